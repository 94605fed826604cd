//! The catalog: every indexed capability by id, who contributed it, and the
//! rules for changing it.
//!
//! Capabilities come from *origins*: `builtin` (capdex itself), `runtime:<id>`
//! (an agent runtime's registrations over NATS), `dispatch` (the dispatch
//! registry's discoverable records), `source:<id>` (a source's tools),
//! `manifests` (the CAPABILITY.yaml folders) and `file:<path>` (a sources or
//! catalog file given on the command line). [`plan_change`] decides what a change means without
//! touching anything, so the indexer only carries the plan out.
//!
//! **Duplicate ids.** One id has one descriptor. When two origins offer the
//! same id, the one of higher precedence holds it: `builtin` > `runtime:*` >
//! `dispatch` > `source:*` > `manifests` > `file:*` (a live runtime tool keeps its own schema even when a
//! manifest or catalog names the same id). Among equals the current holder
//! keeps it. A refused offer is reported as a [`Conflict`], never dropped
//! silently; within one batch a repeated id is reported the same way.

use crate::core::descriptor::CapabilityDescriptor;
use crate::core::filter::DiscoveryFilter;
use crate::core::graph::Preset;
use crate::core::tiers::{assemble_tier0, CategoryMember, TokenBudget};
use serde::Serialize;
use std::collections::{BTreeMap, BTreeSet};

/// The origin of capdex's own capabilities.
pub const BUILTIN_ORIGIN: &str = "builtin";
/// The origin of the CAPABILITY.yaml folders.
pub const MANIFESTS_ORIGIN: &str = "manifests";
/// The origin of the dispatch registry's discoverable records.
pub const DISPATCH_ORIGIN: &str = "dispatch";

/// Returns the origin of a source's tools.
pub fn source_origin(source_id: &str) -> String {
    format!("source:{source_id}")
}

/// Returns the origin of a runtime's registrations.
pub fn runtime_origin(runtime_id: &str) -> String {
    format!("runtime:{runtime_id}")
}

/// Lower is stronger; see the module docs.
pub fn precedence(origin: &str) -> u8 {
    if origin == BUILTIN_ORIGIN {
        0
    } else if origin.starts_with("runtime:") {
        1
    } else if origin == DISPATCH_ORIGIN {
        2
    } else if origin.starts_with("source:") {
        3
    } else if origin == MANIFESTS_ORIGIN {
        4
    } else {
        5
    }
}

/// An immutable view of every indexed capability, by id.
#[derive(Clone, Debug, Default)]
pub struct Catalog {
    pub version: u64,
    pub descriptors: BTreeMap<String, CapabilityDescriptor>,
    /// The origin holding each id; ids missing here count as `builtin`.
    pub origins: BTreeMap<String, String>,
    /// Presets (capabilities used together) by the origin that gave them.
    pub presets: BTreeMap<String, Vec<Preset>>,
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

    /// Returns the origin holding `id`.
    pub fn origin(&self, id: &str) -> &str {
        self.origins.get(id).map_or(BUILTIN_ORIGIN, String::as_str)
    }

    /// Returns every preset, of every origin.
    pub fn all_presets(&self) -> Vec<Preset> {
        self.presets.values().flatten().cloned().collect()
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

/// How a change treats what the origin contributed before.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum ChangeMode {
    /// The incoming set is everything the origin has now (a folder scan).
    Replace,
    /// The incoming set is added to what the origin has (a registration batch).
    Merge,
}

/// An offer that was not taken, and why.
#[derive(Clone, Debug, PartialEq, Eq, Serialize)]
#[serde(rename_all = "camelCase")]
pub struct Conflict {
    pub id: String,
    pub problem: String,
}

/// What a change does.
#[derive(Clone, Debug, Default, PartialEq)]
pub struct ChangePlan {
    /// New or changed descriptors, with the origin that will hold them.
    pub upserts: Vec<CapabilityDescriptor>,
    /// Ids to drop.
    pub removals: Vec<String>,
    /// Offers identical to what is held.
    pub unchanged: usize,
    pub conflicts: Vec<Conflict>,
}

/// Plans a change by `origin`: `incoming` descriptors (replacing or merged
/// into what it held before, per `mode`) and explicit `removals` (ids the
/// origin holds; others are reported as conflicts).
pub fn plan_change(
    catalog: &Catalog,
    origin: &str,
    incoming: Vec<CapabilityDescriptor>,
    mode: ChangeMode,
    removals: &[String],
) -> ChangePlan {
    let mut plan = ChangePlan::default();
    let mut offered: BTreeSet<String> = BTreeSet::new();
    for descriptor in incoming {
        if !offered.insert(descriptor.id.clone()) {
            plan.conflicts.push(Conflict {
                id: descriptor.id.clone(),
                problem: "repeated in the same batch; the first one was used".into(),
            });
            continue;
        }
        let Some(existing) = catalog.get(&descriptor.id) else {
            plan.upserts.push(descriptor);
            continue;
        };
        let holder = catalog.origin(&descriptor.id);
        if holder != origin && precedence(holder) <= precedence(origin) {
            plan.conflicts.push(Conflict {
                id: descriptor.id.clone(),
                problem: format!("already provided by {holder}, which takes precedence; this one was not indexed"),
            });
        } else if holder == origin && *existing == descriptor {
            plan.unchanged += 1;
        } else {
            plan.upserts.push(descriptor);
        }
    }
    let mut removed: BTreeSet<String> = BTreeSet::new();
    if mode == ChangeMode::Replace {
        removed.extend(
            catalog
                .origins
                .iter()
                .filter(|(id, held_by)| held_by.as_str() == origin && !offered.contains(*id))
                .map(|(id, _)| id.clone()),
        );
    }
    for id in removals {
        match catalog.origins.get(id) {
            Some(held_by) if held_by == origin => {
                removed.insert(id.clone());
            }
            Some(held_by) => {
                plan.conflicts.push(Conflict { id: id.clone(), problem: format!("held by {held_by}, not removed") })
            }
            None => plan.conflicts.push(Conflict { id: id.clone(), problem: "not indexed".into() }),
        }
    }
    plan.removals = removed.into_iter().collect();
    plan
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::core::descriptor::DefinitionRef;
    use crate::core::dispatch_rules::Builtin;

    fn descriptor(id: &str, description: &str) -> CapabilityDescriptor {
        let mut descriptor = Builtin::Echo.descriptor();
        descriptor.id = id.into();
        descriptor.description = description.into();
        descriptor.definition_ref = DefinitionRef::Manifest { manifest_path: format!("{id}/CAPABILITY.yaml") };
        descriptor
    }

    fn catalog(entries: &[(&str, &str)]) -> Catalog {
        let mut catalog = Catalog::default();
        for (id, origin) in entries {
            catalog.descriptors.insert(id.to_string(), descriptor(id, id));
            catalog.origins.insert(id.to_string(), origin.to_string());
        }
        catalog
    }

    #[test]
    fn replace_upserts_changes_and_removes_what_is_gone() {
        let catalog = catalog(&[("tool:a", "manifests"), ("tool:b", "manifests"), ("tool:echo", "builtin")]);
        let incoming = vec![descriptor("tool:a", "tool:a"), descriptor("tool:c", "c"), descriptor("tool:echo", "x")];
        let plan = plan_change(&catalog, MANIFESTS_ORIGIN, incoming, ChangeMode::Replace, &[]);
        assert_eq!(plan.unchanged, 1);
        assert_eq!(plan.upserts.iter().map(|d| d.id.as_str()).collect::<Vec<_>>(), vec!["tool:c"]);
        assert_eq!(plan.removals, vec!["tool:b"]);
        assert_eq!(plan.conflicts.len(), 1);
        assert!(plan.conflicts[0].problem.contains("builtin"));
    }

    #[test]
    fn precedence_decides_who_holds_an_id() {
        let catalog = catalog(&[("tool:web", "manifests"), ("tool:live", "runtime:a")]);
        let plan = plan_change(
            &catalog,
            "runtime:b",
            vec![descriptor("tool:web", "live schema"), descriptor("tool:live", "other runtime")],
            ChangeMode::Merge,
            &[],
        );
        assert_eq!(plan.upserts.iter().map(|d| d.id.as_str()).collect::<Vec<_>>(), vec!["tool:web"]);
        assert_eq!(plan.conflicts.iter().map(|c| c.id.as_str()).collect::<Vec<_>>(), vec!["tool:live"]);
        let plan =
            plan_change(&catalog, "file:x.json", vec![descriptor("tool:web", "catalog")], ChangeMode::Merge, &[]);
        assert!(plan.upserts.is_empty() && plan.conflicts.len() == 1);
        let order = ["builtin", "runtime:a", DISPATCH_ORIGIN, &source_origin("pets"), MANIFESTS_ORIGIN, "file:x"];
        let ranks: Vec<u8> = order.iter().map(|origin| precedence(origin)).collect();
        assert!(ranks.windows(2).all(|pair| pair[0] < pair[1]), "{ranks:?}");
        let registered = super::tests::catalog(&[("tool:web", DISPATCH_ORIGIN)]);
        let plan =
            plan_change(&registered, MANIFESTS_ORIGIN, vec![descriptor("tool:web", "folder")], ChangeMode::Merge, &[]);
        assert!(plan.upserts.is_empty() && plan.conflicts[0].problem.contains("dispatch"));
    }

    #[test]
    fn merge_keeps_the_rest_and_removals_need_ownership() {
        let catalog = catalog(&[("tool:a", "runtime:r"), ("tool:b", "runtime:r"), ("tool:m", "manifests")]);
        let plan = plan_change(
            &catalog,
            "runtime:r",
            vec![descriptor("tool:c", "c"), descriptor("tool:c", "again")],
            ChangeMode::Merge,
            &["tool:a".to_string(), "tool:m".to_string(), "tool:zz".to_string()],
        );
        assert_eq!(plan.removals, vec!["tool:a"]);
        assert_eq!(plan.upserts.len(), 1);
        let problems: Vec<&str> = plan.conflicts.iter().map(|c| c.id.as_str()).collect();
        assert_eq!(problems, vec!["tool:c", "tool:m", "tool:zz"]);
    }
}
