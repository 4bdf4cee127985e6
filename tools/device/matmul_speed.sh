#!/usr/bin/env bash
# The matmul variants on a lent NVIDIA machine, quickly (under two minutes, the machine's start
# included): the op suite's matmul tests, then `tensormem bench`, every variant's speed per size
# in $OUT/bench.json and a short table last. For trying kernels between runs of the whole check
# (tools/device/h100.sh). Carry [".gl"] (prepare with tools/device/prepare.sh).
set -u
cd "$(dirname "$0")/../.."
. tools/device/quick_env.sh
export TENSORMEM_CACHE=memory
[ -s .gl/target_tmpdir ] && mkdir -p "$(cat .gl/target_tmpdir)" 2>/dev/null
SIZES=${SIZES:-1024,2048,4096}
CI=true timeout 120 .gl/bin/gpu_ops matmul 2>&1 | grep -E '^test |test result' | tee "$OUT/gpu_ops.txt"
timeout 150 .gl/bin/tensormem bench --json --sizes "$SIZES" > "$OUT/bench.json" 2> "$OUT/bench.err"
python3 - "$OUT" <<'PY'
import json, sys
for name in ("bench",):
    try:
        r = json.loads([l for l in open(f"{sys.argv[1]}/{name}.json") if l.startswith("{")][-1])
    except Exception as e:
        print(name, "no result:", e, open(f"{sys.argv[1]}/{name}.err").read()[-500:]); continue
    print(f"== {name}: {r['adapter']}")
    for m in r["matmul"]:
        v = "  ".join(f"{k} {g/1e3:.1f}" for k, g in sorted(m["variants"].items(), key=lambda kv: -kv[1]))
        print(f"{m['m']}: picked {m['kernel']} {m['gflops']/1e3:.1f} TFLOP/s | {v}")
    print(f"add {r['elementwise_gbps']:.0f} GB/s, row sums {r['reduction_gbps'][0]:.0f}, tiny op {r['dispatch_us']:.1f} us")
PY
