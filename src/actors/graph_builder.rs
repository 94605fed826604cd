//! GraphBuilder: rebuilds the capability graph (petgraph, via
//! `core::graph::CapabilityGraph::build`) for each new catalog and publishes it.
//! Runs on a `SyncArbiter` thread: a build over a large catalog is CPU work
//! that would otherwise stall the System's thread, and every request with it.

use crate::actors::snapshot::SnapshotCell;
use crate::actors::Inspect;
use crate::core::catalog::Catalog;
use crate::core::graph::{CapabilityGraph, GraphStats, Preset};
use actix::prelude::*;
use std::sync::Arc;

/// Builds the graph of `catalog`; replies once subscribers have been sent it.
#[derive(Message, Debug)]
#[rtype(result = "GraphStats")]
pub struct BuildGraph {
    pub catalog: Arc<Catalog>,
}

/// A graph for catalog `version`.
#[derive(Message, Debug, Clone)]
#[rtype(result = "()")]
pub struct GraphPublished {
    pub version: u64,
    pub graph: Arc<CapabilityGraph>,
}

/// The last graph built.
#[derive(Debug, Clone, Default, PartialEq)]
pub struct GraphBuilderStats {
    pub version: u64,
    pub builds: u64,
    pub graph: GraphStats,
}

pub struct GraphBuilder {
    presets: Vec<Preset>,
    subscribers: Vec<Recipient<GraphPublished>>,
    /// Where discovery reads its snapshots, written before a build is replied to.
    snapshots: Option<Arc<SnapshotCell>>,
    stats: GraphBuilderStats,
}

impl GraphBuilder {
    pub fn new(presets: Vec<Preset>, subscribers: Vec<Recipient<GraphPublished>>) -> GraphBuilder {
        GraphBuilder { presets, subscribers, snapshots: None, stats: GraphBuilderStats::default() }
    }

    /// Publishes every graph into `snapshots` too, before replying to its build.
    pub fn with_snapshot_cell(mut self, snapshots: Arc<SnapshotCell>) -> GraphBuilder {
        self.snapshots = Some(snapshots);
        self
    }
}

impl Actor for GraphBuilder {
    type Context = SyncContext<Self>;
}

impl Handler<BuildGraph> for GraphBuilder {
    type Result = MessageResult<BuildGraph>;

    fn handle(&mut self, msg: BuildGraph, _: &mut SyncContext<Self>) -> Self::Result {
        let mut presets = self.presets.clone();
        presets.extend(msg.catalog.all_presets());
        // Borrowed from the catalog: no copy of its descriptors.
        let graph = Arc::new(CapabilityGraph::build_from(msg.catalog.descriptors.values(), &presets));
        let stats = graph.stats();
        if let Some(snapshots) = &self.snapshots {
            snapshots.publish_graph(msg.catalog.version, &graph);
        }
        for subscriber in &self.subscribers {
            subscriber.do_send(GraphPublished { version: msg.catalog.version, graph: graph.clone() });
        }
        self.stats =
            GraphBuilderStats { version: msg.catalog.version, builds: self.stats.builds + 1, graph: stats.clone() };
        MessageResult(stats)
    }
}

impl Handler<Inspect<GraphBuilderStats>> for GraphBuilder {
    type Result = MessageResult<Inspect<GraphBuilderStats>>;

    fn handle(&mut self, _: Inspect<GraphBuilderStats>, _: &mut SyncContext<Self>) -> Self::Result {
        MessageResult(self.stats.clone())
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::actors::test_support::{collector, tool};

    #[actix::test]
    async fn a_build_uses_every_preset_and_is_published_before_its_reply() {
        let configured = Preset { name: "configured".into(), capability_ids: vec!["tool:a".into(), "tool:b".into()] };
        let offered = Preset { name: "offered".into(), capability_ids: vec!["tool:b".into(), "tool:c".into()] };
        let descriptors = vec![tool("a", "Read a gauge"), tool("b", "Open a valve"), tool("c", "Close a valve")];
        let mut catalog = Catalog { version: 7, ..Catalog::default() };
        for descriptor in &descriptors {
            catalog.descriptors.insert(descriptor.id.clone(), descriptor.clone());
        }
        catalog.presets.insert("runtime:r".into(), vec![offered.clone()]);
        let (subscriber, published) = collector::<GraphPublished>();
        let cell = Arc::new(SnapshotCell::default());
        let (presets, graph_cell) = (vec![configured.clone()], cell.clone());
        let builder = SyncArbiter::start(1, move || {
            GraphBuilder::new(presets.clone(), vec![subscriber.clone()]).with_snapshot_cell(graph_cell.clone())
        });
        let stats = builder.send(BuildGraph { catalog: Arc::new(catalog) }).await.unwrap();
        assert_eq!(stats, CapabilityGraph::build(&descriptors, &[configured, offered]).stats());
        assert_ne!(stats, CapabilityGraph::build(&descriptors, &[]).stats(), "presets add edges");
        assert_eq!(cell.load().graph_version, 7);
        assert_eq!(cell.load().graph.stats(), stats);
        let observed = builder.send(Inspect::<GraphBuilderStats>::new()).await.unwrap();
        assert_eq!(observed, GraphBuilderStats { version: 7, builds: 1, graph: stats });
        // The subscriber's copy was sent before the reply; wait until it is handled.
        for _ in 0..200 {
            if !published.lock().unwrap().is_empty() {
                break;
            }
            actix::clock::sleep(std::time::Duration::from_millis(5)).await;
        }
        let published = published.lock().unwrap();
        assert_eq!(published.iter().map(|graph| graph.version).collect::<Vec<_>>(), [7]);
    }
}
