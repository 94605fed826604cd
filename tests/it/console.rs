//! The operator console in a real browser: Debian's Chromium driven over
//! WebDriver against a real `capdex serve` (with `[console] listen`) on a real
//! nats-server. An approval appears live and, approved with one click, runs its
//! call exactly once; a KPI changes on the page as outcomes arrive; the catalog
//! is searched; the playground shows the tiers and signals; a capability named
//! like markup renders as text. Forged changes (no CSRF token, a foreign
//! origin, a foreign Host) are refused, and a console beyond loopback needs a
//! token to start and a sign-in to use.
//!
//! With `CAPDEX_CONSOLE_SCREENSHOTS=<dir>` the browser test saves a PNG of each
//! page there (`docs/console/` holds the ones the README links).

use crate::dispatch::{ask, call, code, handler, record, register, serve};
use crate::support::nats_server::{free_port, NatsServer};
use crate::support::webdriver::Browser;
use serde_json::json;
use std::path::PathBuf;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::Arc;
use std::time::Duration;

const LIVE: Duration = Duration::from_secs(5);

/// An HTTP client for the console that follows no redirect.
fn http() -> reqwest::Client {
    capdex::tls::install_provider();
    reqwest::Client::builder().no_proxy().redirect(reqwest::redirect::Policy::none()).build().unwrap()
}

fn screenshots() -> Option<PathBuf> {
    std::env::var_os("CAPDEX_CONSOLE_SCREENSHOTS").map(PathBuf::from)
}

/// Puts a marker in the page's window: it survives live updates, not a reload.
async fn mark(browser: &Browser) {
    browser.execute("window.__consoleMarker = 42; return null;").await;
}

async fn still_marked(browser: &Browser) -> bool {
    browser.execute("return window.__consoleMarker === 42;").await == json!(true)
}

async fn outcome(client: &async_nats::Client, turn: u32, status: &str) {
    let report = json!({"turnId": format!("t{turn}"), "organizationId": "acme", "personaId": "ops", "status": status});
    let answer = ask(client, "capdex.v1.outcome", report).await;
    assert!(answer["kpi"].is_object(), "{answer}");
}

#[tokio::test]
async fn an_operator_approves_watches_searches_and_asks_in_a_real_browser() {
    let nats = NatsServer::start();
    let data = tempfile::tempdir().unwrap();
    let port = free_port();
    let listen = format!("127.0.0.1:{port}");
    let (_serving, client) = serve(&nats, data.path(), &[("CAPDEX_CONSOLE_LISTEN", &listen)]).await;
    let console = format!("http://{listen}");
    let runs = Arc::new(AtomicU64::new(0));
    handler(&client, "refund", runs.clone(), Duration::ZERO).await;
    register(
        &client,
        record(
            "refund",
            json!({"name": "Refund an order", "description": "Refunds a customer's order by its number",
                   "requiresApproval": true, "approvalTimeoutMs": 600000,
                   "processesPii": true, "redaction": {"redactKeys": ["cardNumber"]}}),
        ),
    )
    .await;
    register(
        &client,
        record("weather", json!({"name": "Weather forecast", "description": "Tells the weather of a city"})),
    )
    .await;
    register(
        &client,
        record("markup", json!({"name": "<script>window.__pwned = 1</script>", "description": "<img src=x onerror=\"window.__pwned=2\">"})),
    )
    .await;

    let browser = Browser::start().await;
    let shots = screenshots();

    // Approvals: a call that needs one appears without a reload; one click approves it.
    browser.goto(&format!("{console}/approvals")).await;
    browser.wait_for_text("#pending", LIVE, |text| text.contains("No call is waiting")).await;
    browser.wait_for("#live.on", LIVE).await;
    mark(&browser).await;
    let arguments = json!({"q": "order 1001", "cardNumber": "4111 1111 1111 1111"});
    let asked = call(&client, json!({"slug": "refund", "agentId": "agent-7", "arguments": arguments})).await;
    assert_eq!(code(&asked), "requires_approval", "{asked}");
    let id = asked["metadata"]["approvalId"].as_str().unwrap().to_string();
    let row = format!("#approval-{id}");
    browser.wait_for(&format!("{row} button.approve"), LIVE).await;
    assert!(still_marked(&browser).await, "the approval appeared without a reload");
    browser
        .wait_for_text(&row, LIVE, |t| t.contains("refund") && t.contains("agent-7") && t.contains("order 1001"))
        .await;
    // The arguments are shown redacted as provenance redacts them: the card number never reaches the page.
    let page = browser.source().await;
    assert!(page.contains("[redacted:cardNumber]") && !page.contains("4111"), "{page}");
    if let Some(dir) = &shots {
        browser.screenshot(&dir.join("approvals.png")).await;
    }
    browser.click(&format!("{row} button.approve"), LIVE).await;
    let decided = browser.wait_for_text(&format!("{row}.approved"), LIVE, |t| t.contains("approved")).await;
    assert!(decided.contains("console"), "decided by the console's operator: {decided}");
    let approved = json!({"slug": "refund", "agentId": "agent-7", "arguments": arguments, "approvalId": id});
    let ran = call(&client, approved.clone()).await;
    assert_eq!(ran["success"], true, "{ran}");
    assert_eq!(code(&call(&client, approved).await), "approval_invalid", "an approval runs one call");
    assert_eq!(runs.load(Ordering::SeqCst), 1, "the handler ran exactly once");

    // Another site's page that posts the console's approve form on load changes nothing.
    let second = call(&client, json!({"slug": "refund", "agentId": "agent-8", "arguments": {"q": "order 2002"}})).await;
    let second_id = second["metadata"]["approvalId"].as_str().unwrap().to_string();
    let attacker = attacker_page(&format!("{console}/approvals/{second_id}/approve"));
    browser.goto(&attacker).await;
    browser
        .wait_for_text("body", LIVE, |t| t.contains("the request comes from another site") || t.contains("origin"))
        .await;
    let listed = ask(&client, "capdex.v1.approval.list", json!({})).await;
    let pending: Vec<&str> = listed["approvals"].as_array().unwrap().iter().filter_map(|a| a["id"].as_str()).collect();
    assert!(pending.contains(&second_id.as_str()), "the forged approval is still pending: {listed}");

    // KPIs: the scope appears and its figures change as outcomes arrive.
    browser.goto(&format!("{console}/kpis")).await;
    browser.wait_for("#live.on", LIVE).await;
    mark(&browser).await;
    outcome(&client, 1, "success").await;
    let samples = "tr.scope[data-scope='acme/ops'] td.samples";
    browser.wait_for_text(samples, LIVE, |t| t == "1").await;
    for turn in 2..=6 {
        outcome(&client, turn, "failed").await;
    }
    browser.wait_for_text(samples, LIVE, |t| t == "6").await;
    browser.wait_for_text("tr.scope[data-scope='acme/ops'] td.success", LIVE, |t| t == "16.7%").await;
    assert!(still_marked(&browser).await, "the KPIs changed without a reload");
    if let Some(dir) = &shots {
        browser.screenshot(&dir.join("kpis.png")).await;
    }

    // Capabilities: search, and a name made of markup shows as text.
    browser.goto(&format!("{console}/capabilities")).await;
    browser
        .wait_for_text("tr[data-id='tool:markup'] span.name", LIVE, |t| t == "<script>window.__pwned = 1</script>")
        .await;
    assert_eq!(browser.execute("return window.__pwned === undefined;").await, json!(true), "no script ran");
    let search = browser.wait_for("#catalog-search", LIVE).await;
    search.type_text("weather").await;
    browser.click("#catalog-filter button", LIVE).await;
    browser.wait_for_text("#match-count", LIVE, |t| t == "1").await;
    assert!(browser.url().await.contains("q=weather"));
    assert_eq!(browser.find_all("tr.capability").await.len(), 1);
    assert!(browser.find_all("tr[data-id='tool:weather']").await.len() == 1);
    if let Some(dir) = &shots {
        browser.goto(&format!("{console}/capabilities")).await;
        browser.wait_for("tr.capability", LIVE).await;
        browser.screenshot(&dir.join("capabilities.png")).await;
    }

    // The playground: the tiers as an agent gets them, with each capability's signals.
    browser.goto(&format!("{console}/playground")).await;
    browser.wait_for("#playground-message", LIVE).await.type_text("refund the customer's order 1001").await;
    browser.click("#playground-form button", LIVE).await;
    browser.wait_for_text("tr.tier1-entry", LIVE, |t| t.contains("tool:refund")).await;
    let lexical = browser.wait_for_text("tr.tier1-entry td.lexical", LIVE, |_| true).await;
    assert!(lexical.parse::<f32>().is_ok(), "the lexical signal is shown: {lexical:?}");
    browser.wait_for_text("#total-tokens", LIVE, |t| t.ends_with("/ 3000")).await;
    if let Some(dir) = &shots {
        browser.screenshot(&dir.join("playground.png")).await;
    }

    // Sources: none configured, said so.
    browser.goto(&format!("{console}/sources")).await;
    browser.wait_for_text("main", LIVE, |t| t.contains("No live source is configured")).await;
    if let Some(dir) = &shots {
        browser.screenshot(&dir.join("sources.png")).await;
    }
}

/// Serves, on another port of 127.0.0.1 (another origin), a page whose form posts to `target` as soon as it
/// loads, with a made-up CSRF token, as a malicious site would; returns its URL.
fn attacker_page(target: &str) -> String {
    use std::io::{Read, Write};
    let listener = std::net::TcpListener::bind("127.0.0.1:0").unwrap();
    let url = format!("http://{}/", listener.local_addr().unwrap());
    let page = format!(
        "<!doctype html><html><body><form id=f method=post action=\"{target}\"><input type=hidden name=csrf value=\"{}\"></form>\
         <script>document.getElementById('f').submit()</script></body></html>",
        "0".repeat(64)
    );
    std::thread::spawn(move || {
        for stream in listener.incoming().take(4) {
            let Ok(mut stream) = stream else { continue };
            let mut request = [0u8; 4096];
            let _ = stream.read(&mut request);
            let answer = format!(
                "HTTP/1.1 200 OK\r\ncontent-type: text/html\r\ncontent-length: {}\r\nconnection: close\r\n\r\n{page}",
                page.len()
            );
            let _ = stream.write_all(answer.as_bytes());
        }
    });
    url
}

#[tokio::test]
async fn forged_changes_and_foreign_hosts_are_refused() {
    let nats = NatsServer::start();
    let data = tempfile::tempdir().unwrap();
    let listen = format!("127.0.0.1:{}", free_port());
    let (_serving, client) = serve(&nats, data.path(), &[("CAPDEX_CONSOLE_LISTEN", &listen)]).await;
    register(&client, record("wire", json!({"requiresApproval": true, "approvalTimeoutMs": 600000}))).await;
    let asked = call(&client, json!({"slug": "wire", "agentId": "a", "arguments": {"q": "x"}})).await;
    let id = asked["metadata"]["approvalId"].as_str().unwrap().to_string();
    let http = http();
    let approve = format!("http://{listen}/approvals/{id}/approve");

    let page = http.get(format!("http://{listen}/approvals")).send().await.unwrap();
    assert_eq!(page.status(), 200);
    let csp = page.headers()["content-security-policy"].to_str().unwrap().to_string();
    assert!(csp.contains("script-src 'self'") && csp.contains("frame-ancestors 'none'"), "{csp}");
    let html = page.text().await.unwrap();
    let token = html.split("name=\"csrf-token\" content=\"").nth(1).unwrap().split('"').next().unwrap().to_string();

    let no_token = http
        .post(&approve)
        .header("Content-Type", "application/x-www-form-urlencoded")
        .body(format!("csrf={}", ""))
        .send()
        .await
        .unwrap();
    assert_eq!(no_token.status(), 403);
    let wrong = http
        .post(&approve)
        .header("Content-Type", "application/x-www-form-urlencoded")
        .body(format!("csrf={}", "0".repeat(64).as_str()))
        .send()
        .await
        .unwrap();
    assert_eq!(wrong.status(), 403);
    let foreign = http
        .post(&approve)
        .header("Origin", "http://evil.example")
        .header("Content-Type", "application/x-www-form-urlencoded")
        .body(format!("csrf={}", token.as_str()))
        .send()
        .await
        .unwrap();
    assert_eq!(foreign.status(), 403);
    let cross = http
        .post(&approve)
        .header("Sec-Fetch-Site", "cross-site")
        .header("Content-Type", "application/x-www-form-urlencoded")
        .body(format!("csrf={}", token.as_str()))
        .send()
        .await
        .unwrap();
    assert_eq!(cross.status(), 403);
    let rebound =
        http.get(format!("http://{listen}/approvals")).header("Host", "attacker.example").send().await.unwrap();
    assert_eq!(rebound.status(), 421, "a DNS-rebound name is refused");
    let listed = ask(&client, "capdex.v1.approval.list", json!({})).await;
    assert_eq!(listed["approvals"][0]["status"], "pending", "no forged change went through: {listed}");

    let genuine = http
        .post(&approve)
        .header("Origin", format!("http://{listen}"))
        .header("Content-Type", "application/x-www-form-urlencoded")
        .body(format!("csrf={}", token.as_str()))
        .send()
        .await
        .unwrap();
    assert_eq!(genuine.status(), 303);
    let listed = ask(&client, "capdex.v1.approval.list", json!({"all": true})).await;
    assert_eq!(listed["approvals"][0]["status"], "approved", "{listed}");
    let again = http
        .post(&approve)
        .header("Content-Type", "application/x-www-form-urlencoded")
        .body(format!("csrf={}", token.as_str()))
        .send()
        .await
        .unwrap();
    assert_eq!(again.status(), 409, "an approval is decided once");
}

#[tokio::test]
async fn a_console_beyond_loopback_needs_a_token_and_a_sign_in() {
    let nats = NatsServer::start();
    let data = tempfile::tempdir().unwrap();
    let refused = crate::cli::capdex()
        .arg("serve")
        .env("CAPDEX_NATS_URL", nats.url())
        .env("CAPDEX_DATA_DIR", data.path())
        .env("CAPDEX_CONSOLE_LISTEN", format!("0.0.0.0:{}", free_port()))
        .output()
        .unwrap();
    assert!(!refused.status.success());
    let stderr = String::from_utf8_lossy(&refused.stderr);
    assert!(stderr.contains("console.listen") && stderr.contains("console.token"), "{stderr}");

    let listen = format!("127.0.0.1:{}", free_port());
    let token = "console-token-0123456789";
    let (_serving, _client) = serve(
        &nats,
        data.path(),
        &[
            ("CAPDEX_CONSOLE_LISTEN", &listen),
            ("CAPDEX_CONSOLE_TOKEN", "${env:OPS_CONSOLE_TOKEN}"),
            ("OPS_CONSOLE_TOKEN", token),
        ],
    )
    .await;
    let http = http();
    let page = http.get(format!("http://{listen}/kpis")).send().await.unwrap();
    assert_eq!((page.status().as_u16(), page.headers()["location"].to_str().unwrap()), (303, "/login"));
    let events = http.get(format!("http://{listen}/events")).send().await.unwrap();
    assert_eq!(events.status(), 401);
    let wrong = http
        .post(format!("http://{listen}/login"))
        .header("Content-Type", "application/x-www-form-urlencoded")
        .body(format!("token={}", "not-the-token-at-all"))
        .send()
        .await
        .unwrap();
    assert_eq!(wrong.status(), 401);
    assert!(wrong.headers().get("set-cookie").is_none());
    let signed = http
        .post(format!("http://{listen}/login"))
        .header("Content-Type", "application/x-www-form-urlencoded")
        .body(format!("token={}", token))
        .send()
        .await
        .unwrap();
    assert_eq!(signed.status(), 303);
    let cookie = signed.headers()["set-cookie"].to_str().unwrap().to_string();
    assert!(cookie.contains("HttpOnly") && cookie.contains("SameSite=Strict"), "{cookie}");
    let session = cookie.split(';').next().unwrap().to_string();
    let page = http.get(format!("http://{listen}/kpis")).header("Cookie", &session).send().await.unwrap();
    assert_eq!(page.status(), 200);
    let html = page.text().await.unwrap();
    assert!(html.contains("KPIs and alerts") && !html.contains(token), "the token is never rendered");
}
