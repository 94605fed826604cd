//! A runtime's registration applied through the Indexer: `capabilities.upsert`
//! and `capabilities.remove`, and the reply they earn.
//!
//! Shared by the two ways a registration arrives, straight from the gateway
//! (`app`) or read back from the JetStream index log (`replication`), and
//! below both, so neither imports the other for it.

use crate::actors::indexer::{Indexer, SyncBatch, SyncCapabilities, SyncReport};
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

/// Upserts a runtime's batch of capabilities through the Indexer; ids are at
/// most `max_id_bytes` (`[limits]`).
pub(crate) async fn apply_upsert(
    indexer: actix::Addr<Indexer>,
    payload: RegistrationPayload,
    max_id_bytes: usize,
) -> Result<RegistrationReply, ApiError> {
    let (sync, diagnostics) = upsert_sync(&payload, max_id_bytes)?;
    let report =
        indexer.send(sync).await.map_err(ApiError::unavailable)?.map_err(|err| ApiError::internal(err.to_string()))?;
    Ok(registration_reply(report, diagnostics))
}

/// Removes capabilities a runtime registered, through the Indexer.
pub(crate) async fn apply_remove(
    indexer: actix::Addr<Indexer>,
    request: RemoveRequest,
    max_id_bytes: usize,
) -> Result<RegistrationReply, ApiError> {
    let report = indexer
        .send(remove_sync(request, max_id_bytes)?)
        .await
        .map_err(ApiError::unavailable)?
        .map_err(|err| ApiError::internal(err.to_string()))?;
    Ok(registration_reply(report, Vec::new()))
}

/// The sync an upsert asks of the Indexer, and the diagnostics of its normalisation.
fn upsert_sync(
    payload: &RegistrationPayload,
    max_id_bytes: usize,
) -> Result<(SyncCapabilities, Vec<serde_json::Value>), ApiError> {
    let origin = runtime_origin(&runtime_id(payload.runtime_id.as_deref(), max_id_bytes)?);
    let normalised = normalise_registration(payload, max_id_bytes);
    let mut sync = SyncCapabilities::merge(&origin, normalised.descriptors);
    if !payload.presets.is_empty() {
        sync.presets = Some(normalised.presets);
    }
    let diagnostics = normalised.diagnostics.iter().filter_map(|d| serde_json::to_value(d).ok()).collect();
    Ok((sync, diagnostics))
}

/// The sync a removal asks of the Indexer.
fn remove_sync(request: RemoveRequest, max_id_bytes: usize) -> Result<SyncCapabilities, ApiError> {
    let origin = runtime_origin(&runtime_id(request.runtime_id.as_deref(), max_id_bytes)?);
    Ok(SyncCapabilities::remove(&origin, request.ids))
}

/// One registration mutation: an upsert or a removal.
pub(crate) enum Mutation {
    Upsert(RegistrationPayload),
    Remove(RemoveRequest),
}

/// Applies mutations in order as one change of the index (`SyncBatch`: one
/// index build for all of them) and answers each one's reply, in order; a
/// mutation refused before it reaches the Indexer gets its error and changes nothing.
pub(crate) async fn apply_batch(
    indexer: actix::Addr<Indexer>,
    mutations: Vec<Mutation>,
    max_id_bytes: usize,
) -> Vec<Result<RegistrationReply, ApiError>> {
    let mut replies: Vec<Option<Result<RegistrationReply, ApiError>>> = Vec::with_capacity(mutations.len());
    let mut syncs = Vec::new();
    let mut diagnostics = Vec::new();
    for mutation in mutations {
        let sync = match mutation {
            Mutation::Upsert(payload) => upsert_sync(&payload, max_id_bytes),
            Mutation::Remove(request) => remove_sync(request, max_id_bytes).map(|sync| (sync, Vec::new())),
        };
        match sync {
            Ok((sync, notes)) => {
                syncs.push(sync);
                diagnostics.push(notes);
                replies.push(None);
            }
            Err(err) => replies.push(Some(Err(err))),
        }
    }
    let reports = if syncs.is_empty() {
        Ok(Vec::new())
    } else {
        match indexer.send(SyncBatch(syncs)).await {
            Ok(Ok(reports)) => Ok(reports),
            Ok(Err(err)) => Err(ApiError::internal(err.to_string())),
            Err(err) => Err(ApiError::unavailable(err)),
        }
    };
    let mut reports = match reports {
        Ok(reports) => reports.into_iter().zip(diagnostics).map(|(r, d)| Ok(registration_reply(r, d))).collect(),
        Err(err) => diagnostics.iter().map(|_| Err(err.clone())).collect::<Vec<_>>(),
    }
    .into_iter();
    replies.into_iter().map(|reply| reply.unwrap_or_else(|| reports.next().expect("one report per sync"))).collect()
}
