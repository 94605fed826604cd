//! Fuzzes SKILL.md front matter: any text splits into a front-matter map and a
//! body, and registers as a skill or a refusal, never a panic.
#![no_main]

use libfuzzer_sys::fuzz_target;

fuzz_target!(|data: &[u8]| {
    let Ok(text) = std::str::from_utf8(data) else { return };
    let (front, body) = capdex::core::registration::split_front_matter(text);
    if let Some(body) = &body {
        assert!(body.len() <= text.len());
    }
    let _ = front;
    let payload = serde_json::json!({"runtimeId": "fuzz", "skills": [{"name": "fuzz", "content": text}]});
    if let Ok(payload) = serde_json::from_value::<capdex::core::registration::RegistrationPayload>(payload) {
        let _ = capdex::core::registration::normalise_registration(&payload, 128);
    }
});
