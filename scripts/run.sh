#!/usr/bin/env bash
# The main job: builds the web page (wasm) and serves it on http://127.0.0.1:8080/ (open it in a
# browser). Arguments go to `tensormem serve`: a snapshot file to open, --port N.
#   bash scripts/run.sh                      # the page, on a default scenario already run
#   bash scripts/run.sh my_snapshot.pickle   # the page with that snapshot loaded
set -euo pipefail
cd "$(dirname "$0")/.."
bash scripts/build-web.sh
cargo build --locked --release -p native-runner
exec target/release/tensormem serve "$@"
