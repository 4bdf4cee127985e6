#!/usr/bin/env bash
# The main job. Until the web page exists, it records an example snapshot with tensormem's
# allocator and replays it under two allocator settings (see README.md).
set -euo pipefail
cd "$(dirname "$0")/.."
cargo run --release --locked -p native-runner -- demo "$@"
