#!/usr/bin/env bash
# Matmul against numpy's BLAS on the same CPU, back to back: `tensormem bench --json` (on the
# first adapter; lavapipe on a machine without a GPU) and numpy's float32 matmul at the same
# sizes, then the ratios. Installs numpy into target/bench-venv (PyPI).
set -euo pipefail
cd "$(dirname "$0")/.."
sizes="${1:-512,1024}"
venv=target/bench-venv
[ -x "$venv/bin/python" ] || python3 -m venv "$venv"
"$venv/bin/python" -c "import numpy" 2>/dev/null || "$venv/bin/pip" install --quiet numpy
cargo build --locked --release -p native-runner --quiet
report=$(target/release/tensormem bench --json --sizes "$sizes")
echo "$report" | "$venv/bin/python" -c '
import json, sys, time
import numpy as np
report = json.load(sys.stdin)
print("adapter:", report["adapter"])
for m in report["matmul"]:
    s = m["m"]
    a = np.random.rand(s, s).astype(np.float32)
    b = np.random.rand(s, s).astype(np.float32)
    a @ b
    best = float("inf")
    for _ in range(5):
        start = time.perf_counter()
        a @ b
        best = min(best, time.perf_counter() - start)
    numpy_gflops = 2 * s**3 / best / 1e9
    ours, naive = m["gflops"], m["naive_gflops"]
    print("%dx%dx%d f32: tensormem %s %.2f GFLOP/s = %.1fx the naive kernel, %.1f%% of numpy (%.1f GFLOP/s, numpy %s)"
          % (s, s, s, m["kernel"], ours, ours / naive, 100 * ours / numpy_gflops, numpy_gflops, np.__version__))
'
