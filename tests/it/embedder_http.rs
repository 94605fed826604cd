//! The HTTP embedder through the real binary and the real actors, against a
//! tiny embeddings server on 127.0.0.1 that counts what it is asked:
//! batches of at most 32, nothing re-embedded on re-registration or restart,
//! and best effort when the endpoint is down (indexing completes, discovery
//! answers lexically and says so, the vectors are fetched later).

use crate::cli::capdex;
use crate::support::nats_server::free_port;
use serde_json::{json, Value};
use std::io::{BufRead, BufReader, Read, Write};
use std::net::TcpListener;
use std::path::Path;
use std::sync::{Arc, Mutex};

/// Texts of every request the server answered, in order.
type Seen = Arc<Mutex<Vec<Vec<String>>>>;

/// A deterministic unit-free 16-dimensional vector per text (word hashes).
fn vector_of(text: &str) -> Vec<f32> {
    let mut vector = vec![0.0f32; 16];
    for word in text.to_lowercase().split(|c: char| !c.is_alphanumeric()).filter(|w| !w.is_empty()) {
        // The server's one piece of meaning, which no word, field or lexicon entry of capdex
        // knows: `frumious` means `invoice`.
        let word = if word == "frumious" { "invoice" } else { word };
        let hash = word.bytes().fold(0xcbf2_9ce4_8422_2325u64, |h, b| (h ^ u64::from(b)).wrapping_mul(0x100_0000_01b3));
        vector[(hash % 16) as usize] += 1.0;
    }
    vector
}

/// Serves OpenAI-style embeddings on `listener` until the test ends.
fn serve_on(listener: TcpListener) -> Seen {
    let seen: Seen = Arc::new(Mutex::new(Vec::new()));
    let log = seen.clone();
    std::thread::spawn(move || {
        for stream in listener.incoming() {
            let Ok(stream) = stream else { continue };
            let log = log.clone();
            std::thread::spawn(move || {
                let mut reader = BufReader::new(stream);
                let mut length = 0usize;
                loop {
                    let mut line = String::new();
                    if reader.read_line(&mut line).unwrap_or(0) == 0 {
                        return;
                    }
                    if line.trim_end().is_empty() {
                        break;
                    }
                    if let Some(value) = line.to_ascii_lowercase().strip_prefix("content-length:") {
                        length = value.trim().parse().unwrap_or(0);
                    }
                }
                let mut body = vec![0u8; length];
                if reader.read_exact(&mut body).is_err() {
                    return;
                }
                let request: Value = serde_json::from_slice(&body).unwrap_or(Value::Null);
                let inputs: Vec<String> = serde_json::from_value(request["input"].clone()).unwrap_or_default();
                let data: Vec<Value> = inputs
                    .iter()
                    .enumerate()
                    .map(|(index, text)| json!({"object": "embedding", "index": index, "embedding": vector_of(text)}))
                    .collect();
                log.lock().unwrap().push(inputs);
                let answer = json!({"object": "list", "data": data, "model": request["model"]}).to_string();
                let mut stream = reader.into_inner();
                let _ = write!(
                    stream,
                    "HTTP/1.1 200 OK\r\ncontent-type: application/json\r\ncontent-length: {}\r\nconnection: close\r\n\r\n{answer}",
                    answer.len()
                );
            });
        }
    });
    seen
}

/// A catalog of `n` tools; `tweak` names one whose description changes.
fn write_catalog(path: &Path, n: usize, changed: Option<usize>) {
    let items: Vec<Value> = (0..n)
        .map(|i| {
            let description = if changed == Some(i) {
                format!("Archive old invoices number {i} into cold storage")
            } else {
                format!("Send message batch {i} to the team channel about topic {}", i % 7)
            };
            json!({"id": format!("tool:notify-{i}"), "kind": "tool", "name": format!("notify-{i}"),
                   "description": description, "category": "communication", "tags": ["chat", "notify"]})
        })
        .collect();
    std::fs::write(path, serde_json::to_string(&items).unwrap()).unwrap();
}

fn http_env(command: &mut std::process::Command, endpoint: &str, data_dir: &Path) {
    command
        .env("CAPDEX_EMBEDDER_BACKEND", "http")
        .env("CAPDEX_EMBEDDER_ENDPOINT", endpoint)
        .env("CAPDEX_EMBEDDER_MODEL", "counting-test")
        .env("CAPDEX_EMBEDDER_RETRIES", "0")
        .env("CAPDEX_EMBEDDER_TIMEOUT_MS", "5000")
        .env("CAPDEX_DATA_DIR", data_dir)
        .env("CAPDEX_CAPABILITY_DIRS", "");
}

fn index(endpoint: &str, data_dir: &Path, catalog: &Path) -> String {
    let mut command = capdex();
    http_env(&mut command, endpoint, data_dir);
    let output = command.args(["index", "--catalog"]).arg(catalog).output().unwrap();
    let stderr = String::from_utf8_lossy(&output.stderr).to_string();
    assert!(output.status.success(), "capdex index failed: {stderr}");
    stderr
}

#[test]
fn batches_of_32_and_nothing_embedded_twice() {
    let listener = TcpListener::bind("127.0.0.1:0").unwrap();
    let endpoint = format!("http://{}", listener.local_addr().unwrap());
    let seen = serve_on(listener);
    let dir = tempfile::tempdir().unwrap();
    let (data_dir, catalog) = (dir.path().join("data"), dir.path().join("catalog.json"));
    write_catalog(&catalog, 70, None);

    index(&endpoint, &data_dir, &catalog);
    let first: Vec<Vec<String>> = seen.lock().unwrap().clone();
    let texts: usize = first.iter().map(Vec::len).sum();
    assert!(texts >= 70, "every capability is embedded once: {texts} texts");
    assert!(
        first.iter().all(|batch| !batch.is_empty() && batch.len() <= 32),
        "{:?}",
        first.iter().map(Vec::len).collect::<Vec<_>>()
    );
    assert!(
        first.iter().filter(|batch| batch.iter().any(|t| t.contains("Send message batch"))).count() >= 3,
        "70 texts need 3 requests"
    );

    // A restart with the same catalog: every vector comes from the store.
    let stderr = index(&endpoint, &data_dir, &catalog);
    assert_eq!(seen.lock().unwrap().len(), first.len(), "a restart embedded again: {stderr}");

    // One changed capability: one text in one request.
    write_catalog(&catalog, 70, Some(5));
    index(&endpoint, &data_dir, &catalog);
    let after: Vec<Vec<String>> = seen.lock().unwrap()[first.len()..].to_vec();
    assert_eq!(after.len(), 1, "{after:?}");
    assert_eq!(after[0].len(), 1);
    assert!(after[0][0].contains("Archive old invoices number 5"), "{after:?}");
}

#[test]
fn a_closed_port_leaves_discovery_lexical_and_says_so() {
    let endpoint = format!("http://127.0.0.1:{}", free_port());
    let dir = tempfile::tempdir().unwrap();
    let (data_dir, catalog) = (dir.path().join("data"), dir.path().join("catalog.json"));
    write_catalog(&catalog, 40, Some(3));
    let mut command = capdex();
    http_env(&mut command, &endpoint, &data_dir);
    let output = command
        .args(["discover", "archive old invoices into cold storage", "--json", "--catalog"])
        .arg(&catalog)
        .output()
        .unwrap();
    let stderr = String::from_utf8_lossy(&output.stderr);
    assert!(output.status.success(), "{stderr}");
    let result: Value = serde_json::from_slice(&output.stdout).unwrap();
    let embedder = result["diagnostics"]["embedder"].as_str().unwrap();
    assert!(embedder.starts_with("unavailable: embedder_unavailable"), "{embedder}");
    let tier1 = result["tier1"].as_array().unwrap();
    assert_eq!(tier1[0]["id"], "tool:notify-3", "{tier1:?}");
    for entry in tier1 {
        let relevance = entry["relevance"].as_f64().unwrap();
        assert!((0.0..=1.0).contains(&relevance), "{entry}");
    }
    assert!(result["diagnostics"]["totalIndexed"].as_u64().unwrap() >= 40);
}

/// With a neural backend the chatter gate is on by default (`chatter_gate = "auto"`): the
/// chatter sentences are asked of the endpoint once, with the first query, and chatter gets
/// an empty Tier 1 while a request keeps its capability; `false` turns the gate off.
#[test]
fn chatter_gets_an_empty_tier1_with_a_neural_embedder() {
    let listener = TcpListener::bind("127.0.0.1:0").unwrap();
    let endpoint = format!("http://{}", listener.local_addr().unwrap());
    let seen = serve_on(listener);
    let dir = tempfile::tempdir().unwrap();
    let (data_dir, catalog) = (dir.path().join("data"), dir.path().join("catalog.json"));
    write_catalog(&catalog, 20, Some(3));
    index(&endpoint, &data_dir, &catalog);
    let discover = |message: &str, gate: Option<&str>| -> Value {
        let mut command = capdex();
        http_env(&mut command, &endpoint, &data_dir);
        if let Some(gate) = gate {
            command.env("CAPDEX_DISCOVERY_CHATTER_GATE", gate);
        }
        let output = command.args(["discover", message, "--json", "--catalog"]).arg(&catalog).output().unwrap();
        assert!(output.status.success(), "{}", String::from_utf8_lossy(&output.stderr));
        serde_json::from_slice(&output.stdout).unwrap()
    };
    let chatter = "thanks a lot for your help, see you tomorrow";
    let gated = discover(chatter, None);
    assert_eq!(gated["diagnostics"]["embedder"], "ok");
    assert_eq!(gated["diagnostics"]["chatter"]["nothingFits"], true, "{}", gated["diagnostics"]);
    assert!(gated["tier1"].as_array().unwrap().is_empty(), "{}", gated["tier1"]);
    assert!(gated["tier2"].as_array().unwrap().is_empty());
    let asked = seen.lock().unwrap().clone();
    assert!(asked.iter().any(|batch| batch.iter().any(|text| text == "see you tomorrow")), "the sentences were asked");
    let request = discover("archive old invoices into cold storage", None);
    assert_eq!(request["diagnostics"]["chatter"]["nothingFits"], false, "{}", request["diagnostics"]);
    assert_eq!(request["tier1"][0]["id"], "tool:notify-3", "{}", request["tier1"]);
    // Off, the sentences are not asked for at all.
    let asked_for_sentences =
        || seen.lock().unwrap().iter().filter(|batch| batch.iter().any(|text| text == "see you tomorrow")).count();
    let before = asked_for_sentences();
    let ungated = discover(chatter, Some("false"));
    assert!(ungated["diagnostics"].get("chatter").is_none(), "{}", ungated["diagnostics"]);
    assert_eq!(asked_for_sentences(), before);
}

#[test]
fn vectors_missed_while_down_are_fetched_later() {
    use capdex::actors::indexer::{RetryEmbeddings, SyncCapabilities};
    let port = free_port();
    let dir = tempfile::tempdir().unwrap();
    let env: capdex::config::Environment = [
        ("CAPDEX_EMBEDDER_BACKEND", "http".to_string()),
        ("CAPDEX_EMBEDDER_ENDPOINT", format!("http://127.0.0.1:{port}")),
        ("CAPDEX_EMBEDDER_MODEL", "counting-test".to_string()),
        ("CAPDEX_EMBEDDER_RETRIES", "0".to_string()),
        ("CAPDEX_DATA_DIR", dir.path().join("data").display().to_string()),
        ("CAPDEX_METRICS_LISTEN_ADDR", String::new()),
    ]
    .into_iter()
    .map(|(k, v)| (k.to_string(), v))
    .collect();
    let settings = capdex::config::Settings::load(None, &env).unwrap();
    let catalog = dir.path().join("catalog.json");
    write_catalog(&catalog, 10, None);
    let items: Vec<Value> = serde_json::from_str(&std::fs::read_to_string(&catalog).unwrap()).unwrap();
    let descriptors = capdex::core::registration::normalise_catalog(&items, 128).descriptors;
    actix_rt::System::new().block_on(async move {
        let actors = capdex::app::start(&settings).await.unwrap();
        let report = actors.indexer.send(SyncCapabilities::replace("file:test", descriptors)).await.unwrap().unwrap();
        assert_eq!(report.upserted, 10);
        assert_eq!(report.embedded, 0);
        assert!(report.pending >= 10, "{report:?}");
        assert!(report.embedder_error.as_deref().unwrap_or("").contains("embedder_unavailable"), "{report:?}");
        let down = capdex::app::discover(&actors, "notify-4", Default::default()).await.unwrap();
        assert_eq!(down.tier1[0].id, "tool:notify-4");
        assert!(down.diagnostics.embedder.starts_with("unavailable"));

        // The endpoint comes up: a retry fetches every missing vector.
        let seen = serve_on(TcpListener::bind(("127.0.0.1", port)).unwrap());
        let retry = actors.indexer.send(RetryEmbeddings).await.unwrap().unwrap();
        assert_eq!(retry.pending, 0, "{retry:?}");
        assert!(retry.embedded >= 10);
        assert!(seen.lock().unwrap().iter().all(|batch| batch.len() <= 32));
        let up =
            capdex::app::discover(&actors, "send a message to the team channel", Default::default()).await.unwrap();
        assert_eq!(up.diagnostics.embedder, "ok");
        assert!(up.tier1.iter().all(|entry| (0.0..=1.0).contains(&entry.relevance)));
        assert!(!up.tier1.is_empty());
        let again = actors.indexer.send(RetryEmbeddings).await.unwrap().unwrap();
        assert_eq!((again.embedded, again.pending), (0, 0));
    });
}

/// `capdex eval --cache-dir`: a second evaluation with the same model asks
/// the endpoint nothing and ranks exactly as the first; another model misses
/// the cache.
#[test]
fn eval_with_a_cache_embeds_nothing_twice() {
    let listener = TcpListener::bind("127.0.0.1:0").unwrap();
    let endpoint = format!("http://{}", listener.local_addr().unwrap());
    let seen = serve_on(listener);
    let dir = tempfile::tempdir().unwrap();
    let (tools, queries, cache) =
        (dir.path().join("tools.jsonl"), dir.path().join("queries.jsonl"), dir.path().join("cache"));
    let tool_lines: Vec<String> = (0..40)
        .map(|i| {
            json!({"id": format!("t{i}"), "name": format!("notify{i}"),
                   "description": format!("Send message batch {i} about topic {}", i % 7)})
            .to_string()
        })
        .collect();
    std::fs::write(&tools, tool_lines.join("\n") + "\n").unwrap();
    let query_lines: Vec<String> = (0..10)
        .map(|i| {
            json!({"query": format!("send batch {i}, then topic {}", i % 3), "relevant": [format!("t{i}")]}).to_string()
        })
        .collect();
    std::fs::write(&queries, query_lines.join("\n") + "\n").unwrap();
    let run = |model: &str, out: &Path| {
        let output = capdex()
            .args(["eval", "--json", "--embedder", "http", "--endpoint", &endpoint, "--model", model, "--tools"])
            .arg(&tools)
            .arg("--queries")
            .arg(&queries)
            .arg("--cache-dir")
            .arg(&cache)
            .arg("--out")
            .arg(out)
            .env("CAPDEX_EMBEDDER_RETRIES", "0")
            .output()
            .unwrap();
        assert!(output.status.success(), "capdex eval failed: {}", String::from_utf8_lossy(&output.stderr));
        std::fs::read_to_string(out).unwrap()
    };
    let first = run("counting-test", &dir.path().join("run-1.jsonl"));
    let asked = seen.lock().unwrap().iter().map(Vec::len).sum::<usize>();
    assert!(asked >= 50, "40 tools and 10 queries with their clauses are embedded: {asked} texts");
    let second = run("counting-test", &dir.path().join("run-2.jsonl"));
    assert_eq!(seen.lock().unwrap().iter().map(Vec::len).sum::<usize>(), asked, "the second run asked the endpoint");
    assert_eq!(first, second, "cached vectors rank as fresh ones");
    run("another-model", &dir.path().join("run-3.jsonl"));
    assert_eq!(seen.lock().unwrap().iter().map(Vec::len).sum::<usize>(), 2 * asked, "another model shares no vector");
}

/// `capdex route` with the `http` embedder: the graph's texts and the question are embedded
/// by the server (on the Embedder's thread, not the graph actor's), and the route follows
/// the server's meaning, which words alone do not reach.
#[test]
fn route_uses_the_configured_http_embedder() {
    let listener = TcpListener::bind("127.0.0.1:0").unwrap();
    let endpoint = format!("http://{}", listener.local_addr().unwrap());
    let seen = serve_on(listener);
    let dir = tempfile::tempdir().unwrap();
    let data_dir = dir.path().join("data");
    let ddl = Path::new(env!("CARGO_MANIFEST_DIR")).join("tests/fixtures/sql/chinook.sqlite-ddl.sql");
    let mut map = capdex();
    http_env(&mut map, &endpoint, &data_dir);
    let output = map.args(["map", "--source-id", "chinook", "--kind", "sql"]).arg(&ddl).output().unwrap();
    assert!(output.status.success(), "capdex map failed: {}", String::from_utf8_lossy(&output.stderr));
    let route = |env: bool| {
        let mut command = capdex();
        if env {
            http_env(&mut command, &endpoint, &data_dir);
        } else {
            command.env("CAPDEX_DATA_DIR", &data_dir).env("CAPDEX_CAPABILITY_DIRS", "");
        }
        let output = command.args(["route", "--json", "-k", "3", "frumious"]).output().unwrap();
        assert!(output.status.success(), "capdex route failed: {}", String::from_utf8_lossy(&output.stderr));
        let answer: Value = serde_json::from_slice(&output.stdout).unwrap();
        answer["recipes"].as_array().unwrap().iter().map(|r| r["sourceKey"].as_str().unwrap().to_string()).collect()
    };
    let before = seen.lock().unwrap().len();
    let keys: Vec<String> = route(true);
    let asked: Vec<Vec<String>> = seen.lock().unwrap()[before..].to_vec();
    assert!(asked.iter().any(|batch| batch.iter().any(|text| text == "frumious")), "the question went to the server");
    assert!(asked.iter().flatten().any(|text| text.starts_with("Invoice ")), "the graph's texts went to the server");
    // (16 hashed dimensions collide, so an invoice is among the top 3 rather than first.)
    assert!(keys.iter().any(|key| key.contains("Invoice")), "{keys:?}");
    // With the built-in embedder the same question reaches no invoice.
    let builtin: Vec<String> = route(false);
    assert!(!builtin.iter().any(|key| key.contains("Invoice")), "{builtin:?}");
}
