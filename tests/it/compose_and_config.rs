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

#[test]
fn compose_runs_nats_with_the_shipped_config_and_prometheus_scrapes_capdex() {
    let text = std::fs::read_to_string(root().join("docker-compose.yml")).unwrap();
    let compose: serde_json::Value = serde_norway::from_str(&text).expect("docker-compose.yml is YAML");
    let services = &compose["services"];
    let mounts = |service: &str| -> Vec<(String, String)> {
        services[service]["volumes"]
            .as_array()
            .unwrap_or_else(|| panic!("{service} has volumes"))
            .iter()
            .filter_map(|v| v.as_str())
            .filter(|v| v.starts_with("./"))
            .map(|v| {
                let mut parts = v.split(':');
                (parts.next().unwrap().to_string(), parts.next().unwrap().to_string())
            })
            .collect()
    };
    for (service, file) in [("nats", "./config/nats-server.conf"), ("prometheus", "./config/prometheus.yml")] {
        let (host, container) = mounts(service)
            .into_iter()
            .find(|(host, _)| host == file)
            .unwrap_or_else(|| panic!("{service} mounts {file}"));
        assert!(root().join(&host).is_file(), "{host} exists");
        let command = services[service]["command"].to_string();
        assert!(command.contains(&container), "{service} is started with {container}: {command}");
    }
    let nats_conf = std::fs::read_to_string(root().join("config/nats-server.conf")).unwrap();
    assert!(nats_conf.contains("jetstream"), "JetStream is on in config/nats-server.conf");
    // Every password the server config reads from its environment is given by compose.
    for variable in ["NATS_CAPDEX_PASSWORD", "NATS_RUNTIME_PASSWORD", "NATS_OPS_PASSWORD"] {
        assert!(nats_conf.contains(&format!("${variable}")), "{variable} in nats-server.conf");
        assert!(services["nats"]["environment"][variable].is_string(), "compose sets {variable} for nats");
    }
    assert_eq!(services["capdex"]["environment"]["CAPDEX_NATS_USER"], "capdex");
    let ports = services["prometheus"]["ports"].to_string();
    assert!(ports.contains("9090:9090"), "{ports}");

    let prometheus: serde_json::Value =
        serde_norway::from_str(&std::fs::read_to_string(root().join("config/prometheus.yml")).unwrap()).unwrap();
    let capdex_job = prometheus["scrape_configs"]
        .as_array()
        .unwrap()
        .iter()
        .find(|job| job["job_name"] == "capdex")
        .expect("a capdex scrape job")
        .clone();
    assert_eq!(capdex_job["metrics_path"], "/metrics");
    let listen = services["capdex"]["environment"]["CAPDEX_METRICS_LISTEN_ADDR"].as_str().unwrap();
    let port = listen.rsplit(':').next().unwrap();
    assert_eq!(capdex_job["static_configs"][0]["targets"][0], format!("capdex:{port}"));

    // The Dockerfile is multi-stage, and everything its build stage copies exists.
    let dockerfile = std::fs::read_to_string(root().join("Dockerfile")).unwrap();
    assert!(dockerfile.lines().filter(|line| line.starts_with("FROM ")).count() >= 2, "multi-stage");
    for line in dockerfile.lines().filter(|line| line.starts_with("COPY ") && !line.contains("--from")) {
        let words: Vec<&str> = line.split_whitespace().collect();
        for source in &words[1..words.len() - 1] {
            assert!(root().join(source).exists(), "Dockerfile copies {source}, which does not exist");
        }
    }
    let ignored = std::fs::read_to_string(root().join(".dockerignore")).unwrap();
    assert!(ignored.lines().any(|line| line.trim() == "target/"), "target/ stays out of the build context");
}
