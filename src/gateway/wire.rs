//! API boundary: the v1 request and reply shapes on NATS, in JSON with
//! camelCase fields. Core types are reused where their shape is the wire shape.

use crate::core::descriptor::CapabilityKind;
use crate::core::discovery::DiscoveryFilter;
use serde::{Deserialize, Serialize};

/// The longest discovery query accepted, in characters.
pub const MAX_QUERY_CHARS: usize = 16 * 1024;

/// `capdex.v1.discover` request.
#[derive(Clone, Debug, Default, PartialEq, Deserialize, Serialize)]
#[serde(rename_all = "camelCase", deny_unknown_fields)]
pub struct DiscoverRequest {
    /// The user's message for this turn.
    #[serde(alias = "query")]
    pub message: String,
    /// `tool`, `skill`, `extension`, `channel`, ... or `any` (the default).
    #[serde(default)]
    pub kind: Option<String>,
    #[serde(default)]
    pub category: Option<String>,
    #[serde(default)]
    pub only_available: bool,
    #[serde(default)]
    pub excluded_capability_ids: Vec<String>,
}

impl DiscoverRequest {
    /// Validates the request and returns the core filter.
    pub fn filter(&self) -> Result<DiscoveryFilter, ApiError> {
        if self.message.trim().is_empty() {
            return Err(ApiError::bad_request("message must not be empty"));
        }
        if self.message.chars().count() > MAX_QUERY_CHARS {
            return Err(ApiError::bad_request(format!("message is longer than {MAX_QUERY_CHARS} characters")));
        }
        let kind = match self.kind.as_deref() {
            None | Some("any") => None,
            Some(text) => Some(
                CapabilityKind::parse(text).ok_or_else(|| ApiError::bad_request(format!("unknown kind {text:?}")))?,
            ),
        };
        Ok(DiscoveryFilter {
            kind,
            category: self.category.clone(),
            only_available: self.only_available,
            excluded_capability_ids: self.excluded_capability_ids.clone(),
        })
    }
}

/// An error reply body: a stable code and a human-readable message. The
/// reply also carries `Nats-Service-Error` and `Nats-Service-Error-Code` headers.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
pub struct ApiError {
    pub code: String,
    pub message: String,
    /// The numeric code for the `Nats-Service-Error-Code` header (HTTP-like).
    #[serde(skip)]
    pub status: u16,
}

impl ApiError {
    pub fn new(status: u16, code: impl Into<String>, message: impl Into<String>) -> ApiError {
        ApiError { code: code.into(), message: message.into(), status }
    }

    pub fn bad_request(message: impl Into<String>) -> ApiError {
        ApiError::new(400, "bad_request", message)
    }

    pub fn internal(message: impl Into<String>) -> ApiError {
        ApiError::new(500, "internal", message)
    }
}

/// Decodes a JSON request, turning every failure into a `bad_request`.
pub fn decode<T: serde::de::DeserializeOwned>(payload: &[u8], max_bytes: usize) -> Result<T, ApiError> {
    if payload.len() > max_bytes {
        return Err(ApiError::new(
            413,
            "payload_too_large",
            format!("payload is {} bytes, the limit is {max_bytes}", payload.len()),
        ));
    }
    serde_json::from_slice(payload).map_err(|err| ApiError::bad_request(format!("malformed request: {err}")))
}

/// `capdex.v1.outcome` reply.
#[derive(Clone, Debug, PartialEq, Serialize)]
#[serde(rename_all = "camelCase")]
pub struct OutcomeReply {
    pub accepted: bool,
    pub kpi: crate::core::kpi_window::Kpi,
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn requests_decode_and_validate() {
        let request: DiscoverRequest =
            decode(br#"{"message":"send a telegram","kind":"channel","onlyAvailable":true}"#, 1024).unwrap();
        assert_eq!(request.filter().unwrap().kind, Some(CapabilityKind::Channel));
        let request: DiscoverRequest = decode(br#"{"query":"x"}"#, 1024).unwrap();
        assert_eq!(request.message, "x");
        assert_eq!(decode::<DiscoverRequest>(b"{not json", 1024).unwrap_err().code, "bad_request");
        assert_eq!(decode::<DiscoverRequest>(br#"{"message":"x","bogus":1}"#, 1024).unwrap_err().code, "bad_request");
        assert_eq!(decode::<DiscoverRequest>(&[b' '; 2000], 1024).unwrap_err().code, "payload_too_large");
        let bad_kind = DiscoverRequest { message: "x".into(), kind: Some("gadget".into()), ..Default::default() };
        assert_eq!(bad_kind.filter().unwrap_err().code, "bad_request");
        assert_eq!(DiscoverRequest::default().filter().unwrap_err().code, "bad_request");
    }
}
