//! A runtime's registration applied through the Indexer: `capabilities.upsert`
//! and `capabilities.remove`, and the reply they earn.
//!
//! Shared by the two ways a registration arrives, straight from the gateway
//! (`app`) or read back from the JetStream index log (`replication`), and
//! below both, so neither imports the other for it.

use crate::actors::indexer::{Indexer, SyncCapabilities, SyncReport};
use crate::core::catalog::runtime_origin;
use crate::core::registration::{normalise_registration, RegistrationPayload};
use crate::gateway::wire::{runtime_id, ApiError, RegistrationReply, RemoveRequest};

fn registration_reply(report: SyncReport, diagnostics: Vec<serde_json::Value>) -> RegistrationReply {
    let mut diagnostics = diagnostics;
    diagnostics
        .extend(report.conflicts.iter().map(|c| serde_json::json!({"id": c.id, "field": "id", "problem": c.problem})));
    RegistrationReply {
        version: report.version,
        added: report.added,
        updated: report.updated,
        removed: report.removed_ids,
        unchanged: report.unchanged,
        diagnostics,
    }
}

/// Upserts a runtime's batch of capabilities through the Indexer.
pub(crate) async fn apply_upsert(
    indexer: actix::Addr<Indexer>,
    payload: RegistrationPayload,
) -> Result<RegistrationReply, ApiError> {
    let origin = runtime_origin(&runtime_id(payload.runtime_id.as_deref())?);
    let normalised = normalise_registration(&payload);
    let mut sync = SyncCapabilities::merge(&origin, normalised.descriptors);
    if !payload.presets.is_empty() {
        sync.presets = Some(normalised.presets);
    }
    let report =
        indexer.send(sync).await.map_err(ApiError::unavailable)?.map_err(|err| ApiError::internal(err.to_string()))?;
    let diagnostics = normalised.diagnostics.iter().filter_map(|d| serde_json::to_value(d).ok()).collect();
    Ok(registration_reply(report, diagnostics))
}

/// Removes capabilities a runtime registered, through the Indexer.
pub(crate) async fn apply_remove(
    indexer: actix::Addr<Indexer>,
    request: RemoveRequest,
) -> Result<RegistrationReply, ApiError> {
    let origin = runtime_origin(&runtime_id(request.runtime_id.as_deref())?);
    let report = indexer
        .send(SyncCapabilities::remove(&origin, request.ids))
        .await
        .map_err(ApiError::unavailable)?
        .map_err(|err| ApiError::internal(err.to_string()))?;
    Ok(registration_reply(report, Vec::new()))
}
