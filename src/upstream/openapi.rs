//! Reads an OpenAPI document (JSON or YAML; parsing is `core`'s): fetched
//! from an http(s) URL with `If-None-Match` ([`DocumentFetcher`], answering
//! [`Fetched::NotModified`] or the document and its ETag), through the SSRF
//! guard, following at most a few redirects and only to allowed targets,
//! within a size cap and a timeout; or read from a file that must lie under
//! one of the allowed roots once canonicalised ([`read_file_under_roots`],
//! which serves SQL sources' DDL files too; [`resolve_under_roots`] checks a
//! stdio source's `cwd` the same way).

use super::guard::{from_reqwest, SsrfGuard};
use super::http::read_limited;
use super::{UpstreamError, UpstreamErrorKind};
use crate::core::dispatch::ssrf::Cidr;
use crate::core::sources::settings::is_contained_relative_path;
use std::path::{Path, PathBuf};
use std::time::Duration;

/// The largest document read by default, in bytes.
pub const DEFAULT_MAX_DOCUMENT_BYTES: usize = 8 * 1024 * 1024;

/// What a fetch found.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum Fetched {
    /// The server answered `304 Not Modified` to the ETag given.
    NotModified,
    /// The document's text and the ETag to send next time.
    Document { text: String, etag: Option<String> },
}

/// Fetches documents over HTTP. Cheap to clone (clones share the pool).
#[derive(Clone, Debug)]
pub struct DocumentFetcher {
    client: reqwest::Client,
    guard: SsrfGuard,
    max_bytes: usize,
}

impl DocumentFetcher {
    /// A fetcher with the guard's allowlist and the largest document read.
    pub fn new(allowlist: Vec<Cidr>, max_bytes: usize) -> Result<DocumentFetcher, UpstreamError> {
        let guard = SsrfGuard::new(allowlist);
        let client = guard
            .client_builder()
            .redirect(guard.redirect_policy())
            .connect_timeout(Duration::from_secs(10))
            .build()
            .map_err(|err| {
                UpstreamError::new(UpstreamErrorKind::Connect, format!("cannot build the HTTP client: {err}"))
            })?;
        Ok(DocumentFetcher { client, guard, max_bytes })
    }

    /// Fetches `url`, sending `If-None-Match: <etag>` when given, within `timeout`.
    pub async fn fetch(&self, url: &str, etag: Option<&str>, timeout: Duration) -> Result<Fetched, UpstreamError> {
        let timeout_ms = timeout.as_millis();
        match tokio::time::timeout(timeout, self.fetch_unbounded(url, etag)).await {
            Ok(result) => result,
            Err(_) => Err(UpstreamError::new(
                UpstreamErrorKind::Timeout,
                format!("the document did not arrive within {timeout_ms} ms"),
            )),
        }
    }

    async fn fetch_unbounded(&self, url: &str, etag: Option<&str>) -> Result<Fetched, UpstreamError> {
        let url = self.guard.check_url(url)?;
        let mut request =
            self.client.get(url).header("Accept", "application/json, application/yaml, text/yaml, */*;q=0.5");
        if let Some(etag) = etag {
            request = request.header("If-None-Match", etag);
        }
        let response = request.send().await.map_err(|err| from_reqwest(err, "fetching the document"))?;
        let status = response.status();
        if status == reqwest::StatusCode::NOT_MODIFIED {
            return Ok(Fetched::NotModified);
        }
        if !status.is_success() {
            return Err(UpstreamError::new(
                UpstreamErrorKind::HttpStatus,
                format!("fetching the document answered HTTP {}", status.as_u16()),
            ));
        }
        let etag = response.headers().get("etag").and_then(|value| value.to_str().ok()).map(str::to_string);
        let bytes = read_limited(response, self.max_bytes).await?;
        let text = String::from_utf8(bytes)
            .map_err(|_| UpstreamError::new(UpstreamErrorKind::Protocol, "the document is not UTF-8 text"))?;
        Ok(Fetched::Document { text, etag })
    }
}

/// Reads `relative` (a path the settings checked lexically) from the first
/// of `roots` holding it ([`resolve_under_roots`]), refusing one larger than `max_bytes`.
pub async fn read_file_under_roots(
    relative: &str,
    roots: &[PathBuf],
    max_bytes: usize,
) -> Result<String, UpstreamError> {
    let path = resolve_under_roots(relative, roots).await?;
    read_capped(&path, max_bytes).await
}

/// The canonical path of `relative` under the first of `roots` where it
/// exists, refused when it is not relative, climbs out with `..`, or (once
/// symbolic links are followed) lies outside that root. Serves a stdio
/// source's `cwd` as well as document and DDL files.
pub async fn resolve_under_roots(relative: &str, roots: &[PathBuf]) -> Result<PathBuf, UpstreamError> {
    let file_error = |message: String| UpstreamError::new(UpstreamErrorKind::File, message);
    if !is_contained_relative_path(relative) {
        return Err(file_error(format!("{relative:?} must be a relative path that does not climb out with '..'")));
    }
    if roots.is_empty() {
        return Err(file_error("no allowed roots are configured for source files".into()));
    }
    for root in roots {
        let Ok(root) = tokio::fs::canonicalize(root).await else { continue };
        let Ok(path) = tokio::fs::canonicalize(root.join(relative)).await else { continue };
        if !path.starts_with(&root) {
            return Err(file_error(format!("{relative:?} leads outside its allowed root")));
        }
        return Ok(path);
    }
    Err(file_error(format!("{relative:?} is under none of the allowed roots")))
}

async fn read_capped(path: &Path, max_bytes: usize) -> Result<String, UpstreamError> {
    let file_error = |message: String| UpstreamError::new(UpstreamErrorKind::File, message);
    let metadata = tokio::fs::metadata(path).await.map_err(|err| file_error(format!("cannot read the file: {err}")))?;
    if !metadata.is_file() {
        return Err(file_error("the path is not a regular file".into()));
    }
    if metadata.len() > max_bytes as u64 {
        return Err(UpstreamError::new(
            UpstreamErrorKind::TooLarge,
            format!("the file is larger than {max_bytes} bytes"),
        ));
    }
    let bytes = tokio::fs::read(path).await.map_err(|err| file_error(format!("cannot read the file: {err}")))?;
    if bytes.len() > max_bytes {
        return Err(UpstreamError::new(
            UpstreamErrorKind::TooLarge,
            format!("the file is larger than {max_bytes} bytes"),
        ));
    }
    String::from_utf8(bytes).map_err(|_| file_error("the file is not UTF-8 text".into()))
}
