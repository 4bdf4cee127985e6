#!/usr/bin/env bash
# Browser tests: builds the library for wasm32 and runs tests/web.rs in headless Chromium's WebGPU
# through wasm-bindgen-test. Installs what it needs: the wasm target, wasm-bindgen-cli at the
# exact version of the wasm-bindgen crate, Chromium and ChromeDriver.
set -euo pipefail
cd "$(dirname "$0")/.."
if [ "$(id -u)" = 0 ]; then sudo=""; else sudo="sudo"; fi

rustup target list --installed | grep -qx wasm32-unknown-unknown || rustup target add wasm32-unknown-unknown
version=$(awk '/^name = "wasm-bindgen"$/ { getline; gsub(/[^0-9.]/, ""); print; exit }' Cargo.lock)
if [ "$(wasm-bindgen-test-runner --version 2>/dev/null | awk '{print $2}')" != "$version" ]; then
  echo "== installing wasm-bindgen-cli $version (a few minutes, once)"
  cargo install wasm-bindgen-cli --version "$version" --force >/dev/null
fi
if ! command -v chromium >/dev/null || ! command -v chromedriver >/dev/null; then
  echo "== installing Chromium and ChromeDriver"
  $sudo apt-get update -qq
  DEBIAN_FRONTEND=noninteractive $sudo apt-get install -y -qq chromium chromium-driver >/dev/null
fi

# --install-only: what the browser benchmark (scripts/bench-web-gpu.sh) needs, nothing run.
[ "${1:-}" = "--install-only" ] && exit 0

echo "== wasm tests in headless Chromium (WebGPU)"
export CHROMEDRIVER=/usr/bin/chromedriver
export CARGO_TARGET_WASM32_UNKNOWN_UNKNOWN_RUNNER=wasm-bindgen-test-runner
# The budget of the whole headless run (not of one test): a fresh 2-core machine ran the suite
# in 63 s once, past the default of 60; scripts/test.sh bounds the suite as a whole as well.
export WASM_BINDGEN_TEST_TIMEOUT="${WASM_BINDGEN_TEST_TIMEOUT:-900}"
cargo test --locked --target wasm32-unknown-unknown --test web
