//! The pure core: capability descriptors, manifests, texts, the built-in
//! embedder, retrieval, the capability graph, token-budgeted tiers, KPI
//! windows, dispatch rules and the turn planner.
//!
//! Nothing here does I/O or knows about actors, the bus or the store;
//! `tests/tidy.rs` enforces that.

pub mod catalog;
pub mod catalog_snapshot;
pub mod compact_json;
pub mod console;
pub mod descriptor;
pub mod discovery;
pub mod dispatch;
pub mod dispatch_rules;
pub mod embedder;
pub mod evaluation;
pub mod filter;
pub mod graph;
pub mod id_table;
pub mod index;
pub mod kpi_window;
pub mod lexical;
pub mod limits;
pub mod manifest;
pub mod mcp_face;
pub mod meta_tool;
pub mod nothing_fits;
pub mod outcome_learning;
pub mod outcome_memory;
pub mod outcome_prior;
pub mod outcome_trust;
pub mod registration;
pub mod reindex;
pub mod retention;
pub mod retrieval;
pub mod scg;
pub mod source_concepts;
pub mod sources;
pub mod static_embedder;
pub mod static_share;
pub mod subject_token;
pub mod text;
pub mod tiers;
pub mod top_keys;
pub mod turn_planner;
