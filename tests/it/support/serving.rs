//! Waiting for a `capdex serve` child process to answer on NATS.

use std::process::Child;
use std::time::{Duration, Instant};

/// Waits (at most 30 s) until `$SRV.PING.capdex` is answered through `client`.
/// Panics with `output()` (the child's log) if the child exits first or the
/// time runs out; the child is killed then.
pub async fn wait_until_serving(child: &mut Child, client: &async_nats::Client, output: impl Fn() -> String) {
    let deadline = Instant::now() + Duration::from_secs(30);
    loop {
        let ping =
            tokio::time::timeout(Duration::from_millis(500), client.request("$SRV.PING.capdex", "".into())).await;
        if matches!(ping, Ok(Ok(_))) {
            return;
        }
        if let Ok(Some(status)) = child.try_wait() {
            panic!("capdex serve exited with {status} before answering $SRV.PING.capdex:\n{}", output());
        }
        if Instant::now() >= deadline {
            let _ = child.kill();
            panic!("capdex serve did not answer $SRV.PING.capdex within 30 s:\n{}", output());
        }
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
}
