#!/usr/bin/env bash
# Runs every test of the project. Installs what the tests need: Mesa's lavapipe (a software
# Vulkan driver) so the GPU tests have an adapter on machines without a GPU; the browser tests
# (scripts/test-web.sh, scripts/test-e2e.sh) install Chromium, wasm-bindgen-cli and playwright-core.
# The real PyTorch snapshots are read from $TENSORMEM_FIXTURES (default ../shared/fixtures/...);
# under CI=true a missing folder fails the run instead of skipping those tests.
set -euo pipefail
cd "$(dirname "$0")/.."
export TENSORMEM_FIXTURES="${TENSORMEM_FIXTURES:-$(cd .. && pwd)/shared/fixtures/pytorch-snapshots}"
if [ "${CI:-}" = "true" ] && [ ! -d "$TENSORMEM_FIXTURES" ]; then
  echo "error: fixture folder $TENSORMEM_FIXTURES is missing" >&2
  exit 1
fi
if ! ls /usr/share/vulkan/icd.d/lvp_icd*.json >/dev/null 2>&1; then
  echo "== installing Mesa's software Vulkan driver (lavapipe)"
  if [ "$(id -u)" = 0 ]; then sudo=""; else sudo="sudo"; fi
  $sudo apt-get update -qq
  DEBIAN_FRONTEND=noninteractive $sudo apt-get install -y -qq mesa-vulkan-drivers >/dev/null
fi
# Mesa warns on every device creation without a runtime dir; any private directory will do.
if [ -z "${XDG_RUNTIME_DIR:-}" ] || [ ! -d "${XDG_RUNTIME_DIR:-}" ]; then
  export XDG_RUNTIME_DIR="${TMPDIR:-/tmp}/tensormem-xdg-$(id -u)"
  mkdir -p "$XDG_RUNTIME_DIR" && chmod 700 "$XDG_RUNTIME_DIR"
fi
log=$(mktemp)
trap 'rm -f "$log"' EXIT

echo "== benchmarks compile"
cargo check --benches --locked --quiet

echo "== rustfmt (rustfmt.toml) and clippy (warnings are errors), native and wasm"
rustup component list --installed 2>/dev/null | grep -q '^rustfmt' || rustup component add rustfmt
cargo fmt --all --check
rustup component list --installed 2>/dev/null | grep -q '^clippy' || rustup component add clippy
rustup target list --installed | grep -q wasm32-unknown-unknown || rustup target add wasm32-unknown-unknown
cargo clippy --workspace --all-targets --locked --quiet -- -D warnings
cargo clippy --lib --target wasm32-unknown-unknown --locked --quiet -- -D warnings

echo "== cargo test (allocator rules and properties, fixtures, replay, malformed input, CLI, GPU kernels on the first adapter)"
cargo test --workspace --locked 2>&1 | tee "$log"

bash scripts/test-web.sh 2>&1 | tee -a "$log"

bash scripts/test-e2e.sh 2>&1 | tee -a "$log"

# One closing line for the whole run. A test that could not run here (no fixtures, no adapter;
# never under CI=true, where that fails) passes after printing `SKIPPED name: reason`: those
# are counted apart.
skipped=$( (grep -o 'SKIPPED [A-Za-z0-9_:]*:' "$log" || true) | sort -u | wc -l)
awk -v skipped="$skipped" '/^test result:/ { for (i = 1; i <= NF; i++) { if ($(i+1) ~ /^passed/) p += $i; if ($(i+1) ~ /^failed/) f += $i } }
     END { printf "tests: %d passed, %d skipped (see the SKIPPED lines), %d failed\n", p - skipped, skipped, f }' "$log"
