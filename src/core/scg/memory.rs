//! Learned routing memory: notes deposited after acting on a route, with a polarity
//! (`positive` or `dead_end`), anchored to graph nodes or recipes, labelled `ws:<id>`
//! (a workspace-bound run) or `session:<id>` (a plain session).
//!
//! At route time the top notes bias recipes up or down. A note's contribution to
//! every anchor it names is
//!
//! ```text
//! contribution = polarity_weight × relevance(query, note) × 0.5^(age_ms / half_life_ms)
//! ```
//!
//! with `polarity_weight` = [`POSITIVE_WEIGHT`] (+0.6) or [`DEAD_END_WEIGHT`] (−0.8),
//! `relevance` the cosine (or, with no embedder, word overlap) between the query and the
//! note's text (content and anchor names), clamped to [0, 1], and `age_ms` the time since
//! the note was last deposited (a repeat deposit refreshes it). The half-life defaults to
//! [`DEFAULT_HALF_LIFE_MS`] (7 days; `scg.memory_half_life_ms`). Only the
//! [`TOP_NOTES`] notes with the largest `relevance × decay` count, and anchors outside the
//! request's scope contribute nothing. A recipe's memory score is the sum of the
//! contributions of the distinct anchors among its key and its steps, clamped to
//! [−[`MAX_MEMORY_SCORE`], +[`MAX_MEMORY_SCORE`]] — a sum, so a dead end on one step is
//! not hidden by a positive note on another.
//!
//! Positive and dead-end notes with the same text are different notes (the polarity is
//! part of the id), so a merge never turns one into the other.

use serde::{Deserialize, Serialize};
use std::collections::{BTreeMap, BTreeSet};

/// Longest note text, in characters.
pub const MAX_NOTE_CHARS: usize = 400;
/// Weight of a positive note at full relevance and no age.
pub const POSITIVE_WEIGHT: f32 = 0.6;
/// Weight of a dead-end note at full relevance and no age.
pub const DEAD_END_WEIGHT: f32 = -0.8;
/// Default half-life of a note's influence: 7 days.
pub const DEFAULT_HALF_LIFE_MS: u64 = 7 * 24 * 3600 * 1000;
/// Notes that may bias one route.
pub const TOP_NOTES: usize = 10;
/// Bound on a recipe's memory score, either way.
pub const MAX_MEMORY_SCORE: f32 = 1.0;
/// Notes shown per observed node.
pub const NOTES_PER_NODE: usize = 5;

/// Whether acting on a pathway produced results.
#[derive(Clone, Copy, Debug, PartialEq, Eq, PartialOrd, Ord, Hash, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum Polarity {
    Positive,
    DeadEnd,
}

impl Polarity {
    /// Returns `positive` or `dead_end`.
    pub fn as_str(self) -> &'static str {
        match self {
            Polarity::Positive => "positive",
            Polarity::DeadEnd => "dead_end",
        }
    }

    /// Returns the weight a fresh, fully relevant note of this polarity contributes.
    pub fn weight(self) -> f32 {
        match self {
            Polarity::Positive => POSITIVE_WEIGHT,
            Polarity::DeadEnd => DEAD_END_WEIGHT,
        }
    }
}

/// A deposit as asked for, before its anchors are resolved.
#[derive(Clone, Debug, PartialEq)]
pub struct Deposit {
    pub content: String,
    pub polarity: Polarity,
    /// Node ids or source keys of nodes or recipes.
    pub anchors: Vec<String>,
    /// `ws:<id>` or `session:<id>`.
    pub label: String,
}

/// A stored memory note.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct Note {
    pub id: String,
    pub content: String,
    pub polarity: Polarity,
    /// Source keys of the nodes or recipes the note is about.
    pub anchors: Vec<String>,
    /// Every label it was deposited under (`ws:<id>`, `session:<id>`).
    pub labels: Vec<String>,
    pub first_at_ms: u64,
    /// The last deposit; the decay runs from here.
    pub last_at_ms: u64,
    /// How many times it was deposited.
    pub count: u32,
}

/// A stored note and whether it repeated an earlier one (the `capdex.v1.memory.deposit` reply).
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct Deposited {
    pub note: Note,
    pub merged: bool,
}

/// Why a deposit was refused.
#[derive(Clone, Debug, PartialEq, thiserror::Error)]
pub enum MemoryError {
    #[error("content must not be empty")]
    EmptyContent,
    #[error("content is {0} characters, more than the {MAX_NOTE_CHARS} allowed")]
    TooLong(usize),
    /// None, or more than `[limits] max_anchors`.
    #[error("a deposit needs 1 to {max} anchors (limits.max_anchors), got {found}")]
    Anchors { found: usize, max: usize },
    /// Not `ws:<id>` nor `session:<id>`, or its id is no SCG id (`core::scg::source_id_problem`:
    /// `[A-Za-z0-9._-]`, at most `[limits] max_id_bytes`).
    #[error("label {label:?} must be ws:<id> or session:<id>: {problem}")]
    BadLabel { label: String, problem: String },
    #[error("anchor {0:?} is no node or recipe in scope")]
    UnknownAnchor(String),
    /// Longer than a source key can be (`core::limits::max_capability_id_bytes`).
    #[error("anchors[] {0}")]
    AnchorTooLong(String),
}

impl MemoryError {
    /// Returns a stable code for callers that branch on the failure.
    pub fn code(&self) -> &'static str {
        match self {
            MemoryError::EmptyContent
            | MemoryError::TooLong(_)
            | MemoryError::Anchors { .. }
            | MemoryError::AnchorTooLong(_) => "invalid_deposit",
            MemoryError::BadLabel { .. } => "bad_label",
            MemoryError::UnknownAnchor(_) => "unknown_anchor",
        }
    }
}

/// Checks a label: `ws:<id>` or `session:<id>`, the id an SCG id of at most `max_id_bytes` bytes.
pub fn validate_label(label: &str, max_id_bytes: usize) -> Result<(), MemoryError> {
    let bad = |problem: String| Err(MemoryError::BadLabel { label: label.to_string(), problem });
    match label.strip_prefix("ws:").or_else(|| label.strip_prefix("session:")) {
        None => bad("no ws: or session: prefix".to_string()),
        Some(id) => super::source_id_problem(id, max_id_bytes).map_or(Ok(()), |problem| bad(format!("id {problem}"))),
    }
}

/// Checks a deposit's text, anchors (1 to `max_anchors`, each no longer than a
/// capability id) and label (its id within `max_id_bytes`), `[limits]`;
/// anchors are resolved by the caller.
pub fn validate(deposit: &Deposit, limits: &crate::core::limits::Limits) -> Result<(), MemoryError> {
    let max_id_bytes = limits.max_id_bytes;
    let content = deposit.content.trim();
    if content.is_empty() {
        return Err(MemoryError::EmptyContent);
    }
    let chars = content.chars().count();
    if chars > MAX_NOTE_CHARS {
        return Err(MemoryError::TooLong(chars));
    }
    if deposit.anchors.is_empty() || deposit.anchors.len() > limits.max_anchors {
        return Err(MemoryError::Anchors { found: deposit.anchors.len(), max: limits.max_anchors });
    }
    // An anchor is a node id or a source key (a source id, '#', a name): no longer than a capability id.
    if let Some(problem) =
        deposit.anchors.iter().find_map(|anchor| crate::core::limits::capability_id_too_long(anchor, max_id_bytes))
    {
        return Err(MemoryError::AnchorTooLong(problem));
    }
    validate_label(&deposit.label, max_id_bytes)
}

/// Returns `hex(sha1(polarity | lower-cased trimmed content))[:16]`.
pub fn note_id(content: &str, polarity: Polarity) -> String {
    let text = format!("{}|{}", polarity.as_str(), content.trim().to_lowercase());
    sha1_smol::Sha1::from(text).digest().to_string()[..16].to_string()
}

/// Merges a validated deposit (with anchors resolved to source keys) into the note it
/// repeats, if any: anchors and labels are united, the count grows, the decay restarts.
pub fn merge(existing: Option<Note>, deposit: &Deposit, anchors: &[String], now_ms: u64) -> Note {
    let content = deposit.content.trim().to_string();
    let id = note_id(&content, deposit.polarity);
    let mut note = existing.filter(|note| note.id == id).unwrap_or(Note {
        id,
        content,
        polarity: deposit.polarity,
        anchors: Vec::new(),
        labels: Vec::new(),
        first_at_ms: now_ms,
        last_at_ms: now_ms,
        count: 0,
    });
    let anchors: BTreeSet<String> = note.anchors.iter().chain(anchors).cloned().collect();
    let labels: BTreeSet<String> = note.labels.iter().cloned().chain([deposit.label.clone()]).collect();
    note.anchors = anchors.into_iter().collect();
    note.labels = labels.into_iter().collect();
    note.last_at_ms = note.last_at_ms.max(now_ms);
    note.count = note.count.saturating_add(1);
    note
}

/// Returns `0.5^(age_ms / half_life_ms)`; a note from the future counts as new.
pub fn decay(age_ms: u64, half_life_ms: u64) -> f32 {
    if half_life_ms == 0 {
        return if age_ms == 0 { 1.0 } else { 0.0 };
    }
    0.5f64.powf(age_ms as f64 / half_life_ms as f64) as f32
}

/// A note's decayed weight at `now_ms`, before relevance.
pub fn strength(note: &Note, now_ms: u64, half_life_ms: u64) -> f32 {
    note.polarity.weight() * decay(now_ms.saturating_sub(note.last_at_ms), half_life_ms)
}

/// The text a note is matched against queries with: its content, then its anchors' names.
pub fn note_text(note: &Note) -> String {
    let names: Vec<&str> =
        note.anchors.iter().map(|anchor| anchor.split_once('#').map_or(anchor.as_str(), |(_, name)| name)).collect();
    format!("{}\n{}", note.content, names.join(" "))
}

/// Memory's bias for one route: a contribution per anchored source key.
#[derive(Clone, Debug, Default, PartialEq)]
pub struct MemoryBias {
    pub per_anchor: BTreeMap<String, f32>,
    /// Ids of the notes that counted.
    pub notes: Vec<String>,
}

impl MemoryBias {
    /// Computes the bias: `relevance` gives each note's (by position and note) relevance to the query in [0, 1],
    /// `permits` whether an anchor's source is in scope.
    pub fn compute(
        notes: &[Note],
        relevance: impl Fn(usize, &Note) -> f32,
        permits: impl Fn(&str) -> bool,
        now_ms: u64,
        half_life_ms: u64,
    ) -> MemoryBias {
        let mut scored: Vec<(f32, f32, &Note)> = notes
            .iter()
            .enumerate()
            .filter_map(|(at, note)| {
                let relevance = relevance(at, note).clamp(0.0, 1.0);
                let decayed = decay(now_ms.saturating_sub(note.last_at_ms), half_life_ms);
                (relevance > 0.0 && decayed > 0.0).then_some((relevance * decayed, relevance, note))
            })
            .collect();
        scored.sort_by(|a, b| b.0.total_cmp(&a.0).then_with(|| a.2.id.cmp(&b.2.id)));
        scored.truncate(TOP_NOTES);
        let mut bias = MemoryBias::default();
        for (weight, _, note) in scored {
            let contribution = note.polarity.weight() * weight;
            for anchor in note.anchors.iter().filter(|anchor| permits(anchor.split('#').next().unwrap_or(anchor))) {
                *bias.per_anchor.entry(anchor.clone()).or_insert(0.0) += contribution;
            }
            bias.notes.push(note.id.clone());
        }
        bias
    }

    /// Returns the memory score of a recipe: the clamped sum over its distinct anchors.
    pub fn for_recipe(&self, recipe_key: &str, steps: &[String]) -> f32 {
        let keys: BTreeSet<&str> = std::iter::once(recipe_key).chain(steps.iter().map(String::as_str)).collect();
        let sum: f32 = keys.iter().filter_map(|key| self.per_anchor.get(*key)).sum();
        sum.clamp(-MAX_MEMORY_SCORE, MAX_MEMORY_SCORE)
    }

    /// Returns whether no note counted.
    pub fn is_empty(&self) -> bool {
        self.per_anchor.is_empty()
    }
}

/// Returns up to [`NOTES_PER_NODE`] notes anchored at `source_key`, strongest (by decayed weight) first.
pub fn notes_at<'a>(notes: &'a [Note], source_key: &str, now_ms: u64, half_life_ms: u64) -> Vec<&'a Note> {
    let mut anchored: Vec<&Note> = notes.iter().filter(|note| note.anchors.iter().any(|a| a == source_key)).collect();
    anchored.sort_by(|a, b| {
        strength(b, now_ms, half_life_ms)
            .abs()
            .total_cmp(&strength(a, now_ms, half_life_ms).abs())
            .then_with(|| a.id.cmp(&b.id))
    });
    anchored.truncate(NOTES_PER_NODE);
    anchored
}

#[cfg(test)]
mod tests {
    use super::*;
    use proptest::prelude::*;

    const DAY: u64 = 24 * 3600 * 1000;

    fn at(max_id_bytes: usize) -> crate::core::limits::Limits {
        crate::core::limits::Limits { max_id_bytes, ..crate::core::limits::Limits::default() }
    }

    fn deposit(content: &str, polarity: Polarity, label: &str) -> Deposit {
        Deposit { content: content.into(), polarity, anchors: vec!["gitea#getIssue".into()], label: label.into() }
    }

    #[test]
    fn deposits_are_validated() {
        assert!(validate(&deposit("found the assignee", Polarity::Positive, "ws:acme"), &at(128)).is_ok());
        assert!(validate(&deposit("x", Polarity::DeadEnd, "session:s-1"), &at(128)).is_ok());
        assert_eq!(validate(&deposit("  ", Polarity::Positive, "ws:a"), &at(128)), Err(MemoryError::EmptyContent));
        assert_eq!(validate(&deposit("x", Polarity::Positive, "user:a"), &at(128)).unwrap_err().code(), "bad_label");
        assert_eq!(validate(&deposit("x", Polarity::Positive, "ws:"), &at(128)).unwrap_err().code(), "bad_label");
        assert_eq!(validate(&deposit("x", Polarity::Positive, "ws:a b"), &at(128)).unwrap_err().code(), "bad_label");
        let long = "a".repeat(MAX_NOTE_CHARS + 1);
        assert_eq!(
            validate(&deposit(&long, Polarity::Positive, "ws:a"), &at(128)),
            Err(MemoryError::TooLong(MAX_NOTE_CHARS + 1))
        );
        let mut none = deposit("x", Polarity::Positive, "ws:a");
        none.anchors.clear();
        assert_eq!(validate(&none, &at(128)), Err(MemoryError::Anchors { found: 0, max: 8 }));
        none.anchors = vec!["a#b".into(); 8];
        assert_eq!(validate(&none, &at(128)), Ok(()), "limits.max_anchors (8 by default)");
        none.anchors.push("a#b".into());
        let over = validate(&none, &at(128)).unwrap_err();
        assert_eq!(over, MemoryError::Anchors { found: 9, max: 8 });
        assert_eq!(over.to_string(), "a deposit needs 1 to 8 anchors (limits.max_anchors), got 9");
        let two = crate::core::limits::Limits { max_anchors: 2, ..at(128) };
        none.anchors.truncate(2);
        assert_eq!(validate(&none, &two), Ok(()));
        none.anchors.push("a#b".into());
        assert_eq!(validate(&none, &two), Err(MemoryError::Anchors { found: 3, max: 2 }));
        let longest = crate::core::limits::max_capability_id_bytes(64);
        none.anchors = vec!["a".repeat(longest)];
        assert_eq!(validate(&none, &at(64)), Ok(()), "an anchor as long as a capability id");
        none.anchors.push("a".repeat(longest + 1));
        let err = validate(&none, &at(64)).unwrap_err();
        assert_eq!(err.code(), "invalid_deposit");
        assert!(
            err.to_string().starts_with(&format!("anchors[] is {} bytes, over limits.max_id_bytes", longest + 1)),
            "{err}"
        );
    }

    #[test]
    fn a_label_s_id_is_refused_one_byte_over_max_id_bytes_naming_the_setting() {
        for max in [64, 70, 256] {
            for prefix in ["ws:", "session:"] {
                let label = |len: usize| format!("{prefix}{}", "w".repeat(len));
                assert_eq!(validate_label(&label(max), max), Ok(()), "{prefix} {max}");
                let refused = validate_label(&label(max + 1), max).unwrap_err();
                assert_eq!(refused.code(), "bad_label");
                let text = refused.to_string();
                let expected = format!("id is {} bytes, over limits.max_id_bytes: at most {max}", max + 1);
                assert!(text.ends_with(&expected), "{text}");
            }
        }
    }

    #[test]
    fn repeats_merge_and_polarity_is_part_of_identity() {
        let first = deposit("getIssue gives the assignee", Polarity::Positive, "ws:acme");
        let note = merge(None, &first, &["gitea#getIssue".into()], 10);
        let again = deposit("  GetIssue gives the assignee ", Polarity::Positive, "session:s1");
        let merged = merge(Some(note.clone()), &again, &["gitea#Issue".into()], 20);
        assert_eq!(merged.id, note.id);
        assert_eq!((merged.count, merged.first_at_ms, merged.last_at_ms), (2, 10, 20));
        assert_eq!(merged.labels, ["session:s1", "ws:acme"]);
        assert_eq!(merged.anchors, ["gitea#Issue", "gitea#getIssue"]);
        let dead = deposit("getIssue gives the assignee", Polarity::DeadEnd, "ws:acme");
        assert_ne!(note_id(&dead.content, dead.polarity), note.id);
        let fresh = merge(Some(merged), &dead, &["gitea#getIssue".into()], 30);
        assert_eq!(
            (fresh.polarity, fresh.count),
            (Polarity::DeadEnd, 1),
            "a dead end never merges into a positive note"
        );
    }

    #[test]
    fn influence_halves_every_half_life() {
        assert_eq!(decay(0, DAY), 1.0);
        assert!((decay(DAY, DAY) - 0.5).abs() < 1e-6);
        assert!((decay(3 * DAY, DAY) - 0.125).abs() < 1e-6);
        assert_eq!(decay(1, 0), 0.0);
        let note = merge(None, &deposit("x", Polarity::DeadEnd, "ws:a"), &["s#a".into()], 0);
        assert!((strength(&note, 7 * DAY, 7 * DAY) - DEAD_END_WEIGHT / 2.0).abs() < 1e-6);
    }

    #[test]
    fn bias_sums_anchors_respects_scope_and_keeps_the_top_notes() {
        let positive = merge(None, &deposit("good", Polarity::Positive, "ws:a"), &["s#a".into()], 0);
        let dead = merge(None, &deposit("bad", Polarity::DeadEnd, "ws:a"), &["s#b".into(), "t#c".into()], 0);
        let notes = vec![positive, dead];
        let bias = MemoryBias::compute(&notes, |_, _| 1.0, |source| source == "s", 0, DAY);
        assert_eq!(bias.per_anchor.get("s#a"), Some(&POSITIVE_WEIGHT));
        assert_eq!(bias.per_anchor.get("s#b"), Some(&DEAD_END_WEIGHT));
        assert!(!bias.per_anchor.contains_key("t#c"), "out-of-scope anchors contribute nothing");
        let both = bias.for_recipe("s#a", &["s#a".into(), "s#b".into()]);
        assert!((both - (POSITIVE_WEIGHT + DEAD_END_WEIGHT)).abs() < 1e-6, "a sum, not the max");
        assert_eq!(bias.for_recipe("s#z", &[]), 0.0);
        let irrelevant = MemoryBias::compute(&notes, |_, _| 0.0, |_| true, 0, DAY);
        assert!(irrelevant.is_empty());
        let many: Vec<Note> = (0..30)
            .map(|at| merge(None, &deposit(&format!("n{at}"), Polarity::Positive, "ws:a"), &["s#a".into()], at))
            .collect();
        let bias = MemoryBias::compute(&many, |_, _| 1.0, |_| true, 30, DAY);
        assert_eq!(bias.notes.len(), TOP_NOTES);
        assert!(bias.for_recipe("s#a", &[]) <= MAX_MEMORY_SCORE);
    }

    proptest! {
        #[test]
        fn memory_scores_are_bounded(weights in prop::collection::vec((any::<bool>(), 0u64..100 * DAY, 0f32..1.0), 0..40)) {
            let notes: Vec<Note> = weights
                .iter()
                .enumerate()
                .map(|(at, (positive, age, _))| {
                    let polarity = if *positive { Polarity::Positive } else { Polarity::DeadEnd };
                    merge(None, &deposit(&format!("n{at}"), polarity, "ws:a"), &["s#a".into(), "s#b".into()], 100 * DAY - age)
                })
                .collect();
            let bias = MemoryBias::compute(&notes, |_, note| weights[note.content[1..].parse::<usize>().unwrap()].2, |_| true, 100 * DAY, 7 * DAY);
            let score = bias.for_recipe("s#a", &["s#b".into()]);
            prop_assert!(score.abs() <= MAX_MEMORY_SCORE && score.is_finite());
            prop_assert!(bias.notes.len() <= TOP_NOTES);
        }
    }
}
