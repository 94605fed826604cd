//! The catalog: every indexed capability by id, and the rules for changing it.
//!
//! Capabilities come from origins (the manifest folders, a runtime's
//! registrations, capdex's built-ins). A sync replaces everything one origin
//! contributed; [`plan_sync`] decides what that means without touching
//! anything, so the indexer only carries the plan out.

use crate::core::descriptor::{CapabilityDescriptor, SourceRef};
use crate::core::discovery::DiscoveryFilter;
use crate::core::tiers::{assemble_tier0, CategoryMember, TokenBudget};
use std::collections::{BTreeMap, BTreeSet};

/// An immutable view of every indexed capability, by id.
#[derive(Clone, Debug, Default)]
pub struct Catalog {
    pub version: u64,
    pub descriptors: BTreeMap<String, CapabilityDescriptor>,
}

impl Catalog {
    pub fn get(&self, id: &str) -> Option<&CapabilityDescriptor> {
        self.descriptors.get(id)
    }

    pub fn len(&self) -> usize {
        self.descriptors.len()
    }

    pub fn is_empty(&self) -> bool {
        self.descriptors.is_empty()
    }

    /// Builds the Tier 0 map of the capabilities `filter` admits.
    pub fn tier0(&self, filter: &DiscoveryFilter, budget: TokenBudget) -> String {
        let members: Vec<CategoryMember<'_>> = self
            .descriptors
            .values()
            .filter(|descriptor| filter.admits(descriptor))
            .map(|descriptor| CategoryMember { category: &descriptor.category, name: &descriptor.name })
            .collect();
        assemble_tier0(&members, budget)
    }
}

/// The origin a descriptor belongs to: `manifests`, `builtin` or `registration:<runtime>`.
pub fn origin_of(source_ref: &SourceRef) -> String {
    match source_ref {
        SourceRef::Manifest { .. } => "manifests".to_string(),
        SourceRef::Registration { registered_by } => format!("registration:{registered_by}"),
        SourceRef::Builtin => "builtin".to_string(),
    }
}

/// What a sync changes.
#[derive(Clone, Debug, Default, PartialEq)]
pub struct SyncPlan {
    /// New or changed descriptors.
    pub upserts: Vec<CapabilityDescriptor>,
    /// Ids the origin no longer provides.
    pub removals: Vec<String>,
    /// Descriptors unchanged since the last sync.
    pub unchanged: usize,
    /// Incoming ids already held by another origin: `(id, holding origin)`.
    pub conflicts: Vec<(String, String)>,
}

/// Plans replacing everything `origin` contributed with `incoming`.
///
/// An id held by a different origin is not taken over: a runtime's live tool
/// keeps its own descriptor even when a manifest names the same id.
pub fn plan_sync(catalog: &Catalog, origin: &str, incoming: Vec<CapabilityDescriptor>) -> SyncPlan {
    let mut plan = SyncPlan::default();
    let mut offered: BTreeSet<String> = BTreeSet::new();
    for descriptor in incoming {
        if !offered.insert(descriptor.id.clone()) {
            continue;
        }
        match catalog.get(&descriptor.id) {
            Some(existing) if origin_of(&existing.source_ref) != origin => {
                plan.conflicts.push((descriptor.id.clone(), origin_of(&existing.source_ref)));
            }
            Some(existing) if *existing == descriptor => plan.unchanged += 1,
            _ => plan.upserts.push(descriptor),
        }
    }
    plan.removals = catalog
        .descriptors
        .values()
        .filter(|descriptor| origin_of(&descriptor.source_ref) == origin && !offered.contains(&descriptor.id))
        .map(|descriptor| descriptor.id.clone())
        .collect();
    plan
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::core::dispatch_rules::Builtin;

    fn manifest(id: &str, description: &str) -> CapabilityDescriptor {
        let mut descriptor = Builtin::Echo.descriptor();
        descriptor.id = id.into();
        descriptor.description = description.into();
        descriptor.source_ref = SourceRef::Manifest { manifest_path: format!("{id}/CAPABILITY.yaml") };
        descriptor
    }

    #[test]
    fn sync_upserts_changes_and_removes_what_is_gone() {
        let mut catalog = Catalog::default();
        for descriptor in [manifest("tool:a", "a"), manifest("tool:b", "b"), Builtin::Echo.descriptor()] {
            catalog.descriptors.insert(descriptor.id.clone(), descriptor);
        }
        let plan = plan_sync(
            &catalog,
            "manifests",
            vec![manifest("tool:a", "a"), manifest("tool:c", "c"), manifest("tool:echo", "x")],
        );
        assert_eq!(plan.unchanged, 1);
        assert_eq!(plan.upserts.iter().map(|d| d.id.as_str()).collect::<Vec<_>>(), vec!["tool:c"]);
        assert_eq!(plan.removals, vec!["tool:b"]);
        assert_eq!(plan.conflicts, vec![("tool:echo".to_string(), "builtin".to_string())]);
    }
}
