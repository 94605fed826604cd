//! The gateway: capdex on NATS. The only module that imports async-nats.
//!
//! - `subjects`: every subject, defined once, under the configured prefix;
//! - `wire`: the v1 request and reply shapes (**API boundary**);
//! - `errors`: error kinds and their one (status, code) table;
//! - `service`: the NATS micro service's endpoints, shutdown, and event publishing;
//! - `micro`: the micro-service protocol (`$SRV.PING`, `$SRV.INFO`, `$SRV.STATS`);
//! - `connect`: connection options (credentials, TLS) from `[nats]`;
//! - `jetstream`: the index mutation log and the outcome stream shared by several nodes;
//! - `kv`: key-value buckets, the other state several nodes share (registry, approvals, claims, ...);
//! - `patience`: opening streams and buckets while a JetStream cluster forms.

pub mod connect;
pub mod errors;
pub mod jetstream;
pub mod kv;
pub mod micro;
pub mod patience;
pub mod service;
pub mod subjects;
pub mod wire;
