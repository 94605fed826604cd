//! The SSRF guard of every HTTP client in `upstream`: host names resolve
//! through [`GuardedResolver`], which answers only with addresses
//! `core::dispatch::ssrf` allows (so the connection goes to the checked
//! addresses, whatever DNS says next); IP-literal hosts, which reqwest does
//! not resolve, are checked by [`SsrfGuard::check_url`]; system proxies are
//! ignored (a proxy would connect on the guard's behalf); redirects are
//! refused, or followed only to checked targets where a caller allows them.

use super::{UpstreamError, UpstreamErrorKind};
use crate::core::dispatch::ssrf::{self, Cidr, SsrfRefusal};
use std::net::{IpAddr, SocketAddr};
use std::sync::Arc;

/// The allowlist and the checks made with it. Cheap to clone.
#[derive(Clone, Debug, Default)]
pub struct SsrfGuard {
    allowlist: Arc<Vec<Cidr>>,
}

/// The most redirects followed where a caller allows them.
pub const MAX_REDIRECTS: usize = 5;

impl SsrfGuard {
    /// A guard refusing every private, loopback, link-local... address not in `allowlist`.
    pub fn new(allowlist: Vec<Cidr>) -> SsrfGuard {
        SsrfGuard { allowlist: Arc::new(allowlist) }
    }

    /// Parses `url` and checks it: `http` or `https`, a host, and an IP-literal host allowed.
    pub fn check_url(&self, url: &str) -> Result<reqwest::Url, UpstreamError> {
        let parsed = reqwest::Url::parse(url).map_err(|err| {
            UpstreamError::new(UpstreamErrorKind::InvalidTarget, format!("{url:?} is not a URL: {err}"))
        })?;
        self.check_parsed(&parsed)?;
        Ok(parsed)
    }

    fn check_parsed(&self, url: &reqwest::Url) -> Result<(), UpstreamError> {
        if !matches!(url.scheme(), "http" | "https") {
            return Err(UpstreamError::new(UpstreamErrorKind::InvalidTarget, "the URL must be http or https"));
        }
        let Some(host) = url.host_str().filter(|host| !host.is_empty()) else {
            return Err(UpstreamError::new(UpstreamErrorKind::InvalidTarget, "the URL has no host"));
        };
        // The URL parser normalised IPv4 spellings (`0x7f.1`, `2130706433`); the
        // core reads every spelling again, and refuses metadata names.
        ssrf::check_host(host, &self.allowlist).map_err(refused)?;
        Ok(())
    }

    /// A client builder with the guard in place: guarded DNS, no proxy, no
    /// redirects, and the TLS provider installed.
    pub fn client_builder(&self) -> reqwest::ClientBuilder {
        crate::tls::install_provider();
        reqwest::Client::builder()
            .no_proxy()
            .dns_resolver(GuardedResolver { guard: self.clone() })
            .redirect(reqwest::redirect::Policy::none())
    }

    /// A redirect policy following up to [`MAX_REDIRECTS`] redirects to
    /// http(s) URLs whose IP-literal host the guard allows (named hosts are
    /// checked when they resolve).
    pub fn redirect_policy(&self) -> reqwest::redirect::Policy {
        let guard = self.clone();
        reqwest::redirect::Policy::custom(move |attempt| {
            if attempt.previous().len() >= MAX_REDIRECTS {
                return attempt.error(format!("more than {MAX_REDIRECTS} redirects"));
            }
            match guard.check_parsed(attempt.url()) {
                Ok(()) => attempt.follow(),
                Err(err) => attempt.error(format!("a redirect was refused: {err}")),
            }
        })
    }
}

fn refused(refusal: SsrfRefusal) -> UpstreamError {
    UpstreamError::new(UpstreamErrorKind::TargetRefused, refusal.to_string())
}

/// Resolves host names with the system resolver and answers only when every
/// address passes the guard.
struct GuardedResolver {
    guard: SsrfGuard,
}

impl reqwest::dns::Resolve for GuardedResolver {
    fn resolve(&self, name: reqwest::dns::Name) -> reqwest::dns::Resolving {
        let allowlist = self.guard.allowlist.clone();
        let host = name.as_str().to_string();
        Box::pin(async move {
            ssrf::check_host(&host, &allowlist)?;
            let addrs: Vec<SocketAddr> = tokio::net::lookup_host((host.as_str(), 0)).await?.collect();
            let ips: Vec<IpAddr> = addrs.iter().map(SocketAddr::ip).collect();
            ssrf::check_addresses(&ips, &allowlist)?;
            let addrs: reqwest::dns::Addrs = Box::new(addrs.into_iter());
            Ok(addrs)
        })
    }
}

/// The SSRF refusal somewhere in an error's chain of sources, if that is why it failed.
pub fn refusal_in<'a>(err: &'a (dyn std::error::Error + 'static)) -> Option<&'a SsrfRefusal> {
    let mut current = Some(err);
    while let Some(error) = current {
        if let Some(refusal) = error.downcast_ref::<SsrfRefusal>() {
            return Some(refusal);
        }
        current = error.source();
    }
    None
}

/// A reqwest error as an [`UpstreamError`]: `TargetRefused` when the guard
/// refused, `Timeout`, else `Connect`; never with the URL's query (it may hold a key).
pub fn from_reqwest(err: reqwest::Error, doing: &str) -> UpstreamError {
    if let Some(refusal) = refusal_in(&err) {
        return UpstreamError::new(UpstreamErrorKind::TargetRefused, refusal.to_string());
    }
    let kind = if err.is_timeout() { UpstreamErrorKind::Timeout } else { UpstreamErrorKind::Connect };
    let err = err.without_url();
    let mut message = format!("{doing} failed: {err}");
    let mut source = std::error::Error::source(&err);
    while let Some(inner) = source {
        message.push_str(&format!(": {inner}"));
        source = inner.source();
    }
    // The refusal may arrive flattened into text by a layer that does not keep sources.
    let kind = if message.contains("and not allowlisted") { UpstreamErrorKind::TargetRefused } else { kind };
    UpstreamError::new(kind, super::truncate(&message, 500))
}

#[cfg(test)]
mod tests {
    use super::*;

    fn kind(guard: &SsrfGuard, url: &str) -> Option<UpstreamErrorKind> {
        guard.check_url(url).err().map(|err| err.kind)
    }

    #[test]
    fn literal_hosts_are_checked_before_any_connection() {
        let open = SsrfGuard::new(Vec::new());
        let loopback = SsrfGuard::new(vec![Cidr::parse("127.0.0.1/32").unwrap()]);
        for url in [
            "http://127.0.0.1:8080/x",
            "http://0x7f.1/x",
            "http://2130706433/",
            "http://[::1]/",
            "http://[::ffff:127.0.0.1]/",
            "http://169.254.169.254/latest",
            "http://10.0.0.1/",
        ] {
            assert_eq!(kind(&open, url), Some(UpstreamErrorKind::TargetRefused), "{url}");
        }
        assert_eq!(kind(&loopback, "http://127.0.0.1:8080/x"), None);
        assert_eq!(kind(&loopback, "http://0x7f.1/x"), None, "normalised to 127.0.0.1");
        assert_eq!(kind(&loopback, "http://127.0.0.2/"), Some(UpstreamErrorKind::TargetRefused));
        for url in ["http://metadata.google.internal/computeMetadata/v1/", "http://[fd00:ec2::254]/", "http://0177.1/"]
        {
            assert_eq!(kind(&open, url), Some(UpstreamErrorKind::TargetRefused), "{url}");
        }
        // Names are left to the resolver; public literals pass.
        assert_eq!(kind(&open, "https://api.example.com/v1"), None);
        assert_eq!(kind(&open, "https://93.184.216.34/"), None);
        for url in ["file:///etc/passwd", "ftp://h/x", "not a url", "http://"] {
            assert_eq!(kind(&open, url), Some(UpstreamErrorKind::InvalidTarget), "{url}");
        }
    }
}
