//! Embedding backends besides the built-in one (`core::embedder`), the ones
//! that do I/O: the OpenAI-compatible HTTP endpoint (`http`), the local neural
//! model (`neural`, a BERT-family sentence embedder on candle, behind the
//! `neural` cargo feature; `mpnet`, the MPNet encoder it also runs), and the
//! choice between them from the `[embedder]` settings (`backend`).

pub mod backend;
pub mod http;
#[cfg(feature = "neural")]
pub mod mpnet;
#[cfg(feature = "neural")]
pub mod neural;
