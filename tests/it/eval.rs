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

/// The first `n` MetaTool dev queries and the tools they need (all 199), in
/// `dir`: the sample most tests here rank.
fn metatool_sample(dir: &Path, n: usize) -> (PathBuf, PathBuf) {
    let bench = bench_dir();
    let (tools, queries) = (dir.join("tools.jsonl"), dir.join("queries.jsonl"));
    head(&bench.join("metatool").join("dev_queries.jsonl"), &queries, n);
    sample_tools(&bench.join("metatool").join("tools.jsonl"), &queries, &tools, 199);
    (tools, queries)
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
    let dir = tempfile::tempdir().unwrap();
    let (tools, queries) = metatool_sample(dir.path(), 60);
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

#[test]
fn eval_agrees_with_the_reference_scorer_on_bfcl() {
    check_agreement("bfcl", 300, 60);
}

/// Runs `capdex eval --json` with several query files and `extra` arguments; returns the report and the run lines.
fn eval_report(tools: &Path, queries: &[&Path], extra: &[&str]) -> (Value, Vec<Value>) {
    let run = tools.with_file_name("run-report.jsonl");
    let mut command = capdex();
    command.args(["eval", "--json", "--tools"]).arg(tools).arg("--out").arg(&run);
    for file in queries {
        command.arg("--queries").arg(file);
    }
    let output = command.args(extra).output().expect("capdex runs");
    assert!(output.status.success(), "capdex eval failed: {}", String::from_utf8_lossy(&output.stderr));
    let report: Value = serde_json::from_slice(&output.stdout).unwrap();
    let lines = std::fs::read_to_string(&run)
        .unwrap()
        .lines()
        .map(|line| serde_json::from_str::<Value>(line).unwrap())
        .collect();
    (report, lines)
}

/// Requests nothing fits (`"relevant": []`) are counted apart: the share
/// answered with an empty Tier 1 is the share of empty rankings in the run;
/// a request with its own tools is ranked against those alone; metrics cover
/// the answerable requests only.
#[test]
fn nothing_fits_is_measured_on_empty_rankings() {
    let bench = bench_dir();
    let dir = tempfile::tempdir().unwrap();
    let (tools, queries) = metatool_sample(dir.path(), 40);
    let small_talk = bench.join("nothing-fits").join("small-talk.jsonl");
    let irrelevance = dir.path().join("irrelevance.jsonl");
    head(&bench.join("nothing-fits").join("bfcl-irrelevance.jsonl"), &irrelevance, 30);
    let (alone, _) = eval_report(&tools, &[&queries], &[]);
    let (report, lines) = eval_report(&tools, &[&queries, &small_talk, &irrelevance], &["--empty-when-nothing-fits"]);
    let (full, _) = eval_report(&tools, &[&queries, &small_talk, &irrelevance], &[]);
    assert_eq!(full["metrics"], alone["metrics"], "metrics cover the answerable requests alone");
    assert_eq!(full["nothingFits"], report["nothingFits"], "the shares do not depend on what the run file holds");
    assert_eq!(report["metrics"]["queries"], 40);
    assert_eq!(lines.len(), 40 + 60 + 30);
    let fits = &report["nothingFits"];
    assert_eq!(fits["unanswerable"], 90);
    let empty = lines[40..].iter().filter(|line| line["ranked"].as_array().unwrap().is_empty()).count();
    assert_eq!(fits["answeredEmpty"].as_u64(), Some(empty as u64));
    let share = fits["answeredEmptyShare"].as_f64().unwrap();
    assert!((share - 100.0 * empty as f64 / 90.0).abs() < 1e-9, "{fits}");
    // And per split: the small talk's and the irrelevance requests' empty rankings apart.
    let by_split = &fits["unanswerableBySplit"];
    for (split, lines) in [("small-talk", &lines[40..100]), ("irrelevance", &lines[100..])] {
        let empty = lines.iter().filter(|line| line["ranked"].as_array().unwrap().is_empty()).count();
        assert_eq!(by_split[split]["unanswerable"].as_u64(), Some(lines.len() as u64), "{by_split}");
        assert_eq!(by_split[split]["answeredEmpty"].as_u64(), Some(empty as u64), "{by_split}");
    }
    // A request with its own tools never ranks the tools file's.
    let own_tools: Vec<Value> = std::fs::read_to_string(&irrelevance)
        .unwrap()
        .lines()
        .map(|line| serde_json::from_str::<Value>(line).unwrap()["tools"].clone())
        .collect();
    for (line, tools) in lines[100..].iter().zip(&own_tools) {
        let offered: Vec<&str> = tools.as_array().unwrap().iter().map(|tool| tool["id"].as_str().unwrap()).collect();
        for id in line["ranked"].as_array().unwrap() {
            assert!(offered.contains(&id.as_str().unwrap()), "{line} ranks a tool it was not offered");
        }
    }
    let kept = fits["keptShare"].as_f64().unwrap();
    assert!((0.0..=100.0).contains(&kept), "{fits}");
    // --signals: one line per request, in order, with its first hits' signals.
    let signals = dir.path().join("signals.jsonl");
    let signals_arg = signals.to_str().unwrap();
    eval_report(&tools, &[&queries, &small_talk, &irrelevance], &["--signals", signals_arg]);
    let signal_lines: Vec<Value> = std::fs::read_to_string(&signals)
        .unwrap()
        .lines()
        .map(|line| serde_json::from_str::<Value>(line).unwrap())
        .collect();
    assert_eq!(signal_lines.len(), 130);
    for (i, line) in signal_lines.iter().enumerate() {
        assert_eq!(line["queryIdx"].as_u64(), Some(i as u64));
        assert_eq!(line["answerable"].as_bool(), Some(i < 40), "{line}");
        let hits = line["hits"].as_array().unwrap();
        assert!(hits.len() <= 5, "{line}");
        for hit in hits {
            let coverage = hit["coverage"].as_f64().unwrap();
            assert!((0.0..=1.0).contains(&coverage), "{line}");
        }
        assert!(line["floorMax"].as_f64().unwrap() >= line["floorMedian"].as_f64().unwrap(), "{line}");
    }
    let relevant_found = signal_lines[..40]
        .iter()
        .filter(|line| line["hits"].as_array().unwrap().iter().any(|hit| hit["relevant"] == true))
        .count();
    assert_eq!(relevant_found as u64, fits["answerableInReach"].as_u64().unwrap(), "the same first five hits");
    assert!(fits["answerableInReach"].as_u64().unwrap() > 10, "many sample requests find a relevant tool: {fits}");
}

/// The held-out small talk (`scripts/chatterbot_small_talk.py`) is eval
/// input as it stands: every line a request nothing fits, counted under its
/// own split.
#[test]
fn held_out_small_talk_is_its_own_split() {
    let bench = bench_dir();
    let dir = tempfile::tempdir().unwrap();
    let (tools, queries) = metatool_sample(dir.path(), 20);
    let chatter = bench.join("nothing-fits").join("chatterbot.jsonl");
    let lines = std::fs::read_to_string(&chatter).unwrap().lines().count();
    assert!(lines >= 150, "{lines} requests");
    let (report, run) = eval_report(&tools, &[&queries, &chatter], &["--empty-when-nothing-fits"]);
    let fits = &report["nothingFits"];
    assert_eq!(fits["unanswerable"].as_u64(), Some(lines as u64), "{fits}");
    let split = &fits["unanswerableBySplit"]["chatterbot"];
    assert_eq!(split["unanswerable"].as_u64(), Some(lines as u64), "{fits}");
    let empty = run[20..].iter().filter(|line| line["ranked"].as_array().unwrap().is_empty()).count();
    assert_eq!(split["answeredEmpty"].as_u64(), Some(empty as u64), "{fits}");
    // The table for people names each split's share when there is more than one.
    let small_talk = bench.join("nothing-fits").join("small-talk.jsonl");
    let output = capdex()
        .args(["eval", "--tools"])
        .arg(&tools)
        .args(["--queries".as_ref(), queries.as_os_str(), "--queries".as_ref(), chatter.as_os_str()])
        .args(["--queries".as_ref(), small_talk.as_os_str()])
        .output()
        .unwrap();
    assert!(output.status.success(), "capdex eval failed: {}", String::from_utf8_lossy(&output.stderr));
    let text = String::from_utf8_lossy(&output.stdout);
    let by_split = text.lines().find(|line| line.trim_start().starts_with("by split:")).unwrap_or_default();
    assert!(by_split.contains(&format!("chatterbot {empty}/{lines} (")), "{text}");
    assert!(by_split.contains("small-talk "), "{text}");
}

/// The replay protocol: a seeded half's outcomes are fed in one at a time,
/// every learning tried on each before it is learnt; the other half is ranked
/// without learning, with each learning and with the one the trials chose;
/// the same seed gives the same figures.
#[test]
fn replay_feeds_one_half_and_ranks_the_other() {
    let dir = tempfile::tempdir().unwrap();
    let (tools, queries) = metatool_sample(dir.path(), 120);
    let (report, _) = eval_report(&tools, &[&queries], &["--replay", "7"]);
    let replay = &report["replay"];
    assert_eq!(replay["seed"], 7);
    assert_eq!(replay["firstHalf"], 60);
    assert_eq!(replay["withoutLearning"]["queries"], 60);
    assert!(replay["outcomes"].as_u64().unwrap() >= 60, "{replay}");
    assert!(replay["adjusted"].as_u64().unwrap() > 0, "{replay}");
    assert!(replay["remembered"].as_u64().unwrap() > 0, "{replay}");
    // MetaTool's requests for one tool share words: some were learnt.
    let learned_words = replay["learnedWords"].as_u64().unwrap();
    assert!((1..=replay["remembered"].as_u64().unwrap()).contains(&learned_words), "{replay}");
    // Every learning was tried on the first half's requests as they came (all but the first).
    assert_eq!(replay["trials"], 59);
    // The first trial's capabilities had no outcome yet, nor had some later ones'.
    let unseen_trials = replay["unseenTrials"].as_u64().unwrap();
    assert!((1..59).contains(&unseen_trials), "{replay}");
    let tried = replay["atEachLearning"].as_array().unwrap();
    assert_eq!(tried.len(), 11);
    let moved = |prior: bool, memory: bool| {
        tried.iter().any(|trial| {
            trial["prior"] == prior
                && trial["memoryOwnWeight"].is_number() == memory
                && trial["secondHalf"] != replay["withoutLearning"]
        })
    };
    assert!(moved(true, false), "the prior moved some ranking: {replay}");
    assert!(moved(false, true), "the memory alone moved some ranking: {replay}");
    let unseen = replay["unseen"].as_u64().unwrap();
    assert!(unseen < 60, "{replay}");
    for trial in tried {
        assert_eq!(trial["secondHalf"]["queries"], 60);
        assert_eq!(trial["unseen"]["queries"].as_u64(), Some(unseen));
        assert!(trial["standardError"].as_f64().unwrap() >= 0.0, "{trial}");
        // A standard error is infinite (null in JSON) below two trials.
        assert!(trial["unseenMeanGain"].is_number(), "{trial}");
        assert!(trial["unseenStandardError"].is_number() || unseen_trials < 2, "{trial}");
    }
    assert_eq!(replay["unseenWithoutLearning"]["queries"].as_u64(), Some(unseen));
    // What the second half gets is what the chosen learning gives it, or no learning at all.
    let trial_of = |chosen: &serde_json::Map<String, Value>| {
        tried
            .iter()
            .find(|trial| {
                ["prior", "memoryOwnWeight", "memoryWords"].iter().all(|field| trial[field] == chosen[*field])
            })
            .unwrap()
    };
    match replay["chosen"].as_object() {
        None => {
            assert_eq!(replay["learned"], replay["withoutLearning"]);
            assert_eq!(replay["unseenLearned"], replay["unseenWithoutLearning"]);
        }
        Some(chosen) => {
            let trial = trial_of(chosen);
            assert!(trial["meanGain"].as_f64().unwrap() > 2.0 * trial["standardError"].as_f64().unwrap(), "{replay}");
            // Chosen only when the trials of capabilities with no outcome yet did not lose beyond their noise.
            let unseen_gain = trial["unseenMeanGain"].as_f64().unwrap();
            let unseen_error = trial["unseenStandardError"].as_f64().unwrap_or(f64::INFINITY);
            assert!(unseen_gain >= -2.0 * unseen_error, "{replay}");
            assert_eq!(replay["learned"], trial["secondHalf"]);
            assert_eq!(replay["unseenLearned"], trial["unseen"]);
        }
    }
    // As `capdex serve` learns, with its own trials: nothing learnt, or one of the learnings tried.
    let served = &replay["served"];
    assert_eq!(served["prior"], true);
    assert_eq!(served["asServed"], replay["withoutLearning"]);
    assert!(served["trials"].as_u64().unwrap() > 0, "{served}");
    match served["chosen"].as_object() {
        None => assert_eq!(served["learned"], served["asServed"]),
        Some(chosen) => assert_eq!(served["learned"], trial_of(chosen)["secondHalf"]),
    }
    let (again, _) = eval_report(&tools, &[&queries], &["--replay", "7"]);
    assert_eq!(again["replay"], report["replay"]);
    let (other, _) = eval_report(&tools, &[&queries], &["--replay", "8"]);
    assert_ne!(other["replay"]["withoutLearning"], report["replay"]["withoutLearning"], "another seed, another split");
}
