//! capdex: capability discovery and safe dispatch for AI agents.
//!
//! A map of the crate (see ARCHITECTURE.md for the whole picture):
//! - [`core`]: pure logic, no I/O;
//! - [`actors`]: thin actix shells around the core;
//! - [`gateway`]: the only module that speaks NATS;
//! - [`mcp`]: the MCP server face (stdio and streamable HTTP), over the gateway's `Api`;
//! - [`store`]: the only module that speaks sled;
//! - [`folders`]: reading capability folders from disk;
//! - [`embedders`]: the HTTP and local neural embedding backends, and the choice of one;
//! - [`eval`], [`bench`]: retrieval quality on benchmark files and speed on a synthetic catalog;
//! - [`config`], [`telemetry`], [`app`]: settings, logs and metrics, wiring;
//! - [`replication`]: several nodes sharing the index log and the outcome stream (JetStream);
//! - [`shared_state`]: several nodes sharing the SCG (mapped sources, memory notes) and live source definitions (JetStream key-value buckets);
//! - [`source_catalog`]: one source's tools published into the SCG, the catalog and the dispatch registry;
//! - [`registration`]: a runtime's registration applied through the Indexer (for [`app`] and [`replication`]);
//! - [`live`]: live sources wired: the SourceManager's connector over [`upstream`], its publisher over [`source_catalog`], `sources.*` requests;
//! - [`clock`]: the wall clock, in epoch milliseconds;
//! - [`error_report`]: the one line an error becomes on the command line, each cause said once;
//! - [`tls`]: the TLS crypto provider every HTTPS client uses;
//! - [`upstream`]: live sources' outside ends: MCP client sessions, OpenAPI documents and calls over HTTP;
//! - [`dispatch_cli`]: the dispatch admin requests and the `capdex dispatch`, `capability`, `binding`, `approval` commands.

pub mod actors;
pub mod allocations;
pub mod app;
pub mod bench;
pub mod clock;
pub mod config;
pub mod console;
pub mod core;
pub mod dispatch_cli;
pub mod embedders;
pub mod error_report;
pub mod eval;
pub mod folders;
pub mod gateway;
pub mod live;
pub mod mcp;
pub mod registration;
pub mod replication;
pub mod route_eval;
pub mod shared_state;
pub mod source_catalog;
pub mod store;
pub mod telemetry;
pub mod tls;
pub mod upstream;
