//! A real browser for the console's tests: Debian's `chromium` driven by its
//! `chromedriver` over the W3C WebDriver protocol (plain HTTP and JSON on
//! 127.0.0.1, spoken with reqwest). `scripts/test.sh` installs both
//! (`CAPDEX_CHROMEDRIVER` and `CAPDEX_CHROMIUM` name other binaries).
//!
//! Chromium runs headless with a fresh profile and the flags that keep it off
//! the network (no background requests, no component updates, no sync).

use super::nats_server::free_port;
use super::serving::KillOnDrop;
use serde_json::{json, Value};
use std::path::{Path, PathBuf};
use std::process::{Command, Stdio};
use std::time::{Duration, Instant};

/// The key under which WebDriver names an element.
const ELEMENT: &str = "element-6066-11e4-a52e-4f735466cecf";

fn binary(variable: &str, default: &str) -> PathBuf {
    std::env::var_os(variable).map(PathBuf::from).unwrap_or_else(|| PathBuf::from(default))
}

/// A chromedriver process and one browser session.
pub struct Browser {
    http: reqwest::Client,
    base: String,
    _driver: KillOnDrop,
    _profile: tempfile::TempDir,
}

impl Drop for Browser {
    /// Ends the session, which makes chromedriver quit Chromium, before the
    /// driver is killed: killing only the driver would leave Chromium running,
    /// orphaned. Whatever still runs on this profile is then killed.
    fn drop(&mut self) {
        use std::io::{Read, Write};
        if let Some((authority, path)) = self.base.strip_prefix("http://").and_then(|rest| rest.split_once('/')) {
            if let Ok(mut stream) = std::net::TcpStream::connect(authority) {
                let _ = stream.set_read_timeout(Some(Duration::from_secs(15)));
                let request = format!(
                    "DELETE /{path} HTTP/1.1\r\nHost: {authority}\r\nContent-Length: 0\r\nConnection: close\r\n\r\n"
                );
                if stream.write_all(request.as_bytes()).is_ok() {
                    let _ = stream.read_to_end(&mut Vec::new());
                }
            }
        }
        kill_processes_using(self._profile.path());
    }
}

/// SIGKILLs every process whose command line names `profile` (Linux: `/proc`).
fn kill_processes_using(profile: &Path) {
    let needle = format!("--user-data-dir={}", profile.display());
    let Ok(entries) = std::fs::read_dir("/proc") else { return };
    for entry in entries.flatten() {
        let Some(pid) = entry.file_name().to_str().and_then(|name| name.parse::<u32>().ok()) else { continue };
        let Ok(cmdline) = std::fs::read(entry.path().join("cmdline")) else { continue };
        if cmdline.split(|byte| *byte == 0).any(|arg| arg == needle.as_bytes()) {
            let _ = Command::new("kill").arg("-9").arg(pid.to_string()).status();
        }
    }
}

/// One element found on the page.
pub struct Element<'a> {
    browser: &'a Browser,
    id: String,
}

impl Browser {
    /// Starts chromedriver on a free port and opens a headless Chromium session.
    pub async fn start() -> Browser {
        let driver_bin = binary("CAPDEX_CHROMEDRIVER", "/usr/bin/chromedriver");
        let chromium = binary("CAPDEX_CHROMIUM", "/usr/bin/chromium");
        assert!(
            driver_bin.exists() && chromium.exists(),
            "the console's browser tests need {} and {} (scripts/test.sh installs Debian's chromium and chromium-driver)",
            driver_bin.display(),
            chromium.display()
        );
        let port = free_port();
        let driver = Command::new(&driver_bin)
            .arg(format!("--port={port}"))
            .arg("--allowed-ips=127.0.0.1")
            .stdout(Stdio::null())
            .stderr(Stdio::null())
            .spawn()
            .expect("chromedriver starts");
        let driver = KillOnDrop::new(driver);
        let base = format!("http://127.0.0.1:{port}");
        capdex::tls::install_provider();
        let http = reqwest::Client::builder().no_proxy().timeout(Duration::from_secs(60)).build().unwrap();
        let deadline = Instant::now() + Duration::from_secs(20);
        while http.get(format!("{base}/status")).send().await.is_err() {
            assert!(Instant::now() < deadline, "chromedriver did not answer within 20 s");
            tokio::time::sleep(Duration::from_millis(100)).await;
        }
        let profile = tempfile::tempdir().unwrap();
        let args = [
            "--headless=new".to_string(),
            "--no-sandbox".into(),
            "--disable-gpu".into(),
            "--disable-dev-shm-usage".into(),
            "--disable-quic".into(),
            "--no-first-run".into(),
            "--disable-background-networking".into(),
            "--disable-component-update".into(),
            "--disable-sync".into(),
            "--disable-extensions".into(),
            "--window-size=1360,900".into(),
            format!("--user-data-dir={}", profile.path().display()),
        ];
        let capabilities = json!({"capabilities": {"alwaysMatch": {
            "browserName": "chrome",
            "goog:chromeOptions": {"binary": chromium, "args": args},
        }}});
        let session = http.post(format!("{base}/session")).json(&capabilities).send().await.expect("new session");
        let session: Value = session.json().await.expect("a JSON answer");
        let id = session["value"]["sessionId"].as_str().unwrap_or_else(|| panic!("no session: {session}")).to_string();
        Browser { http, base: format!("{base}/session/{id}"), _driver: driver, _profile: profile }
    }

    async fn send(&self, method: reqwest::Method, path: &str, body: Option<Value>) -> Value {
        self.try_send(method, path, body).await.unwrap_or_else(|error| panic!("WebDriver {path}: {error}"))
    }

    /// A WebDriver command; `Err` with the driver's error (a stale element, say).
    async fn try_send(&self, method: reqwest::Method, path: &str, body: Option<Value>) -> Result<Value, String> {
        let mut request = self.http.request(method, format!("{}{path}", self.base));
        if let Some(body) = body {
            request = request.json(&body);
        }
        let answer: Value = request.send().await.expect("chromedriver answers").json().await.expect("JSON");
        match answer["value"]["error"].as_str() {
            Some(error) => Err(format!("{error}: {}", answer["value"]["message"])),
            None => Ok(answer["value"].clone()),
        }
    }

    /// Opens `url` and waits for the page to load.
    pub async fn goto(&self, url: &str) {
        self.send(reqwest::Method::POST, "/url", Some(json!({"url": url}))).await;
    }

    pub async fn url(&self) -> String {
        self.send(reqwest::Method::GET, "/url", None).await.as_str().unwrap_or_default().to_string()
    }

    /// The elements matching a CSS selector now.
    pub async fn find_all(&self, css: &str) -> Vec<Element<'_>> {
        let found =
            self.send(reqwest::Method::POST, "/elements", Some(json!({"using": "css selector", "value": css}))).await;
        found
            .as_array()
            .map(|all| {
                all.iter()
                    .filter_map(|e| e[ELEMENT].as_str())
                    .map(|id| Element { browser: self, id: id.into() })
                    .collect()
            })
            .unwrap_or_default()
    }

    /// Waits (at most `within`) for an element matching `css`.
    pub async fn wait_for(&self, css: &str, within: Duration) -> Element<'_> {
        let deadline = Instant::now() + within;
        loop {
            if let Some(element) = self.find_all(css).await.into_iter().next() {
                return element;
            }
            assert!(Instant::now() < deadline, "no {css:?} within {within:?}; the page:\n{}", self.source().await);
            tokio::time::sleep(Duration::from_millis(50)).await;
        }
    }

    /// Waits (at most `within`) until the text of the first `css` element satisfies `ok`; returns it.
    pub async fn wait_for_text(&self, css: &str, within: Duration, ok: impl Fn(&str) -> bool) -> String {
        let deadline = Instant::now() + within;
        loop {
            // The page's content may be swapped by a live update between finding and reading.
            if let Some(element) = self.find_all(css).await.into_iter().next() {
                let path = format!("/element/{}/text", element.id);
                if let Ok(text) = self.try_send(reqwest::Method::GET, &path, None).await {
                    let text = text.as_str().unwrap_or_default().to_string();
                    if ok(&text) {
                        return text;
                    }
                }
            }
            assert!(
                Instant::now() < deadline,
                "{css:?} never had the text awaited within {within:?}; the page:\n{}",
                self.source().await
            );
            tokio::time::sleep(Duration::from_millis(50)).await;
        }
    }

    /// Clicks the first element matching `css`, found again if a live update replaced it.
    pub async fn click(&self, css: &str, within: Duration) {
        let deadline = Instant::now() + within;
        loop {
            if let Some(element) = self.find_all(css).await.into_iter().next() {
                let path = format!("/element/{}/click", element.id);
                if self.try_send(reqwest::Method::POST, &path, Some(json!({}))).await.is_ok() {
                    return;
                }
            }
            assert!(Instant::now() < deadline, "could not click {css:?} within {within:?}");
            tokio::time::sleep(Duration::from_millis(50)).await;
        }
    }

    /// The page's HTML as the browser holds it now.
    pub async fn source(&self) -> String {
        self.send(reqwest::Method::GET, "/source", None).await.as_str().unwrap_or_default().to_string()
    }

    /// Runs `script` in the page and returns its value.
    pub async fn execute(&self, script: &str) -> Value {
        self.send(reqwest::Method::POST, "/execute/sync", Some(json!({"script": script, "args": []}))).await
    }

    /// Saves a PNG screenshot of the window to `path`.
    pub async fn screenshot(&self, path: &Path) {
        let encoded = self.send(reqwest::Method::GET, "/screenshot", None).await;
        let png = base64_decode(encoded.as_str().expect("base64 text"));
        std::fs::write(path, png).expect("screenshot written");
    }
}

impl Element<'_> {
    /// Types `text` into the element.
    pub async fn type_text(&self, text: &str) {
        self.browser
            .send(reqwest::Method::POST, &format!("/element/{}/value", self.id), Some(json!({"text": text})))
            .await;
    }
}

/// Decodes standard base64 (the screenshot's encoding).
fn base64_decode(text: &str) -> Vec<u8> {
    let value = |c: u8| -> Option<u32> {
        Some(match c {
            b'A'..=b'Z' => c - b'A',
            b'a'..=b'z' => c - b'a' + 26,
            b'0'..=b'9' => c - b'0' + 52,
            b'+' => 62,
            b'/' => 63,
            _ => return None,
        } as u32)
    };
    let digits: Vec<u32> = text.bytes().filter_map(value).collect();
    let mut out = Vec::with_capacity(digits.len() * 3 / 4);
    for chunk in digits.chunks(4) {
        let n = chunk.iter().enumerate().fold(0u32, |acc, (i, d)| acc | d << (18 - 6 * i as u32));
        let bytes = [(n >> 16) as u8, (n >> 8) as u8, n as u8];
        out.extend_from_slice(&bytes[..chunk.len().saturating_sub(1)]);
    }
    out
}

#[test]
fn base64_decodes_padded_and_unpadded_text() {
    assert_eq!(base64_decode("aGVsbG8="), b"hello");
    assert_eq!(base64_decode("aGVsbG8h"), b"hello!");
    assert_eq!(base64_decode("aA=="), b"h");
}
