//! What the SCG's shared state means when several nodes hold it: the value a
//! mapped source is shared as ([`SharedSource`]), how a node's result is folded
//! into what the shared copy already holds ([`fold_source`], [`fold_note`]),
//! and what a change read from the shared copy does to a node's own graph
//! ([`source_change`], [`note_change`], [`put_source`]).
//!
//! The shared copy is the truth: a node maps or deposits locally, folds its
//! result into the shared value (so a concurrent map or deposit on another node
//! is kept, not overwritten), and every node applies each shared value as it is
//! (never merging it again, so applying it twice changes nothing).

use crate::core::scg::memory::{merge, Deposit, Note};
use crate::core::scg::model::StoredSource;
use crate::core::sources::SourceTool;
use serde::{Deserialize, Serialize};

/// A mapped source as every node needs it: its stored graph (for route,
/// observe and memory anchors) and the tools its text offers (for the
/// catalog and the dispatch records under `<source_id>#<Name>`).
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct SharedSource {
    pub stored: StoredSource,
    #[serde(default)]
    pub tools: Vec<SourceTool>,
}

/// What applying one shared change does to a node's copy.
#[derive(Clone, Debug, PartialEq)]
pub enum Apply<T> {
    /// The node holds exactly this already (or the change names nothing it holds).
    Nothing,
    /// Put this value in place of the node's.
    Put(T),
    /// Remove the node's value.
    Remove,
}

/// Folds this node's map of a source into the shared copy of it: the new
/// graph and time, with the workspaces of both (sorted, without repeats), so a
/// map on another node never disables a source a workspace enabled.
pub fn fold_source(local: StoredSource, shared: Option<&StoredSource>) -> StoredSource {
    let mut workspaces = local.workspaces;
    if let Some(shared) = shared.filter(|shared| shared.graph.source_id == local.graph.source_id) {
        workspaces.extend(shared.workspaces.iter().cloned());
    }
    workspaces.sort();
    workspaces.dedup();
    StoredSource { workspaces, ..local }
}

/// Folds a note deposited on this node (`local`, under `label`) into the shared
/// copy: the shared note merged with this deposit (anchors and labels united,
/// the count one more, the decay restarted), or this node's note when none is shared.
pub fn fold_note(shared: Option<Note>, local: &Note, label: &str) -> Note {
    match shared.filter(|shared| shared.id == local.id) {
        None => local.clone(),
        Some(shared) => {
            let deposit = Deposit {
                content: local.content.clone(),
                polarity: local.polarity,
                anchors: Vec::new(),
                label: label.to_string(),
            };
            merge(Some(shared), &deposit, &local.anchors, local.last_at_ms)
        }
    }
}

/// What a shared source (`None`: its key was deleted) does to the one a node holds.
pub fn source_change(held: Option<&StoredSource>, shared: Option<StoredSource>) -> Apply<StoredSource> {
    match (held, shared) {
        (Some(held), Some(shared)) if *held == shared => Apply::Nothing,
        (_, Some(shared)) => Apply::Put(shared),
        (Some(_), None) => Apply::Remove,
        (None, None) => Apply::Nothing,
    }
}

/// What a shared note (`None`: its key was deleted) does to the one a node holds.
pub fn note_change(held: Option<&Note>, shared: Option<Note>) -> Apply<Note> {
    match (held, shared) {
        (Some(held), Some(shared)) if *held == shared => Apply::Nothing,
        (_, Some(shared)) => Apply::Put(shared),
        (Some(_), None) => Apply::Remove,
        (None, None) => Apply::Nothing,
    }
}

/// Puts `source` among `sources` (sorted by id) as it is, in place of any
/// source of its id; the result stays sorted.
pub fn put_source(sources: Vec<StoredSource>, source: StoredSource) -> Vec<StoredSource> {
    let mut sources: Vec<StoredSource> =
        sources.into_iter().filter(|held| held.graph.source_id != source.graph.source_id).collect();
    let at = sources.partition_point(|held| held.graph.source_id < source.graph.source_id);
    sources.insert(at, source);
    sources
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::core::scg::memory::{note_id, Polarity};
    use crate::core::scg::model::{SourceGraph, SourceKind};

    fn source(id: &str, drift: &str, workspaces: &[&str], at_ms: u64) -> StoredSource {
        let graph = SourceGraph {
            source_id: id.into(),
            kind: SourceKind::Sql,
            drift_hash: drift.into(),
            nodes: vec![],
            edges: vec![],
            recipes: vec![],
        };
        StoredSource { graph, workspaces: workspaces.iter().map(|w| w.to_string()).collect(), mapped_at_ms: at_ms }
    }

    fn note(content: &str, anchors: &[&str], labels: &[&str], count: u32, at_ms: u64) -> Note {
        Note {
            id: note_id(content, Polarity::DeadEnd),
            content: content.into(),
            polarity: Polarity::DeadEnd,
            anchors: anchors.iter().map(|a| a.to_string()).collect(),
            labels: labels.iter().map(|l| l.to_string()).collect(),
            first_at_ms: at_ms,
            last_at_ms: at_ms,
            count,
        }
    }

    #[test]
    fn a_map_keeps_the_workspaces_another_node_enabled() {
        let shared = source("db", "h1", &["w1", "w3"], 5);
        let folded = fold_source(source("db", "h2", &["w2", "w1"], 9), Some(&shared));
        assert_eq!(folded, source("db", "h2", &["w1", "w2", "w3"], 9));
        assert_eq!(fold_source(source("db", "h2", &["w2"], 9), None), source("db", "h2", &["w2"], 9));
        let other = source("other", "h1", &["w9"], 5);
        assert_eq!(fold_source(source("db", "h2", &[], 9), Some(&other)).workspaces, Vec::<String>::new());
    }

    #[test]
    fn a_deposit_counts_once_more_on_the_shared_note() {
        let local = note("tag is empty", &["db#a"], &["ws:w1"], 1, 20);
        assert_eq!(fold_note(None, &local, "ws:w1"), local);
        let shared = note("tag is empty", &["db#b"], &["session:s"], 3, 10);
        let folded = fold_note(Some(shared), &local, "ws:w1");
        assert_eq!(folded.anchors, ["db#a", "db#b"]);
        assert_eq!(folded.labels, ["session:s", "ws:w1"]);
        assert_eq!((folded.count, folded.first_at_ms, folded.last_at_ms), (4, 10, 20));
        let unrelated = note("something else", &["db#c"], &["ws:w2"], 7, 10);
        assert_eq!(fold_note(Some(unrelated), &local, "ws:w1"), local);
    }

    #[test]
    fn a_change_puts_removes_or_does_nothing() {
        let held = source("db", "h1", &["w1"], 5);
        assert_eq!(source_change(Some(&held), Some(held.clone())), Apply::Nothing);
        let newer = source("db", "h1", &["w1", "w2"], 5);
        assert_eq!(source_change(Some(&held), Some(newer.clone())), Apply::Put(newer.clone()));
        assert_eq!(source_change(None, Some(newer.clone())), Apply::Put(newer));
        assert_eq!(source_change(Some(&held), None), Apply::Remove);
        assert_eq!(source_change(None, None), Apply::Nothing);
        let note_held = note("x", &["db#a"], &["ws:w"], 1, 1);
        assert_eq!(note_change(Some(&note_held), Some(note_held.clone())), Apply::Nothing);
        let merged = note("x", &["db#a"], &["ws:w"], 2, 3);
        assert_eq!(note_change(Some(&note_held), Some(merged.clone())), Apply::Put(merged));
        assert_eq!(note_change(Some(&note_held), None), Apply::Remove);
        assert_eq!(note_change(None, None), Apply::Nothing);
    }

    #[test]
    fn put_replaces_in_id_order() {
        let sources = vec![source("a", "h", &[], 1), source("c", "h", &[], 1)];
        let put = put_source(sources.clone(), source("b", "h", &["w"], 2));
        let ids: Vec<&str> = put.iter().map(|s| s.graph.source_id.as_str()).collect();
        assert_eq!(ids, ["a", "b", "c"]);
        let replaced = put_source(put, source("c", "h2", &[], 3));
        assert_eq!((replaced.len(), replaced[2].graph.drift_hash.as_str()), (3, "h2"));
    }
}
