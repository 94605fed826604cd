//! The shared SCG: `map` and `memory.deposit` written through the SCG bucket,
//! and each change of it applied to this node's graph, catalog and dispatch
//! records (the key layout is in `shared_state/mod.rs`).

use super::{not_shared, write_folded, ValueCodec};
use crate::actors::scg::{DepositNote, PutNote, ScgError, ScgGraph, SourceOf};
use crate::actors::Actors;
use crate::core::scg::memory::{Deposited, Note};
use crate::core::scg::pipeline::MapReport;
use crate::core::scg::shared::{fold_note, fold_source, source_change, Apply, SharedSource};
use crate::gateway::kv::{from_key_token, key_token, Bucket, Change};
use crate::gateway::wire::{ApiError, ScgDepositRequest, ScgMapRequest};
use crate::source_catalog::{Publication, SourceCatalog};
use actix::prelude::*;

/// What a key of the SCG bucket names.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum ScgKey {
    /// A mapped source, by source id.
    Source(String),
    /// A memory note, by note id.
    Note(String),
}

/// The key of a mapped source: `source.<key_token(source_id)>`.
pub fn source_key(source_id: &str) -> String {
    format!("source.{}", key_token(source_id))
}

/// What every memory note's key starts with.
pub const NOTE_PREFIX: &str = "note.";

/// The key of a memory note: `note.<key_token(note_id)>`.
pub fn note_key(note_id: &str) -> String {
    format!("{NOTE_PREFIX}{}", key_token(note_id))
}

/// What `key` names; `None` for a key capdex does not write.
pub fn scg_key(key: &str) -> Option<ScgKey> {
    let (kind, token) = key.split_once('.')?;
    let id = from_key_token(token)?;
    match kind {
        "source" => Some(ScgKey::Source(id)),
        "note" => Some(ScgKey::Note(id)),
        _ => None,
    }
}

/// This node's side of the SCG bucket.
#[derive(Clone)]
pub(super) struct ScgShare {
    bucket: Bucket,
    catalog: SourceCatalog,
    graph: Addr<ScgGraph>,
}

fn scg_error(err: ScgError) -> ApiError {
    ApiError::new(err.kind(), err.to_string())
}

impl ScgShare {
    pub(super) fn new(bucket: Bucket, actors: &Actors) -> ScgShare {
        ScgShare { bucket, catalog: SourceCatalog::of(actors), graph: actors.scg.graph.clone() }
    }

    pub(super) fn bucket(&self) -> &Bucket {
        &self.bucket
    }

    /// `map`: publishes the source here, folds it into the bucket, and puts
    /// the folded value (the workspaces other nodes enabled too) here.
    pub(super) async fn map(self, request: ScgMapRequest) -> Result<MapReport, ApiError> {
        let published = self
            .catalog
            .publish_source(Publication::of_map(request)?)
            .await
            .map_err(|err| ApiError::new(err.kind(), err.to_string()))?;
        let mut report = published.report;
        let source_id = report.source_id.clone();
        let held = self.graph.send(SourceOf { source_id: source_id.clone() }).await.map_err(ApiError::unavailable)?;
        let local = held
            .map_err(scg_error)?
            .ok_or_else(|| ApiError::internal(format!("source {source_id} was mapped but is not held")))?;
        let tools = published.tools;
        let fold = |shared: Option<SharedSource>| SharedSource {
            stored: fold_source(local.clone(), shared.as_ref().map(|shared| &shared.stored)),
            tools: tools.clone(),
        };
        let folded = write_folded(&self.bucket, &source_key(&source_id), ValueCodec::MsgPack, fold).await?;
        report.workspaces = folded.stored.workspaces.clone();
        if folded.stored != local {
            self.catalog.put_shared(folded).await.map_err(|err| ApiError::new(err.kind(), err.to_string()))?;
        }
        Ok(report)
    }

    /// `memory.deposit`: deposits here, folds the note into the bucket (one
    /// more deposit of the shared note), and puts the folded note here.
    pub(super) async fn deposit(self, request: ScgDepositRequest) -> Result<Deposited, ApiError> {
        let deposit = request.deposit()?;
        let label = deposit.label.clone();
        let local = self
            .graph
            .send(DepositNote { deposit, workspace: request.workspace })
            .await
            .map_err(ApiError::unavailable)?
            .map_err(scg_error)?;
        let fold = |shared: Option<Note>| fold_note(shared, &local.note, &label);
        let note = write_folded(&self.bucket, &note_key(&local.note.id), ValueCodec::MsgPack, fold).await?;
        let put = PutNote { id: note.id.clone(), note: Some(note.clone()) };
        self.graph
            .send(put)
            .await
            .map_err(|err| not_shared(self.bucket.name(), err))?
            .map_err(|err| not_shared(self.bucket.name(), err))?;
        Ok(Deposited { merged: local.merged || note.count > 1, note })
    }

    /// Applies one change of the bucket to this node.
    pub(super) async fn apply(self, change: Change) {
        let Change { key, value, revision, .. } = change;
        let applied = match scg_key(&key) {
            Some(ScgKey::Source(source_id)) => self.apply_source(&source_id, value.as_deref()).await,
            Some(ScgKey::Note(note_id)) => self.apply_note(note_id, value.as_deref()).await,
            None => Err(format!("key {key} is not one capdex writes")),
        };
        if let Err(problem) = applied {
            tracing::warn!(bucket = %self.bucket.name(), %key, revision, %problem, "shared SCG change not applied");
        }
    }

    async fn apply_source(&self, source_id: &str, value: Option<&[u8]>) -> Result<(), String> {
        match value {
            Some(bytes) => {
                let shared: SharedSource = ValueCodec::MsgPack.decode(bytes)?;
                if shared.stored.graph.source_id != source_id {
                    return Err(format!("the value is source {}", shared.stored.graph.source_id));
                }
                self.catalog.put_shared(shared).await.map(|_| ()).map_err(|err| err.to_string())
            }
            None => {
                let held = self.graph.send(SourceOf { source_id: source_id.to_string() }).await;
                let held = held.map_err(|err| err.to_string())?.map_err(|err| err.to_string())?;
                if source_change(held.as_ref(), None) == Apply::Remove {
                    self.catalog.withdraw_source(source_id).await.map_err(|err| err.to_string())?;
                }
                Ok(())
            }
        }
    }

    async fn apply_note(&self, note_id: String, value: Option<&[u8]>) -> Result<(), String> {
        let note: Option<Note> = value.map(|bytes| ValueCodec::MsgPack.decode(bytes)).transpose()?;
        if let Some(note) = note.as_ref().filter(|note| note.id != note_id) {
            return Err(format!("the value is note {}", note.id));
        }
        let put = self.graph.send(PutNote { id: note_id, note }).await.map_err(|err| err.to_string())?;
        put.map(|_| ()).map_err(|err| err.to_string())
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn keys_name_sources_and_notes_and_nothing_else() {
        assert_eq!(source_key("pets"), "source.pets");
        assert_eq!(source_key("my.api"), "source.my=2Eapi");
        assert_eq!(note_key("0a1b"), "note.0a1b");
        assert_eq!(scg_key("source.my=2Eapi"), Some(ScgKey::Source("my.api".into())));
        assert_eq!(scg_key(&note_key("0a1b")), Some(ScgKey::Note("0a1b".into())));
        assert_eq!(scg_key("links.all"), None);
        assert_eq!(scg_key("source"), None);
        assert_eq!(scg_key("source.=zz"), None);
        for id in ["a", "a.b", "x#y", "ünï", ""] {
            assert_eq!(scg_key(&source_key(id)), Some(ScgKey::Source(id.to_string())));
        }
    }
}
