//! A corpus of hostile and broken capability folders, on real files: each is
//! refused with the right field and problem, none panics, and the good ones
//! around them still load. Also the 343-entry AgentOS catalog written out as
//! manifest folders, as a realistic load.

use crate::support::fixture;
use capdex::folders::manifest_dir::{scan, scan_with_refusals, ScanLimits};
use std::fs;
use std::path::Path;

fn folder(root: &Path, name: &str, manifest: &[u8]) {
    fs::create_dir_all(root.join(name)).unwrap();
    fs::write(root.join(name).join("CAPABILITY.yaml"), manifest).unwrap();
}

#[test]
fn hostile_and_broken_manifests_are_refused_with_field_and_problem() {
    let dir = tempfile::tempdir().unwrap();
    let root = dir.path();
    let outside = tempfile::tempdir().unwrap();
    fs::write(outside.path().join("secret.md"), "TOP SECRET").unwrap();
    fs::write(root.join("loose-secret.md"), "ALSO SECRET").unwrap();

    folder(root, "good", b"name: good\nkind: tool\ndescription: A good tool\n");
    folder(root, "good-skill", b"name: good-skill\nkind: skill\ndescription: d\nskillContent: ./docs/SKILL.md\n");
    fs::create_dir_all(root.join("good-skill/docs")).unwrap();
    fs::write(root.join("good-skill/docs/SKILL.md"), "# Good\n").unwrap();

    folder(root, "symlinked-file", b"name: s1\nkind: skill\ndescription: d\n");
    std::os::unix::fs::symlink(outside.path().join("secret.md"), root.join("symlinked-file/SKILL.md")).unwrap();
    fs::create_dir_all(outside.path().join("real")).unwrap();
    fs::write(outside.path().join("real/CAPABILITY.yaml"), "name: s2\nkind: tool\ndescription: d\n").unwrap();
    std::os::unix::fs::symlink(outside.path().join("real"), root.join("symlinked-folder")).unwrap();
    folder(root, "symlinked-subfolder", b"name: s3\nkind: skill\ndescription: d\nskillContent: docs/SKILL.md\n");
    std::os::unix::fs::symlink(outside.path(), root.join("symlinked-subfolder/docs")).unwrap();
    folder(root, "symlinked-manifest", b"");
    fs::remove_file(root.join("symlinked-manifest/CAPABILITY.yaml")).unwrap();
    std::os::unix::fs::symlink(
        outside.path().join("real/CAPABILITY.yaml"),
        root.join("symlinked-manifest/CAPABILITY.yaml"),
    )
    .unwrap();

    let cases: &[(&str, &str, &str)] = &[
        ("dotdot", "skillContent: ../loose-secret.md", "skillContent"),
        ("absolute", "skillContent: /etc/passwd", "skillContent"),
        ("proc", "skillContent: /proc/self/environ", "skillContent"),
        ("dot-name", "skillContent: ./.hidden.md", "skillContent"),
        ("inner-dotdot", "skillContent: docs/../../loose-secret.md", "skillContent"),
        ("empty-skill", "skillContent: \"\"", "skillContent"),
        ("null-skill", "skillContent: null", "skillContent"),
        ("false-skill", "skillContent: false", "skillContent"),
        ("number-skill", "skillContent: 42", "skillContent"),
        ("missing-file", "skillContent: ./NOPE.md", "skillContent"),
    ];
    for (name, line, _) in cases {
        folder(root, name, format!("name: {name}\nkind: skill\ndescription: d\n{line}\n").as_bytes());
    }
    folder(root, "no-name", b"kind: tool\ndescription: d\n");
    folder(root, "no-kind", b"name: x\ndescription: d\n");
    folder(root, "no-description", b"name: x\nkind: tool\n");
    folder(root, "null-description", b"name: x\nkind: tool\ndescription: null\n");
    folder(root, "number-name", b"name: [1, 2]\nkind: tool\ndescription: d\n");
    folder(root, "unknown-kind", b"name: x\nkind: wizard\ndescription: d\n");
    folder(root, "false-tags", b"name: x\nkind: tool\ndescription: d\ntags: false\n");
    folder(root, "invalid-utf8", b"name: x\nkind: tool\ndescription: \xff\xfe\n");
    folder(root, "not-a-mapping", b"- just\n- a list\n");
    folder(root, "broken-yaml", b"name: [unclosed\nkind: tool\n");
    folder(root, "oversize", format!("name: x\nkind: tool\ndescription: {}\n", "y".repeat(300_000)).as_bytes());
    let deep =
        format!("name: deep\nkind: tool\ndescription: d\ninputSchema: {}{}\n", "[".repeat(5000), "]".repeat(5000));
    folder(root, "deep-nesting", deep.as_bytes());
    folder(root, "dup-a", b"id: tool:same\nname: a\nkind: tool\ndescription: first\n");
    folder(root, "dup-b", b"id: tool:same\nname: b\nkind: tool\ndescription: second\n");
    folder(root, "bad-schema-json", b"name: bs\nkind: tool\ndescription: d\n");
    fs::write(root.join("bad-schema-json/schema.json"), "[1, 2").unwrap();
    folder(root, "big-skill", b"name: bigskill\nkind: skill\ndescription: d\n");
    fs::write(root.join("big-skill/SKILL.md"), "z".repeat(2 * 1024 * 1024)).unwrap();

    let report = scan(&[root.to_path_buf()]);
    let found: Vec<&str> = report.descriptors.iter().map(|d| d.id.as_str()).collect();
    assert_eq!(found, vec!["tool:same", "tool:good", "skill:good-skill"], "{:#?}", report.refused);
    let good_skill = &report.descriptors[2];
    assert_eq!(good_skill.full_content.as_deref(), Some("# Good\n"));
    for descriptor in &report.descriptors {
        let text = serde_json::to_string(descriptor).unwrap();
        assert!(!text.contains("SECRET"), "a secret leaked into {}", descriptor.id);
    }

    let refused = |folder: &str| {
        report
            .refused
            .iter()
            .find(|r| r.manifest_path.contains(&format!("/{folder}/")))
            .unwrap_or_else(|| panic!("{folder} was not refused: {:#?}", report.refused))
    };
    for (name, _, field) in cases {
        assert_eq!(refused(name).field, *field, "{name}: {:?}", refused(name));
    }
    let expectations: &[(&str, &str, &str)] = &[
        ("symlinked-file", "SKILL.md", "symbolic link"),
        ("symlinked-folder", "(folder)", "symbolic link"),
        ("symlinked-subfolder", "skillContent", "symbolic link"),
        ("symlinked-manifest", "(file)", "symbolic link"),
        ("no-name", "name", "required"),
        ("no-kind", "kind", "required"),
        ("no-description", "description", "required"),
        ("null-description", "description", "required"),
        ("number-name", "name", "must be text"),
        ("unknown-kind", "kind", "unknown kind"),
        ("false-tags", "tags", "must be a list"),
        ("invalid-utf8", "(file)", "UTF-8"),
        ("not-a-mapping", "(document)", "not a mapping"),
        ("broken-yaml", "(document)", "not valid YAML"),
        ("oversize", "(file)", "more than"),
        ("deep-nesting", "(document)", "not valid YAML"),
        ("dup-b", "id", "duplicate id tool:same"),
        ("bad-schema-json", "schema.json", "not valid JSON"),
        ("big-skill", "SKILL.md", "more than"),
    ];
    for (folder, field, problem) in expectations {
        let refusal = refused(folder);
        assert_eq!(refusal.field, *field, "{folder}: {refusal:?}");
        assert!(refusal.problem.contains(problem), "{folder}: {refusal:?}");
    }
    // A symlinked capability folder is reported, and not followed.
    assert!(!found.contains(&"tool:s2"));
    assert_eq!(report.refused.len(), cases.len() + expectations.len());

    // Limits are configurable.
    let strict = scan_with_refusals(
        &[root.to_path_buf()],
        ScanLimits { max_manifest_bytes: 20, max_attachment_bytes: 4, ..ScanLimits::default() },
    );
    assert!(strict.descriptors.is_empty());
}

#[test]
fn the_agentos_catalog_as_manifest_folders_loads() {
    let catalog_path = fixture("catalog/agentos-catalog.json");
    let text =
        fs::read_to_string(&catalog_path).unwrap_or_else(|err| panic!("cannot read {}: {err}", catalog_path.display()));
    let entries: Vec<serde_json::Value> = serde_json::from_str(&text).unwrap();
    let dir = tempfile::tempdir().unwrap();
    let mut written = std::collections::BTreeSet::new();
    for (i, entry) in entries.iter().enumerate() {
        let folder = dir.path().join(format!("cap-{i:03}"));
        fs::create_dir_all(&folder).unwrap();
        let mut manifest = String::new();
        for key in
            ["id", "kind", "name", "displayName", "description", "category", "tags", "requiredSecrets", "requiredTools"]
        {
            match &entry[key] {
                serde_json::Value::Null => {}
                serde_json::Value::String(s) if s.is_empty() => {}
                value => manifest.push_str(&format!("{key}: {value}\n")),
            }
        }
        if let Some(content) = entry["skillContent"].as_str() {
            fs::write(folder.join("SKILL.md"), content).unwrap();
        }
        fs::write(folder.join("CAPABILITY.yaml"), manifest).unwrap();
        written.insert(entry["id"].as_str().unwrap().to_string());
    }
    let report = scan(&[dir.path().to_path_buf()]);
    let with_description = entries.iter().filter(|e| e["description"].as_str().is_some_and(|d| !d.is_empty())).count();
    // Every entry with a description loads once; repeated ids and entries without a description are refused, with reasons.
    assert_eq!(report.descriptors.len(), written.len() - (entries.len() - with_description));
    assert_eq!(report.descriptors.len() + report.refused.len(), entries.len(), "{:#?}", report.refused);
    for refusal in &report.refused {
        assert!(["description", "id"].contains(&refusal.field.as_str()), "{refusal:?}");
    }
    let skills = report.descriptors.iter().filter(|d| d.full_content.is_some()).count();
    assert!(skills >= 80, "{skills} skills with SKILL.md content");
}
