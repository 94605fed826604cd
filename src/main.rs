//! The `capdex` command: arguments → settings → the job; errors → exit code.

use anyhow::Context as _;
use capdex::config::Settings;
use capdex::core::discovery::DiscoveryFilter;
use capdex::gateway::wire::DiscoverRequest;
use clap::{Parser, Subcommand};
use std::io::IsTerminal;
use std::path::PathBuf;
use std::process::ExitCode;

mod scg_cli;

/// mimalloc, not glibc's malloc: the service allocates on one thread and
/// frees on another (request bytes on the System's thread, replies on the
/// discovery workers), and glibc takes the owning arena's lock for each such
/// free; under load those locks were most of the node's futex calls.
///
/// Wrapped to count live bytes for `capdex bench --memory`, and in a process
/// started with `CAPDEX_COUNT_HEAP` (the gauge `capdex_heap_live_bytes`): until
/// counting starts, the wrapper reads one flag per allocation and writes nothing.
#[global_allocator]
static ALLOCATOR: capdex::allocations::Counting<mimalloc::MiMalloc> = capdex::allocations::Counting(mimalloc::MiMalloc);

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
        #[command(flatten)]
        files: SourceFiles,
        /// Only this kind: tool, skill, extension, channel, voice, productivity, emergent-tool, or any.
        #[arg(long)]
        kind: Option<String>,
        /// Print the result as JSON (tier0, tier1, tier2, tokenEstimate, ...).
        #[arg(long)]
        json: bool,
        /// Also show why each Tier 1 entry ranks where it does: its fused, lexical,
        /// dense, graph and prior signals (`explanations` in --json).
        #[arg(long)]
        explain: bool,
    },
    /// Scan capability folders into the index (in data_dir) and report what changed.
    ///
    /// Unchanged capabilities keep their stored embeddings; refused folders are
    /// listed with the field at fault.
    Index {
        /// A folder of capability folders; repeat for several. Overrides `capability_dirs`.
        #[arg(long = "dir", value_name = "DIR")]
        dirs: Vec<PathBuf>,
        #[command(flatten)]
        files: SourceFiles,
        /// Print the report as JSON.
        #[arg(long)]
        json: bool,
    },
    /// Scan capability folders and print what was found and what was refused, and why.
    ///
    /// Reads only; nothing is indexed. Exit status 0 even when folders are refused.
    Scan {
        /// Folders of capability folders (default: the configured `capability_dirs`).
        dirs: Vec<PathBuf>,
        /// Print `{"found": [descriptors], "refused": [{manifestPath, field, problem}], "warnings": [...]}`.
        #[arg(long)]
        json: bool,
    },
    /// Serve discovery, outcomes and dispatch over NATS until SIGINT or SIGTERM.
    ///
    /// Subjects: <prefix>.discover, <prefix>.outcome, <prefix>.dispatch (requests);
    /// <prefix>.kpi.<scope> and <prefix>.alert.<severity>.<scope> (events);
    /// Source Capability Graph: <prefix>.map, .route, .observe, .memory.deposit (requests)
    /// and <prefix>.events.scg (map progress events).
    /// With `[mcp] listen` set, also serves MCP over streamable HTTP.
    Serve,
    /// Serve MCP on stdio, for MCP clients that launch capdex (desktop assistants, coding agents, IDEs).
    ///
    /// Runs the same actors as `serve` on the data dir, in-process and without
    /// NATS; stdout carries only MCP messages, logs go to stderr. Tools:
    /// discover_capabilities, call_capability, route_sources, report_outcome.
    Mcp {
        /// Direct mode: tools/list also offers the capabilities most relevant to the session so far.
        #[arg(long)]
        direct: bool,
    },
    /// Time index building and in-process discovery on a catalog: seeded synthetic or from files.
    ///
    /// Prints build time, discover latency p50/p99 (query embedding also on its own),
    /// candidates per query and peak RSS. Examples:
    ///   capdex bench --synthetic 10000 --json
    ///   capdex bench --sources ../shared/data/catalog/synthcat-1000.sources.json \
    ///                --queries ../shared/data/catalog/synthcat-1000.queries.jsonl
    ///   capdex bench --prompt-size --sources ../shared/data/catalog/agentos-catalog.json \
    ///                --queries benches/prompt_size_queries.jsonl
    Bench {
        /// Number of synthetic capabilities (seeded generator).
        #[arg(long, value_name = "N", conflicts_with = "sources", required_unless_present_any = ["sources", "soak"])]
        synthetic: Option<usize>,
        /// Capabilities: a sources object {tools, skills, ...}, a catalog array, or tools JSON lines.
        #[arg(long, value_name = "FILE", requires = "queries")]
        sources: Option<PathBuf>,
        /// With --sources: JSON lines with a "text" or "query" field. With --synthetic: how many
        /// synthetic queries (default 1000).
        #[arg(long, value_name = "FILE|N")]
        queries: Option<String>,
        /// Report prompt sizes per tier against the budgets and a dump of every schema, not timings.
        #[arg(long, requires = "sources")]
        prompt_size: bool,
        /// Report where the memory goes: heap bytes per structure (descriptors, schemas,
        /// vectors, lexical index, graph, catalog map, tier 0), per capability, and the
        /// allocator's overhead, not timings.
        #[arg(long, conflicts_with = "prompt_size")]
        memory: bool,
        /// Report what learning from outcomes costs, as `capdex serve` learns: each query is a
        /// turn whose third hit did the job (a trial ranking it ten times, then remembered);
        /// the time per success, the time to fit the memory to a new catalog, and peak RSS.
        #[arg(long, conflicts_with_all = ["prompt_size", "memory"])]
        outcome_learning: bool,
        /// Fail (exit code 1) when the peak resident set size is over SIZE (e.g. 60MB, 1GiB):
        /// a memory budget for CI.
        #[arg(long, value_name = "SIZE", value_parser = capdex::bench::parse_size)]
        max_rss: Option<u64>,
        #[command(flatten)]
        embedder: EmbedderFlags,
        /// Print the report as JSON (keys n, buildMs, p50Us, p99Us, rssBytes, embedP50Us, ...).
        #[arg(long)]
        json: bool,
        /// Soak for MINUTES (fractions allowed): a real nats-server and `capdex serve` (this
        /// binary, a fresh data dir, short retention), mixed load at half the capacity a ramp
        /// measures; prints RSS, data-dir bytes and p99 latency per minute, and whether RSS and
        /// the data dir stayed within 5 % after the warm-up.
        #[arg(long, value_name = "MINUTES", conflicts_with_all = ["synthetic", "sources", "prompt_size", "memory"])]
        soak: Option<f64>,
        /// The nats-server binary the soak starts.
        #[arg(long, value_name = "PATH", env = "CAPDEX_NATS_SERVER", default_value = "nats-server")]
        nats_server: PathBuf,
        /// Seconds between the soak's report lines (default 60), and of its capacity ramp
        /// (default 20); for smoke tests.
        #[arg(long, value_name = "SECONDS", hide = true)]
        soak_report_seconds: Option<f64>,
        /// The soak's warm-up in minutes: the intervals that end within it are left out of the
        /// flatness figures (default: a third of the soak, at most 5 minutes). Example:
        /// `--soak 40 --soak-warmup 10` judges the last 30 minutes.
        #[arg(long, value_name = "MINUTES", requires = "soak")]
        soak_warmup: Option<f64>,
        /// The soak's rate in operations a second instead of half the measured capacity (the
        /// ramp still runs and is reported): to hold the soak at one rate on machines of
        /// different speeds. Example: `--soak 45 --soak-warmup 15 --soak-rate 4700`.
        #[arg(long, value_name = "OPS", requires = "soak")]
        soak_rate: Option<f64>,
    },
    /// Rank every query of a benchmark against its tools and print Recall@1/5/10, NDCG@5/10 and MRR.
    ///
    /// Formats as in ../shared/data/README.md; the metrics are those of its bench/eval.py. Example:
    ///   capdex eval --tools bench/seal-tools/tools.jsonl --queries bench/seal-tools/dev_queries.jsonl --out run.jsonl
    Eval {
        /// Tools, one JSON object a line: {"id","name","description","category","tags","params"}
        /// (only "id" is required; a null field reads as empty, a missing name as the id).
        #[arg(long, value_name = "FILE", required_unless_present = "route")]
        tools: Option<PathBuf>,
        /// Queries, one JSON object a line: {"query","relevant":[ids]}, optionally with "tools":[...]
        /// to rank that query against those tools alone. "relevant": [] means nothing fits (the
        /// right answer is an empty Tier 1); such requests are also counted per "split" when they
        /// name one. Repeatable: the files are read as one list.
        #[arg(long, value_name = "FILE", required_unless_present = "route")]
        queries: Vec<PathBuf>,
        /// The SCG route benchmark instead (src/route_eval.rs): a manifest of sources and
        /// questions, e.g. tests/fixtures/route/route.json; hit@3 per kind beside BM25, route latency.
        #[arg(long, value_name = "MANIFEST", conflicts_with_all = ["tools", "queries"])]
        route: Option<PathBuf>,
        /// Write the run file here: {"query_idx","ranked":[ids]} a line.
        #[arg(long, value_name = "FILE")]
        out: Option<PathBuf>,
        /// Ranked ids per query (MRR looks this deep).
        #[arg(long, default_value_t = 20)]
        depth: usize,
        /// Rank without the graph re-ranking.
        #[arg(long)]
        no_graph: bool,
        /// Print the report as JSON.
        #[arg(long)]
        json: bool,
        /// Ablation: share of the lexical signal in [0, 1] (default: capdex's).
        #[arg(long, value_name = "W")]
        lexical_weight: Option<f32>,
        /// Ablation: clause weight, 0 turns clause fusion off (default: capdex's).
        #[arg(long, value_name = "W")]
        clause_weight: Option<f32>,
        /// Ablation: lexical field weights name,description,category,tags,parameters,parameter descriptions
        /// (default: capdex's).
        #[arg(long, value_name = "N,D,C,T,P,PD")]
        field_weights: Option<String>,
        /// Apply the outcome prior built from these task outcomes (capdex.v1.outcome
        /// JSON objects, one a line, all observed at the same time) with the
        /// configured [discovery] outcome_prior_* settings.
        #[arg(long, value_name = "FILE")]
        outcome_prior: Option<PathBuf>,
        /// Keep every vector (tools and queries) in a sled store in DIR, keyed by model id and
        /// text hash, so later runs with the same model embed nothing twice (cheap sweeps).
        #[arg(long, value_name = "DIR")]
        cache_dir: Option<PathBuf>,
        /// Outcome replay with this seed: feed the outcomes of a seeded half of the answerable
        /// queries in one at a time, trying the outcome prior and memory on each before it is
        /// learnt, then rank the other half without learning and with what the trials chose (a
        /// learning whose gain clears its noise and that loses no more than its noise on the
        /// trials whose capabilities had no outcome yet).
        #[arg(long, value_name = "SEED")]
        replay: Option<u64>,
        /// Write an empty ranking for a query whose Tier 1 would be empty (no capability reaches
        /// tier1_min_relevance: "nothing fits"); by default the run holds every ranking.
        #[arg(long)]
        empty_when_nothing_fits: bool,
        /// Write, per query, the signals "nothing fits" can be decided on (its first hits'
        /// relevance, cosine and coverage of the query's words; its likeness to chatter beside
        /// the catalog's generic floor) as JSON lines to FILE.
        #[arg(long, value_name = "FILE")]
        signals: Option<PathBuf>,
        #[command(flatten)]
        embedder: EmbedderFlags,
    },
    /// Map a source into the Source Capability Graph (stored in data_dir).
    ///
    /// FILE is an OpenAPI 3.x / Swagger 2 document (JSON or YAML), an MCP tools/list
    /// result (JSON), or SQL DDL (PostgreSQL or SQLite). Re-mapping replaces the source.
    Map {
        file: PathBuf,
        /// The source's id, used in source keys `<id>#<Name>` ([A-Za-z0-9._-]).
        #[arg(long)]
        source_id: String,
        /// openapi, mcp or sql; inferred from the content when omitted.
        #[arg(long)]
        kind: Option<String>,
        /// Enable the source in this workspace; repeatable.
        #[arg(long = "workspace", value_name = "WS")]
        workspaces: Vec<String>,
        /// Print the report as JSON.
        #[arg(long)]
        json: bool,
    },
    /// Rank route recipes for a query over the mapped sources.
    Route {
        query: String,
        /// Only sources enabled in this workspace (none enabled: no recipes).
        #[arg(long)]
        workspace: Option<String>,
        /// How many recipes (1-50).
        #[arg(short, long, default_value_t = capdex::core::scg::route::DEFAULT_K)]
        k: usize,
        /// Print `{"recipes": [{"sourceKey", "steps", "score"}]}`.
        #[arg(long)]
        json: bool,
    },
    /// Show a graph node's typed neighbourhood (by id or source key).
    Observe {
        node: String,
        /// Only sources enabled in this workspace.
        #[arg(long)]
        workspace: Option<String>,
        /// Only edges of this kind (HAS_ENTITY, HAS_FIELD, RESOLVES_TO, exposes, SUPPORTS_QUERY, PRODUCES, CONSUMES, builds); repeatable.
        #[arg(long = "edge-kind", value_name = "KIND")]
        edge_kinds: Vec<String>,
        /// Print the observation as JSON.
        #[arg(long)]
        json: bool,
    },
    /// Deposit a memory note on graph nodes or recipes: positive boosts that pathway in
    /// future routes, dead_end damps it (the influence halves every scg.memory_half_life_ms).
    Deposit {
        /// The note (at most 400 characters).
        content: String,
        /// positive or dead_end.
        #[arg(long)]
        polarity: String,
        /// A node id or source key the note is about; repeatable (1-8).
        #[arg(long = "anchor", value_name = "NODE", required = true)]
        anchors: Vec<String>,
        /// Label the note ws:<WS>; anchors must be in the workspace's sources.
        #[arg(long)]
        workspace: Option<String>,
        /// Label the note session:<S> (a session bound to no workspace).
        #[arg(long)]
        session: Option<String>,
        /// Print the stored note as JSON.
        #[arg(long)]
        json: bool,
    },
    /// Print every scope's current KPI from the data dir, or follow KPI events over NATS.
    ///
    /// Without --watch it reads data_dir (so capdex serve must not be running on it);
    /// with --watch it prints each <prefix>.kpi.<scope> and <prefix>.alert.<severity>.<scope>
    /// event as one JSON line.
    Kpi {
        /// Print JSON (one array) instead of a table.
        #[arg(long)]
        json: bool,
        /// Follow the KPI and alert events published on NATS until interrupted.
        #[arg(long)]
        watch: bool,
    },
    /// Run one capability call through the dispatch pipeline, in-process on the data dir.
    ///
    /// Prints the result envelope {success, data?, error?, skipFollowup?, metadata?} as JSON;
    /// exits 1 when success is false. Example:
    ///   capdex dispatch echo --args '{"text": "hi"}' --agent cli
    Dispatch {
        /// The capability's slug.
        slug: String,
        /// The arguments, a JSON object.
        #[arg(long, default_value = "{}")]
        args: String,
        /// The calling agent's id.
        #[arg(long)]
        agent: String,
        /// Re-drive key: a repeat with the same execution and step returns the stored result.
        #[arg(long, requires = "step_id")]
        execution_id: Option<String>,
        #[arg(long, requires = "execution_id")]
        step_id: Option<String>,
        #[arg(long, requires = "step_id")]
        turn: Option<u32>,
        /// The approval that permits this call.
        #[arg(long)]
        approval_id: Option<String>,
        /// Send internal capabilities to their handler services over NATS (nats.url).
        #[arg(long)]
        nats: bool,
    },
    /// Register, update or list capabilities in the dispatch registry (data dir).
    Capability {
        #[command(subcommand)]
        command: CapabilityCommand,
    },
    /// Set or list agents' bindings to capabilities (data dir).
    Binding {
        #[command(subcommand)]
        command: BindingCommand,
    },
    /// List, approve or reject approvals (data dir).
    Approval {
        #[command(subcommand)]
        command: ApprovalCommand,
    },
    /// Add, remove, list or load live sources (MCP servers, OpenAPI documents, SQL schemas)
    /// of the `capdex serve` on the configured NATS.
    ///
    /// Example (an MCP server on stdio):
    ///   capdex source add time.json    # {"id": "time", "kind": "mcp", "command": "mcp-server-time"}
    ///   capdex source list
    Source {
        #[command(subcommand)]
        command: SourceCommand,
    },
}

#[derive(Subcommand, Debug)]
enum SourceCommand {
    /// Add (or replace) a source from a JSON or YAML settings file (see docs/api.md, `sources.add`);
    /// prints the source's state after its first sync.
    Add { file: PathBuf },
    /// Remove a source and its capabilities.
    Remove { id: String },
    /// Print every source with its state (connected, tools, last sync, last error).
    List {
        /// Print JSON instead of a table.
        #[arg(long)]
        json: bool,
    },
    /// Connect a lazy source now.
    Load { id: String },
}

#[derive(Subcommand, Debug)]
enum CapabilityCommand {
    /// Register a capability from a JSON or YAML record (see docs/api.md).
    Register { file: PathBuf },
    /// Replace a registered capability (its policy version goes up).
    Update { file: PathBuf },
    /// Print every capability record as JSON.
    List,
}

#[derive(Subcommand, Debug)]
enum BindingCommand {
    /// Set an agent's binding to a capability.
    Set {
        #[arg(long)]
        agent: String,
        #[arg(long)]
        slug: String,
        /// Disable the capability for this agent.
        #[arg(long)]
        disabled: bool,
        /// Calls per rate window for this agent (overrides the capability's rateLimit).
        #[arg(long)]
        rate_limit: Option<u32>,
        /// customConfig as JSON, e.g. '{"headers": {"Authorization": "Bearer ${env:TOKEN}"}}'.
        #[arg(long, value_name = "JSON")]
        custom_config: Option<String>,
    },
    /// Print bindings as JSON.
    List {
        #[arg(long)]
        agent: Option<String>,
    },
}

#[derive(Subcommand, Debug)]
enum ApprovalCommand {
    /// Print pending approvals (all with --all) as JSON.
    List {
        #[arg(long)]
        all: bool,
    },
    Approve {
        id: String,
        /// Who decides, recorded as the approval's decidedBy (at most 128 printable characters).
        #[arg(long, default_value = "cli")]
        by: String,
    },
    Reject {
        id: String,
        /// Who decides, recorded as the approval's decidedBy (at most 128 printable characters).
        #[arg(long, default_value = "cli")]
        by: String,
    },
}

/// Picks the embedder for `eval` and `bench`; without `--embedder`, the configured one.
#[derive(clap::Args, Debug, Default)]
struct EmbedderFlags {
    /// builtin (hashing), static (distilled MiniLM table), local (with --model-dir) or http
    /// (with --endpoint and --model).
    #[arg(long, value_name = "BACKEND")]
    embedder: Option<String>,
    /// The model folder for --embedder local (model.safetensors, tokenizer.json, config.json).
    #[arg(long, value_name = "DIR")]
    model_dir: Option<PathBuf>,
    /// Base URL of an OpenAI-compatible /v1/embeddings endpoint for --embedder http.
    #[arg(long, value_name = "URL")]
    endpoint: Option<String>,
    /// The model name for --embedder http.
    #[arg(long, value_name = "NAME")]
    model: Option<String>,
}

impl EmbedderFlags {
    /// The `[embedder]` settings with these flags on top.
    fn apply(&self, settings: &capdex::config::EmbedderSettings) -> anyhow::Result<capdex::config::EmbedderSettings> {
        let mut out = settings.clone();
        if let Some(backend) = &self.embedder {
            out.backend = capdex::config::EmbedderBackend::parse(backend)
                .map_err(|problem| anyhow::anyhow!("--embedder {problem}"))?;
        }
        if let Some(dir) = &self.model_dir {
            out.model_dir = dir.clone();
        }
        if let Some(endpoint) = &self.endpoint {
            out.endpoint = endpoint.clone();
        }
        if let Some(model) = &self.model {
            out.model = model.clone();
        }
        out.validate().map_err(|err| anyhow::anyhow!("{} {}", err.field, err.problem))?;
        Ok(out)
    }
}

/// Capability files to index besides the folders.
#[derive(clap::Args, Debug, Default)]
struct SourceFiles {
    /// A sources file: `{tools, skills, extensions, channels, presets}` as runtimes register them. Repeatable.
    #[arg(long = "sources", value_name = "FILE")]
    sources: Vec<PathBuf>,
    /// A catalog file: a JSON array of capability descriptors. Repeatable.
    #[arg(long = "catalog", value_name = "FILE")]
    catalogs: Vec<PathBuf>,
}

fn main() -> ExitCode {
    capdex::allocations::tune_mimalloc(|variable| std::env::var_os(variable).is_some());
    if std::env::var_os("CAPDEX_COUNT_HEAP").is_some() {
        // From the first allocation on, so every free has its allocation counted.
        capdex::allocations::start();
    }
    let cli = Cli::parse();
    match run(cli) {
        Ok(()) => ExitCode::SUCCESS,
        Err(err) => {
            eprintln!("error: {}", capdex::error_report::one_line(err.as_ref()));
            ExitCode::FAILURE
        }
    }
}

fn run(cli: Cli) -> anyhow::Result<()> {
    let env: capdex::config::Environment = std::env::vars().collect();
    let mut settings = Settings::load(cli.config.as_deref(), &env)?;
    if let Some(dir) = cli.data_dir {
        settings.data_dir = dir;
    }
    capdex::telemetry::init_logging(&settings.log, settings.log_format);
    if let Command::Eval { route: Some(manifest), json, embedder, .. } = &cli.command {
        let options = capdex::route_eval::RouteEvalOptions {
            manifest: manifest.clone(),
            embedder: embedder.apply(&settings.embedder)?,
            rounds: 20,
        };
        return capdex::route_eval::print(&capdex::route_eval::run(&options)?, *json);
    }
    if let Command::Eval {
        tools: Some(tools),
        queries,
        out,
        depth,
        no_graph,
        json,
        lexical_weight,
        clause_weight,
        field_weights,
        outcome_prior,
        cache_dir,
        replay,
        empty_when_nothing_fits,
        signals,
        embedder,
        route: None,
    } = cli.command
    {
        let embedder = embedder.apply(&settings.embedder)?;
        // `[discovery]`'s "auto" settings follow the embedder chosen here.
        let mut config = settings.discovery_for(embedder.backend);
        config.use_graph_reranking &= !no_graph;
        let mut fusion = capdex::core::retrieval::Fusion::default();
        fusion.lexical = lexical_weight.unwrap_or(config.lexical_weight).clamp(0.0, 1.0);
        fusion.clause = clause_weight.unwrap_or(fusion.clause).clamp(0.0, 1.0);
        let field_weights = match field_weights {
            Some(text) => parse_field_weights(&text)?,
            None => capdex::core::lexical::FIELD_WEIGHTS,
        };
        let options = capdex::eval::EvalOptions {
            tools,
            queries,
            out,
            depth: depth.max(1),
            config,
            embedder,
            fusion,
            field_weights,
            outcome_prior: match outcome_prior {
                Some(path) => Some(capdex::eval::prior_from_outcomes(&path, &settings.kpi.prior)?),
                None => None,
            },
            cache: cache_dir,
            replay,
            empty_when_nothing_fits,
            prior_settings: settings.kpi.prior,
            signals,
        };
        return print_eval(&capdex::eval::run(&options)?, json);
    }
    if let Command::Bench {
        soak: Some(minutes), nats_server, soak_report_seconds, soak_warmup, soak_rate, json, ..
    } = &cli.command
    {
        return run_soak(&settings, *minutes, nats_server, *soak_report_seconds, *soak_warmup, *soak_rate, *json);
    }
    if let Command::Bench {
        synthetic,
        sources,
        queries,
        prompt_size,
        memory,
        outcome_learning,
        max_rss,
        embedder,
        json,
        ..
    } = cli.command
    {
        let mode = match (prompt_size, memory, outcome_learning) {
            (true, _, _) => BenchMode::PromptSize,
            (_, true, _) => BenchMode::Memory,
            (_, _, true) => BenchMode::OutcomeLearning,
            _ => BenchMode::Timings,
        };
        return run_bench(&settings, synthetic, sources, queries, mode, max_rss, &embedder, json);
    }
    let system = actix_rt::System::new();
    match cli.command {
        Command::Discover { message, dirs, files, kind, json, explain } => {
            if !dirs.is_empty() {
                settings.capability_dirs = dirs;
            }
            let request = DiscoverRequest { message: message.clone(), kind, ..DiscoverRequest::default() };
            let filter: DiscoveryFilter =
                request.filter(&settings.limits).map_err(|err| anyhow::anyhow!(err.message))?;
            system.block_on(discover_once(&settings, &files, &message, filter, json, explain))
        }
        Command::Index { dirs, files, json } => {
            if !dirs.is_empty() {
                settings.capability_dirs = dirs;
            }
            system.block_on(index_once(&settings, &files, json))
        }
        Command::Scan { dirs, json } => {
            let dirs = if dirs.is_empty() { settings.capability_dirs.clone() } else { dirs };
            let report = capdex::folders::manifest_dir::scan_with_refusals(&dirs, settings.scan_limits);
            if json {
                let value = serde_json::json!({"found": report.descriptors, "refused": report.refused, "warnings": report.warnings});
                println!("{}", serde_json::to_string_pretty(&value).context("failed to encode the report")?);
            } else {
                for descriptor in &report.descriptors {
                    println!("found   {:<40} {}", descriptor.id, manifest_path(&descriptor.definition_ref));
                }
                for refusal in &report.refused {
                    println!("refused {} ({}: {})", refusal.manifest_path, refusal.field, refusal.problem);
                }
                for warning in &report.warnings {
                    println!("warning {warning}");
                }
                println!("{} found, {} refused", report.descriptors.len(), report.refused.len());
            }
            Ok(())
        }
        Command::Serve => system.block_on(capdex::app::serve(&settings)),
        Command::Mcp { direct } => system.block_on(capdex::app::serve_mcp_stdio(&settings, direct)),
        Command::Eval { .. } | Command::Bench { .. } => unreachable!("eval and bench run without the actor system"),
        Command::Map { file, source_id, kind, workspaces, json } => scg_cli::map(
            &system,
            &settings,
            scg_cli::MapArgs {
                file: &file,
                source_id: &source_id,
                kind: kind.as_deref(),
                workspaces: &workspaces,
                json,
            },
        ),
        Command::Route { query, workspace, k, json } => {
            scg_cli::route(&system, &settings, &query, workspace.as_deref(), k, json)
        }
        Command::Observe { node, workspace, edge_kinds, json } => {
            scg_cli::observe(&system, &settings, &node, workspace.as_deref(), &edge_kinds, json)
        }
        Command::Deposit { content, polarity, anchors, workspace, session, json } => scg_cli::deposit(
            &system,
            &settings,
            scg_cli::DepositArgs {
                content: &content,
                polarity: &polarity,
                anchors: &anchors,
                workspace: workspace.as_deref(),
                session: session.as_deref(),
                json,
            },
        ),
        Command::Dispatch { slug, args, agent, execution_id, step_id, turn, approval_id, nats } => {
            let arguments: serde_json::Value = serde_json::from_str(&args).context("--args must be a JSON object")?;
            let call = capdex::core::dispatch::pipeline::DispatchCall {
                slug,
                arguments,
                agent_id: agent,
                execution_id,
                step_id,
                turn,
                approval_id,
            };
            let result = system.block_on(capdex::dispatch_cli::run_dispatch(&settings, call, nats))?;
            println!("{}", serde_json::to_string_pretty(&result).context("failed to encode the result")?);
            if !result.success {
                std::process::exit(1);
            }
            Ok(())
        }
        Command::Capability { command } => {
            use capdex::gateway::wire::DispatchAdmin;
            let request = match command {
                CapabilityCommand::Register { file } => {
                    DispatchAdmin::Register(capdex::dispatch_cli::read_document(&file)?)
                }
                CapabilityCommand::Update { file } => {
                    DispatchAdmin::Update(capdex::dispatch_cli::read_document(&file)?)
                }
                CapabilityCommand::List => DispatchAdmin::List,
            };
            print_admin(system.block_on(capdex::dispatch_cli::run_admin(&settings, request))?)
        }
        Command::Binding { command } => {
            use capdex::gateway::wire::DispatchAdmin;
            let request = match command {
                BindingCommand::Set { agent, slug, disabled, rate_limit, custom_config } => {
                    let config: serde_json::Value = match custom_config {
                        Some(text) => serde_json::from_str(&text).context("--custom-config must be JSON")?,
                        None => serde_json::Value::Null,
                    };
                    DispatchAdmin::SetBinding(
                        serde_json::json!({"agentId": agent, "slug": slug, "isEnabled": !disabled,
                        "customRateLimit": rate_limit, "customConfig": config}),
                    )
                }
                BindingCommand::List { agent } => DispatchAdmin::ListBindings(serde_json::json!({"agentId": agent})),
            };
            print_admin(system.block_on(capdex::dispatch_cli::run_admin(&settings, request))?)
        }
        Command::Approval { command } => {
            use capdex::gateway::wire::DispatchAdmin;
            let request = match command {
                ApprovalCommand::List { all } => DispatchAdmin::ListApprovals(serde_json::json!({"all": all})),
                ApprovalCommand::Approve { id, by } => DispatchAdmin::Decide { id, approve: true, by },
                ApprovalCommand::Reject { id, by } => DispatchAdmin::Decide { id, approve: false, by },
            };
            print_admin(system.block_on(capdex::dispatch_cli::run_admin(&settings, request))?)
        }
        Command::Source { command } => {
            use capdex::gateway::wire::SourcesRequest;
            let (request, table) = match command {
                SourceCommand::Add { file } => {
                    (SourcesRequest::Add(capdex::dispatch_cli::read_document(&file)?), false)
                }
                SourceCommand::Remove { id } => (SourcesRequest::Remove(serde_json::json!({ "id": id })), false),
                SourceCommand::List { json } => (SourcesRequest::List, !json),
                SourceCommand::Load { id } => (SourcesRequest::Load(serde_json::json!({ "id": id })), false),
            };
            let answer = system.block_on(capdex::app::sources_request(&settings, request))?;
            if table {
                print_sources(&answer);
                Ok(())
            } else {
                print_admin(answer)
            }
        }
        Command::Kpi { json, watch } => {
            if watch {
                system.block_on(capdex::app::watch_kpis(&settings))
            } else {
                print_kpis(&capdex::app::stored_kpis(&settings, capdex::clock::epoch_ms())?, json)
            }
        }
    }
}

/// Prints `sources.list`'s answer as a table: id, kind, state, tools, last error.
fn print_sources(answer: &serde_json::Value) {
    let sources = answer.get("sources").and_then(serde_json::Value::as_array).cloned().unwrap_or_default();
    println!("{:<24} {:<8} {:<13} {:>5}  last error", "id", "kind", "state", "tools");
    for source in &sources {
        let text = |key: &str| source.get(key).and_then(serde_json::Value::as_str).unwrap_or("").to_string();
        let tools = source.get("toolCount").and_then(serde_json::Value::as_u64).unwrap_or(0);
        println!("{:<24} {:<8} {:<13} {:>5}  {}", text("id"), text("kind"), text("state"), tools, text("lastError"));
    }
}

fn print_admin(value: serde_json::Value) -> anyhow::Result<()> {
    println!("{}", serde_json::to_string_pretty(&value).context("failed to encode the answer")?);
    Ok(())
}

fn manifest_path(definition_ref: &capdex::core::descriptor::DefinitionRef) -> &str {
    match definition_ref {
        capdex::core::descriptor::DefinitionRef::Manifest { manifest_path } => manifest_path,
        _ => "",
    }
}

/// Indexes the `--sources` and `--catalog` files; reports items left out on stderr.
async fn load_files(actors: &capdex::actors::Actors, files: &SourceFiles, max_id_bytes: usize) -> anyhow::Result<()> {
    let given: Vec<PathBuf> = files.sources.iter().chain(&files.catalogs).cloned().collect();
    capdex::app::drop_other_files(actors, &given).await?;
    let shaped = files
        .sources
        .iter()
        .map(|path| (path, capdex::app::FileShape::Sources))
        .chain(files.catalogs.iter().map(|path| (path, capdex::app::FileShape::Catalog)));
    for (path, shape) in shaped {
        let (report, normalised) = capdex::app::load_file(actors, path, shape, max_id_bytes).await?;
        for diagnostic in &normalised.diagnostics {
            eprintln!(
                "left out {} {}[{}] ({}: {})",
                path.display(),
                diagnostic.section,
                diagnostic.index,
                diagnostic.field,
                diagnostic.problem
            );
        }
        for conflict in &report.conflicts {
            eprintln!("left out {} {} ({})", path.display(), conflict.id, conflict.problem);
        }
        eprintln!(
            "indexed {}: {} new or changed ({} embedded, {} reused), {} unchanged, {} removed, {} left out",
            path.display(),
            report.upserted,
            report.embedded,
            report.reused,
            report.unchanged,
            report.removed,
            normalised.diagnostics.len() + report.conflicts.len()
        );
    }
    Ok(())
}

/// Starts the actors, scans the capability folders and indexes the given files,
/// with a spinner on a terminal.
async fn start_and_index(
    settings: &Settings,
    files: &SourceFiles,
) -> anyhow::Result<(capdex::actors::Actors, capdex::actors::scanner::ScanOutcome)> {
    let spinner = spinner("scanning and indexing capability folders");
    let actors = capdex::app::start(settings).await?;
    let outcome = capdex::app::scan(&actors).await?;
    load_files(&actors, files, settings.limits.max_id_bytes).await?;
    if let Some(bar) = spinner {
        bar.finish_and_clear();
    }
    Ok((actors, outcome))
}

async fn index_once(settings: &Settings, files: &SourceFiles, json: bool) -> anyhow::Result<()> {
    let (actors, outcome) = start_and_index(settings, files).await?;
    // What was indexed is also on disk as a lexical snapshot, so `capdex serve` starts on it at once.
    let _ = actors.indexer.send(capdex::actors::indexer::FlushSnapshots).await;
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

async fn discover_once(
    settings: &Settings,
    files: &SourceFiles,
    message: &str,
    filter: DiscoveryFilter,
    json: bool,
    explain: bool,
) -> anyhow::Result<()> {
    let (actors, outcome) = start_and_index(settings, files).await?;
    print_scan_problems(&outcome);
    let result = capdex::app::discover_explained(&actors, message, filter, explain).await?;
    if json {
        println!("{}", serde_json::to_string_pretty(&result).context("failed to encode the result")?);
    } else {
        print!("{}", result.rendered);
        if explain {
            print_explanations(&result.explanations);
        }
    }
    Ok(())
}

/// Prints one line per Tier 1 entry: its relevance and the signals that made it.
fn print_explanations(explanations: &[capdex::core::discovery::Explanation]) {
    if explanations.is_empty() {
        return;
    }
    println!("\nWhy (relevance = (fused + graph) x (1 + prior); fused from lexical and dense on the part):");
    println!(
        "{:<40} {:>9} {:>7} {:>7} {:>7} {:>7} {:>7} {:>5}",
        "id", "relevance", "fused", "lexical", "dense", "graph", "prior", "part"
    );
    for explanation in explanations {
        let dense = explanation.dense.map_or_else(|| "-".to_string(), |dense| format!("{dense:.3}"));
        let part = if explanation.exact { "exact".to_string() } else { explanation.part.to_string() };
        println!(
            "{:<40} {:>9.3} {:>7.3} {:>7.3} {:>7} {:>+7.3} {:>+7.3} {:>5}",
            explanation.id,
            explanation.relevance,
            explanation.fused,
            explanation.lexical,
            dense,
            explanation.graph,
            explanation.prior,
            part
        );
    }
}

/// What `capdex bench` reports.
enum BenchMode {
    Timings,
    PromptSize,
    Memory,
    OutcomeLearning,
}

/// `capdex bench --soak MINUTES`.
fn run_soak(
    settings: &Settings,
    minutes: f64,
    nats_server: &std::path::Path,
    report_seconds: Option<f64>,
    warmup_minutes: Option<f64>,
    rate: Option<f64>,
    json: bool,
) -> anyhow::Result<()> {
    if !(minutes.is_finite() && minutes > 0.0) {
        anyhow::bail!("--soak {minutes}: must be a positive number of minutes");
    }
    if let Some(warmup) = warmup_minutes.filter(|warmup| !(warmup.is_finite() && (0.0..minutes).contains(warmup))) {
        anyhow::bail!("--soak-warmup {warmup}: must be at least 0 and shorter than the soak ({minutes} minutes)");
    }
    if let Some(rate) = rate.filter(|rate| !(rate.is_finite() && *rate >= 1.0)) {
        anyhow::bail!("--soak-rate {rate}: must be at least 1 operation a second");
    }
    let seconds = |value: f64| std::time::Duration::from_secs_f64(value);
    let options = capdex::bench::soak::SoakOptions {
        duration: seconds(minutes * 60.0),
        report_every: seconds(report_seconds.unwrap_or(60.0).max(0.1)),
        ramp: seconds(report_seconds.map_or(20.0, |every| every.max(0.1))),
        warmup: warmup_minutes.map(|warmup| seconds(warmup * 60.0)),
        rate,
        nats_server: nats_server.to_path_buf(),
        capdex: std::env::current_exe()?,
        nats: settings.nats.clone(),
    };
    let mut print = |line: &str| {
        if !json {
            println!("{line}");
        }
    };
    print(&format!(
        "capdex soak: {minutes} min, reports every {:.0} s; the machine's other load counts too",
        options.report_every.as_secs_f64()
    ));
    let report = capdex::bench::soak::run(&options, &mut print)?;
    if json {
        println!("{}", serde_json::to_string_pretty(&report)?);
    } else {
        println!(
            "after the warm-up ({} of {} intervals): per-minute means, RSS max/min {:.3}, data dir max/min {:.3}: {}",
            report.warmup_intervals,
            report.intervals.len(),
            report.rss_ratio,
            report.data_dir_ratio,
            if report.flat { "flat within 5 %" } else { "NOT flat within 5 %" }
        );
        println!(
            "moments (highest sample / lowest, one a second): RSS {:.3}, data dir {:.3}",
            report.rss_sample_ratio, report.data_dir_sample_ratio
        );
    }
    Ok(())
}

#[allow(clippy::too_many_arguments)]
fn run_bench(
    settings: &Settings,
    synthetic: Option<usize>,
    sources: Option<PathBuf>,
    queries: Option<String>,
    mode: BenchMode,
    max_rss: Option<u64>,
    flags: &EmbedderFlags,
    json: bool,
) -> anyhow::Result<()> {
    bench_report(settings, synthetic, sources, queries, mode, flags, json)?;
    let peak = capdex::bench::peak_rss_bytes();
    match max_rss {
        Some(budget) if peak == 0 => anyhow::bail!(
            "--max-rss {:.1} MB: this platform does not report the peak resident set size",
            budget as f64 / 1e6
        ),
        Some(budget) if peak > budget => {
            anyhow::bail!("peak RSS {:.1} MB is over --max-rss {:.1} MB", peak as f64 / 1e6, budget as f64 / 1e6)
        }
        _ => Ok(()),
    }
}

fn bench_report(
    settings: &Settings,
    synthetic: Option<usize>,
    sources: Option<PathBuf>,
    queries: Option<String>,
    mode: BenchMode,
    flags: &EmbedderFlags,
    json: bool,
) -> anyhow::Result<()> {
    use capdex::bench;
    let embedder_settings = flags.apply(&settings.embedder)?;
    let embedder = capdex::embedders::backend::build(&embedder_settings)?;
    let batch_size = embedder_settings.batch_size;
    let discovery = settings.discovery_for(embedder_settings.backend);
    if let (BenchMode::Memory, Some(n)) = (&mode, synthetic) {
        // The descriptors are made inside the account, so that they are measured too.
        let count = match queries.as_deref() {
            None => 100,
            Some(text) => text.parse().context("with --synthetic, --queries is a number of queries")?,
        };
        let messages = bench::synthetic_queries(count);
        let account = bench::memory_account(
            || (bench::synthetic_catalog(n), Vec::new()),
            &messages,
            embedder.as_ref(),
            batch_size,
            &discovery,
        )?
        .context("this build's allocator does not count allocations (the capdex binary's does)")?;
        return print_memory_account(&account, json);
    }
    let (descriptors, presets, messages) = match (synthetic, sources) {
        (Some(n), _) => {
            let count = match queries.as_deref() {
                None => 1000,
                Some(text) => text.parse().context("with --synthetic, --queries is a number of queries")?,
            };
            (bench::synthetic_catalog(n), Vec::new(), bench::synthetic_queries(count))
        }
        (None, Some(path)) => {
            let (descriptors, presets) = bench::load_sources(&path)?;
            let queries = queries.context("--sources needs --queries FILE")?;
            (descriptors, presets, bench::load_queries(std::path::Path::new(&queries))?)
        }
        (None, None) => anyhow::bail!("give --synthetic N or --sources FILE --queries FILE"),
    };
    if let BenchMode::Memory = mode {
        let account =
            bench::memory_account(|| (descriptors, presets), &messages, embedder.as_ref(), batch_size, &discovery)?
                .context("this build's allocator does not count allocations (the capdex binary's does)")?;
        return print_memory_account(&account, json);
    }
    if let BenchMode::OutcomeLearning = mode {
        let report = bench::outcome_learning(descriptors, &messages, embedder.as_ref(), batch_size, &discovery)?;
        if json {
            println!("{}", serde_json::to_string(&report).context("failed to encode the report")?);
        } else {
            println!(
                "{} capabilities, {} successes learnt ({} trials): p50 {:.0} µs, p99 {:.0} µs, max {:.0} µs a \
                 success; fitting the memory to a new catalog {:.1} ms; {} capabilities remembered ({} with \
                 learned words); peak RSS {:.1} MB",
                report.n,
                report.successes,
                report.trials,
                report.learn_p50_us,
                report.learn_p99_us,
                report.learn_max_us,
                report.refit_ms,
                report.remembered,
                report.learned_words,
                report.rss_bytes as f64 / 1e6
            );
        }
        return Ok(());
    }
    if let BenchMode::PromptSize = mode {
        let report = bench::prompt_size(descriptors, presets, &messages, embedder.as_ref(), batch_size, &discovery)?;
        if json {
            println!("{}", serde_json::to_string(&report).context("failed to encode the report")?);
        } else {
            println!(
                "{} capabilities, {} queries: {} over budget; max tokens per tier {:?} (budgets {:?}); \
                 median prompt {:.0} tokens (max {}) vs {} for every schema ({:.1}%)",
                report.n,
                report.queries,
                report.over_budget,
                report.max_tier_tokens,
                report.budgets,
                report.median_total_tokens,
                report.max_total_tokens,
                report.dump_all_tokens,
                report.median_share_of_dump * 100.0
            );
        }
        return Ok(());
    }
    let report = bench::run_with(descriptors, presets, &messages, embedder.as_ref(), batch_size, &discovery)?;
    if json {
        println!("{}", serde_json::to_string(&report).context("failed to encode the report")?);
    } else {
        println!(
            "{} capabilities built in {:.0} ms; {} queries: p50 {:.0} µs, p99 {:.0} µs \
             (query embedding p50 {:.0} µs, p99 {:.0} µs; the rest p50 {:.0} µs, p99 {:.0} µs), \
             {:.1} candidates a query; peak RSS {:.1} MB",
            report.n,
            report.build_ms,
            report.queries,
            report.p50_us,
            report.p99_us,
            report.embed_p50_us,
            report.embed_p99_us,
            report.discover_p50_us,
            report.discover_p99_us,
            report.candidates_per_query,
            report.rss_bytes as f64 / 1e6
        );
        let slowest = &report.slowest_stages_us;
        println!(
            "slowest 1% of turns, mean µs: {:.0} in all: embed {:.0}, lexical {:.0}, dense {:.0}, \
             fusion {:.0}, graph {:.0}, tiers {:.0}",
            slowest.total_us,
            slowest.embed_us,
            slowest.lexical_us,
            slowest.dense_us,
            slowest.fusion_us,
            slowest.graph_us,
            slowest.tiers_us
        );
    }
    Ok(())
}

fn print_memory_account(account: &capdex::bench::MemoryAccount, json: bool) -> anyhow::Result<()> {
    if json {
        println!("{}", serde_json::to_string(account).context("failed to encode the account")?);
        return Ok(());
    }
    let mb = |bytes: i64| bytes as f64 / 1e6;
    let per = |bytes: i64| bytes as f64 / account.n.max(1) as f64;
    println!("memory account: {} capabilities, embedder {}", account.n, account.model_id);
    println!("{:<44} {:>10} {:>16} {:>14}", "structure", "MB", "bytes/capability", "transient MB");
    for part in &account.parts {
        println!(
            "{:<44} {:>10.2} {:>16.0} {:>14.2}",
            part.structure,
            mb(part.bytes),
            part.bytes_per_capability,
            mb(part.transient_bytes)
        );
    }
    let rows = [
        ("heap, all structures", account.live_bytes),
        ("allocator overhead (RSS - baseline - heap)", account.allocator_overhead_bytes),
        ("baseline before the catalog (code, runtime)", account.baseline_rss_bytes as i64),
    ];
    for (name, bytes) in rows {
        println!("{name:<44} {:>10.2} {:>16.0}", mb(bytes), per(bytes));
    }
    println!(
        "RSS after the build and {} queries {:.1} MB; peak RSS {:.1} MB",
        account.queries,
        mb(account.rss_bytes as i64),
        mb(account.peak_rss_bytes as i64)
    );
    Ok(())
}

fn print_eval(report: &capdex::eval::EvalReport, json: bool) -> anyhow::Result<()> {
    if json {
        println!("{}", serde_json::to_string_pretty(report).context("failed to encode the report")?);
        return Ok(());
    }
    let metrics = &report.metrics;
    println!("{:>6} {:>7} {:>7} {:>7} {:>7} {:>7} {:>7}", "n", "R@1", "R@5", "R@10", "NDCG@5", "NDCG@10", "MRR");
    println!(
        "{:>6} {:>7.2} {:>7.2} {:>7.2} {:>7.2} {:>7.2} {:>7.2}",
        metrics.queries,
        metrics.recall_at_1,
        metrics.recall_at_5,
        metrics.recall_at_10,
        metrics.ndcg_at_5,
        metrics.ndcg_at_10,
        metrics.mrr
    );
    let fits = &report.nothing_fits;
    if fits.unanswerable > 0 {
        println!(
            "nothing fits: {}/{} answered empty ({:.2}%)",
            fits.answered_empty, fits.unanswerable, fits.answered_empty_share
        );
        if fits.unanswerable_by_split.len() > 1 {
            let splits: Vec<String> = fits
                .unanswerable_by_split
                .iter()
                .map(|(split, of)| {
                    format!("{split} {}/{} ({:.2}%)", of.answered_empty, of.unanswerable, of.answered_empty_share)
                })
                .collect();
            println!("  by split: {}", splits.join(", "));
        }
    }
    println!(
        "tier 1 kept: {}/{} answerable queries with a relevant capability in reach keep one ({:.2}%)",
        fits.kept, fits.answerable_in_reach, fits.kept_share
    );
    if let Some(replay) = &report.replay {
        let chosen = match replay.chosen {
            None => "nothing learnt is used".to_string(),
            Some(learning) => learning.to_string(),
        };
        println!(
            "replay (seed {}): {} outcomes from {} queries, {} trials ({} unseen) chose: {}; second half NDCG@10 {:.2} -> {:.2}, R@5 {:.2} -> {:.2}; its {} unseen NDCG@10 {:.2} -> {:.2}",
            replay.seed,
            replay.outcomes,
            replay.first_half,
            replay.trials,
            replay.unseen_trials,
            chosen,
            replay.without_learning.ndcg_at_10,
            replay.learned.ndcg_at_10,
            replay.without_learning.recall_at_5,
            replay.learned.recall_at_5,
            replay.unseen,
            replay.unseen_without_learning.ndcg_at_10,
            replay.unseen_learned.ndcg_at_10,
        );
    }
    eprintln!("{} tools indexed in {:.0} ms; {:.2} ms a query", report.tools, report.build_ms, report.query_ms_mean);
    Ok(())
}

fn parse_field_weights(text: &str) -> anyhow::Result<capdex::core::lexical::FieldWeights> {
    let values: Vec<f32> = text
        .split(',')
        .map(|part| part.trim().parse::<f32>().with_context(|| format!("bad field weight {part:?}")))
        .collect::<anyhow::Result<_>>()?;
    let [name, description, category, tags, parameters, parameter_descriptions] = values[..] else {
        anyhow::bail!(
            "--field-weights needs six numbers: name,description,category,tags,parameters,parameter descriptions"
        );
    };
    Ok(capdex::core::lexical::FieldWeights { name, description, category, tags, parameters, parameter_descriptions })
}
