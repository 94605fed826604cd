//! Who may use the console, and which changes it accepts.
//!
//! - **Sign-in.** With a token configured, an operator signs in once with it
//!   and gets a session id in an `HttpOnly`, `SameSite=Strict` cookie
//!   ([`Sessions`]); without a token the console serves loopback only and
//!   every request shares the one session [`LOCAL_SESSION`].
//! - **Cross-site request forgery.** Every change is a POST that must carry
//!   the session's CSRF token ([`csrf_token`]: HMAC-SHA-256 of the session id
//!   under a secret drawn at start) in a form field or header, and its
//!   `Origin` (when sent) must be the console's own, and `Sec-Fetch-Site`
//!   (when sent) must not say another site ([`check_change`]). A token never
//!   leaves a page the same origin served, so another site can neither read
//!   nor forge it.
//!
//! The shell draws the randomness (secret, session ids) and reads the
//! headers; the rules are here.

use sha2::{Digest, Sha256};
use std::collections::HashMap;

/// The session of a console that asks for no sign-in (loopback only).
pub const LOCAL_SESSION: &str = "local";

/// The name of the session cookie.
pub const SESSION_COOKIE: &str = "capdex-console";

/// How long a signed-in session lasts, in milliseconds (12 hours).
pub const SESSION_TTL_MS: u64 = 12 * 3_600_000;

/// The most sessions kept at once; the oldest goes first.
pub const MAX_SESSIONS: usize = 1_024;

/// HMAC-SHA-256 of `message` under `key` (RFC 2104), as lowercase hex.
pub fn hmac_sha256_hex(key: &[u8], message: &[u8]) -> String {
    const BLOCK: usize = 64;
    let mut block = [0u8; BLOCK];
    if key.len() > BLOCK {
        block[..32].copy_from_slice(&Sha256::digest(key));
    } else {
        block[..key.len()].copy_from_slice(key);
    }
    let pad = |byte: u8| block.map(|b| b ^ byte);
    let inner = Sha256::new().chain_update(pad(0x36)).chain_update(message).finalize();
    let outer = Sha256::new().chain_update(pad(0x5c)).chain_update(inner).finalize();
    outer.iter().map(|b| format!("{b:02x}")).collect()
}

/// The CSRF token of `session` under `secret`.
pub fn csrf_token(secret: &[u8], session: &str) -> String {
    hmac_sha256_hex(secret, format!("capdex-console-csrf:{session}").as_bytes())
}

/// Compares two texts in time that depends only on their lengths.
pub fn same_secret(given: &str, expected: &str) -> bool {
    let (given, expected) = (given.as_bytes(), expected.as_bytes());
    if given.len() != expected.len() {
        return false;
    }
    given.iter().zip(expected).fold(0u8, |acc, (a, b)| acc | (a ^ b)) == 0
}

/// What a change request carries that the CSRF check reads.
#[derive(Clone, Debug, Default)]
pub struct ChangeRequest<'a> {
    /// The token from the form field `csrf` or the `X-Csrf-Token` header.
    pub token: Option<&'a str>,
    /// The `Origin` header.
    pub origin: Option<&'a str>,
    /// The `Host` header.
    pub host: Option<&'a str>,
    /// The `Sec-Fetch-Site` header.
    pub fetch_site: Option<&'a str>,
}

/// Why a change was refused.
#[derive(Clone, Debug, PartialEq, Eq, thiserror::Error)]
pub enum CsrfRefusal {
    #[error("the request carries no CSRF token")]
    MissingToken,
    #[error("the request's CSRF token is not this session's")]
    WrongToken,
    #[error("the request comes from another site ({0})")]
    CrossSite(String),
    #[error("the request's origin {origin} is not this console's ({host})")]
    ForeignOrigin { origin: String, host: String },
}

/// Checks a change (a POST) of `session` against forgery: [`check_origin`], then the token.
pub fn check_change(secret: &[u8], session: &str, request: &ChangeRequest<'_>) -> Result<(), CsrfRefusal> {
    check_origin(request)?;
    let token = request.token.filter(|t| !t.is_empty()).ok_or(CsrfRefusal::MissingToken)?;
    if same_secret(token, &csrf_token(secret, session)) {
        Ok(())
    } else {
        Err(CsrfRefusal::WrongToken)
    }
}

/// Refuses a request that says it comes from another site: a `Sec-Fetch-Site`
/// other than `same-origin` or `none`, or an `Origin` that is not the `Host`'s
/// (the sign-in form, which has no session yet, is checked by this alone).
pub fn check_origin(request: &ChangeRequest<'_>) -> Result<(), CsrfRefusal> {
    if let Some(site) = request.fetch_site {
        if !matches!(site, "same-origin" | "none") {
            return Err(CsrfRefusal::CrossSite(site.to_string()));
        }
    }
    if let Some(origin) = request.origin {
        let host = request.host.unwrap_or("");
        let authority = origin.strip_prefix("http://").or_else(|| origin.strip_prefix("https://"));
        if host.is_empty() || authority != Some(host) {
            return Err(CsrfRefusal::ForeignOrigin { origin: origin.to_string(), host: host.to_string() });
        }
    }
    Ok(())
}

/// The signed-in sessions: id → when it expires.
#[derive(Debug, Default)]
pub struct Sessions {
    expiry: HashMap<String, u64>,
}

impl Sessions {
    /// Starts session `id` (drawn at random by the caller) at `now_ms`; drops
    /// expired sessions, and the oldest one when [`MAX_SESSIONS`] are live.
    pub fn start(&mut self, id: String, now_ms: u64) {
        self.expiry.retain(|_, &mut until| until > now_ms);
        if self.expiry.len() >= MAX_SESSIONS {
            if let Some(oldest) = self.expiry.iter().min_by_key(|(_, &until)| until).map(|(id, _)| id.clone()) {
                self.expiry.remove(&oldest);
            }
        }
        self.expiry.insert(id, now_ms + SESSION_TTL_MS);
    }

    /// True when `id` is a live session at `now_ms`.
    pub fn is_live(&self, id: &str, now_ms: u64) -> bool {
        self.expiry.get(id).is_some_and(|&until| until > now_ms)
    }

    /// Ends session `id`.
    pub fn end(&mut self, id: &str) {
        self.expiry.remove(id);
    }

    pub fn len(&self) -> usize {
        self.expiry.len()
    }

    pub fn is_empty(&self) -> bool {
        self.expiry.is_empty()
    }
}

/// Reads cookie `name` from a `Cookie` header.
pub fn cookie<'a>(header: &'a str, name: &str) -> Option<&'a str> {
    header.split(';').filter_map(|pair| pair.trim().split_once('=')).find(|(key, _)| *key == name).map(|(_, v)| v)
}

#[cfg(test)]
mod tests {
    use super::*;
    use proptest::prelude::*;

    const SECRET: &[u8] = b"0123456789abcdef0123456789abcdef";

    fn change<'a>(token: Option<&'a str>) -> ChangeRequest<'a> {
        ChangeRequest {
            token,
            origin: Some("http://127.0.0.1:7700"),
            host: Some("127.0.0.1:7700"),
            fetch_site: Some("same-origin"),
        }
    }

    #[test]
    fn hmac_matches_rfc_4231_case_2() {
        assert_eq!(
            hmac_sha256_hex(b"Jefe", b"what do ya want for nothing?"),
            "5bdcc146bf60754e6a042426089575c75a003f089d2739839dec58b964ec3843"
        );
    }

    #[test]
    fn a_change_with_its_sessions_token_from_its_own_origin_passes() {
        let token = csrf_token(SECRET, "s1");
        assert_eq!(check_change(SECRET, "s1", &change(Some(&token))), Ok(()));
        // Browsers that send neither header still need the token.
        let bare = ChangeRequest { token: Some(&token), ..Default::default() };
        assert_eq!(check_change(SECRET, "s1", &bare), Ok(()));
    }

    #[test]
    fn forgeries_are_refused() {
        let token = csrf_token(SECRET, "s1");
        assert_eq!(check_change(SECRET, "s1", &change(None)), Err(CsrfRefusal::MissingToken));
        assert_eq!(check_change(SECRET, "s1", &change(Some(""))), Err(CsrfRefusal::MissingToken));
        assert_eq!(check_change(SECRET, "s2", &change(Some(&token))), Err(CsrfRefusal::WrongToken));
        assert_eq!(check_change(b"another secret", "s1", &change(Some(&token))), Err(CsrfRefusal::WrongToken));
        let cross = ChangeRequest { fetch_site: Some("cross-site"), ..change(Some(&token)) };
        assert_eq!(check_change(SECRET, "s1", &cross), Err(CsrfRefusal::CrossSite("cross-site".into())));
        let foreign = ChangeRequest { origin: Some("http://evil.example"), ..change(Some(&token)) };
        assert!(matches!(check_change(SECRET, "s1", &foreign), Err(CsrfRefusal::ForeignOrigin { .. })));
        let null = ChangeRequest { origin: Some("null"), ..change(Some(&token)) };
        assert!(matches!(check_change(SECRET, "s1", &null), Err(CsrfRefusal::ForeignOrigin { .. })));
    }

    #[test]
    fn sessions_expire_and_stay_bounded() {
        let mut sessions = Sessions::default();
        sessions.start("a".into(), 0);
        assert!(sessions.is_live("a", SESSION_TTL_MS - 1));
        assert!(!sessions.is_live("a", SESSION_TTL_MS));
        assert!(!sessions.is_live("b", 0));
        for i in 0..MAX_SESSIONS + 10 {
            sessions.start(format!("s{i}"), i as u64);
        }
        assert_eq!(sessions.len(), MAX_SESSIONS);
        assert!(!sessions.is_live("s0", MAX_SESSIONS as u64 + 10));
        sessions.end("s20");
        assert!(!sessions.is_live("s20", 100));
    }

    #[test]
    fn cookies_are_found_by_name() {
        assert_eq!(cookie("a=1; capdex-console=xyz; b=2", SESSION_COOKIE), Some("xyz"));
        assert_eq!(cookie("capdex-consolex=1", SESSION_COOKIE), None);
    }

    proptest! {
        /// No token but the session's own passes.
        #[test]
        fn only_the_sessions_token_passes(session in "[a-z0-9]{1,16}", other in "[a-z0-9]{1,16}", guess in "[0-9a-f]{64}") {
            let token = csrf_token(SECRET, &other);
            let request = ChangeRequest { token: Some(&token), ..Default::default() };
            prop_assert_eq!(check_change(SECRET, &session, &request).is_ok(), session == other);
            let guessed = ChangeRequest { token: Some(&guess), ..Default::default() };
            prop_assert_eq!(check_change(SECRET, &session, &guessed).is_ok(), guess == csrf_token(SECRET, &session));
        }
    }
}
