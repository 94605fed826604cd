//! What a node remembers of the JetStream streams (tree `jetstream`): its
//! node name, the last index mutation it applied (so a restart resumes the
//! index log after it), and the ids of the outcomes it has recorded from the
//! outcome stream (so a redelivered outcome is not counted twice).
//!
//! | key | value |
//! |---|---|
//! | `node` | the node name (UTF-8), made once |
//! | `index_seq` | last applied stream sequence, 8 bytes big-endian |
//! | `o\0<outcome id>` | the stream sequence it came with and the outcome's stream time (ms), 8 bytes big-endian each (earlier versions: the sequence alone) |
//!
//! The applied sequence is written after the Indexer's own writes; sled
//! recovers a prefix of its log, so after a crash the stored sequence is
//! never ahead of what the index holds (a mutation may be applied twice,
//! which changes nothing the second time).

use super::{Store, StoreError};

pub(super) const TREE: &str = "jetstream";
const NODE_KEY: &[u8] = b"node";
const INDEX_SEQ_KEY: &[u8] = b"index_seq";

impl Store {
    fn jetstream_tree(&self) -> Result<sled::Tree, StoreError> {
        self.db.open_tree(TREE).map_err(|source| StoreError::Sled { action: "open", tree: TREE, source })
    }

    /// Returns this data dir's node name, making `generated` it on first use.
    pub fn node_name(&self, generated: impl FnOnce() -> String) -> Result<String, StoreError> {
        let tree = self.jetstream_tree()?;
        if let Some(bytes) = tree.get(NODE_KEY).map_err(|source| sled_err("get", source))? {
            return Ok(String::from_utf8_lossy(&bytes).into_owned());
        }
        let name = generated();
        tree.insert(NODE_KEY, name.as_bytes()).map_err(|source| sled_err("insert", source))?;
        self.flush()?;
        Ok(name)
    }

    /// Returns the last index-log sequence this node applied (0: none).
    pub fn applied_index_sequence(&self) -> Result<u64, StoreError> {
        let tree = self.jetstream_tree()?;
        Ok(tree.get(INDEX_SEQ_KEY).map_err(|source| sled_err("get", source))?.map_or(0, |bytes| be_u64(&bytes)))
    }

    /// Records that the index-log mutation `sequence` has been applied.
    pub fn set_applied_index_sequence(&self, sequence: u64) -> Result<(), StoreError> {
        let tree = self.jetstream_tree()?;
        tree.insert(INDEX_SEQ_KEY, &sequence.to_be_bytes()).map_err(|source| sled_err("insert", source))?;
        Ok(())
    }

    /// Returns whether the outcome `outcome_id` was already recorded from the stream.
    pub fn outcome_processed(&self, outcome_id: &str) -> Result<bool, StoreError> {
        let tree = self.jetstream_tree()?;
        tree.contains_key(outcome_key(outcome_id)).map_err(|source| sled_err("get", source))
    }

    /// Records the outcome `outcome_id` (stream sequence `sequence`) as processed;
    /// await [`Store::durable`] before acknowledging it. (The outcome stream's
    /// consumer queues the mark with its KPI writes instead, as
    /// [`super::KpiOp::OutcomeProcessed`].)
    /// This writes the sequence alone, as earlier versions did (the sweep
    /// dates such an id when it first sees it).
    pub fn mark_outcome_processed(&self, outcome_id: &str, sequence: u64) -> Result<(), StoreError> {
        let tree = self.jetstream_tree()?;
        tree.insert(outcome_key(outcome_id), &sequence.to_be_bytes()).map_err(|source| sled_err("insert", source))?;
        Ok(())
    }
}

/// The prefix of every processed outcome id's key.
pub(super) const OUTCOME_PREFIX: &[u8] = b"o\0";

pub(super) fn outcome_key(outcome_id: &str) -> Vec<u8> {
    [OUTCOME_PREFIX, outcome_id.as_bytes()].concat()
}

/// A processed id's value: its stream sequence and time.
pub(super) fn outcome_value(sequence: u64, at_ms: u64) -> Vec<u8> {
    [sequence.to_be_bytes(), at_ms.to_be_bytes()].concat()
}

/// The time of a processed id's value (`None` for one without a time).
pub(super) fn outcome_time(value: &[u8]) -> Option<u64> {
    value.get(8..16).map(be_u64)
}

fn be_u64(bytes: &[u8]) -> u64 {
    bytes.try_into().map(u64::from_be_bytes).unwrap_or(0)
}

fn sled_err(action: &'static str, source: sled::Error) -> StoreError {
    StoreError::Sled { action, tree: TREE, source }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn sequences_node_name_and_processed_ids_survive_a_reopen() {
        let dir = tempfile::tempdir().unwrap();
        {
            let store = Store::open(dir.path()).unwrap();
            assert_eq!(store.applied_index_sequence().unwrap(), 0);
            assert_eq!(store.node_name(|| "n1".into()).unwrap(), "n1");
            store.set_applied_index_sequence(41).unwrap();
            store.set_applied_index_sequence(42).unwrap();
            assert!(!store.outcome_processed("t-1").unwrap());
            store.mark_outcome_processed("t-1", 7).unwrap();
            store.flush().unwrap();
        }
        let store = Store::open(dir.path()).unwrap();
        assert_eq!(store.node_name(|| "other".into()).unwrap(), "n1", "the first name stays");
        assert_eq!(store.applied_index_sequence().unwrap(), 42);
        assert!(store.outcome_processed("t-1").unwrap());
        assert!(!store.outcome_processed("t-2").unwrap());
    }
}
