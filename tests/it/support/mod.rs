//! Shared helpers for the integration tests (a real nats-server, etc.).

pub mod nats_server;
pub mod serving;
