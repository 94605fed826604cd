# Shared by scripts/fetch-minilm.sh and scripts/fetch-mpnet.sh (sourced, not run): messages,
# and the Python with pip that downloads the wheels.

say() { printf '==> %s\n' "$*" >&2; }
die() { printf 'error: %s\n' "$*" >&2; exit 1; }

# Sets PYTHON: the project's virtualenv (scripts/test.sh makes it), else any python3 with pip.
find_pip_python() {
    PYTHON="python3"
    [[ -x .venv/bin/python ]] && PYTHON=".venv/bin/python"
    "$PYTHON" -m pip --version >/dev/null 2>&1 || die "$PYTHON has no pip; install python3-pip or run scripts/test.sh once"
}

# Whether every file named after the folder $1 is there and not empty.
have_files() {
    local dir="$1" file
    shift
    for file in "$@"; do
        [[ -s "$dir/$file" ]] || return 1
    done
}

# Sets SCRATCH to a new temporary folder, removed when the script exits.
make_scratch() {
    SCRATCH="$(mktemp -d)"
    trap 'rm -rf "$SCRATCH"' EXIT
}
