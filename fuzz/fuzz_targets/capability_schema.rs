//! Fuzzes capability JSON Schemas: the first half of the input is a schema, the
//! rest the arguments; argument validation and the SCG's schema walker answer
//! or refuse, never panic.
#![no_main]

use capdex::core::scg::schema::Resolver;
use libfuzzer_sys::fuzz_target;

fuzz_target!(|data: &[u8]| {
    let split = data.iter().position(|b| *b == 0).unwrap_or(data.len());
    let Ok(schema) = serde_json::from_slice::<serde_json::Value>(&data[..split]) else { return };
    let arguments = serde_json::from_slice::<serde_json::Value>(data.get(split + 1..).unwrap_or_default())
        .unwrap_or(serde_json::json!({}));
    let _ = capdex::core::dispatch_rules::validate_arguments("fuzz", &schema, &arguments);
    let resolver = Resolver::new(&schema);
    let _ = resolver.properties(&schema);
    let _ = resolver.field_paths(&schema);
    let _ = capdex::core::scg::schema::description(&schema);
});
