//! The docker-compose stack and the documented config agree on settings, and the
//! Dockerfile's build stage copies everything the build compiles in.

use std::collections::BTreeSet;
use std::path::{Path, PathBuf};

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
    for variable in [
        "NATS_CAPDEX_PASSWORD",
        "NATS_RUNTIME_PASSWORD",
        "NATS_OPS_PASSWORD",
        "NATS_AGENT_ALPHA_PASSWORD",
        "NATS_AGENT_BETA_PASSWORD",
        "NATS_APPROVER_PASSWORD",
    ] {
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

/// Where the Dockerfile's build stage puts what it copies: `(path in the repository, path in the
/// image)` per `COPY` source, and the stage's `WORKDIR`.
fn build_stage_copies(dockerfile: &str) -> (PathBuf, Vec<(PathBuf, PathBuf)>) {
    let mut workdir = PathBuf::from("/");
    let mut copies = Vec::new();
    let mut stages = 0;
    for line in dockerfile.lines().map(str::trim) {
        let words: Vec<&str> = line.split_whitespace().collect();
        match words.first().map(|word| word.to_ascii_uppercase()).as_deref() {
            Some("FROM") => {
                stages += 1;
                if stages > 1 {
                    break;
                }
            }
            Some("WORKDIR") => workdir = workdir.join(words[1]),
            Some("COPY") if !line.contains("--from") => {
                let (sources, destination) = (&words[1..words.len() - 1], words[words.len() - 1]);
                let destination = normalise(&workdir.join(destination));
                for source in sources {
                    let source = normalise(Path::new(source));
                    // A folder's contents land in the destination; a file lands in a destination
                    // folder (written with a trailing slash, or one of several sources) by name.
                    let landed = if root().join(&source).is_dir() {
                        destination.clone()
                    } else if words[words.len() - 1].ends_with('/') || sources.len() > 1 {
                        destination.join(source.file_name().unwrap())
                    } else {
                        destination.clone()
                    };
                    copies.push((source, landed));
                }
            }
            _ => {}
        }
    }
    (workdir, copies)
}

/// `path` with `.` and `..` components resolved lexically.
fn normalise(path: &Path) -> PathBuf {
    let mut out = PathBuf::new();
    for component in path.components() {
        match component {
            std::path::Component::CurDir => {}
            std::path::Component::ParentDir => {
                assert!(out.pop(), "{} climbs above its root", path.display());
            }
            other => out.push(other),
        }
    }
    out
}

/// Every `include_bytes!("…")` / `include_str!("…")` of the `.rs` files below `src/` outside their
/// `#[cfg(test)] mod` (which a release build does not compile), as `(file, path in the repository)`.
fn compiled_in_includes() -> Vec<(PathBuf, PathBuf)> {
    let mut files = vec![root().join("src")];
    let mut includes = Vec::new();
    while let Some(path) = files.pop() {
        if path.is_dir() {
            files.extend(std::fs::read_dir(&path).unwrap().map(|entry| entry.unwrap().path()));
            continue;
        }
        if path.extension().is_none_or(|ext| ext != "rs") {
            continue;
        }
        let text = std::fs::read_to_string(&path).unwrap();
        let tests_start = text.find("#[cfg(test)]\nmod ").unwrap_or(text.len());
        for macro_name in ["include_bytes!(", "include_str!("] {
            for (at, _) in text.match_indices(macro_name).filter(|(at, _)| *at < tests_start) {
                let line_start = text[..at].rfind('\n').map_or(0, |i| i + 1);
                if text[line_start..at].trim_start().starts_with("//") {
                    continue;
                }
                let argument = text[at + macro_name.len()..].trim_start();
                let literal = argument
                    .strip_prefix('"')
                    .and_then(|rest| rest.split('"').next())
                    .unwrap_or_else(|| panic!("{}: {macro_name} without a plain string literal", path.display()));
                let relative = path.parent().unwrap().strip_prefix(root()).unwrap().join(literal);
                includes.push((path.strip_prefix(root()).unwrap().to_path_buf(), normalise(&relative)));
            }
        }
    }
    includes.sort();
    includes
}

/// The includes of `includes` that the Dockerfile text `dockerfile` does not copy to where the
/// build finds them (the same path below its `WORKDIR`).
fn not_copied(dockerfile: &str, includes: &[(PathBuf, PathBuf)]) -> Vec<String> {
    let (workdir, copies) = build_stage_copies(dockerfile);
    includes
        .iter()
        .filter(|(_, included)| {
            !copies
                .iter()
                .any(|(source, landed)| included.starts_with(source) && normalise(&workdir.join(source)) == *landed)
        })
        .map(|(file, included)| format!("{} includes {}", file.display(), included.display()))
        .collect()
}

#[test]
fn the_dockerfile_build_stage_copies_everything_the_build_compiles_in() {
    let includes = compiled_in_includes();
    let included: Vec<&Path> = includes.iter().map(|(_, path)| path.as_path()).collect();
    // The scan finds the known ones (so an empty scan cannot pass), and skips test-only includes.
    for known in ["config/capdex.toml", "assets/static-minilm/table.bin", "assets/static-minilm/vocab.txt"] {
        assert!(included.contains(&Path::new(known)), "{known} not found among {included:?}");
    }
    assert!(included.iter().all(|path| !path.starts_with("tests")), "{included:?}");
    for (file, path) in &includes {
        assert!(root().join(path).is_file(), "{} includes {}, which is not a file", file.display(), path.display());
    }
    let dockerfile = std::fs::read_to_string(root().join("Dockerfile")).unwrap();
    let missing = not_copied(&dockerfile, &includes);
    assert!(missing.is_empty(), "the Dockerfile's build stage does not COPY what the build compiles in: {missing:?}");
    // The check fails on a Dockerfile without the assets, or with them put elsewhere.
    let without: String =
        dockerfile.lines().filter(|line| !line.contains("assets")).map(|l| format!("{l}\n")).collect();
    let in_assets = included.iter().filter(|path| path.starts_with("assets")).count();
    assert_eq!(not_copied(&without, &includes).len(), in_assets, "{without}");
    assert!(without.contains("COPY src ./src\n"), "{without}");
    let elsewhere = without.replace("COPY src ./src\n", "COPY src ./src\nCOPY assets ./data/\n");
    assert_eq!(not_copied(&elsewhere, &includes).len(), in_assets, "{elsewhere}");
    let restored = without.replace("COPY src ./src\n", "COPY src ./src\nCOPY assets ./assets\n");
    assert!(not_copied(&restored, &includes).is_empty(), "{restored}");
    // Only the build stage counts: a copy into the runtime stage (the last) compiles nothing.
    let runtime_only = format!("{without}COPY assets ./assets\n");
    assert_eq!(not_copied(&runtime_only, &includes).len(), in_assets, "{runtime_only}");
}

/// The compose file as JSON.
fn compose() -> serde_json::Value {
    let text = std::fs::read_to_string(root().join("docker-compose.yml")).unwrap();
    serde_norway::from_str(&text).expect("docker-compose.yml is YAML")
}

/// The `host:port` of each entry of the `routes: [...]` list of a nats-server config.
fn routes(conf: &str) -> Vec<String> {
    let start = conf.find("routes: [").expect("a routes list") + "routes: [".len();
    let end = start + conf[start..].find(']').expect("the routes list ends");
    conf[start..end]
        .split(|c: char| c.is_whitespace() || c == ',')
        .filter(|route| !route.is_empty())
        .map(|route| {
            route.strip_prefix("nats://").unwrap_or_else(|| panic!("route {route} is not nats://")).to_string()
        })
        .collect()
}

/// The `accounts { ... }` block of a nats-server config, from its line to the end of the file.
fn accounts_block(conf: &str) -> &str {
    &conf[conf.find("\naccounts {").expect("an accounts block")..]
}

#[test]
fn the_cluster_profile_runs_three_nats_servers_and_two_capdex_replicas() {
    let compose = compose();
    let services = compose["services"].as_object().expect("services");
    let in_profile: BTreeSet<&str> = services
        .iter()
        .filter(|(_, service)| service["profiles"].as_array().is_some_and(|p| p.iter().any(|p| p == "cluster")))
        .map(|(name, _)| name.as_str())
        .collect();
    assert_eq!(in_profile, BTreeSet::from(["nats-1", "nats-2", "nats-3", "capdex-1", "capdex-2"]));
    for name in ["nats", "capdex", "prometheus"] {
        assert!(services[name]["profiles"].is_null(), "{name} stays in the default stack");
    }
    let conf = std::fs::read_to_string(root().join("config/nats-cluster.conf")).unwrap();
    let nats_names = ["nats-1", "nats-2", "nats-3"];
    let cluster_port = conf
        .split("cluster {")
        .nth(1)
        .and_then(|block| block.lines().find_map(|line| line.trim().strip_prefix("port: ")))
        .expect("the cluster block has a port");
    // The routes name the three servers on the cluster port: every server has routes to the two others.
    let mut expected_routes: Vec<String> = nats_names.iter().map(|name| format!("{name}:{cluster_port}")).collect();
    expected_routes.sort();
    let mut found_routes = routes(&conf);
    found_routes.sort();
    assert_eq!(found_routes, expected_routes);
    assert!(conf.contains("server_name: $NATS_SERVER_NAME"), "each server names itself from its environment");
    assert!(conf.contains("jetstream {"), "JetStream is on");
    // The same accounts and permissions as the single server.
    let single = std::fs::read_to_string(root().join("config/nats-server.conf")).unwrap();
    assert_eq!(accounts_block(&conf), accounts_block(&single), "config/nats-cluster.conf's accounts drifted");

    let mut ports = BTreeSet::new();
    for name in nats_names {
        let service = &services[name];
        assert!(
            service["command"].to_string().contains("/etc/nats/nats-cluster.conf"),
            "{name}: {}",
            service["command"]
        );
        let mount = "./config/nats-cluster.conf:/etc/nats/nats-cluster.conf:ro";
        assert!(service["volumes"].as_array().unwrap().iter().any(|v| v == mount), "{name} mounts the cluster config");
        assert_eq!(service["environment"]["NATS_SERVER_NAME"], name);
        for variable in [
            "NATS_CAPDEX_PASSWORD",
            "NATS_RUNTIME_PASSWORD",
            "NATS_OPS_PASSWORD",
            "NATS_AGENT_ALPHA_PASSWORD",
            "NATS_AGENT_BETA_PASSWORD",
            "NATS_APPROVER_PASSWORD",
        ] {
            assert!(service["environment"][variable].is_string(), "compose sets {variable} for {name}");
        }
        for port in service["ports"].as_array().unwrap() {
            assert!(ports.insert(port.as_str().unwrap().split(':').next().unwrap().to_string()), "{name}: {port}");
        }
    }

    let known: BTreeSet<String> = capdex::config::env_names().into_iter().map(|(name, _)| name).collect();
    let mut node_names = BTreeSet::new();
    for (i, name) in ["capdex-1", "capdex-2"].into_iter().enumerate() {
        let environment = services[name]["environment"].as_object().expect("a map of settings");
        for variable in environment.keys() {
            assert!(known.contains(variable), "{name} sets {variable}, which is not a capdex setting");
        }
        assert_eq!(environment["CAPDEX_JETSTREAM_REPLICAS"], "3", "{name}");
        assert!(
            node_names.insert(environment["CAPDEX_JETSTREAM_NODE_NAME"].as_str().unwrap()),
            "{name}: a unique name"
        );
        // The URL list names every server once, this replica's own first, and capdex accepts it.
        let url = environment["CAPDEX_NATS_URL"].as_str().unwrap();
        let servers: Vec<&str> = url.split(',').collect();
        assert_eq!(servers[0], format!("nats://{}:4222", nats_names[i]), "{name}: {url}");
        let mut hosts: Vec<&str> =
            servers.iter().map(|s| s.strip_prefix("nats://").unwrap().strip_suffix(":4222").unwrap()).collect();
        hosts.sort();
        assert_eq!(hosts, nats_names, "{name}: {url}");
        let settings: std::collections::BTreeMap<String, String> =
            environment.iter().map(|(key, value)| (key.clone(), value.as_str().unwrap().to_string())).collect();
        let loaded = capdex::config::Settings::load(None, &settings.into()).expect("the replica's settings load");
        assert_eq!(loaded.nats.servers.len(), 3, "{name}");
        assert_eq!(loaded.jetstream.replicas, 3, "{name}");
        for port in services[name]["ports"].as_array().unwrap() {
            assert!(ports.insert(port.as_str().unwrap().split(':').next().unwrap().to_string()), "{name}: {port}");
        }
        let data = services[name]["volumes"][0].as_str().unwrap();
        assert!(data.starts_with(&format!("{name}-data:")), "{name} keeps its own data: {data}");
    }
    for volume in ["nats-1-data", "nats-2-data", "nats-3-data", "capdex-1-data", "capdex-2-data"] {
        assert!(compose["volumes"].as_object().unwrap().contains_key(volume), "volume {volume} is declared");
    }
}

#[test]
fn the_cluster_config_parses_with_nats_server_for_each_server() {
    let binary = crate::support::nats_server::find_binary();
    let conf = root().join("config/nats-cluster.conf");
    let check = |server_name: Option<&str>| {
        let mut command = std::process::Command::new(&binary);
        command
            .args(["-t", "-c"])
            .arg(&conf)
            .env("NATS_CAPDEX_PASSWORD", "a")
            .env("NATS_RUNTIME_PASSWORD", "b")
            .env("NATS_OPS_PASSWORD", "c")
            .env("NATS_AGENT_ALPHA_PASSWORD", "d")
            .env("NATS_AGENT_BETA_PASSWORD", "e")
            .env("NATS_APPROVER_PASSWORD", "f")
            .env_remove("NATS_SERVER_NAME");
        if let Some(name) = server_name {
            command.env("NATS_SERVER_NAME", name);
        }
        command.output().expect("nats-server -t runs")
    };
    for name in ["nats-1", "nats-2", "nats-3"] {
        let output = check(Some(name));
        assert!(output.status.success(), "{name}: {}", String::from_utf8_lossy(&output.stderr));
    }
    // The check can fail: without its name the file does not load.
    let output = check(None);
    assert!(!output.status.success(), "a server without NATS_SERVER_NAME must not start");
    assert!(String::from_utf8_lossy(&output.stderr).contains("NATS_SERVER_NAME"));
}
