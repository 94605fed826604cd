//! The operator console's pure half: what its pages show ([`model`]) and how
//! they are rendered to HTML. The actix-web shell in `crate::console` asks the
//! `Api` for the data and sends the rendered pages; nothing here does I/O.

pub mod guard;
pub mod html;
pub mod model;
pub mod pages;
