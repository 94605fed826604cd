//! Group commit: callers that must not answer before their writes are
//! durable wait on [`GroupFlush::durable`]; one background thread flushes
//! sled for every caller that registered before the flush began.
//!
//! Why it is correct: a caller registers *after* its write returned, and the
//! thread takes the registered callers *before* it calls `flush`, which makes
//! every write issued before that call durable. Callers that register while a
//! flush runs share the next one, so under load one fsync serves a batch.

use futures::channel::oneshot;
use std::sync::{Arc, Condvar, Mutex};
use std::time::Instant;

type Waiter = oneshot::Sender<Result<(), String>>;

#[derive(Default)]
struct Queue {
    waiters: Vec<Waiter>,
    stopping: bool,
}

struct Shared {
    queue: Mutex<Queue>,
    wake: Condvar,
}

/// The flushing thread of one sled database; stops (after its last flush) when dropped.
pub(crate) struct GroupFlush {
    shared: Arc<Shared>,
    thread: Mutex<Option<std::thread::JoinHandle<()>>>,
}

impl std::fmt::Debug for GroupFlush {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str("GroupFlush")
    }
}

impl GroupFlush {
    /// Starts the thread that flushes `db`.
    pub(crate) fn start(db: sled::Db) -> GroupFlush {
        let shared = Arc::new(Shared { queue: Mutex::new(Queue::default()), wake: Condvar::new() });
        let thread_shared = shared.clone();
        let thread = std::thread::Builder::new()
            .name("capdex-flush".into())
            .spawn(move || run(&thread_shared, &db))
            .expect("the flush thread starts");
        GroupFlush { shared, thread: Mutex::new(Some(thread)) }
    }

    /// Returns a receiver that resolves once every write issued before this
    /// call is durable, or with the flush error.
    pub(crate) fn durable(&self) -> oneshot::Receiver<Result<(), String>> {
        let (sender, receiver) = oneshot::channel();
        let mut queue = self.shared.queue.lock().unwrap_or_else(|poisoned| poisoned.into_inner());
        queue.waiters.push(sender);
        drop(queue);
        self.shared.wake.notify_one();
        receiver
    }
}

impl Drop for GroupFlush {
    fn drop(&mut self) {
        let mut queue = self.shared.queue.lock().unwrap_or_else(|poisoned| poisoned.into_inner());
        queue.stopping = true;
        drop(queue);
        self.shared.wake.notify_one();
        // Joining releases the thread's handle on the database, so it can be reopened at once.
        let thread = self.thread.lock().unwrap_or_else(|poisoned| poisoned.into_inner()).take();
        if let Some(thread) = thread {
            let _ = thread.join();
        }
    }
}

fn run(shared: &Shared, db: &sled::Db) {
    loop {
        let waiters = {
            let mut queue = shared.queue.lock().unwrap_or_else(|poisoned| poisoned.into_inner());
            while queue.waiters.is_empty() && !queue.stopping {
                queue = shared.wake.wait(queue).unwrap_or_else(|poisoned| poisoned.into_inner());
            }
            if queue.waiters.is_empty() {
                return;
            }
            std::mem::take(&mut queue.waiters)
        };
        let started = Instant::now();
        let result = db.flush().map(|_| ()).map_err(|err| err.to_string());
        metrics::histogram!("capdex_store_flush_duration_seconds").record(started.elapsed().as_secs_f64());
        metrics::histogram!("capdex_store_flush_callers").record(waiters.len() as f64);
        for waiter in waiters {
            // A caller that stopped waiting is no error.
            let _ = waiter.send(result.clone());
        }
    }
}
