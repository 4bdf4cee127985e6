#!/usr/bin/env bash
# Fuzz the snapshot reader and replay with libFuzzer (cargo fuzz, nightly toolchain).
# Usage: bash scripts/fuzz.sh [SECONDS]   (default 60)
set -euo pipefail
cd "$(dirname "$0")/.."
seconds="${1:-60}"
command -v cargo-fuzz >/dev/null || cargo install cargo-fuzz --locked
corpus=fuzz/corpus/load_snapshot
mkdir -p "$corpus"
fixtures="${TENSORMEM_FIXTURES:-../shared/fixtures/pytorch-snapshots}"
for f in "$fixtures"/tiny-settings.pickle "$fixtures"/small-state.pickle; do
  [ -f "$f" ] && cp "$f" "$corpus/"
done
cargo run -q --release -p native-runner -- demo --out "$corpus/demo.json" >/dev/null
cargo +nightly fuzz run load_snapshot "$corpus" -- -max_total_time="$seconds" -max_len=200000
