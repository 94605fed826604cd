//! The bridge between rmcp's handlers, which must be `Send`, and capdex's
//! [`Api`], which is not (its futures are local to the actix System's thread).
//!
//! [`Bridge::spawn`] starts one local task on the System's thread that owns
//! the `Api`; a handler sends it a job (a `Send` closure) over an unbounded
//! channel and awaits the answer on a oneshot. rmcp's own tasks are spawned on
//! the same current-thread runtime, so a job costs a channel hop and two task
//! wake-ups, not a thread switch; `capdex bench --mcp` measures it.

use crate::gateway::service::Api;
use crate::gateway::wire::ApiError;
use futures::future::LocalBoxFuture;
use tokio::sync::{mpsc, oneshot};

/// A call to make on the `Api`, run on the System's thread.
type Job = Box<dyn FnOnce(&dyn Api) -> LocalBoxFuture<'static, ()> + Send>;

/// A `Send` handle on an [`Api`] served by a local task; cheap to clone.
#[derive(Clone)]
pub struct Bridge {
    jobs: mpsc::UnboundedSender<Job>,
}

impl Bridge {
    /// Moves `api` into a local task on the current thread (which must run a
    /// `LocalSet`, as the actix System does) and returns its handle. The task
    /// ends when every handle is dropped.
    pub fn spawn<A: Api>(api: A) -> Bridge {
        let (jobs, mut queue) = mpsc::unbounded_channel::<Job>();
        tokio::task::spawn_local(async move {
            while let Some(job) = queue.recv().await {
                // Each call runs as its own task, so a slow call never holds up the next.
                tokio::task::spawn_local(job(&api));
            }
        });
        Bridge { jobs }
    }

    /// Runs `call` on the `Api` and returns its answer; `unavailable` once the System has stopped.
    pub async fn call<T, F>(&self, call: F) -> Result<T, ApiError>
    where
        T: Send + 'static,
        F: FnOnce(&dyn Api) -> LocalBoxFuture<'static, Result<T, ApiError>> + Send + 'static,
    {
        let (answer_tx, answer_rx) = oneshot::channel();
        let job: Job = Box::new(move |api| {
            let answer = call(api);
            Box::pin(async move {
                let _ = answer_tx.send(answer.await);
            })
        });
        self.jobs.send(job).map_err(|_| ApiError::unavailable("capdex is shutting down"))?;
        answer_rx.await.map_err(|_| ApiError::unavailable("capdex stopped before answering"))?
    }
}
