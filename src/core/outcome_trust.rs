//! Whether learning from outcomes is worth using here, judged on the
//! deployment's own outcomes as they come.
//!
//! Two things learn from outcomes: the scalar prior
//! ([`crate::core::outcome_prior`]: capabilities that do better than the rest
//! rise) and the outcome memory ([`crate::core::outcome_memory`]: a
//! capability's vector moves towards the requests it did the job for, its
//! text weighing `own_weight` requests, and the words its requests kept
//! using become a field of the lexical index; its words are also tried
//! alone, for where the moved vectors bury capabilities no outcome named and
//! the words do not). Both can help and both can hurt:
//! where near-identical capabilities answer near-identical requests, a
//! capability that succeeded overtakes its unseen siblings on their own
//! requests. Which happens depends on the catalog and on how its users ask,
//! so it is measured, not assumed (prequential evaluation): before a
//! request's successes are learnt, the capabilities that did the job are
//! looked up in the ranking with no learning and in the ranking with each
//! [`Learning`] of [`TRIED`] (the prior and the memory as they stand, so
//! they never saw the request), and the difference is recorded
//! ([`OutcomeTrust::record`]). A learning is used only when its mean gain
//! clears [`TRUST_STANDARD_ERRORS`] standard errors of those paired
//! differences; of those that do, the one with the largest gain
//! ([`OutcomeTrust::chosen`]). With no evidence, nothing learnt is used, so a
//! capability never seen in an outcome is never ranked below where it would
//! be without the learning on the strength of a guess.
//!
//! A gain on the whole can still be paid for by the capabilities nothing was
//! learnt about: where near-duplicates answer near-identical requests, the
//! ones outcomes named overtake the others on their own requests, and the
//! gain on the named ones hides the loss. So the trials whose capabilities
//! had nothing learnt at the time (no remembered request, no prior) are also
//! kept apart ([`OutcomeTrust::record`]'s `unseen`), and a learning whose gain
//! on them is below zero by more than [`TRUST_STANDARD_ERRORS`] standard
//! errors is not used, whatever it gains on the rest: a capability no outcome
//! named is not buried under the ones that were.

use serde::{Deserialize, Serialize};

/// One way of using what was learnt from outcomes.
#[derive(Clone, Copy, Debug, PartialEq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct Learning {
    /// Whether the scalar prior is applied.
    pub prior: bool,
    /// The outcome memory's vectors at this own weight (in requests), or
    /// `None` for the capabilities' own vectors.
    pub memory_own_weight: Option<f32>,
    /// Whether the outcome memory's learned words are a field of the lexical
    /// index (a learning kept before they were counted apart has none).
    #[serde(default)]
    pub memory_words: bool,
}

impl Learning {
    /// Nothing learnt is used.
    pub const NOTHING: Learning = Learning { prior: false, memory_own_weight: None, memory_words: false };
    /// The prior alone.
    pub const PRIOR: Learning = Learning { prior: true, memory_own_weight: None, memory_words: false };

    /// The memory, its vectors at `own_weight` and its learned words, with or without the prior.
    pub const fn memory(prior: bool, own_weight: f32) -> Learning {
        Learning { prior, memory_own_weight: Some(own_weight), memory_words: true }
    }

    /// The memory's learned words alone (the capabilities' vectors as they
    /// are), with or without the prior.
    pub const fn words(prior: bool) -> Learning {
        Learning { prior, memory_own_weight: None, memory_words: true }
    }

    /// Whether it uses the outcome memory (its vectors or its words).
    pub fn uses_memory(&self) -> bool {
        self.memory_own_weight.is_some() || self.memory_words
    }
}

impl std::fmt::Display for Learning {
    /// "the prior", "no prior", then the memory's part: ", the memory at
    /// own weight 5" (vectors and words) or ", the memory's words".
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(if self.prior { "the prior" } else { "no prior" })?;
        match (self.memory_own_weight, self.memory_words) {
            (Some(weight), true) => write!(f, ", the memory at own weight {weight}"),
            (Some(weight), false) => write!(f, ", the memory's vectors at own weight {weight}"),
            (None, true) => f.write_str(", the memory's words"),
            (None, false) => Ok(()),
        }
    }
}

/// The learnings tried: the prior alone; the memory at own weights from one
/// that soon outweighs a capability's text to one that only leans on it,
/// and the memory's words alone (where moving vectors buries capabilities no
/// outcome named, its words may not); each without and with the prior.
pub const TRIED: [Learning; 11] = [
    Learning::PRIOR,
    Learning::memory(false, 1.0),
    Learning::memory(false, 2.0),
    Learning::memory(false, 5.0),
    Learning::memory(false, 10.0),
    Learning::words(false),
    Learning::memory(true, 1.0),
    Learning::memory(true, 2.0),
    Learning::memory(true, 5.0),
    Learning::memory(true, 10.0),
    Learning::words(true),
];

/// How many standard errors a mean gain must clear for a learning to be used.
pub const TRUST_STANDARD_ERRORS: f64 = 2.0;

/// The trials of each [`Learning`] against none ([`crate::core::outcome_trust`]).
#[derive(Clone, Debug)]
pub struct OutcomeTrust {
    recorded: TrustState,
}

/// What an [`OutcomeTrust`] has recorded, as kept across restarts.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
pub struct TrustState {
    pub learnings: Vec<Learning>,
    /// Per learning: the sum and the sum of squares of the gains.
    pub gains: Vec<(f64, f64)>,
    pub trials: u64,
    /// The same over the unseen trials alone ([`OutcomeTrust::record`]); absent from states kept
    /// before they were counted apart (such a state is not taken back).
    #[serde(default)]
    pub unseen_gains: Vec<(f64, f64)>,
    #[serde(default)]
    pub unseen_trials: u64,
}

/// One learning's record in an [`OutcomeTrust`]: its mean gain and the
/// standard error of that mean, over every trial and over the unseen ones.
#[derive(Clone, Copy, Debug, PartialEq, Serialize)]
#[serde(rename_all = "camelCase")]
pub struct TrialGain {
    #[serde(flatten)]
    pub learning: Learning,
    pub mean_gain: f64,
    pub standard_error: f64,
    pub unseen_mean_gain: f64,
    pub unseen_standard_error: f64,
}

impl TrialGain {
    /// Whether the gain clears its noise and the unseen trials do not lose
    /// beyond theirs ([`TRUST_STANDARD_ERRORS`] each).
    pub fn trusted(&self) -> bool {
        self.mean_gain > 0.0
            && self.mean_gain > TRUST_STANDARD_ERRORS * self.standard_error
            && self.unseen_mean_gain >= -TRUST_STANDARD_ERRORS * self.unseen_standard_error
    }
}

/// The mean of `n` gains with this sum and sum of squares, and its standard
/// error (a mean of 0 and an infinite error below two).
fn mean_and_error((sum, squares): (f64, f64), n: u64) -> (f64, f64) {
    if n < 2 {
        return (0.0, f64::INFINITY);
    }
    let n = n as f64;
    let mean = sum / n;
    let variance = ((squares - n * mean * mean) / (n - 1.0)).max(0.0);
    (mean, (variance / n).sqrt())
}

/// Whether `gains` holds a finite sum and sum of squares for each of `learnings`.
fn sound(gains: &[(f64, f64)], learnings: usize) -> bool {
    gains.len() == learnings
        && gains.iter().all(|(sum, squares)| sum.is_finite() && squares.is_finite() && *squares >= 0.0)
}

impl Default for OutcomeTrust {
    fn default() -> Self {
        OutcomeTrust::new(&TRIED)
    }
}

impl OutcomeTrust {
    /// A trust with no trials yet, over `learnings`.
    pub fn new(learnings: &[Learning]) -> OutcomeTrust {
        let zero = vec![(0.0, 0.0); learnings.len()];
        let recorded = TrustState {
            learnings: learnings.to_vec(),
            gains: zero.clone(),
            trials: 0,
            unseen_gains: zero,
            unseen_trials: 0,
        };
        OutcomeTrust { recorded }
    }

    /// The learnings tried, in the order [`OutcomeTrust::record`] takes their scores.
    pub fn learnings(&self) -> &[Learning] {
        &self.recorded.learnings
    }

    /// What has been recorded, to keep ([`OutcomeTrust::from_state`] takes it back).
    pub fn state(&self) -> TrustState {
        self.recorded.clone()
    }

    /// The trust `state` recorded, if it tried exactly `learnings` and kept
    /// its unseen trials apart (a kept state of other learnings, an older or a
    /// misshapen one, says nothing about these).
    pub fn from_state(state: TrustState, learnings: &[Learning]) -> Option<OutcomeTrust> {
        let sound = state.learnings == learnings
            && sound(&state.gains, learnings.len())
            && sound(&state.unseen_gains, learnings.len())
            && state.unseen_trials <= state.trials;
        sound.then_some(OutcomeTrust { recorded: state })
    }

    /// Number of trials recorded.
    pub fn trials(&self) -> u64 {
        self.recorded.trials
    }

    /// Number of those that were unseen ([`OutcomeTrust::record`]).
    pub fn unseen_trials(&self) -> u64 {
        self.recorded.unseen_trials
    }

    /// Records one trial: the score of the capabilities that did the job
    /// (e.g. their mean reciprocal rank) `without` any learning and `with`
    /// each learning; `unseen`: nothing had been learnt about any of them
    /// (what a learning does to capabilities no outcome named yet). A trial
    /// of another length, or with a score that is not finite, is ignored;
    /// returns whether it was recorded.
    pub fn record(&mut self, without: f64, with: &[f64], unseen: bool) -> bool {
        let recorded = &mut self.recorded;
        if with.len() != recorded.learnings.len() || !without.is_finite() || with.iter().any(|score| !score.is_finite())
        {
            return false;
        }
        let add = |gains: &mut [(f64, f64)]| {
            for ((sum, squares), score) in gains.iter_mut().zip(with) {
                let gain = score - without;
                *sum += gain;
                *squares += gain * gain;
            }
        };
        add(&mut recorded.gains);
        recorded.trials += 1;
        if unseen {
            add(&mut recorded.unseen_gains);
            recorded.unseen_trials += 1;
        }
        true
    }

    /// Each learning's mean gain and its standard error so far, over every
    /// trial and over the unseen ones (infinite below two trials).
    pub fn gains(&self) -> Vec<TrialGain> {
        let recorded = &self.recorded;
        recorded
            .learnings
            .iter()
            .zip(recorded.gains.iter().zip(&recorded.unseen_gains))
            .map(|(&learning, (&all, &unseen))| {
                let (mean_gain, standard_error) = mean_and_error(all, recorded.trials);
                let (unseen_mean_gain, unseen_standard_error) = mean_and_error(unseen, recorded.unseen_trials);
                TrialGain { learning, mean_gain, standard_error, unseen_mean_gain, unseen_standard_error }
            })
            .collect()
    }

    /// The learning to use, or `None` (nothing learnt is used): of those
    /// whose gain clears [`TRUST_STANDARD_ERRORS`] standard errors and whose
    /// unseen trials do not lose beyond as many of theirs
    /// ([`TrialGain::trusted`]), the one with the largest gain.
    pub fn chosen(&self) -> Option<Learning> {
        self.gains()
            .into_iter()
            .filter(TrialGain::trusted)
            .max_by(|a, b| a.mean_gain.total_cmp(&b.mean_gain))
            .map(|trial| trial.learning)
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use proptest::prelude::*;

    const PRIOR: Learning = Learning::PRIOR;
    const MEMORY: Learning = Learning::memory(false, 5.0);

    #[test]
    fn a_learning_is_trusted_only_at_a_gain_beyond_its_noise() {
        let mut trust = OutcomeTrust::new(&[PRIOR, MEMORY]);
        assert_eq!(trust.chosen(), None, "no trials");
        // The prior gains a little, the memory more; both steadily.
        for round in 0..40 {
            let wobble = if round % 2 == 0 { 0.01 } else { -0.01 };
            assert!(trust.record(0.5, &[0.52 + wobble, 0.6 + wobble], round % 4 == 0));
        }
        assert_eq!(trust.chosen(), Some(MEMORY));
        let gains = trust.gains();
        assert!((gains[1].mean_gain - 0.1).abs() < 1e-9 && gains[1].standard_error < 0.01);
        // Misshapen trials are not counted.
        assert!(!trust.record(0.5, &[0.5], false));
        assert!(!trust.record(f64::NAN, &[0.5, 0.5], true));
        assert_eq!(trust.trials(), 40);
    }

    #[test]
    fn a_learning_reads_as_what_it_uses_and_one_kept_before_words_is_vectors_alone() {
        assert_eq!(Learning::PRIOR.to_string(), "the prior");
        assert_eq!(Learning::memory(false, 5.0).to_string(), "no prior, the memory at own weight 5");
        assert_eq!(Learning::words(true).to_string(), "the prior, the memory's words");
        assert!(Learning::words(false).uses_memory() && !Learning::PRIOR.uses_memory());
        let json = serde_json::to_value(Learning::words(true)).unwrap();
        assert_eq!(json, serde_json::json!({"prior": true, "memoryOwnWeight": null, "memoryWords": true}));
        // A learning kept before the words were a part of their own: the memory's vectors alone,
        // which is none of the learnings tried now, so its trials are not taken back.
        let kept: Learning =
            serde_json::from_value(serde_json::json!({"prior": false, "memoryOwnWeight": 5.0})).unwrap();
        assert_eq!(kept.to_string(), "no prior, the memory's vectors at own weight 5");
        assert!(!TRIED.contains(&kept));
    }

    #[test]
    fn a_learning_that_loses_or_only_wobbles_is_not_used() {
        let mut losing = OutcomeTrust::new(&[PRIOR, MEMORY]);
        for _ in 0..50 {
            losing.record(0.8, &[0.5, 0.7], false);
        }
        assert_eq!(losing.chosen(), None);
        // Gains of +0.5 and −0.4 in turn: a mean of +0.05 within its noise.
        let mut noisy = OutcomeTrust::new(&[MEMORY]);
        for round in 0..20 {
            noisy.record(0.5, &[if round % 2 == 0 { 1.0 } else { 0.1 }], false);
        }
        assert!(noisy.gains()[0].mean_gain > 0.0);
        assert_eq!(noisy.chosen(), None);
    }

    #[test]
    fn a_learning_that_gains_on_the_seen_but_loses_on_the_unseen_is_not_used() {
        // The memory gains much where its capabilities were seen, loses steadily where they
        // were not; the prior gains less, and nothing on the unseen.
        let mut trust = OutcomeTrust::new(&[PRIOR, MEMORY]);
        for round in 0..60 {
            let unseen = round % 3 == 0;
            let wobble = if round % 2 == 0 { 0.01 } else { -0.01 };
            let memory = if unseen { 0.4 + wobble } else { 0.9 + wobble };
            let prior = if unseen { 0.5 + wobble } else { 0.6 + wobble };
            assert!(trust.record(0.5, &[prior, memory], unseen));
        }
        assert_eq!((trust.trials(), trust.unseen_trials()), (60, 20));
        let gains = trust.gains();
        assert!(gains[1].mean_gain > gains[0].mean_gain && gains[1].mean_gain > 5.0 * gains[1].standard_error);
        assert!(gains[1].unseen_mean_gain < -0.09 && !gains[1].trusted());
        assert!(gains[0].trusted());
        assert_eq!(trust.chosen(), Some(PRIOR));
        // With no unseen trials there is nothing to bury: the gain alone decides.
        let mut seen_only = OutcomeTrust::new(&[MEMORY]);
        for round in 0..40 {
            seen_only.record(0.5, &[if round % 2 == 0 { 0.81 } else { 0.79 }], false);
        }
        assert_eq!(seen_only.chosen(), Some(MEMORY));
    }

    #[test]
    fn a_kept_state_comes_back_only_for_the_same_learnings() {
        let mut trust = OutcomeTrust::new(&[PRIOR, MEMORY]);
        for round in 0..5 {
            trust.record(0.5, &[0.5, 0.5 + f64::from(round) / 10.0], round % 2 == 0);
        }
        let back = OutcomeTrust::from_state(trust.state(), &[PRIOR, MEMORY]).unwrap();
        assert_eq!(back.gains(), trust.gains());
        assert_eq!(back.trials(), 5);
        assert!(OutcomeTrust::from_state(trust.state(), &[MEMORY]).is_none());
        assert_eq!(back.unseen_trials(), 3);
        let mut bad = trust.state();
        bad.gains[0].1 = f64::NAN;
        assert!(OutcomeTrust::from_state(bad, &[PRIOR, MEMORY]).is_none());
        // A state kept before the unseen trials were counted apart is not taken back.
        let mut older = trust.state();
        (older.unseen_gains, older.unseen_trials) = (Vec::new(), 0);
        assert!(OutcomeTrust::from_state(older, &[PRIOR, MEMORY]).is_none());
    }

    proptest! {
        #[test]
        fn the_chosen_learning_gains_and_clears_its_noise(
            trials in proptest::collection::vec((0.0f64..1.0, 0.0f64..1.0, 0.0f64..1.0, any::<bool>()), 0..60),
        ) {
            let mut trust = OutcomeTrust::new(&[PRIOR, MEMORY]);
            for (without, prior, memory, unseen) in &trials {
                prop_assert!(trust.record(*without, &[*prior, *memory], *unseen));
            }
            if let Some(chosen) = trust.chosen() {
                let gains = trust.gains();
                let trial = gains.iter().find(|trial| trial.learning == chosen).unwrap();
                prop_assert!(trial.mean_gain > TRUST_STANDARD_ERRORS * trial.standard_error);
                prop_assert!(trial.unseen_mean_gain >= -TRUST_STANDARD_ERRORS * trial.unseen_standard_error);
                prop_assert!(gains.iter().all(|other| other.mean_gain <= trial.mean_gain || !other.trusted()));
            }
        }
    }
}
