//! Shared helpers for the integration tests: a real nats-server or a cluster
//! of them (`nats_cluster`), `capdex serve` nodes under load (`cluster_load`), `capdex serve`
//! children killed on drop, the real MCP servers the live-source tests start
//! (`upstreams`), and the fixtures below `tests/fixtures`.

pub mod cluster_load;
pub mod nats_cluster;
pub mod nats_server;
pub mod serving;
pub mod upstreams;
pub mod webdriver;

use std::path::PathBuf;

/// The path of `relative` below `tests/fixtures`, the inputs the tests read
/// (copied into the repository with their licenses: see `tests/fixtures/README.md`).
pub fn fixture(relative: &str) -> PathBuf {
    let path = std::path::Path::new(env!("CARGO_MANIFEST_DIR")).join("tests/fixtures").join(relative);
    assert!(path.exists(), "the fixture {} is missing (see tests/fixtures/README.md)", path.display());
    path
}
