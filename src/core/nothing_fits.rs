//! Signals for "nothing fits": whether a request's best capabilities
//! really answer it, from evidence with a reason to generalise rather than
//! from the relevance scale alone.
//!
//! - [`coverage`]: the share of the request's content words (index terms,
//!   [`index_terms`]) that a capability's own text uses. A request whose
//!   words the best capability does not use is about something else, even
//!   when one shared word ("height", "calculate") lifts its BM25F score.
//! - [`GenericFloor`]: how close text that asks for no capability at all
//!   comes to the catalog. [`GENERIC_SENTENCES`] (conversation, opinions,
//!   everyday statements: no tool request) are embedded with the catalog's
//!   model when the index is built; a request is semantically nearer a
//!   capability than chatter only when its cosine with that capability
//!   passes what those sentences reach against the same catalog. The
//!   floor is thus measured per model and per catalog, never a fixed cosine.
//! - [`asks_for_nothing`], the rule discovery applies when
//!   `[discovery] chatter_gate` is on: a request whose best capabilities are
//!   no nearer it than chatter is ([`chatter_likeness`], its best cosine
//!   with [`GENERIC_SENTENCES`] embedded by the same model) asks for nothing
//!   the catalog offers, and gets an empty Tier 1. Measured on the three dev
//!   sets in `docs/performance.md` ("An empty Tier 1 for chatter").

use crate::core::embedder::dot;
use crate::core::index::VectorIndex;
use crate::core::text::index_terms;
use std::collections::HashSet;

/// Sentences that ask for no capability: greetings, thanks, feelings,
/// opinions, remarks about the conversation, everyday statements. Written
/// for capdex (not taken from any benchmark), embedded once per index.
pub const GENERIC_SENTENCES: &[&str] = &[
    "hello",
    "hi, nice to meet you",
    "good afternoon, how has your week been?",
    "thank you, I really appreciate it",
    "thanks a lot for your help earlier",
    "alright, that works for me",
    "sure, no problem",
    "I understand now, thanks for explaining",
    "that is interesting, tell me more about yourself",
    "I am not sure how I feel about that",
    "this is so exciting",
    "I feel great today",
    "I'm a little sad this evening",
    "the weekend went by too quickly",
    "it has been a busy morning",
    "my neighbour's dog barks all night",
    "we had pasta for dinner yesterday",
    "I'm going to make some tea",
    "what a beautiful day it is",
    "I love spending time with my family",
    "do you ever get tired of talking?",
    "are you real?",
    "what is your name?",
    "how old are you?",
    "do you dream?",
    "what do you like to do for fun?",
    "tell me something about you",
    "please be more concise",
    "that was not quite what I meant",
    "let me rephrase my question",
    "wait, I need to think",
    "hold on a minute",
    "never mind that",
    "I changed my mind",
    "ok thanks, that's all for now",
    "see you tomorrow",
    "take care",
    "goodbye",
    "yes please",
    "no thanks",
    "I don't know",
    "fine",
    "really?",
    "interesting",
    "you are very kind",
    "sorry about that",
    "my apologies for the confusion",
    "I'm just chatting",
    "nothing in particular, just saying hello",
    "this conversation is fun",
];

/// [`GENERIC_SENTENCES`] as the texts an embedder is asked for.
pub fn chatter_texts() -> Vec<String> {
    GENERIC_SENTENCES.iter().map(|text| text.to_string()).collect()
}

/// The share of `request`'s distinct content words (index terms) found in
/// `capability_terms`; 0 for a request without content words.
pub fn coverage(request: &str, capability_terms: &HashSet<String>) -> f32 {
    let terms: HashSet<String> = index_terms(request).into_iter().collect();
    if terms.is_empty() {
        return 0.0;
    }
    terms.iter().filter(|term| capability_terms.contains(*term)).count() as f32 / terms.len() as f32
}

/// The index terms of a capability's text, for [`coverage`].
pub fn terms_of(text: &str) -> HashSet<String> {
    index_terms(text).into_iter().collect()
}

/// What requests that ask for nothing reach against one catalog: for each
/// generic sentence its best cosine with any capability; the floor is the
/// largest of them.
#[derive(Clone, Debug, Default, PartialEq)]
pub struct GenericFloor {
    /// Per generic sentence, its best cosine with the catalog.
    pub best: Vec<f32>,
}

impl GenericFloor {
    /// Measures `generic` (the vectors of [`GENERIC_SENTENCES`]) against
    /// `vectors`; sentences without a vector are skipped.
    pub fn measure(generic: &[Vec<f32>], vectors: &VectorIndex) -> GenericFloor {
        let best = generic
            .iter()
            .filter(|vector| dot(vector, vector) > 0.0)
            .filter_map(|vector| vectors.search(vector, 1, |_| true).first().map(|hit| hit.score))
            .collect();
        GenericFloor { best }
    }

    /// The highest cosine a generic sentence reached with the catalog
    /// (0 with no vectors: every cosine passes).
    pub fn floor(&self) -> f32 {
        self.best.iter().copied().fold(0.0, f32::max)
    }

    /// The `q`-quantile (in [0, 1]) of the generic sentences' best cosines.
    pub fn quantile(&self, q: f32) -> f32 {
        if self.best.is_empty() {
            return 0.0;
        }
        let mut sorted = self.best.clone();
        sorted.sort_by(f32::total_cmp);
        let at = ((sorted.len() - 1) as f32 * q.clamp(0.0, 1.0)).round() as usize;
        sorted[at]
    }
}

/// The request's likeness to chatter: its best cosine with any of `generic`
/// (the vectors of [`GENERIC_SENTENCES`] by the request's own model);
/// `None` when the request has no vector or no generic vector has its
/// dimensions (then nothing can be said).
pub fn chatter_likeness(request: &[f32], generic: &[Vec<f32>]) -> Option<f32> {
    if dot(request, request) <= 0.0 {
        return None;
    }
    generic
        .iter()
        .filter(|vector| vector.len() == request.len() && dot(vector, vector) > 0.0)
        .map(|vector| dot(request, vector))
        .reduce(f32::max)
}

/// Whether a request asks for nothing the catalog offers: `chatter` is its
/// likeness to chatter ([`chatter_likeness`]) and `cosines` the cosines of
/// its best capabilities with it (`None` for one without a vector). True
/// when it has a likeness, some best capability has a cosine, and none of
/// them is nearer the request than chatter is. A request that names a
/// capability exactly is never taken for chatter (its caller checks that).
pub fn asks_for_nothing(chatter: Option<f32>, cosines: impl IntoIterator<Item = Option<f32>>) -> bool {
    let Some(chatter) = chatter else { return false };
    match cosines.into_iter().flatten().reduce(f32::max) {
        Some(best) => best <= chatter,
        None => false,
    }
}

/// Whether a message asks for nothing the catalog offers, judged part by
/// part: `parts` gives, for the whole message and then each of its clauses,
/// its likeness to chatter and its best cosine with the capabilities found.
/// True when the whole message asks for nothing ([`asks_for_nothing`]) and no
/// clause is nearer those capabilities than it is to chatter: a request that
/// opens with a greeting or a feeling ("Hey! I'm off to Margaret River soon.
/// Can you tell me the surf conditions?") keeps its Tier 1 by the clause that
/// asks for something.
pub fn message_asks_for_nothing(parts: impl IntoIterator<Item = (Option<f32>, Option<f32>)>) -> bool {
    let mut parts = parts.into_iter();
    let Some((chatter, best)) = parts.next() else { return false };
    asks_for_nothing(chatter, [best])
        && !parts.any(|part| matches!(part, (Some(chatter), Some(best)) if best > chatter))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_clause_that_asks_for_something_keeps_the_message() {
        // (likeness to chatter, best cosine with the capabilities found): the whole message first.
        let chatty_whole = (Some(0.6), Some(0.5));
        assert!(message_asks_for_nothing([chatty_whole]));
        assert!(message_asks_for_nothing([chatty_whole, (Some(0.7), Some(0.4)), (Some(0.5), Some(0.5))]));
        assert!(!message_asks_for_nothing([chatty_whole, (Some(0.7), Some(0.4)), (Some(0.3), Some(0.6))]));
        // A clause without a likeness or a cosine says nothing either way.
        assert!(message_asks_for_nothing([chatty_whole, (None, Some(0.9)), (Some(0.1), None)]));
        // A whole message nearer the catalog than chatter is never gated, whatever its clauses.
        assert!(!message_asks_for_nothing([(Some(0.4), Some(0.5)), (Some(0.9), Some(0.1))]));
        assert!(!message_asks_for_nothing([]));
    }

    #[test]
    fn coverage_counts_the_requests_content_words_the_capability_uses() {
        let bmi = terms_of("determine_body_mass_index Calculate body mass index given weight and height.");
        let triangle = terms_of("calculate_triangle_area Calculate the area of a triangle given base and height.");
        let request = "Calculate the area of a triangle given the base is 10 meters and height is 5 meters.";
        assert!(coverage(request, &triangle) > 0.6, "{}", coverage(request, &triangle));
        assert!(coverage(request, &bmi) < 0.4, "{}", coverage(request, &bmi));
        assert_eq!(coverage("the of and", &triangle), 0.0);
    }

    #[test]
    fn the_floor_is_what_generic_sentences_reach_against_the_catalog() {
        let mut index = VectorIndex::new(2);
        index.upsert("a", &[1.0, 0.0]).unwrap();
        index.upsert("b", &[0.0, 1.0]).unwrap();
        let generic = vec![vec![0.6, 0.8], vec![0.0, 0.0], vec![1.0, 0.0]];
        let floor = GenericFloor::measure(&generic, &index);
        assert_eq!(floor.best.len(), 2);
        assert!((floor.floor() - 1.0).abs() < 0.02);
        assert!((floor.quantile(0.0) - 0.8).abs() < 0.02);
        assert_eq!(GenericFloor::default().floor(), 0.0);
        assert!((chatter_likeness(&[0.6, 0.8], &generic).unwrap() - 1.0).abs() < 1e-6);
        let unique: HashSet<&str> = GENERIC_SENTENCES.iter().copied().collect();
        assert_eq!(unique.len(), GENERIC_SENTENCES.len());
    }

    #[test]
    fn a_request_no_nearer_its_best_capabilities_than_chatter_asks_for_nothing() {
        let generic = vec![vec![0.6, 0.8], vec![0.0, 0.0], vec![1.0, 0.0, 0.0]];
        // Only the generic vectors of the request's dimensions count; a zero request says nothing.
        assert!((chatter_likeness(&[1.0, 0.0], &generic).unwrap() - 0.6).abs() < 1e-6);
        assert_eq!(chatter_likeness(&[0.0, 0.0], &generic), None);
        assert_eq!(chatter_likeness(&[1.0, 0.0, 0.0, 0.0], &generic), None);
        assert!(asks_for_nothing(Some(0.6), [Some(0.5), None, Some(0.6)]));
        assert!(!asks_for_nothing(Some(0.6), [Some(0.5), Some(0.61)]));
        // No likeness or no cosine: nothing to decide on, so Tier 1 is chosen as usual.
        assert!(!asks_for_nothing(None, [Some(0.1)]));
        assert!(!asks_for_nothing(Some(0.6), [None, None]));
        assert!(!asks_for_nothing(Some(0.6), []));
    }
}
