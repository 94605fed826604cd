//! `capdex map`, `route` and `observe` on one data dir: the commands build on each other.

use crate::cli::capdex;
use crate::support::fixture;
use serde_json::Value;
use std::path::Path;

fn run_json(data_dir: &Path, args: &[&str]) -> Value {
    let output = capdex().arg("--data-dir").arg(data_dir).args(args).output().expect("capdex runs");
    assert!(output.status.success(), "capdex {args:?} failed: {}", String::from_utf8_lossy(&output.stderr));
    serde_json::from_slice(&output.stdout)
        .unwrap_or_else(|err| panic!("not JSON ({err}): {}", String::from_utf8_lossy(&output.stdout)))
}

#[test]
fn map_route_observe_on_one_data_dir() {
    let dir = tempfile::tempdir().unwrap();
    let ddl = fixture("sql/chinook.sqlite-ddl.sql");
    let report = run_json(
        dir.path(),
        &["map", ddl.to_str().unwrap(), "--source-id", "chinook", "--workspace", "music", "--json"],
    );
    assert_eq!(report["kind"], "sql");
    assert_eq!(report["changed"], true);
    assert_eq!(report["nodeCounts"]["entity_type"], 11);
    // Re-mapping the same file changes nothing.
    let again = run_json(dir.path(), &["map", ddl.to_str().unwrap(), "--source-id", "chinook", "--json"]);
    assert_eq!(again["changed"], false);
    assert_eq!(again["driftHash"], report["driftHash"]);
    assert_eq!(again["workspaces"], serde_json::json!(["music"]));
    let mcp = fixture("mcp/github.json");
    run_json(dir.path(), &["map", mcp.to_str().unwrap(), "--source-id", "github", "--kind", "mcp", "--json"]);

    let routed = run_json(dir.path(), &["route", "invoice lines of a track", "--workspace", "music", "--json"]);
    let recipes = routed["recipes"].as_array().unwrap();
    assert!(!recipes.is_empty() && recipes.len() <= 5);
    for recipe in recipes {
        assert!(recipe["sourceKey"].as_str().unwrap().starts_with("chinook#"), "{recipe}");
        assert!(recipe["score"].as_f64().unwrap() > 0.0);
        assert!(recipe["steps"].as_array().unwrap().iter().all(|step| step.as_str().unwrap().starts_with("chinook#")));
    }
    let unscoped = run_json(dir.path(), &["route", "create a pull request", "--json"]);
    assert!(unscoped["recipes"][0]["sourceKey"].as_str().unwrap().starts_with("github#"), "{unscoped}");
    let empty = run_json(dir.path(), &["route", "create a pull request", "--workspace", "nobody", "--json"]);
    assert_eq!(empty["recipes"], serde_json::json!([]));
    // `map` offered the operations to discovery under the ids `route` gives them.
    let empty_dir = dir.path().join("no-capabilities");
    let found =
        run_json(dir.path(), &["discover", "create a pull request", "--json", "--dir", empty_dir.to_str().unwrap()]);
    let first = found["tier1"][0]["id"].as_str().unwrap_or_default().to_string();
    assert!(first.starts_with("github#") && first.contains("pull_request"), "{found}");
    let steps = unscoped["recipes"].as_array().unwrap().iter().flat_map(|r| r["steps"].as_array().unwrap().clone());
    assert!(steps.map(|step| step.as_str().unwrap().to_string()).any(|step| step == first), "{unscoped} {first}");

    let observed = run_json(dir.path(), &["observe", "chinook#InvoiceLine", "--edge-kind", "RESOLVES_TO", "--json"]);
    assert_eq!(observed["node"]["kind"], "entity_type");
    let neighbours: Vec<&str> =
        observed["edges"].as_array().unwrap().iter().map(|edge| edge["neighbourKey"].as_str().unwrap()).collect();
    assert!(neighbours.contains(&"chinook#Invoice") && neighbours.contains(&"chinook#Track"), "{neighbours:?}");
    let hidden = capdex()
        .arg("--data-dir")
        .arg(dir.path())
        .args(["observe", "github#create_pull_request", "--workspace", "music"])
        .output()
        .unwrap();
    assert!(!hidden.status.success(), "a workspace must not observe a source it did not enable");

    // Memory: a dead end deposited from the CLI damps that recipe and shows at its node.
    let before = run_json(dir.path(), &["route", "invoice lines of a track", "--workspace", "music", "--json"]);
    let first = before["recipes"][0]["sourceKey"].as_str().unwrap().to_string();
    let deposited = run_json(
        dir.path(),
        &[
            "deposit",
            "returned no rows",
            "--polarity",
            "dead_end",
            "--anchor",
            &first,
            "--workspace",
            "music",
            "--json",
        ],
    );
    assert_eq!(deposited["note"]["labels"], serde_json::json!(["ws:music"]));
    let after = run_json(dir.path(), &["route", "invoice lines of a track", "--workspace", "music", "--json"]);
    let score = |route: &Value| {
        route["recipes"]
            .as_array()
            .unwrap()
            .iter()
            .find(|r| r["sourceKey"] == first.as_str())
            .map(|r| r["score"].as_f64().unwrap())
    };
    assert!(score(&after).is_none_or(|after| after < score(&before).unwrap()), "{before}\n{after}");
    let observed = run_json(dir.path(), &["observe", &first, "--workspace", "music", "--json"]);
    assert_eq!(observed["notes"][0]["polarity"], "dead_end", "{observed}");
    let outside = capdex()
        .arg("--data-dir")
        .arg(dir.path())
        .args([
            "deposit",
            "x",
            "--polarity",
            "positive",
            "--anchor",
            "github#create_pull_request",
            "--workspace",
            "music",
        ])
        .output()
        .unwrap();
    assert!(!outside.status.success(), "a workspace deposit must not anchor a source it did not enable");
}

/// Route resolves a question that shares no word with the schema to concepts, says what
/// resolved them, and names per recipe the operation and field that carry each; observe
/// lists the concepts a node carries.
#[test]
fn route_resolves_concepts_and_says_through_what() {
    let dir = tempfile::tempdir().unwrap();
    let ddl = fixture("sql/chinook.sqlite-ddl.sql");
    run_json(dir.path(), &["map", ddl.to_str().unwrap(), "--source-id", "chinook", "--json"]);

    let routed = run_json(dir.path(), &["route", "who is this employee's boss", "-k", "3", "--json"]);
    let owner = routed["concepts"].as_array().unwrap().iter().find(|c| c["concept"] == "owner").cloned();
    let owner = owner.unwrap_or_else(|| panic!("no owner concept: {routed}"));
    assert!(owner["via"].as_array().unwrap().iter().any(|via| via["through"] == "lexicon" && via["term"] == "boss"));
    let recipes = routed["recipes"].as_array().unwrap();
    let keys: Vec<&str> = recipes.iter().map(|recipe| recipe["sourceKey"].as_str().unwrap()).collect();
    assert!(keys.iter().any(|key| key.starts_with("chinook#") && key.contains("Employee")), "{routed}");
    let field = recipes
        .iter()
        .flat_map(|recipe| recipe["concepts"].as_array().into_iter().flatten())
        .filter(|concept| concept["concept"] == "owner")
        .flat_map(|concept| concept["steps"].as_array().into_iter().flatten())
        .find_map(|step| step["field"].as_str());
    assert_eq!(field, Some("chinook#Employee.ReportsTo"), "{routed}");

    // A field's own name in the question resolves through the source itself.
    let routed = run_json(dir.path(), &["route", "which invoices have a billing country", "--json"]);
    let through: Vec<&str> = routed["concepts"]
        .as_array()
        .unwrap()
        .iter()
        .flat_map(|concept| concept["via"].as_array().unwrap())
        .map(|via| via["through"].as_str().unwrap())
        .collect();
    assert!(through.contains(&"source"), "{routed}");

    let observed = run_json(dir.path(), &["observe", "chinook#Employee", "--json"]);
    let carried: Vec<&str> =
        observed["concepts"].as_array().unwrap().iter().map(|concept| concept["concept"].as_str().unwrap()).collect();
    assert!(carried.contains(&"owner") && carried.contains(&"employee"), "{carried:?}");
}

/// `capdex eval --route` maps the ten fixture sources, judges every question, and puts a
/// plain BM25 beside capdex.
#[test]
fn the_route_benchmark_runs_on_the_fixtures() {
    let dir = tempfile::tempdir().unwrap();
    let manifest = fixture("route/route.json");
    let report = run_json(dir.path(), &["eval", "--route", manifest.to_str().unwrap(), "--json"]);
    assert_eq!(report["sources"], 10);
    let questions = report["questions"].as_array().unwrap();
    assert!(questions.len() >= 40);
    let kind = |name: &str| &report["byKind"][name];
    let total: u64 = ["direct", "concept", "cross"].iter().map(|name| kind(name)["questions"].as_u64().unwrap()).sum();
    assert_eq!(total as usize, questions.len());
    // Concepts are what the plain BM25 lacks: capdex reaches more concept questions.
    assert!(kind("concept")["capdexHits"].as_u64() > kind("concept")["bm25Hits"].as_u64(), "{}", report["byKind"]);
    assert!(report["routeP99Us"].as_f64().unwrap() > 0.0);
    assert!(questions.iter().all(|q| q["capdex"].as_array().unwrap().len() <= 3));
}
