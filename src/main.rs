//! The `capdex` command: arguments → settings → the job; errors → exit code.

use anyhow::Context as _;
use capdex::config::Settings;
use capdex::core::discovery::DiscoveryFilter;
use capdex::gateway::wire::DiscoverRequest;
use clap::{Parser, Subcommand};
use std::collections::BTreeMap;
use std::io::IsTerminal;
use std::path::PathBuf;
use std::process::ExitCode;

/// capdex tells AI agents which of their capabilities matter for the turn at
/// hand, within a token budget, and runs the capability calls they make.
#[derive(Parser, Debug)]
#[command(name = "capdex", version, about, long_about = None)]
struct Cli {
    /// Config file (TOML; see config/capdex.toml). Defaults are built in.
    #[arg(long, global = true, env = "CAPDEX_CONFIG", value_name = "FILE")]
    config: Option<PathBuf>,
    /// Where capdex keeps its state; overrides `data_dir` and CAPDEX_DATA_DIR.
    #[arg(long, global = true, value_name = "DIR")]
    data_dir: Option<PathBuf>,
    #[command(subcommand)]
    command: Command,
}

#[derive(Subcommand, Debug)]
enum Command {
    /// Scan capability folders, index them, and print the context for one message.
    ///
    /// Works in-process, without NATS. Example:
    ///   capdex discover "post the release notes to the team chat" --dir examples/capabilities
    Discover {
        /// The user's message for this turn.
        message: String,
        /// A folder of capability folders; repeat for several. Overrides `capability_dirs`.
        #[arg(long = "dir", value_name = "DIR")]
        dirs: Vec<PathBuf>,
        /// Only this kind: tool, skill, extension, channel, voice, productivity, emergent-tool, or any.
        #[arg(long)]
        kind: Option<String>,
        /// Print the result as JSON (tier0, tier1, tier2, tokenEstimate, ...).
        #[arg(long)]
        json: bool,
    },
    /// Scan capability folders into the index (in data_dir) and report what changed.
    ///
    /// Unchanged capabilities keep their stored embeddings; refused folders are
    /// listed with the field at fault.
    Index {
        /// A folder of capability folders; repeat for several. Overrides `capability_dirs`.
        #[arg(long = "dir", value_name = "DIR")]
        dirs: Vec<PathBuf>,
        /// Print the report as JSON.
        #[arg(long)]
        json: bool,
    },
    /// Serve discovery, outcomes and dispatch over NATS until SIGINT or SIGTERM.
    ///
    /// Subjects: <prefix>.discover, <prefix>.outcome, <prefix>.dispatch (requests);
    /// <prefix>.kpi.<scope> and <prefix>.alert.<severity>.<scope> (events).
    Serve,
    /// Print every scope's current KPI from the data dir, or follow KPI events over NATS.
    ///
    /// Without --watch it reads data_dir (so capdex serve must not be running on it);
    /// with --watch it prints each <prefix>.kpi.<scope> event as one JSON line.
    Kpi {
        /// Print JSON (one array) instead of a table.
        #[arg(long)]
        json: bool,
        /// Follow the KPI events published on NATS until interrupted.
        #[arg(long)]
        watch: bool,
    },
}

fn main() -> ExitCode {
    let cli = Cli::parse();
    match run(cli) {
        Ok(()) => ExitCode::SUCCESS,
        Err(err) => {
            eprintln!("error: {err:#}");
            ExitCode::FAILURE
        }
    }
}

fn run(cli: Cli) -> anyhow::Result<()> {
    let env: BTreeMap<String, String> = std::env::vars().collect();
    let mut settings = Settings::load(cli.config.as_deref(), &env)?;
    if let Some(dir) = cli.data_dir {
        settings.data_dir = dir;
    }
    capdex::telemetry::init_logging(&settings.log, settings.log_format);
    let system = actix_rt::System::new();
    match cli.command {
        Command::Discover { message, dirs, kind, json } => {
            if !dirs.is_empty() {
                settings.capability_dirs = dirs;
            }
            let request = DiscoverRequest { message: message.clone(), kind, ..DiscoverRequest::default() };
            let filter: DiscoveryFilter = request.filter().map_err(|err| anyhow::anyhow!(err.message))?;
            system.block_on(discover_once(&settings, &message, filter, json))
        }
        Command::Index { dirs, json } => {
            if !dirs.is_empty() {
                settings.capability_dirs = dirs;
            }
            system.block_on(index_once(&settings, json))
        }
        Command::Serve => system.block_on(capdex::app::serve(&settings)),
        Command::Kpi { json, watch } => {
            if watch {
                system.block_on(capdex::app::watch_kpis(&settings))
            } else {
                print_kpis(&capdex::app::stored_kpis(&settings, capdex::app::epoch_ms())?, json)
            }
        }
    }
}

async fn index_once(settings: &Settings, json: bool) -> anyhow::Result<()> {
    let spinner = spinner("scanning and indexing capability folders");
    let actors = capdex::app::start(settings).await?;
    let outcome = capdex::app::scan(&actors).await?;
    if let Some(bar) = spinner {
        bar.finish_and_clear();
    }
    if json {
        let report = serde_json::json!({ "scan": { "refused": outcome.scan.refused, "warnings": outcome.scan.warnings,
            "found": outcome.scan.descriptors.len() }, "sync": outcome.sync });
        println!("{}", serde_json::to_string_pretty(&report).context("failed to encode the report")?);
        return Ok(());
    }
    print_scan_problems(&outcome);
    let sync = &outcome.sync;
    println!(
        "found {} capabilities ({} refused): {} new or changed ({} embedded, {} reused), {} unchanged, {} removed; index version {}",
        outcome.scan.descriptors.len(),
        outcome.scan.refused.len(),
        sync.upserted,
        sync.embedded,
        sync.reused,
        sync.unchanged,
        sync.removed,
        sync.version
    );
    Ok(())
}

fn print_kpis(kpis: &[capdex::core::kpi_window::Kpi], json: bool) -> anyhow::Result<()> {
    if json {
        println!("{}", serde_json::to_string_pretty(kpis).context("failed to encode the KPIs")?);
        return Ok(());
    }
    println!(
        "{:<32} {:>7} {:>7} {:>7} {:>7} {:>8} {:>8} {:>8}",
        "scope", "samples", "success", "partial", "failed", "success%", "avgScore", "weighted"
    );
    for kpi in kpis {
        println!(
            "{:<32} {:>7} {:>7} {:>7} {:>7} {:>8.3} {:>8.3} {:>8.3}",
            kpi.scope_key,
            kpi.sample_count,
            kpi.success_count,
            kpi.partial_count,
            kpi.failed_count,
            kpi.success_rate,
            kpi.average_score,
            kpi.weighted_success_rate
        );
    }
    Ok(())
}

fn spinner(message: &'static str) -> Option<indicatif::ProgressBar> {
    std::io::stderr().is_terminal().then(|| {
        let bar = indicatif::ProgressBar::new_spinner();
        bar.set_message(message);
        bar.enable_steady_tick(std::time::Duration::from_millis(100));
        bar
    })
}

fn print_scan_problems(outcome: &capdex::actors::scanner::ScanOutcome) {
    for refusal in &outcome.scan.refused {
        eprintln!("refused {} ({}: {})", refusal.manifest_path, refusal.field, refusal.problem);
    }
    for warning in &outcome.scan.warnings {
        eprintln!("warning: {warning}");
    }
}

async fn discover_once(settings: &Settings, message: &str, filter: DiscoveryFilter, json: bool) -> anyhow::Result<()> {
    let spinner = spinner("scanning and indexing capability folders");
    let actors = capdex::app::start(settings).await?;
    let outcome = capdex::app::scan(&actors).await?;
    if let Some(bar) = spinner {
        bar.finish_and_clear();
    }
    print_scan_problems(&outcome);
    let result = capdex::app::discover(&actors, message, filter).await?;
    if json {
        println!("{}", serde_json::to_string_pretty(&result).context("failed to encode the result")?);
    } else {
        print!("{}", result.rendered);
    }
    Ok(())
}
