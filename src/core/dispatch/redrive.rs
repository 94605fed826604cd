//! The re-drive state machine, pure: which calls go through the create-only
//! cache ([`cached_key`]), what a call's key says about it ([`verdict`]:
//! run, wait for the first, replay the stored result, or refuse), what is
//! left behind once it ran ([`completion`]), and who waits for a key running
//! in this process ([`InFlight`]).
//!
//! The shell (`actors::dispatcher`) asks the store (`store::dispatch`) to
//! claim a key, hands what it found to [`verdict`], and performs the answer;
//! so a handler never runs twice for one key, whatever the interleaving of
//! repeats, concurrent duplicates and crashes.

use crate::core::dispatch::approval;
use crate::core::dispatch::pipeline::{DispatchCall, ExecutionKey};
use crate::core::dispatch::registry::CapabilityRecord;
use crate::core::dispatch::{CallResult, ErrorCode};
use serde::{Deserialize, Serialize};
use std::collections::HashMap;

/// A re-drive cache entry: a key in progress, or its stored result.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct CacheEntry {
    pub slug: String,
    pub agent_id: String,
    pub args_digest: String,
    /// The process that claimed the key (a fresh id per start).
    pub owner: String,
    pub started_at_ms: u64,
    /// The result, once the call succeeded; `None` while in progress.
    #[serde(default)]
    pub result: Option<CallResult>,
}

/// What a create-only claim of a key found.
#[derive(Clone, Debug, PartialEq)]
pub enum Claim {
    /// The key was free and is now marked in progress by this caller.
    Claimed,
    /// The key was already there (in progress or done).
    Existing(Box<CacheEntry>),
}

/// What the shell found when it looked at a call's key.
#[derive(Clone, Debug, PartialEq)]
pub enum KeyState {
    /// A call of this key is running in this process.
    InFlight,
    /// The store's create-only claim answered.
    Claim(Claim),
    /// The store could not be asked.
    Unreadable(String),
    /// The cluster's shared state could not be asked: a client may retry.
    Unavailable(String),
}

/// What happens to a call with a re-drive key.
#[derive(Clone, Debug, PartialEq)]
pub enum Verdict {
    /// The key is this call's: run it, then leave [`completion`] behind.
    Run,
    /// The first call of this key runs in this process: answer its result, as a replay.
    Wait,
    /// The call neither runs nor waits: this is its answer.
    Answer(Box<Answered>),
}

/// The answer of a call whose key decides it without running it.
#[derive(Clone, Debug, PartialEq)]
pub enum Answered {
    /// The key holds this call's stored result.
    Replay(CallResult),
    /// The key belongs to a call with another capability, agent or arguments.
    Conflict(CallResult),
    /// The key was left in progress by a process that is gone: its outcome is unknown, so it is not run again.
    Interrupted(CallResult),
    /// The cache could not be asked.
    CacheFailed(CallResult),
}

impl Answered {
    /// The answer, and whether it is recorded as a replay (every answer the key held is).
    pub fn into_result(self) -> (CallResult, bool) {
        match self {
            Answered::Replay(result) | Answered::Conflict(result) | Answered::Interrupted(result) => (result, true),
            Answered::CacheFailed(result) => (result, false),
        }
    }
}

/// What a claimed key keeps once its call has run.
#[derive(Clone, Debug, PartialEq)]
pub enum Completion {
    /// The call succeeded: store this entry (with the result), durably, before answering.
    Store(Box<CacheEntry>),
    /// The call failed: free the key, so a re-drive may run it again.
    Release,
}

/// Returns the key under which a call goes through the re-drive cache: a call
/// with an execution key to a known capability that is not `isIdempotent`.
pub fn cached_key(key: Option<ExecutionKey>, record: Option<&CapabilityRecord>) -> Option<ExecutionKey> {
    key.filter(|_| record.is_some_and(|r| !r.is_idempotent))
}

/// Whether a key found in progress was claimed by this very call elsewhere
/// (same capability, agent and arguments): a duplicate that may wait for it.
pub fn same_call(found: &CacheEntry, ours: &CacheEntry) -> bool {
    found.slug == ours.slug && found.agent_id == ours.agent_id && found.args_digest == ours.args_digest
}

/// The in-progress entry a call claims its key with.
pub fn claim_entry(call: &DispatchCall, owner: &str, now_ms: u64) -> CacheEntry {
    CacheEntry {
        slug: call.slug.clone(),
        agent_id: call.agent_id.clone(),
        args_digest: approval::args_digest(&call.arguments),
        owner: owner.to_string(),
        started_at_ms: now_ms,
        result: None,
    }
}

/// Decides a call from its key's state; `ours` is the entry the call claimed (or would claim) the key with.
pub fn verdict(key: &ExecutionKey, ours: &CacheEntry, state: KeyState) -> Verdict {
    let found = match state {
        KeyState::InFlight => return Verdict::Wait,
        KeyState::Claim(Claim::Claimed) => return Verdict::Run,
        KeyState::Unreadable(problem) => {
            return Verdict::Answer(Box::new(Answered::CacheFailed(CallResult::fail(
                ErrorCode::ExecutionError,
                format!("the re-drive cache failed: {problem}"),
            ))))
        }
        KeyState::Unavailable(problem) => {
            return Verdict::Answer(Box::new(Answered::CacheFailed(CallResult::fail(
                ErrorCode::Unavailable,
                format!("the re-drive record could not be claimed: {problem}"),
            ))))
        }
        KeyState::Claim(Claim::Existing(found)) => *found,
    };
    if !same_call(&found, ours) {
        return Verdict::Answer(Box::new(Answered::Conflict(CallResult::fail(
            ErrorCode::InvalidRequest,
            format!("step {key} already belongs to another call (capability, agent or arguments differ)"),
        ))));
    }
    Verdict::Answer(Box::new(match found.result {
        Some(stored) => Answered::Replay(stored),
        None => Answered::Interrupted(CallResult::fail(
            ErrorCode::ExecutionError,
            format!("an earlier attempt of step {key} was interrupted; its outcome is unknown, so it is not run again"),
        )),
    }))
}

/// What the key claimed with `ours` keeps after its call answered `result`.
pub fn completion(ours: &CacheEntry, result: &CallResult) -> Completion {
    if !result.success {
        return Completion::Release;
    }
    Completion::Store(Box::new(CacheEntry { result: Some(result.clone()), ..ours.clone() }))
}

/// The answer of a duplicate whose first call went away without one.
pub fn abandoned() -> CallResult {
    CallResult::fail(ErrorCode::ExecutionError, "the first call of this step was abandoned")
}

/// Keys running in this process, each with the duplicates waiting for its result.
#[derive(Debug)]
pub struct InFlight<W> {
    waiting: HashMap<Vec<u8>, Vec<W>>,
}

impl<W> Default for InFlight<W> {
    fn default() -> InFlight<W> {
        InFlight { waiting: HashMap::new() }
    }
}

impl<W> InFlight<W> {
    /// True while a call of `key` runs here.
    pub fn contains(&self, key: &[u8]) -> bool {
        self.waiting.contains_key(key)
    }

    /// Marks `key` as running here (its claim just won).
    pub fn start(&mut self, key: Vec<u8>) {
        debug_assert!(!self.waiting.contains_key(&key), "a key is claimed once while it runs");
        self.waiting.insert(key, Vec::new());
    }

    /// Adds a waiter for `key`; gives it back when `key` does not run here.
    pub fn join(&mut self, key: &[u8], waiter: W) -> Result<(), W> {
        match self.waiting.get_mut(key) {
            Some(waiters) => {
                waiters.push(waiter);
                Ok(())
            }
            None => Err(waiter),
        }
    }

    /// Ends `key`'s run; returns its waiters, to be given the result.
    pub fn finish(&mut self, key: &[u8]) -> Vec<W> {
        self.waiting.remove(key).unwrap_or_default()
    }

    /// How many keys run here.
    pub fn len(&self) -> usize {
        self.waiting.len()
    }

    pub fn is_empty(&self) -> bool {
        self.waiting.is_empty()
    }
}

#[cfg(test)]
mod tests;
