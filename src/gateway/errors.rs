//! Error kinds and the one table that gives each its wire pair: the
//! `Nats-Service-Error-Code` status (HTTP-like) and the body's `code`.
//!
//! Every error reply is an [`ErrorKind`] and a message
//! ([`crate::gateway::wire::ApiError`]); [`ErrorKind::status_and_code`] is
//! the only place a status is written. The SCG's and dispatch
//! administration's errors (`ScgError::kind` in `actors::scg`, `AdminError`
//! in `actors::dispatcher`) are kinds too: their domain names the code, this
//! table the status. Dispatch *calls*
//! never fail this way: their refusals are `core::dispatch::ErrorCode`s in
//! the reply envelope. `docs/api.md` lists the table (checked by a test below).

use crate::core::turn_planner::PlanError;

/// What went wrong with a request, as the gateway answers it.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum ErrorKind {
    /// The request is malformed, or breaks a rule of its own fields.
    BadRequest,
    /// The payload is over `max_payload_bytes`.
    PayloadTooLarge,
    /// A bug or a storage failure (the message says which).
    Internal,
    /// The request is not served by this node's API.
    NotImplemented,
    /// An actor is not answering (shutting down), or the index log cannot be written.
    Unavailable,
    /// `plan` with `toolFailureMode: fail_closed`, and discovery failed.
    DiscoveryFailed,
    /// A mutation is in the index log but was not applied here in time.
    ApplyTimeout,
    /// The data dir is under its free-space reserve: writes are refused, reads work.
    StorageFull,
    /// The request breaks a rule of its domain; the domain names the code
    /// (an SCG map or memory error, an invalid capability record or binding).
    Invalid(&'static str),
    /// Reading a source by path is refused by the settings.
    Forbidden(&'static str),
    /// The request names something that does not exist (an approval, a
    /// capability, a memory anchor, an SCG node).
    NotFound(&'static str),
    /// The request conflicts with what is stored (a built-in, a registered
    /// capability, a decided approval).
    Conflict(&'static str),
    /// A source is over a size limit.
    TooLarge(&'static str),
    /// The SCG store failed.
    Storage,
}

impl ErrorKind {
    /// The gateway's own kinds (those whose pair this table defines).
    pub const GATEWAY: [ErrorKind; 8] = [
        ErrorKind::BadRequest,
        ErrorKind::PayloadTooLarge,
        ErrorKind::Internal,
        ErrorKind::NotImplemented,
        ErrorKind::Unavailable,
        ErrorKind::DiscoveryFailed,
        ErrorKind::ApplyTimeout,
        ErrorKind::StorageFull,
    ];

    /// The table: the `Nats-Service-Error-Code` status and the body's `code`.
    pub fn status_and_code(&self) -> (u16, &'static str) {
        match self {
            ErrorKind::BadRequest => (400, "bad_request"),
            ErrorKind::PayloadTooLarge => (413, "payload_too_large"),
            ErrorKind::Internal => (500, "internal"),
            ErrorKind::NotImplemented => (501, "not_implemented"),
            ErrorKind::Unavailable => (503, "unavailable"),
            ErrorKind::DiscoveryFailed => (503, "discovery_failed"),
            ErrorKind::ApplyTimeout => (504, "apply_timeout"),
            ErrorKind::StorageFull => (507, "storage_full"),
            ErrorKind::Invalid(code) => (400, code),
            ErrorKind::Forbidden(code) => (403, code),
            ErrorKind::NotFound(code) => (404, code),
            ErrorKind::Conflict(code) => (409, code),
            ErrorKind::TooLarge(code) => (413, code),
            ErrorKind::Storage => (500, "store"),
        }
    }
}

impl From<&PlanError> for ErrorKind {
    fn from(err: &PlanError) -> ErrorKind {
        match err {
            PlanError::DiscoveryFailed(_) => ErrorKind::DiscoveryFailed,
            PlanError::BadTaskOutcome(_) | PlanError::Contradiction(..) => ErrorKind::BadRequest,
        }
    }
}

/// Why the gateway could not connect to NATS or start serving.
#[derive(Debug, thiserror::Error)]
pub enum GatewayError {
    #[error("failed to connect to NATS at {url}: {source}")]
    Connect { url: String, source: async_nats::ConnectError },
    #[error("failed to start the NATS service {name}: {source}")]
    Service { name: String, source: async_nats::SubscribeError },
    #[error("failed to subscribe to {subject}: {source}")]
    Subscribe { subject: String, source: async_nats::SubscribeError },
    #[error("failed to add endpoint {subject}: {source}")]
    Endpoint { subject: String, source: async_nats::SubscribeError },
    #[error("setting {setting}: {problem}")]
    Credentials { setting: String, problem: String },
    #[error("no answer on {subject}: {problem} (is `capdex serve` running on this NATS?)")]
    Request { subject: String, problem: String },
    #[error("{subject} answered {code}: {message}")]
    Refused { subject: String, code: String, message: String },
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::collections::BTreeSet;

    /// The `| status | code | when |` rows of `docs/api.md`'s error table.
    fn documented_pairs() -> BTreeSet<(u16, String)> {
        let path = concat!(env!("CARGO_MANIFEST_DIR"), "/docs/api.md");
        let text = std::fs::read_to_string(path).expect("docs/api.md is readable");
        let mut pairs = BTreeSet::new();
        for line in text.lines() {
            let cells: Vec<&str> = line.split('|').map(str::trim).collect();
            let [_, status, codes, _when, _] = cells.as_slice() else { continue };
            let Ok(status) = status.parse::<u16>() else { continue };
            for code in codes.split(',').map(|code| code.trim().trim_matches('`')) {
                pairs.insert((status, code.to_string()));
            }
        }
        pairs
    }

    #[test]
    fn every_gateway_kind_is_in_the_documented_table() {
        let documented = documented_pairs();
        assert!(documented.len() >= ErrorKind::GATEWAY.len(), "the table was not found: {documented:?}");
        for kind in ErrorKind::GATEWAY {
            let (status, code) = kind.status_and_code();
            assert!(
                documented.contains(&(status, code.to_string())),
                "{kind:?} ({status} {code}) is not in docs/api.md"
            );
        }
    }

    #[test]
    fn every_documented_pair_is_a_gateway_kind() {
        let defined: BTreeSet<(u16, String)> = ErrorKind::GATEWAY
            .iter()
            .map(|kind| kind.status_and_code())
            .map(|(status, code)| (status, code.to_string()))
            .collect();
        for pair in documented_pairs() {
            assert!(defined.contains(&pair), "docs/api.md lists {pair:?}, which no gateway kind answers");
        }
    }

    #[test]
    fn gateway_codes_are_distinct() {
        let codes: BTreeSet<&str> = ErrorKind::GATEWAY.iter().map(|kind| kind.status_and_code().1).collect();
        assert_eq!(codes.len(), ErrorKind::GATEWAY.len());
    }

    #[test]
    fn plan_errors_map_by_variant() {
        let failed = PlanError::DiscoveryFailed("down".into());
        assert_eq!(ErrorKind::from(&failed).status_and_code(), (503, "discovery_failed"));
        assert_eq!(ErrorKind::from(&PlanError::BadTaskOutcome(2.0)).status_and_code(), (400, "bad_request"));
        assert_eq!(ErrorKind::from(&PlanError::Contradiction("failed", true)), ErrorKind::BadRequest);
    }

    #[test]
    fn domain_kinds_take_their_status_from_the_table() {
        assert_eq!(ErrorKind::NotFound("unknown_anchor").status_and_code(), (404, "unknown_anchor"));
        assert_eq!(ErrorKind::Conflict("already_registered").status_and_code(), (409, "already_registered"));
        assert_eq!(ErrorKind::Invalid("invalid_binding").status_and_code(), (400, "invalid_binding"));
        assert_eq!(ErrorKind::Forbidden("path_not_allowed").status_and_code(), (403, "path_not_allowed"));
        assert_eq!(ErrorKind::TooLarge("too_large").status_and_code(), (413, "too_large"));
        assert_eq!(ErrorKind::Storage.status_and_code(), (500, "store"));
    }
}
