#!/usr/bin/env bash
# Fuzz the snapshot reader, replay and snapshot writing with libFuzzer (cargo fuzz). With a
# nightly toolchain it runs under AddressSanitizer; with only stable, libFuzzer's coverage runs
# without a sanitizer (RUSTC_BOOTSTRAP lets cargo fuzz pass its flags to stable rustc).
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
if rustup toolchain list 2>/dev/null | grep -q '^nightly'; then
  cargo +nightly fuzz run load_snapshot "$corpus" -- -max_total_time="$seconds" -max_len=200000
else
  RUSTC_BOOTSTRAP=1 cargo fuzz run --sanitizer none load_snapshot "$corpus" -- -max_total_time="$seconds" -max_len=200000
fi
