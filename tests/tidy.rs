//! Tidy checks: the module boundaries hold and every source file says what it owns.
//!
//! - `src/core` imports none of actix, async-nats, sled, tokio or notify;
//! - only `src/gateway` imports async-nats; only `src/store` imports sled;
//! - every `.rs` file opens with a `//!` doc comment.

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

/// Returns the crates a file names in code (`use x::`, `x::path`, `extern crate x`), comments excluded.
fn mentions(text: &str, krate: &str) -> bool {
    text.lines().map(|line| line.split("//").next().unwrap_or("")).any(|code| {
        code.match_indices(krate).any(|(at, _)| {
            let before = code[..at].chars().next_back();
            let after = &code[at + krate.len()..];
            before.is_none_or(|c| !(c.is_alphanumeric() || c == '_'))
                && (after.starts_with("::") || after.starts_with(';'))
        })
    })
}

fn src() -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR")).join("src")
}

#[test]
fn core_is_pure() {
    for file in rust_files(&src().join("core")) {
        let text = std::fs::read_to_string(&file).unwrap();
        for krate in ["actix", "actix_rt", "async_nats", "sled", "tokio", "notify", "notify_debouncer_full"] {
            assert!(
                !mentions(&text, krate),
                "{} uses {krate}: src/core must stay free of I/O and runtimes",
                file.display()
            );
        }
        assert!(!text.contains("std::fs") && !text.contains("std::net"), "{} does I/O", file.display());
    }
}

#[test]
fn only_the_gateway_speaks_nats_and_only_the_store_speaks_sled() {
    for file in rust_files(&src()) {
        let relative = file.strip_prefix(src()).unwrap().to_string_lossy().into_owned();
        let text = std::fs::read_to_string(&file).unwrap();
        if !relative.starts_with("gateway/") {
            assert!(!mentions(&text, "async_nats"), "src/{relative} uses async_nats: only src/gateway may");
        }
        if !relative.starts_with("store/") {
            assert!(!mentions(&text, "sled"), "src/{relative} uses sled: only src/store may");
        }
    }
}

#[test]
fn the_checker_sees_a_crossing() {
    assert!(mentions("use sled::Db;", "sled"));
    assert!(mentions("    let db = sled::open(p);", "sled"));
    assert!(!mentions("// sled::open is only mentioned in a comment", "sled"));
    assert!(!mentions("let unsled::x = 1;", "sled"));
}

#[test]
fn every_file_opens_with_a_module_doc() {
    for dir in ["src", "tests", "benches"] {
        let root = Path::new(env!("CARGO_MANIFEST_DIR")).join(dir);
        for file in rust_files(&root) {
            let text = std::fs::read_to_string(&file).unwrap();
            assert!(
                text.trim_start().starts_with("//!"),
                "{} must open with a //! comment saying what it owns",
                file.display()
            );
        }
    }
}
