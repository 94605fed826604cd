//! Fuzzes MCP tool lists (`tools/list` results): mapping into the SCG and
//! listing a source's tools give a graph or a `MapError`, never a panic.
#![no_main]

use capdex::core::scg::map_source;
use capdex::core::scg::model::SourceKind;
use capdex::core::sources::tools::tools_of;
use libfuzzer_sys::fuzz_target;

fuzz_target!(|data: &[u8]| {
    let Ok(text) = std::str::from_utf8(data) else { return };
    let _ = map_source("fuzz", Some(SourceKind::Mcp), text);
    if let Ok(tools) = tools_of(SourceKind::Mcp, text) {
        let _ = capdex::core::sources::tools::mcp_document(&tools);
    }
});
