//! Tests of the re-drive state machine: one-line cases of [`verdict`], and a
//! property test driving [`verdict`], [`completion`] and [`InFlight`] over a
//! create-only map (as the dispatcher drives them over the store) against a
//! simple model of the state machine, op by op.

use super::*;
use crate::core::dispatch::registry::tests::record;
use proptest::prelude::*;
use serde_json::json;
use std::collections::{BTreeMap, HashMap, HashSet};

fn call(args: u8) -> DispatchCall {
    DispatchCall {
        slug: "refund".into(),
        arguments: json!({"q": args.to_string()}),
        agent_id: "a".into(),
        execution_id: Some("e".into()),
        step_id: Some("s".into()),
        turn: None,
        approval_id: None,
    }
}

fn key() -> ExecutionKey {
    ExecutionKey { execution_id: "e".into(), step_id: "s".into(), turn: None }
}

fn kind(verdict: &Verdict) -> &'static str {
    match verdict {
        Verdict::Run => "run",
        Verdict::Wait => "wait",
        Verdict::Answer(answered) => match **answered {
            Answered::Replay(_) => "replay",
            Answered::Conflict(_) => "conflict",
            Answered::Interrupted(_) => "interrupted",
            Answered::CacheFailed(_) => "cache_failed",
        },
    }
}

fn check(state: KeyState, expect: &str) {
    assert_eq!(kind(&verdict(&key(), &claim_entry(&call(0), "p1", 0), state)), expect);
}

#[test]
fn verdicts() {
    let stored = |args: u8, result: Option<CallResult>| {
        let mut entry = claim_entry(&call(args), "p0", 0);
        entry.result = result;
        KeyState::Claim(Claim::Existing(Box::new(entry)))
    };
    check(KeyState::InFlight, "wait");
    check(KeyState::Claim(Claim::Claimed), "run");
    check(KeyState::Unreadable("disk".into()), "cache_failed");
    check(KeyState::Unavailable("no quorum".into()), "cache_failed");
    check(stored(0, Some(CallResult::ok(json!(1)))), "replay");
    check(stored(0, None), "interrupted");
    check(stored(1, Some(CallResult::ok(json!(1)))), "conflict");
    check(stored(1, None), "conflict");
}

#[test]
fn answers_say_whether_they_replay() {
    let ours = claim_entry(&call(0), "p1", 0);
    let answered = |state| match verdict(&key(), &ours, state) {
        Verdict::Answer(answered) => answered.into_result(),
        other => panic!("{other:?}"),
    };
    let mut done = ours.clone();
    done.result = Some(CallResult::ok(json!({"n": 1})));
    let replay = answered(KeyState::Claim(Claim::Existing(Box::new(done))));
    assert_eq!(replay, (CallResult::ok(json!({"n": 1})), true));
    let failed = answered(KeyState::Unreadable("disk".into()));
    assert_eq!((failed.0.code(), failed.1), (Some("execution_error"), false));
    let unavailable = answered(KeyState::Unavailable("no quorum".into()));
    assert_eq!((unavailable.0.code(), unavailable.1), (Some("unavailable"), false), "a client may retry it");
    let interrupted = answered(KeyState::Claim(Claim::Existing(Box::new(ours.clone()))));
    assert!(interrupted.1 && interrupted.0.error.unwrap().message.contains("outcome is unknown"));
}

#[test]
fn only_calls_with_a_key_to_a_non_idempotent_capability_are_cached() {
    let mut once = record("refund");
    once.is_idempotent = false;
    let mut again = record("lookup");
    again.is_idempotent = true;
    assert_eq!(cached_key(Some(key()), Some(&once)), Some(key()));
    assert_eq!(cached_key(Some(key()), Some(&again)), None);
    assert_eq!(cached_key(Some(key()), None), None, "an unknown capability is refused by the pipeline");
    assert_eq!(cached_key(None, Some(&once)), None);
}

#[test]
fn a_success_is_stored_with_the_claim_and_a_failure_frees_the_key() {
    let ours = claim_entry(&call(0), "p1", 7);
    let ok = CallResult::ok(json!({"n": 1}));
    assert_eq!(
        completion(&ours, &ok),
        Completion::Store(Box::new(CacheEntry { result: Some(ok.clone()), ..ours.clone() }))
    );
    assert_eq!(completion(&ours, &CallResult::fail(ErrorCode::ExecutionError, "x")), Completion::Release);
}

#[test]
fn waiters_join_only_a_running_key_and_leave_with_it() {
    let mut in_flight: InFlight<u32> = InFlight::default();
    assert_eq!(in_flight.join(b"k", 1), Err(1));
    in_flight.start(b"k".to_vec());
    assert_eq!(in_flight.join(b"k", 2), Ok(()));
    assert_eq!(in_flight.join(b"k", 3), Ok(()));
    assert_eq!((in_flight.len(), in_flight.contains(b"k")), (1, true));
    assert_eq!(in_flight.finish(b"k"), vec![2, 3]);
    assert!(in_flight.is_empty() && in_flight.finish(b"k").is_empty());
}

/// One event in the life of the dispatcher, for a handful of keys.
#[derive(Clone, Debug)]
enum Op {
    /// A call of `key` with arguments `args` arrives: a first call, a repeat, or a concurrent duplicate.
    Call { key: u8, args: u8 },
    /// The running call of `key` (if any) finishes and answers.
    Finish { key: u8, success: bool },
    /// The process dies with calls running; `stored`: each had stored its success (a crash before the reply),
    /// else each was still in the handler.
    Crash { stored: bool },
}

fn op() -> impl Strategy<Value = Op> {
    prop_oneof![
        4 => (0..3u8, 0..2u8).prop_map(|(key, args)| Op::Call { key, args }),
        3 => (0..3u8, any::<bool>()).prop_map(|(key, success)| Op::Finish { key, success }),
        1 => any::<bool>().prop_map(|stored| Op::Crash { stored }),
    ]
}

/// What the model says of a key.
#[derive(Clone, Debug)]
enum Model {
    Free,
    Running { args: u8, waiters: usize },
    Done { args: u8, result: CallResult },
    Unknown { args: u8 },
}

/// What a verdict is, compared between model and implementation.
#[derive(Clone, Debug, PartialEq)]
enum Seen {
    Run,
    Wait,
    Replay(CallResult),
    Conflict,
    Interrupted,
    /// Never expected: the map cannot fail, so the model never says it.
    CacheFailed(CallResult),
}

fn seen(verdict: Verdict) -> Seen {
    match verdict {
        Verdict::Run => Seen::Run,
        Verdict::Wait => Seen::Wait,
        Verdict::Answer(answered) => match *answered {
            Answered::Replay(result) => Seen::Replay(result),
            Answered::Conflict(_) => Seen::Conflict,
            Answered::Interrupted(_) => Seen::Interrupted,
            Answered::CacheFailed(result) => Seen::CacheFailed(result),
        },
    }
}

/// The result of the `n`th run of `key`.
fn result_of(key: u8, run: u32, success: bool) -> CallResult {
    if success {
        CallResult::ok(json!({"key": key, "run": run}))
    } else {
        CallResult::fail(ErrorCode::ExecutionError, format!("run {run} of {key} failed"))
    }
}

fn keyed_call(key: u8, args: u8) -> (ExecutionKey, DispatchCall) {
    let mut call = call(args);
    call.step_id = Some(format!("s{key}"));
    (ExecutionKey { execution_id: "e".into(), step_id: format!("s{key}"), turn: None }, call)
}

/// The dispatcher's use of the core, with a create-only map standing in for the store.
#[derive(Default)]
struct Harness {
    store: BTreeMap<Vec<u8>, CacheEntry>,
    in_flight: InFlight<usize>,
    /// Running calls: their claim entry, per key.
    running: HashMap<u8, CacheEntry>,
    process: u32,
    next_waiter: usize,
    runs: HashMap<u8, u32>,
    /// Keys whose handler succeeded or whose outcome is unknown: none may run again.
    settled: HashSet<u8>,
}

impl Harness {
    fn claim(&mut self, storage: &[u8], entry: &CacheEntry) -> Claim {
        match self.store.get(storage) {
            Some(found) => Claim::Existing(Box::new(found.clone())),
            None => {
                self.store.insert(storage.to_vec(), entry.clone());
                Claim::Claimed
            }
        }
    }

    fn call(&mut self, key: u8, args: u8) -> Seen {
        let (execution_key, call) = keyed_call(key, args);
        let storage = execution_key.storage_key();
        let ours = claim_entry(&call, &format!("p{}", self.process), 0);
        let state = if self.in_flight.contains(&storage) {
            KeyState::InFlight
        } else {
            KeyState::Claim(self.claim(&storage, &ours))
        };
        let decided = verdict(&execution_key, &ours, state);
        match &decided {
            Verdict::Run => {
                assert!(!self.settled.contains(&key), "key {key} ran again after its outcome was settled");
                assert!(self.running.insert(key, ours).is_none(), "key {key} ran twice at once");
                *self.runs.entry(key).or_default() += 1;
                self.in_flight.start(storage);
            }
            Verdict::Wait => {
                self.next_waiter += 1;
                assert_eq!(self.in_flight.join(&storage, self.next_waiter), Ok(()));
            }
            Verdict::Answer(_) => {}
        }
        seen(decided)
    }

    /// Finishes the running call of `key`; returns its answer and how many waiters got it.
    fn finish(&mut self, key: u8, success: bool) -> Option<(CallResult, usize)> {
        let ours = self.running.remove(&key)?;
        let result = result_of(key, self.runs[&key], success);
        let storage = keyed_call(key, 0).0.storage_key();
        match completion(&ours, &result) {
            Completion::Store(entry) => {
                self.settled.insert(key);
                self.store.insert(storage.clone(), *entry);
            }
            Completion::Release => {
                self.store.remove(&storage);
            }
        }
        Some((result, self.in_flight.finish(&storage).len()))
    }

    fn crash(&mut self, stored: bool) {
        for (key, ours) in std::mem::take(&mut self.running) {
            self.settled.insert(key);
            if stored {
                if let Completion::Store(entry) = completion(&ours, &result_of(key, self.runs[&key], true)) {
                    self.store.insert(keyed_call(key, 0).0.storage_key(), *entry);
                }
            }
        }
        self.in_flight = InFlight::default();
        self.process += 1;
    }
}

/// The state machine as the design states it.
struct Reference {
    keys: HashMap<u8, Model>,
    runs: HashMap<u8, u32>,
}

impl Reference {
    fn call(&mut self, key: u8, args: u8) -> Seen {
        let state = self.keys.entry(key).or_insert(Model::Free);
        match state {
            Model::Free => {
                *state = Model::Running { args, waiters: 0 };
                *self.runs.entry(key).or_default() += 1;
                Seen::Run
            }
            Model::Running { waiters, .. } => {
                *waiters += 1;
                Seen::Wait
            }
            Model::Done { args: first, result } if *first == args => Seen::Replay(result.clone()),
            Model::Unknown { args: first } if *first == args => Seen::Interrupted,
            Model::Done { .. } | Model::Unknown { .. } => Seen::Conflict,
        }
    }

    fn finish(&mut self, key: u8, success: bool) -> Option<(CallResult, usize)> {
        let state = self.keys.entry(key).or_insert(Model::Free);
        let Model::Running { args, waiters } = *state else { return None };
        let result = result_of(key, self.runs[&key], success);
        *state = if success { Model::Done { args, result: result.clone() } } else { Model::Free };
        Some((result, waiters))
    }

    fn crash(&mut self, stored: bool) {
        for (key, state) in self.keys.iter_mut() {
            if let Model::Running { args, .. } = *state {
                *state = if stored {
                    Model::Done { args, result: result_of(*key, self.runs[key], true) }
                } else {
                    Model::Unknown { args }
                };
            }
        }
    }
}

proptest! {
    #![proptest_config(ProptestConfig::with_cases(512))]

    #[test]
    fn the_core_agrees_with_the_model_and_never_runs_a_key_twice(ops in prop::collection::vec(op(), 1..60)) {
        let mut harness = Harness::default();
        let mut reference = Reference { keys: HashMap::new(), runs: HashMap::new() };
        for (step, op) in ops.iter().enumerate() {
            match *op {
                Op::Call { key, args } => {
                    prop_assert_eq!(harness.call(key, args), reference.call(key, args), "step {}: {:?}", step, op);
                }
                Op::Finish { key, success } => {
                    prop_assert_eq!(harness.finish(key, success), reference.finish(key, success), "step {}: {:?}", step, op);
                }
                Op::Crash { stored } => {
                    harness.crash(stored);
                    reference.crash(stored);
                }
            }
        }
        prop_assert_eq!(harness.runs, reference.runs);
    }
}
