//! Concepts at query time: placeholder, filled in the next commit.

use serde::{Deserialize, Serialize};

/// One concept a question resolved to.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct ResolvedConcept {
    pub concept: String,
}

impl ResolvedConcept {
    /// `concept`.
    pub fn label(&self) -> String {
        self.concept.clone()
    }
}
