//! Upstreams: the only module that speaks MCP as a client (crate `rmcp`) or
//! fetches and calls live sources over HTTP. It knows nothing of actors: the
//! `SourceManager` holds what it hands out.
//!
//! - [`mcp`]: an MCP client session (stdio child or streamable HTTP):
//!   initialize, list tools, tool-list changes, calls with timeout, cancel and
//!   progress, and the session's end;
//! - [`openapi`]: an OpenAPI document fetched with `If-None-Match`, or read
//!   from a file under the allowed roots;
//! - [`http`]: an operation's request sent on a pooled client per source;
//! - [`guard`]: the SSRF guard every HTTP client here uses (`core::dispatch::ssrf`
//!   on resolved addresses, no proxies, no redirects to refused targets).
//!
//! Every failure is an [`UpstreamError`] (a kind with a wire code, and a
//! message); calls answer a `CallResult`. Every await on an upstream is bounded.

pub mod guard;
pub mod http;
pub mod mcp;
pub mod openapi;

use crate::core::dispatch::{CallResult, ErrorCode};

/// What went wrong with an upstream.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum UpstreamErrorKind {
    /// The target itself is unusable (a malformed URL, an empty command).
    InvalidTarget,
    /// The target resolved to an address the SSRF guard refuses.
    TargetRefused,
    /// The program could not be started.
    Spawn,
    /// No connection or no answer to the handshake.
    Connect,
    /// No answer within the time allowed.
    Timeout,
    /// The upstream answered something that is not what the protocol says.
    Protocol,
    /// The session is over (the upstream closed it or died).
    Closed,
    /// An answer larger than allowed.
    TooLarge,
    /// An HTTP status that is not success.
    HttpStatus,
    /// A file outside the allowed roots, missing, or unreadable.
    File,
}

impl UpstreamErrorKind {
    /// The wire code.
    pub fn as_str(self) -> &'static str {
        match self {
            UpstreamErrorKind::InvalidTarget => "invalid_target",
            UpstreamErrorKind::TargetRefused => "target_refused",
            UpstreamErrorKind::Spawn => "spawn_failed",
            UpstreamErrorKind::Connect => "connect_failed",
            UpstreamErrorKind::Timeout => "timeout",
            UpstreamErrorKind::Protocol => "protocol_error",
            UpstreamErrorKind::Closed => "closed",
            UpstreamErrorKind::TooLarge => "too_large",
            UpstreamErrorKind::HttpStatus => "http_status",
            UpstreamErrorKind::File => "file_error",
        }
    }

    /// The call error code a call failing this way answers.
    pub fn call_code(self) -> ErrorCode {
        match self {
            UpstreamErrorKind::InvalidTarget => ErrorCode::InvalidBinding,
            UpstreamErrorKind::TargetRefused => ErrorCode::TargetRefused,
            UpstreamErrorKind::Spawn | UpstreamErrorKind::Connect | UpstreamErrorKind::Closed => ErrorCode::Unavailable,
            UpstreamErrorKind::Timeout
            | UpstreamErrorKind::Protocol
            | UpstreamErrorKind::TooLarge
            | UpstreamErrorKind::HttpStatus
            | UpstreamErrorKind::File => ErrorCode::ExecutionError,
        }
    }
}

/// A failure to connect to, sync from or call an upstream.
#[derive(Clone, Debug, PartialEq, Eq, thiserror::Error)]
#[error("{message}")]
pub struct UpstreamError {
    pub kind: UpstreamErrorKind,
    pub message: String,
}

impl UpstreamError {
    pub fn new(kind: UpstreamErrorKind, message: impl Into<String>) -> UpstreamError {
        UpstreamError { kind, message: message.into() }
    }

    /// The error as a failed call.
    pub fn to_call_result(&self) -> CallResult {
        CallResult::fail(self.kind.call_code(), self.message.clone())
    }
}

/// `text` cut to at most `max_chars` characters, marked when cut.
pub(crate) fn truncate(text: &str, max_chars: usize) -> String {
    match text.char_indices().nth(max_chars) {
        Some((at, _)) => format!("{}…", &text[..at]),
        None => text.to_string(),
    }
}
