//! DiscoveryWorker: runs discoveries off the System's thread. A pool of
//! `[discovery] workers` threads, each reading the [`SnapshotCell`]
//! (immutable `Arc` snapshots of one catalog version), so the NATS service's
//! discover, search and plan requests rank on every core while the System's
//! thread only does their I/O.
//!
//! The pool is a mutex-guarded queue with a condition variable, not a
//! `SyncArbiter`: an idle thread sleeps until a job arrives, where the
//! arbiter's channel spins and yields to the scheduler before it parks (a
//! measured tenth of a serving node's CPU on two cores, taken from the
//! threads that have work).
//!
//! A worker embeds the query itself when the embedder is in-process and cheap
//! (the built-in hashing and the static embedders, pure and deterministic); otherwise
//! [`DiscoveryLanes::run`] asks the Embedder actor first and hands the vectors
//! over. The caller's `finish` runs on the worker too, so a reply is encoded
//! there (JSON or msgpack) and the System's thread sends bytes.

use crate::actors::discoverer::{run_discovery, ChatterVectors, Discover, DiscovererError, QueryVectors};
use crate::actors::embedder::EmbedTexts;
use crate::actors::snapshot::SnapshotCell;
use crate::core::catalog::Catalog;
use crate::core::discovery::{DiscoveryConfig, DiscoveryResult};
use crate::core::embedder::{embed_in_batches_as, Embed, EmbedError, TextRole};
use crate::core::retrieval::query_texts;
use actix::prelude::*;
use std::collections::VecDeque;
use std::sync::{Arc, Condvar, Mutex};
use std::time::Instant;

/// Turns a discovery's result (with the catalog it was ranked on) into the caller's answer, on the worker.
pub type Finish<R> = Box<dyn FnOnce(Result<DiscoveryResult, DiscovererError>, &Catalog) -> R + Send>;

/// One discovery for a worker.
pub struct RunDiscovery<R> {
    pub discover: Discover,
    /// The Embedder actor's answer for `query_texts(discover.query)`; `None`:
    /// the worker embeds with its own model.
    pub embedded: Option<QueryVectors>,
    pub finish: Finish<R>,
}

/// One discovery thread's state.
pub struct DiscoveryWorker {
    snapshots: Arc<SnapshotCell>,
    config: DiscoveryConfig,
    prior_enabled: bool,
    /// The in-process embedder, when queries are embedded here.
    model: Option<Box<dyn Embed + Send>>,
    batch_size: usize,
    /// The chatter sentences' vectors by `model`, made when a discovery first needs them.
    chatter: Option<Arc<Vec<Vec<f32>>>>,
}

impl DiscoveryWorker {
    pub fn new(
        snapshots: Arc<SnapshotCell>,
        config: DiscoveryConfig,
        prior_enabled: bool,
        model: Option<Box<dyn Embed + Send>>,
        batch_size: usize,
    ) -> DiscoveryWorker {
        DiscoveryWorker { snapshots, config, prior_enabled, model, batch_size: batch_size.max(1), chatter: None }
    }

    /// Embeds (unless given vectors), ranks on the current snapshot and finishes.
    fn run<R>(&mut self, msg: RunDiscovery<R>) -> R {
        let texts = query_texts(&msg.discover.query);
        let embedded = match (msg.embedded, &self.model) {
            (Some(embedded), _) => embedded,
            (None, Some(model)) => {
                let started = Instant::now();
                let vectors = embed_in_batches_as(model.as_ref(), &texts, self.batch_size, TextRole::Query);
                let embed_us = started.elapsed().as_secs_f64() * 1e6;
                let gate = msg.discover.config.as_ref().unwrap_or(&self.config).chatter_gate;
                let chatter = match &self.chatter {
                    Some(chatter) => chatter.clone(),
                    None if gate => {
                        let sentences = crate::core::nothing_fits::chatter_texts();
                        // A failure leaves them unknown; the next discovery that needs them asks again.
                        match embed_in_batches_as(model.as_ref(), &sentences, self.batch_size, TextRole::Query) {
                            Ok(vectors) => self.chatter.insert(Arc::new(vectors)).clone(),
                            Err(_) => Arc::default(),
                        }
                    }
                    None => Arc::default(),
                };
                QueryVectors { vectors, embed_us, chatter }
            }
            (None, None) => {
                let reason = "no query vectors were given to a discovery worker without a model";
                let error = EmbedError::new(crate::core::embedder::EmbedErrorCode::Unavailable, reason);
                QueryVectors { vectors: Err(error), embed_us: 0.0, chatter: Arc::default() }
            }
        };
        let snapshot = self.snapshots.load();
        let result = run_discovery(&snapshot, &self.config, self.prior_enabled, &msg.discover, texts, embedded);
        self.snapshots.count_query();
        (msg.finish)(result, &snapshot.catalog)
    }
}

/// A job for whichever worker thread takes it first.
type Job = Box<dyn FnOnce(&mut DiscoveryWorker) + Send>;

/// The queue the worker threads take jobs from.
#[derive(Default)]
struct Queue {
    jobs: Mutex<Jobs>,
    /// Signalled for each job pushed, and for all when the pool closes.
    ready: Condvar,
}

#[derive(Default)]
struct Jobs {
    waiting: VecDeque<Job>,
    closed: bool,
    /// Workers asleep on [`Queue::ready`] (or woken and not yet back at the
    /// queue), and how many of them a push has signalled already. A push
    /// signals only when some sleeper has not been: a signal is a system
    /// call whether or not anyone waits, a burst of pushes needs each sleeper
    /// woken once, and a busy worker looks at the queue before it sleeps.
    sleeping: usize,
    signalled: usize,
}

/// The worker threads; closing (dropping the last [`DiscoveryLanes`]) lets
/// each finish the jobs queued and exit.
struct Pool {
    queue: Arc<Queue>,
}

impl Pool {
    /// Starts `threads`, each with the worker `factory` makes on it.
    fn start(threads: usize, factory: impl Fn() -> DiscoveryWorker + Send + Sync + 'static) -> std::io::Result<Pool> {
        let queue = Arc::new(Queue::default());
        let factory = Arc::new(factory);
        for index in 0..threads {
            let (queue, factory) = (queue.clone(), factory.clone());
            std::thread::Builder::new()
                .name(format!("capdex-discovery-{index}"))
                .spawn(move || work(&queue, factory()))?;
        }
        Ok(Pool { queue })
    }

    fn push(&self, job: Job) -> Result<(), MailboxError> {
        let mut jobs = self.queue.jobs.lock().unwrap_or_else(|poisoned| poisoned.into_inner());
        if jobs.closed {
            return Err(MailboxError::Closed);
        }
        jobs.waiting.push_back(job);
        let wake_one = jobs.sleeping > jobs.signalled;
        if wake_one {
            jobs.signalled += 1;
        }
        drop(jobs);
        if wake_one {
            self.queue.ready.notify_one();
        }
        Ok(())
    }
}

impl Drop for Pool {
    fn drop(&mut self) {
        self.queue.jobs.lock().unwrap_or_else(|poisoned| poisoned.into_inner()).closed = true;
        self.queue.ready.notify_all();
    }
}

/// A worker thread: takes jobs until the pool is closed and drained. A job
/// that panics drops its answer (the caller gets an error); the thread goes on.
fn work(queue: &Queue, mut worker: DiscoveryWorker) {
    loop {
        let job = {
            let mut jobs = queue.jobs.lock().unwrap_or_else(|poisoned| poisoned.into_inner());
            loop {
                if let Some(job) = jobs.waiting.pop_front() {
                    break job;
                }
                if jobs.closed {
                    return;
                }
                jobs.sleeping += 1;
                jobs = queue.ready.wait(jobs).unwrap_or_else(|poisoned| poisoned.into_inner());
                jobs.sleeping -= 1;
                // Woken by a push, by the close or spuriously: either way one
                // fewer sleeper is owed a signal.
                jobs.signalled = jobs.signalled.saturating_sub(1).min(jobs.sleeping);
            }
        };
        let ran = std::panic::catch_unwind(std::panic::AssertUnwindSafe(|| job(&mut worker)));
        if ran.is_err() {
            tracing::error!("a discovery panicked on a worker thread; its request gets an error");
        }
    }
}

/// How the gateway reaches the workers: their queue and, when queries are
/// not embedded on the workers, the Embedder to ask first.
#[derive(Clone)]
pub struct DiscoveryLanes {
    pool: Arc<Pool>,
    /// `None` when the workers embed queries themselves (the built-in embedder).
    pub embedder: Option<Recipient<EmbedTexts>>,
    /// The chatter sentences' vectors by `embedder`'s model, asked with the
    /// first query the chatter gate applies to.
    chatter: ChatterVectors,
    /// Whether the gate is on for a request without settings of its own (`[discovery] chatter_gate`).
    chatter_gate: bool,
    /// How many worker threads serve.
    pub threads: usize,
}

impl DiscoveryLanes {
    /// Starts `threads` worker threads (at least one), each with the worker
    /// `factory` makes on it; `embedder`: the Embedder to ask for query
    /// vectors first, `None` when the workers embed themselves.
    pub fn start(
        threads: usize,
        factory: impl Fn() -> DiscoveryWorker + Send + Sync + 'static,
        embedder: Option<Recipient<EmbedTexts>>,
    ) -> std::io::Result<DiscoveryLanes> {
        let threads = threads.max(1);
        Ok(DiscoveryLanes {
            pool: Arc::new(Pool::start(threads, factory)?),
            embedder,
            chatter: ChatterVectors::default(),
            chatter_gate: false,
            threads,
        })
    }

    /// Asks the Embedder for the chatter sentences' vectors with the first
    /// query the chatter gate applies to: those with settings of their own
    /// that turn it on, and, when `on` (the configured `chatter_gate`), every
    /// other one. Off (the default), only the former.
    pub fn with_chatter_gate(mut self, on: bool) -> DiscoveryLanes {
        self.chatter_gate = on;
        self
    }

    /// Runs `discover` on a worker and returns what `finish` made of it there.
    pub async fn run<R: Send + 'static>(&self, discover: Discover, finish: Finish<R>) -> Result<R, MailboxError> {
        let embedded = match &self.embedder {
            None => None,
            Some(embedder) => {
                let started = Instant::now();
                let texts = query_texts(&discover.query);
                let n_query = texts.len();
                let gate = discover.config.as_ref().map_or(self.chatter_gate, |config| config.chatter_gate);
                let asked = if gate { self.chatter.texts_for(texts) } else { texts };
                let answer = embedder.send(EmbedTexts { texts: asked, role: TextRole::Query }).await?;
                let vectors = self.chatter.take(answer.vectors, n_query);
                let embed_us = started.elapsed().as_secs_f64() * 1e6;
                Some(QueryVectors { vectors, embed_us, chatter: self.chatter.get() })
            }
        };
        let (answer, answered) = futures::channel::oneshot::channel();
        let msg = RunDiscovery { discover, embedded, finish };
        self.pool.push(Box::new(move |worker: &mut DiscoveryWorker| {
            let _ = answer.send(worker.run(msg));
        }))?;
        answered.await.map_err(|_| MailboxError::Closed)
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::actors::discoverer::{Discoverer, DiscovererStats};
    use crate::actors::embedder::Embedder;
    use crate::actors::Inspect;
    use crate::core::descriptor::CapabilityDescriptor;
    use crate::core::discovery::DiscoveryFilter;
    use crate::core::dispatch_rules::Builtin;
    use crate::core::embedder::HashingEmbedder;
    use crate::core::graph::CapabilityGraph;
    use crate::core::index::VectorIndex;
    use crate::core::lexical::LexicalIndex;
    use crate::core::text::embedding_text;

    fn tool(name: &str, description: &str) -> CapabilityDescriptor {
        crate::core::descriptor::test_tool(name, description)
    }

    /// A few capabilities as catalog `version`, published into `cell` with their graph.
    fn publish(cell: &SnapshotCell, version: u64) -> Arc<Catalog> {
        let embedder = HashingEmbedder::default();
        let mut descriptors: Vec<_> = Builtin::ALL.iter().map(|builtin| builtin.descriptor()).collect();
        descriptors.extend([
            tool("send-message", "Send a message to a team channel"),
            tool("invoice-lookup", "Look up an invoice by number and return its status"),
            tool("list-capabilities", "List what is indexed, by kind and origin"),
            tool("weather", "Tell the weather forecast for a city"),
        ]);
        let mut catalog = Catalog::default();
        let mut index = VectorIndex::new(embedder.dimensions());
        for descriptor in &descriptors {
            index.upsert(&descriptor.id, &embedder.embed(&embedding_text(descriptor))).unwrap();
            catalog.descriptors.insert(descriptor.id.clone(), descriptor.clone());
        }
        catalog.version = version;
        let catalog = Arc::new(catalog);
        let lexical = Arc::new(LexicalIndex::build(&descriptors));
        cell.publish_catalog(&catalog, &Arc::new(index), &lexical);
        cell.publish_graph(version, &Arc::new(CapabilityGraph::build(&descriptors, &[])));
        catalog
    }

    fn without_timings(mut result: DiscoveryResult) -> DiscoveryResult {
        result.diagnostics.timings = Default::default();
        result
    }

    fn discover(query: &str) -> Discover {
        Discover { query: query.to_string(), filter: DiscoveryFilter::default(), config: None, explain: false }
    }

    fn keep() -> Finish<Result<DiscoveryResult, String>> {
        Box::new(|result, _| result.map_err(|err| err.to_string()))
    }

    #[actix::test]
    async fn workers_answer_as_the_discoverer_does_and_are_counted() {
        let cell = Arc::new(SnapshotCell::default());
        publish(&cell, 3);
        let config = DiscoveryConfig::default();
        let embedder = SyncArbiter::start(1, || Embedder::new(Box::new(HashingEmbedder::default())));
        let discoverer =
            Discoverer::new(config.clone(), embedder.clone().recipient()).with_snapshot_cell(cell.clone()).start();
        let lanes = {
            let cell = cell.clone();
            let config = config.clone();
            let factory = move || {
                let model: Box<dyn Embed + Send> = Box::new(HashingEmbedder::default());
                DiscoveryWorker::new(cell.clone(), config.clone(), true, Some(model), 32)
            };
            DiscoveryLanes::start(2, factory, None).unwrap()
        };
        // A worker without a model gets the Embedder actor's vectors.
        let relayed = {
            let (cell, config) = (cell.clone(), config.clone());
            let factory = move || DiscoveryWorker::new(cell.clone(), config.clone(), true, None, 32);
            DiscoveryLanes::start(1, factory, Some(embedder.recipient())).unwrap()
        };
        for query in ["echo this text back", "list what is indexed", "send a message to the team"] {
            let by_discoverer = without_timings(discoverer.send(discover(query)).await.unwrap().unwrap());
            assert_eq!(by_discoverer.diagnostics.embedder, "ok");
            assert!(!by_discoverer.tier1.is_empty(), "{query}: {by_discoverer:?}");
            let on_worker = without_timings(lanes.run(discover(query), keep()).await.unwrap().unwrap());
            assert_eq!(on_worker, by_discoverer, "{query}");
            let relayed = without_timings(relayed.run(discover(query), keep()).await.unwrap().unwrap());
            assert_eq!(relayed, by_discoverer, "{query}");
        }
        // `finish` sees the catalog the query was ranked on.
        let version = lanes.run(discover("anything"), Box::new(|_, catalog| catalog.version)).await.unwrap();
        assert_eq!(version, 3);
        let stats = discoverer.send(Inspect::<DiscovererStats>::new()).await.unwrap();
        assert_eq!((stats.queries, stats.catalog_version, stats.graph_version), (10, 3, 3));
    }

    #[actix::test]
    async fn with_the_chatter_gate_chatter_gets_an_empty_tier1_on_every_path() {
        let cell = Arc::new(SnapshotCell::default());
        publish(&cell, 1);
        let config = DiscoveryConfig { chatter_gate: true, ..DiscoveryConfig::default() };
        let embedder = SyncArbiter::start(1, || Embedder::new(Box::new(HashingEmbedder::default())));
        let discoverer =
            Discoverer::new(config.clone(), embedder.clone().recipient()).with_snapshot_cell(cell.clone()).start();
        let in_process = {
            let (cell, config) = (cell.clone(), config.clone());
            let factory = move || {
                let model: Box<dyn Embed + Send> = Box::new(HashingEmbedder::default());
                DiscoveryWorker::new(cell.clone(), config.clone(), false, Some(model), 32)
            };
            DiscoveryLanes::start(1, factory, None).unwrap()
        };
        let relayed = {
            let (cell, config) = (cell.clone(), config.clone());
            let factory = move || DiscoveryWorker::new(cell.clone(), config.clone(), false, None, 32);
            DiscoveryLanes::start(1, factory, Some(embedder.recipient())).unwrap().with_chatter_gate(true)
        };
        // (request, emptied by the gate, Tier 1 empty): "hello" matches nothing at all, so there is nothing to gate.
        for (query, gated, empty) in [
            ("thanks a lot for your help earlier, see you tomorrow", true, true),
            ("send a message to the team channel", false, false),
            ("hello", false, true),
            // A message that names a capability is never chatter.
            ("weather", false, false),
        ] {
            // The relayed lanes and the Discoverer ask for the chatter sentences with their first query.
            let by_discoverer = without_timings(discoverer.send(discover(query)).await.unwrap().unwrap());
            let check = by_discoverer.diagnostics.chatter.expect("the gate read the request");
            assert_eq!(check.nothing_fits, gated, "{query}: {check:?}");
            assert_eq!(by_discoverer.tier1.is_empty(), empty, "{query}: {:?}", by_discoverer.tier1);
            let on_worker = without_timings(in_process.run(discover(query), keep()).await.unwrap().unwrap());
            assert_eq!(on_worker, by_discoverer, "{query}");
            let relayed = without_timings(relayed.run(discover(query), keep()).await.unwrap().unwrap());
            assert_eq!(relayed, by_discoverer, "{query}");
        }
        // A request may turn the gate off; then nothing is read and Tier 1 is chosen as usual.
        let mut off = discover("hello");
        off.config = Some(DiscoveryConfig { chatter_gate: false, tier1_min_relevance: 0.0, ..config.clone() });
        let result = in_process.run(off, keep()).await.unwrap().unwrap();
        assert_eq!(result.diagnostics.chatter, None);
    }

    #[actix::test]
    async fn a_worker_without_vectors_ranks_lexically_and_says_why() {
        let cell = Arc::new(SnapshotCell::default());
        publish(&cell, 1);
        let lanes = {
            let cell = cell.clone();
            let factory = move || DiscoveryWorker::new(cell.clone(), DiscoveryConfig::default(), false, None, 32);
            DiscoveryLanes::start(1, factory, None).unwrap()
        };
        let result = lanes.run(discover("look up invoice 42"), keep()).await.unwrap().unwrap();
        assert!(result.diagnostics.embedder.starts_with("unavailable: "), "{:?}", result.diagnostics);
        assert!(!result.tier1.is_empty());
        // Per-query settings are checked on the worker too.
        let bad = DiscoveryConfig { tier1_min_relevance: 2.0, ..DiscoveryConfig::default() };
        let query = Discover { config: Some(bad), ..discover("anything") };
        assert!(lanes.run(query, keep()).await.unwrap().unwrap_err().contains("not valid"));
    }

    #[test]
    fn the_cell_never_goes_back_to_an_older_version() {
        let cell = SnapshotCell::default();
        let newer = publish(&cell, 5);
        let graph = cell.load().graph.clone();
        let tier0 = cell.load().tier0(&DiscoveryFilter::default(), crate::core::tiers::TokenBudget::new(200));
        assert!(!tier0.is_empty());
        publish(&cell, 4);
        let current = cell.load();
        assert!(Arc::ptr_eq(&current.catalog, &newer));
        assert!(Arc::ptr_eq(&current.graph, &graph));
        assert_eq!(current.graph_version, 5);
        // A newer graph or prior keeps the catalog and its Tier 0 cache.
        cell.publish_graph(6, &Arc::new(CapabilityGraph::default()));
        cell.publish_prior(&Arc::new(crate::core::outcome_prior::OutcomePrior::neutral()));
        let current = cell.load();
        assert!(Arc::ptr_eq(&current.catalog, &newer));
        assert_eq!(current.graph_version, 6);
        assert_eq!(current.tier0(&DiscoveryFilter::default(), crate::core::tiers::TokenBudget::new(200)), tier0);
    }

    /// The Indexer and the GraphBuilder publish into the cell themselves before
    /// they reply, so no message to the Discoverer has to be handled first: here
    /// they have no subscriber at all, and the cell is still current at the reply.
    #[actix::test]
    async fn a_change_is_in_the_cell_when_it_is_replied_to() {
        use crate::actors::graph_builder::GraphBuilder;
        use crate::actors::indexer::{Indexer, SyncCapabilities};
        let dir = tempfile::tempdir().unwrap();
        let store = crate::store::Store::open(dir.path()).unwrap();
        let cell = Arc::new(SnapshotCell::default());
        let embedder = SyncArbiter::start(1, || Embedder::new(Box::new(HashingEmbedder::default())));
        let graph_cell = cell.clone();
        let graph_builder = SyncArbiter::start(1, move || {
            GraphBuilder::new(Vec::new(), Vec::new()).with_snapshot_cell(graph_cell.clone())
        });
        let model = HashingEmbedder::default();
        let indexer = Indexer::load(
            store,
            embedder.recipient(),
            graph_builder.recipient(),
            Vec::new(),
            &model.model_id(),
            model.dimensions(),
        )
        .unwrap()
        .with_snapshot_cell(cell.clone())
        .start();
        let lanes = {
            let cell = cell.clone();
            let factory = move || {
                let model: Box<dyn Embed + Send> = Box::new(HashingEmbedder::default());
                DiscoveryWorker::new(cell.clone(), DiscoveryConfig::default(), false, Some(model), 32)
            };
            DiscoveryLanes::start(2, factory, None).unwrap()
        };
        for round in 0..5 {
            let name = format!("coil{round}gauge");
            let sync = SyncCapabilities::merge("runtime:t", vec![tool(&name, "Read the gauge of a reactor coil")]);
            let report = indexer.send(sync).await.unwrap().unwrap();
            let current = cell.load();
            assert_eq!((current.catalog.version, current.graph_version), (report.version, report.version));
            let found = lanes.run(discover(&format!("read the {name}")), keep()).await.unwrap().unwrap();
            assert_eq!(found.tier1.first().map(|entry| entry.id.clone()), Some(format!("tool:{name}")));
        }
    }
}
