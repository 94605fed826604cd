//! Fuzzes registration normalisation: any JSON payload normalises to
//! descriptors and diagnostics, never a panic, and ids follow the conventions.
#![no_main]

use libfuzzer_sys::fuzz_target;

fuzz_target!(|data: &[u8]| {
    let Ok(payload) = serde_json::from_slice::<capdex::core::registration::RegistrationPayload>(data) else { return };
    let normalised = capdex::core::registration::normalise_registration(&payload, 128);
    for descriptor in &normalised.descriptors {
        assert!(descriptor.id.starts_with(&format!("{}:", descriptor.kind)));
    }
});
