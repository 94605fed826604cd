//! Outbound safety end to end, through a real `capdex serve` on a real
//! nats-server (issue 24, point 6): `${env:VAR}` reads only
//! `[dispatch] env_allow` names; the SSRF guard refuses every spelling of a
//! loopback address, a name resolving to one, and a redirect, before any
//! connection reaches the local listener; ids that become NATS subject
//! tokens refuse `.`, `*` and `>` naming their field.
//!
//! Every server here listens on 127.0.0.1 (one on 127.0.0.2, to count the
//! connections a followed redirect would make); nothing leaves the machine.

use crate::dispatch::{ask, call, code, record, register, serve};
use crate::support::nats_server::NatsServer;
use serde_json::{json, Value};
use std::io::{BufRead, BufReader, Read, Write};
use std::net::TcpListener;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, Mutex};
use std::time::Duration;

/// A listener that counts the connections it accepts and answers each with `answer(request head)`.
fn listener_on(
    host: &str,
    answer: impl Fn(&str) -> String + Send + 'static,
) -> (u16, Arc<AtomicU64>, Arc<Mutex<Vec<String>>>) {
    let listener = TcpListener::bind((host, 0)).expect("bind a local listener");
    let port = listener.local_addr().unwrap().port();
    let (accepts, heads) = (Arc::new(AtomicU64::new(0)), Arc::new(Mutex::new(Vec::new())));
    let (counted, recorded) = (accepts.clone(), heads.clone());
    std::thread::spawn(move || {
        for stream in listener.incoming() {
            let Ok(mut stream) = stream else { continue };
            counted.fetch_add(1, Ordering::SeqCst);
            let mut reader = BufReader::new(stream.try_clone().unwrap());
            let (mut head, mut length) = (String::new(), 0usize);
            loop {
                let mut line = String::new();
                if reader.read_line(&mut line).unwrap_or(0) == 0 || line == "\r\n" {
                    break;
                }
                if let Some(value) = line.to_ascii_lowercase().strip_prefix("content-length:") {
                    length = value.trim().parse().unwrap_or(0);
                }
                head.push_str(&line);
            }
            let mut body = vec![0; length];
            let _ = reader.read_exact(&mut body);
            let response = answer(&head);
            recorded.lock().unwrap().push(head);
            let _ = stream.write_all(response.as_bytes());
        }
    });
    (port, accepts, heads)
}

/// An HTTP/1.1 answer with a JSON body.
fn json_answer(status: &str, extra_headers: &str, body: &Value) -> String {
    let body = body.to_string();
    format!(
        "HTTP/1.1 {status}\r\nContent-Type: application/json\r\n{extra_headers}Content-Length: {}\r\nConnection: close\r\n\r\n{body}",
        body.len()
    )
}

/// The header `name` of a request head, if present.
fn header<'a>(head: &'a str, name: &str) -> Option<&'a str> {
    head.lines().find_map(|line| {
        let (key, value) = line.split_once(':')?;
        key.trim().eq_ignore_ascii_case(name).then(|| value.trim())
    })
}

fn api(slug: &str, url: &str) -> Value {
    record(
        slug,
        json!({"executionType": "api", "handler": url,
            "functionDefinition": {"name": slug, "parameters": {"type": "object"}}}),
    )
}

#[tokio::test]
async fn env_templates_read_only_allowlisted_variables() {
    let nats = NatsServer::start();
    let data = tempfile::tempdir().unwrap();
    let secret = "outbound-secret-value-9137";
    let (serving, client) =
        serve(&nats, data.path(), &[("CAPDEX_DISPATCH_SSRF_ALLOWLIST", "127.0.0.1/32"), ("CAPDEX_SECRET_X", secret)])
            .await;
    let (port, accepts, heads) = listener_on("127.0.0.1", |head| {
        json_answer("200 OK", "", &json!({"sawKey": header(head, "x-key").unwrap_or_default()}))
    });
    register(&client, api("crm", &format!("http://127.0.0.1:{port}/crm"))).await;

    // A header reading HOME is refused when the binding is set, naming the variable and the setting.
    let refused = ask(
        &client,
        "capdex.v1.binding.set",
        json!({"agentId": "a", "slug": "crm", "customConfig": {"headers": {"X-Key": "${env:HOME}"}}}),
    )
    .await;
    assert_eq!(refused["code"], "env_not_allowed", "{refused}");
    let message = refused["message"].as_str().unwrap();
    assert!(message.contains("HOME") && message.contains("env_allow") && message.contains("X-Key"), "{message}");
    // So is a capability whose own URL reads one.
    let url_refused = ask(&client, "capdex.v1.capability.register", api("leaky", "http://127.0.0.1/${env:PATH}")).await;
    assert_eq!(url_refused["code"], "env_not_allowed", "{url_refused}");
    // A sources.add reading one is refused before anything starts.
    let source_refused = ask(
        &client,
        "capdex.v1.sources.add",
        json!({"id": "leaky", "kind": "mcp", "command": "true", "env": {"K": "${env:HOME}"}}),
    )
    .await;
    assert_eq!(source_refused["code"], "env_not_allowed", "{source_refused}");
    assert!(source_refused["message"].as_str().unwrap().contains("env.K"), "{source_refused}");
    assert_eq!(accepts.load(Ordering::SeqCst), 0, "nothing was called");

    // An allowlisted CAPDEX_SECRET_* variable reaches the server, and never provenance, events or logs.
    let bound = ask(
        &client,
        "capdex.v1.binding.set",
        json!({"agentId": "a", "slug": "crm", "customConfig": {"headers": {"X-Key": "k=${env:CAPDEX_SECRET_X}"}}}),
    )
    .await;
    assert!(bound["binding"].is_object(), "{bound}");
    let result = call(&client, json!({"slug": "crm", "agentId": "a", "arguments": {"q": "x"}})).await;
    assert_eq!(result["success"], true, "{result}");
    assert_eq!(header(&heads.lock().unwrap()[0], "x-key"), Some(format!("k={secret}").as_str()));
    let provenance = ask(&client, "capdex.v1.provenance.list", json!({"limit": 10})).await;
    assert_eq!(provenance["provenance"].as_array().map(Vec::len), Some(1), "{provenance}");
    assert!(!provenance.to_string().contains(secret), "the secret reached provenance: {provenance}");
    assert!(!serving.log().contains(secret), "the secret reached the log");
}

#[tokio::test]
async fn every_spelling_of_loopback_is_refused_before_any_connection() {
    let nats = NatsServer::start();
    let data = tempfile::tempdir().unwrap();
    // Loopback is not allowlisted here.
    let (_serving, client) = serve(&nats, data.path(), &[]).await;
    let (port, accepts, _) = listener_on("127.0.0.1", |_| json_answer("200 OK", "", &json!({"reached": true})));
    let spellings = [
        format!("http://2130706433:{port}/"),
        format!("http://0x7f.1:{port}/"),
        format!("http://0x7f000001:{port}/"),
        format!("http://0177.0.0.1:{port}/"),
        format!("http://127.1:{port}/"),
        format!("http://127.0.0.1:{port}/"),
        format!("http://[::ffff:127.0.0.1]:{port}/"),
        format!("http://[::ffff:7f00:1]:{port}/"),
        format!("http://[64:ff9b::7f00:1]:{port}/"),
        // A name that resolves to loopback is judged on its addresses.
        format!("http://localhost:{port}/"),
    ];
    for (at, url) in spellings.iter().enumerate() {
        let slug = format!("spelling_{at}");
        register(&client, api(&slug, url)).await;
        let refused = call(&client, json!({"slug": slug, "agentId": "a", "arguments": {}})).await;
        assert_eq!(code(&refused), "target_refused", "{url}: {refused}");
    }
    tokio::time::sleep(Duration::from_millis(200)).await;
    assert_eq!(accepts.load(Ordering::SeqCst), 0, "a refused target was connected to");
}

#[tokio::test]
async fn redirects_are_not_followed_and_proxies_from_the_environment_are_not_used() {
    let nats = NatsServer::start();
    let data = tempfile::tempdir().unwrap();
    // A proxy that would see every request if capdex honoured the proxy variables.
    let (proxy_port, proxy_accepts, _) =
        listener_on("127.0.0.1", |_| json_answer("502 Bad Gateway", "", &json!({"via": "proxy"})));
    let proxy = format!("http://127.0.0.1:{proxy_port}");
    // Only 127.0.0.1 is allowed: 127.0.0.2 is loopback and refused.
    let (_serving, client) = serve(
        &nats,
        data.path(),
        &[
            ("CAPDEX_DISPATCH_SSRF_ALLOWLIST", "127.0.0.1/32"),
            ("HTTP_PROXY", &proxy),
            ("http_proxy", &proxy),
            ("ALL_PROXY", &proxy),
            ("all_proxy", &proxy),
            ("NO_PROXY", ""),
            ("no_proxy", ""),
        ],
    )
    .await;
    let (blocked_port, blocked_accepts, _) =
        listener_on("127.0.0.2", |_| json_answer("200 OK", "", &json!({"reached": "blocked"})));
    let location = format!("Location: http://127.0.0.2:{blocked_port}/inside\r\n");
    let (port, accepts, heads) = listener_on("127.0.0.1", move |head| {
        if head.starts_with("POST /start") {
            json_answer("302 Found", &location, &json!({}))
        } else {
            json_answer("200 OK", "", &json!({"direct": true}))
        }
    });
    register(&client, api("bouncer", &format!("http://127.0.0.1:{port}/start"))).await;
    register(&client, api("direct", &format!("http://127.0.0.1:{port}/direct"))).await;

    let direct = call(&client, json!({"slug": "direct", "agentId": "a", "arguments": {}})).await;
    assert_eq!(direct["data"]["direct"], true, "straight to the server, not through the proxy: {direct}");
    let refused = call(&client, json!({"slug": "bouncer", "agentId": "a", "arguments": {}})).await;
    assert_eq!(code(&refused), "target_refused", "{refused}");
    assert!(refused["error"]["message"].as_str().unwrap().contains("redirect"), "{refused}");
    tokio::time::sleep(Duration::from_millis(200)).await;
    assert_eq!(
        accepts.load(Ordering::SeqCst),
        2,
        "the allowed server was asked once per call: {:?}",
        heads.lock().unwrap()
    );
    assert_eq!(blocked_accepts.load(Ordering::SeqCst), 0, "the redirect's target was never contacted");
    assert_eq!(proxy_accepts.load(Ordering::SeqCst), 0, "the proxy variables were honoured");
}

#[tokio::test]
async fn ids_that_become_subject_tokens_refuse_separators_and_wildcards() {
    let nats = NatsServer::start();
    let data = tempfile::tempdir().unwrap();
    let (_serving, client) = serve(&nats, data.path(), &[]).await;
    for slug in ["look.up", "look*", "a>"] {
        let refused = ask(&client, "capdex.v1.capability.register", record(slug, json!({}))).await;
        assert_eq!(refused["code"], "invalid_registration", "{slug}: {refused}");
        assert!(refused["message"].as_str().unwrap().contains("slug"), "{refused}");
    }
    for agent in ["bot.1", "bot*", ">", "a b"] {
        let refused = call(&client, json!({"slug": "echo", "agentId": agent, "arguments": {"text": "hi"}})).await;
        assert_eq!(code(&refused), "invalid_request", "{agent}: {refused}");
        assert!(refused["error"]["message"].as_str().unwrap().contains("agentId"), "{refused}");
        let refused =
            ask(&client, "capdex.v1.binding.set", json!({"agentId": agent, "slug": "echo", "isEnabled": true})).await;
        assert_eq!(refused["code"], "invalid_binding", "{agent}: {refused}");
        assert!(refused["message"].as_str().unwrap().contains("agentId"), "{refused}");
    }
    let refused = call(&client, json!({"slug": "ec.ho", "agentId": "a", "arguments": {"text": "hi"}})).await;
    assert_eq!(code(&refused), "invalid_request", "{refused}");
    assert!(refused["error"]["message"].as_str().unwrap().contains("slug"), "{refused}");
    let refused = call(&client, json!({"slug": "echo", "agentId": "a", "approvalId": "x.*", "arguments": {}})).await;
    assert!(refused["error"]["message"].as_str().unwrap().contains("approvalId"), "{refused}");
    let refused = ask(
        &client,
        "capdex.v1.capabilities.upsert",
        json!({"runtimeId": "rt.1", "tools": [{"name": "t", "description": "d"}]}),
    )
    .await;
    assert_eq!(refused["code"], "bad_request", "{refused}");
    assert!(refused["message"].as_str().unwrap().contains("runtimeId"), "{refused}");
    let refused =
        ask(&client, "capdex.v1.outcome", json!({"turnId": "t1", "organizationId": "acme.eu", "status": "success"}))
            .await;
    assert!(refused["message"].as_str().unwrap_or_default().contains("organizationId"), "{refused}");
    let refused = ask(&client, "capdex.v1.sources.add", json!({"id": "a.b", "kind": "mcp", "command": "true"})).await;
    assert_eq!(refused["code"], "invalid_source", "{refused}");
    // The same ids without the forbidden characters pass.
    let fine = call(&client, json!({"slug": "echo", "agentId": "bot-1", "arguments": {"text": "hi"}})).await;
    assert_eq!(fine["success"], true, "{fine}");
}
