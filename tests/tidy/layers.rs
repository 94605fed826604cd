//! The layers of `src/`, written in one place, and the checks that hold the
//! code to them: which top-level module may import which ([`MODULE_EDGES`]),
//! which external crates and `std` modules only some may name
//! ([`EXTERNAL_RULES`]), and no import circle between files ([`circles`]).

use crate::imports::{imports, module_declarations, Crate, Import, Place, Target};
use std::collections::{BTreeMap, BTreeSet};

/// The layer of the binary (`src/main.rs` and the modules it declares).
pub const BINARY: &str = "main";

/// Which top-level modules each top-level module of `src/` may import (a
/// module may always import itself). A module missing here may import
/// nothing; the binary is [`BINARY`].
pub const MODULE_EDGES: &[(&str, &[&str])] = &[
    // Pure logic: nothing but itself.
    ("core", &[]),
    // Adapters around the core, each speaking one outside thing.
    ("store", &["core"]),
    ("gateway", &["core", "config"]),
    // The MCP face: like the gateway, it calls capdex through the gateway's `Api`.
    ("mcp", &["core", "config", "gateway"]),
    // The operator console: web pages over the same `Api`, through the MCP face's `Send` bridge.
    ("console", &["core", "config", "gateway", "mcp", "clock"]),
    ("folders", &["core"]),
    ("embedders", &["core", "config", "tls"]),
    ("config", &["core"]),
    ("telemetry", &["config"]),
    // The TLS provider: a leaf every HTTPS client may call.
    ("tls", &[]),
    // The binary's allocator, counting for `capdex bench --memory`.
    ("allocations", &[]),
    // Live sources' outside ends: MCP client sessions, OpenAPI documents, HTTP calls.
    ("upstream", &["core", "tls"]),
    // The actors drive the core through the adapters.
    (
        "actors",
        &["core", "store", "gateway", "folders", "embedders", "config", "telemetry", "tls", "clock", "allocations"],
    ),
    // Wiring and front ends.
    ("registration", &["core", "actors", "gateway"]),
    ("replication", &["core", "actors", "gateway", "store", "config", "registration", "clock"]),
    ("dispatch_cli", &["core", "actors", "gateway", "store", "config"]),
    ("source_catalog", &["core", "actors", "gateway", "config", "store"]),
    ("live", &["core", "actors", "gateway", "config", "store", "upstream", "source_catalog", "clock"]),
    ("shared_state", &["core", "actors", "gateway", "config", "store", "source_catalog", "live", "clock"]),
    ("eval", &["core", "folders", "embedders", "config", "store"]),
    ("route_eval", &["core", "embedders", "config"]),
    ("bench", &["core", "folders", "embedders", "config", "actors", "store", "app", "gateway", "mcp", "allocations"]),
    (
        "app",
        &[
            "core",
            "store",
            "gateway",
            "folders",
            "embedders",
            "config",
            "telemetry",
            "actors",
            "registration",
            "replication",
            "dispatch_cli",
            "source_catalog",
            "live",
            "shared_state",
            "upstream",
            "clock",
            "tls",
            "mcp",
            "console",
        ],
    ),
    (
        BINARY,
        &[
            "core",
            "store",
            "gateway",
            "folders",
            "embedders",
            "config",
            "telemetry",
            "actors",
            "registration",
            "replication",
            "dispatch_cli",
            "source_catalog",
            "live",
            "shared_state",
            "upstream",
            "eval",
            "route_eval",
            "bench",
            "allocations",
            "app",
            "clock",
            "tls",
            "mcp",
            "error_report",
        ],
    ),
];

/// Who may name an external path.
pub enum Allowed {
    /// Only these top-level modules.
    Only(&'static [&'static str]),
    /// Every module but these.
    NotIn(&'static [&'static str]),
}

/// External paths (a crate, or a crate's module) and who may name them.
pub const EXTERNAL_RULES: &[(&[&str], Allowed)] = &[
    // Only the gateway speaks NATS; only the store speaks sled.
    (&["async_nats"], Allowed::Only(&["gateway"])),
    (&["sled"], Allowed::Only(&["store"])),
    (&["rmcp"], Allowed::Only(&["upstream", "mcp"])),
    // The core knows nothing of actors, runtimes, watchers, the network or the disk.
    (&["actix"], Allowed::NotIn(&["core"])),
    (&["actix_rt"], Allowed::NotIn(&["core"])),
    (&["tokio"], Allowed::NotIn(&["core"])),
    (&["notify"], Allowed::NotIn(&["core"])),
    (&["notify_debouncer_full"], Allowed::NotIn(&["core"])),
    (&["reqwest"], Allowed::NotIn(&["core"])),
    (&["rustls"], Allowed::Only(&["tls"])),
    // Only the upstream adapter (client) and the MCP face (server) speak MCP.
    (&["rmcp"], Allowed::Only(&["upstream", "mcp"])),
    // Only the console serves web pages.
    (&["actix_web"], Allowed::Only(&["console"])),
    (&["std", "fs"], Allowed::NotIn(&["core"])),
    (&["std", "net"], Allowed::NotIn(&["core"])),
    (&["std", "process"], Allowed::NotIn(&["core"])),
];

/// One file of `src/` and what it imports.
pub struct SourceFile {
    /// The path from the package root, `src/core/index.rs`.
    pub path: String,
    pub krate: Crate,
    pub module: Vec<String>,
    pub imports: Vec<Import>,
}

impl SourceFile {
    /// Its top-level module: `core` for `src/core/index.rs`, `lib` for `src/lib.rs`, [`BINARY`] for the binary's files.
    pub fn layer(&self) -> &str {
        match (self.krate, self.module.first()) {
            (Crate::Bin, _) => BINARY,
            (Crate::Lib, Some(top)) => top,
            (Crate::Lib, None) => "lib",
        }
    }
}

/// The package's source files, found by following `mod` declarations from
/// `src/lib.rs` and `src/main.rs`. `files` maps paths (`src/app.rs`) to texts.
pub fn analyse(files: &BTreeMap<String, String>, crates: &BTreeSet<String>) -> Vec<SourceFile> {
    let mut out = Vec::new();
    let mut queue: Vec<(String, Crate, Vec<String>)> =
        vec![("src/lib.rs".into(), Crate::Lib, Vec::new()), ("src/main.rs".into(), Crate::Bin, Vec::new())];
    while let Some((path, krate, module)) = queue.pop() {
        let Some(text) = files.get(&path) else { continue };
        let dir = match path.rsplit_once('/') {
            Some((dir, "lib.rs" | "main.rs" | "mod.rs")) => dir.to_string(),
            _ => path.trim_end_matches(".rs").to_string(),
        };
        for child in module_declarations(text) {
            let mut child_module = module.clone();
            child_module.push(child.clone());
            for candidate in [format!("{dir}/{child}.rs"), format!("{dir}/{child}/mod.rs")] {
                if files.contains_key(&candidate) {
                    queue.push((candidate, krate, child_module.clone()));
                }
            }
        }
        let imports = imports(text, &Place { krate, module: &module, crates });
        out.push(SourceFile { path, krate, module, imports });
    }
    out.sort_by(|a, b| a.path.cmp(&b.path));
    out
}

/// The crate names a path may start with: `[dependencies]` and
/// `[dev-dependencies]` of `Cargo.toml` (dashes as underscores), and the standard crates.
pub fn known_crates(cargo_toml: &str) -> BTreeSet<String> {
    let mut crates: BTreeSet<String> = ["std", "core", "alloc", "proc_macro"].map(String::from).into();
    let mut in_dependencies = false;
    for line in cargo_toml.lines().map(str::trim) {
        if line.starts_with('[') {
            in_dependencies = line == "[dependencies]" || line == "[dev-dependencies]";
        } else if let Some((name, _)) = line.split_once('=').filter(|_| in_dependencies && !line.starts_with('#')) {
            crates.insert(name.trim().replace('-', "_"));
        }
    }
    crates
}

/// Every import that breaks [`MODULE_EDGES`] or [`EXTERNAL_RULES`], as `path:line: reason`.
pub fn layer_violations(files: &[SourceFile]) -> Vec<String> {
    let edges: BTreeMap<&str, &[&str]> = MODULE_EDGES.iter().copied().collect();
    let mut violations = Vec::new();
    for file in files {
        let layer = file.layer();
        for import in &file.imports {
            match &import.target {
                Target::Local(Crate::Lib, path) => {
                    let Some(target) = path.first() else { continue };
                    let allowed =
                        target == layer || edges.get(layer).is_some_and(|allowed| allowed.contains(&target.as_str()));
                    if !allowed {
                        violations.push(format!(
                            "{}:{}: {layer} imports {} (`{}`), which MODULE_EDGES does not allow",
                            file.path,
                            import.line,
                            target,
                            path.join("::")
                        ));
                    }
                }
                Target::Local(Crate::Bin, _) => {}
                Target::External(path) => {
                    for (prefix, allowed) in EXTERNAL_RULES {
                        if !path.starts_with(&prefix.iter().map(|s| s.to_string()).collect::<Vec<_>>()) {
                            continue;
                        }
                        let ok = match allowed {
                            Allowed::Only(modules) => modules.contains(&layer),
                            Allowed::NotIn(modules) => !modules.contains(&layer),
                        };
                        if !ok {
                            violations.push(format!(
                                "{}:{}: {layer} names `{}`, which EXTERNAL_RULES keeps out of it",
                                file.path,
                                import.line,
                                path.join("::")
                            ));
                        }
                    }
                }
            }
        }
    }
    violations
}

/// The file a local path leads into: the one holding the longest module prefix of it.
fn file_of<'a>(by_module: &BTreeMap<(Crate, &[String]), &'a str>, krate: Crate, path: &[String]) -> Option<&'a str> {
    (0..=path.len()).rev().find_map(|len| by_module.get(&(krate, &path[..len])).copied())
}

/// The file-level import graph: for each file, the files it imports and the
/// first line doing so. A file's use of an ancestor's `mod.rs` (`super::MapError`,
/// `crate::actors::Inspect` from an actor) is no edge: a parent module owns the
/// vocabulary its children share and declares them, which is a tree, not a
/// circle. Siblings and cousins count, and so does a `mod.rs` importing its children.
pub fn file_graph(files: &[SourceFile]) -> BTreeMap<&str, BTreeMap<&str, usize>> {
    let by_module: BTreeMap<(Crate, &[String]), &str> =
        files.iter().map(|f| ((f.krate, f.module.as_slice()), f.path.as_str())).collect();
    let mut graph: BTreeMap<&str, BTreeMap<&str, usize>> = BTreeMap::new();
    for file in files {
        let edges = graph.entry(file.path.as_str()).or_default();
        for import in &file.imports {
            let Target::Local(krate, path) = &import.target else { continue };
            let ancestor = |target: &str| {
                target.strip_suffix("mod.rs").is_some_and(|dir| file.path.starts_with(dir) && target != file.path)
            };
            if let Some(target) = file_of(&by_module, *krate, path).filter(|t| *t != file.path && !ancestor(t)) {
                edges.entry(target).or_insert(import.line);
            }
        }
    }
    graph
}

/// Every import circle between files: each strongly connected component of
/// more than one file, written as one cycle through it with the line of each
/// import (`src/a.rs:3 → src/b.rs:9 → src/a.rs`).
pub fn circles(graph: &BTreeMap<&str, BTreeMap<&str, usize>>) -> Vec<String> {
    let components = strongly_connected(graph);
    let mut found = Vec::new();
    for component in components.into_iter().filter(|c| c.len() > 1) {
        let members: BTreeSet<&str> = component.iter().copied().collect();
        let start = component[0];
        // Shortest way back to `start` inside the component (breadth first).
        let mut previous: BTreeMap<&str, &str> = BTreeMap::new();
        let mut frontier = vec![start];
        'search: while !frontier.is_empty() {
            let mut next = Vec::new();
            for node in frontier {
                for &target in graph[node].keys().filter(|t| members.contains(*t)) {
                    if target == start {
                        previous.insert(start, node);
                        break 'search;
                    }
                    if !previous.contains_key(target) {
                        previous.insert(target, node);
                        next.push(target);
                    }
                }
            }
            frontier = next;
        }
        let mut cycle = vec![start];
        let mut node = previous[start];
        while node != start {
            cycle.push(node);
            node = previous[node];
        }
        cycle.reverse();
        cycle.rotate_right(1);
        let mut text: Vec<String> = cycle
            .iter()
            .zip(cycle.iter().cycle().skip(1))
            .map(|(from, to)| format!("{from}:{}", graph[from][to]))
            .collect();
        text.push(start.to_string());
        let others = members.len() - cycle.len();
        let suffix = if others > 0 { format!(" (and {others} more files in the same circle)") } else { String::new() };
        found.push(format!("{}{suffix}", text.join(" → ")));
    }
    found
}

/// Tarjan's strongly connected components, each sorted, in a stable order.
fn strongly_connected<'a>(graph: &BTreeMap<&'a str, BTreeMap<&'a str, usize>>) -> Vec<Vec<&'a str>> {
    struct State<'a> {
        index: BTreeMap<&'a str, usize>,
        low: BTreeMap<&'a str, usize>,
        stack: Vec<&'a str>,
        on_stack: BTreeSet<&'a str>,
        components: Vec<Vec<&'a str>>,
    }
    fn visit<'a>(node: &'a str, graph: &BTreeMap<&'a str, BTreeMap<&'a str, usize>>, state: &mut State<'a>) {
        let index = state.index.len();
        state.index.insert(node, index);
        state.low.insert(node, index);
        state.stack.push(node);
        state.on_stack.insert(node);
        for &target in graph.get(node).into_iter().flat_map(|edges| edges.keys()) {
            if !state.index.contains_key(target) {
                visit(target, graph, state);
                let low = state.low[node].min(state.low[target]);
                state.low.insert(node, low);
            } else if state.on_stack.contains(target) {
                let low = state.low[node].min(state.index[target]);
                state.low.insert(node, low);
            }
        }
        if state.low[node] == state.index[node] {
            let mut component = Vec::new();
            while let Some(member) = state.stack.pop() {
                state.on_stack.remove(member);
                component.push(member);
                if member == node {
                    break;
                }
            }
            component.sort();
            state.components.push(component);
        }
    }
    let mut state = State {
        index: BTreeMap::new(),
        low: BTreeMap::new(),
        stack: Vec::new(),
        on_stack: BTreeSet::new(),
        components: Vec::new(),
    };
    for &node in graph.keys() {
        if !state.index.contains_key(node) {
            visit(node, graph, &mut state);
        }
    }
    state.components.sort();
    state.components
}
