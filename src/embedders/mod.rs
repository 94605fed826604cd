//! Embedding backends besides the built-in one (`core::embedder`): the
//! OpenAI-compatible HTTP endpoint (`http`), the local neural model (`neural`,
//! behind the `neural` cargo feature), and the choice between them from the
//! `[embedder]` settings (`backend`).

//! The `neural` module itself (`#[cfg(feature = "neural")] pub mod neural;`)
//! comes with the neural backend's branch; `backend` uses it only under that feature.

pub mod backend;
pub mod http;
