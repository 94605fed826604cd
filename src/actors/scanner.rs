//! Scanner: reads the CAPABILITY.yaml folders and hands what it found to the
//! Indexer as one sync of the `manifests` origin. Runs on a `SyncArbiter`
//! thread (it does blocking disk I/O); a notify watcher re-triggers it.

use crate::actors::indexer::{Refused, SyncCapabilities, SyncReport};
use crate::actors::Inspect;
use crate::core::catalog::MANIFESTS_ORIGIN;
use crate::core::descriptor::CapabilityDescriptor;
use crate::core::manifest::{keep_last_good, LastGood};
use crate::folders::manifest_dir::{self, ScanLimits, ScanReport};
use actix::prelude::*;
use notify_debouncer_full::notify::{EventKind, RecursiveMode};
use notify_debouncer_full::{new_debouncer, DebounceEventResult, Debouncer, RecommendedCache};
use std::collections::HashMap;
use std::path::PathBuf;
use std::time::Duration;

/// Scans the folders now and syncs the result into the index.
#[derive(Message, Debug, Default)]
#[rtype(result = "Result<ScanOutcome, ScanError>")]
pub struct ScanManifests;

/// What a scan found and what the index made of it.
#[derive(Debug, Clone)]
pub struct ScanOutcome {
    pub scan: ScanReport,
    pub sync: SyncReport,
}

#[derive(Debug, thiserror::Error)]
pub enum ScanError {
    #[error("the indexer did not answer: {0}")]
    Indexer(String),
}

/// What the scanner has done so far.
#[derive(Debug, Clone, Default, PartialEq)]
pub struct ScannerStats {
    pub scans: u64,
    pub last_found: usize,
    pub last_refused: usize,
}

pub struct Scanner {
    dirs: Vec<PathBuf>,
    limits: ScanLimits,
    indexer: Recipient<SyncCapabilities>,
    /// The last valid descriptor read from each manifest path: a manifest that
    /// turns invalid keeps it indexed (and is reported refused) until fixed or deleted.
    last_good: HashMap<String, CapabilityDescriptor>,
    stats: ScannerStats,
}

impl Scanner {
    pub fn new(dirs: Vec<PathBuf>, limits: ScanLimits, indexer: Recipient<SyncCapabilities>) -> Scanner {
        Scanner { dirs, limits, indexer, last_good: HashMap::new(), stats: ScannerStats::default() }
    }
}

impl Actor for Scanner {
    type Context = SyncContext<Self>;
}

impl Handler<ScanManifests> for Scanner {
    type Result = Result<ScanOutcome, ScanError>;

    fn handle(&mut self, _: ScanManifests, _: &mut SyncContext<Self>) -> Self::Result {
        let scan = manifest_dir::scan_with_refusals(&self.dirs, self.limits);
        let LastGood { offered, by_path } = keep_last_good(
            &scan.descriptors,
            scan.refused.iter().map(|refusal| refusal.manifest_path.as_str()),
            &self.last_good,
        );
        self.last_good = by_path;
        for refusal in &scan.refused {
            tracing::warn!(manifest = %refusal.manifest_path, field = %refusal.field, problem = %refusal.problem, "capability refused");
        }
        for warning in &scan.warnings {
            if warning == manifest_dir::CONTAINMENT_UNCHECKED {
                tracing::warn!("{warning}");
            } else {
                // Missing folders are normal (the default folders often do not exist).
                tracing::debug!("{warning}");
            }
        }
        self.stats.scans += 1;
        self.stats.last_found = scan.descriptors.len();
        self.stats.last_refused = scan.refused.len();
        let mut request = SyncCapabilities::replace(MANIFESTS_ORIGIN, offered);
        request.refused = scan
            .refused
            .iter()
            .map(|r| Refused { item: r.manifest_path.clone(), field: r.field.clone(), problem: r.problem.clone() })
            .collect();
        // A sync-arbiter thread may block on the async indexer: it is not the System's thread.
        let sync = futures::executor::block_on(self.indexer.send(request))
            .map_err(|err| ScanError::Indexer(err.to_string()))?
            .map_err(|err| ScanError::Indexer(err.to_string()))?;
        Ok(ScanOutcome { scan, sync })
    }
}

impl Handler<Inspect<ScannerStats>> for Scanner {
    type Result = MessageResult<Inspect<ScannerStats>>;

    fn handle(&mut self, _: Inspect<ScannerStats>, _: &mut SyncContext<Self>) -> Self::Result {
        MessageResult(self.stats.clone())
    }
}

/// Keeps the folder watcher alive; dropping it stops watching.
pub struct ManifestWatcher {
    _debouncer: Debouncer<notify_debouncer_full::notify::RecommendedWatcher, RecommendedCache>,
}

/// Watches `dirs` (recursively) and sends [`ScanManifests`] to `scanner`
/// after each burst of changes has been quiet for `debounce`. Folders that do
/// not exist are skipped with a warning.
pub fn watch(dirs: &[PathBuf], debounce: Duration, scanner: Addr<Scanner>) -> Result<ManifestWatcher, String> {
    let mut debouncer = new_debouncer(debounce, None, move |result: DebounceEventResult| match result {
        Ok(events) => {
            // Opens and reads are noise (some come from the debouncer itself).
            if events.iter().any(|event| !matches!(event.kind, EventKind::Access(_))) {
                scanner.do_send(ScanManifests);
            }
        }
        Err(errors) => tracing::warn!(?errors, "capability folder watch reported errors"),
    })
    .map_err(|err| format!("failed to start the folder watcher: {err}"))?;
    for dir in dirs {
        if let Err(err) = debouncer.watch(dir, RecursiveMode::Recursive) {
            tracing::info!(dir = %dir.display(), %err, "capability folder not watched (restart capdex after creating it)");
        }
    }
    Ok(ManifestWatcher { _debouncer: debouncer })
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::actors::indexer::IndexerError;
    use std::sync::{Arc, Mutex};

    /// Stands in for the Indexer: keeps every sync and answers how many it offered.
    struct FakeIndexer {
        syncs: Arc<Mutex<Vec<SyncCapabilities>>>,
    }

    impl Actor for FakeIndexer {
        type Context = Context<Self>;
    }

    impl Handler<SyncCapabilities> for FakeIndexer {
        type Result = Result<SyncReport, IndexerError>;

        fn handle(&mut self, msg: SyncCapabilities, _: &mut Context<Self>) -> Self::Result {
            let report = SyncReport { upserted: msg.descriptors.len(), ..SyncReport::default() };
            self.syncs.lock().unwrap().push(msg);
            Ok(report)
        }
    }

    fn write_manifest(root: &std::path::Path, folder: &str, text: &str) {
        std::fs::create_dir_all(root.join(folder)).unwrap();
        std::fs::write(root.join(folder).join("CAPABILITY.yaml"), text).unwrap();
    }

    #[actix::test]
    async fn a_manifest_that_turns_invalid_stays_offered_until_deleted() {
        let dir = tempfile::tempdir().unwrap();
        let root = dir.path().to_path_buf();
        let syncs = Arc::new(Mutex::new(Vec::new()));
        let indexer = FakeIndexer { syncs: syncs.clone() }.start().recipient();
        let dirs = vec![root.clone()];
        let scanner = SyncArbiter::start(1, move || Scanner::new(dirs.clone(), ScanLimits::default(), indexer.clone()));
        write_manifest(&root, "gauge", "name: gauge\nkind: tool\ndescription: Read a gauge\n");
        let first = scanner.send(ScanManifests).await.unwrap().unwrap();
        assert_eq!((first.scan.descriptors.len(), first.sync.upserted), (1, 1));
        write_manifest(&root, "gauge", "name: gauge\nkind: tool\n");
        let broken = scanner.send(ScanManifests).await.unwrap().unwrap();
        assert!(broken.scan.descriptors.is_empty());
        std::fs::remove_dir_all(root.join("gauge")).unwrap();
        scanner.send(ScanManifests).await.unwrap().unwrap();
        let stats = scanner.send(Inspect::<ScannerStats>::new()).await.unwrap();
        assert_eq!(stats, ScannerStats { scans: 3, last_found: 0, last_refused: 0 });
        let syncs = std::mem::take(&mut *syncs.lock().unwrap());
        let offered: Vec<Vec<&str>> =
            syncs.iter().map(|sync| sync.descriptors.iter().map(|d| d.id.as_str()).collect()).collect();
        assert_eq!(offered, [vec!["tool:gauge"], vec!["tool:gauge"], vec![]]);
        assert!(syncs
            .iter()
            .all(|sync| sync.origin == MANIFESTS_ORIGIN && sync.mode == crate::core::catalog::ChangeMode::Replace));
        assert_eq!(syncs[1].refused.len(), 1);
        assert_eq!(syncs[1].refused[0].field, "description");
        assert!(syncs[1].refused[0].item.ends_with("gauge/CAPABILITY.yaml"));
    }
}
