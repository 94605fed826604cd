//! Fuzzes SQL DDL: mapping a schema into the SCG (its own tokenizer) gives a
//! graph or a `MapError`, never a panic.
#![no_main]

use capdex::core::scg::map_source;
use capdex::core::scg::model::SourceKind;
use capdex::core::sources::tools::tools_of;
use libfuzzer_sys::fuzz_target;

fuzz_target!(|data: &[u8]| {
    let Ok(text) = std::str::from_utf8(data) else { return };
    let _ = map_source("fuzz", Some(SourceKind::Sql), text);
    let _ = tools_of(SourceKind::Sql, text);
    let _ = capdex::core::scg::infer_kind(text);
});
