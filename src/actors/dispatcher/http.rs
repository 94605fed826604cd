//! The HTTP executor of `api` and `webhook` capabilities: check the host as
//! written (an IP literal in any spelling, a metadata name), resolve it, check
//! every address against the SSRF guard (`core::dispatch::ssrf`), then POST
//! only to the checked addresses, within the capability's timeout. No proxy
//! from the environment is used (a proxy would connect on the guard's behalf),
//! and no redirect is followed: a 3xx answer is `target_refused`. The
//! target's `${env:VAR}` templates were resolved at call time by
//! `core::dispatch::plan::choose_executor`; their values never leave here but
//! in the request.

use crate::core::dispatch::pipeline::HttpTarget;
use crate::core::dispatch::ssrf;
use crate::core::dispatch::{CallResult, ErrorCode};
use serde_json::{json, Value};
use std::time::Duration;

/// Runs one `api` call (its response is the result) or webhook POST (answered
/// `{accepted: true}` once sent on its way), bounded by `timeout_ms`.
pub(super) async fn call(
    target: HttpTarget,
    body: Value,
    webhook: bool,
    allowlist: Vec<ssrf::Cidr>,
    timeout_ms: u64,
) -> CallResult {
    let timeout = Duration::from_millis(timeout_ms);
    match actix_rt::time::timeout(timeout, http_call(target, body, webhook, allowlist, timeout)).await {
        Ok(result) => result,
        Err(_) => CallResult::fail(ErrorCode::ExecutionError, format!("no answer within {timeout_ms} ms")),
    }
}

/// The largest HTTP response body read, in bytes.
const MAX_RESPONSE_BYTES: usize = 4 * 1024 * 1024;

/// One `api` or `webhook` call: resolve, check every address, then connect
/// only to the checked addresses (no redirects), so DNS cannot change the target.
async fn http_call(
    target: HttpTarget,
    body: Value,
    webhook: bool,
    allowlist: Vec<ssrf::Cidr>,
    timeout: Duration,
) -> CallResult {
    let invalid = |message: &str| CallResult::fail(ErrorCode::InvalidBinding, message.to_string());
    let Ok(url) = reqwest::Url::parse(&target.url) else {
        return invalid("the target URL is not a valid URL");
    };
    if !matches!(url.scheme(), "http" | "https") {
        return invalid("the target URL must be http or https");
    }
    let (Some(host), Some(port)) = (url.host_str().map(str::to_string), url.port_or_known_default()) else {
        return invalid("the target URL has no host");
    };
    // The host as written first: a literal in any spelling, or a metadata name, never reaches DNS.
    if let Err(refusal) = ssrf::check_host(&host, &allowlist) {
        return CallResult::fail(ErrorCode::TargetRefused, refusal.to_string());
    }
    let lookup_host = host.trim_start_matches('[').trim_end_matches(']').to_string();
    let addrs: Vec<std::net::SocketAddr> = match tokio::net::lookup_host((lookup_host.as_str(), port)).await {
        Ok(addrs) => addrs.collect(),
        Err(err) => {
            return CallResult::fail(ErrorCode::ExecutionError, format!("cannot resolve the target host: {err}"))
        }
    };
    let ips: Vec<std::net::IpAddr> = addrs.iter().map(|a| a.ip()).collect();
    if let Err(refusal) = ssrf::check_addresses(&ips, &allowlist) {
        return CallResult::fail(ErrorCode::TargetRefused, refusal.to_string());
    }
    crate::tls::install_provider();
    let client = match reqwest::Client::builder()
        .no_proxy()
        .redirect(reqwest::redirect::Policy::none())
        .timeout(timeout)
        .resolve_to_addrs(&lookup_host, &addrs)
        .build()
    {
        Ok(client) => client,
        Err(err) => return CallResult::fail(ErrorCode::ExecutionError, format!("cannot build the HTTP client: {err}")),
    };
    let mut request = client.post(url).json(&body);
    for (name, value) in &target.headers {
        request = request.header(name.as_str(), value.as_str());
    }
    if webhook {
        actix_rt::spawn(async move {
            match request.send().await {
                Ok(response) if response.status().is_redirection() => {
                    tracing::warn!(status = %response.status(), "a webhook answered a redirect, which is not followed")
                }
                Ok(response) if !response.status().is_success() => {
                    tracing::warn!(status = %response.status(), "a webhook answered with an error status")
                }
                Ok(_) => {}
                Err(err) => tracing::warn!(err = %err.without_url(), "a webhook POST failed"),
            }
        });
        return CallResult::ok(json!({"accepted": true}));
    }
    let response = match request.send().await {
        Ok(response) => response,
        Err(err) => {
            return CallResult::fail(ErrorCode::ExecutionError, format!("the request failed: {}", err.without_url()))
        }
    };
    let status = response.status();
    if status.is_redirection() {
        return CallResult::fail(
            ErrorCode::TargetRefused,
            format!("the endpoint answered a redirect (HTTP {}); redirects are not followed", status.as_u16()),
        );
    }
    let bytes = match read_limited(response).await {
        Ok(bytes) => bytes,
        Err(problem) => return CallResult::fail(ErrorCode::ExecutionError, problem),
    };
    let data = serde_json::from_slice::<Value>(&bytes)
        .unwrap_or_else(|_| Value::String(String::from_utf8_lossy(&bytes).into_owned()));
    if !status.is_success() {
        return CallResult::fail(ErrorCode::ExecutionError, format!("the endpoint answered HTTP {}", status.as_u16()));
    }
    CallResult::ok(data)
}

async fn read_limited(mut response: reqwest::Response) -> Result<Vec<u8>, String> {
    let mut bytes = Vec::new();
    while let Some(chunk) =
        response.chunk().await.map_err(|err| format!("reading the response failed: {}", err.without_url()))?
    {
        if bytes.len() + chunk.len() > MAX_RESPONSE_BYTES {
            return Err(format!("the response is larger than {MAX_RESPONSE_BYTES} bytes"));
        }
        bytes.extend_from_slice(&chunk);
    }
    Ok(bytes)
}
