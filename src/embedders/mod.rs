//! Embedding backends that do I/O (model files, the network), outside the pure core.
//!
//! - [`neural`] (feature `neural`): a local BERT-family sentence embedder on candle.

#[cfg(feature = "neural")]
pub mod neural;
