//! Dispatch state in sled: the capability registry, per-agent bindings,
//! approvals, the create-only re-drive cache and provenance records.
//!
//! | tree | key | value |
//! |---|---|---|
//! | `dispatch_registry` | slug | [`CapabilityRecord`] |
//! | `dispatch_bindings` | `<agentId>\0<slug>` | [`Binding`] |
//! | `dispatch_approvals` | approval id | [`Approval`] |
//! | `dispatch_cache` | `<executionId>\0<stepId>[\0turn=<n>]` | [`CacheEntry`]: in progress, or the stored result |
//! | `dispatch_provenance` | sled-generated id, 8 bytes big-endian | [`ProvenanceRecord`] |
//!
//! The cache is create-only: [`Store::claim_execution`] inserts an
//! in-progress marker with compare-and-swap, so of two claims of one key only
//! one wins; the winner later stores the result or releases the key.

use crate::core::dispatch::approval::Approval;
pub use crate::core::dispatch::redrive::{CacheEntry, Claim};
use crate::core::dispatch::registry::{Binding, CapabilityRecord};
use crate::core::dispatch::ProvenanceRecord;
use crate::store::{all, get, put, Store, StoreError};

pub(crate) const REGISTRY: &str = "dispatch_registry";
pub(crate) const BINDINGS: &str = "dispatch_bindings";
pub(crate) const APPROVALS: &str = "dispatch_approvals";
pub(crate) const CACHE: &str = "dispatch_cache";
pub(crate) const PROVENANCE: &str = "dispatch_provenance";

/// The dispatch trees, opened with the store.
#[derive(Clone, Debug)]
pub(crate) struct DispatchTrees {
    pub(super) registry: sled::Tree,
    pub(super) bindings: sled::Tree,
    pub(super) approvals: sled::Tree,
    pub(super) cache: sled::Tree,
    pub(super) provenance: sled::Tree,
}

impl DispatchTrees {
    pub(crate) fn open(db: &sled::Db) -> Result<DispatchTrees, sled::Error> {
        Ok(DispatchTrees {
            registry: db.open_tree(REGISTRY)?,
            bindings: db.open_tree(BINDINGS)?,
            approvals: db.open_tree(APPROVALS)?,
            cache: db.open_tree(CACHE)?,
            provenance: db.open_tree(PROVENANCE)?,
        })
    }
}

fn sled_err(action: &'static str, tree: &'static str) -> impl FnOnce(sled::Error) -> StoreError {
    move |source| StoreError::Sled { action, tree, source }
}

fn binding_key(agent_id: &str, slug: &str) -> String {
    format!("{agent_id}\0{slug}")
}

impl Store {
    /// Every registered capability, in slug order.
    pub fn capability_records(&self) -> Result<Vec<CapabilityRecord>, StoreError> {
        all(&self.dispatch.registry, REGISTRY).map(|rows| rows.into_iter().map(|(_, r)| r).collect())
    }

    pub fn capability_record(&self, slug: &str) -> Result<Option<CapabilityRecord>, StoreError> {
        get(&self.dispatch.registry, REGISTRY, slug)
    }

    pub fn put_capability_record(&self, record: &CapabilityRecord) -> Result<(), StoreError> {
        self.check_space()?;
        put(&self.dispatch.registry, REGISTRY, &record.slug, record)
    }

    /// Every binding, in (agent, slug) order.
    pub fn bindings(&self) -> Result<Vec<Binding>, StoreError> {
        all(&self.dispatch.bindings, BINDINGS).map(|rows| rows.into_iter().map(|(_, b)| b).collect())
    }

    pub fn put_binding(&self, binding: &Binding) -> Result<(), StoreError> {
        self.check_space()?;
        put(&self.dispatch.bindings, BINDINGS, &binding_key(&binding.agent_id, &binding.slug), binding)
    }

    pub fn approval(&self, id: &str) -> Result<Option<Approval>, StoreError> {
        get(&self.dispatch.approvals, APPROVALS, id)
    }

    pub fn put_approval(&self, approval: &Approval) -> Result<(), StoreError> {
        self.check_space()?;
        put(&self.dispatch.approvals, APPROVALS, &approval.id, approval)
    }

    /// Every approval, in id order.
    pub fn approvals(&self) -> Result<Vec<Approval>, StoreError> {
        all(&self.dispatch.approvals, APPROVALS).map(|rows| rows.into_iter().map(|(_, a)| a).collect())
    }

    /// Claims an execution key: inserts `entry` (in progress) only if the key is absent.
    pub fn claim_execution(&self, key: &[u8], entry: &CacheEntry) -> Result<Claim, StoreError> {
        self.check_space()?;
        let bytes = rmp_serde::to_vec_named(entry).map_err(|source| StoreError::Encode { tree: CACHE, source })?;
        match self
            .dispatch
            .cache
            .compare_and_swap(key, None as Option<&[u8]>, Some(bytes))
            .map_err(sled_err("claim", CACHE))?
        {
            Ok(()) => Ok(Claim::Claimed),
            Err(existing) => {
                let current = existing.current.unwrap_or_default();
                let entry = rmp_serde::from_slice(&current).map_err(|source| StoreError::Decode {
                    tree: CACHE,
                    key: String::from_utf8_lossy(key).into_owned(),
                    source,
                })?;
                Ok(Claim::Existing(Box::new(entry)))
            }
        }
    }

    /// Stores the result of a claimed key.
    pub fn complete_execution(&self, key: &[u8], entry: &CacheEntry) -> Result<(), StoreError> {
        let bytes = rmp_serde::to_vec_named(entry).map_err(|source| StoreError::Encode { tree: CACHE, source })?;
        self.dispatch.cache.insert(key, bytes).map_err(sled_err("insert", CACHE))?;
        Ok(())
    }

    /// Frees a claimed key (the call failed, so a re-drive may run it again).
    pub fn release_execution(&self, key: &[u8]) -> Result<(), StoreError> {
        self.dispatch.cache.remove(key).map_err(sled_err("remove", CACHE))?;
        Ok(())
    }

    /// Appends a provenance record.
    pub fn append_provenance(&self, record: &ProvenanceRecord) -> Result<(), StoreError> {
        self.check_space()?;
        let id = self.db.generate_id().map_err(sled_err("generate an id", PROVENANCE))?;
        let bytes =
            rmp_serde::to_vec_named(record).map_err(|source| StoreError::Encode { tree: PROVENANCE, source })?;
        self.dispatch.provenance.insert(id.to_be_bytes(), bytes).map_err(sled_err("insert", PROVENANCE))?;
        Ok(())
    }

    /// The newest `limit` provenance records, oldest first.
    pub fn provenance(&self, limit: usize) -> Result<Vec<ProvenanceRecord>, StoreError> {
        let mut records = Vec::new();
        for entry in self.dispatch.provenance.iter().rev().take(limit) {
            let (key, bytes) = entry.map_err(sled_err("iterate", PROVENANCE))?;
            records.push(rmp_serde::from_slice(&bytes).map_err(|source| StoreError::Decode {
                tree: PROVENANCE,
                key: format!("{key:?}"),
                source,
            })?);
        }
        records.reverse();
        Ok(records)
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::core::dispatch::approval::pending;
    use crate::core::dispatch::CallResult;
    use serde_json::json;

    #[test]
    fn dispatch_state_survives_a_reopen_and_claims_are_create_only() {
        let dir = tempfile::tempdir().unwrap();
        let record: CapabilityRecord = serde_json::from_value(json!({
            "slug": "lookup", "name": "Lookup", "executionType": "internal", "handler": "h",
            "functionDefinition": {"name": "lookup", "parameters": {"type": "object"}}, "policyVersion": 1
        }))
        .unwrap();
        let binding = Binding {
            agent_id: "a".into(),
            slug: "lookup".into(),
            is_enabled: false,
            custom_rate_limit: Some(2),
            custom_config: json!({"url": "${env:X}"}),
        };
        let approval = pending("ap1".into(), "lookup", "a", &json!({}), 1, 0, 10);
        let entry = |owner: &str| CacheEntry {
            slug: "lookup".into(),
            agent_id: "a".into(),
            args_digest: "d".into(),
            owner: owner.into(),
            started_at_ms: 1,
            result: None,
        };
        {
            let store = Store::open(dir.path()).unwrap();
            store.put_capability_record(&record).unwrap();
            store.put_binding(&binding).unwrap();
            store.put_approval(&approval).unwrap();
            assert_eq!(store.claim_execution(b"e\0s", &entry("p1")).unwrap(), Claim::Claimed);
            assert_eq!(store.claim_execution(b"e\0s", &entry("p2")).unwrap(), Claim::Existing(Box::new(entry("p1"))));
            let mut done = entry("p1");
            done.result = Some(CallResult::ok(json!({"n": 1})));
            store.complete_execution(b"e\0s", &done).unwrap();
            assert_eq!(store.claim_execution(b"e\0t", &entry("p1")).unwrap(), Claim::Claimed);
            store.release_execution(b"e\0t").unwrap();
            for n in 0..3 {
                store.append_provenance(&ProvenanceRecord::test_record(n)).unwrap();
            }
            store.flush().unwrap();
        }
        let store = Store::open(dir.path()).unwrap();
        assert_eq!(store.capability_records().unwrap(), vec![record]);
        assert_eq!(store.bindings().unwrap(), vec![binding]);
        assert_eq!(store.approval("ap1").unwrap(), Some(approval));
        match store.claim_execution(b"e\0s", &entry("p3")).unwrap() {
            Claim::Existing(found) => assert_eq!(found.result, Some(CallResult::ok(json!({"n": 1})))),
            other => panic!("{other:?}"),
        }
        assert_eq!(store.claim_execution(b"e\0t", &entry("p3")).unwrap(), Claim::Claimed);
        let newest: Vec<u64> = store.provenance(2).unwrap().iter().map(|r| r.at_ms).collect();
        assert_eq!(newest, vec![1, 2]);
    }

    #[test]
    fn an_approval_stored_by_an_older_version_decodes_and_a_new_one_keeps_its_arguments() {
        /// An approval as versions before `arguments` and `decidedBy` stored it.
        #[derive(serde::Serialize)]
        #[serde(rename_all = "camelCase")]
        struct OldApproval {
            id: &'static str,
            slug: &'static str,
            agent_id: &'static str,
            args_digest: &'static str,
            policy_version: u64,
            created_at_ms: u64,
            expires_at_ms: u64,
            status: &'static str,
            decided_at_ms: Option<u64>,
        }
        let dir = tempfile::tempdir().unwrap();
        let store = Store::open(dir.path()).unwrap();
        let old = OldApproval {
            id: "old1",
            slug: "refund",
            agent_id: "a",
            args_digest: "00",
            policy_version: 2,
            created_at_ms: 1,
            expires_at_ms: 5,
            status: "approved",
            decided_at_ms: Some(3),
        };
        put(&store.dispatch.approvals, APPROVALS, "old1", &old).unwrap();
        let decoded = store.approval("old1").unwrap().unwrap();
        assert_eq!((decoded.arguments, decoded.decided_by, decoded.decided_at_ms), (None, None, Some(3)));
        assert_eq!(decoded.status, crate::core::dispatch::approval::ApprovalStatus::Approved);
        // Arguments of any JSON shape survive msgpack.
        let mut new = pending("new1".into(), "refund", "a", &json!({}), 1, 0, 10);
        new.arguments =
            Some(json!({"n": 1, "x": 2.5, "list": [true, null, "s"], "neg": -3, "o": {"k": "[redacted:k]"}}));
        new.decided_by = Some("alice".into());
        store.put_approval(&new).unwrap();
        assert_eq!(store.approval("new1").unwrap(), Some(new));
    }
}
