//! Faults of the data dir, one trial each, against a real nats-server and the
//! real `capdex serve` (the repeated trials are `benches/trials.rs`): a
//! truncated or corrupted data dir is refused with what is wrong and how to
//! recover, never a panic and never a silent empty start; a second `capdex
//! serve` on one data dir is refused naming the dir and the holder's pid; a
//! full data dir refuses writes with `storage_full`, keeps answering reads,
//! loses and corrupts nothing, and takes writes again once space returns.
//!
//! The full disk is real free space: the test measures the free bytes of the
//! data dir's file system (`/dev/shm` where there is one, a tmpfs any user may
//! write, else the temporary folder's), sets `data_dir_min_free_bytes` 256 MiB
//! under them, and then takes 512 MiB with a file allocated on that file
//! system (no mount needed; `benches/trials.rs` fills a tmpfs to its last byte).

use crate::cli::capdex;
use crate::dispatch::{ask, call, code, handler, record, register};
use crate::serve_over_nats::{body, request};
use crate::support::nats_server::NatsServer;
use crate::support::serving::{serve_at, KillOnDrop};
use serde_json::{json, Value};
use std::path::Path;
use std::process::{Output, Stdio};
use std::sync::atomic::AtomicU64;
use std::sync::Arc;
use std::time::{Duration, Instant};

fn outcome(turn: &str) -> Vec<u8> {
    json!({"turnId": turn, "organizationId": "acme", "personaId": "bot", "status": "success"}).to_string().into_bytes()
}

/// Runs `capdex serve` on `data`, expecting it to refuse: its output once it
/// exits (fails if it is still running after 30 s, i.e. it started).
fn serve_expecting_refusal(nats: &NatsServer, data: &Path) -> Output {
    let caps = data.with_extension("caps");
    let child = capdex()
        .arg("serve")
        .env("CAPDEX_NATS_URL", nats.url())
        .env("CAPDEX_DATA_DIR", data)
        .env("CAPDEX_CAPABILITY_DIRS", &caps)
        .env("CAPDEX_WATCH", "false")
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn()
        .expect("capdex serve starts");
    let mut child = KillOnDrop::new(child);
    let deadline = Instant::now() + Duration::from_secs(30);
    while child.child.try_wait().unwrap().is_none() {
        assert!(Instant::now() < deadline, "capdex serve started on {} instead of refusing it", data.display());
        std::thread::sleep(Duration::from_millis(50));
    }
    let mut stderr = String::new();
    let mut stdout = String::new();
    use std::io::Read;
    child.child.stderr.take().unwrap().read_to_string(&mut stderr).unwrap();
    child.child.stdout.take().unwrap().read_to_string(&mut stdout).unwrap();
    let status = child.child.wait().unwrap();
    Output { status, stdout: stdout.into_bytes(), stderr: stderr.into_bytes() }
}

fn copy_dir(from: &Path, to: &Path) {
    std::fs::create_dir_all(to).unwrap();
    for entry in std::fs::read_dir(from).unwrap() {
        let entry = entry.unwrap();
        let target = to.join(entry.file_name());
        if entry.file_type().unwrap().is_dir() {
            copy_dir(&entry.path(), &target);
        } else {
            std::fs::copy(entry.path(), target).unwrap();
        }
    }
}

/// The sample count of `acme/bot` as `capdex kpi` reads it from `data`.
fn stored_samples(data: &Path) -> u64 {
    let output = capdex().args(["kpi", "--json", "--data-dir"]).arg(data).output().unwrap();
    assert!(output.status.success(), "capdex kpi: {}", String::from_utf8_lossy(&output.stderr));
    let kpis: Value = serde_json::from_slice(&output.stdout).unwrap();
    kpis.as_array()
        .unwrap()
        .iter()
        .find(|kpi| kpi["scopeKey"] == "acme/bot")
        .map_or(0, |kpi| kpi["sampleCount"].as_u64().unwrap())
}

/// A way to damage a data dir, and its name.
type Damage = (&'static str, fn(&Path));

#[tokio::test]
async fn a_truncated_or_corrupted_data_dir_is_refused_with_what_is_wrong_and_how_to_recover() {
    let nats = NatsServer::start();
    let work = tempfile::tempdir().unwrap();
    let data = work.path().join("data");
    let (mut served, client) = serve_at(&nats, &work.path().join("caps"), &data, false, &[]).await;
    for turn in 0..20 {
        let reply = body(&request(&client, "capdex.v1.outcome", outcome(&format!("t{turn}"))).await);
        assert_eq!(reply["accepted"], true, "{reply}");
    }
    // A clean stop: sled's snapshot then records how far its log reaches, so a
    // shorter log is seen. (A log cut after a crash looks like the crash itself
    // to sled: docs/operations.md.)
    let pid = served.child.id().to_string();
    assert!(std::process::Command::new("kill").args(["-TERM", &pid]).status().unwrap().success());
    assert!(served.child.wait().unwrap().success());

    let damages: [Damage; 3] = [
        ("the log truncated to 1,000 bytes", |dir| {
            std::fs::OpenOptions::new().write(true).open(dir.join("db")).unwrap().set_len(1000).unwrap()
        }),
        ("the log removed", |dir| std::fs::remove_file(dir.join("db")).unwrap()),
        ("4,000 bytes of the log overwritten", |dir| {
            use std::io::{Seek, SeekFrom, Write};
            let mut file = std::fs::OpenOptions::new().write(true).open(dir.join("db")).unwrap();
            file.seek(SeekFrom::Start(100)).unwrap();
            file.write_all(&[0xa5; 4000]).unwrap();
        }),
    ];
    for (name, damage) in damages {
        let copy = work.path().join(name.replace([' ', ','], "-"));
        copy_dir(&data, &copy);
        damage(&copy);
        let output = serve_expecting_refusal(&nats, &copy);
        let stderr = String::from_utf8_lossy(&output.stderr);
        assert!(!output.status.success(), "{name}: capdex serve exited 0");
        assert!(!stderr.contains("panicked"), "{name}: a panic, not a refusal:\n{stderr}");
        for needed in
            ["is corrupted or truncated", &copy.display().to_string(), "move the dir aside", "docs/operations.md"]
        {
            assert!(stderr.contains(needed), "{name}: {needed:?} missing from:\n{stderr}");
        }
    }
    // The undamaged data dir still holds every acknowledged outcome.
    assert_eq!(stored_samples(&data), 20);
}

#[tokio::test]
async fn a_second_serve_on_one_data_dir_is_refused_naming_the_dir_and_the_holders_pid() {
    let nats = NatsServer::start();
    let work = tempfile::tempdir().unwrap();
    let data = work.path().join("data");
    let (mut first, client) = serve_at(&nats, &work.path().join("caps"), &data, false, &[]).await;
    let output = serve_expecting_refusal(&nats, &data);
    let stderr = String::from_utf8_lossy(&output.stderr);
    assert!(!output.status.success() && !stderr.contains("panicked"), "{stderr}");
    let pid = format!("pid {}", first.child.id());
    for needed in ["is in use by another capdex process", &data.display().to_string(), &pid] {
        assert!(stderr.contains(needed), "{needed:?} missing from:\n{stderr}");
    }
    // The first one keeps serving.
    assert!(first.child.try_wait().unwrap().is_none());
    assert_eq!(body(&request(&client, "capdex.v1.outcome", outcome("still-here")).await)["accepted"], true);
}

#[tokio::test]
async fn a_full_data_dir_refuses_writes_keeps_reads_and_takes_writes_again_when_space_returns() {
    let nats = NatsServer::start();
    let shm = Path::new("/dev/shm");
    let work = if shm.is_dir() { tempfile::tempdir_in(shm).unwrap() } else { tempfile::tempdir().unwrap() };
    let data = work.path().join("data");
    const MIB: u64 = 1 << 20;
    let free = fs2::available_space(work.path()).unwrap();
    assert!(free > 1024 * MIB, "this test needs 1 GiB free on {}", work.path().display());
    let min_free = (free - 256 * MIB).to_string();
    let (served, client) =
        serve_at(&nats, &work.path().join("caps"), &data, false, &[("CAPDEX_DATA_DIR_MIN_FREE_BYTES", &min_free)])
            .await;
    handler(&client, "book", Arc::new(AtomicU64::new(0)), Duration::ZERO).await;
    register(&client, record("book", json!({}))).await;
    assert_eq!(body(&request(&client, "capdex.v1.outcome", outcome("before")).await)["accepted"], true);

    // Take 512 MiB of the file system: it is now under the reserve.
    let filler_path = work.path().join("filler");
    let filler = std::fs::File::create(&filler_path).unwrap();
    fs2::FileExt::allocate(&filler, 512 * MIB).unwrap();
    drop(filler);
    tokio::time::sleep(Duration::from_millis(300)).await;

    let refused = request(&client, "capdex.v1.outcome", outcome("while-full")).await;
    let headers = refused.headers.clone().expect("an error reply");
    assert_eq!(headers.get("Nats-Service-Error-Code").map(|v| v.as_str()), Some("507"));
    let error = body(&refused);
    assert_eq!(error["code"], "storage_full", "{error}");
    let message = error["message"].as_str().unwrap();
    assert!(message.contains(&data.display().to_string()) && message.contains("data_dir_min_free_bytes"), "{message}");
    let registration = ask(&client, "capdex.v1.capability.register", record("later", json!({}))).await;
    assert_eq!(registration["code"], "storage_full", "{registration}");
    // A dispatch's re-drive claim lives in JetStream here (shared state), not
    // in the data dir: the call runs; only its local provenance is not kept.
    let claimed = call(
        &client,
        json!({"slug": "book", "agentId": "a", "arguments": {"q": "x"}, "executionId": "e", "stepId": "s"}),
    )
    .await;
    assert!(claimed["success"] == true || code(&claimed) == "unavailable", "{claimed}");
    // Reads keep working.
    let discover =
        body(&request(&client, "capdex.v1.discover", json!({"message": "book a table"}).to_string().into()).await);
    assert!(discover["tier1"].is_array(), "{discover}");
    let listed = ask(&client, "capdex.v1.capability.list", json!({})).await;
    assert!(listed["capabilities"].as_array().unwrap().iter().any(|r| r["slug"] == "book"), "{listed}");

    // Space returns: writes are taken again, the refused ones were not kept.
    std::fs::remove_file(&filler_path).unwrap();
    tokio::time::sleep(Duration::from_millis(300)).await;
    let after = body(&request(&client, "capdex.v1.outcome", outcome("after")).await);
    assert_eq!(after["kpi"]["sampleCount"], 2, "{after}");
    register(&client, record("later", json!({}))).await;
    let ran = call(
        &client,
        json!({"slug": "book", "agentId": "a", "arguments": {"q": "x"}, "executionId": "e", "stepId": "s"}),
    )
    .await;
    assert_eq!(ran["success"], true, "{ran}");
    assert_eq!(ran["data"]["n"], 1, "the step ran once, its result replayed: {ran}");
    // Nothing is corrupted: a crash now, and the data dir opens with both outcomes.
    served.kill_9();
    assert_eq!(stored_samples(&data), 2);
}
