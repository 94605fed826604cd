//! Fuzzes OpenAPI documents (JSON and YAML, `$ref`s): mapping into the SCG and
//! listing a source's operations give a graph or a `MapError`, never a panic.
#![no_main]

use capdex::core::scg::map_source;
use capdex::core::scg::model::SourceKind;
use capdex::core::sources::tools::tools_of;
use libfuzzer_sys::fuzz_target;

fuzz_target!(|data: &[u8]| {
    let Ok(text) = std::str::from_utf8(data) else { return };
    let _ = map_source("fuzz", Some(SourceKind::Openapi), text);
    let _ = tools_of(SourceKind::Openapi, text);
});
