//! `capdex eval` against the reference scorer: on a sample of each benchmark,
//! the figures capdex prints equal those the reference scorer
//! `tests/fixtures/bench/eval.py` computes from the run file capdex writes.

use crate::cli::capdex;
use crate::support::fixture;
use serde_json::Value;
use std::path::{Path, PathBuf};

fn bench_dir() -> PathBuf {
    fixture("bench")
}

/// Copies the first `n` lines of `from` to `to`.
fn head(from: &Path, to: &Path, n: usize) {
    let text = std::fs::read_to_string(from).unwrap_or_else(|err| panic!("cannot read {}: {err}", from.display()));
    let lines: Vec<&str> = text.lines().take(n).collect();
    std::fs::write(to, lines.join("\n") + "\n").unwrap();
}

/// Writes the first `n` tools of `from` plus every tool a query of `queries` needs.
fn sample_tools(from: &Path, queries: &Path, to: &Path, n: usize) {
    let needed: std::collections::HashSet<String> = std::fs::read_to_string(queries)
        .unwrap()
        .lines()
        .flat_map(|line| {
            let query: Value = serde_json::from_str(line).unwrap();
            query["relevant"].as_array().unwrap().iter().map(|id| id.as_str().unwrap().to_string()).collect::<Vec<_>>()
        })
        .collect();
    let text = std::fs::read_to_string(from).unwrap();
    let lines: Vec<&str> = text
        .lines()
        .enumerate()
        .filter(|(i, line)| {
            *i < n || serde_json::from_str::<Value>(line).unwrap()["id"].as_str().is_some_and(|id| needed.contains(id))
        })
        .map(|(_, line)| line)
        .collect();
    std::fs::write(to, lines.join("\n") + "\n").unwrap();
}

fn check_agreement(set: &str, n_tools: usize, n_queries: usize) {
    let bench = bench_dir();
    let script = fixture("bench/eval.py");
    let dir = tempfile::tempdir().unwrap();
    let (tools, queries, run) =
        (dir.path().join("tools.jsonl"), dir.path().join("queries.jsonl"), dir.path().join("run.jsonl"));
    head(&bench.join(set).join("dev_queries.jsonl"), &queries, n_queries);
    sample_tools(&bench.join(set).join("tools.jsonl"), &queries, &tools, n_tools);
    let output = capdex()
        .args(["eval", "--json", "--tools"])
        .arg(&tools)
        .arg("--queries")
        .arg(&queries)
        .arg("--out")
        .arg(&run)
        .output()
        .expect("capdex runs");
    assert!(output.status.success(), "capdex eval failed: {}", String::from_utf8_lossy(&output.stderr));
    let ours: Value = serde_json::from_slice(&output.stdout).unwrap();
    let reference = std::process::Command::new("python3")
        .arg(&script)
        .arg(&queries)
        .arg(&run)
        .arg("--json")
        .output()
        .expect("python3 runs (the reference scorer needs it)");
    assert!(reference.status.success(), "eval.py failed: {}", String::from_utf8_lossy(&reference.stderr));
    let theirs: Value = serde_json::from_slice(&reference.stdout).unwrap();
    let theirs = &theirs["ALL"];
    assert_eq!(theirs["n"].as_u64(), Some(n_queries as u64));
    assert_eq!(ours["metrics"]["queries"].as_u64(), Some(n_queries as u64));
    for (key, reference_key) in [
        ("recallAt1", "R@1"),
        ("recallAt5", "R@5"),
        ("recallAt10", "R@10"),
        ("ndcgAt5", "NDCG@5"),
        ("ndcgAt10", "NDCG@10"),
        ("mrr", "MRR"),
    ] {
        let (a, b) = (ours["metrics"][key].as_f64().unwrap(), theirs[reference_key].as_f64().unwrap());
        assert!((a - b).abs() < 1e-9, "{set} {key}: capdex {a} but eval.py {b}");
    }
    assert!(ours["metrics"]["ndcgAt10"].as_f64().unwrap() > 10.0, "a sample this easy is not all misses: {ours}");
    // The run names tools by the ids of the tools file.
    let first_line = std::fs::read_to_string(&run).unwrap().lines().next().unwrap().to_string();
    let line: Value = serde_json::from_str(&first_line).unwrap();
    assert_eq!(line["query_idx"], 0);
    assert!(!line["ranked"].as_array().unwrap().is_empty());
}

#[test]
fn eval_agrees_with_the_reference_scorer_on_seal_tools() {
    check_agreement("seal-tools", 600, 60);
}

#[test]
fn eval_agrees_with_the_reference_scorer_on_metatool() {
    check_agreement("metatool", 199, 120);
}

/// Runs `capdex eval --json` on `tools` and `queries`, with `extra` arguments; returns its metrics and run file.
fn eval_run(tools: &Path, queries: &Path, extra: &[&std::ffi::OsStr]) -> (Value, String) {
    let run = tools.with_file_name(format!("run-{}.jsonl", extra.len()));
    let output = capdex()
        .args(["eval", "--json", "--tools"])
        .arg(tools)
        .arg("--queries")
        .arg(queries)
        .arg("--out")
        .arg(&run)
        .args(extra)
        .output()
        .expect("capdex runs");
    assert!(output.status.success(), "capdex eval failed: {}", String::from_utf8_lossy(&output.stderr));
    let report: Value = serde_json::from_slice(&output.stdout).unwrap();
    (report["metrics"].clone(), std::fs::read_to_string(&run).unwrap())
}

/// Outcomes that treat every capability alike leave every ranking as it was;
/// outcomes that fail the relevant tools change the figures (so the prior is applied at all).
#[test]
fn a_neutral_outcome_prior_leaves_eval_unchanged() {
    let bench = bench_dir();
    let dir = tempfile::tempdir().unwrap();
    let (tools, queries) = (dir.path().join("tools.jsonl"), dir.path().join("queries.jsonl"));
    head(&bench.join("metatool").join("dev_queries.jsonl"), &queries, 60);
    sample_tools(&bench.join("metatool").join("tools.jsonl"), &queries, &tools, 199);
    let ids: Vec<String> = std::fs::read_to_string(&tools)
        .unwrap()
        .lines()
        .map(|line| serde_json::from_str::<Value>(line).unwrap()["id"].as_str().unwrap().to_string())
        .collect();
    let relevant: Vec<String> = std::fs::read_to_string(&queries)
        .unwrap()
        .lines()
        .map(|line| serde_json::from_str::<Value>(line).unwrap()["relevant"][0].as_str().unwrap().to_string())
        .collect();
    let write_outcomes = |name: &str, outcomes: Vec<Value>| {
        let path = dir.path().join(name);
        std::fs::write(&path, outcomes.iter().map(Value::to_string).collect::<Vec<_>>().join("\n")).unwrap();
        path
    };
    // Every tool is used in successful and failed turns alike.
    let neutral = write_outcomes(
        "neutral.jsonl",
        ids.iter()
            .flat_map(|id| {
                ["success", "failed"].map(|status| serde_json::json!({"status": status, "capabilities": [id]}))
            })
            .collect(),
    );
    let hostile = write_outcomes(
        "hostile.jsonl",
        relevant
            .iter()
            .map(|id| serde_json::json!({"status": "failed", "capabilities": [id]}))
            .chain(ids.iter().map(|id| serde_json::json!({"status": "success", "capabilities": [id]})))
            .collect(),
    );
    let (plain_metrics, plain_run) = eval_run(&tools, &queries, &[]);
    let (neutral_metrics, neutral_run) = eval_run(&tools, &queries, &["--outcome-prior".as_ref(), neutral.as_os_str()]);
    assert_eq!(neutral_metrics, plain_metrics);
    assert_eq!(neutral_run, plain_run, "not a single ranking moved");
    let (hostile_metrics, _) = eval_run(
        &tools,
        &queries,
        &["--outcome-prior".as_ref(), hostile.as_os_str(), "--depth".as_ref(), "20".as_ref()],
    );
    let mrr = |metrics: &Value| metrics["mrr"].as_f64().unwrap();
    assert!(mrr(&hostile_metrics) < mrr(&plain_metrics), "{hostile_metrics} vs {plain_metrics}");
}
