//! capdex
pub mod core;
