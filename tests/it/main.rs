//! Integration tests: one binary, real components (a real nats-server per
//! test, real sled files in temp dirs, the real `capdex` binary).

mod cli;
mod cluster;
mod compose_and_config;
mod console;
mod dispatch;
mod embedder_http;
mod eval;
mod exact_names;
mod faults;
mod hostile_manifests;
mod identity;
mod kpi_over_nats;
mod lanes;
mod limits;
mod live_sources;
mod mcp_clients;
mod mcp_sources;
mod multinode;
mod one_catalog;
mod openapi_sources;
mod outbound;
mod outcome_learning;
mod python_clients;
mod retention;
mod robustness;
mod scg_cli;
mod scg_over_nats;
mod scg_real_specs;
mod security;
mod serve_over_nats;
mod shared_dispatch;
mod shared_scg;
mod support;
