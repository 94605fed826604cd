//! The shared live source definitions: `sources.add` and `sources.remove`
//! written through the sources bucket, and each change of it applied to this
//! node's SourceManager (the key layout is in `shared_state/mod.rs`).

use super::{not_shared, ValueCodec};
use crate::actors::sources::{stored_sources, AddSource, RemoveSource, SourceManager};
use crate::config::Settings;
use crate::core::sources::settings::SourceSettings;
use crate::core::sources::shared::{change_of, SourceChange};
use crate::gateway::errors::ErrorKind;
use crate::gateway::kv::{from_key_token, key_token, Bucket, Change, Expect};
use crate::gateway::service::Api;
use crate::gateway::wire::{ApiError, SourcesRequest};
use crate::live::LiveSources;
use crate::store::sources::SourcesStore;
use crate::store::Store;
use actix::prelude::*;
use std::cell::RefCell;
use std::collections::{BTreeMap, BTreeSet};
use std::rc::Rc;

/// The key of a live source definition: `source.<key_token(source_id)>`.
pub fn definition_key(source_id: &str) -> String {
    format!("source.{}", key_token(source_id))
}

/// The source id a key names; `None` for a key capdex does not write.
fn definition_id(key: &str) -> Option<String> {
    from_key_token(key.strip_prefix("source.")?)
}

/// This node's side of the sources bucket.
#[derive(Clone)]
pub(super) struct SourcesShare {
    bucket: Bucket,
    manager: Addr<SourceManager>,
    /// The ids this node's `[[sources]]` declare: they stay as its file says.
    declared: Rc<BTreeSet<String>>,
    /// The definitions this node serves, as given (not the config's).
    held: Rc<RefCell<BTreeMap<String, SourceSettings>>>,
    live: LiveSources,
}

fn invalid(message: String) -> ApiError {
    ApiError::new(ErrorKind::Invalid("invalid_source"), message)
}

impl SourcesShare {
    /// Over `bucket`, knowing the sources this node restored from its store.
    pub(super) fn new(
        bucket: Bucket,
        settings: &Settings,
        store: &Store,
        live: &LiveSources,
    ) -> anyhow::Result<SourcesShare> {
        let declared: BTreeSet<String> = settings.sources.iter().map(|source| source.id.clone()).collect();
        let stored = stored_sources(&SourcesStore::open(store)?)?;
        let held = stored
            .into_iter()
            .filter(|source| !declared.contains(&source.id))
            .map(|source| (source.id.clone(), source))
            .collect();
        Ok(SourcesShare {
            bucket,
            manager: live.manager.clone(),
            declared: Rc::new(declared),
            held: Rc::new(RefCell::new(held)),
            live: live.clone(),
        })
    }

    pub(super) fn bucket(&self) -> &Bucket {
        &self.bucket
    }

    /// `sources.add`: checks the settings, writes them to the bucket, then adds the source here.
    pub(super) async fn add<A: Api>(self, body: serde_json::Value, local: A) -> Result<serde_json::Value, ApiError> {
        let settings: SourceSettings =
            serde_json::from_value(body.clone()).map_err(|err| invalid(format!("source settings: {err}")))?;
        settings.validate().map_err(|err| invalid(format!("{}: {}", err.field, err.problem)))?;
        crate::live::check_client_env(&settings, &self.live)?;
        let bytes = ValueCodec::Json.encode(&settings).map_err(ApiError::internal)?;
        // Held before the write, so this node's follower takes its own write as known.
        let earlier = self.held.borrow_mut().insert(settings.id.clone(), settings.clone());
        let written = self.bucket.write(&definition_key(&settings.id), bytes.into(), Expect::Any).await;
        if let Err(err) = written {
            let mut held = self.held.borrow_mut();
            match earlier {
                Some(earlier) => held.insert(settings.id.clone(), earlier),
                None => held.remove(&settings.id),
            };
            return Err(not_shared(self.bucket.name(), err));
        }
        local.sources(SourcesRequest::Add(body)).await
    }

    /// `sources.remove`: deletes the key, then removes the source here (a
    /// source this node had not applied yet is removed all the same).
    pub(super) async fn remove<A: Api>(self, body: serde_json::Value, local: A) -> Result<serde_json::Value, ApiError> {
        let Some(id) = body.get("id").and_then(serde_json::Value::as_str).map(str::to_string) else {
            return local.sources(SourcesRequest::Remove(body)).await;
        };
        let key = definition_key(&id);
        let shared = self.bucket.get(&key).await.map_err(|err| not_shared(self.bucket.name(), err))?.is_some();
        // Forgotten before the delete, so this node's follower does not remove it a second time.
        self.held.borrow_mut().remove(&id);
        if shared {
            self.bucket.delete(&key).await.map_err(|err| not_shared(self.bucket.name(), err))?;
        }
        match local.sources(SourcesRequest::Remove(body)).await {
            Err(err) if shared && err.kind == ErrorKind::NotFound("unknown_source") => {
                Ok(serde_json::json!({ "removed": id }))
            }
            answer => answer,
        }
    }

    /// Applies one change of the bucket to this node's SourceManager.
    pub(super) async fn apply(self, change: Change) {
        let Some(id) = definition_id(&change.key) else {
            tracing::warn!(bucket = %self.bucket.name(), key = %change.key, "a key capdex does not write; ignored");
            return;
        };
        let shared = match change.value.as_deref().map(|bytes| ValueCodec::Json.decode::<SourceSettings>(bytes)) {
            Some(Err(problem)) => {
                tracing::warn!(bucket = %self.bucket.name(), %id, %problem, "a source definition that does not read; ignored");
                return;
            }
            Some(Ok(settings)) => Some(settings),
            None => None,
        };
        let declared = self.declared.contains(&id);
        let change = change_of(&id, declared, self.held.borrow().get(&id), shared);
        match change {
            SourceChange::Keep => {}
            SourceChange::Add(settings) => {
                tracing::info!(source = %id, "adding a live source shared by another node");
                self.held.borrow_mut().insert(id, (*settings).clone());
                // Not awaited: the source connects on its own, as a configured one does.
                self.manager.do_send(AddSource { settings: *settings, persist: true });
            }
            SourceChange::Remove(id) => {
                tracing::info!(source = %id, "removing a live source another node removed");
                self.held.borrow_mut().remove(&id);
                self.manager.do_send(RemoveSource { id });
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn definition_keys_round_trip() {
        assert_eq!(definition_key("wiki"), "source.wiki");
        assert_eq!(definition_id("source.wiki").as_deref(), Some("wiki"));
        assert_eq!(definition_id(&definition_key("a-b_c")).as_deref(), Some("a-b_c"));
        assert_eq!(definition_id("note.wiki"), None);
        assert_eq!(definition_id("source.=q"), None);
    }
}
