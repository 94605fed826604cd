//! capdex: capability discovery and safe dispatch for AI agents.
//!
//! A map of the crate (see ARCHITECTURE.md for the whole picture):
//! - [`core`]: pure logic, no I/O;
//! - [`actors`]: thin actix shells around the core;
//! - [`gateway`]: the only module that speaks NATS;
//! - [`store`]: the only module that speaks sled;
//! - [`sources`]: reading capability folders from disk;
//! - [`embedders`]: embedding backends with I/O (the local neural model, feature `neural`);
//! - [`eval`], [`bench`]: retrieval quality on benchmark files and speed on a synthetic catalog;
//! - [`config`], [`telemetry`], [`app`]: settings, logs and metrics, wiring.

pub mod actors;
pub mod app;
pub mod bench;
pub mod config;
pub mod core;
pub mod embedders;
pub mod eval;
pub mod gateway;
pub mod sources;
pub mod store;
pub mod telemetry;
