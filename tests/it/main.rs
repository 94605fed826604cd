//! Integration tests: one binary, real components (a real nats-server per
//! test, real sled files in temp dirs, the real `capdex` binary).

mod cli;
mod compose_and_config;
mod kpi_over_nats;
mod serve_over_nats;
mod support;
