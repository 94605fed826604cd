//! Fuzzes the config file (`capdex.toml`): any text loads to settings or a
//! `ConfigError` naming the setting, never a panic.
#![no_main]

use capdex::config::{Environment, Settings};
use libfuzzer_sys::fuzz_target;

fuzz_target!(|data: &[u8]| {
    let Ok(text) = std::str::from_utf8(data) else { return };
    let env: Environment = [("HOME", "/home/fuzz")].into_iter().collect();
    let _ = Settings::load_text("fuzz.toml", Some(text), &env);
});
