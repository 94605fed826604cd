//! The per-query discovery filter: which capabilities a query may return
//! (kind, category, availability, excluded ids, the sources a workspace
//! enabled) and whether the outcome prior applies.
//!
//! It sits below both users: retrieval applies it while ranking, discovery
//! (which calls retrieval) and the catalog's Tier 0 take it as input.

use crate::core::descriptor::{CapabilityDescriptor, CapabilityKind};
use serde::{Deserialize, Serialize};

/// Per-query filters, and per-query ranking switches.
#[derive(Clone, Debug, Default, PartialEq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct DiscoveryFilter {
    /// Only this kind; `None` means any.
    pub kind: Option<CapabilityKind>,
    pub category: Option<String>,
    #[serde(default)]
    pub only_available: bool,
    /// Capabilities the query must not return (sorted, each once: a lookup is a binary search).
    #[serde(default)]
    pub excluded_capability_ids: ExcludedIds,
    /// Applies the outcome prior (`Some(false)` turns it off); `None` follows the configuration.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub outcome_prior: Option<bool>,
    /// The sources a workspace enabled: a capability of a source passes only when its
    /// source is listed; capabilities of no source always pass. `None`: every source.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub sources: Option<Vec<String>>,
}

impl DiscoveryFilter {
    /// Returns true when `descriptor` passes every filter.
    pub fn admits(&self, descriptor: &CapabilityDescriptor) -> bool {
        self.kind.is_none_or(|kind| descriptor.kind == kind)
            && self.category.as_deref().is_none_or(|category| descriptor.category.eq_ignore_ascii_case(category))
            && (!self.only_available || descriptor.available)
            && !self.excluded_capability_ids.contains(&descriptor.id)
            && self.admits_source(descriptor.definition_ref.source_id())
    }

    /// Returns true when a capability of `source_id` (`None`: of no source) passes the workspace's sources.
    pub fn admits_source(&self, source_id: Option<&str>) -> bool {
        match (&self.sources, source_id) {
            (Some(sources), Some(source_id)) => sources.iter().any(|enabled| enabled == source_id),
            _ => true,
        }
    }
}

/// The ids a query excludes, kept sorted and each once, so that checking a
/// descriptor costs a binary search whatever the list's length (a request
/// lists at most `limits.max_excluded_capabilities`, but a filter is checked
/// against every descriptor of a catalog). On the wire: a list of strings.
#[derive(Clone, Debug, Default, PartialEq, Eq, Serialize, Deserialize)]
#[serde(from = "Vec<String>", into = "Vec<String>")]
pub struct ExcludedIds(Vec<String>);

impl ExcludedIds {
    /// Returns true when `id` is excluded.
    pub fn contains(&self, id: &str) -> bool {
        self.0.binary_search_by(|excluded| excluded.as_str().cmp(id)).is_ok()
    }

    /// The excluded ids, in order.
    pub fn iter(&self) -> impl Iterator<Item = &str> {
        self.0.iter().map(String::as_str)
    }

    pub fn len(&self) -> usize {
        self.0.len()
    }

    pub fn is_empty(&self) -> bool {
        self.0.is_empty()
    }
}

impl From<Vec<String>> for ExcludedIds {
    fn from(mut ids: Vec<String>) -> ExcludedIds {
        ids.sort_unstable();
        ids.dedup();
        ExcludedIds(ids)
    }
}

impl FromIterator<String> for ExcludedIds {
    fn from_iter<I: IntoIterator<Item = String>>(ids: I) -> ExcludedIds {
        ExcludedIds::from(ids.into_iter().collect::<Vec<_>>())
    }
}

impl From<ExcludedIds> for Vec<String> {
    fn from(ids: ExcludedIds) -> Vec<String> {
        ids.0
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::core::dispatch_rules::Builtin;

    #[test]
    fn a_filter_admits_only_what_passes_every_field() {
        let descriptor = CapabilityDescriptor { available: false, ..Builtin::ALL[0].descriptor() };
        let admits = |filter: DiscoveryFilter| filter.admits(&descriptor);
        assert!(admits(DiscoveryFilter::default()));
        assert!(admits(DiscoveryFilter { kind: Some(descriptor.kind), ..DiscoveryFilter::default() }));
        let other_kind =
            if descriptor.kind == CapabilityKind::Tool { CapabilityKind::Skill } else { CapabilityKind::Tool };
        assert!(!admits(DiscoveryFilter { kind: Some(other_kind), ..DiscoveryFilter::default() }));
        let category = descriptor.category.to_uppercase();
        assert!(admits(DiscoveryFilter { category: Some(category), ..DiscoveryFilter::default() }));
        assert!(!admits(DiscoveryFilter {
            category: Some(format!("{}x", descriptor.category)),
            ..DiscoveryFilter::default()
        }));
        assert!(!admits(DiscoveryFilter { only_available: true, ..DiscoveryFilter::default() }));
        assert!(!admits(DiscoveryFilter {
            excluded_capability_ids: vec!["tool:zz-other".into(), descriptor.id.clone(), "a".into()].into(),
            ..DiscoveryFilter::default()
        }));
        assert!(admits(DiscoveryFilter {
            excluded_capability_ids: vec!["tool:zz-other".into(), "a".into()].into(),
            ..DiscoveryFilter::default()
        }));
        let only = |sources: &[&str]| DiscoveryFilter {
            sources: Some(sources.iter().map(|s| s.to_string()).collect()),
            ..DiscoveryFilter::default()
        };
        assert!(admits(only(&[])), "a capability of no source always passes");
        let of_source = CapabilityDescriptor {
            definition_ref: crate::core::descriptor::DefinitionRef::Source {
                source_id: "pets".into(),
                loadable: false,
            },
            ..descriptor.clone()
        };
        assert!(only(&["pets", "shop"]).admits(&of_source));
        assert!(!only(&["shop"]).admits(&of_source));
        assert!(!only(&[]).admits(&of_source), "an empty workspace sees no source");
        assert!(DiscoveryFilter::default().admits(&of_source));
    }

    proptest::proptest! {
        /// The excluded set answers like the list it was made from, in any order and with repeats.
        #[test]
        fn excluded_ids_contain_exactly_what_the_list_holds(
            ids in proptest::collection::vec("[a-c]{0,3}", 0..12),
            probe in "[a-c]{0,3}",
        ) {
            let excluded = ExcludedIds::from(ids.clone());
            proptest::prop_assert_eq!(excluded.contains(&probe), ids.contains(&probe));
            proptest::prop_assert!(excluded.iter().zip(excluded.iter().skip(1)).all(|(a, b)| a < b));
            let wire: Vec<String> = serde_json::from_value(serde_json::to_value(&excluded).unwrap()).unwrap();
            proptest::prop_assert_eq!(ExcludedIds::from(wire), excluded);
        }
    }
}
