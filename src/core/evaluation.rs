//! Retrieval evaluation: the benchmark tool and query records, their mapping
//! to descriptors, and the quality metrics of `../shared/data/bench/eval.py`.
//!
//! Definitions (binary relevance; `R` is the set of relevant ids; the ranked
//! list is deduplicated keeping first occurrences; a query with no ranking
//! scores 0 everywhere):
//!
//! ```text
//! Recall@k = |R ∩ top_k| / |R|
//! NDCG@k   = DCG@k / IDCG@k,  DCG@k = Σ_{i<k, ranked[i] ∈ R} 1/log2(i+2),
//!                             IDCG@k = Σ_{i<min(k,|R|)} 1/log2(i+2)
//! MRR      = 1/(1 + rank of the first relevant id) over the whole list, 0 if none
//! ```
//!
//! Each is averaged over every query (macro average) and reported ×100.

use crate::core::descriptor::{display_name_from, CapabilityDescriptor, CapabilityKind, DefinitionRef};
use serde::{Deserialize, Serialize};
use serde_json::{json, Map, Value};
use std::collections::{BTreeMap, HashSet};

/// One line of a `tools.jsonl`. Only `id` is required: a field other
/// converters write as `null` or leave out reads as empty, and a record
/// without a `name` is named by its `id`.
#[derive(Clone, Debug, PartialEq, Deserialize)]
pub struct ToolRecord {
    pub id: String,
    #[serde(default, deserialize_with = "null_as_default")]
    pub name: String,
    #[serde(default, deserialize_with = "null_as_default")]
    pub description: String,
    #[serde(default)]
    pub category: Option<String>,
    #[serde(default, deserialize_with = "null_as_default")]
    pub tags: Vec<String>,
    #[serde(default, deserialize_with = "null_as_default")]
    pub params: Vec<ToolParam>,
}

/// One parameter of a [`ToolRecord`].
#[derive(Clone, Debug, PartialEq, Deserialize)]
pub struct ToolParam {
    pub name: String,
    #[serde(default, rename = "type")]
    pub kind: Option<String>,
    #[serde(default)]
    pub description: Option<String>,
    #[serde(default, deserialize_with = "null_as_default")]
    pub required: bool,
}

/// A field that may be `null`: it reads as its type's default, as a missing
/// one does with `#[serde(default)]`.
fn null_as_default<'de, D, T>(deserializer: D) -> Result<T, D::Error>
where
    D: serde::Deserializer<'de>,
    T: Default + Deserialize<'de>,
{
    Ok(Option::<T>::deserialize(deserializer)?.unwrap_or_default())
}

/// One line of a `queries.jsonl`.
///
/// `relevant` may be empty: no capability fits the request, and the right
/// answer is an empty ranking ("nothing fits"). With `tools`, the request is
/// ranked against those tools alone instead of the tools file (BFCL's
/// `irrelevance` category gives each request its own few functions).
#[derive(Clone, Debug, PartialEq, Deserialize)]
pub struct QueryRecord {
    pub query: String,
    pub relevant: Vec<String>,
    #[serde(default)]
    pub tools: Option<Vec<ToolRecord>>,
    /// The part of the set the request comes from (`small-talk`,
    /// `irrelevance`, ...): "nothing fits" is also reported per split.
    #[serde(default)]
    pub split: Option<String>,
}

impl QueryRecord {
    /// Whether some capability fits the request.
    pub fn answerable(&self) -> bool {
        !self.relevant.is_empty()
    }
}

/// One line of a run file.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
pub struct RunLine {
    pub query_idx: usize,
    pub ranked: Vec<String>,
}

impl ToolRecord {
    /// Maps the record to a tool descriptor whose id is the record's id, so a
    /// run file names tools the way the query file does; parameters become
    /// the properties of its input schema, in order.
    pub fn to_descriptor(&self) -> CapabilityDescriptor {
        let mut properties = Map::new();
        for param in &self.params {
            let mut property = Map::new();
            if let Some(kind) = &param.kind {
                property.insert("type".into(), Value::String(kind.clone()));
            }
            if let Some(description) = &param.description {
                property.insert("description".into(), Value::String(description.clone()));
            }
            properties.insert(param.name.clone(), Value::Object(property));
        }
        let required: Vec<&str> = self.params.iter().filter(|p| p.required).map(|p| p.name.as_str()).collect();
        let name = if self.name.trim().is_empty() { &self.id } else { &self.name };
        CapabilityDescriptor {
            id: self.id.clone(),
            kind: CapabilityKind::Tool,
            name: name.clone(),
            display_name: display_name_from(name),
            description: self.description.clone(),
            category: self.category.clone().unwrap_or_default(),
            tags: self.tags.clone(),
            required_secrets: vec![],
            required_tools: vec![],
            available: true,
            has_side_effects: None,
            full_schema: (!self.params.is_empty())
                .then(|| json!({"type": "object", "properties": properties, "required": required}).into()),
            full_content: None,
            definition_ref: DefinitionRef::Builtin,
        }
    }
}

/// Macro-averaged metrics ×100, as `eval.py` prints them.
#[derive(Clone, Debug, Default, PartialEq, Serialize)]
#[serde(rename_all = "camelCase")]
pub struct Metrics {
    pub queries: usize,
    #[serde(rename = "recallAt1")]
    pub recall_at_1: f64,
    #[serde(rename = "recallAt5")]
    pub recall_at_5: f64,
    #[serde(rename = "recallAt10")]
    pub recall_at_10: f64,
    #[serde(rename = "ndcgAt5")]
    pub ndcg_at_5: f64,
    #[serde(rename = "ndcgAt10")]
    pub ndcg_at_10: f64,
    pub mrr: f64,
}

/// The metrics of one query, as fractions.
#[derive(Clone, Copy, Debug, Default, PartialEq)]
pub struct QueryScores {
    pub recall_at_1: f64,
    pub recall_at_5: f64,
    pub recall_at_10: f64,
    pub ndcg_at_5: f64,
    pub ndcg_at_10: f64,
    pub mrr: f64,
}

/// Scores one ranked list against the relevant ids.
///
/// # Examples
/// ```
/// use capdex::core::evaluation::score_query;
/// let scores = score_query(&["b".into(), "a".into()], &["a".into()]);
/// assert_eq!(scores.mrr, 0.5);
/// assert_eq!(scores.recall_at_1, 0.0);
/// ```
pub fn score_query(ranked: &[String], relevant: &[String]) -> QueryScores {
    let relevant: HashSet<&str> = relevant.iter().map(String::as_str).collect();
    if relevant.is_empty() {
        return QueryScores::default();
    }
    let mut seen: HashSet<&str> = HashSet::new();
    let ranked: Vec<&str> = ranked.iter().map(String::as_str).filter(|id| seen.insert(id)).collect();
    let recall =
        |k: usize| ranked.iter().take(k).filter(|id| relevant.contains(*id)).count() as f64 / relevant.len() as f64;
    let ndcg = |k: usize| {
        let dcg: f64 = ranked
            .iter()
            .take(k)
            .enumerate()
            .filter(|(_, id)| relevant.contains(*id))
            .map(|(i, _)| 1.0 / ((i + 2) as f64).log2())
            .sum();
        let ideal: f64 = (0..k.min(relevant.len())).map(|i| 1.0 / ((i + 2) as f64).log2()).sum();
        if ideal > 0.0 {
            dcg / ideal
        } else {
            0.0
        }
    };
    let mrr = ranked.iter().position(|id| relevant.contains(id)).map(|i| 1.0 / (i + 1) as f64).unwrap_or(0.0);
    QueryScores {
        recall_at_1: recall(1),
        recall_at_5: recall(5),
        recall_at_10: recall(10),
        ndcg_at_5: ndcg(5),
        ndcg_at_10: ndcg(10),
        mrr,
    }
}

/// Averages per-query scores over `n_queries` (queries missing from `scores` count 0) and scales ×100.
pub fn aggregate(scores: &[QueryScores], n_queries: usize) -> Metrics {
    let n = n_queries.max(1) as f64;
    let mean = |field: fn(&QueryScores) -> f64| 100.0 * scores.iter().map(field).sum::<f64>() / n;
    Metrics {
        queries: n_queries,
        recall_at_1: mean(|s| s.recall_at_1),
        recall_at_5: mean(|s| s.recall_at_5),
        recall_at_10: mean(|s| s.recall_at_10),
        ndcg_at_5: mean(|s| s.ndcg_at_5),
        ndcg_at_10: mean(|s| s.ndcg_at_10),
        mrr: mean(|s| s.mrr),
    }
}

/// How discovery's Tier 1 treats requests, over one evaluation: requests
/// no capability fits should get an empty Tier 1, requests some capability
/// fits should keep it there.
#[derive(Clone, Debug, Default, PartialEq, Serialize)]
#[serde(rename_all = "camelCase")]
pub struct NothingFits {
    /// Requests with `"relevant": []`.
    pub unanswerable: usize,
    /// Of those, the ones whose Tier 1 was empty.
    pub answered_empty: usize,
    /// `answered_empty / unanswerable` ×100 (0 without unanswerable requests).
    pub answered_empty_share: f64,
    /// Answerable requests with a relevant capability among the first
    /// `tier1TopK` hits when no relevance minimum applies.
    pub answerable_in_reach: usize,
    /// Of those, the ones whose Tier 1 (with `tier1MinRelevance`) still holds one.
    pub kept: usize,
    /// `kept / answerable_in_reach` ×100 (100 without such requests).
    pub kept_share: f64,
    /// Answerable requests whose Tier 1 without the chatter gate
    /// (`chatterGate`) holds a relevant capability.
    pub kept_without_gate: usize,
    /// Of those, the ones whose Tier 1 with the gate still holds one.
    pub kept_with_gate: usize,
    /// `kept_with_gate / kept_without_gate` ×100: what the gate itself keeps
    /// (100 without such requests, and with the gate off).
    pub gate_kept_share: f64,
    /// The unanswerable requests of each split (requests without one are
    /// counted above only).
    pub unanswerable_by_split: BTreeMap<String, AnsweredEmpty>,
}

/// How many requests of one split nothing fits were answered empty.
#[derive(Clone, Debug, Default, PartialEq, Serialize)]
#[serde(rename_all = "camelCase")]
pub struct AnsweredEmpty {
    pub unanswerable: usize,
    pub answered_empty: usize,
    /// `answered_empty / unanswerable` ×100.
    pub answered_empty_share: f64,
}

impl NothingFits {
    /// Counts one request no capability fits, from `split` if it names one.
    pub fn unanswerable(&mut self, split: Option<&str>, tier1_empty: bool) {
        self.unanswerable += 1;
        self.answered_empty += usize::from(tier1_empty);
        self.answered_empty_share = share(self.answered_empty, self.unanswerable, 0.0);
        if let Some(split) = split {
            let of_split = self.unanswerable_by_split.entry(split.to_string()).or_default();
            of_split.unanswerable += 1;
            of_split.answered_empty += usize::from(tier1_empty);
            of_split.answered_empty_share = share(of_split.answered_empty, of_split.unanswerable, 0.0);
        }
    }

    /// Counts one answerable request: whether a relevant capability was in
    /// Tier 1 without the relevance minimum, whether it is with the minimum
    /// and without the chatter gate, and whether it is with both.
    pub fn answerable(&mut self, in_reach: bool, kept_without_gate: bool, kept: bool) {
        if in_reach {
            self.answerable_in_reach += 1;
            self.kept += usize::from(kept);
        }
        if kept_without_gate {
            self.kept_without_gate += 1;
            self.kept_with_gate += usize::from(kept);
        }
        self.kept_share = share(self.kept, self.answerable_in_reach, 100.0);
        self.gate_kept_share = share(self.kept_with_gate, self.kept_without_gate, 100.0);
    }
}

fn share(part: usize, whole: usize, otherwise: f64) -> f64 {
    if whole == 0 {
        otherwise
    } else {
        100.0 * part as f64 / whole as f64
    }
}

/// Splits `0..n` into two halves of a seeded shuffle (the first half has
/// `n / 2` indices), each half sorted. The shuffle is Fisher–Yates over
/// SplitMix64, so a seed gives the same halves on every platform.
///
/// # Examples
/// ```
/// use capdex::core::evaluation::seeded_halves;
/// let (first, second) = seeded_halves(5, 7);
/// assert_eq!((first.len(), second.len()), (2, 3));
/// assert_eq!(seeded_halves(5, 7), (first, second));
/// ```
pub fn seeded_halves(n: usize, seed: u64) -> (Vec<usize>, Vec<usize>) {
    let order = seeded_order(n, seed);
    let mut first = order[..n / 2].to_vec();
    let mut second = order[n / 2..].to_vec();
    first.sort_unstable();
    second.sort_unstable();
    (first, second)
}

/// `0..n` in an order shuffled by `seed` (Fisher–Yates over SplitMix64).
pub fn seeded_order(n: usize, seed: u64) -> Vec<usize> {
    let mut state = seed;
    let mut next = || {
        state = state.wrapping_add(0x9E37_79B9_7F4A_7C15);
        let mut z = state;
        z = (z ^ (z >> 30)).wrapping_mul(0xBF58_476D_1CE4_E5B9);
        z = (z ^ (z >> 27)).wrapping_mul(0x94D0_49BB_1331_11EB);
        z ^ (z >> 31)
    };
    let mut order: Vec<usize> = (0..n).collect();
    for i in (1..n).rev() {
        let j = (next() % (i as u64 + 1)) as usize;
        order.swap(i, j);
    }
    order
}

/// The mean over `succeeded` of the reciprocal of its rank in `ranked`
/// (0 for one not in it): how high the capabilities that did the job were.
pub fn mean_reciprocal_rank(ranked: &[String], succeeded: &[&str]) -> f64 {
    if succeeded.is_empty() {
        return 0.0;
    }
    let sum: f64 =
        succeeded.iter().map(|id| ranked.iter().position(|hit| hit == id).map_or(0.0, |i| 1.0 / (i + 1) as f64)).sum();
    sum / succeeded.len() as f64
}

/// The outcomes the replay protocol feeds in for one request of the first
/// half, as `(capability id, score)`: success (1) for every relevant
/// capability (the agent used them and the task worked), and failure (0)
/// for the best-ranked wrong capability above the first relevant one (the
/// agent tried it first and it did not do the job), if there is one.
///
/// # Examples
/// ```
/// use capdex::core::evaluation::replay_outcomes;
/// let ids = |t: &str| t.split_whitespace().map(String::from).collect::<Vec<_>>();
/// assert_eq!(replay_outcomes(&ids("x a y"), &ids("a")), vec![("a".to_string(), 1.0), ("x".to_string(), 0.0)]);
/// assert_eq!(replay_outcomes(&ids("a x"), &ids("a")), vec![("a".to_string(), 1.0)]);
/// ```
pub fn replay_outcomes(ranked: &[String], relevant: &[String]) -> Vec<(String, f32)> {
    let mut outcomes: Vec<(String, f32)> = Vec::new();
    for id in relevant {
        if !outcomes.iter().any(|(seen, _)| seen == id) {
            outcomes.push((id.clone(), 1.0));
        }
    }
    if let Some(first) = ranked.first().filter(|id| !relevant.contains(id)) {
        outcomes.push((first.clone(), 0.0));
    }
    outcomes
}

#[cfg(test)]
mod tests {
    use super::*;
    use proptest::prelude::*;

    fn ids(text: &str) -> Vec<String> {
        text.split_whitespace().map(str::to_string).collect()
    }

    fn check(ranked: &str, relevant: &str, expect: QueryScores) {
        let scores = score_query(&ids(ranked), &ids(relevant));
        for (got, want) in [
            (scores.recall_at_1, expect.recall_at_1),
            (scores.recall_at_5, expect.recall_at_5),
            (scores.recall_at_10, expect.recall_at_10),
            (scores.ndcg_at_5, expect.ndcg_at_5),
            (scores.ndcg_at_10, expect.ndcg_at_10),
            (scores.mrr, expect.mrr),
        ] {
            assert!((got - want).abs() < 1e-12, "{ranked} / {relevant}: {scores:?} != {expect:?}");
        }
    }

    #[test]
    fn definitions() {
        let one = QueryScores {
            recall_at_1: 1.0,
            recall_at_5: 1.0,
            recall_at_10: 1.0,
            ndcg_at_5: 1.0,
            ndcg_at_10: 1.0,
            mrr: 1.0,
        };
        check("a b c", "a", one);
        check("x", "a", QueryScores::default());
        check("", "a", QueryScores::default());
        // Second place: DCG 1/log2(3); a duplicate of a non-relevant id does not push it down.
        let second = 1.0 / 3f64.log2();
        check(
            "x x a",
            "a",
            QueryScores {
                recall_at_1: 0.0,
                recall_at_5: 1.0,
                recall_at_10: 1.0,
                ndcg_at_5: second,
                ndcg_at_10: second,
                mrr: 0.5,
            },
        );
        // Two relevant, one found at rank 1: IDCG counts both.
        let ideal = 1.0 + second;
        check(
            "a x",
            "a b",
            QueryScores {
                recall_at_1: 0.5,
                recall_at_5: 0.5,
                recall_at_10: 0.5,
                ndcg_at_5: 1.0 / ideal,
                ndcg_at_10: 1.0 / ideal,
                mrr: 1.0,
            },
        );
        // Beyond 10 only MRR sees it.
        let far = "q w e r t y u i o p a";
        check(far, "a", QueryScores { mrr: 1.0 / 11.0, ..QueryScores::default() });
    }

    #[test]
    fn aggregate_counts_missing_queries_as_zero() {
        let perfect = score_query(&ids("a"), &ids("a"));
        let metrics = aggregate(&[perfect], 2);
        assert_eq!(metrics.recall_at_1, 50.0);
        assert_eq!(metrics.mrr, 50.0);
        assert_eq!(metrics.queries, 2);
    }

    #[test]
    fn records_map_to_tool_descriptors() {
        let record: ToolRecord = serde_json::from_str(
            r#"{"id": "getWeather", "name": "getWeather", "description": "Weather", "category": "Travel", "tags": ["t"],
                "params": [{"name": "city", "type": "str", "description": "City", "required": true}, {"name": "days", "type": "int", "required": false}]}"#,
        )
        .unwrap();
        let descriptor = record.to_descriptor();
        assert_eq!(descriptor.id, "getWeather");
        assert_eq!(descriptor.kind, CapabilityKind::Tool);
        assert_eq!(descriptor.parameter_names(), vec!["city", "days"]);
        assert_eq!(descriptor.full_schema.unwrap().value()["required"], json!(["city"]));
        let bare: ToolRecord = serde_json::from_str(r#"{"id": "x", "name": "x", "description": "d"}"#).unwrap();
        assert!(bare.to_descriptor().full_schema.is_none());
    }

    #[test]
    fn records_with_null_or_missing_fields_read_as_empty() {
        let record: ToolRecord = serde_json::from_str(
            r#"{"id": "send_email", "name": null, "description": null, "category": null, "tags": null,
                "params": [{"name": "to", "type": null, "description": null, "required": null}], "extra": 5}"#,
        )
        .unwrap();
        assert_eq!((record.description.as_str(), record.tags.len(), record.params[0].required), ("", 0, false));
        let descriptor = record.to_descriptor();
        assert_eq!((descriptor.name.as_str(), descriptor.category.as_str()), ("send_email", ""));
        assert_eq!(descriptor.parameter_names(), vec!["to"]);
        let id_only: ToolRecord = serde_json::from_str(r#"{"id": "get_weather"}"#).unwrap();
        assert_eq!(id_only.to_descriptor().name, "get_weather");
        // The id is what a run file names: it stays required.
        assert!(serde_json::from_str::<ToolRecord>(r#"{"name": "x"}"#).is_err());
        assert!(serde_json::from_str::<ToolRecord>(r#"{"id": null}"#).is_err());
    }

    #[test]
    fn nothing_fits_counts_shares() {
        let mut fits = NothingFits::default();
        assert_eq!((fits.answered_empty_share, fits.kept_share), (0.0, 0.0));
        fits.unanswerable(Some("irrelevance"), true);
        fits.unanswerable(Some("small-talk"), false);
        fits.answerable(true, true, true);
        fits.answerable(true, false, false);
        fits.answerable(false, false, false);
        assert_eq!((fits.unanswerable, fits.answered_empty, fits.answered_empty_share), (2, 1, 50.0));
        fits.unanswerable(None, true);
        assert_eq!((fits.unanswerable, fits.answered_empty), (3, 2));
        let by_split: Vec<(&str, usize, f64)> = fits
            .unanswerable_by_split
            .iter()
            .map(|(split, of)| (split.as_str(), of.unanswerable, of.answered_empty_share))
            .collect();
        assert_eq!(by_split, vec![("irrelevance", 1, 100.0), ("small-talk", 1, 0.0)]);
        assert_eq!((fits.answerable_in_reach, fits.kept, fits.kept_share), (2, 1, 50.0));
        assert_eq!((fits.kept_without_gate, fits.kept_with_gate, fits.gate_kept_share), (1, 1, 100.0));
        // A request the chatter gate took Tier 1 from.
        fits.answerable(true, true, false);
        assert_eq!((fits.kept_without_gate, fits.kept_with_gate, fits.gate_kept_share), (2, 1, 50.0));
        let query: QueryRecord = serde_json::from_str(
            r#"{"query": "hi", "relevant": [], "split": "x", "tools": [{"id": "a", "name": "a", "description": "d"}]}"#,
        )
        .unwrap();
        assert!(!query.answerable());
        assert_eq!(query.split.as_deref(), Some("x"));
        assert_eq!(query.tools.unwrap()[0].id, "a");
    }

    proptest! {
        /// The halves split `0..n` exactly, whatever the seed, and the seed decides them.
        #[test]
        fn seeded_halves_partition(n in 0usize..200, seed in any::<u64>()) {
            let (first, second) = seeded_halves(n, seed);
            prop_assert_eq!(first.len(), n / 2);
            let mut all: Vec<usize> = first.iter().chain(&second).copied().collect();
            all.sort_unstable();
            prop_assert_eq!(all, (0..n).collect::<Vec<_>>());
            prop_assert_eq!(seeded_halves(n, seed), (first, second));
        }

        #[test]
        fn metrics_are_fractions_and_monotone(
            ranked in proptest::collection::vec("[a-f]", 0..12),
            relevant in proptest::collection::vec("[a-f]", 1..4),
        ) {
            let scores = score_query(&ranked, &relevant);
            for value in [scores.recall_at_1, scores.recall_at_5, scores.recall_at_10, scores.ndcg_at_5, scores.ndcg_at_10, scores.mrr] {
                prop_assert!((0.0..=1.0 + 1e-12).contains(&value));
            }
            prop_assert!(scores.recall_at_1 <= scores.recall_at_5 && scores.recall_at_5 <= scores.recall_at_10);
        }
    }
}
