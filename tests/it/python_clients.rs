//! The Python example clients (`examples/python`, nats-py from PyPI) against a
//! live `capdex serve` on a real nats-server: `ops_alerts.py` subscribes to the
//! alert subjects, `agent_runtime.py` registers, discovers, dispatches and
//! reports failures, and the failures raise the alert that ops receives.
//!
//! The interpreter is `CAPDEX_PYTHON`, else `<crate>/.venv/bin/python`
//! (`scripts/test.sh` installs `examples/python/requirements.txt` there); a
//! missing interpreter or nats-py fails the test with a hint.

use crate::cli::examples_dir;
use crate::support::nats_server::NatsServer;
use crate::support::serving::{serve_at, KillOnDrop};
use serde_json::Value;
use std::io::{BufRead, BufReader};
use std::path::{Path, PathBuf};
use std::process::{Command, Stdio};

fn python() -> PathBuf {
    let python = std::env::var_os("CAPDEX_PYTHON")
        .filter(|p| !p.is_empty())
        .map(PathBuf::from)
        .unwrap_or_else(|| Path::new(env!("CARGO_MANIFEST_DIR")).join(".venv/bin/python"));
    let check = Command::new(&python).args(["-c", "import nats"]).output();
    assert!(
        matches!(&check, Ok(output) if output.status.success()),
        "{} cannot import nats-py ({check:?}); run scripts/test.sh, or \
         .venv/bin/pip install -r examples/python/requirements.txt, or set CAPDEX_PYTHON",
        python.display()
    );
    python
}

fn example(name: &str) -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR")).join("examples/python").join(name)
}

fn json_lines(text: &str) -> Vec<Value> {
    text.lines()
        .filter(|line| !line.trim().is_empty())
        .map(|line| serde_json::from_str(line).unwrap_or_else(|err| panic!("not a JSON line ({err}): {line}")))
        .collect()
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn agent_runtime_failures_reach_ops_alerts() {
    let python = python();
    let nats = NatsServer::start();
    let data = tempfile::tempdir().unwrap();
    let (mut served, _client) = serve_at(&nats, &examples_dir(), data.path(), false, &[]).await;

    let ops = Command::new(&python)
        .arg(example("ops_alerts.py"))
        .args(["--url", &nats.url(), "--count", "1", "--timeout", "60"])
        .stdout(Stdio::piped())
        .spawn()
        .expect("ops_alerts.py starts");
    let mut ops = KillOnDrop::new(ops);
    let mut ops_out = BufReader::new(ops.child.stdout.take().unwrap());
    let mut first = String::new();
    // The first line comes once the server has the subscriptions.
    tokio::task::block_in_place(|| ops_out.read_line(&mut first)).unwrap();
    assert_eq!(serde_json::from_str::<Value>(&first).unwrap()["subscribed"][0], "capdex.v1.alert.>", "{first}");

    let runtime = tokio::task::spawn_blocking({
        let (python, url) = (python.clone(), nats.url());
        move || {
            Command::new(python)
                .arg(example("agent_runtime.py"))
                .args(["--url", &url, "--runtime-id", "py-runtime", "--successes", "1", "--failures", "8"])
                .output()
                .expect("agent_runtime.py runs")
        }
    })
    .await
    .unwrap();
    let stdout = String::from_utf8_lossy(&runtime.stdout).to_string();
    assert!(
        runtime.status.success(),
        "agent_runtime.py failed:\n{stdout}\n{}",
        String::from_utf8_lossy(&runtime.stderr)
    );
    let steps = json_lines(&stdout);
    let step = |name: &'static str| steps.iter().filter(move |s| s["step"] == name);
    let register = step("register").next().expect("a register step");
    assert_eq!(register["added"], serde_json::json!(["tool:invoice-lookup", "tool:refund-request"]), "{register}");
    let discover = step("discover").next().expect("a discover step");
    assert_eq!(discover["tier1"][0], "tool:invoice-lookup", "the registered tool is discovered first: {discover}");
    let dispatch = step("dispatch").next().expect("a dispatch step");
    assert_eq!(dispatch["output"]["text"], "look up the invoices of a customer", "{dispatch}");
    let outcomes: Vec<&Value> = step("outcome").collect();
    assert_eq!(outcomes.len(), 9);
    assert!(outcomes.iter().all(|o| o["accepted"] == true && o["duplicate"] == false));
    assert_eq!(outcomes[8]["sampleCount"], 9);
    let bad = step("bad-request").next().expect("a bad-request step");
    assert_eq!((bad["error"]["status"].as_u64(), bad["error"]["code"].as_str()), (Some(400), Some("bad_request")));

    let ops_status = tokio::task::block_in_place(|| ops.child.wait()).unwrap();
    let mut rest = String::new();
    tokio::task::block_in_place(|| std::io::Read::read_to_string(&mut ops_out, &mut rest)).unwrap();
    assert!(ops_status.success(), "ops_alerts.py did not get an alert:\n{rest}");
    let alerts = json_lines(&rest);
    let alert = &alerts[0];
    assert_eq!(alert["subject"], "capdex.v1.alert.critical.acme_support-bot", "{alert}");
    assert_eq!(alert["event"]["severity"], "critical");
    assert_eq!(alert["event"]["scopeKey"], "acme/support-bot");
    assert!(served.child.try_wait().unwrap().is_none(), "capdex serve still running");
}
