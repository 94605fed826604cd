//! Sends an OpenAPI operation's request ([`HttpRequestPlan`], built by
//! `core::sources::request`) on one pooled client per source
//! ([`HttpExecutor`]): connections are reused across calls, the SSRF guard
//! sits in the client's resolver (and checks IP-literal hosts before
//! sending), redirects are not followed, and every call is bounded by a
//! timeout and a response size cap. Answers a `CallResult`: the body as
//! JSON when it parses, else as text; a non-2xx status is an
//! `execution_error` naming the status with the start of the body.

use super::guard::{from_reqwest, SsrfGuard};
use super::{truncate, UpstreamError, UpstreamErrorKind};
use crate::core::dispatch::ssrf::Cidr;
use crate::core::dispatch::{CallResult, ErrorCode};
use crate::core::sources::request::{build_request, HttpRequestPlan};
use crate::core::sources::settings::ResolvedAuth;
use crate::core::sources::HttpOperation;
use serde_json::{json, Value};
use std::time::Duration;

/// The largest response body read by default, in bytes.
pub const DEFAULT_MAX_RESPONSE_BYTES: usize = 4 * 1024 * 1024;
/// How much of an error body a failed call's message carries, in characters.
const ERROR_BODY_CHARS: usize = 300;

/// One source's HTTP client. Cheap to clone (clones share the pool).
#[derive(Clone, Debug)]
pub struct HttpExecutor {
    client: reqwest::Client,
    guard: SsrfGuard,
    max_response_bytes: usize,
}

impl HttpExecutor {
    /// A client for one source: the guard's allowlist, and the largest response body read.
    ///
    /// # Examples
    /// ```
    /// use capdex::upstream::http::{HttpExecutor, DEFAULT_MAX_RESPONSE_BYTES};
    /// let executor = HttpExecutor::new(vec![], DEFAULT_MAX_RESPONSE_BYTES).unwrap();
    /// # drop(executor);
    /// ```
    pub fn new(allowlist: Vec<Cidr>, max_response_bytes: usize) -> Result<HttpExecutor, UpstreamError> {
        let guard = SsrfGuard::new(allowlist);
        let client = guard
            .client_builder()
            .pool_idle_timeout(Duration::from_secs(90))
            .pool_max_idle_per_host(8)
            .connect_timeout(Duration::from_secs(10))
            .build()
            .map_err(|err| {
                UpstreamError::new(UpstreamErrorKind::Connect, format!("cannot build the HTTP client: {err}"))
            })?;
        Ok(HttpExecutor { client, guard, max_response_bytes })
    }

    /// Builds the request of one call of `op` (`core::sources::request::build_request`,
    /// with `base_url` replacing the operation's when given: a source's
    /// `baseUrl` setting) and sends it; arguments that do not fit answer
    /// `invalid_args`, an unusable operation `invalid_binding`.
    pub async fn call(
        &self,
        op: &HttpOperation,
        arguments: &Value,
        auth: Option<&ResolvedAuth>,
        base_url: Option<&str>,
        timeout: Duration,
    ) -> CallResult {
        let overridden;
        let op = match base_url {
            Some(base_url) => {
                overridden = HttpOperation { base_url: base_url.to_string(), ..op.clone() };
                &overridden
            }
            None => op,
        };
        match build_request(op, arguments, auth) {
            Ok(plan) => self.execute(&plan, timeout).await,
            Err(err) => CallResult::fail(err.code(), err.to_string()),
        }
    }

    /// Sends `plan` and reads the answer, all within `timeout`.
    pub async fn execute(&self, plan: &HttpRequestPlan, timeout: Duration) -> CallResult {
        let timeout_ms = timeout.as_millis();
        match tokio::time::timeout(timeout, self.send(plan)).await {
            Ok(Ok(result)) => result,
            Ok(Err(err)) => err.to_call_result(),
            Err(_) => CallResult::fail(ErrorCode::ExecutionError, format!("no answer within {timeout_ms} ms")),
        }
    }

    async fn send(&self, plan: &HttpRequestPlan) -> Result<CallResult, UpstreamError> {
        let url = self.guard.check_url(&plan.url)?;
        let method = reqwest::Method::from_bytes(plan.method.as_bytes()).map_err(|_| {
            UpstreamError::new(UpstreamErrorKind::InvalidTarget, format!("{:?} is not a method", plan.method))
        })?;
        let mut request = self.client.request(method, url);
        for (name, value) in &plan.headers {
            request = request.header(name.as_str(), value.as_str());
        }
        if let Some(body) = &plan.body {
            let bytes = serde_json::to_vec(body).map_err(|err| {
                UpstreamError::new(UpstreamErrorKind::InvalidTarget, format!("cannot encode the body: {err}"))
            })?;
            request = request.body(bytes);
        }
        let response = request.send().await.map_err(|err| from_reqwest(err, "the request"))?;
        let status = response.status();
        let bytes = read_limited(response, self.max_response_bytes).await?;
        let data = serde_json::from_slice::<Value>(&bytes)
            .unwrap_or_else(|_| Value::String(String::from_utf8_lossy(&bytes).into_owned()));
        if !status.is_success() {
            let body = match &data {
                Value::String(text) => text.clone(),
                other => other.to_string(),
            };
            let mut result = CallResult::fail(
                ErrorCode::ExecutionError,
                format!("the operation answered HTTP {}: {}", status.as_u16(), truncate(body.trim(), ERROR_BODY_CHARS)),
            );
            result.metadata = Some(json!({"status": status.as_u16()}));
            return Ok(result);
        }
        let mut result = CallResult::ok(data);
        result.metadata = Some(json!({"status": status.as_u16()}));
        Ok(result)
    }
}

/// Reads a response body, failing once it passes `max_bytes`.
pub(crate) async fn read_limited(mut response: reqwest::Response, max_bytes: usize) -> Result<Vec<u8>, UpstreamError> {
    if response.content_length().is_some_and(|length| length > max_bytes as u64) {
        return Err(UpstreamError::new(
            UpstreamErrorKind::TooLarge,
            format!("the response is larger than {max_bytes} bytes"),
        ));
    }
    let mut bytes = Vec::new();
    while let Some(chunk) = response.chunk().await.map_err(|err| from_reqwest(err, "reading the response"))? {
        if bytes.len() + chunk.len() > max_bytes {
            return Err(UpstreamError::new(
                UpstreamErrorKind::TooLarge,
                format!("the response is larger than {max_bytes} bytes"),
            ));
        }
        bytes.extend_from_slice(&chunk);
    }
    Ok(bytes)
}
