//! Finds the real MCP servers the live-source tests start, in one place:
//! `mcp-server-time` and `mcp-server-git` (PyPI, next to `CAPDEX_PYTHON`, else
//! in `<crate root>/.venv/bin`, else on `PATH`) and
//! `@modelcontextprotocol/server-everything` (npm, under `CAPDEX_NPM_TOOLS`,
//! else `<crate root>/.npm-tools`, run with `node`). `scripts/test.sh`
//! installs all three, pinned. A missing program panics with the command
//! that installs it, so a test that needs it fails instead of passing silently.

use std::io::{BufRead, BufReader};
use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};
use std::time::{Duration, Instant};

/// The pinned versions (see `scripts/test.sh`).
pub const MCP_SERVER_TIME_VERSION: &str = "2026.10.19";
pub const MCP_SERVER_GIT_VERSION: &str = "2026.10.19";
pub const SERVER_EVERYTHING_VERSION: &str = "2026.8.31";
pub const MCP_SDK_VERSION: &str = "2.3.0";

fn crate_root() -> &'static Path {
    Path::new(env!("CARGO_MANIFEST_DIR"))
}

/// A PyPI-installed console script: beside `CAPDEX_PYTHON`, in `.venv/bin`, or on `PATH`.
fn python_script(name: &str, package: &str, version: &str) -> PathBuf {
    let mut candidates = Vec::new();
    if let Some(python) = std::env::var_os("CAPDEX_PYTHON") {
        if let Some(dir) = Path::new(&python).parent() {
            candidates.push(dir.join(name));
        }
    }
    candidates.push(crate_root().join(".venv/bin").join(name));
    if let Some(path) = std::env::var_os("PATH") {
        candidates.extend(std::env::split_paths(&path).map(|dir| dir.join(name)));
    }
    candidates.into_iter().find(|candidate| candidate.is_file()).unwrap_or_else(|| {
        panic!(
            "{name} is not installed; run scripts/test.sh, or: \
             .venv/bin/python -m pip install {package}=={version} (and set CAPDEX_PYTHON=.venv/bin/python)"
        )
    })
}

/// The Python with PyPI `mcp` (the SDK) installed: `CAPDEX_PYTHON`, else `.venv/bin/python`.
pub fn python_with_mcp() -> PathBuf {
    let python =
        std::env::var_os("CAPDEX_PYTHON").map(PathBuf::from).unwrap_or_else(|| crate_root().join(".venv/bin/python"));
    assert!(
        python.is_file(),
        "{} is missing; run scripts/test.sh, or: python3 -m venv .venv && .venv/bin/python -m pip install mcp=={MCP_SDK_VERSION}",
        python.display()
    );
    python
}

/// The `mcp-server-time` program (PyPI `mcp-server-time`).
pub fn mcp_server_time() -> PathBuf {
    python_script("mcp-server-time", "mcp-server-time", MCP_SERVER_TIME_VERSION)
}

/// The `mcp-server-git` program (PyPI `mcp-server-git`).
pub fn mcp_server_git() -> PathBuf {
    python_script("mcp-server-git", "mcp-server-git", MCP_SERVER_GIT_VERSION)
}

/// `node` and the server-everything entry script (`dist/index.js`); run it as
/// `node <script> stdio` or `node <script> streamableHttp`.
pub fn server_everything() -> (PathBuf, PathBuf) {
    let install =
        format!("npm install --prefix .npm-tools @modelcontextprotocol/server-everything@{SERVER_EVERYTHING_VERSION}");
    let tools =
        std::env::var_os("CAPDEX_NPM_TOOLS").map(PathBuf::from).unwrap_or_else(|| crate_root().join(".npm-tools"));
    let script = tools.join("node_modules/@modelcontextprotocol/server-everything/dist/index.js");
    assert!(script.is_file(), "{} is missing; run scripts/test.sh, or: {install}", script.display());
    let node = std::env::var_os("PATH")
        .and_then(|path| std::env::split_paths(&path).map(|dir| dir.join("node")).find(|node| node.is_file()))
        .unwrap_or_else(|| panic!("node is not on PATH; install Node.js 20, then: {install}"));
    (node, script)
}

/// server-everything over streamable HTTP on a free port, killed on drop.
pub struct EverythingHttp {
    child: Child,
    /// `http://127.0.0.1:<port>/mcp`.
    pub url: String,
}

impl EverythingHttp {
    /// Starts it (`PORT=<free port> node dist/index.js streamableHttp`) and waits until it listens.
    pub fn start() -> EverythingHttp {
        let (node, script) = server_everything();
        for _ in 0..5 {
            let port = crate::support::nats_server::free_port();
            let mut child = Command::new(&node)
                .arg(&script)
                .arg("streamableHttp")
                .env("PORT", port.to_string())
                .stdin(Stdio::null())
                .stdout(Stdio::null())
                .stderr(Stdio::piped())
                .spawn()
                .expect("start server-everything");
            let stderr = child.stderr.take().expect("piped stderr");
            let (ready_tx, ready_rx) = std::sync::mpsc::channel();
            std::thread::spawn(move || {
                for line in BufReader::new(stderr).lines().map_while(Result::ok) {
                    if line.contains("listening on port") {
                        let _ = ready_tx.send(true);
                    } else if line.contains("already in use") {
                        let _ = ready_tx.send(false);
                    }
                }
            });
            let deadline = Instant::now() + Duration::from_secs(20);
            match ready_rx.recv_timeout(deadline.saturating_duration_since(Instant::now())) {
                Ok(true) => return EverythingHttp { child, url: format!("http://127.0.0.1:{port}/mcp") },
                _ => {
                    let _ = child.kill();
                    let _ = child.wait();
                }
            }
        }
        panic!("server-everything (streamableHttp) did not start listening");
    }
}

impl Drop for EverythingHttp {
    fn drop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}
