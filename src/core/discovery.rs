//! Per-turn discovery: search, graph re-rank, token-budgeted tiers.
//!
//! [`discover`] is the whole per-turn pipeline over immutable inputs (a
//! catalog snapshot with its vector index, lexical index and graph, and the
//! embedded query), so the Discoverer actor only gathers those and calls it.

// The filter sits below retrieval, which applies it; discovery's callers name it from here.
pub use crate::core::filter::DiscoveryFilter;
use crate::core::retrieval::{
    rank_explained, rank_with, Fusion, FusionSignals, Indexes, Query, RankedHit, Ranking, LEXICAL_WEIGHT,
};
use crate::core::text::{detail_text, summary_line};
use crate::core::tiers::{
    assemble_tier1, assemble_tier2, estimate_tokens, Candidate, Tier1Entry, Tier2Entry, TokenBudget, TokenEstimate,
};
use serde::{Deserialize, Serialize};
use std::borrow::Cow;
use std::collections::BTreeSet;

/// Discovery settings; defaults are the design's.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase", deny_unknown_fields)]
pub struct DiscoveryConfig {
    pub tier0_token_budget: usize,
    pub tier1_token_budget: usize,
    pub tier2_token_budget: usize,
    pub tier1_top_k: usize,
    pub tier2_top_k: usize,
    pub tier1_min_relevance: f32,
    pub use_graph_reranking: bool,
    pub graph_boost_factor: f32,
    /// Share of the lexical signal in fusion ([`Fusion::lexical`]); the
    /// default suits the built-in embedder, and the configuration picks one
    /// per embedder when it is not set ([`crate::config`]).
    #[serde(default = "default_lexical_weight")]
    pub lexical_weight: f32,
    /// Whether a request that is no nearer its best capabilities than
    /// chatter is gets an empty Tier 1 ([`asks_for_nothing`]); the
    /// configuration turns it on for neural embedders (`"auto"`, [`crate::config`]).
    #[serde(default)]
    pub chatter_gate: bool,
}

fn default_lexical_weight() -> f32 {
    LEXICAL_WEIGHT
}

/// The relevance a Tier 1 capability needs by default (`tier1MinRelevance`,
/// the design's 0.3): below it, nothing fits the request.
pub const TIER1_MIN_RELEVANCE: f32 = 0.3;
/// `tier1MinRelevance` with a neural model and the chatter gate on when the
/// configuration asks for it (`[discovery] tier1_min_relevance = "auto"`): the gate tells chatter
/// from requests by the model's own cosines, and a neural model's relevance
/// for a paraphrase sits near [`TIER1_MIN_RELEVANCE`] (its cosines lie in a
/// low band), so the floor is left for matches too faint to show. With
/// all-MiniLM-L6-v2 (alone), 0.3 kept Tier 1 for 76.5 % of MetaTool's
/// answerable requests, 0.15 for 97.0 %; with the static table beside it
/// (`[embedder] static_share`), 84.4 % and 98.3 %; the small talk answered
/// empty unchanged (`docs/performance.md`).
pub const GATED_TIER1_MIN_RELEVANCE: f32 = 0.15;

impl Default for DiscoveryConfig {
    fn default() -> Self {
        DiscoveryConfig {
            tier0_token_budget: 200,
            tier1_token_budget: 800,
            tier2_token_budget: 2000,
            tier1_top_k: 5,
            tier2_top_k: 2,
            tier1_min_relevance: TIER1_MIN_RELEVANCE,
            use_graph_reranking: true,
            graph_boost_factor: 0.15,
            lexical_weight: LEXICAL_WEIGHT,
            chatter_gate: false,
        }
    }
}

/// Per-query overrides of [`DiscoveryConfig`]: every field optional, each one
/// given replaces the configured value (`"config": {"tier1TopK": 3}` on the wire).
#[derive(Clone, Debug, Default, PartialEq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase", deny_unknown_fields)]
pub struct DiscoveryOverrides {
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub tier0_token_budget: Option<usize>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub tier1_token_budget: Option<usize>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub tier2_token_budget: Option<usize>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub tier1_top_k: Option<usize>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub tier2_top_k: Option<usize>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub tier1_min_relevance: Option<f32>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub use_graph_reranking: Option<bool>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub graph_boost_factor: Option<f32>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub lexical_weight: Option<f32>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub chatter_gate: Option<bool>,
}

impl DiscoveryOverrides {
    /// Returns true when no field is given.
    pub fn is_empty(&self) -> bool {
        *self == DiscoveryOverrides::default()
    }

    /// `base` with every given field replaced, validated as a whole.
    pub fn apply(&self, base: &DiscoveryConfig) -> Result<DiscoveryConfig, ConfigProblem> {
        let config = DiscoveryConfig {
            tier0_token_budget: self.tier0_token_budget.unwrap_or(base.tier0_token_budget),
            tier1_token_budget: self.tier1_token_budget.unwrap_or(base.tier1_token_budget),
            tier2_token_budget: self.tier2_token_budget.unwrap_or(base.tier2_token_budget),
            tier1_top_k: self.tier1_top_k.unwrap_or(base.tier1_top_k),
            tier2_top_k: self.tier2_top_k.unwrap_or(base.tier2_top_k),
            tier1_min_relevance: self.tier1_min_relevance.unwrap_or(base.tier1_min_relevance),
            use_graph_reranking: self.use_graph_reranking.unwrap_or(base.use_graph_reranking),
            graph_boost_factor: self.graph_boost_factor.unwrap_or(base.graph_boost_factor),
            lexical_weight: self.lexical_weight.unwrap_or(base.lexical_weight),
            chatter_gate: self.chatter_gate.unwrap_or(base.chatter_gate),
        };
        config.validate()?;
        Ok(config)
    }
}

/// A setting outside its allowed range.
#[derive(Debug, Clone, PartialEq, thiserror::Error)]
#[error("{field} {problem}")]
pub struct ConfigProblem {
    pub field: &'static str,
    pub problem: String,
}

impl DiscoveryConfig {
    /// Checks every range; the first violation is returned.
    pub fn validate(&self) -> Result<(), ConfigProblem> {
        let unit = |field: &'static str, value: f32| {
            if value.is_finite() && (0.0..=1.0).contains(&value) {
                Ok(())
            } else {
                Err(ConfigProblem { field, problem: format!("must be a number in [0, 1], got {value}") })
            }
        };
        unit("tier1MinRelevance", self.tier1_min_relevance)?;
        unit("graphBoostFactor", self.graph_boost_factor)?;
        unit("lexicalWeight", self.lexical_weight)?;
        for (field, value) in [
            ("tier0TokenBudget", self.tier0_token_budget),
            ("tier1TokenBudget", self.tier1_token_budget),
            ("tier2TokenBudget", self.tier2_token_budget),
        ] {
            if value > 1_000_000 {
                return Err(ConfigProblem { field, problem: format!("must be at most 1000000 tokens, got {value}") });
            }
        }
        if self.tier1_top_k == 0 || self.tier1_top_k > 100 {
            return Err(ConfigProblem {
                field: "tier1TopK",
                problem: format!("must be in 1..=100, got {}", self.tier1_top_k),
            });
        }
        if self.tier2_top_k > self.tier1_top_k {
            return Err(ConfigProblem {
                field: "tier2TopK",
                problem: format!("must not exceed tier1TopK ({}), got {}", self.tier1_top_k, self.tier2_top_k),
            });
        }
        Ok(())
    }
}

/// Timing and volume figures of one discovery.
#[derive(Clone, Debug, Default, PartialEq, Serialize)]
#[serde(rename_all = "camelCase")]
pub struct DiscoveryDiagnostics {
    pub candidates_scanned: usize,
    pub capabilities_retrieved: usize,
    pub total_indexed: usize,
    /// `"ok"`, or `"unavailable: <reason>"` when the query could not be
    /// embedded and was ranked by the lexical and graph signals alone.
    pub embedder: String,
    pub timings: StageTimings,
    /// What the outcome learner's trials decided this discovery uses
    /// (`core::outcome_learning`; absent while it ranks as configured): the
    /// prior (unless the request said otherwise) and the memory's own weight.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub outcome_learning: Option<crate::core::outcome_trust::Learning>,
    /// The chatter gate's reading of the request (`chatterGate` on and a
    /// likeness measured; absent otherwise).
    #[serde(skip_serializing_if = "Option::is_none")]
    pub chatter: Option<ChatterCheck>,
}

/// What the chatter gate ([`asks_for_nothing`]) read of one request.
#[derive(Clone, Copy, Debug, Default, PartialEq, Serialize)]
#[serde(rename_all = "camelCase")]
pub struct ChatterCheck {
    /// The request's best cosine with the chatter sentences.
    pub likeness: f32,
    /// The best cosine of the request with its first `tier1TopK` hits (0 with none).
    pub best_cosine: f32,
    /// Whether Tier 1 was emptied for it.
    pub nothing_fits: bool,
}

/// Microseconds per stage of one discovery (`embedUs` is filled in by the
/// caller that embedded the query; `totalUs` covers ranking and tiers).
#[derive(Clone, Copy, Debug, Default, PartialEq, Serialize)]
#[serde(rename_all = "camelCase")]
pub struct StageTimings {
    pub embed_us: f64,
    pub lexical_us: f64,
    pub dense_us: f64,
    pub fusion_us: f64,
    pub graph_us: f64,
    pub tiers_us: f64,
    pub total_us: f64,
}

/// The answer to one discovery query.
#[derive(Clone, Debug, Default, PartialEq, Serialize)]
#[serde(rename_all = "camelCase")]
pub struct DiscoveryResult {
    pub tier0: String,
    pub tier1: Vec<Tier1Entry>,
    pub tier2: Vec<Tier2Entry>,
    pub token_estimate: TokenEstimate,
    /// The three tiers as one prompt section; its estimate is at most `totalTokens`.
    pub rendered: String,
    pub diagnostics: DiscoveryDiagnostics,
    /// Why each Tier 1 entry is there, one per entry in Tier 1's order; only
    /// when the query asked for it (`explain`), and then computed from the
    /// values the ranking used.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub explanations: Vec<Explanation>,
}

/// The signals that ranked one Tier 1 entry (`"explain": true`), as the
/// ranking used them. With the module docs of [`crate::core::retrieval`]:
///
/// ```text
/// relevance = clamp((fused + graph + concept) · (1 + prior), 0, 1)
/// ```
///
/// up to float rounding. An entry Tier 1 took in as a dependency or preset
/// partner of another, without retrieval returning it, has the values the
/// ranking saw of it: `fused`, `lexical` 0 and `dense` `None` when retrieval
/// did not return it (a graph pull-in has only its `graph`), and everything 0
/// when the ranking never reached it (its relevance is then 0 too).
#[derive(Clone, Debug, PartialEq, Serialize)]
#[serde(rename_all = "camelCase")]
pub struct Explanation {
    pub id: String,
    /// The entry's Tier 1 relevance.
    pub relevance: f32,
    /// `lex_p(d)`: the normalised BM25F score in [0, 1] that entered the
    /// fusion, on the part of the message that set `fused` (`part`).
    pub lexical: f32,
    /// `cos_p(d)`: the cosine of that part's vector with the capability's
    /// (the fusion counts a negative one as 0); `None` when the query or the
    /// capability has no vector (then `fused` came from `lexical` alone), or
    /// retrieval did not return it.
    pub dense: Option<f32>,
    /// What graph re-ranking added: the relevance after re-ranking (capped
    /// at 1) minus `fused`; 0 with `useGraphReranking` off.
    pub graph: f32,
    /// The relative adjustment the outcome prior applied: the relevance was
    /// multiplied by `1 + prior` (then clamped to [0, 1]); 0 when the prior
    /// is off, knows nothing of the capability, or the hit is an exact name.
    pub prior: f32,
    /// The relevance hybrid retrieval gave: the fusion of the lexical and
    /// dense signals over the message's parts, 1 for an exact name; 0 when
    /// retrieval did not return it.
    pub fused: f32,
    /// The part of the message whose score set `fused`: 0 for the whole
    /// message, `c ≥ 1` for its clause `c` (the ranking's `CLAUSE_WEIGHT`
    /// times the clause's score, relative to its best, was higher).
    pub part: usize,
    /// The message is exactly this capability's id, name or display name.
    pub exact: bool,
    /// What the message's concepts added, for a capability that came from a source
    /// (`core::source_concepts`): after `graph`, before the prior; 0 for any other.
    #[serde(default, skip_serializing_if = "is_zero")]
    pub concept: f32,
    /// The concepts the message resolved to that this capability carries, each with the
    /// term that resolved it (`owner (lexicon "responsible")`).
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub concepts: Vec<String>,
}

fn is_zero(value: &f32) -> bool {
    *value == 0.0
}

/// Runs one discovery: rank the admitted capabilities for `query` (hybrid
/// retrieval with `config`'s lexical weight and graph re-ranking, [`rank_with`]), pick Tier 1 with the
/// dependency rule below, and assemble the tiers within `config`'s budgets.
///
/// # Tier 1 and dependencies
///
/// Tier 1 holds at most `tier1TopK` entries. Walking the ranking best first,
/// every capability with relevance ≥ `tier1MinRelevance` that is not yet in
/// Tier 1 is added, and right after it, while room remains:
/// 1. the capabilities it depends on (its `DEPENDS_ON` edges in their
///    direction, by id), then
/// 2. the capabilities it shares a preset with (`COMPOSED_WITH`), best
///    ranked first, then by id,
///
/// each only if the filter admits it and it is not yet in Tier 1, whatever
/// its own relevance (its entry carries its ranked relevance, or 0 when the
/// ranking did not reach it). Dependencies are one hop deep: a dependency's
/// own dependencies follow only if it reaches the minimum itself.
pub fn discover(
    query: &Query,
    indexes: &Indexes<'_>,
    config: &DiscoveryConfig,
    filter: &DiscoveryFilter,
    tier0: String,
) -> DiscoveryResult {
    discover_with_prior(query, indexes, config, filter, tier0, None, false)
}

/// [`discover`], with the outcome prior applied to the ranking after fusion
/// and graph re-ranking and before Tier 1 is picked
/// ([`crate::core::outcome_prior::OutcomePrior::apply`]); `None` is [`discover`].
///
/// With `explain`, the result carries one [`Explanation`] per Tier 1 entry;
/// the rest of the result is the same as without it.
pub fn discover_with_prior(
    query: &Query,
    indexes: &Indexes<'_>,
    config: &DiscoveryConfig,
    filter: &DiscoveryFilter,
    tier0: String,
    prior: Option<&crate::core::outcome_prior::OutcomePrior>,
    explain: bool,
) -> DiscoveryResult {
    let started = std::time::Instant::now();
    let catalog = indexes.catalog;
    let Ranked { ranking, reranked, concepts } = ranked(query, indexes, config, filter, prior, explain);
    let tiers_started = std::time::Instant::now();
    let chatter = chatter_check(query, &ranking.hits, indexes, config);
    let chosen = match chatter {
        Some(check) if check.nothing_fits => Vec::new(),
        _ => tier1_with_dependencies(&ranking.hits, indexes, config, filter),
    };
    // The lexical index keeps each capability's texts for its catalog version;
    // a catalog it was not built with gets fresh ones.
    let texts = indexes.one_publication().then_some(indexes.lexical);
    let candidates: Vec<Candidate> = chosen
        .into_iter()
        .filter_map(|(id, relevance)| {
            catalog.get(&id).map(|descriptor| {
                let summary = match texts {
                    Some(lexical) => lexical.summary_line(descriptor).into_owned(),
                    None => summary_line(descriptor),
                };
                Candidate { id, relevance, summary }
            })
        })
        .collect();
    let (tier1, tier1_block) = assemble_tier1(&candidates, TokenBudget::new(config.tier1_token_budget));
    let details: Vec<(&str, Cow<'_, str>)> = tier1
        .iter()
        .take(config.tier2_top_k)
        .filter_map(|entry| {
            catalog.get(&entry.id).map(|descriptor| {
                let detail = match texts {
                    Some(lexical) => lexical.detail_text(descriptor),
                    None => Cow::Owned(detail_text(descriptor)),
                };
                (entry.id.as_str(), detail)
            })
        })
        .collect();
    let (tier2, tier2_block) = assemble_tier2(&details, TokenBudget::new(config.tier2_token_budget));
    let token_estimate = TokenEstimate {
        tier0_tokens: estimate_tokens(&tier0),
        tier1_tokens: estimate_tokens(&tier1_block),
        tier2_tokens: estimate_tokens(&tier2_block),
        total_tokens: estimate_tokens(&tier0) + estimate_tokens(&tier1_block) + estimate_tokens(&tier2_block),
    };
    let retrieved: BTreeSet<&str> =
        tier1.iter().map(|e| e.id.as_str()).chain(tier2.iter().map(|e| e.id.as_str())).collect();
    let rendered = format!("{tier0}{tier1_block}{tier2_block}");
    let micros = |since: std::time::Instant| since.elapsed().as_secs_f64() * 1e6;
    let diagnostics = DiscoveryDiagnostics {
        candidates_scanned: ranking.candidates_scanned,
        capabilities_retrieved: retrieved.len(),
        total_indexed: catalog.len(),
        embedder: match &query.embedder_error {
            None => "ok".to_string(),
            Some(reason) => format!("unavailable: {reason}"),
        },
        timings: StageTimings {
            embed_us: 0.0,
            lexical_us: ranking.timings.lexical_us,
            dense_us: ranking.timings.dense_us,
            fusion_us: ranking.timings.fusion_us,
            graph_us: ranking.timings.graph_us,
            tiers_us: micros(tiers_started),
            total_us: micros(started),
        },
        outcome_learning: None,
        chatter,
    };
    debug_assert!(estimate_tokens(&rendered) <= token_estimate.total_tokens);
    let explanations =
        if explain { explain_tier1(&tier1, &ranking.signals, &reranked, prior, &concepts) } else { Vec::new() };
    DiscoveryResult { tier0, tier1, tier2, token_estimate, rendered, diagnostics, explanations }
}

/// The ranking Tier 1 is chosen from, with what explanations need.
struct Ranked {
    ranking: Ranking,
    /// The ranking before concepts and the prior (kept only to explain), to tell the graph's part from theirs.
    reranked: Vec<RankedHit>,
    concepts: crate::core::source_concepts::SourceConcepts,
}

/// Fusion, the graph, the source concepts and the prior, as discovery ranks.
fn ranked(
    query: &Query,
    indexes: &Indexes<'_>,
    config: &DiscoveryConfig,
    filter: &DiscoveryFilter,
    prior: Option<&crate::core::outcome_prior::OutcomePrior>,
    explain: bool,
) -> Ranked {
    let graph_boost = config.use_graph_reranking.then_some(config.graph_boost_factor);
    let fusion = Fusion { lexical: config.lexical_weight, ..Fusion::default() };
    let limit = config.tier1_top_k * 2;
    let mut ranking = if explain {
        rank_explained(query, indexes, filter, limit, graph_boost, fusion)
    } else {
        rank_with(query, indexes, filter, limit, graph_boost, fusion)
    };
    let reranked: Vec<RankedHit> = if explain { ranking.hits.clone() } else { Vec::new() };
    let message = query.parts.first().map_or("", |part| part.text.as_str());
    let concepts = crate::core::source_concepts::apply(message, &mut ranking.hits, indexes.catalog);
    if let Some(prior) = prior {
        prior.apply(&mut ranking.hits);
    }
    Ranked { ranking, reranked, concepts }
}

/// The ids discovery ranks for `query` before it chooses Tier 1 (best
/// first; fusion, the graph, the source concepts, the prior when given),
/// with no filter: what the outcome learner's trials compare.
pub fn ranked_ids(
    query: &Query,
    indexes: &Indexes<'_>,
    config: &DiscoveryConfig,
    prior: Option<&crate::core::outcome_prior::OutcomePrior>,
) -> Vec<String> {
    let ranked = ranked(query, indexes, config, &DiscoveryFilter::default(), prior, false);
    ranked.ranking.hits.into_iter().map(|hit| hit.id).collect()
}

/// One [`Explanation`] per Tier 1 entry, from what retrieval saw (`signals`),
/// the ranking after graph re-ranking and before the prior (`reranked`), and
/// the prior discovery applied.
fn explain_tier1(
    tier1: &[Tier1Entry],
    signals: &[FusionSignals],
    reranked: &[RankedHit],
    prior: Option<&crate::core::outcome_prior::OutcomePrior>,
    concepts: &crate::core::source_concepts::SourceConcepts,
) -> Vec<Explanation> {
    tier1
        .iter()
        .map(|entry| {
            let seen = signals.iter().find(|signals| signals.id == entry.id);
            let ranked = reranked.iter().find(|hit| hit.id == entry.id);
            let fused = seen.map_or(0.0, |seen| seen.fused);
            // `OutcomePrior::apply` adjusts every ranked hit but exact names.
            let prior = match (prior, ranked) {
                (Some(prior), Some(hit)) if hit.exact.is_none() => prior.adjustment(&hit.id),
                _ => 0.0,
            };
            Explanation {
                id: entry.id.clone(),
                relevance: entry.relevance,
                lexical: seen.map_or(0.0, |seen| seen.lexical),
                dense: seen.and_then(|seen| seen.dense),
                graph: ranked.map_or(0.0, |hit| hit.relevance - fused),
                prior,
                fused,
                part: seen.map_or(0, |seen| seen.part),
                exact: seen.is_some_and(|seen| seen.exact),
                concept: concepts.boosted.get(&entry.id).map_or(0.0, |(gain, _)| *gain),
                concepts: concepts
                    .boosted
                    .get(&entry.id)
                    .map(|(_, carried)| {
                        concepts
                            .resolved
                            .iter()
                            .filter(|label| carried.iter().any(|id| label.starts_with(&format!("{id} ("))))
                            .cloned()
                            .collect()
                    })
                    .unwrap_or_default(),
            }
        })
        .collect()
}

/// Whether `query` asks for nothing the catalog offers, by the rule of
/// [`crate::core::nothing_fits::message_asks_for_nothing`] over its first
/// `tier1TopK` hits (the whole message, then each clause): true only with
/// `chatterGate` on, a measured likeness to chatter, and no hit that names a
/// capability exactly. Discovery then returns an empty Tier 1 (and the turn
/// needs no capability).
pub fn asks_for_nothing(query: &Query, hits: &[RankedHit], indexes: &Indexes<'_>, config: &DiscoveryConfig) -> bool {
    chatter_check(query, hits, indexes, config).is_some_and(|check| check.nothing_fits)
}

/// The chatter gate's reading of `query` ([`asks_for_nothing`]), when it applies.
fn chatter_check(
    query: &Query,
    hits: &[RankedHit],
    indexes: &Indexes<'_>,
    config: &DiscoveryConfig,
) -> Option<ChatterCheck> {
    let likeness = query.chatter.first().copied().flatten().filter(|_| config.chatter_gate)?;
    let best_of = |vector: &[f32]| {
        hits.iter().take(config.tier1_top_k).filter_map(|hit| indexes.vectors.cosine(&hit.id, vector)).reduce(f32::max)
    };
    let whole = query.parts.first().map(|part| part.vector.as_slice()).unwrap_or(&[]);
    let best = best_of(whole);
    let exact = hits.iter().any(|hit| hit.exact.is_some());
    // The clauses' cosines are computed only when the whole message looks like chatter.
    let clauses =
        query.parts.iter().zip(&query.chatter).skip(1).map(|(part, &chatter)| (chatter, best_of(&part.vector)));
    let nothing_fits = !exact
        && crate::core::nothing_fits::message_asks_for_nothing(std::iter::once((Some(likeness), best)).chain(clauses));
    Some(ChatterCheck { likeness, best_cosine: best.unwrap_or(0.0), nothing_fits })
}

/// Picks Tier 1 from `hits` (best first, as ranked) by the rule in
/// [`discover`]'s docs; returns ids with relevance. Empty when no hit reaches
/// `tier1MinRelevance`: nothing fits the request, and the turn needs no capability.
pub fn tier1_with_dependencies(
    hits: &[RankedHit],
    indexes: &Indexes<'_>,
    config: &DiscoveryConfig,
    filter: &DiscoveryFilter,
) -> Vec<(String, f32)> {
    let relevance_of = |id: &str| hits.iter().find(|hit| hit.id == id).map(|hit| hit.relevance);
    let admitted = |id: &str| indexes.catalog.get(id).is_some_and(|descriptor| filter.admits(descriptor));
    let mut chosen: Vec<(String, f32)> = Vec::with_capacity(config.tier1_top_k);
    let is_chosen = |chosen: &[(String, f32)], id: &str| chosen.iter().any(|(existing, _)| existing == id);
    for hit in hits.iter().filter(|hit| hit.relevance >= config.tier1_min_relevance) {
        if chosen.len() >= config.tier1_top_k {
            break;
        }
        if is_chosen(&chosen, &hit.id) {
            continue;
        }
        chosen.push((hit.id.clone(), hit.relevance));
        let mut partners: Vec<&str> = indexes.graph.composed_with(&hit.id);
        partners.sort_by(|a, b| {
            relevance_of(b).unwrap_or(0.0).total_cmp(&relevance_of(a).unwrap_or(0.0)).then_with(|| a.cmp(b))
        });
        let followers = indexes.graph.dependencies(&hit.id).iter().map(String::as_str).chain(partners);
        for follower in followers {
            if chosen.len() >= config.tier1_top_k {
                break;
            }
            if admitted(follower) && !is_chosen(&chosen, follower) {
                chosen.push((follower.to_string(), relevance_of(follower).unwrap_or(0.0)));
            }
        }
    }
    chosen
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::core::catalog::Catalog;
    use crate::core::descriptor::{CapabilityDescriptor, CapabilityKind, DefinitionRef};
    use crate::core::embedder::{Embed, HashingEmbedder};
    use crate::core::graph::{CapabilityGraph, Preset};
    use crate::core::index::VectorIndex;
    use crate::core::lexical::LexicalIndex;
    use crate::core::outcome_prior::{OutcomePrior, OutcomePriorSettings, OutcomeStats};
    use crate::core::retrieval::{query_texts, retrieve_with};
    use crate::core::text::embedding_text;
    use proptest::prelude::*;

    fn descriptor(id: &str, description: &str, category: &str, available: bool) -> CapabilityDescriptor {
        let (kind, name) = id.split_once(':').unwrap();
        CapabilityDescriptor {
            id: id.into(),
            kind: CapabilityKind::parse(kind).unwrap(),
            name: name.into(),
            display_name: name.into(),
            description: description.into(),
            category: category.into(),
            tags: vec![],
            required_secrets: vec![],
            required_tools: vec![],
            available,
            has_side_effects: None,
            full_schema: None,
            full_content: None,
            definition_ref: DefinitionRef::Builtin,
        }
    }

    struct Fixture {
        catalog: Catalog,
        vectors: VectorIndex,
        lexical: LexicalIndex,
        graph: CapabilityGraph,
        embedder: HashingEmbedder,
    }

    impl Fixture {
        fn new(descriptors: Vec<CapabilityDescriptor>, presets: &[Preset]) -> Fixture {
            let embedder = HashingEmbedder::default();
            let mut vectors = VectorIndex::new(embedder.dimensions());
            let mut catalog = Catalog::default();
            for descriptor in &descriptors {
                vectors.upsert(&descriptor.id, &embedder.embed(&embedding_text(descriptor))).unwrap();
                catalog.descriptors.insert(descriptor.id.clone(), descriptor.clone());
            }
            let lexical = LexicalIndex::build(&descriptors);
            let graph = CapabilityGraph::build(&descriptors, presets);
            Fixture { catalog, vectors, lexical, graph, embedder }
        }

        fn discover(&self, message: &str, config: &DiscoveryConfig, filter: &DiscoveryFilter) -> DiscoveryResult {
            let tier0 = self.catalog.tier0(filter, TokenBudget::new(config.tier0_token_budget));
            discover(&self.query(message), &self.indexes(), config, filter, tier0)
        }

        fn indexes(&self) -> Indexes<'_> {
            Indexes { catalog: &self.catalog, vectors: &self.vectors, lexical: &self.lexical, graph: &self.graph }
        }

        fn query(&self, message: &str) -> Query {
            let texts = query_texts(message);
            let vectors = texts.iter().map(|text| self.embedder.embed(text)).collect();
            Query::new(texts, vectors)
        }

        fn discover_explained(
            &self,
            query: &Query,
            config: &DiscoveryConfig,
            filter: &DiscoveryFilter,
            prior: Option<&OutcomePrior>,
            explain: bool,
        ) -> DiscoveryResult {
            let tier0 = self.catalog.tier0(filter, TokenBudget::new(config.tier0_token_budget));
            discover_with_prior(query, &self.indexes(), config, filter, tier0, prior, explain)
        }
    }

    fn fixture() -> Fixture {
        Fixture::new(
            vec![
                descriptor("channel:telegram", "Send and receive messages in Telegram chats", "communication", true),
                descriptor("channel:discord", "Send messages to Discord servers and channels", "communication", false),
                descriptor("tool:weather", "Get the weather forecast for a city", "information", true),
                descriptor("tool:web-search", "Search the web for current information", "information", true),
            ],
            &[],
        )
    }

    fn tier1_ids(result: &DiscoveryResult) -> Vec<&str> {
        result.tier1.iter().map(|entry| entry.id.as_str()).collect()
    }

    #[test]
    fn finds_the_relevant_capability_within_budget() {
        let fixture = fixture();
        let config = DiscoveryConfig::default();
        let result = fixture.discover("send a telegram message", &config, &DiscoveryFilter::default());
        assert_eq!(result.tier1[0].id, "channel:telegram");
        assert_eq!(result.tier2[0].id, "channel:telegram");
        assert!(result.token_estimate.total_tokens <= 3000);
        assert!(result.rendered.contains("Relevant capabilities:\n1. telegram (channel)"));
        assert!(result.diagnostics.candidates_scanned >= 1);
    }

    /// A request whose words the catalog does not know gets an empty Tier 1
    /// (nothing fits); a request about a capability still finds it.
    #[test]
    fn nothing_fits_gives_an_empty_tier1() {
        let fixture = fixture();
        let config = DiscoveryConfig::default();
        let unrelated = "calculate the hypotenuse of a right triangle";
        let result = fixture.discover(unrelated, &config, &DiscoveryFilter::default());
        assert!(result.tier1.is_empty(), "{:?}", tier1_ids(&result));
        assert!(result.tier2.is_empty());
        let reach = DiscoveryConfig { tier1_min_relevance: 0.0, ..DiscoveryConfig::default() };
        let unfiltered = fixture.discover(unrelated, &reach, &DiscoveryFilter::default());
        assert!(!unfiltered.tier1.is_empty(), "the ranking itself still has hits; only the minimum empties Tier 1");
        let result = fixture.discover("weather forecast for my city", &config, &DiscoveryFilter::default());
        assert_eq!(tier1_ids(&result)[0], "tool:weather");
    }

    /// With the chatter gate, a request no nearer its best hits than chatter
    /// gets an empty Tier 1 even where the relevance minimum would keep one;
    /// a request about a capability, or naming one, keeps it; without the
    /// gate (or without the chatter sentences' vectors) nothing changes.
    #[test]
    fn the_chatter_gate_empties_tier1_for_chatter_only() {
        let fixture = fixture();
        let generic: Vec<Vec<f32>> = crate::core::nothing_fits::GENERIC_SENTENCES
            .iter()
            .map(|sentence| fixture.embedder.embed(sentence))
            .collect();
        let gate = DiscoveryConfig { chatter_gate: true, tier1_min_relevance: 0.0, ..DiscoveryConfig::default() };
        let run_query = |query: &Query, config: &DiscoveryConfig| {
            let tier0 = fixture.catalog.tier0(&DiscoveryFilter::default(), TokenBudget::new(200));
            discover(query, &fixture.indexes(), config, &DiscoveryFilter::default(), tier0)
        };
        let run =
            |message: &str, config: &DiscoveryConfig| run_query(&fixture.query(message).with_chatter(&generic), config);
        let chatter = "thank you, I really appreciate it, see you tomorrow";
        let gated = run(chatter, &gate);
        assert!(gated.tier1.is_empty() && gated.tier2.is_empty(), "{:?}", tier1_ids(&gated));
        let check = gated.diagnostics.chatter.unwrap();
        assert!(check.nothing_fits && check.best_cosine <= check.likeness, "{check:?}");
        let ungated = run(chatter, &DiscoveryConfig { chatter_gate: false, ..gate.clone() });
        assert!(!ungated.tier1.is_empty(), "without the gate the minimum of 0 keeps the hits");
        assert_eq!(ungated.diagnostics.chatter, None);
        let request = run("weather forecast for my city", &gate);
        assert_eq!(tier1_ids(&request)[0], "tool:weather");
        assert!(!request.diagnostics.chatter.unwrap().nothing_fits);
        let named = run("web-search", &gate);
        assert_eq!(tier1_ids(&named)[0], "tool:web-search");
        // A request that opens chattily keeps Tier 1 by the clause that asks for something,
        // though its whole message alone would have been taken for chatter.
        let opening = "thank you so much, I really appreciate it, you are great. weather forecast for my city please?";
        let mut whole_only = fixture.query(opening).with_chatter(&generic);
        assert!(whole_only.parts.len() > 1, "{:?}", whole_only.parts);
        whole_only.chatter.truncate(1);
        let whole_only = run_query(&whole_only, &gate);
        assert!(whole_only.tier1.is_empty() && whole_only.diagnostics.chatter.unwrap().nothing_fits);
        let by_clause = run(opening, &gate);
        assert_eq!(tier1_ids(&by_clause)[0], "tool:weather");
        assert!(!by_clause.diagnostics.chatter.unwrap().nothing_fits);
        // No chatter vectors: nothing to compare with, so the gate cannot apply.
        let blind = run_query(&fixture.query(chatter), &gate);
        assert!(!blind.tier1.is_empty());
        assert_eq!(blind.diagnostics.chatter, None);
    }

    #[test]
    fn filters_apply() {
        let fixture = fixture();
        let config = DiscoveryConfig { tier1_min_relevance: 0.0, ..DiscoveryConfig::default() };
        let filter =
            DiscoveryFilter { only_available: true, kind: Some(CapabilityKind::Channel), ..DiscoveryFilter::default() };
        let result = fixture.discover("send a discord message", &config, &filter);
        assert_eq!(tier1_ids(&result), vec!["channel:telegram"]);
    }

    #[test]
    fn per_query_overrides_replace_only_what_they_give() {
        let base = DiscoveryConfig { lexical_weight: 0.25, ..DiscoveryConfig::default() };
        let overrides: DiscoveryOverrides =
            serde_json::from_str(r#"{"tier1TopK": 2, "tier2TopK": 1, "lexicalWeight": 0.5}"#).unwrap();
        let config = overrides.apply(&base).unwrap();
        assert_eq!((config.tier1_top_k, config.tier2_top_k, config.lexical_weight), (2, 1, 0.5));
        assert_eq!(config.tier1_token_budget, base.tier1_token_budget);
        assert!(DiscoveryOverrides::default().is_empty());
        assert_eq!(DiscoveryOverrides::default().apply(&base).unwrap(), base);
        // The whole is validated: tier2TopK may not exceed the (overridden) tier1TopK.
        let too_many: DiscoveryOverrides = serde_json::from_str(r#"{"tier1TopK": 1}"#).unwrap();
        assert_eq!(too_many.apply(&base).unwrap_err().field, "tier2TopK");
        let bad: DiscoveryOverrides = serde_json::from_str(r#"{"lexicalWeight": 1.5}"#).unwrap();
        assert_eq!(bad.apply(&base).unwrap_err().field, "lexicalWeight");
        assert!(serde_json::from_str::<DiscoveryOverrides>(r#"{"topK": 3}"#).is_err());
        // The lexical weight reaches the ranking: all-lexical and all-dense fusions differ.
        let fixture = fixture();
        let filter = DiscoveryFilter::default();
        let lexical_only = DiscoveryConfig { lexical_weight: 1.0, tier1_min_relevance: 0.0, ..base.clone() };
        let dense_only = DiscoveryConfig { lexical_weight: 0.0, ..lexical_only.clone() };
        let relevances = |config: &DiscoveryConfig| -> Vec<f32> {
            fixture.discover("search the web", config, &filter).tier1.iter().map(|entry| entry.relevance).collect()
        };
        assert_ne!(relevances(&lexical_only), relevances(&dense_only));
    }

    #[test]
    fn an_exact_name_ranks_first() {
        let result = fixture().discover("Web-Search", &DiscoveryConfig::default(), &DiscoveryFilter::default());
        assert_eq!(result.tier1[0].id, "tool:web-search");
        assert_eq!(result.tier1[0].relevance, 1.0);
    }

    fn with_dependencies() -> Fixture {
        let mut github = descriptor("skill:github", "Manage GitHub issues and pull requests", "developer", true);
        github.required_tools = vec!["cli-executor".into()];
        let mut deploy = descriptor("skill:deploy", "Deploy the site to production", "developer", true);
        deploy.required_tools = vec!["cli-executor".into()];
        Fixture::new(
            vec![
                github,
                deploy,
                descriptor("tool:cli-executor", "Run shell commands", "system", true),
                descriptor("tool:slack-post", "Post to a Slack channel", "communication", true),
                descriptor("tool:notes", "Keep notes", "productivity", true),
            ],
            &[Preset { name: "release".into(), capability_ids: vec!["skill:github".into(), "tool:slack-post".into()] }],
        )
    }

    #[test]
    fn a_dependency_follows_its_dependent_into_tier1_even_below_the_minimum() {
        let fixture = with_dependencies();
        let config = DiscoveryConfig::default();
        let result =
            fixture.discover("open a github issue about the pull request", &config, &DiscoveryFilter::default());
        let ids = tier1_ids(&result);
        assert_eq!(&ids[..3], &["skill:github", "tool:cli-executor", "tool:slack-post"], "{ids:?}");
        assert!(result.tier1[1].relevance < config.tier1_min_relevance, "{:?}", result.tier1);
        // A dependency is never listed twice, and nothing unrelated is pulled in.
        assert!(!ids.contains(&"tool:notes"));
        assert_eq!(ids.iter().filter(|id| **id == "tool:cli-executor").count(), 1);
    }

    #[test]
    fn dependencies_obey_filters_and_the_top_k() {
        let fixture = with_dependencies();
        let message = "open a github issue about the pull request";
        let skills = DiscoveryFilter { kind: Some(CapabilityKind::Skill), ..DiscoveryFilter::default() };
        assert_eq!(tier1_ids(&fixture.discover(message, &DiscoveryConfig::default(), &skills)), vec!["skill:github"]);
        let excluded = DiscoveryFilter {
            excluded_capability_ids: vec!["tool:cli-executor".to_string()].into(),
            ..DiscoveryFilter::default()
        };
        let ids = fixture.discover(message, &DiscoveryConfig::default(), &excluded);
        assert_eq!(tier1_ids(&ids), vec!["skill:github", "tool:slack-post"]);
        let one = DiscoveryConfig { tier1_top_k: 1, tier2_top_k: 1, ..DiscoveryConfig::default() };
        assert_eq!(tier1_ids(&fixture.discover(message, &one, &DiscoveryFilter::default())), vec!["skill:github"]);
    }

    /// Both fixtures' capabilities in one catalog, with the release preset.
    fn explained_fixture() -> Fixture {
        let mut github = descriptor("skill:github", "Manage GitHub issues and pull requests", "developer", true);
        github.required_tools = vec!["cli-executor".into()];
        let mut deploy = descriptor("skill:deploy", "Deploy the site to production", "developer", true);
        deploy.required_tools = vec!["cli-executor".into()];
        Fixture::new(
            vec![
                github,
                deploy,
                descriptor("tool:cli-executor", "Run shell commands", "system", true),
                descriptor("tool:slack-post", "Post to a Slack channel", "communication", true),
                descriptor("tool:notes", "Keep notes", "productivity", true),
                descriptor("channel:telegram", "Send and receive messages in Telegram chats", "communication", true),
                descriptor("channel:discord", "Send messages to Discord servers and channels", "communication", false),
                descriptor("tool:weather", "Get the weather forecast for a city", "information", true),
                descriptor("tool:web-search", "Search the web for current information", "information", true),
            ],
            &[Preset { name: "release".into(), capability_ids: vec!["skill:github".into(), "tool:slack-post".into()] }],
        )
    }

    /// A prior that favours the weather tool and disfavours GitHub.
    fn biased_prior() -> OutcomePrior {
        let settings = OutcomePriorSettings::default();
        let mut stats = OutcomeStats::default();
        for at_ms in 0..20 {
            stats.credit("tool:weather", 1.0, at_ms, settings.half_life_ms);
            stats.credit("skill:github", 0.0, at_ms, settings.half_life_ms);
            stats.credit("tool:notes", 0.5, at_ms, settings.half_life_ms);
        }
        stats.snapshot(&settings, 20)
    }

    fn without_timings(mut result: DiscoveryResult) -> DiscoveryResult {
        result.diagnostics.timings = StageTimings::default();
        result
    }

    const MESSAGES: &[&str] = &[
        "open a github issue about the pull request",
        "send a telegram message",
        "what's the weather forecast. then post it to slack and keep notes",
        "Web-Search",
        "deploy the site then run a shell command",
        "nothing here matches",
    ];

    #[test]
    fn explaining_changes_nothing_but_the_explanations() {
        let fixture = explained_fixture();
        let prior = biased_prior();
        let graph_off = DiscoveryConfig { use_graph_reranking: false, ..DiscoveryConfig::default() };
        let low = DiscoveryConfig { tier1_min_relevance: 0.0, tier1_top_k: 8, ..DiscoveryConfig::default() };
        for message in MESSAGES {
            for config in [&DiscoveryConfig::default(), &graph_off, &low] {
                for prior in [None, Some(&prior)] {
                    for query in [fixture.query(message), Query::without_vectors(query_texts(message), "down")] {
                        let filter = DiscoveryFilter::default();
                        let plain = fixture.discover_explained(&query, config, &filter, prior, false);
                        let explained = fixture.discover_explained(&query, config, &filter, prior, true);
                        assert!(plain.explanations.is_empty());
                        assert_eq!(explained.explanations.len(), explained.tier1.len(), "{message}");
                        let bare = DiscoveryResult { explanations: Vec::new(), ..explained.clone() };
                        assert_eq!(without_timings(bare.clone()), without_timings(plain.clone()), "{message}");
                        // Serialized, the plain result has no `explanations` key, and the rest is the same bytes.
                        let json = |result: DiscoveryResult| serde_json::to_string(&without_timings(result)).unwrap();
                        assert!(!json(plain.clone()).contains("explanations"));
                        assert_eq!(json(bare), json(plain));
                    }
                }
            }
        }
    }

    #[test]
    fn explanations_name_the_signals_in_camel_case() {
        let fixture = explained_fixture();
        let config = DiscoveryConfig::default();
        let result = fixture.discover_explained(
            &fixture.query("open a github issue about the pull request"),
            &config,
            &DiscoveryFilter::default(),
            Some(&biased_prior()),
            true,
        );
        let value = serde_json::to_value(&result).unwrap();
        let first = &value["explanations"][0];
        assert_eq!(first["id"], "skill:github", "{value}");
        for key in ["relevance", "lexical", "dense", "graph", "prior", "fused", "part", "exact"] {
            assert!(first.get(key).is_some(), "{key} missing: {first}");
        }
        assert!(first["prior"].as_f64().unwrap() < 0.0, "github does worse than the rest: {first}");
        assert!(first["lexical"].as_f64().unwrap() > 0.0 && first["dense"].as_f64().unwrap() > 0.0, "{first}");
        // The dependency came in under its dependent, below the minimum, pulled in by the graph alone:
        // retrieval did not return it, so all it has is the graph's share.
        let dependency = &result.explanations[1];
        assert_eq!(dependency.id, "tool:cli-executor");
        assert!(dependency.relevance < config.tier1_min_relevance);
        assert_eq!((dependency.fused, dependency.lexical, dependency.dense), (0.0, 0.0, None));
        assert!(dependency.graph > 0.0 && dependency.graph == dependency.relevance, "{dependency:?}");
        // A many-part message: some entries owe their fused relevance to a clause.
        let clauses = fixture.discover_explained(
            &fixture.query("what's the weather forecast. then post it to slack and keep notes"),
            &config,
            &DiscoveryFilter::default(),
            Some(&biased_prior()),
            true,
        );
        let weather = clauses.explanations.iter().find(|explanation| explanation.id == "tool:weather").unwrap();
        assert_eq!(weather.part, 1, "{weather:?}");
        assert!(weather.prior > 0.0, "the weather tool does better than the rest: {weather:?}");
        // Without vectors there is no cosine.
        let lexical_only = fixture.discover_explained(
            &Query::without_vectors(query_texts("send a telegram message"), "down"),
            &config,
            &DiscoveryFilter::default(),
            None,
            true,
        );
        assert_eq!(lexical_only.explanations[0].id, "channel:telegram");
        assert!(lexical_only.explanations.iter().all(|explanation| explanation.dense.is_none()));
        assert_eq!(lexical_only.explanations[0].fused, lexical_only.explanations[0].lexical);
        // An exact name: fused 1, not adjusted by the prior.
        let exact = fixture.discover_explained(
            &fixture.query("Web-Search"),
            &config,
            &DiscoveryFilter::default(),
            Some(&biased_prior()),
            true,
        );
        let first = &exact.explanations[0];
        assert_eq!((first.id.as_str(), first.fused, first.exact, first.prior), ("tool:web-search", 1.0, true, 0.0));
    }

    /// Checks `result`'s explanations against what the ranking computes on its own.
    fn check_explanations(
        fixture: &Fixture,
        query: &Query,
        config: &DiscoveryConfig,
        prior: Option<&OutcomePrior>,
        result: &DiscoveryResult,
    ) -> Result<(), TestCaseError> {
        let filter = DiscoveryFilter::default();
        let ids: Vec<&str> = result.explanations.iter().map(|explanation| explanation.id.as_str()).collect();
        prop_assert_eq!(ids, tier1_ids(result));
        let limit = config.tier1_top_k * 2;
        let fusion = Fusion { lexical: config.lexical_weight, ..Fusion::default() };
        let retrieved = retrieve_with(query, &fixture.indexes(), &filter, limit, fusion);
        let graph_boost = config.use_graph_reranking.then_some(config.graph_boost_factor);
        let mut ranked = rank_with(query, &fixture.indexes(), &filter, limit, graph_boost, fusion);
        if let Some(prior) = prior {
            prior.apply(&mut ranked.hits);
        }
        for (explanation, entry) in result.explanations.iter().zip(&result.tier1) {
            prop_assert_eq!(explanation.relevance, entry.relevance);
            // The fused value is retrieval's score, float for float, for every entry it ranked.
            match retrieved.hits.iter().find(|hit| hit.id == explanation.id) {
                Some(hit) => {
                    prop_assert_eq!(explanation.fused, hit.relevance, "{:?}", explanation);
                    prop_assert_eq!(explanation.exact, hit.exact.is_some());
                }
                None => {
                    prop_assert_eq!(explanation.fused, 0.0);
                    prop_assert_eq!(explanation.lexical, 0.0);
                    prop_assert_eq!(explanation.dense, None);
                }
            }
            // The final ranking's score is the entry's relevance.
            if let Some(hit) = ranked.hits.iter().find(|hit| hit.id == explanation.id) {
                prop_assert_eq!(hit.relevance, entry.relevance);
            }
            let rebuilt = ((explanation.fused + explanation.graph) * (1.0 + explanation.prior)).clamp(0.0, 1.0);
            prop_assert!((rebuilt - entry.relevance).abs() < 1e-5, "{:?} rebuilds to {}", explanation, rebuilt);
            if !config.use_graph_reranking {
                prop_assert_eq!(explanation.graph, 0.0);
            }
            // lexical and dense are the part's own signals.
            let part = &query.parts[explanation.part];
            if explanation.fused > 0.0 {
                let doc = fixture.lexical.doc(&explanation.id).unwrap();
                let lexical = fixture.lexical.score(&part.text);
                let expected = lexical.scores.iter().find(|(d, _)| *d == doc).map_or(0.0, |(_, score)| *score);
                prop_assert_eq!(explanation.lexical, expected);
                let cosine = fixture
                    .vectors
                    .scores(&part.vector)
                    .zip(fixture.vectors.row(&explanation.id))
                    .map(|(scores, row)| scores[row]);
                prop_assert_eq!(explanation.dense, cosine);
            }
        }
        Ok(())
    }

    proptest! {
        /// Over random messages and settings, with and without vectors and a
        /// prior: the explanations name Tier 1's ids in order, their fused
        /// value is retrieval's score, and they rebuild each entry's relevance.
        #[test]
        fn explanations_are_the_rankings_own_numbers(
            words in proptest::collection::vec(proptest::sample::select(vec![
                "github", "issue", "pull", "request", "deploy", "site", "shell", "command", "slack", "post",
                "notes", "telegram", "message", "discord", "weather", "forecast", "web", "search", "then", ".",
                "Web-Search", "the", "a",
            ]), 1..12),
            top_k in 1usize..8,
            min_relevance in proptest::sample::select(vec![0.0f32, 0.1, 0.3]),
            graph in any::<bool>(),
            lexical_weight in proptest::sample::select(vec![0.0f32, 0.4, 0.6, 1.0]),
            with_prior in any::<bool>(),
            without_vectors in proptest::bool::weighted(0.2),
        ) {
            let fixture = explained_fixture();
            let message = words.join(" ").replace(" .", ".");
            let config = DiscoveryConfig {
                tier1_top_k: top_k,
                tier2_top_k: top_k.min(2),
                tier1_min_relevance: min_relevance,
                use_graph_reranking: graph,
                lexical_weight,
                ..DiscoveryConfig::default()
            };
            let prior = biased_prior();
            let prior = with_prior.then_some(&prior);
            let query = if without_vectors {
                Query::without_vectors(query_texts(&message), "down")
            } else {
                fixture.query(&message)
            };
            let explained = fixture.discover_explained(&query, &config, &DiscoveryFilter::default(), prior, true);
            let plain = fixture.discover_explained(&query, &config, &DiscoveryFilter::default(), prior, false);
            prop_assert_eq!(
                without_timings(DiscoveryResult { explanations: Vec::new(), ..explained.clone() }),
                without_timings(plain)
            );
            check_explanations(&fixture, &query, &config, prior, &explained)?;
        }
    }

    #[test]
    fn config_validation_rejects_nonsense() {
        assert!(DiscoveryConfig::default().validate().is_ok());
        let nan = DiscoveryConfig { tier1_min_relevance: f32::NAN, ..DiscoveryConfig::default() };
        assert_eq!(nan.validate().unwrap_err().field, "tier1MinRelevance");
        let top = DiscoveryConfig { tier2_top_k: 9, ..DiscoveryConfig::default() };
        assert_eq!(top.validate().unwrap_err().field, "tier2TopK");
    }
}
