//! Approvals that complete: a `requires_approval` answer creates a pending
//! approval bound to the capability, the agent, the digest of the arguments,
//! the capability's policy version and an expiry. Approve or reject decides it
//! once; an approved approval runs exactly that call, once.
//!
//! The bookkeeping is here too: [`request`] makes the approval a call asks
//! for (with the call's arguments as provenance would show them, so a person
//! sees what they approve), [`consumed`] is an approval once its call runs,
//! [`decide`] approves or rejects and records who did ([`check_decider`]),
//! and [`is_open`] says what is still waiting for a decision.
//!
//! `arguments` and `decidedBy` were added later: both default to `None`, so
//! an approval stored before (sled, the approvals bucket) still decodes.

use crate::core::dispatch::redact;
use crate::core::dispatch::registry::CapabilityRecord;
use serde::{Deserialize, Serialize};
use serde_json::Value;
use sha2::{Digest, Sha256};

#[derive(Clone, Copy, Debug, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "lowercase")]
pub enum ApprovalStatus {
    Pending,
    Approved,
    Rejected,
    /// Approved and run; it permits nothing more.
    Used,
}

/// One approval.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct Approval {
    pub id: String,
    pub slug: String,
    pub agent_id: String,
    /// [`args_digest`] of the arguments it was asked for.
    pub args_digest: String,
    pub policy_version: u64,
    pub created_at_ms: u64,
    pub expires_at_ms: u64,
    pub status: ApprovalStatus,
    #[serde(default)]
    pub decided_at_ms: Option<u64>,
    /// The call's arguments, redacted as provenance redacts them
    /// ([`redact::redact_arguments`]); `None` for an approval stored by an
    /// older version. Larger than [`MAX_SHOWN_ARGUMENT_BYTES`] as JSON, they
    /// are replaced by a string saying so.
    #[serde(default)]
    pub arguments: Option<Value>,
    /// Who approved or rejected it (see [`check_decider`]); `None` while pending
    /// and for an approval decided by an older version.
    #[serde(default)]
    pub decided_by: Option<String>,
}

/// The most bytes of redacted arguments (as JSON) an approval keeps.
pub const MAX_SHOWN_ARGUMENT_BYTES: usize = 16 * 1024;

/// Why an approval does not permit a call, or cannot be decided.
#[derive(Clone, Debug, PartialEq, Eq, thiserror::Error)]
pub enum ApprovalProblem {
    #[error("approval {0} is unknown")]
    Unknown(String),
    #[error("approval {0} has expired")]
    Expired(String),
    #[error("approval {0} is still pending")]
    Pending(String),
    #[error("approval {0} was rejected")]
    Rejected(String),
    #[error("approval {0} was already used")]
    Used(String),
    #[error("approval {0} was already decided")]
    AlreadyDecided(String),
    #[error("approval {id} was given for other {what}")]
    Mismatch { id: String, what: &'static str },
    /// The decider is the agent whose call waits: an agent never approves its own call.
    #[error("approval {id} is for a call of agent {agent}, who may not approve it")]
    SelfApproval { id: String, agent: String },
}

/// Why a decision's `by` was refused.
#[derive(Clone, Debug, PartialEq, Eq, thiserror::Error)]
pub enum DeciderProblem {
    #[error("by must not be blank")]
    Blank,
    /// Longer than `[limits] max_id_bytes` (the decider is an id from outside).
    #[error("by {}", crate::core::subject_token::too_long_text(.0))]
    TooLong(crate::core::limits::LimitExceeded),
    #[error("by must be printable (no control characters)")]
    NotPrintable,
}

/// Checks who a decision names: not blank, at most `max_id_bytes` bytes
/// (`[limits]`), no control characters.
pub fn check_decider(by: &str, max_id_bytes: usize) -> Result<(), DeciderProblem> {
    if by.trim().is_empty() {
        Err(DeciderProblem::Blank)
    } else if let Err(exceeded) = crate::core::subject_token::check_len(by, max_id_bytes) {
        Err(DeciderProblem::TooLong(exceeded))
    } else if by.chars().any(char::is_control) {
        Err(DeciderProblem::NotPrintable)
    } else {
        Ok(())
    }
}

/// What an approval shows of its call's arguments: redacted under `record`'s
/// rule exactly as provenance is, and bounded to [`MAX_SHOWN_ARGUMENT_BYTES`].
pub fn shown_arguments(record: &CapabilityRecord, args: &Value) -> Value {
    let shown = redact::redact_arguments(record.redaction.as_ref(), args);
    let bytes = serde_json::to_vec(&shown).map_or(usize::MAX, |json| json.len());
    if bytes > MAX_SHOWN_ARGUMENT_BYTES {
        return Value::String(format!("[omitted: {bytes} bytes of arguments]"));
    }
    shown
}

/// SHA-256 (hex) of the arguments in canonical JSON (object keys sorted at every depth).
pub fn args_digest(args: &Value) -> String {
    let mut text = String::new();
    canonical_json(args, &mut text);
    hex(&Sha256::digest(text.as_bytes()))
}

fn hex(bytes: &[u8]) -> String {
    bytes.iter().map(|b| format!("{b:02x}")).collect()
}

fn canonical_json(value: &Value, out: &mut String) {
    match value {
        Value::Object(map) => {
            let mut keys: Vec<&String> = map.keys().collect();
            keys.sort();
            out.push('{');
            for (i, key) in keys.into_iter().enumerate() {
                if i > 0 {
                    out.push(',');
                }
                out.push_str(&Value::String(key.clone()).to_string());
                out.push(':');
                canonical_json(&map[key], out);
            }
            out.push('}');
        }
        Value::Array(items) => {
            out.push('[');
            for (i, item) in items.iter().enumerate() {
                if i > 0 {
                    out.push(',');
                }
                canonical_json(item, out);
            }
            out.push(']');
        }
        scalar => out.push_str(&scalar.to_string()),
    }
}

/// An approval id from unpredictable `seed` bytes (the shell supplies them): 32 hex digits.
pub fn approval_id(seed: &[u8]) -> String {
    hex(&Sha256::digest(seed)[..16])
}

/// A pending approval for this call.
pub fn pending(
    id: String,
    slug: &str,
    agent_id: &str,
    args: &Value,
    policy_version: u64,
    now_ms: u64,
    ttl_ms: u64,
) -> Approval {
    Approval {
        id,
        slug: slug.to_string(),
        agent_id: agent_id.to_string(),
        args_digest: args_digest(args),
        policy_version,
        created_at_ms: now_ms,
        expires_at_ms: now_ms.saturating_add(ttl_ms),
        status: ApprovalStatus::Pending,
        decided_at_ms: None,
        arguments: None,
        decided_by: None,
    }
}

/// The pending approval a call to `record` that carries none asks for: it
/// expires after the capability's `approvalTimeoutMs`, else after `default_ttl_ms`.
pub fn request(
    id: String,
    record: &CapabilityRecord,
    agent_id: &str,
    args: &Value,
    now_ms: u64,
    default_ttl_ms: u64,
) -> Approval {
    let ttl_ms = record.approval_timeout_ms.unwrap_or(default_ttl_ms);
    let asked = pending(id, &record.slug, agent_id, args, record.policy_version, now_ms, ttl_ms);
    Approval { arguments: Some(shown_arguments(record, args)), ..asked }
}

/// The approval once the call it permits runs: it permits nothing more.
pub fn consumed(approval: &Approval) -> Approval {
    Approval { status: ApprovalStatus::Used, ..approval.clone() }
}

/// True while an approval waits for a decision: pending and unexpired.
pub fn is_open(approval: &Approval, now_ms: u64) -> bool {
    approval.status == ApprovalStatus::Pending && now_ms < approval.expires_at_ms
}

/// Approves or rejects a pending, unexpired approval on behalf of `by`
/// (checked by the caller with [`check_decider`]). `by` may reject its own
/// call but never approve it ([`ApprovalProblem::SelfApproval`]).
pub fn decide(approval: &mut Approval, approve: bool, now_ms: u64, by: &str) -> Result<(), ApprovalProblem> {
    if approve && by == approval.agent_id {
        return Err(ApprovalProblem::SelfApproval { id: approval.id.clone(), agent: approval.agent_id.clone() });
    }
    if approval.status != ApprovalStatus::Pending {
        return Err(ApprovalProblem::AlreadyDecided(approval.id.clone()));
    }
    if now_ms >= approval.expires_at_ms {
        return Err(ApprovalProblem::Expired(approval.id.clone()));
    }
    approval.status = if approve { ApprovalStatus::Approved } else { ApprovalStatus::Rejected };
    approval.decided_at_ms = Some(now_ms);
    approval.decided_by = Some(by.to_string());
    Ok(())
}

/// Checks that `approval` permits exactly this call now; the caller then marks it used.
pub fn permits(
    approval: &Approval,
    slug: &str,
    agent_id: &str,
    args: &Value,
    policy_version: u64,
    now_ms: u64,
) -> Result<(), ApprovalProblem> {
    let id = || approval.id.clone();
    match approval.status {
        ApprovalStatus::Pending => return Err(ApprovalProblem::Pending(id())),
        ApprovalStatus::Rejected => return Err(ApprovalProblem::Rejected(id())),
        ApprovalStatus::Used => return Err(ApprovalProblem::Used(id())),
        ApprovalStatus::Approved => {}
    }
    if now_ms >= approval.expires_at_ms {
        return Err(ApprovalProblem::Expired(id()));
    }
    let mismatch = |what| Err(ApprovalProblem::Mismatch { id: id(), what });
    if approval.slug != slug {
        return mismatch("capability");
    }
    if approval.agent_id != agent_id {
        return mismatch("agent");
    }
    if approval.policy_version != policy_version {
        return mismatch("policy version");
    }
    if approval.args_digest != args_digest(args) {
        return mismatch("arguments");
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::json;

    #[test]
    fn an_approval_permits_one_exact_call() {
        let args = json!({"amount": 5, "order": "o-1"});
        let mut approval = pending("id1".into(), "refund", "agent", &args, 3, 1_000, 500);
        assert_eq!(permits(&approval, "refund", "agent", &args, 3, 1_100), Err(ApprovalProblem::Pending("id1".into())));
        decide(&mut approval, true, 1_100, "ops").unwrap();
        assert_eq!(approval.decided_by.as_deref(), Some("ops"));
        assert_eq!(decide(&mut approval, false, 1_100, "other"), Err(ApprovalProblem::AlreadyDecided("id1".into())));
        // Key order does not change the digest.
        assert_eq!(permits(&approval, "refund", "agent", &json!({"order": "o-1", "amount": 5}), 3, 1_200), Ok(()));
        let refused = |slug, agent, args: &Value, version, now| permits(&approval, slug, agent, args, version, now);
        assert!(matches!(
            refused("refund", "agent", &json!({"amount": 6, "order": "o-1"}), 3, 1_200),
            Err(ApprovalProblem::Mismatch { what: "arguments", .. })
        ));
        assert!(matches!(
            refused("other", "agent", &args, 3, 1_200),
            Err(ApprovalProblem::Mismatch { what: "capability", .. })
        ));
        assert!(matches!(
            refused("refund", "b", &args, 3, 1_200),
            Err(ApprovalProblem::Mismatch { what: "agent", .. })
        ));
        assert!(matches!(
            refused("refund", "agent", &args, 4, 1_200),
            Err(ApprovalProblem::Mismatch { what: "policy version", .. })
        ));
        assert_eq!(refused("refund", "agent", &args, 3, 1_500), Err(ApprovalProblem::Expired("id1".into())));
        approval.status = ApprovalStatus::Used;
        assert_eq!(permits(&approval, "refund", "agent", &args, 3, 1_200), Err(ApprovalProblem::Used("id1".into())));
        let mut late = pending("id2".into(), "refund", "agent", &args, 3, 0, 10);
        assert_eq!(decide(&mut late, true, 10, "ops"), Err(ApprovalProblem::Expired("id2".into())));
        assert_eq!(approval_id(b"seed").len(), 32);
    }

    #[test]
    fn an_agent_never_approves_its_own_call_but_may_reject_it() {
        let args = json!({"amount": 5});
        let mut own = pending("id3".into(), "refund", "alpha", &args, 1, 1_000, 500);
        assert_eq!(
            decide(&mut own, true, 1_100, "alpha"),
            Err(ApprovalProblem::SelfApproval { id: "id3".into(), agent: "alpha".into() })
        );
        assert_eq!(own.status, ApprovalStatus::Pending, "a refused decision changes nothing");
        decide(&mut own, false, 1_100, "alpha").unwrap();
        assert_eq!(own.status, ApprovalStatus::Rejected);
        let mut other = pending("id4".into(), "refund", "alpha", &args, 1, 1_000, 500);
        decide(&mut other, true, 1_100, "beta").unwrap();
        assert_eq!(other.status, ApprovalStatus::Approved);
    }

    #[test]
    fn a_request_takes_the_capability_s_timeout_and_is_open_until_decided_or_expired() {
        use crate::core::dispatch::registry::tests::record;
        let args = json!({"q": "x"});
        let mut gated = record("refund");
        gated.policy_version = 4;
        let asked = request("id1".into(), &gated, "agent", &args, 1_000, 500);
        let expected = pending("id1".into(), "refund", "agent", &args, 4, 1_000, 500);
        assert_eq!(asked, Approval { arguments: Some(args.clone()), ..expected });
        gated.approval_timeout_ms = Some(20);
        let mut quick = request("id2".into(), &gated, "agent", &args, 1_000, 500);
        assert_eq!(quick.expires_at_ms, 1_020);
        assert!(is_open(&quick, 1_019) && !is_open(&quick, 1_020));
        decide(&mut quick, true, 1_010, "ops").unwrap();
        assert!(!is_open(&quick, 1_011), "decided");
        assert_eq!(permits(&quick, "refund", "agent", &args, 4, 1_011), Ok(()));
        let used = consumed(&quick);
        assert_eq!(used.status, ApprovalStatus::Used);
        assert_eq!(permits(&used, "refund", "agent", &args, 4, 1_011), Err(ApprovalProblem::Used("id2".into())));
    }

    #[test]
    fn an_approval_shows_its_arguments_redacted_as_provenance_does() {
        use crate::core::dispatch::registry::{tests::record, RedactionRule};
        let mut gated = record("refund");
        gated.redaction = Some(RedactionRule { redact_keys: vec!["apiKey".into()], ..Default::default() });
        let args = json!({"apiKey": "sk-live-123", "note": "mail bob@corp.io, Authorization: Bearer tok-9", "n": 2});
        let asked = request("id1".into(), &gated, "agent", &args, 1_000, 500);
        let shown = asked.arguments.clone().unwrap();
        let text = shown.to_string();
        assert!(!text.contains("sk-live-123") && !text.contains("bob@corp.io") && !text.contains("tok-9"), "{text}");
        assert_eq!(shown["apiKey"], "[redacted:apiKey]");
        assert_eq!(shown["n"], 2);
        assert_eq!(shown, redact::redact_for_provenance(gated.redaction.as_ref(), &args, &Value::Null, &[]).0);
        // The digest is still of the arguments as given, so the approval permits exactly that call.
        assert_eq!(asked.args_digest, args_digest(&args));
        let huge = json!({"blob": "x".repeat(MAX_SHOWN_ARGUMENT_BYTES)});
        let big = request("id2".into(), &gated, "agent", &huge, 1_000, 500);
        assert!(big.arguments.unwrap().as_str().unwrap().starts_with("[omitted: "));
    }

    #[test]
    fn an_approval_stored_by_an_older_version_still_decodes() {
        // As an earlier version wrote it into the approvals bucket (JSON), without arguments or decidedBy.
        let old = r#"{"id":"ab12","slug":"refund","agentId":"agent","argsDigest":"00","policyVersion":1,
            "createdAtMs":1,"expiresAtMs":2,"status":"approved","decidedAtMs":1}"#;
        let approval: Approval = serde_json::from_str(old).unwrap();
        assert_eq!((approval.arguments, approval.decided_by), (None, None));
        assert_eq!((approval.status, approval.decided_at_ms), (ApprovalStatus::Approved, Some(1)));
        let written = serde_json::to_value(pending("id".into(), "s", "a", &json!({}), 1, 0, 1)).unwrap();
        assert!(written.get("decidedBy").is_some() && written.get("arguments").is_some(), "{written}");
    }

    #[test]
    fn deciders_are_checked() {
        assert_eq!(check_decider("alice@ops", 128), Ok(()));
        assert_eq!(check_decider("nats", 128), Ok(()));
        assert_eq!(check_decider("  ", 128), Err(DeciderProblem::Blank));
        assert_eq!(check_decider("a\nb", 128), Err(DeciderProblem::NotPrintable));
        assert_eq!(check_decider("a\u{7f}", 128), Err(DeciderProblem::NotPrintable));
    }

    #[test]
    fn a_decider_at_max_id_bytes_passes_and_one_byte_more_is_refused_naming_the_setting() {
        use crate::core::limits::{Limit, LimitExceeded};
        for max in [64, 70, 128, 256] {
            // Bytes, not characters: 'é' is two.
            let by = |len: usize| "é".repeat(len / 2) + &"x".repeat(len % 2);
            assert_eq!(check_decider(&by(max), max), Ok(()), "{max}");
            let refused = check_decider(&by(max + 1), max).unwrap_err();
            assert_eq!(refused, DeciderProblem::TooLong(LimitExceeded { limit: Limit::IdBytes, found: max + 1, max }));
            assert_eq!(
                refused.to_string(),
                format!("by is {} bytes, over limits.max_id_bytes: at most {max}", max + 1)
            );
        }
    }
}
