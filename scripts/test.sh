#!/usr/bin/env bash
# Runs every test of the project. Installs what the tests need (today: only the Rust toolchain,
# which the machine has; the engine's GPU and browser tests will add lavapipe and Chromium here).
# The real PyTorch snapshots are read from $TENSORMEM_FIXTURES (default ../shared/fixtures/...);
# under CI=true a missing folder fails the run instead of skipping those tests.
set -euo pipefail
cd "$(dirname "$0")/.."
export TENSORMEM_FIXTURES="${TENSORMEM_FIXTURES:-$(cd .. && pwd)/shared/fixtures/pytorch-snapshots}"
if [ "${CI:-}" = "true" ] && [ ! -d "$TENSORMEM_FIXTURES" ]; then
  echo "error: fixture folder $TENSORMEM_FIXTURES is missing" >&2
  exit 1
fi
log=$(mktemp)
trap 'rm -f "$log"' EXIT

echo "== benchmarks compile"
cargo check --benches --locked --quiet

echo "== cargo test (library, allocator rules and properties, fixtures, replay, malformed input, CLI)"
cargo test --workspace --locked 2>&1 | tee "$log"

# One closing line for the whole run.
awk '/^test result:/ { for (i = 1; i <= NF; i++) { if ($(i+1) ~ /^passed/) p += $i; if ($(i+1) ~ /^failed/) f += $i } }
     END { printf "tests: %d passed, %d failed\n", p, f }' "$log"
