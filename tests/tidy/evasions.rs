//! The checker's own tests: each way around the old tidy check (an alias, a
//! grouped import, code after a string, a `crate::` edge, a new circle) is
//! caught, and comments and strings do not count.

use crate::layers::{analyse, circles, file_graph, layer_violations};
use std::collections::{BTreeMap, BTreeSet};

/// A crate root declaring the modules the files below need.
const LIB: &str = "//! root\npub mod actors;\npub mod app;\npub mod core;\npub mod store;\n";
const CORE: &str = "//! core\npub mod a;\npub mod b;\n";

/// The layer violations and the circles of `src/lib.rs`, `src/core/mod.rs` and `files`.
fn check(files: &[(&str, &str)]) -> (Vec<String>, Vec<String>) {
    let mut tree: BTreeMap<String, String> =
        BTreeMap::from([("src/lib.rs".into(), LIB.into()), ("src/core/mod.rs".into(), CORE.into())]);
    tree.extend(files.iter().map(|(path, text)| (path.to_string(), text.to_string())));
    let crates: BTreeSet<String> =
        ["std", "core", "tokio", "sled", "async_nats", "actix", "serde"].map(String::from).into();
    let analysed = analyse(&tree, &crates);
    (layer_violations(&analysed), circles(&file_graph(&analysed)))
}

fn violations(path: &str, text: &str) -> Vec<String> {
    check(&[(path, text)]).0
}

#[test]
fn an_aliased_crate_is_caught() {
    let found = violations("src/actors.rs", "use async_nats as nats;\nfn f() { nats::connect(u); }");
    assert_eq!(found.len(), 2, "{found:?}");
    assert!(found[0].starts_with("src/actors.rs:1: actors names `async_nats`"), "{found:?}");
    assert!(found[1].starts_with("src/actors.rs:2: actors names `async_nats::connect`"), "{found:?}");
    let found = violations("src/core/a.rs", "use tokio as rt;\nfn f() { rt::spawn(g()); }");
    assert!(found.iter().any(|v| v.contains("`tokio::spawn`")), "{found:?}");
}

#[test]
fn a_grouped_import_is_caught() {
    let found = violations("src/core/a.rs", "use std::{collections::BTreeMap, fs};");
    assert_eq!(found, ["src/core/a.rs:1: core names `std::fs`, which EXTERNAL_RULES keeps out of it"]);
    let found = violations("src/core/a.rs", "use std::{\n    io,\n    net::{TcpStream as T},\n};");
    assert_eq!(found, ["src/core/a.rs:3: core names `std::net::TcpStream`, which EXTERNAL_RULES keeps out of it"]);
}

#[test]
fn code_after_a_string_is_caught() {
    let found = violations("src/app.rs", r#"fn f(p: &str) { let u = "nats://x"; sled::open(p); }"#);
    assert_eq!(found, ["src/app.rs:1: app names `sled::open`, which EXTERNAL_RULES keeps out of it"]);
    let found = violations("src/core/a.rs", "fn f() { let c = '\"'; tokio::spawn(g()); }");
    assert_eq!(found.len(), 1, "{found:?}");
}

#[test]
fn an_absolute_path_is_caught() {
    let found = violations("src/core/a.rs", "fn f() { ::tokio::spawn(g()); }");
    assert_eq!(found.len(), 1, "{found:?}");
}

#[test]
fn a_crate_edge_outside_the_table_is_caught() {
    let found = violations("src/core/a.rs", "use crate::actors::Thing;");
    assert_eq!(found, ["src/core/a.rs:1: core imports actors (`actors::Thing`), which MODULE_EDGES does not allow"]);
    let found = violations("src/store.rs", "fn f() -> crate::app::Thing { todo!() }");
    assert_eq!(found.len(), 1, "{found:?}");
    let found = violations("src/core/a.rs", "use super::super::store::Store;");
    assert_eq!(found.len(), 1, "{found:?}");
    // Allowed edges and the module itself pass.
    assert!(violations("src/store.rs", "use crate::core::a::A; use self::inner::B;").is_empty());
    assert!(violations("src/app.rs", "use crate::{actors::X, store::{Store}};").is_empty());
}

#[test]
fn a_new_circle_between_two_files_is_caught() {
    let (_, found) = check(&[
        ("src/core/a.rs", "//! a\nuse crate::core::b::B;\npub struct A;"),
        ("src/core/b.rs", "//! b\n\npub fn f() -> super::a::A { super::a::A }"),
    ]);
    assert_eq!(found, ["src/core/a.rs:2 → src/core/b.rs:3 → src/core/a.rs"]);
    // One way only is no circle; an import of the file's own items is no edge.
    let (_, found) = check(&[
        ("src/core/a.rs", "//! a\nuse crate::core::b::B;\nmod tests { use super::*; use crate::core::a::A; }"),
        ("src/core/b.rs", "//! b\npub struct B;"),
    ]);
    assert!(found.is_empty(), "{found:?}");
}

#[test]
fn a_child_using_its_parents_items_is_no_circle_but_siblings_are() {
    let (_, found) = check(&[
        ("src/core/mod.rs", "pub mod a;\npub mod b;\nuse self::a::A;\npub struct Shared;"),
        ("src/core/a.rs", "use super::Shared;\npub struct A;"),
        ("src/core/b.rs", "use crate::core::Shared;"),
    ]);
    assert!(found.is_empty(), "{found:?}");
    let (_, found) = check(&[
        ("src/core/a.rs", "use super::b::B;\npub struct A;"),
        ("src/core/b.rs", "use super::a::A;\npub struct B;"),
    ]);
    assert_eq!(found, ["src/core/a.rs:1 → src/core/b.rs:1 → src/core/a.rs"]);
}

#[test]
fn a_circle_through_three_files_is_printed_whole() {
    let (_, found) = check(&[
        ("src/core/a.rs", "use crate::core::b::B;"),
        ("src/core/b.rs", "use crate::store::S;"),
        ("src/store.rs", "\nuse crate::core::a::A;"),
    ]);
    assert_eq!(found, ["src/core/a.rs:1 → src/core/b.rs:1 → src/store.rs:2 → src/core/a.rs"]);
}

#[test]
fn comments_and_strings_do_not_count() {
    let text = r####"//! Mentions tokio::spawn and `use sled;` in its doc.
// use async_nats as nats;
/* sled::open(p) /* nested: tokio::spawn */ still a comment */
/// std::fs::read(p)
fn f() -> (&'static str, &'static str, char) {
    let a = "use std::fs; sled::open(p)";
    let b = r#"tokio::spawn("x")"#;
    let _c = b"async_nats::connect";
    (a, b, '"')
}
"####;
    assert_eq!(violations("src/core/a.rs", text), Vec::<String>::new());
}

#[test]
fn names_that_only_look_like_crates_do_not_count() {
    let text = "fn f() { let unsled = 1; Settings::from_raw(r); my_tokio::x(); Self::new(); }";
    assert_eq!(violations("src/core/a.rs", text), Vec::<String>::new());
}
