//! Runs a real NATS cluster for integration tests and benches: `n`
//! `nats-server` processes on 127.0.0.1, clustered over loopback routes, each
//! with JetStream on and its own store dir, so streams with up to `n`
//! replicas survive the loss of a minority. Any server can be killed with
//! SIGKILL and restarted on the same ports and store dir.
//!
//! Health comes from each server's monitoring port: `/healthz` (the server's
//! JetStream is current with the meta leader and its streams and consumers
//! are current) and `/jsz` (the meta leader and, in the leader's view, which
//! peers are current). The binary is found as for [`NatsServer`](super::nats_server::NatsServer).

// Shared by several test binaries, each of which uses only part of the API.
#![allow(dead_code)]

use super::nats_server::{answers_info, find_binary, free_port, install_hint};
use serde_json::Value;
use std::fs::{self, File};
use std::io::{Read, Write};
use std::net::{Ipv4Addr, SocketAddr, TcpStream};
use std::path::PathBuf;
use std::process::{Child, Command, Stdio};
use std::thread;
use std::time::{Duration, Instant};

/// How long a server may take to accept connections after its launch.
const READY_TIMEOUT: Duration = Duration::from_secs(10);
/// How long the cluster may take to elect a meta leader and catch every running server up.
const HEALTHY_TIMEOUT: Duration = Duration::from_secs(45);
/// Whole-cluster starts tried with fresh ports when one is taken under us.
const START_ATTEMPTS: u32 = 5;
/// Tries of [`NatsCluster::restart`] while a port of the killed server is still in use.
const RESTART_ATTEMPTS: u32 = 20;
const RESTART_BACKOFF: Duration = Duration::from_millis(250);
/// The `--cluster_name` of every test cluster.
pub const CLUSTER_NAME: &str = "capdex-test";

/// A running cluster of `nats-server` children, all killed when dropped.
pub struct NatsCluster {
    servers: Vec<ClusterServer>,
    binary: PathBuf,
    /// Holds one folder per server (`n<i>/store`, its log files).
    /// Declared last so it is removed after the processes are gone.
    dir: tempfile::TempDir,
}

/// One server of the cluster: its ports stay the same across restarts.
struct ClusterServer {
    child: Option<Child>,
    name: String,
    port: u16,
    cluster_port: u16,
    monitor_port: u16,
    launches: u32,
}

/// Why one launch did not come up.
struct LaunchError {
    addr_in_use: bool,
    message: String,
}

impl NatsCluster {
    /// Starts `n` servers (`n0`, `n1`, ...) clustered over loopback routes
    /// with JetStream on, and waits until they have a meta leader and every
    /// server is current.
    ///
    /// Panics if no nats-server binary is found, or the cluster is not
    /// healthy within about 45 s (with the servers' logs in the message).
    pub fn start(n: usize) -> NatsCluster {
        assert!(n >= 1, "a cluster needs at least one server");
        let binary = find_binary();
        let dir = tempfile::Builder::new().prefix("capdex-nats-cluster-").tempdir().expect("create temporary dir");
        let mut cluster = NatsCluster { servers: Vec::new(), binary, dir };
        let mut attempt = 1;
        loop {
            cluster.kill_all();
            cluster.servers = (0..n)
                .map(|i| ClusterServer {
                    child: None,
                    name: format!("n{i}"),
                    port: free_port(),
                    cluster_port: free_port(),
                    monitor_port: free_port(),
                    launches: 0,
                })
                .collect();
            let launched = (0..n).try_for_each(|i| cluster.launch(i));
            match launched {
                Ok(()) => break,
                // Someone else grabbed a port between probing and binding.
                Err(e) if e.addr_in_use && attempt < START_ATTEMPTS => attempt += 1,
                Err(e) => panic!("{}", e.message),
            }
        }
        cluster.wait_healthy();
        cluster
    }

    /// The number of servers (running or not).
    pub fn size(&self) -> usize {
        self.servers.len()
    }

    /// `nats://127.0.0.1:PORT` of server `i`.
    pub fn url(&self, i: usize) -> String {
        format!("nats://127.0.0.1:{}", self.servers[i].port)
    }

    /// Every server's URL, comma-separated, server `first` first and the
    /// others in order (the `[nats] url` of a node near server `first`).
    pub fn urls_from(&self, first: usize) -> String {
        let order = std::iter::once(first).chain((0..self.size()).filter(|i| *i != first));
        order.map(|i| self.url(i)).collect::<Vec<_>>().join(",")
    }

    /// Every server's URL, in order, for a client's server list.
    pub fn urls(&self) -> Vec<String> {
        (0..self.size()).map(|i| self.url(i)).collect()
    }

    /// The client port of server `i`.
    pub fn port(&self, i: usize) -> u16 {
        self.servers[i].port
    }

    /// The `--server_name` of server `i` (`n<i>`).
    pub fn name(&self, i: usize) -> &str {
        &self.servers[i].name
    }

    /// The process id of server `i`, while it runs.
    pub fn pid(&self, i: usize) -> Option<u32> {
        self.servers[i].child.as_ref().map(Child::id)
    }

    /// The JetStream store dir of server `i` (kept across restarts).
    pub fn store_dir(&self, i: usize) -> PathBuf {
        self.dir.path().join(&self.servers[i].name).join("store")
    }

    /// Whether server `i` is running.
    pub fn is_running(&mut self, i: usize) -> bool {
        match &mut self.servers[i].child {
            Some(child) => matches!(child.try_wait(), Ok(None)),
            None => false,
        }
    }

    /// Server `i`'s output of its latest launch.
    pub fn log(&self, i: usize) -> String {
        fs::read_to_string(self.log_path(i, self.servers[i].launches)).unwrap_or_default()
    }

    /// Kills server `i` with SIGKILL (as a crash would) and waits for it to
    /// exit; does not wait for the others to notice (see [`NatsCluster::wait_healthy`]).
    pub fn kill_9(&mut self, i: usize) {
        if let Some(mut child) = self.servers[i].child.take() {
            let _ = child.kill();
            let _ = child.wait();
        }
    }

    /// Starts server `i` again on the same ports with the same store dir
    /// (killing it first if it still runs), then waits until the cluster is
    /// healthy again: a meta leader, every server current, its streams caught up.
    pub fn restart(&mut self, i: usize) {
        self.kill_9(i);
        let mut attempt = 1;
        loop {
            match self.launch(i) {
                Ok(()) => break,
                Err(e) if e.addr_in_use && attempt < RESTART_ATTEMPTS => {
                    attempt += 1;
                    thread::sleep(RESTART_BACKOFF);
                }
                Err(e) => panic!("{}", e.message),
            }
        }
        self.wait_healthy();
    }

    /// Waits until the running servers are healthy: each answers `/healthz`
    /// with `ok`, all name the same meta leader, that leader is running and
    /// sees every running server as current. With a minority down this holds
    /// once the majority has (re-)elected a leader. Panics after about 45 s.
    pub fn wait_healthy(&mut self) {
        let deadline = Instant::now() + HEALTHY_TIMEOUT;
        loop {
            let problem = match self.health_problem() {
                None => return,
                Some(problem) => problem,
            };
            if Instant::now() >= deadline {
                let logs: String = (0..self.size())
                    .map(|i| format!("--- {} (last 30 lines) ---\n{}\n", self.name(i), tail(&self.log(i), 30)))
                    .collect();
                panic!("the NATS cluster is not healthy after {HEALTHY_TIMEOUT:?}: {problem}\n{logs}");
            }
            thread::sleep(Duration::from_millis(100));
        }
    }

    /// What keeps the running servers from being healthy now, if anything.
    fn health_problem(&mut self) -> Option<String> {
        let running: Vec<usize> = (0..self.size()).filter(|i| self.is_running(*i)).collect();
        if running.is_empty() {
            return Some("no server is running".into());
        }
        let mut leaders = Vec::new();
        for &i in &running {
            let monitor = self.servers[i].monitor_port;
            match http_get(monitor, "/healthz") {
                Ok(body) if body.contains("\"ok\"") => {}
                Ok(body) => return Some(format!("{} /healthz: {}", self.name(i), body.trim())),
                Err(e) => return Some(format!("{} /healthz: {e}", self.name(i))),
            }
            let jsz = match http_get(monitor, "/jsz").map(|body| serde_json::from_str::<Value>(&body)) {
                Ok(Ok(jsz)) => jsz,
                other => return Some(format!("{} /jsz: {other:?}", self.name(i))),
            };
            if self.size() > 1 {
                leaders.push((i, jsz["meta_cluster"]["leader"].as_str().unwrap_or("").to_string(), jsz));
            }
        }
        let (_, leader, _) = leaders.first()?;
        if leaders.iter().any(|(_, other, _)| other != leader) {
            let views: Vec<String> = leaders.iter().map(|(i, l, _)| format!("{}→{l:?}", self.name(*i))).collect();
            return Some(format!("servers disagree on the meta leader: {}", views.join(", ")));
        }
        let Some((_, _, leader_jsz)) = leaders.iter().find(|(i, _, _)| self.name(*i) == leader) else {
            return Some(format!("the meta leader {leader:?} is not a running server"));
        };
        let replicas = leader_jsz["meta_cluster"]["replicas"].as_array().cloned().unwrap_or_default();
        for &i in &running {
            let name = self.name(i);
            if name == leader {
                continue;
            }
            let current = replicas.iter().any(|peer| peer["name"] == name && peer["current"] == true);
            if !current {
                return Some(format!("the meta leader {leader} does not see {name} as current"));
            }
        }
        None
    }

    fn log_path(&self, i: usize, launch: u32) -> PathBuf {
        self.dir.path().join(&self.servers[i].name).join(format!("nats-server.{launch}.log"))
    }

    /// Spawns server `i` on its ports, with routes to every other server,
    /// and waits until it answers with its `INFO` line.
    fn launch(&mut self, i: usize) -> Result<(), LaunchError> {
        self.servers[i].launches += 1;
        let folder = self.dir.path().join(&self.servers[i].name);
        fs::create_dir_all(&folder).expect("create the server's folder");
        let log_path = self.log_path(i, self.servers[i].launches);
        let log = File::create(&log_path).expect("create nats-server log file");
        let routes: Vec<String> = (0..self.size())
            .filter(|j| *j != i)
            .map(|j| format!("nats://127.0.0.1:{}", self.servers[j].cluster_port))
            .collect();
        let server = &self.servers[i];
        let mut command = Command::new(&self.binary);
        command
            .args(["-a", "127.0.0.1", "-p", &server.port.to_string(), "-js", "--store_dir"])
            .arg(folder.join("store"))
            .args(["--server_name", &server.name, "-m", &server.monitor_port.to_string()]);
        // One server is a plain server: a cluster block without peers would wait for them.
        if !routes.is_empty() {
            command
                .args(["--cluster_name", CLUSTER_NAME])
                .args(["--cluster", &format!("nats://127.0.0.1:{}", server.cluster_port)])
                .args(["--routes", &routes.join(",")]);
        }
        command.stdin(Stdio::null()).stdout(log.try_clone().expect("clone log file handle")).stderr(log);
        let child = command
            .spawn()
            .unwrap_or_else(|e| panic!("could not run nats-server {}: {e}\n{}", self.binary.display(), install_hint()));
        let addr = SocketAddr::from((Ipv4Addr::LOCALHOST, server.port));
        self.servers[i].child = Some(child);
        let deadline = Instant::now() + READY_TIMEOUT;
        loop {
            let child = self.servers[i].child.as_mut().expect("child was just spawned");
            if let Ok(Some(status)) = child.try_wait() {
                self.servers[i].child = None;
                let output = fs::read_to_string(&log_path).unwrap_or_default();
                return Err(LaunchError {
                    addr_in_use: output.to_lowercase().contains("address already in use"),
                    message: format!(
                        "nats-server {} exited with {status} while starting; its output:\n{output}",
                        self.name(i)
                    ),
                });
            }
            if answers_info(addr) {
                thread::sleep(Duration::from_millis(20));
                if let Ok(None) = child.try_wait() {
                    return Ok(());
                }
                continue;
            }
            if Instant::now() >= deadline {
                self.kill_9(i);
                let output = fs::read_to_string(&log_path).unwrap_or_default();
                return Err(LaunchError {
                    addr_in_use: false,
                    message: format!(
                        "nats-server {} did not accept connections on {addr} within {READY_TIMEOUT:?}; its output:\n{output}",
                        self.name(i)
                    ),
                });
            }
            thread::sleep(Duration::from_millis(25));
        }
    }

    fn kill_all(&mut self) {
        for i in 0..self.servers.len() {
            self.kill_9(i);
        }
    }
}

impl Drop for NatsCluster {
    fn drop(&mut self) {
        self.kill_all();
    }
}

/// The body of `GET path` on the monitoring port (HTTP/1.0, so the server closes the connection).
fn http_get(port: u16, path: &str) -> std::io::Result<String> {
    let addr = SocketAddr::from((Ipv4Addr::LOCALHOST, port));
    let mut stream = TcpStream::connect_timeout(&addr, Duration::from_millis(500))?;
    stream.set_read_timeout(Some(Duration::from_secs(2)))?;
    write!(stream, "GET {path} HTTP/1.0\r\nHost: 127.0.0.1\r\n\r\n")?;
    let mut response = String::new();
    stream.read_to_string(&mut response)?;
    match response.split_once("\r\n\r\n") {
        Some((_, body)) => Ok(body.to_string()),
        None => Err(std::io::Error::other(format!("not an HTTP response: {response:?}"))),
    }
}

/// The last `n` lines of `text`.
fn tail(text: &str, n: usize) -> String {
    let lines: Vec<&str> = text.lines().collect();
    lines[lines.len().saturating_sub(n)..].join("\n")
}
