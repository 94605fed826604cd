//! Fuzzes the CAPABILITY.yaml parser: any bytes parse to a draft or a refusal,
//! never a panic, and a draft always carries the required fields.
#![no_main]

use libfuzzer_sys::fuzz_target;

fuzz_target!(|data: &[u8]| {
    let Ok(text) = std::str::from_utf8(data) else { return };
    if let Ok(draft) = capdex::core::manifest::parse(text) {
        assert!(!draft.name.is_empty() && !draft.description.is_empty());
        assert!(!draft.id.is_empty());
        if let Some(path) = &draft.skill_content_path {
            assert!(!path.split('/').any(|segment| segment.is_empty() || segment.starts_with('.')));
        }
    }
});
