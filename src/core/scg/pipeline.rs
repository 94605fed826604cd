//! The map pipeline's pure parts: its phases and progress events, the connect
//! phase's handling of a connector descriptor (credentials are counted and dropped,
//! never kept), the server-side path rule, and the map report.
//!
//! Phases, in order: connect (check the source id, kind and connector descriptor;
//! drop the descriptor), introspect (take the source text from the request or an
//! allowed path), parse (one mapper per kind), link (TypeAligner and CONSUMES over
//! every mapped source), finalize (store the source and links atomically, embed the
//! nodes for routing). The actors in `actors::scg` run them and send one event when
//! each phase starts and one when it ends.

use super::align::Links;
use super::model::{EdgeKind, NodeKind, SourceGraph, SourceKind};
use serde::{Deserialize, Serialize};
use serde_json::Value;
use std::collections::BTreeMap;
use std::path::{Path, PathBuf};

/// The most keys, at any depth, a connector descriptor may hold.
pub const MAX_CONNECTION_KEYS: usize = 256;
/// The deepest a connector descriptor may nest.
pub const MAX_CONNECTION_DEPTH: usize = 8;

/// One phase of the map pipeline.
#[derive(Clone, Copy, Debug, PartialEq, Eq, PartialOrd, Ord, Hash, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum Phase {
    Connect,
    Introspect,
    Parse,
    Link,
    Finalize,
}

impl Phase {
    /// Every phase, in pipeline order.
    pub const ALL: [Phase; 5] = [Phase::Connect, Phase::Introspect, Phase::Parse, Phase::Link, Phase::Finalize];

    /// Returns the phase's name.
    pub fn as_str(self) -> &'static str {
        match self {
            Phase::Connect => "connect",
            Phase::Introspect => "introspect",
            Phase::Parse => "parse",
            Phase::Link => "link",
            Phase::Finalize => "finalize",
        }
    }
}

/// Where a phase is.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum PhaseStatus {
    Started,
    Done,
    Failed,
}

/// A progress event of the map pipeline (published on `<prefix>.events.scg`).
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct ScgEvent {
    pub source_id: String,
    pub phase: Phase,
    pub status: PhaseStatus,
    pub at_ms: u64,
    /// Set when the phase ended.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub elapsed_ms: Option<f64>,
    /// Counts the phase produced (bytes read, nodes, edges, links...).
    #[serde(default, skip_serializing_if = "BTreeMap::is_empty")]
    pub counts: BTreeMap<String, u64>,
    /// The error code and message when the phase failed.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub error: Option<PhaseError>,
}

/// Why a phase failed, as sent in events.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
pub struct PhaseError {
    pub code: String,
    pub message: String,
}

/// A connector descriptor the connect phase refused.
#[derive(Clone, Debug, PartialEq, thiserror::Error)]
pub enum ConnectError {
    #[error("connection must be a JSON object")]
    NotAnObject,
    #[error("connection nests deeper than {MAX_CONNECTION_DEPTH} levels")]
    TooDeep,
    #[error("connection has more than {MAX_CONNECTION_KEYS} keys")]
    TooManyKeys,
}

/// What the connect phase kept of a connector descriptor: nothing but counts.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct ConnectReport {
    /// Keys in the descriptor.
    pub keys: usize,
    /// Keys that looked like credentials (tokens, secrets, passwords, keys, authorization...).
    pub credential_fields: usize,
}

/// Returns whether a key names a credential.
pub fn is_credential_key(key: &str) -> bool {
    let folded: String = key.chars().filter(|c| c.is_ascii_alphanumeric()).collect::<String>().to_ascii_lowercase();
    [
        "token",
        "secret",
        "password",
        "passwd",
        "passphrase",
        "apikey",
        "authorization",
        "auth",
        "credential",
        "cookie",
        "privatekey",
        "bearer",
        "signature",
        "session",
        "dsn",
    ]
    .iter()
    .any(|word| folded.contains(word))
        || folded.ends_with("key")
}

/// Checks a connector descriptor and counts its credential-like keys. The descriptor
/// itself is dropped by the caller: nothing of it enters the graph.
pub fn check_connection(connection: Option<&Value>) -> Result<ConnectReport, ConnectError> {
    let Some(connection) = connection else { return Ok(ConnectReport::default()) };
    if !connection.is_object() {
        return Err(ConnectError::NotAnObject);
    }
    let mut report = ConnectReport::default();
    walk(connection, 0, &mut report)?;
    Ok(report)
}

fn walk(value: &Value, depth: usize, report: &mut ConnectReport) -> Result<(), ConnectError> {
    if depth > MAX_CONNECTION_DEPTH {
        return Err(ConnectError::TooDeep);
    }
    match value {
        Value::Object(map) => {
            for (key, child) in map {
                report.keys += 1;
                if report.keys > MAX_CONNECTION_KEYS {
                    return Err(ConnectError::TooManyKeys);
                }
                if is_credential_key(key) {
                    report.credential_fields += 1;
                }
                walk(child, depth + 1, report)?;
            }
        }
        Value::Array(items) => {
            for item in items {
                walk(item, depth + 1, report)?;
            }
        }
        _ => {}
    }
    Ok(())
}

/// Returns whether a canonical path lies inside one of the canonical roots.
pub fn path_allowed(path: &Path, roots: &[PathBuf]) -> bool {
    roots.iter().any(|root| path.starts_with(root))
}

/// Cross-source link counts.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct LinkCounts {
    pub entity_resolves_to: usize,
    pub field_resolves_to: usize,
    pub consumes: usize,
    pub pairs_compared: usize,
}

impl LinkCounts {
    /// Counts a set of links.
    pub fn of(links: &Links) -> LinkCounts {
        LinkCounts {
            entity_resolves_to: links.n_entity_edges,
            field_resolves_to: links.resolves_to.len() - links.n_entity_edges,
            consumes: links.consumes.len(),
            pairs_compared: links.n_pairs_compared,
        }
    }
}

/// What mapping one source gave.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct MapReport {
    pub source_id: String,
    pub kind: SourceKind,
    pub drift_hash: String,
    /// Whether the drift hash differs from the previous map of this source (true for a first map).
    pub changed: bool,
    pub workspaces: Vec<String>,
    pub nodes: usize,
    pub edges: usize,
    pub node_counts: BTreeMap<String, usize>,
    pub edge_counts: BTreeMap<String, usize>,
    /// Sources mapped, this one included.
    pub sources: usize,
    pub links: LinkCounts,
    pub connection: ConnectReport,
    /// Milliseconds per phase, in pipeline order.
    pub phase_ms: BTreeMap<String, f64>,
}

/// Counts a graph's nodes and edges by kind.
pub fn kind_counts(graph: &SourceGraph) -> (BTreeMap<String, usize>, BTreeMap<String, usize>) {
    let nodes = [NodeKind::Source, NodeKind::EntityType, NodeKind::Field, NodeKind::Capability, NodeKind::RouteRecipe]
        .into_iter()
        .map(|kind| (kind.as_str().to_string(), graph.count_nodes(kind)))
        .collect();
    let edges = EdgeKind::ALL.into_iter().map(|kind| (kind.as_str().to_string(), graph.count_edges(kind))).collect();
    (nodes, edges)
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::json;

    #[test]
    fn credentials_are_counted_and_descriptors_checked() {
        let connection = json!({
            "baseUrl": "https://git.example.com",
            "headers": {"Authorization": "Bearer s3cr3t", "X-Api-Key": "k"},
            "token": "t", "client_secret": "c", "user": "me", "password": "p",
            "pool": [{"dsn": "postgres://u:p@h/db"}]
        });
        let report = check_connection(Some(&connection)).unwrap();
        assert_eq!(report.credential_fields, 6, "{report:?}");
        assert_eq!(report.keys, 10);
        assert_eq!(check_connection(None).unwrap(), ConnectReport::default());
        assert_eq!(check_connection(Some(&json!("x"))), Err(ConnectError::NotAnObject));
        let mut deep = json!({});
        for _ in 0..20 {
            deep = json!({ "a": deep });
        }
        assert_eq!(check_connection(Some(&deep)), Err(ConnectError::TooDeep));
        let wide: serde_json::Map<String, Value> = (0..300).map(|at| (format!("k{at}"), json!(1))).collect();
        assert_eq!(check_connection(Some(&Value::Object(wide))), Err(ConnectError::TooManyKeys));
        assert!(!is_credential_key("baseUrl") && !is_credential_key("user") && is_credential_key("apiKey"));
    }

    #[test]
    fn paths_must_lie_under_a_root() {
        let roots = [PathBuf::from("/srv/specs")];
        assert!(path_allowed(Path::new("/srv/specs/gitea.json"), &roots));
        assert!(!path_allowed(Path::new("/srv/specs-other/x.json"), &roots));
        assert!(!path_allowed(Path::new("/etc/passwd"), &roots));
        assert!(!path_allowed(Path::new("/srv/specs/x.json"), &[]));
    }
}
