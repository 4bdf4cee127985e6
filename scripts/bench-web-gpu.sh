#!/usr/bin/env bash
# The engine benchmark (tensormem::bench, as `tensormem bench --json` natively) in headless
# Chromium's WebGPU. Prints the report as JSON on stdout; progress on stderr. Installs what
# scripts/test-web.sh installs.
set -euo pipefail
cd "$(dirname "$0")/.."
bash scripts/test-web.sh --install-only >/dev/null
export CHROMEDRIVER=/usr/bin/chromedriver
export CARGO_TARGET_WASM32_UNKNOWN_UNKNOWN_RUNNER=wasm-bindgen-test-runner
export WASM_BINDGEN_TEST_TIMEOUT=900
# A bench profile build (lto, one codegen unit, as the page's wasm-release): slower to build than --release.
log=$(mktemp)
cargo bench --locked --target wasm32-unknown-unknown --bench web_gpu -- --nocapture 2>&1 | tee "$log" | grep --line-buffered -v BENCH_JSON >&2
sed -n 's/.*BENCH_JSON //p' "$log"
rm -f "$log"
