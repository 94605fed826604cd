//! The operator console: web pages served by `capdex serve` with actix-web
//! when `[console] listen` is set (docs/console.md).
//!
//! A thin shell: each handler checks the session (and, for a change, the
//! CSRF guard of `core::console::guard`), asks capdex through the same `Api`
//! the NATS service and the MCP face call (over the `Send` [`Bridge`], so a
//! decision takes the same path and checks as `capdex.v1.approval.<id>.approve`),
//! and sends the page `core::console::pages` rendered. Live updates: the
//! gateway follows the NATS events ops subscribe to and puts them on a
//! broadcast channel; `/events` streams them to browsers as server-sent
//! events, and `console.js` fetches the page's content again when one of its
//! topics arrives.

use crate::config::ConsoleSettings;
use crate::core::console::guard::{self, ChangeRequest, Sessions, LOCAL_SESSION, SESSION_COOKIE};
use crate::core::console::html::{document, Nav};
use crate::core::console::model::FeedEvent;
use crate::core::console::pages::{self, ApprovalRow, Budgets, CatalogQuery, Signals, SourceRow};
use crate::gateway::wire::{ApiError, DiscoverRequest, DispatchAdmin, SourcesRequest};
use crate::mcp::bridge::Bridge;
use actix_web::http::header::{self, HeaderValue};
use actix_web::http::StatusCode;
use actix_web::{web, App, HttpRequest, HttpResponse, HttpServer};
use std::net::SocketAddr;
use std::sync::Mutex;
use std::time::Duration;

const CONSOLE_CSS: &str = include_str!("../../assets/console/console.css");
const CONSOLE_JS: &str = include_str!("../../assets/console/console.js");

/// The header `console.js` sends when it fetches a page's content alone.
const FRAGMENT_HEADER: &str = "x-console-fragment";

/// The most bytes of a form the console reads.
const MAX_FORM_BYTES: usize = 16 * 1024;

/// Why the console could not start.
#[derive(Debug, thiserror::Error)]
pub enum ConsoleError {
    #[error("failed to listen for the console on {addr}: {source}")]
    Bind { addr: SocketAddr, source: std::io::Error },
    #[error("cannot draw the console's secret from the system's random source: {0}")]
    Random(std::io::Error),
}

/// What every handler shares.
struct Shared {
    bridge: Bridge,
    /// The CSRF tokens' key, drawn at start.
    secret: [u8; 32],
    token: Option<crate::config::Secret>,
    sessions: Mutex<Sessions>,
    feed: tokio::sync::broadcast::Sender<FeedEvent>,
    budgets: Budgets,
    operator: String,
}

/// A running console; [`RunningConsole::stop`] ends it.
pub struct RunningConsole {
    addr: SocketAddr,
    handle: actix_web::dev::ServerHandle,
    task: tokio::task::JoinHandle<std::io::Result<()>>,
}

impl RunningConsole {
    /// The address bound (with the port chosen for port 0).
    pub fn local_addr(&self) -> SocketAddr {
        self.addr
    }

    /// Stops accepting, lets requests in flight finish (at most 2 s), and waits.
    pub async fn stop(self) {
        self.handle.stop(true).await;
        let _ = self.task.await;
    }
}

/// Binds `addr` and serves the console on a worker thread of its own.
pub fn start(
    settings: &ConsoleSettings,
    addr: SocketAddr,
    bridge: Bridge,
    feed: tokio::sync::broadcast::Sender<FeedEvent>,
    budgets: Budgets,
) -> Result<RunningConsole, ConsoleError> {
    let shared = web::Data::new(Shared {
        bridge,
        secret: random_bytes().map_err(ConsoleError::Random)?,
        token: settings.token.clone(),
        sessions: Mutex::new(Sessions::default()),
        feed,
        budgets,
        operator: settings.operator.clone(),
    });
    let server = HttpServer::new(move || {
        App::new()
            .app_data(shared.clone())
            .app_data(web::FormConfig::default().limit(MAX_FORM_BYTES))
            .wrap(
                actix_web::middleware::DefaultHeaders::new()
                    .add((
                        header::CONTENT_SECURITY_POLICY,
                        "default-src 'none'; script-src 'self'; style-src 'self'; img-src 'self' data:; connect-src 'self'; form-action 'self'; frame-ancestors 'none'; base-uri 'none'",
                    ))
                    .add((header::X_FRAME_OPTIONS, "DENY"))
                    .add((header::X_CONTENT_TYPE_OPTIONS, "nosniff"))
                    // `no-referrer` would make browsers send `Origin: null` with the console's own forms.
                    .add((header::REFERRER_POLICY, "same-origin"))
                    .add((header::CACHE_CONTROL, "no-store")),
            )
            .route("/", web::get().to(|| async { see_other("/approvals") }))
            .route("/static/console.css", web::get().to(|| async { asset("text/css; charset=utf-8", CONSOLE_CSS) }))
            .route("/static/console.js", web::get().to(|| async { asset("text/javascript; charset=utf-8", CONSOLE_JS) }))
            .route("/login", web::get().to(sign_in_page))
            .route("/login", web::post().to(sign_in))
            .route("/logout", web::post().to(sign_out))
            .route("/approvals", web::get().to(approvals_page))
            .route("/approvals/{id}/{action}", web::post().to(decide))
            .route("/kpis", web::get().to(kpis_page))
            .route("/capabilities", web::get().to(capabilities_page))
            .route("/capabilities/{id}", web::get().to(capability_page))
            .route("/sources", web::get().to(sources_page))
            .route("/playground", web::get().to(playground_page))
            .route("/events", web::get().to(events))
            .default_service(web::to(|| async { plain(StatusCode::NOT_FOUND, "not found") }))
    })
    .workers(1)
    .disable_signals()
    .shutdown_timeout(2)
    .bind(addr)
    .map_err(|source| ConsoleError::Bind { addr, source })?;
    let bound = server.addrs().first().copied().unwrap_or(addr);
    let server = server.run();
    let handle = server.handle();
    tracing::info!(addr = %bound, "serving the operator console");
    Ok(RunningConsole { addr: bound, handle, task: tokio::task::spawn_local(server) })
}

/// 32 bytes from the system's random source.
fn random_bytes() -> std::io::Result<[u8; 32]> {
    use std::io::Read as _;
    let mut bytes = [0u8; 32];
    std::fs::File::open("/dev/urandom")?.read_exact(&mut bytes)?;
    Ok(bytes)
}

fn hex(bytes: &[u8]) -> String {
    bytes.iter().map(|b| format!("{b:02x}")).collect()
}

fn now_ms() -> u64 {
    crate::clock::epoch_ms()
}

fn see_other(location: &str) -> HttpResponse {
    HttpResponse::SeeOther().insert_header((header::LOCATION, location)).finish()
}

fn plain(status: StatusCode, text: &str) -> HttpResponse {
    HttpResponse::build(status).content_type("text/plain; charset=utf-8").body(text.to_string())
}

fn asset(content_type: &'static str, body: &'static str) -> HttpResponse {
    HttpResponse::Ok().content_type(content_type).body(body)
}

/// The request's header `name`, when it is text.
fn header_text<'a>(request: &'a HttpRequest, name: &str) -> Option<&'a str> {
    request.headers().get(name).and_then(|value| value.to_str().ok())
}

/// True when `host` (a `Host` header) names this machine: without a token the
/// console answers only those, so a DNS-rebound name cannot reach it.
fn loopback_host(host: &str) -> bool {
    let name = match host.strip_prefix('[') {
        Some(rest) => rest.split(']').next().unwrap_or(""),
        None => host.rsplit_once(':').map_or(host, |(name, _)| name),
    };
    name.eq_ignore_ascii_case("localhost") || name.parse::<std::net::IpAddr>().is_ok_and(|ip| ip.is_loopback())
}

/// The request's session, or the answer that refuses it: a sign-in page (for
/// a page) or 401 (for anything else) when the console asks for a token and
/// the request has no live session; 421 for a foreign `Host` without a token.
fn session(request: &HttpRequest, shared: &Shared, page: bool) -> Result<String, Box<HttpResponse>> {
    if shared.token.is_none() {
        return match header_text(request, "host") {
            Some(host) if loopback_host(host) => Ok(LOCAL_SESSION.to_string()),
            _ => Err(Box::new(plain(StatusCode::MISDIRECTED_REQUEST, "this console answers loopback names only"))),
        };
    }
    let id = header_text(request, "cookie").and_then(|cookie| guard::cookie(cookie, SESSION_COOKIE));
    let live = id.is_some_and(|id| shared.sessions.lock().is_ok_and(|sessions| sessions.is_live(id, now_ms())));
    match id {
        Some(id) if live => Ok(id.to_string()),
        _ if page => Err(Box::new(see_other("/login"))),
        _ => Err(Box::new(plain(StatusCode::UNAUTHORIZED, "sign in first"))),
    }
}

/// Checks a change of `session` against forgery; `token` is the form's `csrf` field.
fn check_change(
    request: &HttpRequest,
    shared: &Shared,
    session: &str,
    token: Option<&str>,
) -> Result<(), Box<HttpResponse>> {
    let token = token.or_else(|| header_text(request, "x-csrf-token"));
    let change = ChangeRequest {
        token,
        origin: header_text(request, "origin"),
        host: header_text(request, "host"),
        fetch_site: header_text(request, "sec-fetch-site"),
    };
    guard::check_change(&shared.secret, session, &change).map_err(|refusal| {
        tracing::warn!(%refusal, "the console refused a change");
        Box::new(plain(StatusCode::FORBIDDEN, &refusal.to_string()))
    })
}

/// A page: the whole document, or its content alone when `console.js` asks for it.
fn page(request: &HttpRequest, shared: &Shared, session: &str, nav: Nav, content: String) -> HttpResponse {
    let body = if request.headers().contains_key(FRAGMENT_HEADER) {
        content
    } else {
        document(nav, &guard::csrf_token(&shared.secret, session), &content)
    };
    HttpResponse::Ok().content_type("text/html; charset=utf-8").body(body)
}

/// An error capdex answered, as `code: message`.
fn describe(error: &ApiError) -> String {
    format!("{}: {}", error.kind.status_and_code().1, error.message)
}

/// The page for an error capdex answered.
fn failed(request: &HttpRequest, shared: &Shared, session: &str, nav: Nav, error: &ApiError) -> HttpResponse {
    let mut html = crate::core::console::html::Html::default();
    html.element("h1", "", nav.title()).element("p", "error", &describe(error));
    let mut response = page(request, shared, session, nav, html.finish());
    *response.status_mut() = StatusCode::SERVICE_UNAVAILABLE;
    response
}

macro_rules! session_or_return {
    ($request:expr, $shared:expr, $page:expr) => {
        match session($request, $shared, $page) {
            Ok(session) => session,
            Err(response) => return *response,
        }
    };
}

async fn sign_in_page(shared: web::Data<Shared>) -> HttpResponse {
    if shared.token.is_none() {
        return see_other("/approvals");
    }
    HttpResponse::Ok().content_type("text/html; charset=utf-8").body(pages::sign_in(None))
}

#[derive(serde::Deserialize)]
struct SignInForm {
    #[serde(default)]
    token: String,
}

async fn sign_in(request: HttpRequest, shared: web::Data<Shared>, form: web::Form<SignInForm>) -> HttpResponse {
    let Some(expected) = &shared.token else { return see_other("/approvals") };
    // The sign-in form is a change too: only from this console's own pages.
    let change = ChangeRequest {
        token: None,
        origin: header_text(&request, "origin"),
        host: header_text(&request, "host"),
        fetch_site: header_text(&request, "sec-fetch-site"),
    };
    let cross_site = guard::check_origin(&change).is_err();
    if cross_site || !guard::same_secret(&form.token, expected.expose()) {
        // A wrong token costs the guesser time.
        tokio::time::sleep(Duration::from_millis(300)).await;
        let mut response = HttpResponse::Ok()
            .content_type("text/html; charset=utf-8")
            .body(pages::sign_in(Some("That token is not the console's.")));
        *response.status_mut() = StatusCode::UNAUTHORIZED;
        return response;
    }
    let id = match random_bytes() {
        Ok(bytes) => hex(&bytes),
        Err(err) => return plain(StatusCode::INTERNAL_SERVER_ERROR, &format!("cannot start a session: {err}")),
    };
    if let Ok(mut sessions) = shared.sessions.lock() {
        sessions.start(id.clone(), now_ms());
    }
    let cookie =
        format!("{SESSION_COOKIE}={id}; Path=/; HttpOnly; SameSite=Strict; Max-Age={}", guard::SESSION_TTL_MS / 1000);
    let mut response = see_other("/approvals");
    if let Ok(value) = HeaderValue::from_str(&cookie) {
        response.headers_mut().insert(header::SET_COOKIE, value);
    }
    response
}

#[derive(serde::Deserialize)]
struct ChangeForm {
    #[serde(default)]
    csrf: String,
}

async fn sign_out(request: HttpRequest, shared: web::Data<Shared>, form: web::Form<ChangeForm>) -> HttpResponse {
    let session = session_or_return!(&request, &shared, true);
    if let Err(refused) = check_change(&request, &shared, &session, Some(&form.csrf)) {
        return *refused;
    }
    if let Ok(mut sessions) = shared.sessions.lock() {
        sessions.end(&session);
    }
    let mut response = see_other("/login");
    if let Ok(value) =
        HeaderValue::from_str(&format!("{SESSION_COOKIE}=; Path=/; HttpOnly; SameSite=Strict; Max-Age=0"))
    {
        response.headers_mut().insert(header::SET_COOKIE, value);
    }
    response
}

/// Every approval, as `approval.list` with `all` gives them.
async fn approval_rows(shared: &Shared) -> Result<Vec<ApprovalRow>, ApiError> {
    let answer = shared
        .bridge
        .call(|api| api.dispatch_admin(DispatchAdmin::ListApprovals(serde_json::json!({"all": true}))))
        .await?;
    let rows = answer.get("approvals").cloned().unwrap_or_default();
    serde_json::from_value(rows).map_err(|err| ApiError::internal(format!("approval.list answered {err}")))
}

async fn approvals_page(request: HttpRequest, shared: web::Data<Shared>) -> HttpResponse {
    let session = session_or_return!(&request, &shared, true);
    match approval_rows(&shared).await {
        Ok(rows) => {
            let csrf = guard::csrf_token(&shared.secret, &session);
            page(&request, &shared, &session, Nav::Approvals, pages::approvals(&rows, now_ms(), &csrf))
        }
        Err(err) => failed(&request, &shared, &session, Nav::Approvals, &err),
    }
}

async fn decide(
    request: HttpRequest,
    shared: web::Data<Shared>,
    path: web::Path<(String, String)>,
    form: web::Form<ChangeForm>,
) -> HttpResponse {
    let session = session_or_return!(&request, &shared, true);
    if let Err(refused) = check_change(&request, &shared, &session, Some(&form.csrf)) {
        return *refused;
    }
    let (id, action) = path.into_inner();
    let approve = match action.as_str() {
        "approve" => true,
        "reject" => false,
        _ => return plain(StatusCode::NOT_FOUND, "not found"),
    };
    let by = shared.operator.clone();
    let decision = DispatchAdmin::Decide { id: id.clone(), approve, by };
    match shared.bridge.call(move |api| api.dispatch_admin(decision)).await {
        Ok(_) => {
            tracing::info!(approval = %id, approve, operator = %shared.operator, "decided in the console");
            see_other("/approvals")
        }
        Err(err) => {
            let mut response = failed(&request, &shared, &session, Nav::Approvals, &err);
            *response.status_mut() = StatusCode::CONFLICT;
            response
        }
    }
}

async fn kpis_page(request: HttpRequest, shared: web::Data<Shared>) -> HttpResponse {
    let session = session_or_return!(&request, &shared, true);
    match shared.bridge.call(|api| api.kpi_overview()).await {
        Ok(overview) => page(&request, &shared, &session, Nav::Kpis, pages::kpis(&overview)),
        Err(err) => failed(&request, &shared, &session, Nav::Kpis, &err),
    }
}

async fn capabilities_page(
    request: HttpRequest,
    shared: web::Data<Shared>,
    query: web::Query<CatalogQuery>,
) -> HttpResponse {
    let session = session_or_return!(&request, &shared, true);
    match shared.bridge.call(|api| api.catalog_overview()).await {
        Ok(overview) => page(&request, &shared, &session, Nav::Capabilities, pages::capabilities(&overview, &query)),
        Err(err) => failed(&request, &shared, &session, Nav::Capabilities, &err),
    }
}

async fn capability_page(request: HttpRequest, shared: web::Data<Shared>, id: web::Path<String>) -> HttpResponse {
    let session = session_or_return!(&request, &shared, true);
    match shared.bridge.call(|api| api.catalog_overview()).await {
        Ok(overview) => match pages::capability(&overview, &id) {
            Some(content) => page(&request, &shared, &session, Nav::Capabilities, content),
            None => {
                let mut html = crate::core::console::html::Html::default();
                html.element("h1", "", "Unknown capability").element(
                    "p",
                    "error",
                    &format!("No capability has the id {:?}.", id.as_str()),
                );
                let mut response = page(&request, &shared, &session, Nav::Capabilities, html.finish());
                *response.status_mut() = StatusCode::NOT_FOUND;
                response
            }
        },
        Err(err) => failed(&request, &shared, &session, Nav::Capabilities, &err),
    }
}

async fn sources_page(request: HttpRequest, shared: web::Data<Shared>) -> HttpResponse {
    let session = session_or_return!(&request, &shared, true);
    let answer = shared.bridge.call(|api| api.sources(SourcesRequest::List)).await;
    let rows = answer.and_then(|answer| {
        let list = answer.get("sources").cloned().unwrap_or_default();
        serde_json::from_value::<Vec<SourceRow>>(list)
            .map_err(|err| ApiError::internal(format!("sources.list answered {err}")))
    });
    match rows {
        Ok(rows) => page(&request, &shared, &session, Nav::Sources, pages::sources(&rows, now_ms())),
        Err(err) if err.kind == crate::gateway::errors::ErrorKind::NotImplemented => {
            page(&request, &shared, &session, Nav::Sources, pages::sources(&[], now_ms()))
        }
        Err(err) => failed(&request, &shared, &session, Nav::Sources, &err),
    }
}

#[derive(serde::Deserialize)]
struct PlaygroundQuery {
    #[serde(default)]
    message: String,
}

/// The longest message the playground sends.
const MAX_PLAYGROUND_MESSAGE: usize = 4_096;

async fn playground_page(
    request: HttpRequest,
    shared: web::Data<Shared>,
    query: web::Query<PlaygroundQuery>,
) -> HttpResponse {
    let session = session_or_return!(&request, &shared, true);
    let message = query.message.trim();
    let content = if message.is_empty() {
        pages::playground("", None, shared.budgets)
    } else if message.len() > MAX_PLAYGROUND_MESSAGE {
        pages::playground(message, Some(Err("the message is longer than 4,096 bytes")), shared.budgets)
    } else {
        let discover = DiscoverRequest { message: message.to_string(), explain: true, ..Default::default() };
        match shared.bridge.call(move |api| api.discover(discover)).await {
            Ok(result) => {
                let signals: Vec<Signals> = result
                    .explanations
                    .iter()
                    .map(|e| Signals {
                        id: e.id.clone(),
                        lexical: e.lexical,
                        dense: e.dense,
                        graph: e.graph,
                        prior: e.prior,
                    })
                    .collect();
                pages::playground(message, Some(Ok((&result, &signals))), shared.budgets)
            }
            Err(err) => pages::playground(message, Some(Err(&describe(&err))), shared.budgets),
        }
    };
    page(&request, &shared, &session, Nav::Playground, content)
}

/// Server-sent events: one per console event (`event: <topic>`, `data: <subject>`), a comment every 15 s.
async fn events(request: HttpRequest, shared: web::Data<Shared>) -> HttpResponse {
    if let Err(refused) = session(&request, &shared, false) {
        return *refused;
    }
    let receiver = shared.feed.subscribe();
    let stream = futures::stream::unfold((receiver, true), |(mut receiver, first)| async move {
        if first {
            return Some((
                Ok::<_, actix_web::Error>(web::Bytes::from_static(b"retry: 1000\n: connected\n\n")),
                (receiver, false),
            ));
        }
        let frame = match tokio::time::timeout(Duration::from_secs(15), receiver.recv()).await {
            Ok(Ok(event)) => format!("event: {}\ndata: {}\n\n", event.topic, event.subject),
            Ok(Err(tokio::sync::broadcast::error::RecvError::Lagged(_))) => "event: lagged\ndata: \n\n".to_string(),
            Ok(Err(tokio::sync::broadcast::error::RecvError::Closed)) => return None,
            Err(_) => ": keep-alive\n\n".to_string(),
        };
        Some((Ok(web::Bytes::from(frame)), (receiver, false)))
    });
    HttpResponse::Ok()
        .content_type("text/event-stream")
        .insert_header((header::CACHE_CONTROL, "no-store"))
        .insert_header(("x-accel-buffering", "no"))
        .streaming(stream)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn only_loopback_hosts_pass_without_a_token() {
        for host in ["127.0.0.1:7700", "localhost:7700", "LOCALHOST", "[::1]:7700", "127.9.9.9"] {
            assert!(loopback_host(host), "{host}");
        }
        for host in ["example.com", "10.0.0.1:7700", "[2001:db8::1]:80", "127.0.0.1.nip.io:7700", ""] {
            assert!(!loopback_host(host), "{host}");
        }
    }
}
