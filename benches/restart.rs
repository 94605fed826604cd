//! Restart on a full data dir (issue 23): how long a `capdex serve` node
//! takes, from its process start, to answer `capdex.v1.discover` over NATS
//! with the whole catalog, when its data dir already holds N capabilities.
//!
//! The data dir is filled once by `capdex index --catalog` (N synthetic
//! capabilities, `capdex::bench::synthetic_catalog`, built-in embedder), then
//! the node is started, asked until it answers a discovery whose catalog holds
//! all N, stopped with SIGTERM, and started again, several times. Nothing may
//! be embedded again on a restart: the node's `capdex_embedder_texts_total`
//! (Prometheus) must stay at zero.
//!
//! Run with `cargo bench --bench restart` (100,000 capabilities, 5 restarts;
//! `CAPDEX_BENCH_RESTART_N` changes N). Needs nats-server (`CAPDEX_NATS_SERVER`,
//! `.venv/bin/nats-server` or `PATH`). The node is this build's `capdex`, or
//! `CAPDEX_BENCH_SERVE_BIN`. Without `--bench` (`cargo test --benches`) it runs
//! once on 2,000 capabilities as a smoke test. `CAPDEX_BENCH_RESTART_KEEP=DIR`
//! keeps the filled data dir in DIR (and reuses it when it is there), so a
//! profiler can be pointed at `capdex serve` on it.

#[path = "../tests/it/support/nats_server.rs"]
mod nats_server;

use serde_json::{json, Value};
use std::collections::BTreeMap;
use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};
use std::time::{Duration, Instant};

fn main() {
    let full = std::env::args().any(|arg| arg == "--bench" || arg == "--full");
    let n: usize = std::env::var("CAPDEX_BENCH_RESTART_N").ok().and_then(|n| n.parse().ok()).unwrap_or(if full {
        100_000
    } else {
        2_000
    });
    let restarts = if full { 5 } else { 1 };
    let binary: PathBuf = std::env::var_os("CAPDEX_BENCH_SERVE_BIN")
        .map(PathBuf::from)
        .unwrap_or_else(|| PathBuf::from(env!("CARGO_BIN_EXE_capdex")));

    let work = tempfile::tempdir().expect("a temporary folder");
    let kept = std::env::var_os("CAPDEX_BENCH_RESTART_KEEP").map(PathBuf::from);
    let data = kept.clone().unwrap_or_else(|| work.path().join("data"));
    let reuse = kept.as_ref().is_some_and(|dir| dir.read_dir().is_ok_and(|mut entries| entries.next().is_some()));
    let caps = work.path().join("capabilities");
    std::fs::create_dir_all(&caps).expect("a capability folder");
    let nats = nats_server::NatsServer::start();
    let metrics_port = nats_server::free_port();
    let env: BTreeMap<&str, String> = [
        ("CAPDEX_NATS_URL", nats.url()),
        ("CAPDEX_DATA_DIR", data.display().to_string()),
        ("CAPDEX_CAPABILITY_DIRS", caps.display().to_string()),
        ("CAPDEX_WATCH", "false".into()),
        // The built-in embedder, as in the figures of docs/performance.md.
        ("CAPDEX_EMBEDDER_BACKEND", "builtin".into()),
        ("CAPDEX_METRICS_LISTEN_ADDR", format!("127.0.0.1:{metrics_port}")),
        ("CAPDEX_LOG", "warn".into()),
    ]
    .into_iter()
    .collect();

    println!(
        "capdex restart bench: {n} capabilities, built-in embedder, {} mode, node {}",
        if full { "full" } else { "smoke" },
        binary.display()
    );
    if reuse {
        println!("  reusing the data dir {}", data.display());
    } else {
        fill(&binary, &env, work.path(), n);
    }
    println!("  data dir {:.1} MB", dir_bytes(&data) as f64 / 1e6);

    let runtime = tokio::runtime::Builder::new_current_thread().enable_all().build().expect("a runtime");
    let client = runtime.block_on(async_nats::connect(nats.url())).expect("bench client connects");
    let mut ready = Vec::new();
    for trial in 0..restarts {
        let started = Instant::now();
        let mut node =
            node_command(&binary, &env).arg("serve").stdout(Stdio::null()).spawn().expect("capdex serve starts");
        let answer = runtime.block_on(first_full_answer(&client, n, &mut node));
        let elapsed = started.elapsed();
        let rss = rss_bytes(node.id());
        // The built-in embedder (as the static one) embeds queries in the discovery workers, so
        // the Embedder's count is the catalog's texts embedded since start.
        let embedded = embedded_texts(metrics_port);
        stop(&mut node);
        assert_eq!(embedded, 0, "restart {} embedded {embedded} texts again", trial + 1);
        println!(
            "  restart {}: answered discovery with all {n} capabilities {:.0} ms after its start ({} Tier 1 entries; RSS {:.0} MB)",
            trial + 1,
            elapsed.as_secs_f64() * 1e3,
            answer["tier1"].as_array().map_or(0, Vec::len),
            rss as f64 / 1e6
        );
        ready.push(elapsed);
    }
    ready.sort();
    let median = ready[ready.len() / 2];
    let worst = ready[ready.len() - 1];
    println!(
        "  ready after restart: median {:.0} ms, worst {:.0} ms{}",
        median.as_secs_f64() * 1e3,
        worst.as_secs_f64() * 1e3,
        if full && n >= 100_000 {
            format!(" (target <= 1 s at 100,000: {})", if worst <= Duration::from_secs(1) { "met" } else { "MISSED" })
        } else {
            String::new()
        }
    );
}

/// Fills the data dir named in `env` with `n` synthetic capabilities by
/// `capdex index --catalog`, through the same Indexer a node runs.
fn fill(binary: &Path, env: &BTreeMap<&str, String>, work: &Path, n: usize) {
    let catalog = work.join("catalog.json");
    let descriptors = capdex::bench::synthetic_catalog(n);
    std::fs::write(&catalog, serde_json::to_vec(&descriptors).expect("the catalog encodes")).expect("catalog written");
    drop(descriptors);
    let started = Instant::now();
    let status = node_command(binary, env)
        .args(["index", "--catalog"])
        .arg(&catalog)
        .stdout(Stdio::null())
        .status()
        .expect("capdex index runs");
    assert!(status.success(), "capdex index failed: {status}");
    let fill = started.elapsed();
    println!("  filled by `capdex index --catalog` in {:.2} s", fill.as_secs_f64());
}

/// `binary` with `env`, without the bench's own variables (capdex refuses a
/// `CAPDEX_*` variable that names no setting).
fn node_command(binary: &Path, env: &BTreeMap<&str, String>) -> Command {
    let mut command = Command::new(binary);
    command.envs(env).env_remove("CAPDEX_BENCH_RESTART_N").env_remove("CAPDEX_BENCH_RESTART_KEEP");
    command
}

/// Asks `capdex.v1.discover` until the node answers with every one of the `n`
/// capabilities in its catalog; returns the reply.
async fn first_full_answer(client: &async_nats::Client, n: usize, node: &mut Child) -> Value {
    let deadline = Instant::now() + Duration::from_secs(600);
    let request = json!({"message": "please search my files on github"}).to_string();
    loop {
        assert!(node.try_wait().expect("the node's status").is_none(), "capdex serve exited before answering");
        assert!(Instant::now() < deadline, "capdex serve did not answer with the whole catalog within 600 s");
        let reply = tokio::time::timeout(
            Duration::from_millis(250),
            client.request("capdex.v1.discover", request.clone().into()),
        )
        .await;
        if let Ok(Ok(message)) = reply {
            let reply: Value = serde_json::from_slice(&message.payload).unwrap_or(Value::Null);
            let indexed = reply["diagnostics"]["totalIndexed"].as_u64().unwrap_or(0) as usize;
            if indexed >= n {
                assert!(reply["tier1"].as_array().is_some_and(|tier1| !tier1.is_empty()), "no Tier 1: {reply}");
                return reply;
            }
        }
        tokio::time::sleep(Duration::from_millis(5)).await;
    }
}

/// Stops a node with SIGTERM, as an orchestrator does, and waits for it.
fn stop(node: &mut Child) {
    let _ = Command::new("kill").args(["-TERM", &node.id().to_string()]).status();
    let deadline = Instant::now() + Duration::from_secs(30);
    while node.try_wait().expect("the node's status").is_none() {
        if Instant::now() > deadline {
            let _ = node.kill();
            let _ = node.wait();
            panic!("capdex serve did not stop within 30 s of SIGTERM");
        }
        std::thread::sleep(Duration::from_millis(20));
    }
}

/// `capdex_embedder_texts_total` on the node's metrics endpoint (0 when not yet counted).
fn embedded_texts(port: u16) -> u64 {
    use std::io::{Read, Write};
    let mut stream = std::net::TcpStream::connect(("127.0.0.1", port)).expect("the metrics endpoint answers");
    stream.set_read_timeout(Some(Duration::from_secs(10))).expect("a read timeout");
    write!(stream, "GET /metrics HTTP/1.1\r\nHost: 127.0.0.1\r\nConnection: close\r\n\r\n").expect("request sent");
    let mut text = String::new();
    stream.read_to_string(&mut text).expect("the metrics read");
    text.lines()
        .filter(|line| line.starts_with("capdex_embedder_texts_total"))
        .filter_map(|line| line.split_whitespace().last()?.parse::<f64>().ok())
        .sum::<f64>() as u64
}

fn rss_bytes(pid: u32) -> u64 {
    let status = std::fs::read_to_string(format!("/proc/{pid}/status")).unwrap_or_default();
    status
        .lines()
        .find_map(|line| line.strip_prefix("VmRSS:"))
        .and_then(|value| value.trim().trim_end_matches("kB").trim().parse::<u64>().ok())
        .map_or(0, |kb| kb * 1024)
}

fn dir_bytes(dir: &Path) -> u64 {
    let Ok(entries) = std::fs::read_dir(dir) else { return 0 };
    entries
        .flatten()
        .map(|entry| match entry.metadata() {
            Ok(meta) if meta.is_dir() => dir_bytes(&entry.path()),
            Ok(meta) => meta.len(),
            Err(_) => 0,
        })
        .sum()
}
