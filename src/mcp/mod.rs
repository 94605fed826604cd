//! capdex's MCP face: the Model Context Protocol server that MCP clients
//! (desktop assistants, coding agents, IDEs) use instead of NATS, built on the
//! official Rust SDK (`rmcp`). It offers `discover_capabilities`,
//! `call_capability`, `route_sources` and `report_outcome`, and in direct mode
//! the session's most relevant capabilities as tools of their own.
//!
//! - [`server`]: the handler, one [`server::Session`] per MCP session;
//! - [`tools`]: the tools' schemas and results;
//! - [`bridge`]: the `Send` handle on capdex's (thread-local) `Api`;
//! - [`http`]: streamable HTTP with the bearer-token check;
//! - [`serve_stdio`]: stdio, for clients that launch `capdex mcp`.
//!
//! Like the gateway, this module knows nothing of actors: it calls capdex
//! through `gateway::service::Api`, which `app.rs` implements.

pub mod bridge;
pub mod http;
pub mod server;
pub mod tools;

use crate::mcp::bridge::Bridge;
use crate::mcp::server::{FaceOptions, Session};
use std::sync::Arc;

/// Why the stdio face stopped with an error.
#[derive(Debug, thiserror::Error)]
pub enum StdioError {
    #[error("the MCP client did not complete the handshake on stdio: {0}")]
    Handshake(String),
    #[error("the MCP session task failed: {0}")]
    Task(String),
}

/// Serves one MCP session on stdin and stdout until the client closes it or
/// `stop` resolves. Stdout carries only MCP frames.
pub async fn serve_stdio(
    options: FaceOptions,
    bridge: Bridge,
    direct: bool,
    stop: impl std::future::Future<Output = ()>,
) -> Result<(), StdioError> {
    let session = Session::new(Arc::new(options), bridge, direct);
    let handshake = rmcp::ServiceExt::serve(session, rmcp::transport::stdio());
    tokio::pin!(stop);
    let running = tokio::select! {
        running = handshake => running.map_err(|err| StdioError::Handshake(err.to_string()))?,
        _ = &mut stop => return Ok(()),
    };
    let cancel = running.cancellation_token();
    let waiting = running.waiting();
    tokio::pin!(waiting);
    let quit = tokio::select! {
        quit = &mut waiting => quit,
        _ = &mut stop => {
            cancel.cancel();
            waiting.await
        }
    };
    quit.map(|reason| tracing::info!(?reason, "MCP session on stdio ended"))
        .map_err(|err| StdioError::Task(err.to_string()))
}
