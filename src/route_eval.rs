//! `capdex eval --route MANIFEST`: the route benchmark of the Source Capability Graph.
//!
//! The manifest (`tests/fixtures/route/route.json`) names the sources to map (each a file
//! beside it, with its source id and kind) and a questions file, one JSON object a line:
//! `{"qid", "kind": "direct"|"concept"|"cross", "question", "relevant": ["source#Name", ...]}`.
//! - `direct`: the question shares a word with an acceptable operation;
//! - `concept`: it names the concept without any content word of the operation's name or fields;
//! - `cross`: it needs two sources.
//!
//! Every source is mapped and linked as `capdex map` does, and every question routed with
//! `k = 3` over all sources (no memory notes). A direct or concept question is a hit when an
//! acceptable key is among the top 3; a cross-source question is a hit when the top 3 holds
//! acceptable keys of two sources or more, and its coverage is the share of the acceptable
//! keys' sources (at most two counted) the top 3 reaches. Beside it, a plain BM25 (k1 = 1.2,
//! b = 0.75) over the same recipes, each one document of its node's name words, description
//! and its fields' names, is scored the same way. Route latency is the time of
//! `RouteIndex::route` over `rounds` passes of every question, p50 and p99.
//!
//! An acceptable key that names no recipe of the mapped sources is an error, so a typo never
//! counts as a miss.

use crate::config::EmbedderSettings;
use crate::core::embedder::Embed;
use crate::core::scg::align::TypeAligner;
use crate::core::scg::map_source;
use crate::core::scg::model::{EdgeKind, NodeKind, SourceGraph, SourceKind};
use crate::core::scg::route::{node_text, RankedRecipe, RouteIndex, Scope};
use crate::core::text::for_each_index_term;
use serde::{Deserialize, Serialize};
use std::collections::{BTreeMap, BTreeSet, HashMap};
use std::path::{Path, PathBuf};
use std::time::{Duration, Instant};

/// Recipes a question is judged on.
pub const TOP: usize = 3;

/// What kind of question, for the per-kind figures.
#[derive(Clone, Copy, Debug, PartialEq, Eq, PartialOrd, Ord, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum QuestionKind {
    Direct,
    Concept,
    Cross,
}

/// One benchmark question.
#[derive(Clone, Debug, Serialize, Deserialize)]
pub struct Question {
    pub qid: String,
    pub kind: QuestionKind,
    pub question: String,
    pub relevant: Vec<String>,
}

#[derive(Clone, Debug, Deserialize)]
struct ManifestSource {
    id: String,
    path: PathBuf,
    kind: Option<String>,
}

#[derive(Clone, Debug, Deserialize)]
struct Manifest {
    questions: PathBuf,
    sources: Vec<ManifestSource>,
}

/// Why the route benchmark could not run.
#[derive(Debug, thiserror::Error)]
pub enum RouteEvalError {
    #[error("failed to read {path}: {source}")]
    Read { path: PathBuf, source: std::io::Error },
    #[error("{path}: {problem}")]
    Invalid { path: PathBuf, problem: String },
    #[error("source {id}: {problem}")]
    Map { id: String, problem: String },
    #[error("question {qid}: no recipe {key:?} in the mapped sources")]
    UnknownKey { qid: String, key: String },
    #[error("embedder: {0}")]
    Embedder(String),
}

/// One question's outcome.
#[derive(Clone, Debug, Serialize)]
#[serde(rename_all = "camelCase")]
pub struct QuestionOutcome {
    pub qid: String,
    pub kind: QuestionKind,
    pub question: String,
    /// capdex's top 3.
    pub capdex: Vec<String>,
    /// BM25's top 3.
    pub bm25: Vec<String>,
    pub capdex_hit: bool,
    pub bm25_hit: bool,
    /// The concepts route resolved, with what resolved them.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub concepts: Vec<String>,
    /// The median time of this question's routes, in µs.
    pub route_median_us: f64,
}

/// Hits of one kind.
#[derive(Clone, Debug, Default, Serialize)]
#[serde(rename_all = "camelCase")]
pub struct KindFigures {
    pub questions: usize,
    pub capdex_hits: usize,
    pub bm25_hits: usize,
    /// For cross-source questions: mean share of the needed sources (two) in the top 3.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub capdex_coverage: Option<f64>,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub bm25_coverage: Option<f64>,
}

/// The benchmark's result.
#[derive(Clone, Debug, Serialize)]
#[serde(rename_all = "camelCase")]
pub struct RouteEvalReport {
    pub sources: usize,
    pub recipes: usize,
    pub model_id: String,
    pub by_kind: BTreeMap<QuestionKind, KindFigures>,
    pub route_p50_us: f64,
    pub route_p99_us: f64,
    pub route_samples: usize,
    pub questions: Vec<QuestionOutcome>,
}

/// What to run.
#[derive(Clone, Debug)]
pub struct RouteEvalOptions {
    pub manifest: PathBuf,
    pub embedder: EmbedderSettings,
    /// Passes over every question for the latency figures.
    pub rounds: usize,
}

fn read(path: &Path) -> Result<String, RouteEvalError> {
    std::fs::read_to_string(path).map_err(|source| RouteEvalError::Read { path: path.to_path_buf(), source })
}

/// Reads a questions file (JSON lines; blank lines skipped).
pub fn read_questions(path: &Path) -> Result<Vec<Question>, RouteEvalError> {
    read(path)?
        .lines()
        .enumerate()
        .filter(|(_, line)| !line.trim().is_empty())
        .map(|(at, line)| {
            serde_json::from_str(line).map_err(|err| RouteEvalError::Invalid {
                path: path.to_path_buf(),
                problem: format!("line {}: {err}", at + 1),
            })
        })
        .collect()
}

/// Maps every source a manifest names; returns the graphs and the questions.
pub fn load(manifest_path: &Path) -> Result<(Vec<SourceGraph>, Vec<Question>), RouteEvalError> {
    let manifest: Manifest = serde_json::from_str(&read(manifest_path)?)
        .map_err(|err| RouteEvalError::Invalid { path: manifest_path.to_path_buf(), problem: err.to_string() })?;
    let dir = manifest_path.parent().unwrap_or(Path::new("."));
    let mut graphs = Vec::new();
    for source in &manifest.sources {
        let kind = match &source.kind {
            Some(text) => Some(SourceKind::parse(text).ok_or_else(|| RouteEvalError::Map {
                id: source.id.clone(),
                problem: format!("unknown kind {text:?}"),
            })?),
            None => None,
        };
        let text = read(&dir.join(&source.path))?;
        let graph = map_source(&source.id, kind, &text)
            .map_err(|err| RouteEvalError::Map { id: source.id.clone(), problem: err.to_string() })?;
        graphs.push(graph);
    }
    let questions = read_questions(&dir.join(&manifest.questions))?;
    Ok((graphs, questions))
}

/// A plain BM25 over the recipes of the mapped sources.
pub struct Bm25 {
    keys: Vec<String>,
    postings: HashMap<String, Vec<(usize, f32)>>,
    lengths: Vec<f32>,
    mean_length: f32,
}

impl Bm25 {
    const K1: f32 = 1.2;
    const B: f32 = 0.75;

    /// One document per recipe: its node's name words and description, and its fields' names.
    pub fn build(graphs: &[SourceGraph]) -> Bm25 {
        let mut keys = Vec::new();
        let mut postings: HashMap<String, Vec<(usize, f32)>> = HashMap::new();
        let mut lengths = Vec::new();
        for graph in graphs {
            let recipe_keys: BTreeSet<&str> = graph.recipes.iter().map(|recipe| recipe.source_key.as_str()).collect();
            let mut fields: HashMap<&str, Vec<&str>> = HashMap::new();
            for edge in &graph.edges {
                if matches!(edge.kind, EdgeKind::HasField | EdgeKind::SupportsQuery | EdgeKind::Produces) {
                    if let Some(field) = graph.node(&edge.target) {
                        fields.entry(edge.source.as_str()).or_default().push(field.name.as_str());
                    }
                }
            }
            for node in &graph.nodes {
                if !matches!(node.kind, NodeKind::Capability | NodeKind::EntityType)
                    || !recipe_keys.contains(node.source_key.as_str())
                {
                    continue;
                }
                let mut text = node_text(node);
                for field in fields.get(node.id.as_str()).into_iter().flatten() {
                    text.push(' ');
                    text.push_str(field);
                }
                let mut counts: BTreeMap<String, f32> = BTreeMap::new();
                let mut length = 0.0;
                for_each_index_term(&text, |term| {
                    *counts.entry(term.to_string()).or_insert(0.0) += 1.0;
                    length += 1.0;
                });
                let doc = keys.len();
                keys.push(node.source_key.clone());
                lengths.push(length);
                for (term, count) in counts {
                    postings.entry(term).or_default().push((doc, count));
                }
            }
        }
        let mean_length = lengths.iter().sum::<f32>() / lengths.len().max(1) as f32;
        Bm25 { keys, postings, lengths, mean_length }
    }

    /// The `k` best recipe keys for `query` (ties by key).
    pub fn top(&self, query: &str, k: usize) -> Vec<String> {
        let n = self.keys.len() as f32;
        let mut terms = BTreeSet::new();
        for_each_index_term(query, |term| {
            terms.insert(term.to_string());
        });
        let mut scores: HashMap<usize, f32> = HashMap::new();
        for term in &terms {
            let Some(posting) = self.postings.get(term) else { continue };
            let df = posting.len() as f32;
            let idf = (1.0 + (n - df + 0.5) / (df + 0.5)).ln();
            for &(doc, tf) in posting {
                let norm = Self::K1 * (1.0 - Self::B + Self::B * self.lengths[doc] / self.mean_length.max(1e-6));
                *scores.entry(doc).or_insert(0.0) += idf * tf * (Self::K1 + 1.0) / (tf + norm);
            }
        }
        let mut ranked: Vec<(f32, &str)> = scores.into_iter().map(|(doc, s)| (s, self.keys[doc].as_str())).collect();
        ranked.sort_by(|a, b| b.0.total_cmp(&a.0).then_with(|| a.1.cmp(b.1)));
        ranked.into_iter().take(k).map(|(_, key)| key.to_string()).collect()
    }
}

fn source_of(key: &str) -> &str {
    key.split('#').next().unwrap_or(key)
}

/// Judges a top 3: (hit, coverage of the needed sources).
pub fn judge(question: &Question, top: &[String]) -> (bool, f64) {
    let relevant: BTreeSet<&str> = question.relevant.iter().map(String::as_str).collect();
    let found: Vec<&String> = top.iter().take(TOP).filter(|key| relevant.contains(key.as_str())).collect();
    match question.kind {
        QuestionKind::Direct | QuestionKind::Concept => {
            let hit = !found.is_empty();
            (hit, if hit { 1.0 } else { 0.0 })
        }
        QuestionKind::Cross => {
            let needed = relevant.iter().map(|key| source_of(key)).collect::<BTreeSet<_>>().len().min(2);
            let reached = found.iter().map(|key| source_of(key)).collect::<BTreeSet<_>>().len().min(2);
            (reached >= 2, reached as f64 / needed.max(1) as f64)
        }
    }
}

fn percentile_us(sorted: &[Duration], p: f64) -> f64 {
    if sorted.is_empty() {
        return 0.0;
    }
    sorted[((sorted.len() as f64 - 1.0) * p).round() as usize].as_secs_f64() * 1e6
}

/// Routes every question of `questions` over `index` and BM25, and times the routes.
pub fn evaluate(
    graphs: &[SourceGraph],
    questions: &[Question],
    embedder: Option<&dyn Embed>,
    rounds: usize,
) -> Result<RouteEvalReport, RouteEvalError> {
    let refs: Vec<&SourceGraph> = graphs.iter().collect();
    let links = TypeAligner.link(&refs);
    let index = RouteIndex::build(graphs, &links, embedder);
    let recipe_keys: BTreeSet<&str> =
        graphs.iter().flat_map(|graph| graph.recipes.iter().map(|recipe| recipe.source_key.as_str())).collect();
    for question in questions {
        if let Some(key) = question.relevant.iter().find(|key| !recipe_keys.contains(key.as_str())) {
            return Err(RouteEvalError::UnknownKey { qid: question.qid.clone(), key: key.clone() });
        }
    }
    let bm25 = Bm25::build(graphs);
    let mut by_kind: BTreeMap<QuestionKind, KindFigures> = BTreeMap::new();
    let mut coverage: BTreeMap<QuestionKind, (f64, f64)> = BTreeMap::new();
    let mut outcomes = Vec::new();
    for question in questions {
        let answer = index.route_answer(&question.question, TOP, &Scope::All, embedder, None);
        let capdex: Vec<String> =
            answer.recipes.iter().map(|recipe: &RankedRecipe| recipe.source_key.clone()).collect();
        let bm25_top = bm25.top(&question.question, TOP);
        let (capdex_hit, capdex_cover) = judge(question, &capdex);
        let (bm25_hit, bm25_cover) = judge(question, &bm25_top);
        let figures = by_kind.entry(question.kind).or_default();
        figures.questions += 1;
        figures.capdex_hits += usize::from(capdex_hit);
        figures.bm25_hits += usize::from(bm25_hit);
        let sums = coverage.entry(question.kind).or_default();
        sums.0 += capdex_cover;
        sums.1 += bm25_cover;
        outcomes.push(QuestionOutcome {
            qid: question.qid.clone(),
            kind: question.kind,
            question: question.question.clone(),
            capdex,
            bm25: bm25_top,
            capdex_hit,
            bm25_hit,
            concepts: answer.concepts.iter().map(|concept| concept.label()).collect(),
            route_median_us: 0.0,
        });
    }
    if let (Some(figures), Some((capdex, bm25))) =
        (by_kind.get_mut(&QuestionKind::Cross), coverage.get(&QuestionKind::Cross))
    {
        figures.capdex_coverage = Some(capdex / figures.questions.max(1) as f64);
        figures.bm25_coverage = Some(bm25 / figures.questions.max(1) as f64);
    }
    let mut samples = Vec::with_capacity(rounds * questions.len());
    let mut per_question: Vec<Vec<Duration>> = vec![Vec::with_capacity(rounds); questions.len()];
    for _ in 0..rounds {
        for (at, question) in questions.iter().enumerate() {
            let started = Instant::now();
            let answer = index.route_answer(&question.question, TOP, &Scope::All, embedder, None);
            let elapsed = started.elapsed();
            samples.push(elapsed);
            per_question[at].push(elapsed);
            std::hint::black_box(answer);
        }
    }
    for (outcome, mut times) in outcomes.iter_mut().zip(per_question) {
        times.sort();
        outcome.route_median_us = percentile_us(&times, 0.5);
    }
    samples.sort();
    Ok(RouteEvalReport {
        sources: graphs.len(),
        recipes: recipe_keys.len(),
        model_id: embedder.map_or_else(|| "none".to_string(), |embedder| embedder.model_id()),
        by_kind,
        route_p50_us: percentile_us(&samples, 0.5),
        route_p99_us: percentile_us(&samples, 0.99),
        route_samples: samples.len(),
        questions: outcomes,
    })
}

/// Runs the benchmark a manifest describes with the embedder `options` selects.
pub fn run(options: &RouteEvalOptions) -> Result<RouteEvalReport, RouteEvalError> {
    let (graphs, questions) = load(&options.manifest)?;
    let embedder =
        crate::embedders::backend::build(&options.embedder).map_err(|err| RouteEvalError::Embedder(err.to_string()))?;
    evaluate(&graphs, &questions, Some(&*embedder as &dyn Embed), options.rounds.max(1))
}

/// Prints a report: the per-kind table, the latency, and each question's top 3 that missed.
pub fn print(report: &RouteEvalReport, json: bool) -> anyhow::Result<()> {
    if json {
        println!("{}", serde_json::to_string_pretty(report)?);
        return Ok(());
    }
    println!("route benchmark: {} sources, {} recipes, embedder {}", report.sources, report.recipes, report.model_id);
    println!("{:<8} {:>9} {:>14} {:>14}", "kind", "questions", "capdex hit@3", "BM25 hit@3");
    for (kind, figures) in &report.by_kind {
        let share = |hits: usize| 100.0 * hits as f64 / figures.questions.max(1) as f64;
        println!(
            "{:<8} {:>9} {:>7} {:>5.1}% {:>7} {:>5.1}%",
            format!("{kind:?}").to_lowercase(),
            figures.questions,
            figures.capdex_hits,
            share(figures.capdex_hits),
            figures.bm25_hits,
            share(figures.bm25_hits)
        );
        if let (Some(capdex), Some(bm25)) = (figures.capdex_coverage, figures.bm25_coverage) {
            println!("{:<8} {:>9} {:>14.1}% {:>13.1}%", "  (coverage of 2 sources)", "", 100.0 * capdex, 100.0 * bm25);
        }
    }
    println!(
        "route latency over {} routes: p50 {:.0} µs, p99 {:.0} µs",
        report.route_samples, report.route_p50_us, report.route_p99_us
    );
    let slowest = report.questions.iter().max_by(|a, b| a.route_median_us.total_cmp(&b.route_median_us));
    if let Some(slowest) = slowest {
        println!("slowest question (median): {} {:.0} µs", slowest.qid, slowest.route_median_us);
    }
    for outcome in report.questions.iter().filter(|outcome| !outcome.capdex_hit) {
        println!("  miss {} {:?}: {}", outcome.qid, outcome.question, outcome.capdex.join(", "));
        if !outcome.concepts.is_empty() {
            println!("       concepts: {}", outcome.concepts.join("; "));
        }
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    fn question(kind: QuestionKind, relevant: &[&str]) -> Question {
        Question {
            qid: "q".into(),
            kind,
            question: String::new(),
            relevant: relevant.iter().map(|key| key.to_string()).collect(),
        }
    }

    #[test]
    fn judging_direct_and_cross_questions() {
        let top = |keys: &[&str]| keys.iter().map(|key| key.to_string()).collect::<Vec<_>>();
        let direct = question(QuestionKind::Direct, &["a#x"]);
        assert_eq!(judge(&direct, &top(&["b#y", "c#z", "a#x"])), (true, 1.0));
        assert_eq!(judge(&direct, &top(&["b#y", "c#z", "d#w", "a#x"])), (false, 0.0));
        let cross = question(QuestionKind::Cross, &["a#x", "a#y", "b#z", "c#w"]);
        assert_eq!(judge(&cross, &top(&["a#x", "a#y", "q#q"])), (false, 0.5));
        assert_eq!(judge(&cross, &top(&["a#x", "c#w", "q#q"])), (true, 1.0));
    }
}
