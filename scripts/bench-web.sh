#!/usr/bin/env bash
# Browser benchmark of the page (not a test): time from file choice to the first complete paint,
# pan/zoom frame times and renderer peak memory, in headless Chromium, on the largest fixture and
# on generated 100 k and 1 M entry snapshots. Installs what scripts/test-e2e.sh installs.
set -euo pipefail
cd "$(dirname "$0")/.."
bash scripts/build-web.sh >/dev/null
cargo build --locked --release -p native-runner --quiet
(cd tests/e2e && npm ci --no-audit --no-fund --silent)
fixtures="${TENSORMEM_FIXTURES:-$(cd .. && pwd)/shared/fixtures/pytorch-snapshots}"
mkdir -p target/bench-web
for n in 100000 1000000; do
  out="target/bench-web/synthetic-$n.pickle"
  [ -f "$out" ] || cargo run --locked --release --quiet --example synth_snapshot -- "$n" "$out"
done
target/release/tensormem serve --port 0 > target/bench-web/serve.log &
server=$!
trap 'kill $server 2>/dev/null' EXIT
for _ in $(seq 50); do grep -q serving target/bench-web/serve.log && break; sleep 0.1; done
url=$(sed -n 's/.*serving \(http[^ ]*\).*/\1/p' target/bench-web/serve.log)
node tests/e2e/bench.mjs "$url" "$fixtures/gpt-medium-ctx128-training.pickle" target/bench-web/synthetic-100000.pickle target/bench-web/synthetic-1000000.pickle
