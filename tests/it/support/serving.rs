//! Child processes of the tests: the one kill-on-drop guard ([`KillOnDrop`]),
//! starting `capdex serve` and waiting until it answers on NATS. (The one
//! `free_port` is in `nats_server.rs`, which other test binaries include too.)

use crate::cli::capdex;
use crate::support::nats_server::NatsServer;
use std::path::{Path, PathBuf};
use std::process::{Child, Stdio};
use std::time::{Duration, Instant};

/// A child process (a `capdex serve`, a nats-server, a client the test
/// started) killed with SIGKILL and reaped when dropped, also when a test
/// fails. It may keep the file its output goes to ([`KillOnDrop::log`]) and a
/// temporary folder that must outlive it (its data dir), removed after it.
pub struct KillOnDrop {
    pub child: Child,
    log: Option<PathBuf>,
    _keep: Option<tempfile::TempDir>,
}

impl KillOnDrop {
    pub fn new(child: Child) -> KillOnDrop {
        KillOnDrop { child, log: None, _keep: None }
    }

    /// Says where the child's output goes, for [`KillOnDrop::log`].
    pub fn with_log(mut self, path: PathBuf) -> KillOnDrop {
        self.log = Some(path);
        self
    }

    /// Keeps `dir` until the child is gone.
    pub fn keeping(mut self, dir: tempfile::TempDir) -> KillOnDrop {
        self._keep = Some(dir);
        self
    }

    /// The child's output so far ("" when it has no log file).
    pub fn log(&self) -> String {
        self.log.as_ref().and_then(|path| std::fs::read_to_string(path).ok()).unwrap_or_default()
    }

    /// Kills the child now (SIGKILL, as a crash would) and waits for it.
    pub fn kill_9(mut self) {
        self.child.kill().expect("SIGKILL the child");
        self.child.wait().expect("reap the child");
    }
}

impl Drop for KillOnDrop {
    fn drop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}

/// Starts `capdex serve` on the capability folder `dir` and `data` with extra
/// `env`, and waits until it answers `$SRV.PING`.
pub async fn serve_at(
    nats: &NatsServer,
    dir: &Path,
    data: &Path,
    watch: bool,
    env: &[(&str, &str)],
) -> (KillOnDrop, async_nats::Client) {
    let mut command = capdex();
    command
        .arg("serve")
        .env("CAPDEX_NATS_URL", nats.url())
        .env("CAPDEX_DATA_DIR", data)
        .env("CAPDEX_CAPABILITY_DIRS", dir)
        .env("CAPDEX_WATCH", watch.to_string())
        .env("CAPDEX_WATCH_DEBOUNCE_MS", "200")
        .stdout(Stdio::null());
    for (name, value) in env {
        command.env(name, value);
    }
    let mut served = KillOnDrop::new(command.spawn().expect("capdex serve starts"));
    let client = async_nats::connect(nats.url()).await.expect("test client connects");
    wait_until_serving(&mut served, &client).await;
    (served, client)
}

/// Waits (at most 30 s) until `$SRV.PING.capdex` is answered through `client`.
/// Panics with the child's log if it exits first or the time runs out.
pub async fn wait_until_serving(served: &mut KillOnDrop, client: &async_nats::Client) {
    let deadline = Instant::now() + Duration::from_secs(30);
    loop {
        let ping =
            tokio::time::timeout(Duration::from_millis(500), client.request("$SRV.PING.capdex", "".into())).await;
        if matches!(ping, Ok(Ok(_))) {
            return;
        }
        if let Ok(Some(status)) = served.child.try_wait() {
            panic!("capdex serve exited with {status} before answering $SRV.PING.capdex:\n{}", served.log());
        }
        if Instant::now() >= deadline {
            panic!("capdex serve did not answer $SRV.PING.capdex within 30 s:\n{}", served.log());
        }
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
}
