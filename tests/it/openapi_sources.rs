//! `upstream::openapi` and `upstream::http` against an HTTP server written
//! here on 127.0.0.1 that records what it receives: a document fetched with
//! its ETag (then `304`), files only under the allowed roots, operations
//! called with path, query, header, body and auth as `core::sources::request`
//! builds them, on one reused connection, and the SSRF guard, size caps,
//! error statuses and timeouts.

use capdex::core::dispatch::ssrf::Cidr;
use capdex::core::sources::request::build_request;
use capdex::core::sources::settings::ResolvedAuth;
use capdex::core::sources::{HttpOperation, OperationParam, ParamLocation};
use capdex::upstream::http::HttpExecutor;
use capdex::upstream::openapi::{read_file_under_roots, resolve_under_roots, DocumentFetcher, Fetched};
use capdex::upstream::UpstreamErrorKind;
use serde_json::{json, Value};
use std::io::{BufRead, BufReader, Read, Write};
use std::net::TcpListener;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::{Arc, Mutex};
use std::time::Duration;

const DOCUMENT: &str = r#"{"openapi": "3.0.3", "info": {"title": "pets", "version": "1"}, "paths": {}}"#;

/// One request as the server read it.
#[derive(Clone, Debug)]
struct Seen {
    method: String,
    target: String,
    headers: Vec<(String, String)>,
    body: Vec<u8>,
}

impl Seen {
    fn header(&self, name: &str) -> Option<&str> {
        self.headers.iter().find(|(n, _)| n.eq_ignore_ascii_case(name)).map(|(_, v)| v.as_str())
    }
}

struct TestServer {
    base: String,
    seen: Arc<Mutex<Vec<Seen>>>,
    connections: Arc<AtomicUsize>,
}

impl TestServer {
    /// Serves on a free 127.0.0.1 port (HTTP/1.1, keep-alive) until the test ends.
    fn start() -> TestServer {
        let listener = TcpListener::bind("127.0.0.1:0").unwrap();
        let base = format!("http://{}", listener.local_addr().unwrap());
        let seen: Arc<Mutex<Vec<Seen>>> = Arc::default();
        let connections: Arc<AtomicUsize> = Arc::default();
        let (log, count) = (seen.clone(), connections.clone());
        std::thread::spawn(move || {
            for stream in listener.incoming() {
                let Ok(stream) = stream else { continue };
                count.fetch_add(1, Ordering::SeqCst);
                let log = log.clone();
                std::thread::spawn(move || {
                    let mut reader = BufReader::new(stream.try_clone().unwrap());
                    let mut writer = stream;
                    while let Some(request) = read_request(&mut reader) {
                        log.lock().unwrap().push(request.clone());
                        let (status, headers, body) = answer(&request);
                        let mut head = format!("HTTP/1.1 {status}\r\ncontent-length: {}\r\n", body.len());
                        for (name, value) in headers {
                            head.push_str(&format!("{name}: {value}\r\n"));
                        }
                        head.push_str("\r\n");
                        if writer.write_all(head.as_bytes()).and_then(|_| writer.write_all(&body)).is_err() {
                            return;
                        }
                    }
                });
            }
        });
        TestServer { base, seen, connections }
    }

    fn last(&self) -> Seen {
        self.seen.lock().unwrap().last().cloned().expect("a request arrived")
    }
}

fn read_request(reader: &mut BufReader<std::net::TcpStream>) -> Option<Seen> {
    let mut line = String::new();
    if reader.read_line(&mut line).ok()? == 0 {
        return None;
    }
    let mut parts = line.split_whitespace();
    let (method, target) = (parts.next()?.to_string(), parts.next()?.to_string());
    let mut headers = Vec::new();
    loop {
        let mut header = String::new();
        reader.read_line(&mut header).ok()?;
        let header = header.trim_end();
        if header.is_empty() {
            break;
        }
        let (name, value) = header.split_once(':')?;
        headers.push((name.trim().to_string(), value.trim().to_string()));
    }
    let length: usize = headers
        .iter()
        .find(|(n, _)| n.eq_ignore_ascii_case("content-length"))
        .and_then(|(_, v)| v.parse().ok())
        .unwrap_or(0);
    let mut body = vec![0; length];
    reader.read_exact(&mut body).ok()?;
    Some(Seen { method, target, headers, body })
}

/// The routes: the document (ETag `"v1"`), a redirect to the metadata
/// address, pets, a text answer, an error, a large body and a slow answer.
fn answer(request: &Seen) -> (&'static str, Vec<(&'static str, String)>, Vec<u8>) {
    let json_type = ("content-type", "application/json".to_string());
    let path = request.target.split('?').next().unwrap_or_default();
    match (request.method.as_str(), path) {
        ("GET", "/openapi.json") if request.header("if-none-match") == Some("\"v1\"") => {
            ("304 Not Modified", vec![("etag", "\"v1\"".into())], Vec::new())
        }
        ("GET", "/openapi.json") => {
            ("200 OK", vec![json_type, ("etag", "\"v1\"".into())], DOCUMENT.as_bytes().to_vec())
        }
        ("GET", "/moved") => {
            ("302 Found", vec![("location", "http://169.254.169.254/latest/meta-data".into())], Vec::new())
        }
        ("GET", "/huge.json") => ("200 OK", vec![json_type], vec![b' '; 200_000]),
        ("GET", "/v1/text") => ("200 OK", vec![("content-type", "text/plain".into())], b"plain words".to_vec()),
        ("GET", "/v1/fail") => {
            ("500 Internal Server Error", vec![json_type], br#"{"error":"the database is down"}"#.to_vec())
        }
        ("GET", "/v1/slow") => {
            std::thread::sleep(Duration::from_secs(3));
            ("200 OK", vec![json_type], b"{}".to_vec())
        }
        (method, _) => {
            let body: Value = serde_json::from_slice(&request.body).unwrap_or(Value::Null);
            let echo = json!({"method": method, "target": request.target, "body": body});
            ("200 OK", vec![json_type], echo.to_string().into_bytes())
        }
    }
}

fn loopback() -> Vec<Cidr> {
    vec![Cidr::parse("127.0.0.1/32").unwrap()]
}

fn operation(
    server: &TestServer,
    method: &str,
    path: &str,
    params: Vec<OperationParam>,
    json_body: bool,
) -> HttpOperation {
    HttpOperation {
        method: method.into(),
        base_url: format!("{}/v1/", server.base),
        path: path.into(),
        params,
        json_body,
    }
}

fn param(name: &str, location: ParamLocation, required: bool) -> OperationParam {
    OperationParam { name: name.into(), location, required }
}

const TIMEOUT: Duration = Duration::from_secs(10);

/// Lets hyper put a finished connection back in its pool (it does so just
/// after the body is read), so the next call can find it there.
async fn settle() {
    tokio::time::sleep(Duration::from_millis(100)).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_document_is_fetched_then_not_modified() {
    let server = TestServer::start();
    let fetcher = DocumentFetcher::new(loopback(), 64 * 1024).unwrap();
    let url = format!("{}/openapi.json", server.base);
    let Fetched::Document { text, etag } = fetcher.fetch(&url, None, TIMEOUT).await.unwrap() else {
        panic!("expected the document")
    };
    assert_eq!(text, DOCUMENT);
    assert_eq!(etag.as_deref(), Some("\"v1\""));
    assert_eq!(server.last().header("if-none-match"), None);

    assert_eq!(fetcher.fetch(&url, etag.as_deref(), TIMEOUT).await.unwrap(), Fetched::NotModified);
    assert_eq!(server.last().header("if-none-match"), Some("\"v1\""));

    // A host name goes through the guarded resolver, and connects when its addresses are allowed.
    let by_name =
        DocumentFetcher::new(vec![Cidr::parse("127.0.0.0/8").unwrap(), Cidr::parse("::1/128").unwrap()], 64 * 1024)
            .unwrap();
    let port = server.base.rsplit(':').next().unwrap();
    let fetched = by_name.fetch(&format!("http://localhost:{port}/openapi.json"), None, TIMEOUT).await.unwrap();
    assert!(matches!(fetched, Fetched::Document { .. }), "{fetched:?}");

    let too_small = DocumentFetcher::new(loopback(), 100_000).unwrap();
    let err = too_small.fetch(&format!("{}/huge.json", server.base), None, TIMEOUT).await.unwrap_err();
    assert_eq!(err.kind, UpstreamErrorKind::TooLarge, "{err}");
    let err = fetcher.fetch(&format!("{}/v1/fail", server.base), None, TIMEOUT).await.unwrap_err();
    assert_eq!(err.kind, UpstreamErrorKind::HttpStatus, "{err}");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn fetching_refuses_private_targets_and_redirects_to_them() {
    let server = TestServer::start();
    let unguarded = DocumentFetcher::new(Vec::new(), 64 * 1024).unwrap();
    let err = unguarded.fetch(&format!("{}/openapi.json", server.base), None, TIMEOUT).await.unwrap_err();
    assert_eq!(err.kind, UpstreamErrorKind::TargetRefused, "{err}");
    let err = unguarded.fetch("http://localhost:1/openapi.json", None, TIMEOUT).await.unwrap_err();
    assert_eq!(err.kind, UpstreamErrorKind::TargetRefused, "a name resolving to loopback: {err}");
    let err = unguarded.fetch("file:///etc/passwd", None, TIMEOUT).await.unwrap_err();
    assert_eq!(err.kind, UpstreamErrorKind::InvalidTarget, "{err}");

    let fetcher = DocumentFetcher::new(loopback(), 64 * 1024).unwrap();
    let before = server.seen.lock().unwrap().len();
    let err = fetcher.fetch(&format!("{}/moved", server.base), None, TIMEOUT).await.unwrap_err();
    assert!(err.message.contains("169.254.169.254") || err.kind == UpstreamErrorKind::TargetRefused, "{err:?}");
    assert_eq!(server.seen.lock().unwrap().len(), before + 1, "only the redirecting request was sent");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_document_file_must_lie_under_an_allowed_root() {
    let root = tempfile::tempdir().unwrap();
    let outside = tempfile::tempdir().unwrap();
    std::fs::create_dir(root.path().join("specs")).unwrap();
    std::fs::write(root.path().join("specs/pets.yaml"), "openapi: 3.0.3\n").unwrap();
    std::fs::write(outside.path().join("secret.yaml"), "secret: 1\n").unwrap();
    std::os::unix::fs::symlink(outside.path().join("secret.yaml"), root.path().join("specs/link.yaml")).unwrap();
    std::fs::write(root.path().join("big.json"), vec![b' '; 5000]).unwrap();
    let roots = vec![outside.path().join("missing-root"), root.path().to_path_buf()];

    assert_eq!(read_file_under_roots("specs/pets.yaml", &roots, 4096).await.unwrap(), "openapi: 3.0.3\n");
    assert_eq!(read_file_under_roots("specs/../specs/pets.yaml", &roots, 4096).await.unwrap(), "openapi: 3.0.3\n");
    for (path, kind) in [
        ("specs/link.yaml", UpstreamErrorKind::File),
        ("../secret.yaml", UpstreamErrorKind::File),
        ("/etc/passwd", UpstreamErrorKind::File),
        ("specs/none.yaml", UpstreamErrorKind::File),
        ("specs", UpstreamErrorKind::File),
        ("big.json", UpstreamErrorKind::TooLarge),
    ] {
        let err = read_file_under_roots(path, &roots, 4096).await.unwrap_err();
        assert_eq!(err.kind, kind, "{path}: {err}");
    }
    assert!(read_file_under_roots("specs/pets.yaml", &[], 4096).await.is_err());
    let specs = resolve_under_roots("specs", &roots).await.unwrap();
    assert_eq!(specs, root.path().canonicalize().unwrap().join("specs"), "a folder (a cwd) resolves too");
    assert_eq!(resolve_under_roots("../", &roots).await.unwrap_err().kind, UpstreamErrorKind::File);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn operations_carry_path_query_headers_body_and_auth_on_one_connection() {
    let server = TestServer::start();
    let executor = HttpExecutor::new(loopback(), 64 * 1024).unwrap();

    let get = operation(
        &server,
        "GET",
        "/pets/{petId}",
        vec![
            param("petId", ParamLocation::Path, true),
            param("tag", ParamLocation::Query, false),
            param("X-Request-Id", ParamLocation::Header, false),
        ],
        false,
    );
    let auth = ResolvedAuth::Bearer { token: "t0ken".into() };
    let plan = build_request(&get, &json!({"petId": "a/b c", "tag": ["x", "y&z"], "X-Request-Id": "r1"}), Some(&auth))
        .unwrap();
    let result = executor.execute(&plan, TIMEOUT).await;
    settle().await;
    assert!(result.success, "{result:?}");
    let seen = server.last();
    assert_eq!(seen.target, "/v1/pets/a%2Fb%20c?tag=x&tag=y%26z");
    assert_eq!(seen.header("authorization"), Some("Bearer t0ken"));
    assert_eq!(seen.header("x-request-id"), Some("r1"));
    assert_eq!(result.data.unwrap()["target"], "/v1/pets/a%2Fb%20c?tag=x&tag=y%26z", "the JSON answer is parsed");

    let post = operation(&server, "POST", "/pets", vec![param("dryRun", ParamLocation::Query, false)], true);
    let auth = ResolvedAuth::Header { name: "X-Api-Key".into(), value: "k3y".into() };
    let plan = build_request(&post, &json!({"name": "Rex", "age": 3, "dryRun": false}), Some(&auth)).unwrap();
    let result = executor.execute(&plan, TIMEOUT).await;
    settle().await;
    assert!(result.success, "{result:?}");
    let seen = server.last();
    assert_eq!((seen.method.as_str(), seen.target.as_str()), ("POST", "/v1/pets?dryRun=false"));
    assert_eq!(seen.header("x-api-key"), Some("k3y"));
    assert_eq!(seen.header("content-type"), Some("application/json"));
    assert_eq!(serde_json::from_slice::<Value>(&seen.body).unwrap(), json!({"name": "Rex", "age": 3}));

    let delete = operation(&server, "DELETE", "/pets/{petId}", vec![param("petId", ParamLocation::Path, true)], false);
    let auth = ResolvedAuth::Query { name: "api_key".into(), value: "q k".into() };
    let plan = build_request(&delete, &json!({"petId": 7}), Some(&auth)).unwrap();
    assert!(executor.execute(&plan, TIMEOUT).await.success);
    settle().await;
    assert_eq!(server.last().target, "/v1/pets/7?api_key=q%20k");

    // `call` builds and sends in one step; the source's baseUrl replaces the document's.
    let mut elsewhere =
        operation(&server, "GET", "/pets/{petId}", vec![param("petId", ParamLocation::Path, true)], false);
    elsewhere.base_url = "http://192.0.2.1/unused".into();
    let base = format!("{}/v2", server.base);
    let result = executor.call(&elsewhere, &json!({"petId": "p"}), None, Some(&base), TIMEOUT).await;
    settle().await;
    assert!(result.success, "{result:?}");
    assert_eq!(server.last().target, "/v2/pets/p");
    let missing = executor.call(&elsewhere, &json!({}), None, Some(&base), TIMEOUT).await;
    assert_eq!(missing.code(), Some("invalid_args"), "{missing:?}");
    let unusable = executor.call(&elsewhere, &json!({"petId": "p"}), None, Some(""), TIMEOUT).await;
    assert_eq!(unusable.code(), Some("invalid_binding"), "{unusable:?}");

    let text = operation(&server, "GET", "/text", vec![], false);
    let result = executor.execute(&build_request(&text, &json!({}), None).unwrap(), TIMEOUT).await;
    assert_eq!(result.data, Some(json!("plain words")));

    // Five requests; a client per call would open five connections.
    let requests = server.seen.lock().unwrap().len();
    let connections = server.connections.load(Ordering::SeqCst);
    assert!(requests == 5 && connections <= 2, "{requests} requests on {connections} connections");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn failures_are_typed() {
    let server = TestServer::start();
    let executor = HttpExecutor::new(loopback(), 100_000).unwrap();
    let plan_for =
        |path: &str| build_request(&operation(&server, "GET", path, vec![], false), &json!({}), None).unwrap();

    let failed = executor.execute(&plan_for("/fail"), TIMEOUT).await;
    assert_eq!(failed.code(), Some("execution_error"));
    let message = failed.error.unwrap().message;
    assert!(message.contains("HTTP 500") && message.contains("the database is down"), "{message}");

    let slow = executor.execute(&plan_for("/slow"), Duration::from_millis(300)).await;
    assert_eq!(slow.code(), Some("execution_error"));
    assert!(slow.error.unwrap().message.contains("300 ms"));

    let mut huge = plan_for("/x");
    huge.url = format!("{}/huge.json", server.base);
    let small = HttpExecutor::new(loopback(), 1000).unwrap();
    let too_large = small.execute(&huge, TIMEOUT).await;
    assert_eq!(too_large.code(), Some("execution_error"));
    assert!(too_large.error.unwrap().message.contains("larger than 1000"));

    let unguarded = HttpExecutor::new(Vec::new(), 1000).unwrap();
    let refused = unguarded.execute(&plan_for("/pets"), TIMEOUT).await;
    assert_eq!(refused.code(), Some("target_refused"), "{refused:?}");
    let mut by_name = plan_for("/pets");
    by_name.url = by_name.url.replace("127.0.0.1", "localhost");
    let refused = unguarded.execute(&by_name, TIMEOUT).await;
    assert_eq!(refused.code(), Some("target_refused"), "a name resolving to loopback: {refused:?}");
    assert_eq!(server.seen.lock().unwrap().iter().filter(|s| s.target.starts_with("/v1/pets")).count(), 0);
}
