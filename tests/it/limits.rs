//! `[limits]` over NATS against a real nats-server and `capdex serve`, each
//! limit set small through its `CAPDEX_LIMITS_*` variable and tried at the
//! limit (accepted) and one over it (refused 413 with the limit's code and a
//! message naming the setting): JSON and msgpack nesting, tools per source,
//! operations per OpenAPI spec, YAML aliases and YAML depth, the capabilities
//! one outcome lists. The length of an id (`max_id_bytes`) is tried the same
//! way, each refusal keeping the code of the request it is in.

use crate::dispatch::{ask, call, code, serve};
use crate::support::nats_server::NatsServer;
use serde_json::{json, Value};
use std::time::Duration;

/// Sends `payload` (JSON, or msgpack of the same value) and returns the reply and its error status, if any.
async fn send(client: &async_nats::Client, subject: &str, payload: &Value, msgpack: bool) -> (Value, Option<String>) {
    let mut headers = async_nats::HeaderMap::new();
    let body = if msgpack {
        headers.insert("Content-Type", "application/msgpack");
        rmp_serde::to_vec_named(payload).unwrap()
    } else {
        serde_json::to_vec(payload).unwrap()
    };
    let reply = tokio::time::timeout(
        Duration::from_secs(15),
        client.request_with_headers(subject.to_string(), headers, body.into()),
    )
    .await
    .expect("a reply within 15 s")
    .expect("the request is answered");
    let status = reply.headers.as_ref().and_then(|h| h.get("Nats-Service-Error-Code")).map(|v| v.to_string());
    let value = if msgpack {
        rmp_serde::from_slice(&reply.payload).expect("a msgpack reply")
    } else {
        serde_json::from_slice(&reply.payload).expect("a JSON reply")
    };
    (value, status)
}

fn tool(name: &str) -> Value {
    json!({"name": name, "description": format!("the {name} tool")})
}

fn openapi(operations: usize) -> Value {
    let paths: serde_json::Map<String, Value> = (0..operations)
        .map(|i| (format!("/thing{i}"), json!({"get": {"operationId": format!("getThing{i}"), "summary": "a thing"}})))
        .collect();
    json!({"openapi": "3.0.0", "info": {"title": "t", "version": "1"}, "paths": paths})
}

#[tokio::test]
async fn each_limit_accepts_its_value_and_refuses_one_more_naming_the_setting() {
    let nats = NatsServer::start();
    let data = tempfile::tempdir().unwrap();
    let (_serving, client) = serve(
        &nats,
        data.path(),
        &[
            ("CAPDEX_LIMITS_MAX_JSON_DEPTH", "8"),
            ("CAPDEX_LIMITS_MAX_TOOLS_PER_SOURCE", "2"),
            ("CAPDEX_LIMITS_MAX_OPERATIONS_PER_SPEC", "2"),
            ("CAPDEX_LIMITS_MAX_YAML_ALIASES", "1"),
            ("CAPDEX_LIMITS_MAX_YAML_DEPTH", "4"),
            ("CAPDEX_LIMITS_MAX_REF_HOPS", "2"),
            ("CAPDEX_LIMITS_MAX_CAPABILITIES_PER_OUTCOME", "2"),
            ("CAPDEX_LIMITS_MAX_EXCLUDED_CAPABILITIES", "2"),
            ("CAPDEX_LIMITS_MAX_ANCHORS", "2"),
        ],
    )
    .await;

    // The anchors of one memory deposit: two pass the count (and are then looked up: none
    // is a node here), three are refused naming the setting.
    let deposit = |n: usize| {
        json!({"content": "getIssue gave the assignee", "polarity": "positive", "workspace": "acme",
            "anchors": (0..n).map(|i| format!("gitea#op{i}")).collect::<Vec<_>>()})
    };
    let (two, _) = send(&client, "capdex.v1.memory.deposit", &deposit(2), false).await;
    assert_eq!(two["code"], "unknown_anchor", "two anchors pass the count: {two}");
    let (three, _) = send(&client, "capdex.v1.memory.deposit", &deposit(3), false).await;
    assert_eq!(three["code"], "invalid_deposit", "{three}");
    assert!(three["message"].as_str().unwrap().contains("1 to 2 anchors (limits.max_anchors), got 3"), "{three}");

    // The capabilities one query excludes, on discover and plan.
    let excluding = |n: usize| json!({"message": "send a message", "excludedCapabilityIds": (0..n).map(|i| format!("tool:t{i}")).collect::<Vec<_>>()});
    for subject in ["capdex.v1.discover", "capdex.v1.plan"] {
        let (two, status) = send(&client, subject, &excluding(2), false).await;
        assert_eq!(status, None, "{subject}, two excluded: {two}");
        let (three, status) = send(&client, subject, &excluding(3), false).await;
        assert_eq!((status.as_deref(), three["code"].as_str()), (Some("413"), Some("too_many_excluded")), "{three}");
        assert!(three["message"].as_str().unwrap().contains("limits.max_excluded_capabilities: at most 2"), "{three}");
    }

    // The capabilities one outcome lists.
    let outcome = |n: usize| {
        json!({"turnId": format!("listing-{n}"), "status": "success",
            "capabilities": (0..n).map(|i| format!("tool:t{i}")).collect::<Vec<_>>()})
    };
    let (two, status) = send(&client, "capdex.v1.outcome", &outcome(2), false).await;
    assert_eq!(status, None, "two capabilities: {two}");
    let (three, status) = send(&client, "capdex.v1.outcome", &outcome(3), false).await;
    assert_eq!((status.as_deref(), three["code"].as_str()), (Some("413"), Some("too_many_capabilities")), "{three}");
    assert!(three["message"].as_str().unwrap().contains("limits.max_capabilities_per_outcome: at most 2"), "{three}");

    // Nesting, JSON and msgpack: the batch {tools: [{inputSchema: {properties: {q: {type}}}}]} nests
    // 6 levels, plus `extra` objects wrapped around q's.
    let nested = |extra: usize| {
        let mut leaf = json!({"type": "string"});
        for _ in 0..extra {
            leaf = json!({"x": leaf});
        }
        json!({"runtimeId": "r", "tools": [{"name": "deep", "description": "a deep tool",
            "inputSchema": {"type": "object", "properties": {"q": leaf}}}]})
    };
    for msgpack in [false, true] {
        let (at_limit, status) = send(&client, "capdex.v1.capabilities.upsert", &nested(2), msgpack).await;
        assert_eq!(status, None, "depth 8 is accepted (msgpack: {msgpack}): {at_limit}");
        let (over, status) = send(&client, "capdex.v1.capabilities.upsert", &nested(3), msgpack).await;
        assert_eq!(status.as_deref(), Some("413"), "depth 9 (msgpack: {msgpack}): {over}");
        assert_eq!(over["code"], "json_too_deep", "{over}");
        assert!(over["message"].as_str().unwrap().contains("limits.max_json_depth"), "{over}");
    }

    // Tools per source: a registration's tools.
    let batch =
        |n: usize| json!({"runtimeId": "r", "tools": (0..n).map(|i| tool(&format!("t{i}"))).collect::<Vec<_>>()});
    let (two, status) = send(&client, "capdex.v1.capabilities.upsert", &batch(2), false).await;
    assert_eq!(status, None, "{two}");
    let (three, status) = send(&client, "capdex.v1.capabilities.upsert", &batch(3), false).await;
    assert_eq!((status.as_deref(), three["code"].as_str()), (Some("413"), Some("too_many_tools")), "{three}");
    assert!(three["message"].as_str().unwrap().contains("limits.max_tools_per_source"), "{three}");
    // ... and an MCP tool list mapped into the SCG.
    let list = |n: usize| {
        json!({"tools": (0..n).map(|i| json!({"name": format!("t{i}"), "description": "t",
        "inputSchema": {"type": "object"}})).collect::<Vec<_>>()})
    };
    let map = |id: &str, kind: &str, document: Value| json!({"sourceId": id, "kind": kind, "document": document});
    let (ok, status) = send(&client, "capdex.v1.map", &map("mcp2", "mcp", list(2)), false).await;
    assert_eq!(status, None, "{ok}");
    let (over, status) = send(&client, "capdex.v1.map", &map("mcp3", "mcp", list(3)), false).await;
    assert_eq!((status.as_deref(), over["code"].as_str()), (Some("413"), Some("too_many_tools")), "{over}");

    // Operations per spec.
    let (ok, status) = send(&client, "capdex.v1.map", &map("api2", "openapi", openapi(2)), false).await;
    assert_eq!(status, None, "{ok}");
    let (over, status) = send(&client, "capdex.v1.map", &map("api3", "openapi", openapi(3)), false).await;
    assert_eq!((status.as_deref(), over["code"].as_str()), (Some("413"), Some("too_many_operations")), "{over}");
    assert!(over["message"].as_str().unwrap().contains("limits.max_operations_per_spec"), "{over}");

    // $ref hops: the tool's input schema is `$ref` S0, S0 is `$ref` S1, ..., the last an object.
    let chained = |hops: usize| {
        let mut schemas = serde_json::Map::new();
        for i in 0..hops - 1 {
            schemas.insert(format!("S{i}"), json!({"$ref": format!("#/components/schemas/S{}", i + 1)}));
        }
        schemas.insert(format!("S{}", hops - 1), json!({"type": "object"}));
        json!({"tools": [{"name": "t", "description": "t", "inputSchema": {"$ref": "#/components/schemas/S0"}}],
            "components": {"schemas": schemas}})
    };
    let (ok, status) = send(&client, "capdex.v1.map", &map("refs2", "mcp", chained(2)), false).await;
    assert_eq!(status, None, "two hops: {ok}");
    let (over, status) = send(&client, "capdex.v1.map", &map("refs3", "mcp", chained(3)), false).await;
    assert_eq!((status.as_deref(), over["code"].as_str()), (Some("413"), Some("ref_chain_too_long")), "{over}");
    assert!(over["message"].as_str().unwrap().contains("limits.max_ref_hops"), "{over}");

    // YAML aliases and depth, in an OpenAPI document sent as text.
    let yaml = |aliases: usize, deep: bool| {
        let summaries: String = (0..aliases).map(|i| format!("  /a{i}:\n    get:\n      summary: *s\n")).collect();
        let schema = if deep { "      x:\n        y: [1]\n" } else { "" };
        format!(
            "openapi: 3.0.0\ninfo:\n  title: t\n  version: '1'\nx-summary: &s shared\npaths:\n{summaries}\
             components:\n  schemas:\n    A:\n{schema}      type: object\n"
        )
    };
    let (ok, status) = send(&client, "capdex.v1.map", &map("yaml1", "openapi", json!(yaml(1, false))), false).await;
    assert_eq!(status, None, "one alias: {ok}");
    let (over, status) = send(&client, "capdex.v1.map", &map("yaml2", "openapi", json!(yaml(2, false))), false).await;
    assert_eq!((status.as_deref(), over["code"].as_str()), (Some("413"), Some("too_many_yaml_aliases")), "{over}");
    // Without x the document nests 4 levels; components.schemas.A.x.y (a list) nests 6.
    let (over, status) = send(&client, "capdex.v1.map", &map("yaml3", "openapi", json!(yaml(0, true))), false).await;
    assert_eq!((status.as_deref(), over["code"].as_str()), (Some("413"), Some("yaml_too_deep")), "{over}");
    assert!(over["message"].as_str().unwrap().contains("limits.max_yaml_depth"), "{over}");
}

#[tokio::test]
async fn ids_are_refused_one_byte_over_the_configured_max_id_bytes_naming_the_setting() {
    // Not the default (128): the setting is what is read.
    const MAX: usize = 70;
    let nats = NatsServer::start();
    let data = tempfile::tempdir().unwrap();
    let (_serving, client) = serve(&nats, data.path(), &[("CAPDEX_LIMITS_MAX_ID_BYTES", "70")]).await;
    let (at, over) = ("a".repeat(MAX), "a".repeat(MAX + 1));
    let names_the_setting = |answer: &Value, message: &str| {
        let expected = format!("is {} bytes, over limits.max_id_bytes: at most {MAX}", MAX + 1);
        assert!(message.contains(&expected), "{expected:?} in {answer}");
    };

    // Capability ids on registration: the names a runtime gives its capabilities, and its runtimeId.
    let upsert = |runtime: &str, names: &[&str]| {
        let tools: Vec<Value> = names.iter().map(|name| tool(name)).collect();
        json!({"runtimeId": runtime, "tools": tools})
    };
    let (tool_at, tool_over) = ("t".repeat(MAX), "u".repeat(MAX + 1));
    let reply = ask(&client, "capdex.v1.capabilities.upsert", upsert(&at, &[&tool_at, &tool_over])).await;
    assert_eq!(reply["added"], json!([format!("tool:{tool_at}")]), "{reply}");
    assert_eq!(
        (reply["diagnostics"][0]["index"].as_u64(), &reply["diagnostics"][0]["field"]),
        (Some(1), &json!("name"))
    );
    names_the_setting(&reply, reply["diagnostics"][0]["problem"].as_str().unwrap());
    let refused = ask(&client, "capdex.v1.capabilities.upsert", upsert(&over, &["x"])).await;
    assert_eq!(refused["code"], "bad_request", "{refused}");
    names_the_setting(&refused, refused["message"].as_str().unwrap());

    // The agent id and the re-drive key of a call.
    let echo = json!({"slug": "echo_ids", "name": "echo_ids", "description": "the built-in echo", "category": "test",
        "executionType": "internal", "handler": "builtin:echo",
        "functionDefinition": {"name": "echo_ids", "description": "the built-in echo",
            "parameters": {"type": "object", "properties": {"text": {"type": "string"}}}}});
    let registered = ask(&client, "capdex.v1.capability.register", echo).await;
    assert!(registered["policyVersion"].as_u64().is_some(), "{registered}");
    let go = |agent: &str, execution: &str, step: &str| json!({"slug": "echo_ids", "agentId": agent, "arguments": {"text": "hi"}, "executionId": execution, "stepId": step});
    let ran = call(&client, go(&at, &at, &at)).await;
    assert_eq!(ran["success"], true, "an agentId, executionId and stepId of {MAX} bytes: {ran}");
    for refused in [
        call(&client, go(&over, "e", "s")).await,
        call(&client, go("a", &over, "s")).await,
        call(&client, go("a", "e", &over)).await,
    ] {
        assert_eq!(code(&refused), "invalid_request", "{refused}");
        names_the_setting(&refused, refused["error"]["message"].as_str().unwrap());
    }
    // The agent's own subject: its token is the id.
    let own =
        ask(&client, &format!("capdex.v1.agent.{at}.dispatch"), json!({"slug": "echo_ids", "arguments": {}})).await;
    assert_eq!(own["success"], true, "{own}");
    let refused = ask(&client, &format!("capdex.v1.agent.{over}.dispatch"), json!({"slug": "echo_ids"})).await;
    assert_eq!(refused["code"], "bad_request", "{refused}");
    names_the_setting(&refused, refused["message"].as_str().unwrap());
    // A binding's agent.
    let bind = |agent: &str| json!({"agentId": agent, "slug": "echo_ids", "isEnabled": true});
    let bound = ask(&client, "capdex.v1.binding.set", bind(&at)).await;
    assert!(bound["binding"].is_object(), "{bound}");
    let refused = ask(&client, "capdex.v1.binding.set", bind(&over)).await;
    assert_eq!(refused["code"], "invalid_binding", "{refused}");
    names_the_setting(&refused, refused["message"].as_str().unwrap());

    // An outcome's organisation.
    let outcome = |org: &str| json!({"turnId": "t1", "organizationId": org, "status": "success"});
    let recorded = ask(&client, "capdex.v1.outcome", outcome(&at)).await;
    assert_eq!(recorded["kpi"]["scopeKey"], at.as_str(), "{recorded}");
    let refused = ask(&client, "capdex.v1.outcome", outcome(&over)).await;
    assert!(refused["message"].as_str().unwrap_or_default().starts_with("organizationId"), "{refused}");
    names_the_setting(&refused, refused["message"].as_str().unwrap());
    // ... its turnId.
    let turn = |turn: &str| json!({"turnId": turn, "status": "success"});
    let recorded = ask(&client, "capdex.v1.outcome", turn(&at)).await;
    assert_eq!(recorded["kpi"]["scopeKey"], "global", "{recorded}");
    let refused = ask(&client, "capdex.v1.outcome", turn(&over)).await;
    assert_eq!(refused["code"], "bad_request", "{refused}");
    assert!(refused["message"].as_str().unwrap_or_default().starts_with("turnId"), "{refused}");
    names_the_setting(&refused, refused["message"].as_str().unwrap());

    // Who decides an approval: an unknown one is looked up only when `by` passes.
    let decide = |by: &str| json!({"by": by});
    let unknown = ask(&client, "capdex.v1.approval.nothing-here.approve", decide(&at)).await;
    assert_eq!(unknown["code"], "unknown_approval", "a by of {MAX} bytes is read: {unknown}");
    let refused = ask(&client, "capdex.v1.approval.nothing-here.approve", decide(&over)).await;
    assert_eq!(refused["code"], "bad_request", "{refused}");
    assert!(refused["message"].as_str().unwrap_or_default().starts_with("by is"), "{refused}");
    names_the_setting(&refused, refused["message"].as_str().unwrap());

    // An SCG source id and a workspace it enables.
    let map = |id: &str, workspace: &str| {
        json!({"sourceId": id, "kind": "mcp", "workspaces": [workspace],
            "document": {"tools": [{"name": "t", "description": "t", "inputSchema": {"type": "object"}}]}})
    };
    let mapped = ask(&client, "capdex.v1.map", map(&at, &at)).await;
    assert_eq!(mapped["sourceId"], at.as_str(), "{mapped}");
    for (refused, code) in [
        (ask(&client, "capdex.v1.map", map(&over, "w")).await, "invalid_source_id"),
        (ask(&client, "capdex.v1.map", map("s", &over)).await, "bad_request"),
    ] {
        assert_eq!(refused["code"], code, "{refused}");
        names_the_setting(&refused, refused["message"].as_str().unwrap());
    }
    // ... a discovery's workspace.
    let discover = |workspace: &str| json!({"message": "anything", "workspace": workspace});
    let found = ask(&client, "capdex.v1.discover", discover(&at)).await;
    assert!(found.get("code").is_none(), "a workspace of {MAX} bytes: {found}");
    let refused = ask(&client, "capdex.v1.discover", discover(&over)).await;
    assert_eq!(refused["code"], "bad_request", "{refused}");
    names_the_setting(&refused, refused["message"].as_str().unwrap());
    // ... a route's and an observation's.
    let route = ask(&client, "capdex.v1.route", json!({"query": "anything", "workspace": at})).await;
    assert!(route.get("code").is_none(), "a workspace of {MAX} bytes: {route}");
    for (subject, request) in [
        ("capdex.v1.route", json!({"query": "anything", "workspace": over})),
        ("capdex.v1.observe", json!({"node": format!("{at}#t"), "workspace": over})),
    ] {
        let refused = ask(&client, subject, request).await;
        assert_eq!(refused["code"], "bad_request", "{subject}: {refused}");
        names_the_setting(&refused, refused["message"].as_str().unwrap());
    }
    // ... and a memory note's workspace label: one at the limit reaches the anchor check.
    let deposit = |workspace: &str| json!({"content": "a note", "polarity": "positive", "anchors": ["nowhere#t"], "workspace": workspace});
    let anchored = ask(&client, "capdex.v1.memory.deposit", deposit(&at)).await;
    assert_eq!(anchored["code"], "unknown_anchor", "{anchored}");
    let refused = ask(&client, "capdex.v1.memory.deposit", deposit(&over)).await;
    assert_eq!(refused["code"], "bad_label", "{refused}");
    names_the_setting(&refused, refused["message"].as_str().unwrap());
}
