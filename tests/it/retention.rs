//! Retention over NATS: a real nats-server and `capdex serve` fed dispatches,
//! approval rounds and JetStream outcomes over NATS, with short `[retention]`
//! limits; each store is pruned to its count (and, in the second test, by
//! age), and the store-size gauges at the metrics endpoint say so; KPI scopes
//! beyond their count go least recently updated first. Also the
//! soak benchmark's smoke run (`capdex bench --soak`), its report's shape.

use crate::cli::capdex;
use crate::dispatch::{ask, call, register, serve};
use crate::support::nats_server::NatsServer;
use serde_json::{json, Value};
use std::time::{Duration, Instant};

/// GET /metrics from the Prometheus listener.
fn scrape(addr: &str) -> String {
    use std::io::{Read, Write};
    let Ok(mut stream) = std::net::TcpStream::connect(addr) else { return String::new() };
    let _ = write!(stream, "GET /metrics HTTP/1.1\r\nHost: {addr}\r\nConnection: close\r\n\r\n");
    let mut response = String::new();
    let _ = stream.read_to_string(&mut response);
    response
}

/// The value of gauge or counter `name{store="<store>"}`, if scraped.
fn metric(metrics: &str, name: &str, store: &str) -> Option<f64> {
    let prefix = format!("{name}{{store=\"{store}\"}} ");
    metrics.lines().find_map(|line| line.strip_prefix(&prefix)).and_then(|value| value.trim().parse().ok())
}

/// Scrapes until every `(store, entries)` is what the gauge says, or panics after 30 s.
fn wait_for_entries(addr: &str, expected: &[(&str, f64)]) -> String {
    let deadline = Instant::now() + Duration::from_secs(30);
    loop {
        let metrics = scrape(addr);
        if expected.iter().all(|(store, entries)| metric(&metrics, "capdex_store_entries", store) == Some(*entries)) {
            return metrics;
        }
        assert!(Instant::now() < deadline, "the gauges never reached {expected:?}:\n{metrics}");
        std::thread::sleep(Duration::from_millis(100));
    }
}

fn metrics_addr() -> String {
    let port = std::net::TcpListener::bind("127.0.0.1:0").unwrap().local_addr().unwrap().port();
    format!("127.0.0.1:{port}")
}

/// `capdex serve` with `env`, its metrics at a free address (answered too),
/// sweeping every 200 ms.
async fn serve_sweeping(
    nats: &NatsServer,
    data: &std::path::Path,
    env: &[(&str, &str)],
) -> (crate::support::serving::KillOnDrop, async_nats::Client, String) {
    let addr = metrics_addr();
    let mut all = vec![("CAPDEX_METRICS_LISTEN_ADDR", addr.as_str()), ("CAPDEX_RETENTION_SWEEP_INTERVAL_MS", "200")];
    all.extend_from_slice(env);
    let (serving, client) = serve(nats, data, &all).await;
    (serving, client, addr)
}

/// The built-in echo under `slug`, not idempotent (so a call with a re-drive key keeps its result).
fn echo_record(slug: &str, requires_approval: bool) -> Value {
    json!({
        "slug": slug, "name": slug, "description": "the built-in echo", "category": "test",
        "executionType": "internal", "handler": "builtin:echo", "requiresApproval": requires_approval,
        "isIdempotent": false,
        "functionDefinition": {"name": slug, "description": "the built-in echo",
            "parameters": {"type": "object", "properties": {"text": {"type": "string"}}}},
    })
}

async fn register_both(client: &async_nats::Client) {
    register(client, echo_record("gated", true)).await;
    register(client, echo_record("step", false)).await;
}

/// A call that needs approval, its approval and the approved call.
async fn approval_round(client: &async_nats::Client, n: usize) {
    let go = |approval: Option<&str>| json!({"slug": "gated", "agentId": "a", "arguments": {"text": format!("t{n}")}, "approvalId": approval});
    let asked = call(client, go(None)).await;
    let id = asked["metadata"]["approvalId"].as_str().unwrap_or_else(|| panic!("{asked}")).to_string();
    let approved = ask(client, &format!("capdex.v1.approval.{id}.approve"), json!({})).await;
    assert_eq!(approved["status"], "approved", "{approved}");
    let ran = call(client, go(Some(&id))).await;
    assert_eq!(ran["success"], true, "{ran}");
}

async fn echo(client: &async_nats::Client, execution_id: &str) -> Value {
    let answer = call(
        client,
        json!({"slug": "step", "agentId": "a", "arguments": {"text": execution_id}, "executionId": execution_id, "stepId": "1"}),
    )
    .await;
    assert_eq!(answer["success"], true, "{answer}");
    answer
}

#[tokio::test]
async fn every_store_fed_over_nats_is_pruned_to_its_count_and_the_gauges_follow() {
    let nats = NatsServer::start();
    let data = tempfile::tempdir().unwrap();
    let (_serving, client, addr) = serve_sweeping(
        &nats,
        data.path(),
        &[
            // Dispatch state in sled (with shared dispatch, re-drive records live in a bucket).
            ("CAPDEX_JETSTREAM_SHARED_DISPATCH", "false"),
            ("CAPDEX_RETENTION_PROVENANCE_MAX_COUNT", "4"),
            ("CAPDEX_RETENTION_REDRIVE_MAX_COUNT", "3"),
            ("CAPDEX_RETENTION_APPROVALS_MAX_COUNT", "2"),
            ("CAPDEX_RETENTION_OUTCOME_IDS_MAX_COUNT", "5"),
        ],
    )
    .await;
    register_both(&client).await;
    for n in 0..8 {
        echo(&client, &format!("e{n}")).await;
    }
    for n in 0..4 {
        approval_round(&client, n).await;
    }
    // An approval still pending is never pruned, however many there are.
    let pending = call(&client, json!({"slug": "gated", "agentId": "a", "arguments": {"text": "wait"}})).await;
    assert!(pending["metadata"]["approvalId"].is_string(), "{pending}");
    for n in 0..9 {
        let outcome = json!({"turnId": format!("js-{n}"), "organizationId": "acme", "status": "success"});
        let ack = ask(&client, "capdex.v1.js.outcome", outcome).await;
        assert!(ack["seq"].as_u64().is_some(), "stored by JetStream: {ack}");
    }
    // 8 step calls and 9 gated calls made provenance; 8 re-drive keys (the gated
    // calls have none); 4 used approvals and one pending; 9 outcome ids.
    let metrics = wait_for_entries(
        &addr,
        &[("provenance", 4.0), ("redrive", 3.0), ("approvals", 2.0), ("outcome_ids", 5.0), ("memory", 0.0)],
    );
    for store in ["provenance", "redrive", "approvals", "outcome_ids"] {
        assert!(metric(&metrics, "capdex_retention_pruned_total", store).unwrap_or(0.0) > 0.0, "{store}: {metrics}");
        assert!(metric(&metrics, "capdex_store_bytes", store).unwrap_or(0.0) > 0.0, "{store}: {metrics}");
    }
    for store in ["descriptors", "embeddings", "kpi", "registry", "bindings"] {
        assert!(metric(&metrics, "capdex_store_entries", store).is_some(), "{store}: {metrics}");
    }
    assert!(metrics.contains("capdex_store_disk_bytes "), "{metrics}");
    let provenance = ask(&client, "capdex.v1.provenance.list", json!({"limit": 100})).await;
    assert_eq!(provenance["provenance"].as_array().unwrap().len(), 4, "{provenance}");
    // approval.list lists the pending ones: the one left pending stayed, however old.
    let approvals = ask(&client, "capdex.v1.approval.list", json!({})).await;
    let pending_id = pending["metadata"]["approvalId"].as_str().unwrap();
    assert!(approvals["approvals"].as_array().unwrap().iter().any(|a| a["id"] == pending_id), "{approvals}");
    // The newest re-drive result is still replayed; the oldest was pruned, so it runs again.
    echo(&client, "e7").await;
    echo(&client, "e0").await;
    let last = ask(&client, "capdex.v1.provenance.list", json!({"limit": 2})).await;
    let replayed: Vec<Option<bool>> =
        last["provenance"].as_array().unwrap().iter().map(|row| row["replayed"].as_bool()).collect();
    assert_eq!(replayed, vec![Some(true), Some(false)], "{last}");
}

/// Every entry of the key-value bucket `bucket`, decoded.
async fn bucket_values(client: &async_nats::Client, bucket: &str) -> Vec<Value> {
    use futures::StreamExt;
    let store = async_nats::jetstream::new(client.clone()).get_key_value(bucket).await.unwrap();
    let keys: Vec<String> = store.keys().await.unwrap().map(|key| key.unwrap()).collect().await;
    let mut values = Vec::new();
    for key in keys {
        if let Some(value) = store.get(&key).await.unwrap() {
            values.push(serde_json::from_slice(&value).unwrap());
        }
    }
    values
}

#[tokio::test]
async fn the_shared_buckets_are_pruned_to_their_count_and_what_is_live_stays() {
    let nats = NatsServer::start();
    let data = tempfile::tempdir().unwrap();
    let (_serving, client, addr) = serve_sweeping(
        &nats,
        data.path(),
        &[
            ("CAPDEX_JETSTREAM_SHARED_DISPATCH", "true"),
            ("CAPDEX_JETSTREAM_APPROVALS_MAX_COUNT", "2"),
            ("CAPDEX_JETSTREAM_REDRIVE_MAX_COUNT", "3"),
        ],
    )
    .await;
    register_both(&client).await;
    // The oldest entries are the live ones: a pending approval, and a claim in
    // progress (its handler holds the request and never answers).
    let pending = call(&client, json!({"slug": "gated", "agentId": "a", "arguments": {"text": "wait"}})).await;
    let pending_id = pending["metadata"]["approvalId"].as_str().unwrap_or_else(|| panic!("{pending}")).to_string();
    let mut held = client.subscribe("capdex.v1.exec.held").await.unwrap();
    client.flush().await.unwrap();
    register(&client, crate::dispatch::record("held", json!({"isIdempotent": false, "timeoutMs": 60000}))).await;
    let in_progress = {
        let client = client.clone();
        tokio::spawn(async move {
            let go =
                json!({"slug": "held", "agentId": "a", "arguments": {"q": "x"}, "executionId": "held", "stepId": "1"});
            let _ = client.request("capdex.v1.dispatch", go.to_string().into()).await;
        })
    };
    {
        use futures::StreamExt;
        tokio::time::timeout(Duration::from_secs(15), held.next()).await.expect("the held call reaches its handler");
    }
    for n in 0..8 {
        echo(&client, &format!("e{n}")).await;
    }
    for n in 0..4 {
        approval_round(&client, n).await;
    }
    // 9 re-drive keys (the claim and 8 results) and 5 approvals (4 used, 1
    // pending), pruned to 3 and 2, oldest first, the live ones kept.
    // (The counts hold after every sweep, so the totals say when all are done.)
    let deadline = Instant::now() + Duration::from_secs(30);
    let metrics = loop {
        let metrics = wait_for_entries(&addr, &[("jetstream_redrive", 3.0), ("jetstream_approvals", 2.0)]);
        let pruned = |store| metric(&metrics, "capdex_retention_pruned_total", store);
        if (pruned("jetstream_redrive"), pruned("jetstream_approvals")) == (Some(6.0), Some(3.0)) {
            break metrics;
        }
        assert!(Instant::now() < deadline, "never pruned 6 and 3:\n{metrics}");
        tokio::time::sleep(Duration::from_millis(100)).await;
    };
    for store in ["jetstream_redrive", "jetstream_approvals"] {
        assert!(metric(&metrics, "capdex_store_bytes", store).unwrap_or(0.0) > 0.0, "{store}: {metrics}");
    }
    let approvals = bucket_values(&client, "CAPDEX_APPROVALS").await;
    let mut statuses: Vec<&str> = approvals.iter().map(|a| a["status"].as_str().unwrap()).collect();
    statuses.sort();
    assert_eq!(statuses, ["pending", "used"], "{approvals:?}");
    assert!(approvals.iter().any(|a| a["id"] == pending_id.as_str()), "{approvals:?}");
    let redrive = bucket_values(&client, "CAPDEX_REDRIVE").await;
    assert_eq!(redrive.len(), 3, "{redrive:?}");
    assert_eq!(
        redrive.iter().filter(|entry| entry["result"].is_null()).count(),
        1,
        "the claim in progress: {redrive:?}"
    );
    // The pending approval can still be approved; the newest result still
    // replays, the oldest was purged, so its call runs again.
    let approved = ask(&client, &format!("capdex.v1.approval.{pending_id}.approve"), json!({})).await;
    assert_eq!(approved["status"], "approved", "{approved}");
    echo(&client, "e7").await;
    echo(&client, "e0").await;
    let last = ask(&client, "capdex.v1.provenance.list", json!({"limit": 2})).await;
    let replayed: Vec<Option<bool>> =
        last["provenance"].as_array().unwrap().iter().map(|row| row["replayed"].as_bool()).collect();
    assert_eq!(replayed, vec![Some(true), Some(false)], "{last}");
    in_progress.abort();
}

/// `capdex serve` with JetStream (so the shared SCG bucket), sweeping every
/// 200 ms with `limit` (a `CAPDEX_RETENTION_MEMORY_*` variable) and one
/// mapped table; deposits `notes` memory notes on it, one after the other.
/// Answers the node, its client, its metrics address and the notes' ids.
async fn notes_on_a_mapped_table(
    nats: &NatsServer,
    data: &std::path::Path,
    limit: (&str, &str),
    notes: usize,
) -> (crate::support::serving::KillOnDrop, async_nats::Client, String, Vec<String>) {
    let (serving, client, addr) = serve_sweeping(nats, data, &[limit]).await;
    let table = "CREATE TABLE orders (id INT PRIMARY KEY, customer_email TEXT, invoice_total NUMERIC);";
    let mapped =
        ask(&client, "capdex.v1.map", json!({"sourceId": "orders", "document": table, "workspaces": ["shop"]})).await;
    assert!(mapped.get("error").is_none(), "{mapped}");
    let route =
        ask(&client, "capdex.v1.route", json!({"query": "orders invoice total", "k": 5, "workspace": "shop"})).await;
    let anchor = route["recipes"][0]["sourceKey"].as_str().unwrap_or_else(|| panic!("{route}")).to_string();
    let mut ids = Vec::new();
    for n in 0..notes {
        let deposit =
            json!({"content": format!("note {n}"), "polarity": "dead_end", "anchors": [anchor], "workspace": "shop"});
        let deposited = ask(&client, "capdex.v1.memory.deposit", deposit).await;
        ids.push(deposited["note"]["id"].as_str().unwrap_or_else(|| panic!("{deposited}")).to_string());
    }
    (serving, client, addr, ids)
}

#[tokio::test]
async fn memory_notes_in_the_shared_scg_bucket_are_pruned_and_its_sources_stay() {
    let (nats, data) = (NatsServer::start(), tempfile::tempdir().unwrap());
    // The bucket's count counts its one source too (never purged).
    let (_serving, client, addr, ids) =
        notes_on_a_mapped_table(&nats, data.path(), ("CAPDEX_RETENTION_MEMORY_MAX_COUNT", "3"), 5).await;
    // The count holds after every sweep; the total says when all three went.
    let deadline = Instant::now() + Duration::from_secs(30);
    while metric(&wait_for_entries(&addr, &[("jetstream_scg", 3.0)]), "capdex_retention_pruned_total", "jetstream_scg")
        != Some(3.0)
    {
        assert!(Instant::now() < deadline, "three notes never pruned:\n{}", scrape(&addr));
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
    let bucket = async_nats::jetstream::new(client.clone()).get_key_value("CAPDEX_SCG").await.unwrap();
    let mut keys: Vec<String> = {
        use futures::StreamExt;
        bucket.keys().await.unwrap().map(|key| key.unwrap()).collect().await
    };
    let mut expected = vec!["source.orders".to_string(), format!("note.{}", ids[3]), format!("note.{}", ids[4])];
    keys.sort();
    expected.sort();
    assert_eq!(keys, expected, "the source and the two newest notes");
}

#[tokio::test]
async fn memory_notes_in_the_shared_scg_bucket_go_with_their_age() {
    let (nats, data) = (NatsServer::start(), tempfile::tempdir().unwrap());
    let (_serving, _client, addr, _) =
        notes_on_a_mapped_table(&nats, data.path(), ("CAPDEX_RETENTION_MEMORY_MAX_AGE_MS", "3000"), 2).await;
    // Both notes younger than 3 s, then only the source: no request in between.
    wait_for_entries(&addr, &[("jetstream_scg", 3.0)]);
    let metrics = wait_for_entries(&addr, &[("jetstream_scg", 1.0)]);
    assert_eq!(metric(&metrics, "capdex_retention_pruned_total", "jetstream_scg"), Some(2.0), "{metrics}");
}

#[tokio::test]
async fn records_older_than_their_age_are_pruned_continuously() {
    let nats = NatsServer::start();
    let data = tempfile::tempdir().unwrap();
    let (_serving, client, addr) = serve_sweeping(
        &nats,
        data.path(),
        &[
            // Dispatch state in sled (with shared dispatch, re-drive records live in a bucket).
            ("CAPDEX_JETSTREAM_SHARED_DISPATCH", "false"),
            ("CAPDEX_RETENTION_PROVENANCE_MAX_AGE_MS", "8000"),
            ("CAPDEX_RETENTION_REDRIVE_MAX_AGE_MS", "8000"),
            ("CAPDEX_RETENTION_APPROVALS_MAX_AGE_MS", "8000"),
            ("CAPDEX_RETENTION_OUTCOME_IDS_MAX_AGE_MS", "8000"),
        ],
    )
    .await;
    register_both(&client).await;
    for n in 0..3 {
        echo(&client, &format!("e{n}")).await;
    }
    approval_round(&client, 0).await;
    let outcome = json!({"turnId": "js-0", "organizationId": "acme", "status": "success"});
    assert!(ask(&client, "capdex.v1.js.outcome", outcome).await["seq"].as_u64().is_some());
    // Younger than 8 s: all there (3 step and 2 gated calls; 3 re-drive keys, the gated
    // calls have none; 1 approval; 1 id).
    wait_for_entries(&addr, &[("provenance", 5.0), ("redrive", 3.0), ("approvals", 1.0), ("outcome_ids", 1.0)]);
    // Then, without another request, the sweep prunes them as they age.
    let metrics =
        wait_for_entries(&addr, &[("provenance", 0.0), ("redrive", 0.0), ("approvals", 0.0), ("outcome_ids", 0.0)]);
    assert_eq!(metric(&metrics, "capdex_retention_pruned_total", "provenance"), Some(5.0), "{metrics}");
    let provenance = ask(&client, "capdex.v1.provenance.list", json!({"limit": 100})).await;
    assert_eq!(provenance["provenance"].as_array().unwrap().len(), 0, "{provenance}");
}

/// The value of the unlabelled gauge `name`, if scraped.
fn gauge(metrics: &str, name: &str) -> Option<f64> {
    let prefix = format!("{name} ");
    metrics.lines().find_map(|line| line.strip_prefix(&prefix)).and_then(|value| value.trim().parse().ok())
}

#[tokio::test]
async fn kpi_scopes_beyond_their_count_are_pruned_least_recently_updated_first() {
    let nats = NatsServer::start();
    let data = tempfile::tempdir().unwrap();
    let (serving, client, addr) = serve_sweeping(&nats, data.path(), &[("CAPDEX_RETENTION_KPI_MAX_COUNT", "2")]).await;
    // Four organisations updated in turn, then the first again: o2 and o3 are
    // the least recently updated. Whenever a sweep runs in between, the two
    // kept at the end are the two updated last.
    for (n, organization) in ["o1", "o2", "o3", "o4", "o1"].into_iter().enumerate() {
        let outcome = json!({"turnId": format!("t{n}"), "organizationId": organization, "status": "success"});
        let recorded = ask(&client, "capdex.v1.outcome", outcome).await;
        assert_eq!(recorded["kpi"]["scopeKey"], organization, "{recorded}");
    }
    // After the last outcome at least three scopes are held; the gauge reaches 2 only by pruning.
    let deadline = Instant::now() + Duration::from_secs(30);
    let metrics = loop {
        let metrics = scrape(&addr);
        if gauge(&metrics, "capdex_kpi_scopes") == Some(2.0)
            && metric(&metrics, "capdex_retention_pruned_total", "kpi").unwrap_or(0.0) >= 2.0
        {
            break metrics;
        }
        assert!(Instant::now() < deadline, "the KPI scopes were never pruned to 2:\n{metrics}");
        std::thread::sleep(Duration::from_millis(100));
    };
    assert!(metric(&metrics, "capdex_store_entries", "kpi").unwrap_or(0.0) > 0.0, "{metrics}");
    assert!(metric(&metrics, "capdex_store_bytes", "kpi").unwrap_or(0.0) > 0.0, "{metrics}");
    // Later sweeps (each after the one before is durable) keep the count.
    std::thread::sleep(Duration::from_millis(600));
    assert_eq!(gauge(&scrape(&addr), "capdex_kpi_scopes"), Some(2.0));
    serving.kill_9();
    let output = capdex().args(["kpi", "--json", "--data-dir"]).arg(data.path()).output().unwrap();
    assert!(output.status.success(), "{}", String::from_utf8_lossy(&output.stderr));
    let kpis: Value = serde_json::from_slice(&output.stdout).unwrap();
    let mut kept: Vec<&str> = kpis.as_array().unwrap().iter().map(|kpi| kpi["scopeKey"].as_str().unwrap()).collect();
    kept.sort_unstable();
    assert_eq!(kept, ["o1", "o4"], "the least recently updated went first: {kpis}");
}

#[test]
fn the_soak_benchmark_reports_rss_data_dir_and_p99_per_interval() {
    let nats_server = crate::support::nats_server::find_binary();
    let output = capdex()
        .args(["bench", "--soak", "0.05", "--soak-report-seconds", "1", "--soak-rate", "40", "--json"])
        .env("CAPDEX_NATS_SERVER", nats_server)
        .output()
        .expect("capdex runs");
    assert!(output.status.success(), "{}", String::from_utf8_lossy(&output.stderr));
    let report: Value = serde_json::from_slice(&output.stdout)
        .unwrap_or_else(|err| panic!("not JSON ({err}): {}", String::from_utf8_lossy(&output.stdout)));
    assert!(report["capacityOps"].as_f64().unwrap() > 0.0, "{report}");
    assert_eq!(report["targetOps"].as_f64(), Some(40.0), "the rate asked for: {report}");
    assert!(report["retention"]
        .as_array()
        .unwrap()
        .iter()
        .any(|line| line.as_str().unwrap().starts_with("CAPDEX_RETENTION_")));
    let intervals = report["intervals"].as_array().unwrap();
    assert!(intervals.len() >= 2, "{report}");
    for interval in intervals {
        assert!(interval["rssBytes"].as_u64().unwrap() > 0, "{interval}");
        assert!(interval["dataDirBytes"].as_u64().unwrap() > 0, "{interval}");
        for figure in ["rss", "dataDir"] {
            let read = |suffix: &str| interval[format!("{figure}{suffix}")].as_u64().unwrap();
            let (min, mean, max) = (read("MinBytes"), read("Bytes"), read("MaxBytes"));
            assert!(min <= mean && mean <= max, "{figure}: {interval}");
        }
        assert!(interval["storeBytes"].is_u64(), "{interval}");
        assert!(interval["natsRssBytes"].as_u64().unwrap() > 0, "{interval}");
        assert!(interval["natsDirBytes"].as_u64().unwrap() > 0, "{interval}");
        assert!(interval["p99Ms"].as_f64().is_some() && interval["requests"].as_u64().is_some(), "{interval}");
    }
    for ratio in ["rssRatio", "dataDirRatio", "rssSampleRatio", "dataDirSampleRatio"] {
        assert!(report[ratio].as_f64().unwrap() >= 1.0, "{ratio}: {report}");
    }
    assert!(report["flat"].is_boolean() && report["warmupIntervals"].is_u64(), "{report}");
    for (option, value, refusal) in [
        ("--soak-warmup", "1", "--soak-warmup 1: must be at least 0 and shorter than the soak"),
        ("--soak-rate", "0.5", "--soak-rate 0.5: must be at least 1 operation a second"),
    ] {
        let refused = capdex()
            .args(["bench", "--soak", "1", option, value])
            .env("CAPDEX_NATS_SERVER", crate::support::nats_server::find_binary())
            .output()
            .expect("capdex runs");
        assert!(!refused.status.success(), "{option} {value}");
        assert!(String::from_utf8_lossy(&refused.stderr).contains(refusal), "{option} {value}");
    }
}

#[test]
fn an_interrupted_soak_reports_what_it_measured_and_leaves_nothing_behind() {
    use std::io::BufRead;
    let mut soak = capdex()
        .args(["bench", "--soak", "5", "--soak-report-seconds", "1"])
        .env("CAPDEX_NATS_SERVER", crate::support::nats_server::find_binary())
        .stdout(std::process::Stdio::piped())
        .stderr(std::process::Stdio::null())
        .spawn()
        .expect("capdex runs");
    let pid = soak.id();
    let mut lines = std::io::BufReader::new(soak.stdout.take().unwrap()).lines().map_while(Result::ok);
    let mut seen = Vec::new();
    // The first interval's line: the soak is under way.
    for line in lines.by_ref() {
        let first_interval = line.split_whitespace().next().is_some_and(|at| at.parse::<f64>().is_ok());
        seen.push(line);
        if first_interval {
            break;
        }
    }
    assert!(
        std::process::Command::new("kill").args(["-TERM", &pid.to_string()]).status().unwrap().success(),
        "{seen:?}"
    );
    seen.extend(lines);
    let status = soak.wait().unwrap();
    let out = seen.join("\n");
    assert!(status.success(), "{status}: {out}");
    assert!(out.contains("interrupted after") && out.contains("after the warm-up"), "{out}");
    let left: Vec<_> = ["nats", "data", "caps"]
        .iter()
        .map(|what| std::env::temp_dir().join(format!("capdex-soak-{pid}-{what}")))
        .filter(|dir| dir.exists())
        .collect();
    assert!(left.is_empty(), "dirs left behind: {left:?}");
    // No child left running: nats-server's command line names its store dir.
    let nats_dir = format!("capdex-soak-{pid}-nats");
    let running: Vec<_> = std::fs::read_dir("/proc")
        .unwrap()
        .flatten()
        .filter_map(|entry| std::fs::read(entry.path().join("cmdline")).ok())
        .filter(|cmdline| String::from_utf8_lossy(cmdline).contains(&nats_dir))
        .collect();
    assert!(running.is_empty(), "a child of the soak still runs");
}
