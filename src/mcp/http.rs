//! Streamable HTTP: rmcp's `StreamableHttpService` (sessions kept in memory)
//! under a small hyper HTTP/1.1 server, with the bearer-token check in front.
//!
//! Every request must carry `Authorization: Bearer <token>` when `[mcp] token`
//! is set (401 otherwise, compared in constant time); without a token the
//! settings accept only a loopback address, and rmcp's `Host` check refuses
//! names other than loopback ones (DNS rebinding).

use crate::mcp::bridge::Bridge;
use crate::mcp::server::{FaceOptions, Session};
use bytes::Bytes;
use http_body_util::{BodyExt, Full};
use hyper::{Request, Response, StatusCode};
use hyper_util::rt::TokioIo;
use rmcp::transport::streamable_http_server::session::local::LocalSessionManager;
use rmcp::transport::streamable_http_server::{StreamableHttpServerConfig, StreamableHttpService};
use std::net::SocketAddr;
use std::sync::Arc;
use tower_service::Service as _;

/// Why the HTTP face could not start.
#[derive(Debug, thiserror::Error)]
pub enum HttpError {
    #[error("failed to listen for MCP on {addr}: {source}")]
    Bind { addr: SocketAddr, source: std::io::Error },
}

/// A bound HTTP face; [`HttpFace::serve`] runs it.
pub struct HttpFace {
    listener: tokio::net::TcpListener,
    path: String,
    service: StreamableHttpService<Session, LocalSessionManager>,
    token: Option<Arc<str>>,
    max_json_depth: usize,
}

impl HttpFace {
    /// Binds `addr` and prepares the service at `path`.
    pub async fn bind(
        addr: SocketAddr,
        path: &str,
        options: FaceOptions,
        bridge: Bridge,
    ) -> Result<HttpFace, HttpError> {
        let listener = tokio::net::TcpListener::bind(addr).await.map_err(|source| HttpError::Bind { addr, source })?;
        let token: Option<Arc<str>> = options.token.as_deref().map(Arc::from);
        let max_json_depth = options.max_json_depth;
        let mut config = StreamableHttpServerConfig::default();
        if token.is_some() {
            // A token guards the face, and it may serve names beyond loopback.
            config = config.disable_allowed_hosts();
        }
        let options = Arc::new(options);
        let service = StreamableHttpService::new(
            move || Ok(Session::new(options.clone(), bridge.clone(), false)),
            Arc::new(LocalSessionManager::default()),
            config,
        );
        Ok(HttpFace { listener, path: path.to_string(), service, token, max_json_depth })
    }

    /// The address bound (with the port chosen for port 0).
    pub fn local_addr(&self) -> Option<SocketAddr> {
        self.listener.local_addr().ok()
    }

    /// Accepts connections until `stop` resolves; each connection is its own task.
    pub async fn serve(self, stop: impl std::future::Future<Output = ()>) {
        tracing::info!(addr = ?self.local_addr(), path = %self.path, "serving MCP over streamable HTTP");
        tokio::pin!(stop);
        loop {
            let accepted = tokio::select! {
                accepted = self.listener.accept() => accepted,
                _ = &mut stop => break,
            };
            let stream = match accepted {
                Ok((stream, _)) => stream,
                Err(err) => {
                    tracing::warn!(%err, "MCP accept failed");
                    tokio::time::sleep(std::time::Duration::from_millis(50)).await;
                    continue;
                }
            };
            let _ = stream.set_nodelay(true);
            let (service, path, token) = (self.service.clone(), self.path.clone(), self.token.clone());
            let max_json_depth = self.max_json_depth;
            tokio::spawn(async move {
                let handler = hyper::service::service_fn(move |request: Request<hyper::body::Incoming>| {
                    let mut service = service.clone();
                    let refusal = refuse(&request, &path, token.as_deref());
                    async move {
                        if let Some(response) = refusal {
                            return Ok::<_, std::convert::Infallible>(response);
                        }
                        match checked(request, max_json_depth).await {
                            Ok(request) => service.call(request).await,
                            Err(response) => Ok(response),
                        }
                    }
                });
                if let Err(err) =
                    hyper::server::conn::http1::Builder::new().serve_connection(TokioIo::new(stream), handler).await
                {
                    tracing::debug!(%err, "MCP connection ended");
                }
            });
        }
    }
}

type Body = http_body_util::combinators::BoxBody<Bytes, std::convert::Infallible>;

/// The answer to a request that does not reach the MCP service: another path
/// (404) or a missing or wrong bearer token (401).
fn refuse<B>(request: &Request<B>, path: &str, token: Option<&str>) -> Option<Response<Body>> {
    if request.uri().path() != path {
        return Some(plain(StatusCode::NOT_FOUND, "not found"));
    }
    let token = token?;
    let given = request
        .headers()
        .get(hyper::header::AUTHORIZATION)
        .and_then(|value| value.to_str().ok())
        .and_then(|value| value.strip_prefix("Bearer "))
        .map(str::trim);
    match given {
        Some(given) if same(given.as_bytes(), token.as_bytes()) => None,
        _ => {
            let mut response = plain(StatusCode::UNAUTHORIZED, "a bearer token is required");
            response
                .headers_mut()
                .insert(hyper::header::WWW_AUTHENTICATE, hyper::header::HeaderValue::from_static("Bearer"));
            Some(response)
        }
    }
}

/// A request the MCP service may read: a POST's body is read whole (at most
/// `core::mcp_face::MAX_MESSAGE_BYTES`) and checked with
/// `core::mcp_face::precheck`, so what the SDK would misanswer (text that is not
/// JSON, an oversized message, `tools/call` arguments that are not an object)
/// gets the JSON-RPC error the specification gives: 400 with an id-less error,
/// or the error response of that request. Other methods pass as they are.
async fn checked(
    request: Request<hyper::body::Incoming>,
    max_json_depth: usize,
) -> Result<Request<http_body_util::combinators::BoxBody<Bytes, hyper::Error>>, Response<Body>> {
    if request.method() != hyper::Method::POST {
        return Ok(request.map(BodyExt::boxed));
    }
    let (parts, body) = request.into_parts();
    let limit = crate::core::mcp_face::MAX_MESSAGE_BYTES;
    let bytes = match http_body_util::Limited::new(body, limit).collect().await {
        Ok(collected) => collected.to_bytes(),
        Err(_) => return Err(json_error(StatusCode::BAD_REQUEST, crate::core::mcp_face::oversized())),
    };
    if let Some(frame) = crate::core::mcp_face::precheck(&String::from_utf8_lossy(&bytes), max_json_depth) {
        let status = if frame["id"].is_null() { StatusCode::BAD_REQUEST } else { StatusCode::OK };
        return Err(json_error(status, frame));
    }
    let body = Full::new(bytes).map_err(|never| match never {}).boxed();
    Ok(Request::from_parts(parts, body))
}

fn json_error(status: StatusCode, frame: serde_json::Value) -> Response<Body> {
    let mut response = Response::new(Full::new(Bytes::from(frame.to_string())).boxed());
    *response.status_mut() = status;
    response
        .headers_mut()
        .insert(hyper::header::CONTENT_TYPE, hyper::header::HeaderValue::from_static("application/json"));
    response
}

/// Compares two byte strings in time that depends only on their lengths.
fn same(a: &[u8], b: &[u8]) -> bool {
    a.len() == b.len() && a.iter().zip(b).fold(0u8, |acc, (x, y)| acc | (x ^ y)) == 0
}

fn plain(status: StatusCode, text: &'static str) -> Response<Body> {
    let mut response = Response::new(Full::new(Bytes::from_static(text.as_bytes())).boxed());
    *response.status_mut() = status;
    response
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn requests_need_the_path_and_the_token() {
        let request = |path: &str, auth: Option<&str>| {
            let mut builder = Request::builder().uri(path);
            if let Some(auth) = auth {
                builder = builder.header("authorization", auth);
            }
            builder.body(()).unwrap()
        };
        let token = Some("0123456789abcdef");
        let status = |r: Option<Response<Body>>| r.map(|r| r.status());
        assert_eq!(status(refuse(&request("/mcp", None), "/mcp", None)), None);
        assert_eq!(status(refuse(&request("/other", None), "/mcp", None)), Some(StatusCode::NOT_FOUND));
        assert_eq!(status(refuse(&request("/mcp", None), "/mcp", token)), Some(StatusCode::UNAUTHORIZED));
        assert_eq!(
            status(refuse(&request("/mcp", Some("Bearer nope")), "/mcp", token)),
            Some(StatusCode::UNAUTHORIZED)
        );
        assert_eq!(status(refuse(&request("/mcp", Some("Bearer 0123456789abcdef")), "/mcp", token)), None);
        assert_eq!(status(refuse(&request("/mcp?direct=true", Some("Bearer 0123456789abcdef")), "/mcp", token)), None);
    }
}
