#!/usr/bin/env python3
"""Checks scripts/bench-vs-torch.sh and tools/bench/compare.py without a GPU: the script says why
and exits 0 where PyTorch with CUDA is missing, and the table gives each figure's ratio and
issue 33's target. Prints `test result: ok. N passed; M failed (bench-vs-torch)`."""

import json
import os
import subprocess
import sys
import tempfile

HERE = os.path.dirname(os.path.abspath(__file__))
ROOT = os.path.dirname(os.path.dirname(HERE))
passed = failed = 0


def check(name, ok, detail=""):
    global passed, failed
    print(("ok   " if ok else "FAIL ") + name + ("" if ok else ": " + detail))
    passed, failed = passed + ok, failed + (not ok)


script = os.path.join(ROOT, "scripts", "bench-vs-torch.sh")
run = subprocess.run(["bash", script], env=dict(os.environ, PYTHON="/nonexistent/python3"), capture_output=True, text=True)
check("without PyTorch the script exits 0", run.returncode == 0, run.stderr[-300:])
check("and says why", "nothing to compare" in run.stdout and "needs PyTorch with CUDA" in run.stdout, run.stdout[-300:])

tm = {"adapter": "gpu", "matmul": [{"m": 2048, "kernel": "register8x8", "gflops": 30000.0}], "elementwise_gbps": 2000.0,
      "reduction_gbps": [1000.0, 1500.0], "dispatch_us": 12.0}
pt = {"adapter": "cuda", "matmul": [{"m": 2048, "gflops": 50000.0}], "elementwise_gbps": 2900.0,
      "reduction_gbps": [2400.0, 2300.0], "dispatch_us": 5.0}
with tempfile.TemporaryDirectory() as d:
    paths = []
    for name, report in (("tm.json", tm), ("pt.json", pt)):
        paths.append(os.path.join(d, name))
        with open(paths[-1], "w") as f:
            json.dump(report, f)
    table = subprocess.run([sys.executable, os.path.join(HERE, "compare.py")] + paths, capture_output=True, text=True).stdout
rows = {line.split("|")[1].strip(): [c.strip() for c in line.split("|")[1:-1]] for line in table.splitlines() if line.startswith("| ")}
check("matmul at 2048: 0.60x meets 0.50x", rows.get("matmul 2048^3 f32 [register8x8]", [""] * 6)[4:6] == ["0.60x", "met (>= 0.50x)"], str(rows))
check("add: 0.69x misses 0.85x", rows.get("elementwise add 16 Mi f32 (r+r+w)", [""] * 6)[4:6] == ["0.69x", "missed (>= 0.85x)"], str(rows))
check("a tiny op: times compare inversely", rows.get("one tiny in-place op (add_ of 4)", [""] * 6)[4:6] == ["0.42x", "missed (>= 0.50x)"], str(rows))
print(f"test result: {'FAILED' if failed else 'ok'}. {passed} passed; {failed} failed (bench-vs-torch)")
sys.exit(1 if failed else 0)
