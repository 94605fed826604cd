//! Tidy checks: the layers of `src/` hold, and the docs name what the code serves.
//!
//! - imports are parsed ([`imports`]: aliases, grouped and nested `use` trees,
//!   `crate::`, `self::`, `super::`, `capdex::` and inline paths, comments and
//!   literals stripped by [`lexer`]) and held to the allow-table of
//!   [`layers`]: module edges, and who may name `async_nats`, `sled`, `tokio`,
//!   `std::fs`, …;
//! - no import circle between files;
//! - every metric the code emits is in `ARCHITECTURE.md`, every subject the
//!   gateway serves in `docs/api.md` ([`docs`]);
//! - every `.rs` file opens with a `//!` doc comment.
//!
//! [`evasions`] shows the checker catching each way around it.

mod docs;
mod evasions;
mod imports;
mod layers;
mod lexer;

use std::collections::BTreeMap;
use std::path::{Path, PathBuf};

fn rust_files(dir: &Path) -> Vec<PathBuf> {
    let mut files = Vec::new();
    for entry in std::fs::read_dir(dir).unwrap() {
        let path = entry.unwrap().path();
        if path.is_dir() {
            files.extend(rust_files(&path));
        } else if path.extension().is_some_and(|ext| ext == "rs") {
            files.push(path);
        }
    }
    files.sort();
    files
}

fn root() -> &'static Path {
    Path::new(env!("CARGO_MANIFEST_DIR"))
}

fn read(relative: &str) -> String {
    std::fs::read_to_string(root().join(relative)).unwrap_or_else(|err| panic!("{relative}: {err}"))
}

/// Every `.rs` file under `src/`, by its path from the package root.
fn sources() -> BTreeMap<String, String> {
    rust_files(&root().join("src"))
        .into_iter()
        .map(|file| {
            let relative = file.strip_prefix(root()).unwrap().to_string_lossy().replace('\\', "/");
            let text = std::fs::read_to_string(&file).unwrap();
            (relative, text)
        })
        .collect()
}

fn analysed() -> Vec<layers::SourceFile> {
    layers::analyse(&sources(), &layers::known_crates(&read("Cargo.toml")))
}

#[test]
fn every_source_file_is_reached_from_a_crate_root() {
    let reached: Vec<String> = analysed().into_iter().map(|f| f.path).collect();
    let unreached: Vec<String> = sources().into_keys().filter(|path| !reached.contains(path)).collect();
    assert!(unreached.is_empty(), "not in the module tree (so not checked): {unreached:?}");
}

#[test]
fn imports_keep_to_the_layers() {
    let violations = layers::layer_violations(&analysed());
    assert!(violations.is_empty(), "imports across the layers of tests/tidy/layers.rs:\n{}", violations.join("\n"));
}

#[test]
fn no_import_circle_between_files() {
    let files = analysed();
    let circles = layers::circles(&layers::file_graph(&files));
    assert!(circles.is_empty(), "{} import circle(s) between files:\n{}", circles.len(), circles.join("\n"));
}

#[test]
fn every_emitted_metric_is_listed_in_the_architecture() {
    let architecture = read("ARCHITECTURE.md");
    let listed = docs::backticked(&architecture);
    let missing: Vec<String> =
        docs::emitted_metrics(&sources()).into_iter().filter(|name| !listed.contains(name)).collect();
    assert!(missing.is_empty(), "metrics emitted but not listed (in backticks) in ARCHITECTURE.md: {missing:?}");
}

#[test]
fn every_gateway_subject_is_in_the_api_doc() {
    let templates = docs::subject_templates(&read("src/gateway/subjects.rs"));
    assert!(templates.len() > 10, "found only {templates:?} in src/gateway/subjects.rs");
    let documented = docs::documented_subjects(&read("docs/api.md"));
    let missing: Vec<&String> =
        templates.iter().filter(|t| !documented.iter().any(|d| docs::subject_matches(t, d))).collect();
    assert!(missing.is_empty(), "subjects of src/gateway/subjects.rs missing from docs/api.md: {missing:?}");
}

#[test]
fn every_file_opens_with_a_module_doc() {
    for dir in ["src", "tests", "benches"] {
        for file in rust_files(&root().join(dir)) {
            let text = std::fs::read_to_string(&file).unwrap();
            assert!(
                text.trim_start().starts_with("//!"),
                "{} must open with a //! comment saying what it owns",
                file.display()
            );
        }
    }
}
