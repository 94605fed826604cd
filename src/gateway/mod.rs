//! The gateway: capdex on NATS. The only module that imports async-nats.
//!
//! - `subjects`: every subject, defined once, under the configured prefix;
//! - `wire`: the v1 request and reply shapes (**API boundary**);
//! - `service`: the NATS micro service (`$SRV.*`), its endpoints, and event publishing;
//! - `jetstream`: the index mutation log and the outcome stream shared by several nodes.

pub mod jetstream;
pub mod service;
pub mod subjects;
pub mod wire;
