//! What a file imports: `use` trees (aliases, groups, nested braces, `self`,
//! globs), `extern crate`, and paths written inline in code
//! (`tokio::spawn(…)`), each resolved to a module of this package or to an
//! external crate.
//!
//! Resolution follows Rust's: `crate::`, `self::`, `super::` and `capdex::`
//! are this package; a name bound by a `use` stands for what it was bound to
//! (`use tokio as rt;` makes `rt::spawn` a tokio path); a child module of the
//! current one is local; anything else a `use` names is an external crate.
//! Inline paths count as external only when they start with a known crate
//! name, since `Settings::from_raw` is a local item's path.

use crate::lexer::{tokens, Kind, Token};
use std::collections::{BTreeMap, BTreeSet};

/// The two crates of the package.
#[derive(Clone, Copy, Debug, PartialEq, Eq, PartialOrd, Ord, Hash)]
pub enum Crate {
    /// `src/lib.rs` and its modules, `capdex::` from the binary.
    Lib,
    /// `src/main.rs` and its modules.
    Bin,
}

/// Where a path leads.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum Target {
    /// A module path (and maybe an item) of this package.
    Local(Crate, Vec<String>),
    /// A path that starts with an external crate's name.
    External(Vec<String>),
}

/// One path a file names, and the line it is on.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Import {
    pub line: usize,
    pub target: Target,
}

/// Where a file sits: its crate, its module path, and the names of the modules it declares.
pub struct Place<'a> {
    pub krate: Crate,
    pub module: &'a [String],
    /// External crate names an inline path may start with (dependencies and `std`, `core`, `alloc`).
    pub crates: &'a BTreeSet<String>,
}

/// The modules a file declares with `mod name;` (not inline `mod name { … }`).
pub fn module_declarations(text: &str) -> Vec<String> {
    let tokens = tokens(text);
    tokens
        .windows(3)
        .filter(|w| w[0].is_ident("mod") && w[2].is_punct(";"))
        .filter_map(|w| w[1].ident().map(str::to_string))
        .collect()
}

/// A `use` leaf before resolution: its path and the name it binds, if any.
struct UseLeaf {
    line: usize,
    path: Vec<String>,
    binding: Option<String>,
    /// The module (file module plus inline modules) the `use` sits in.
    module: Vec<String>,
}

/// Every path `text` names, resolved from `place`.
pub fn imports(text: &str, place: &Place<'_>) -> Vec<Import> {
    let tokens = tokens(text);
    let children: BTreeSet<String> = module_declarations(text).into_iter().collect();
    let mut leaves = Vec::new();
    let mut inline_paths = Vec::new();
    let mut inline_modules: Vec<(String, usize)> = Vec::new();
    let mut depth = 0usize;
    let mut inline_children: BTreeSet<String> = BTreeSet::new();
    let module_here = |inline: &[(String, usize)]| {
        let mut module = place.module.to_vec();
        module.extend(inline.iter().map(|(name, _)| name.clone()));
        module
    };
    let mut at = 0;
    while at < tokens.len() {
        let token = &tokens[at];
        let previous = |back: usize| at.checked_sub(back).map(|i| &tokens[i]);
        // `::sled::open` is absolute: its `::` follows neither a name nor a `>`.
        let absolute = previous(1).is_some_and(|t| t.is_punct("::"))
            && !previous(2).is_some_and(|t| t.ident().is_some() || t.is_punct(">"));
        let after_sep = !absolute && previous(1).is_some_and(|t| t.is_punct("::") || t.is_punct("$"));
        match &token.kind {
            Kind::Punct(p) if p == "{" => depth += 1,
            Kind::Punct(p) if p == "}" => {
                if inline_modules.last().is_some_and(|(_, d)| *d == depth) {
                    inline_modules.pop();
                }
                depth = depth.saturating_sub(1);
            }
            Kind::Ident(word) if word == "mod" => {
                if let (Some(name), Some(next)) = (tokens.get(at + 1).and_then(Token::ident), tokens.get(at + 2)) {
                    if next.is_punct("{") {
                        inline_children.insert(name.to_string());
                        inline_modules.push((name.to_string(), depth + 1));
                        depth += 1;
                        at += 3;
                        continue;
                    }
                }
            }
            Kind::Ident(word) if word == "use" && !after_sep => {
                let module = module_here(&inline_modules);
                let mut leaf_paths = Vec::new();
                at += 1;
                use_tree(&tokens, &mut at, Vec::new(), &mut leaf_paths);
                for (line, path, binding) in leaf_paths {
                    leaves.push(UseLeaf { line, path, binding, module: module.clone() });
                }
                continue;
            }
            Kind::Ident(word) if word == "extern" && tokens.get(at + 1).is_some_and(|t| t.is_ident("crate")) => {
                if let Some(name) = tokens.get(at + 2).and_then(Token::ident) {
                    let binding = match (tokens.get(at + 3), tokens.get(at + 4).and_then(Token::ident)) {
                        (Some(t), Some(alias)) if t.is_ident("as") => alias.to_string(),
                        _ => name.to_string(),
                    };
                    leaves.push(UseLeaf {
                        line: token.line,
                        path: vec![name.to_string()],
                        binding: Some(binding),
                        module: module_here(&inline_modules),
                    });
                }
            }
            Kind::Ident(_) if !after_sep && tokens.get(at + 1).is_some_and(|t| t.is_punct("::")) => {
                let mut path = Vec::new();
                let mut end = at;
                while let Some(name) = tokens.get(end).and_then(Token::ident) {
                    path.push(name.to_string());
                    if tokens.get(end + 1).is_some_and(|t| t.is_punct("::")) {
                        end += 2;
                    } else {
                        break;
                    }
                }
                inline_paths.push((token.line, path, module_here(&inline_modules), absolute));
                at = end + 1;
                continue;
            }
            _ => {}
        }
        at += 1;
    }

    let mut local_children = children;
    local_children.extend(inline_children);
    let mut bindings: BTreeMap<String, Target> = BTreeMap::new();
    let mut found = Vec::new();
    for leaf in &leaves {
        let Some(target) = resolve(&leaf.path, &leaf.module, place, &bindings, &local_children, true) else {
            continue;
        };
        if let Some(name) = &leaf.binding {
            bindings.insert(name.clone(), target.clone());
        }
        found.push(Import { line: leaf.line, target });
    }
    for (line, path, module, absolute) in inline_paths {
        let target = if absolute {
            Some(Target::External(path))
        } else {
            resolve(&path, &module, place, &bindings, &local_children, false)
        };
        if let Some(target) = target {
            found.push(Import { line, target });
        }
    }
    found
}

/// Reads one use tree from `at` up to its end (`;`, `,` or `}`), adding its
/// leaves as `(line, path, binding)`.
fn use_tree(
    tokens: &[Token],
    at: &mut usize,
    prefix: Vec<String>,
    leaves: &mut Vec<(usize, Vec<String>, Option<String>)>,
) {
    let mut path = prefix;
    if tokens.get(*at).is_some_and(|t| t.is_punct("::")) {
        *at += 1;
    }
    while let Some(token) = tokens.get(*at) {
        let line = token.line;
        match &token.kind {
            Kind::Ident(name) => {
                path.push(name.clone());
                *at += 1;
                if tokens.get(*at).is_some_and(|t| t.is_punct("::")) {
                    *at += 1;
                    continue;
                }
                if path.len() > 1 && path.last().is_some_and(|last| last == "self") {
                    path.pop();
                }
                let mut binding = path.last().cloned();
                if tokens.get(*at).is_some_and(|t| t.is_ident("as")) {
                    binding =
                        tokens.get(*at + 1).and_then(Token::ident).filter(|alias| *alias != "_").map(str::to_string);
                    *at += 2;
                }
                leaves.push((line, path, binding));
                break;
            }
            Kind::Punct(p) if p == "{" => {
                *at += 1;
                while let Some(inner) = tokens.get(*at) {
                    if inner.is_punct("}") {
                        *at += 1;
                        break;
                    }
                    if inner.is_punct(",") {
                        *at += 1;
                        continue;
                    }
                    let before = *at;
                    use_tree(tokens, at, path.clone(), leaves);
                    if *at == before {
                        *at += 1;
                    }
                }
                break;
            }
            Kind::Punct(p) if p == "*" => {
                *at += 1;
                leaves.push((line, path, None));
                break;
            }
            _ => break,
        }
    }
    if tokens.get(*at).is_some_and(|t| t.is_punct(";")) {
        *at += 1;
    }
}

/// Resolves a path written in `module`; `None` for a local item's path (`Settings::from_raw`).
fn resolve(
    path: &[String],
    module: &[String],
    place: &Place<'_>,
    bindings: &BTreeMap<String, Target>,
    children: &BTreeSet<String>,
    in_use: bool,
) -> Option<Target> {
    let first = path.first()?.as_str();
    let rest = || path[1..].to_vec();
    let local = |base: &[String], rest: &[String]| {
        let mut full = base.to_vec();
        full.extend(rest.iter().cloned());
        Some(Target::Local(place.krate, full))
    };
    match first {
        "crate" => local(&[], &path[1..]),
        "self" => local(module, &path[1..]),
        "super" => {
            let ups = path.iter().take_while(|s| *s == "super").count();
            let base = &module[..module.len().saturating_sub(ups)];
            local(base, &path[ups..])
        }
        "Self" => None,
        name if bindings.contains_key(name) => Some(match &bindings[name] {
            Target::Local(krate, base) => Target::Local(*krate, base.iter().cloned().chain(rest()).collect()),
            Target::External(base) => Target::External(base.iter().cloned().chain(rest()).collect()),
        }),
        name if children.contains(name) && module.len() == place.module.len() => local(module, path),
        "capdex" => Some(Target::Local(Crate::Lib, rest())),
        name if in_use || place.crates.contains(name) => Some(Target::External(path.to_vec())),
        _ => None,
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn found(text: &str, module: &[&str]) -> Vec<Target> {
        let crates: BTreeSet<String> = ["std", "core", "tokio", "sled", "async_nats", "serde"].map(String::from).into();
        let module: Vec<String> = module.iter().map(|s| s.to_string()).collect();
        imports(text, &Place { krate: Crate::Lib, module: &module, crates: &crates })
            .into_iter()
            .map(|i| i.target)
            .collect()
    }

    fn ext(path: &[&str]) -> Target {
        Target::External(path.iter().map(|s| s.to_string()).collect())
    }

    fn local(path: &[&str]) -> Target {
        Target::Local(Crate::Lib, path.iter().map(|s| s.to_string()).collect())
    }

    #[test]
    fn use_trees_are_read_whole() {
        assert_eq!(
            found("use crate::core::{index::{A, B as C}, lexical, self}; use std::{fs::{self}, io::*};", &["app"]),
            [
                local(&["core", "index", "A"]),
                local(&["core", "index", "B"]),
                local(&["core", "lexical"]),
                local(&["core"]),
                ext(&["std", "fs"]),
                ext(&["std", "io"]),
            ]
        );
    }

    #[test]
    fn relative_paths_resolve_from_the_module() {
        assert_eq!(
            found("use super::x::Y;", &["core", "dispatch", "approval"]),
            [local(&["core", "dispatch", "x", "Y"])]
        );
        assert_eq!(found("use self::inner::Z;", &["core"]), [local(&["core", "inner", "Z"])]);
        // `super` inside an inline module is the file's module.
        assert_eq!(found("mod tests { use super::*; }", &["core", "index"]), [local(&["core", "index"])]);
        assert_eq!(found("use capdex::config::Settings;", &[]), [local(&["config", "Settings"])]);
        assert_eq!(found("mod index; use index::Hit;", &["core"]), [local(&["core", "index", "Hit"])]);
    }

    #[test]
    fn aliases_follow_their_binding() {
        assert_eq!(
            found("use tokio as rt; fn f() { rt::spawn(g()); }", &["core"]),
            [ext(&["tokio"]), ext(&["tokio", "spawn"])]
        );
        assert_eq!(
            found("use std::fs; fn f() { fs::read(p); }", &["core"]),
            [ext(&["std", "fs"]), ext(&["std", "fs", "read"])]
        );
        assert_eq!(
            found("extern crate sled as db; fn f() { db::open(p); }", &["core"]),
            [ext(&["sled"]), ext(&["sled", "open"])]
        );
    }

    #[test]
    fn inline_paths_count_only_from_a_known_crate() {
        assert_eq!(
            found("fn f() { tokio::spawn(x); Settings::from_raw(r); ::sled::open(p); }", &["app"]),
            [ext(&["tokio", "spawn"]), ext(&["sled", "open"])]
        );
        assert_eq!(found("#[tokio::main] async fn main() {}", &[]), [ext(&["tokio", "main"])]);
        assert_eq!(
            found("fn f() -> Vec<crate::store::Store> { Vec::<u8>::new() }", &["app"]),
            [local(&["store", "Store"])]
        );
    }
}
