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
# A clean clone builds once: incremental state would only take disk (1.6 GB of it).
if [ "${CI:-}" = "true" ]; then export CARGO_INCREMENTAL=0; fi
log=$(mktemp)
durations=$(mktemp)
trap 'rm -f "$log" "$durations"' EXIT
# `timeout` runs each suite in a process group of its own, which a Ctrl-C on this script does
# not reach: pass it on (timeout forwards it to the whole suite).
trap 'pkill -TERM -P $$ 2>/dev/null; exit 130' INT TERM

# Each suite runs under a budget about twice its running time on a fresh 2-core machine, and
# the budgets add up to less than CI's 90 minutes; each suite prints its duration, and one past
# half its budget is flagged, so that the next creep is seen long before it fails. Budgets
# include the suite's builds and installs (wasm-bindgen-cli, Chromium) on a fresh machine.
failed_suites=""
suite() {
  local name=$1 budget=$2 start status from
  shift 2
  start=$(date +%s)
  from=$(wc -l < "$log")
  set +e
  timeout --kill-after=30 "$budget" "$@" 2>&1 | tee -a "$log"
  status=${PIPESTATUS[0]}
  set -e
  local took=$(( $(date +%s) - start ))
  echo "$name $took $budget" >> "$durations"
  if [ "$status" != 0 ] && [ "$took" -ge "$budget" ]; then
    echo "== suite $name: stopped after its budget of ${budget} s"
    echo "test result: FAILED. 0 passed; 1 failed (suite $name ran past its budget)" >> "$log"
  else
    echo "== suite $name: ${took} s of its ${budget} s budget"
    # A suite that failed before any test could (a build, an install) still counts a failure.
    if [ "$status" != 0 ] && ! tail -n "+$((from + 1))" "$log" | grep -q '^test result: FAILED'; then
      echo "test result: FAILED. 0 passed; 1 failed (suite $name exited with status $status)" >> "$log"
    fi
  fi
  if [ "$status" != 0 ]; then failed_suites="$failed_suites $name"; fi
}

# Closing lines: each suite's share of its budget, the slowest suite, then the counts. A test
# that could not run here (no fixtures, no adapter; never under CI=true, where that fails)
# passes after printing `SKIPPED name: reason`: those are counted apart.
finish() {
  awk '{ printf "%s%s %d s of %d", (NR > 1 ? ", " : "suite durations: "), $1, $2, $3 } END { print "" }' "$durations"
  awk '$2 * 2 > $3 { printf "WARNING: suite %s took %d s, over half of its %d s budget: speed it up or raise the budget\n", $1, $2, $3 }' "$durations"
  sort -k2,2nr "$durations" | awk 'NR == 1 { printf "slowest suite: %s, %d s (%d%% of its %d s budget)\n", $1, $2, 100 * $2 / $3, $3 }'
  local skipped
  skipped=$( (grep -o 'SKIPPED [A-Za-z0-9_:]*:' "$log" || true) | sort -u | wc -l)
  awk -v skipped="$skipped" '/^test result:/ { for (i = 1; i <= NF; i++) { if ($(i+1) ~ /^passed/) p += $i; if ($(i+1) ~ /^failed/) f += $i } }
       END { printf "tests: %d passed, %d failed, %d skipped\n", p - skipped, f, skipped }' "$log"
  if [ -n "$failed_suites" ]; then
    echo "failed suites:$failed_suites" >&2
    exit 1
  fi
}

# Suites that are shell functions run under `timeout` through `bash -c` (exported below).
checks() {
  set -euo pipefail
  echo "== benchmarks compile"
  cargo check --benches --locked --quiet
  echo "== rustfmt (rustfmt.toml) and clippy (warnings are errors), native and wasm"
  rustup component list --installed 2>/dev/null | grep -q '^rustfmt' || rustup component add rustfmt
  cargo fmt --all --check
  rustup component list --installed 2>/dev/null | grep -q '^clippy' || rustup component add clippy
  rustup target list --installed | grep -q wasm32-unknown-unknown || rustup target add wasm32-unknown-unknown
  cargo clippy --workspace --all-targets --locked --quiet -- -D warnings
  cargo clippy --lib --target wasm32-unknown-unknown --locked --quiet -- -D warnings
  echo "== the analysis and the sim device without wgpu (the gpu feature off), and the layers' order"
  cargo clippy --lib --no-default-features --locked --quiet -- -D warnings
  if cargo tree --locked -p tensormem --no-default-features -e normal | grep -q wgpu; then
    echo "error: wgpu is a dependency of the build without the gpu feature" >&2
    exit 1
  fi
}

native() {
  set -euo pipefail
  echo "== cargo test (allocator rules and properties, fixtures, replay, malformed input, CLI, GPU kernels on the first adapter)"
  cargo test --workspace --locked
  echo "== PyTorch twins: one per scenario, with its parameters and variants (tools/twins/check.py)"
  # Skipped checks print SKIPPED lines, which the closing count takes out of the passed ones.
  python3 tools/twins/check.py | awk '{ print } /^twins:/ { printf "test result: %s. %d passed; %d failed (PyTorch twins)\n", ($4 + 0 ? "FAILED" : "ok"), $2 + $6, $4 }'
  echo "== scripts/bench-vs-torch.sh without PyTorch and CUDA, and its table (tools/bench/check_bench_vs_torch.py)"
  python3 tools/bench/check_bench_vs_torch.py
}

export -f checks native

# Lint first: a format or clippy error fails the run before an hour of tests.
suite checks 600 bash -c checks
[ -z "$failed_suites" ] || finish
suite native 1500 bash -c native
suite python 1200 bash scripts/test-python.sh
suite browser 900 bash scripts/test-web.sh
suite page 900 bash scripts/test-e2e.sh
finish
