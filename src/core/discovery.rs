//! Per-turn discovery: search, graph re-rank, token-budgeted tiers.
//!
//! [`discover`] is the whole per-turn pipeline over immutable inputs (a
//! [`Catalog`] snapshot, its vector index and graph, a query vector), so the
//! Router actor only gathers those and calls it.

use crate::core::catalog::Catalog;
use crate::core::descriptor::{CapabilityDescriptor, CapabilityKind};
use crate::core::graph::CapabilityGraph;
use crate::core::index::VectorIndex;
use crate::core::text::{detail_text, summary_line};
use crate::core::tiers::{
    assemble_tier1, assemble_tier2, estimate_tokens, Candidate, Tier1Entry, Tier2Entry, TokenBudget, TokenEstimate,
};
use serde::{Deserialize, Serialize};
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
}

impl Default for DiscoveryConfig {
    fn default() -> Self {
        DiscoveryConfig {
            tier0_token_budget: 200,
            tier1_token_budget: 800,
            tier2_token_budget: 2000,
            tier1_top_k: 5,
            tier2_top_k: 2,
            tier1_min_relevance: 0.3,
            use_graph_reranking: true,
            graph_boost_factor: 0.15,
        }
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

/// Per-query filters.
#[derive(Clone, Debug, Default, PartialEq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct DiscoveryFilter {
    /// Only this kind; `None` means any.
    pub kind: Option<CapabilityKind>,
    pub category: Option<String>,
    #[serde(default)]
    pub only_available: bool,
    #[serde(default)]
    pub excluded_capability_ids: Vec<String>,
}

impl DiscoveryFilter {
    /// Returns true when `descriptor` passes every filter.
    pub fn admits(&self, descriptor: &CapabilityDescriptor) -> bool {
        self.kind.is_none_or(|kind| descriptor.kind == kind)
            && self.category.as_deref().is_none_or(|category| descriptor.category.eq_ignore_ascii_case(category))
            && (!self.only_available || descriptor.available)
            && !self.excluded_capability_ids.contains(&descriptor.id)
    }
}

/// Timing and volume figures of one discovery.
#[derive(Clone, Debug, Default, PartialEq, Serialize)]
#[serde(rename_all = "camelCase")]
pub struct DiscoveryDiagnostics {
    pub candidates_scanned: usize,
    pub capabilities_retrieved: usize,
    pub total_indexed: usize,
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
}

/// Runs one discovery: search `index` with `query_vector`, re-rank with
/// `graph`, and assemble the tiers within `config`'s budgets.
pub fn discover(
    query_vector: &[f32],
    catalog: &Catalog,
    index: &VectorIndex,
    graph: &CapabilityGraph,
    config: &DiscoveryConfig,
    filter: &DiscoveryFilter,
    tier0: String,
) -> DiscoveryResult {
    let keep = |id: &str| catalog.get(id).is_some_and(|descriptor| filter.admits(descriptor));
    let hits = index.search(query_vector, config.tier1_top_k * 2, keep);
    let scored: Vec<(String, f32)> = hits.into_iter().map(|hit| (hit.id, hit.score)).collect();
    let ranked = if config.use_graph_reranking && !scored.is_empty() {
        graph.rerank(&scored, config.graph_boost_factor, keep)
    } else {
        scored
    };
    let candidates: Vec<Candidate> = ranked
        .iter()
        .filter(|(_, score)| *score >= config.tier1_min_relevance)
        .filter_map(|(id, score)| {
            catalog.get(id).map(|descriptor| Candidate {
                id: id.clone(),
                relevance: score.clamp(0.0, 1.0),
                summary: summary_line(descriptor),
            })
        })
        .take(config.tier1_top_k)
        .collect();
    let (tier1, tier1_block) = assemble_tier1(&candidates, TokenBudget::new(config.tier1_token_budget));
    let details: Vec<(String, String)> = tier1
        .iter()
        .take(config.tier2_top_k)
        .filter_map(|entry| catalog.get(&entry.id).map(|descriptor| (entry.id.clone(), detail_text(descriptor))))
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
    let diagnostics = DiscoveryDiagnostics {
        candidates_scanned: ranked.len(),
        capabilities_retrieved: retrieved.len(),
        total_indexed: catalog.len(),
    };
    let rendered = format!("{tier0}{tier1_block}{tier2_block}");
    debug_assert!(estimate_tokens(&rendered) <= token_estimate.total_tokens);
    DiscoveryResult { tier0, tier1, tier2, token_estimate, rendered, diagnostics }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::core::descriptor::SourceRef;
    use crate::core::embedder::{Embed, HashingEmbedder};
    use crate::core::text::embedding_text;

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
            source_ref: SourceRef::Builtin,
        }
    }

    fn fixture() -> (Catalog, VectorIndex, CapabilityGraph, HashingEmbedder) {
        let embedder = HashingEmbedder::default();
        let descriptors = vec![
            descriptor("channel:telegram", "Send and receive messages in Telegram chats", "communication", true),
            descriptor("channel:discord", "Send messages to Discord servers and channels", "communication", false),
            descriptor("tool:weather", "Get the weather forecast for a city", "information", true),
            descriptor("tool:web-search", "Search the web for current information", "information", true),
        ];
        let mut index = VectorIndex::new(embedder.dimensions());
        let mut catalog = Catalog::default();
        for descriptor in &descriptors {
            index.upsert(&descriptor.id, &embedder.embed(&embedding_text(descriptor))).unwrap();
            catalog.descriptors.insert(descriptor.id.clone(), descriptor.clone());
        }
        let graph = CapabilityGraph::build(&descriptors, &[]);
        (catalog, index, graph, embedder)
    }

    #[test]
    fn finds_the_relevant_capability_within_budget() {
        let (catalog, index, graph, embedder) = fixture();
        let config = DiscoveryConfig::default();
        let filter = DiscoveryFilter::default();
        let tier0 = catalog.tier0(&filter, TokenBudget::new(config.tier0_token_budget));
        let result =
            discover(&embedder.embed("send a telegram message"), &catalog, &index, &graph, &config, &filter, tier0);
        assert_eq!(result.tier1[0].id, "channel:telegram");
        assert_eq!(result.tier2[0].id, "channel:telegram");
        assert!(result.token_estimate.total_tokens <= 3000);
        assert!(result.rendered.contains("Relevant capabilities:\n1. telegram (channel)"));
    }

    #[test]
    fn filters_apply() {
        let (catalog, index, graph, embedder) = fixture();
        let config = DiscoveryConfig { tier1_min_relevance: 0.0, ..DiscoveryConfig::default() };
        let filter =
            DiscoveryFilter { only_available: true, kind: Some(CapabilityKind::Channel), ..DiscoveryFilter::default() };
        let result = discover(
            &embedder.embed("send a discord message"),
            &catalog,
            &index,
            &graph,
            &config,
            &filter,
            String::new(),
        );
        assert_eq!(result.tier1.iter().map(|e| e.id.as_str()).collect::<Vec<_>>(), vec!["channel:telegram"]);
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
