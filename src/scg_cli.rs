//! `capdex map`, `capdex route`, `capdex observe` and `capdex deposit`: the Source Capability Graph on the data dir.
//!
//! Each command opens the store in `data_dir` and starts the SCG actors (the same
//! ones `capdex serve` answers NATS with), so they build on each other: `map` runs
//! the map pipeline (connect → introspect → parse → link → finalize), storing the
//! source's graph in place of an earlier map and recomputing the cross-source links,
//! and (with every actor started) offers its operations to discovery and dispatch;
//! `route`, `observe` and `deposit` read the stored sources, links and memory notes.

use actix_rt::SystemRunner;
use anyhow::Context as _;
use capdex::actors::scg::{self as scg_actors, DepositNote, ObserveNode, Route, ScgActors, SourceText};
use capdex::config::Settings;
use capdex::core::scg::memory::{Deposit, Polarity};
use capdex::core::scg::model::{EdgeKind, SourceKind};
use capdex::core::scg::pipeline::{PhaseStatus, ScgEvent};
use capdex::core::scg::MAX_SOURCE_BYTES;
use capdex::source_catalog::{Publication, SourceCatalog};
use capdex::store::Store;
use std::path::Path;

/// What `capdex map` was asked to do.
#[derive(Debug)]
pub struct MapArgs<'a> {
    pub file: &'a Path,
    pub source_id: &'a str,
    pub kind: Option<&'a str>,
    pub workspaces: &'a [String],
    pub json: bool,
}

/// What `capdex deposit` was asked to do.
#[derive(Debug)]
pub struct DepositArgs<'a> {
    pub content: &'a str,
    pub polarity: &'a str,
    pub anchors: &'a [String],
    pub workspace: Option<&'a str>,
    pub session: Option<&'a str>,
    pub json: bool,
}

/// Opens the data dir and starts the SCG actors; must run inside an actix System.
fn start(settings: &Settings) -> anyhow::Result<ScgActors> {
    std::fs::create_dir_all(&settings.data_dir)
        .with_context(|| format!("failed to create data_dir {}", settings.data_dir.display()))?;
    let store = Store::open(&settings.data_dir)?;
    // A `local` or `http` embedder runs on its own thread, as in `serve`; routes embed there.
    let remote = match settings.embedder.backend {
        capdex::config::EmbedderBackend::Local | capdex::config::EmbedderBackend::Http => {
            let model = std::sync::Mutex::new(Some(capdex::embedders::backend::build(&settings.embedder)?));
            let batch_size = settings.embedder.batch_size;
            let embedder = actix::SyncArbiter::start(1, move || {
                let model = model.lock().ok().and_then(|mut slot| slot.take());
                let model = model.expect("one Embedder thread, started once");
                capdex::actors::embedder::Embedder::new(model).with_batch_size(batch_size)
            });
            Some(embedder.recipient())
        }
        _ => None,
    };
    Ok(scg_actors::spawn(settings, &store, remote)?)
}

fn print_event(event: &ScgEvent) {
    match event.status {
        PhaseStatus::Started => {}
        PhaseStatus::Done => {
            let counts: Vec<String> = event.counts.iter().map(|(name, count)| format!("{name} {count}")).collect();
            eprintln!(
                "  {:<10} {:>8.1} ms  {}",
                event.phase.as_str(),
                event.elapsed_ms.unwrap_or_default(),
                counts.join(", ")
            );
        }
        PhaseStatus::Failed => eprintln!(
            "  {:<10} failed: {}",
            event.phase.as_str(),
            event.error.as_ref().map_or("", |error| error.message.as_str())
        ),
    }
}

/// `capdex map FILE --source-id ID [--kind K] [--workspace WS]...`: runs the map pipeline
/// (its phases are printed on stderr as they end, unless --json).
pub fn map(system: &SystemRunner, settings: &Settings, args: MapArgs<'_>) -> anyhow::Result<()> {
    let kind = match args.kind {
        Some(text) => {
            Some(SourceKind::parse(text).with_context(|| format!("unknown --kind {text:?}: use openapi, mcp or sql"))?)
        }
        None => None,
    };
    let size = std::fs::metadata(args.file).with_context(|| format!("failed to read {}", args.file.display()))?.len();
    anyhow::ensure!(
        size <= MAX_SOURCE_BYTES as u64,
        "{} is {size} bytes, more than the {MAX_SOURCE_BYTES} allowed",
        args.file.display()
    );
    let text = std::fs::read_to_string(args.file)
        .with_context(|| format!("failed to read {} as UTF-8 text", args.file.display()))?;
    let mut publication = Publication::text(args.source_id, kind, SourceText::Inline(text));
    publication.workspaces = args.workspaces.to_vec();
    let report = system.block_on(async {
        // Every actor, not only the SCG's: the mapped operations are offered to discovery
        // and dispatch under the id route gives them, as `capdex.v1.map` does.
        let actors = capdex::app::start(settings).await?;
        let mut events = actors.scg.events.subscribe();
        let published = SourceCatalog::of(&actors).publish_source(publication).await;
        // Every phase's event was sent before the reply, so they are all here.
        while let Ok(event) = events.try_recv() {
            if !args.json {
                print_event(&event);
            }
        }
        published.map(|published| published.report).with_context(|| format!("failed to map {}", args.file.display()))
    })?;
    if args.json {
        println!("{}", serde_json::to_string_pretty(&report).context("failed to encode the report")?);
    } else {
        println!(
            "mapped {} ({:?}): {} nodes, {} edges; drift hash {} ({})",
            report.source_id,
            report.kind,
            report.nodes,
            report.edges,
            report.drift_hash,
            if report.changed { "changed" } else { "unchanged" }
        );
        println!("  nodes {:?}\n  edges {:?}", report.node_counts, report.edge_counts);
        let links = &report.links;
        println!(
            "linked {} sources: {} RESOLVES_TO between entity types, {} between fields, {} CONSUMES",
            report.sources, links.entity_resolves_to, links.field_resolves_to, links.consumes
        );
    }
    Ok(())
}

/// `capdex route "<query>" [--workspace WS] [-k K] [--json]`.
pub fn route(
    system: &SystemRunner,
    settings: &Settings,
    query: &str,
    workspace: Option<&str>,
    k: usize,
    json: bool,
) -> anyhow::Result<()> {
    let answer = system.block_on(async {
        let actors = start(settings)?;
        let route = Route { query: query.to_string(), k, workspace: workspace.map(str::to_string) };
        anyhow::Ok(actors.graph.send(route).await.context("the SCG actor stopped")??)
    })?;
    let ranked = &answer.recipes;
    if json {
        // The `capdex.v1.route` reply: recipes (with the concepts each answers) and the resolved concepts.
        println!("{}", serde_json::to_string_pretty(&answer).context("failed to encode the recipes")?);
    } else if ranked.is_empty() {
        println!(
            "no recipes (is a source mapped{}?)",
            workspace.map(|ws| format!(" and enabled in workspace {ws}")).unwrap_or_default()
        );
    } else {
        if !answer.concepts.is_empty() {
            let concepts: Vec<String> = answer.concepts.iter().map(|concept| concept.label()).collect();
            println!("concepts: {}", concepts.join("; "));
        }
        for recipe in ranked {
            let memory = if recipe.memory != 0.0 { format!(" (memory {:+.3})", recipe.memory) } else { String::new() };
            println!(
                "{:.3}  {}  steps: {}  (via {}){memory}",
                recipe.score,
                recipe.source_key,
                recipe.steps.join(" → "),
                recipe.via
            );
            for concept in &recipe.concepts {
                let steps: Vec<String> = concept
                    .steps
                    .iter()
                    .map(|step| match &step.field {
                        Some(field) => format!("{} reads {field}", step.operation),
                        None => step.operation.clone(),
                    })
                    .collect();
                let across =
                    concept.resolves_to.as_deref().map(|edge| format!(" (RESOLVES_TO {edge})")).unwrap_or_default();
                println!("         answers {}: {}{across}", concept.answers, steps.join("; "));
            }
        }
    }
    Ok(())
}

/// `capdex deposit "<note>" --polarity positive|dead_end --anchor KEY... (--workspace WS | --session S)`.
pub fn deposit(system: &SystemRunner, settings: &Settings, args: DepositArgs<'_>) -> anyhow::Result<()> {
    let polarity = match args.polarity {
        "positive" => Polarity::Positive,
        "dead_end" | "dead-end" => Polarity::DeadEnd,
        other => anyhow::bail!("unknown --polarity {other:?}: use positive or dead_end"),
    };
    let label = match (args.workspace, args.session) {
        (Some(workspace), None) => format!("ws:{workspace}"),
        (None, Some(session)) => format!("session:{session}"),
        _ => anyhow::bail!("give exactly one of --workspace and --session"),
    };
    let deposit = Deposit { content: args.content.to_string(), polarity, anchors: args.anchors.to_vec(), label };
    let deposited = system.block_on(async {
        let actors = start(settings)?;
        let note = DepositNote { deposit, workspace: args.workspace.map(str::to_string) };
        anyhow::Ok(actors.graph.send(note).await.context("the SCG actor stopped")??)
    })?;
    if args.json {
        println!("{}", serde_json::to_string_pretty(&deposited).context("failed to encode the note")?);
    } else {
        let note = &deposited.note;
        println!(
            "{} note {} ({}, deposited {} time{}) on {}",
            if deposited.merged { "merged" } else { "new" },
            note.id,
            note.polarity.as_str(),
            note.count,
            if note.count == 1 { "" } else { "s" },
            note.anchors.join(", ")
        );
    }
    Ok(())
}

/// `capdex observe NODE [--workspace WS] [--edge-kind K]... [--json]`.
pub fn observe(
    system: &SystemRunner,
    settings: &Settings,
    node: &str,
    workspace: Option<&str>,
    edge_kinds: &[String],
    json: bool,
) -> anyhow::Result<()> {
    let kinds: Vec<EdgeKind> = edge_kinds
        .iter()
        .map(|text| EdgeKind::parse(text).with_context(|| format!("unknown edge kind {text:?}")))
        .collect::<anyhow::Result<_>>()?;
    let observation = system.block_on(async {
        let actors = start(settings)?;
        let observe =
            ObserveNode { node: node.to_string(), edge_kinds: kinds, workspace: workspace.map(str::to_string) };
        anyhow::Ok(actors.graph.send(observe).await.context("the SCG actor stopped")??)
    })?;
    if json {
        println!("{}", serde_json::to_string_pretty(&observation).context("failed to encode the observation")?);
        return Ok(());
    }
    let node = &observation.node;
    println!("{} {} ({}) — {} edges", node.kind.as_str(), node.source_key, node.id, observation.n_edges);
    if !node.doc.is_empty() {
        println!("  {}", node.doc.lines().next().unwrap_or_default());
    }
    for row in &observation.survey {
        println!("  {:>5} × {} {} {}", row.count, row.kind.as_str(), row.direction, row.neighbour_kind.as_str());
    }
    if !observation.survey.is_empty() {
        println!("  (a survey: add --edge-kind KIND to list edges)");
    }
    for edge in &observation.edges {
        println!(
            "  {} {:<3} {:.2} {} {}",
            edge.kind.as_str(),
            edge.direction,
            edge.weight,
            edge.neighbour_kind.as_str(),
            edge.neighbour_key
        );
    }
    for recipe in &observation.recipes {
        println!("  recipe {}: {}", recipe.source_key, recipe.steps.join(" → "));
    }
    for note in &observation.notes {
        println!(
            "  note {} ({}, ×{}, labels {}): {}",
            note.id,
            note.polarity.as_str(),
            note.count,
            note.labels.join(","),
            note.content
        );
    }
    Ok(())
}
