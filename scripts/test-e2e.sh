#!/usr/bin/env bash
# End-to-end tests of the web page: builds the wasm and the CLI, serves the page with
# `tensormem serve`, and drives it in headless Chromium with playwright-core (npm, lockfile in
# tests/e2e). Installs what it needs: Chromium (Debian package) and the npm dependencies.
# Screenshots of each state: target/e2e-screenshots/.
set -euo pipefail
cd "$(dirname "$0")/.."
if [ "$(id -u)" = 0 ]; then sudo=""; else sudo="sudo"; fi
if ! command -v chromium >/dev/null; then
  echo "== installing Chromium"
  $sudo apt-get update -qq
  DEBIAN_FRONTEND=noninteractive $sudo apt-get install -y -qq chromium >/dev/null
fi
bash scripts/build-web.sh
cargo build --locked --release -p native-runner --quiet
(cd tests/e2e && npm ci --no-audit --no-fund --silent)
export TENSORMEM_FIXTURES="${TENSORMEM_FIXTURES:-$(cd .. && pwd)/shared/fixtures/pytorch-snapshots}"
echo "== page tests in headless Chromium"
# node's TAP-like summary is turned into the cargo-style line scripts/test.sh counts.
set +e
# One file at a time: each starts its own server and Chromium.
(cd tests/e2e && node --test --test-concurrency=1 --test-reporter=spec page.test.mjs diagnosis.test.mjs size.test.mjs) 2>&1 | tee target/e2e.log
status=${PIPESTATUS[0]}
set -e
# A run that died before its summary counts as one failure.
awk -v status="$status" '/^ℹ pass/ { p = $3 } /^ℹ fail/ { f = $3 }
     END { if (status != 0 && f == 0) f = 1; printf "test result: %s. %d passed; %d failed (page, headless Chromium)\n", (f ? "FAILED" : "ok"), p, f }' target/e2e.log
exit "$status"
