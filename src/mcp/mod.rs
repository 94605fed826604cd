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
///
/// Each line from stdin passes `core::mcp_face::precheck` first: what the SDK
/// would drop or misanswer (text that is not JSON, a message over the size
/// limit, `tools/call` arguments that are not an object) is answered here with
/// the JSON-RPC error the specification gives. One writer puts the SDK's
/// frames and these on stdout, a whole line at a time.
pub async fn serve_stdio(
    options: FaceOptions,
    bridge: Bridge,
    direct: bool,
    stop: impl std::future::Future<Output = ()>,
) -> Result<(), StdioError> {
    use tokio::io::{AsyncBufReadExt, AsyncReadExt, AsyncWriteExt};
    let (sdk_in, mut to_sdk) = tokio::io::duplex(64 * 1024);
    let (from_sdk, sdk_out) = tokio::io::duplex(64 * 1024);
    let (refusals, mut refused) = tokio::sync::mpsc::unbounded_channel::<String>();
    let max_json_depth = options.max_json_depth;
    let reader = tokio::spawn(async move {
        let mut stdin = tokio::io::BufReader::new(tokio::io::stdin());
        let mut line = Vec::new();
        loop {
            line.clear();
            match (&mut stdin).take(MAX_LINE_READ).read_until(b'\n', &mut line).await {
                Ok(0) | Err(_) => break,
                Ok(_) => {}
            }
            if line.last() != Some(&b'\n') && line.len() as u64 >= MAX_LINE_READ {
                // Over the limit: answer it and skip the rest of the line.
                let _ = refusals.send(crate::core::mcp_face::oversized().to_string());
                let mut rest = Vec::new();
                let _ = stdin.read_until(b'\n', &mut rest).await;
                continue;
            }
            let text = String::from_utf8_lossy(&line);
            let text = text.trim();
            if text.is_empty() {
                continue;
            }
            match crate::core::mcp_face::precheck(text, max_json_depth) {
                Some(frame) => {
                    let _ = refusals.send(frame.to_string());
                }
                None => {
                    if to_sdk.write_all(text.as_bytes()).await.is_err() || to_sdk.write_all(b"\n").await.is_err() {
                        break;
                    }
                }
            }
        }
        // Dropping `to_sdk` is the SDK's end of input.
    });
    let writer = tokio::spawn(async move {
        let mut stdout = tokio::io::stdout();
        let mut frames = tokio::io::BufReader::new(from_sdk).lines();
        let mut sdk_open = true;
        loop {
            let line = tokio::select! {
                frame = frames.next_line(), if sdk_open => match frame {
                    Ok(Some(frame)) => frame,
                    _ => { sdk_open = false; continue; }
                },
                refusal = refused.recv() => match refusal {
                    Some(refusal) => refusal,
                    None if sdk_open => continue,
                    None => break,
                },
                else => break,
            };
            if stdout.write_all(format!("{line}\n").as_bytes()).await.is_err() || stdout.flush().await.is_err() {
                break;
            }
        }
    });
    let session = Session::new(Arc::new(options), bridge, direct);
    let handshake = rmcp::ServiceExt::serve(session, (sdk_in, sdk_out));
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
    // The session is over: its output ends; let the writer put out what is left.
    reader.abort();
    let _ = writer.await;
    quit.map(|reason| tracing::info!(?reason, "MCP session on stdio ended"))
        .map_err(|err| StdioError::Task(err.to_string()))
}

/// The most read of one line before it is refused as too large.
const MAX_LINE_READ: u64 = crate::core::mcp_face::MAX_MESSAGE_BYTES as u64 + 1;
