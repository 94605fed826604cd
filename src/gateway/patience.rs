//! Opening JetStream streams and buckets while a cluster forms.
//!
//! When several nodes start beside a JetStream cluster that is still electing
//! its leaders, or race to create the same replicated stream, the server
//! answers for a while with errors that say "not yet": a request that times
//! out, "cluster not available", a stream another node just created that is
//! "not found" until it is placed. A starting node waits those out for
//! `jetstream.open_timeout_ms` ([`until_ready`]), while a server that has no
//! JetStream at all is reported within seconds ([`wait_for_jetstream`]):
//! waiting would only delay the operator's fix.

use async_nats::jetstream::context::AccountErrorKind;
use async_nats::jetstream::{self, ErrorCode};
use std::fmt::Display;
use std::future::Future;
use std::time::Duration;

/// What one try of an opening step came to, when it did not succeed.
#[derive(Debug)]
pub enum Setback<E> {
    /// Worth trying again: the cluster may not be ready yet.
    NotYet(E),
    /// Will not change by waiting (e.g. the server has no JetStream).
    Final(E),
}

/// The wait before try `attempt + 1` (0-based): 0.1, 0.2, 0.4, 0.8, then 1.6 s each.
pub fn backoff(attempt: u32) -> Duration {
    Duration::from_millis(100 << attempt.min(4))
}

/// Runs `step` until it succeeds, fails for good, or the next try would start
/// later than `patience` after the first; answers the last error then. `what`
/// names the step in the logs: the first setback is logged at info (an
/// operator sees why a node is slow to start), later ones at debug.
pub async fn until_ready<T, E, F, Fut>(what: &str, patience: Duration, mut step: F) -> Result<T, E>
where
    E: Display,
    F: FnMut() -> Fut,
    Fut: Future<Output = Result<T, Setback<E>>>,
{
    let started = tokio::time::Instant::now();
    let mut attempt = 0;
    loop {
        match step().await {
            Ok(value) => {
                if attempt > 0 {
                    tracing::info!(what, waited_ms = started.elapsed().as_millis() as u64, "JetStream ready");
                }
                return Ok(value);
            }
            Err(Setback::Final(err)) => return Err(err),
            Err(Setback::NotYet(err)) => {
                let wait = backoff(attempt);
                if started.elapsed() + wait > patience {
                    return Err(err);
                }
                if attempt == 0 {
                    tracing::info!(what, %err, ?patience, "JetStream not ready yet (a cluster forming?); trying again");
                } else {
                    tracing::debug!(what, %err, attempt, "trying again");
                }
                attempt += 1;
                tokio::time::sleep(wait).await;
            }
        }
    }
}

/// How long "no responders" on the JetStream API is taken for a server still
/// starting its JetStream before it is taken for a server without one.
pub const NO_RESPONDER_GRACE: Duration = Duration::from_secs(3);

/// Waits until the server's JetStream answers this account, for at most
/// `patience` ([`until_ready`]). A server with no responder on the JetStream
/// API after [`NO_RESPONDER_GRACE`], or one that says JetStream is off for
/// the account, fails at once (waiting would only delay the operator's fix);
/// anything else (a timeout, a cluster without a leader yet) is waited out.
pub async fn wait_for_jetstream(context: &jetstream::Context, patience: Duration) -> Result<(), String> {
    let started = tokio::time::Instant::now();
    until_ready("JetStream", patience, || async move {
        match context.query_account().await {
            Ok(_) => Ok(()),
            Err(err) => {
                let missing = match err.kind() {
                    AccountErrorKind::JetStreamUnavailable => started.elapsed() >= NO_RESPONDER_GRACE,
                    AccountErrorKind::JetStream(api) => is_missing(api.error_code()),
                    AccountErrorKind::TimedOut | AccountErrorKind::Other => false,
                };
                Err(if missing { Setback::Final(err.to_string()) } else { Setback::NotYet(err.to_string()) })
            }
        }
    })
    .await
}

/// The JetStream API error codes that say JetStream is off, not busy.
fn is_missing(code: ErrorCode) -> bool {
    code == ErrorCode::JETSTREAM_NOT_ENABLED || code == ErrorCode::JETSTREAM_NOT_ENABLED_FOR_ACCOUNT
}

/// Whether creating a stream was refused for a reason waiting does not
/// change: its subjects overlap another stream's, its configuration is
/// invalid, or the account holds as many streams as it may. (A name "already
/// in use" is not among them: it is what a node racing another one to create
/// the same stream may be told while the cluster places it.)
pub fn is_refusal(code: ErrorCode) -> bool {
    [ErrorCode::STREAM_SUBJECT_OVERLAP, ErrorCode::STREAM_INVALID_CONFIG, ErrorCode::MAXIMUM_STREAMS_LIMIT]
        .contains(&code)
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::cell::Cell;

    #[test]
    fn backoff_doubles_up_to_a_cap() {
        let waits: Vec<u64> = (0..7).map(|attempt| backoff(attempt).as_millis() as u64).collect();
        assert_eq!(waits, [100, 200, 400, 800, 1600, 1600, 1600]);
    }

    #[test]
    fn only_the_codes_of_jetstream_off_are_missing() {
        assert!(is_missing(ErrorCode::JETSTREAM_NOT_ENABLED));
        assert!(is_missing(ErrorCode::JETSTREAM_NOT_ENABLED_FOR_ACCOUNT));
        assert!(!is_missing(ErrorCode::CLUSTER_NOT_AVAILABLE));
        assert!(!is_missing(ErrorCode::STREAM_NOT_FOUND));
    }

    #[test]
    fn only_what_waiting_cannot_change_refuses_a_stream() {
        assert!(is_refusal(ErrorCode::STREAM_SUBJECT_OVERLAP));
        assert!(is_refusal(ErrorCode::STREAM_INVALID_CONFIG));
        assert!(!is_refusal(ErrorCode::STREAM_NAME_EXIST), "a race between nodes creating it");
        assert!(!is_refusal(ErrorCode::STREAM_NOT_FOUND));
        assert!(!is_refusal(ErrorCode::CLUSTER_NOT_AVAILABLE));
    }

    #[tokio::test(start_paused = true)]
    async fn setbacks_are_waited_out_until_success() {
        let tries = Cell::new(0);
        let started = tokio::time::Instant::now();
        let opened = until_ready("test", Duration::from_secs(30), || {
            tries.set(tries.get() + 1);
            let now = tries.get();
            async move {
                if now < 5 {
                    Err(Setback::NotYet(format!("try {now}")))
                } else {
                    Ok(now)
                }
            }
        })
        .await;
        assert_eq!(opened, Ok(5));
        assert_eq!(started.elapsed(), Duration::from_millis(100 + 200 + 400 + 800));
    }

    #[tokio::test(start_paused = true)]
    async fn a_final_setback_is_answered_at_once() {
        let tries = Cell::new(0);
        let started = tokio::time::Instant::now();
        let opened: Result<(), String> = until_ready("test", Duration::from_secs(30), || {
            tries.set(tries.get() + 1);
            async { Err(Setback::Final("no JetStream".to_string())) }
        })
        .await;
        assert_eq!((opened, tries.get()), (Err("no JetStream".to_string()), 1));
        assert_eq!(started.elapsed(), Duration::ZERO);
    }

    #[tokio::test(start_paused = true)]
    async fn patience_bounds_the_wait_and_the_last_error_is_answered() {
        let tries = Cell::new(0);
        let started = tokio::time::Instant::now();
        let opened: Result<(), String> = until_ready("test", Duration::from_secs(5), || {
            tries.set(tries.get() + 1);
            let now = tries.get();
            async move { Err(Setback::NotYet(format!("try {now}"))) }
        })
        .await;
        // Tries at 0, 0.1, 0.3, 0.7, 1.5, 3.1 and 4.7 s; one more, 1.6 s later, would start past 5 s.
        assert_eq!(opened, Err("try 7".to_string()));
        assert_eq!(started.elapsed(), Duration::from_millis(4700));
    }
}
