//! The docker-compose stack and the documented config agree on settings.

use std::collections::BTreeSet;
use std::path::Path;

fn root() -> &'static Path {
    Path::new(env!("CARGO_MANIFEST_DIR"))
}

#[test]
fn compose_file_parses_and_names_real_settings() {
    let text = std::fs::read_to_string(root().join("docker-compose.yml")).unwrap();
    let compose: serde_json::Value = serde_norway::from_str(&text).expect("docker-compose.yml is YAML");
    let services = compose["services"].as_object().expect("services");
    let nats = &services["nats"];
    let command = nats["command"].to_string();
    assert!(command.contains("-js") || command.contains("--jetstream"), "nats runs with JetStream: {command}");
    let capdex = &services["capdex"];
    assert!(capdex["build"].is_object() || capdex["build"].is_string(), "capdex is built from the repo");
    let dockerfile = capdex["build"]["dockerfile"].as_str().unwrap_or("Dockerfile");
    assert!(root().join(dockerfile).exists(), "{dockerfile} exists");
    let env: BTreeSet<String> = match &capdex["environment"] {
        serde_json::Value::Object(map) => map.keys().cloned().collect(),
        serde_json::Value::Array(items) => {
            items.iter().map(|i| i.as_str().unwrap().split('=').next().unwrap().to_string()).collect()
        }
        other => panic!("capdex environment must be a map or list, got {other}"),
    };
    let known: BTreeSet<String> = capdex::config::env_names().into_iter().map(|(name, _)| name).collect();
    for name in &env {
        assert!(known.contains(name), "docker-compose.yml sets {name}, which is not a capdex setting");
    }
    for needed in ["CAPDEX_NATS_URL", "CAPDEX_DATA_DIR"] {
        assert!(env.contains(needed), "docker-compose.yml must set {needed}");
    }
    assert!(capdex["environment"]["CAPDEX_NATS_URL"].as_str().unwrap_or_default().contains("nats:4222"));
}

#[test]
fn the_shipped_config_is_the_built_in_default_and_every_key_has_an_env_name() {
    let text = std::fs::read_to_string(root().join("config/capdex.toml")).unwrap();
    assert_eq!(text, capdex::config::DEFAULT_CONFIG_TOML);
    let names = capdex::config::env_names();
    assert!(names.len() >= 25, "{names:?}");
    for (name, key) in names {
        let leaf = key.rsplit('.').next().unwrap();
        assert!(text.contains(&format!("\n{leaf} = ")), "{key} ({name}) is documented with its default");
    }
}
