#!/usr/bin/env bash
# The cost of an op beside its bytes, measured on a lent NVIDIA machine in about two minutes
# (carry [".gl"]; prepare with tools/device/prepare.sh, and put a build to compare with at
# .gl/bin/tensormem-before): the bandwidth figures at two sizes, so that a fixed cost per op
# (time = fixed + bytes / bandwidth) tells itself from bandwidth, tensormem's and PyTorch's at
# the same sizes; the op suite once. Tables last; everything in $OUT/all.tgz (the device
# tool brings back 8 files).
set -u
cd "$(dirname "$0")/../.."
. tools/device/quick_env.sh
export TENSORMEM_CACHE_DIR="$OUT/cache"
SMALL=$((16 << 20)) LARGE=$((64 << 20))
# The build before the change knows no --elements (16 Mi).
timeout 60 .gl/bin/tensormem-before bench --json --sizes 256 > "$OUT/before-16M.json" 2> "$OUT/before-16M.err" || echo "before: exit $?"
for n in $SMALL $LARGE; do
  timeout 60 .gl/bin/tensormem bench --json --sizes 256 --elements "$n" > "$OUT/after-$((n >> 20))M.json" 2> "$OUT/after-$((n >> 20))M.err" || echo "after $n: exit $?"
  timeout 60 python3 tools/bench/torch_bench.py --sizes 256 --elements "$n" --no-fresh > "$OUT/torch-$((n >> 20))M.json" 2> "$OUT/torch-$((n >> 20))M.err" || echo "torch $n: exit $?"
done
[ -s .gl/target_tmpdir ] && mkdir -p "$(cat .gl/target_tmpdir)" 2>/dev/null
TENSORMEM_GPU_WAIT_LIMIT=30 CI=true timeout 120 .gl/bin/gpu_ops --test-threads 1 > "$OUT/gpu_ops.txt" 2>&1
grep -E '^test result' "$OUT/gpu_ops.txt"
python3 - "$OUT" <<'PY'
import glob, json, os, sys
out = sys.argv[1]
def last_json(path):
    try:
        return json.loads([l for l in open(path) if l.startswith("{")][-1])
    except Exception as e:
        return None
print("| run | add TB/s | copy_ TB/s | row sums TB/s | whole sum TB/s | small ops k/s | tiny op us | of which recording |")
print("|---|---:|---:|---:|---:|---:|---:|---:|")
for path in sorted(glob.glob(f"{out}/*.json")):
    r = last_json(path)
    if r is None:
        print(f"| {os.path.basename(path)} | no result |"); continue
    name = os.path.basename(path)[:-5]
    row = [r["elementwise_gbps"] / 1e3, r["elementwise_copy_gbps"] / 1e3, r["reduction_gbps"][0] / 1e3, r["reduction_gbps"][1] / 1e3,
           r["cached_op_loop_per_s"] / 1e3, r["dispatch_us"], r.get("record_us", float("nan"))]
    print(f"| {name} | " + " | ".join(f"{x:.3g}" for x in row) + " |")
# time = fixed + bytes / bandwidth, from the two sizes (add moves 12 bytes an element, copy_ 8,
# the sums read 4).
print()
print("| pair | figure | fixed us per op | bandwidth TB/s |")
print("|---|---|---:|---:|")
for small, large in [("after-16M", "after-64M"), ("torch-16M", "torch-64M")]:
    a, b = last_json(f"{out}/{small}.json"), last_json(f"{out}/{large}.json")
    if not a or not b:
        continue
    for label, get, per in [("add", lambda r: r["elementwise_gbps"], 12), ("copy_", lambda r: r["elementwise_copy_gbps"], 8),
                            ("row sums", lambda r: r["reduction_gbps"][0], 4), ("whole sum", lambda r: r["reduction_gbps"][1], 4)]:
        ta = per * a["elementwise_elements"] / (get(a) * 1e9)
        tb = per * b["elementwise_elements"] / (get(b) * 1e9)
        ratio = b["elementwise_elements"] / a["elementwise_elements"]
        fixed = (ratio * ta - tb) / (ratio - 1)
        bw = per * (b["elementwise_elements"] - a["elementwise_elements"]) / (tb - ta) / 1e12 if tb > ta else float("nan")
        print(f"| {small[:-4]} | {label} | {fixed * 1e6:.1f} | {bw:.2f} |")
PY
tar czf /tmp/all.tgz -C "$OUT" . && find "$OUT" -mindepth 1 -maxdepth 1 -exec rm -rf {} + && mv /tmp/all.tgz "$OUT/all.tgz"
