//! Benchmark of the capability sources: a cold scan of 1,000 manifest folders,
//! how many capabilities are re-embedded after touching one of them, and the
//! time from a manifest write to the change being discoverable (median of 20
//! edits, watcher debounce included).
//!
//! `cargo bench --bench sources` runs the full figures; under `cargo test` it
//! runs a small smoke version (the harness passes no `--bench`).

use capdex::actors::discoverer::Discover;
use capdex::config::Settings;
use capdex::core::discovery::DiscoveryFilter;
use std::collections::BTreeMap;
use std::path::Path;
use std::time::{Duration, Instant};

fn write_manifest(root: &Path, i: usize, description: &str) {
    let folder = root.join(format!("cap-{i:04}"));
    std::fs::create_dir_all(&folder).unwrap();
    let manifest = format!(
        "name: capability-{i}\nkind: tool\ndescription: {description}\ncategory: cat-{}\ntags: [t{}, t{}]\n",
        i % 17,
        i % 13,
        i % 7
    );
    std::fs::write(folder.join("CAPABILITY.yaml"), manifest).unwrap();
}

fn main() {
    let full = std::env::args().any(|arg| arg == "--bench");
    let (n, edits) = if full { (1000, 20) } else { (50, 2) };
    let caps = tempfile::tempdir().unwrap();
    let data = tempfile::tempdir().unwrap();
    for i in 0..n {
        write_manifest(caps.path(), i, &format!("Handles request number {i} about topic {}", i % 31));
    }

    let started = Instant::now();
    let report = capdex::folders::manifest_dir::scan(&[caps.path().to_path_buf()]);
    let cold_scan = started.elapsed();
    assert_eq!(report.descriptors.len(), n);

    let mut env = BTreeMap::new();
    env.insert("CAPDEX_DATA_DIR".to_string(), data.path().display().to_string());
    let mut settings = Settings::load(None, &env.into()).unwrap();
    settings.capability_dirs = vec![caps.path().to_path_buf()];
    let figures = actix_rt::System::new().block_on(async move {
        let actors = capdex::app::start(&settings).await.unwrap();
        let first = capdex::app::scan(&actors).await.unwrap();
        assert_eq!(first.sync.embedded, n);
        write_manifest(caps.path(), 7, "A freshly edited description of capability seven");
        let touched = capdex::app::scan(&actors).await.unwrap();

        let _watcher = capdex::actors::scanner::watch(
            &settings.capability_dirs,
            Duration::from_millis(settings.watch_debounce_ms),
            actors.scanner.clone(),
        )
        .unwrap();
        tokio::time::sleep(Duration::from_millis(300)).await;
        let mut latencies = Vec::new();
        for edit in 0..edits {
            let token = format!("zebracorn{edit}x");
            let written = Instant::now();
            write_manifest(caps.path(), 11, &format!("Finds the {token} in the stable"));
            loop {
                let result = actors
                    .discoverer
                    .send(Discover {
                        query: token.clone(),
                        filter: DiscoveryFilter::default(),
                        config: None,
                        explain: false,
                    })
                    .await
                    .unwrap()
                    .unwrap();
                if result.tier1.first().is_some_and(|e| e.summary_text.contains(&token)) {
                    break;
                }
                assert!(written.elapsed() < Duration::from_secs(20), "edit {edit} not discoverable after 20 s");
                tokio::time::sleep(Duration::from_millis(5)).await;
            }
            latencies.push(written.elapsed());
        }
        latencies.sort();
        (touched.sync.embedded, touched.sync.unchanged, latencies[latencies.len() / 2], latencies[latencies.len() - 1])
    });
    let (re_embedded, unchanged, median, max) = figures;
    println!("capdex::sources n={n}");
    println!("  cold scan of {n} manifest folders: {:.1} ms", cold_scan.as_secs_f64() * 1e3);
    println!("  after touching 1 of {n}: {re_embedded} re-embedded, {unchanged} unchanged");
    println!(
        "  write to discoverable (debounce 500 ms included), {edits} edits: median {:.0} ms, max {:.0} ms",
        median.as_secs_f64() * 1e3,
        max.as_secs_f64() * 1e3
    );
    assert_eq!(re_embedded, 1);
}
