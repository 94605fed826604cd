//! What every SCG phase reports: the [`ScgError`] a request fails with, and
//! the [`Progress`] events each phase sends when it starts and ends. Shared by
//! the mapper and the graph actors (`mapper.rs`, `graph.rs`); imports neither.

use crate::core::scg::memory::MemoryError;
use crate::core::scg::pipeline::{ConnectError, Phase, PhaseError, PhaseStatus, ScgEvent};
use crate::core::scg::route::ObserveError;
use crate::core::scg::MapError;
use crate::gateway::errors::ErrorKind;
use crate::store::StoreError;
use std::collections::BTreeMap;
use std::time::{Instant, SystemTime, UNIX_EPOCH};
use tokio::sync::broadcast;

/// Why an SCG request failed; its [`ScgError::kind`] goes on the wire.
#[derive(Debug, thiserror::Error)]
pub enum ScgError {
    #[error("{0}")]
    Map(#[from] MapError),
    #[error("connection: {0}")]
    Connect(#[from] ConnectError),
    #[error("{0}")]
    Memory(#[from] MemoryError),
    #[error("{0}")]
    Observe(#[from] ObserveError),
    #[error("{0}")]
    Store(#[from] StoreError),
    #[error("reading sources by path is not allowed: {0}")]
    PathNotAllowed(String),
    #[error("cannot read {path}: {problem}")]
    Unreadable { path: String, problem: String },
    #[error("{0}")]
    BadRequest(String),
    #[error("the SCG actors stopped: {0}")]
    Unavailable(String),
}

impl ScgError {
    /// Returns its kind: the domain's code, and through the gateway's table the status.
    pub fn kind(&self) -> ErrorKind {
        match self {
            ScgError::Map(err @ (MapError::TooLarge { .. } | MapError::Limit(_))) => ErrorKind::TooLarge(err.code()),
            ScgError::Map(err) => ErrorKind::Invalid(err.code()),
            ScgError::Connect(_) => ErrorKind::Invalid("bad_connection"),
            ScgError::Memory(err @ MemoryError::UnknownAnchor(_)) => ErrorKind::NotFound(err.code()),
            ScgError::Memory(err) => ErrorKind::Invalid(err.code()),
            ScgError::Observe(_) => ErrorKind::NotFound("not_found"),
            ScgError::Store(_) => ErrorKind::Storage,
            ScgError::PathNotAllowed(_) => ErrorKind::Forbidden("path_not_allowed"),
            ScgError::Unreadable { .. } => ErrorKind::Invalid("unreadable"),
            ScgError::BadRequest(_) => ErrorKind::BadRequest,
            ScgError::Unavailable(_) => ErrorKind::Unavailable,
        }
    }

    /// Returns its stable code.
    pub fn code(&self) -> &'static str {
        self.kind().status_and_code().1
    }

    /// Returns its HTTP-like status (from the gateway's table).
    pub fn status(&self) -> u16 {
        self.kind().status_and_code().0
    }
}

/// Returns milliseconds since the epoch.
pub(crate) fn now_ms() -> u64 {
    SystemTime::now().duration_since(UNIX_EPOCH).map_or(0, |elapsed| elapsed.as_millis() as u64)
}

/// Sends phase events for one source.
#[derive(Clone)]
pub(crate) struct Progress {
    pub(crate) events: broadcast::Sender<ScgEvent>,
    pub(crate) source_id: String,
}

impl Progress {
    pub(crate) fn send(
        &self,
        phase: Phase,
        status: PhaseStatus,
        elapsed_ms: Option<f64>,
        counts: BTreeMap<String, u64>,
        error: Option<&ScgError>,
    ) {
        // No subscriber is fine: nobody is listening.
        let _ = self.events.send(ScgEvent {
            source_id: self.source_id.clone(),
            phase,
            status,
            at_ms: now_ms(),
            elapsed_ms,
            counts,
            error: error.map(|err| PhaseError { code: err.code().to_string(), message: err.to_string() }),
        });
    }

    /// Runs one phase between its started and done (or failed) events; records its time.
    pub(crate) fn phase<T>(
        &self,
        phase: Phase,
        phase_ms: &mut BTreeMap<String, f64>,
        run: impl FnOnce() -> Result<(T, BTreeMap<String, u64>), ScgError>,
    ) -> Result<T, ScgError> {
        self.send(phase, PhaseStatus::Started, None, BTreeMap::new(), None);
        let started = Instant::now();
        let result = run();
        let elapsed = started.elapsed().as_secs_f64() * 1000.0;
        phase_ms.insert(phase.as_str().to_string(), elapsed);
        match result {
            Ok((value, counts)) => {
                self.send(phase, PhaseStatus::Done, Some(elapsed), counts, None);
                Ok(value)
            }
            Err(err) => {
                self.send(phase, PhaseStatus::Failed, Some(elapsed), BTreeMap::new(), Some(&err));
                Err(err)
            }
        }
    }
}
