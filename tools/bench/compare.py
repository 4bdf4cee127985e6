#!/usr/bin/env python3
"""A markdown table of `tensormem bench --json` beside tools/bench/torch_bench.py's JSON.

    python3 tools/bench/compare.py TENSORMEM.json TORCH.json

Either file may be missing or unreadable: its column is then empty. The ratio column is
tensormem's speed over PyTorch's (above 1: tensormem is faster; for microseconds per op the
inverse of the times)."""

import json
import sys


def load(path):
    try:
        with open(path) as f:
            text = f.read().strip()
        # The JSON object is the last line that parses (anything printed before it is skipped).
        for line in reversed(text.splitlines()):
            line = line.strip()
            if line.startswith("{"):
                return json.loads(line)
    except (OSError, ValueError):
        pass
    return {}


def main():
    tm, pt = load(sys.argv[1]), load(sys.argv[2])
    rows = []  # (what, unit, tensormem, torch, higher_is_better)

    def matmul_of(report, s):
        return next((m for m in report.get("matmul") or [] if m.get("m") == s), {})

    sizes = sorted({m.get("m") for r in (tm, pt) for m in r.get("matmul") or [] if m.get("m")})
    for s in sizes:
        a, b = matmul_of(tm, s), matmul_of(pt, s)
        g = lambda m, key="gflops": None if m.get(key) is None else m[key] / 1e3
        rows.append((f"matmul {s}^3 f32" + (f" [{a.get('kernel')}]" if a.get("kernel") else ""), "TFLOP/s", g(a), g(b), True))
        if b.get("tf32_gflops") is not None:
            rows.append((f"  (torch with TF32, not comparable) {s}^3", "TFLOP/s", None, g(b, "tf32_gflops"), True))
        if a.get("naive_gflops") is not None:
            rows.append((f"  (tensormem naive kernel) {s}^3", "TFLOP/s", g(a, "naive_gflops"), None, True))

    tb = lambda r, key, i=None: (None if r.get(key) is None else (r[key] if i is None else r[key][i]) / 1e3)
    rows.append(("device copy (memcpy / copy_buffer_to_buffer)", "TB/s", tb(tm, "copy_gbps"), tb(pt, "copy_gbps"), True))
    rows.append(("elementwise add 16 Mi f32 (r+r+w)", "TB/s", tb(tm, "elementwise_gbps"), tb(pt, "elementwise_gbps"), True))
    rows.append(("elementwise copy kernel (tm copy_ / torch neg)", "TB/s", tb(tm, "elementwise_copy_gbps"), tb(pt, "elementwise_copy_gbps"), True))
    rows.append(("sum over rows of 1024", "TB/s", tb(tm, "reduction_gbps", 0) if tm.get("reduction_gbps") else None,
                 tb(pt, "reduction_gbps", 0) if pt.get("reduction_gbps") else None, True))
    rows.append(("sum of the whole tensor", "TB/s", tb(tm, "reduction_gbps", 1) if tm.get("reduction_gbps") else None,
                 tb(pt, "reduction_gbps", 1) if pt.get("reduction_gbps") else None, True))
    rows.append(("small op loop (add 64 Ki f32), cached", "k ops/s", tb(tm, "cached_op_loop_per_s"), tb(pt, "cached_op_loop_per_s"), True))
    rows.append(("small op loop, fresh buffer each", "k ops/s", tb(tm, "fresh_buffer_op_loop_per_s"), tb(pt, "fresh_buffer_op_loop_per_s"), True))
    rows.append(("one tiny in-place op (add_ of 4)", "us/op", tm.get("dispatch_us"), pt.get("dispatch_us"), False))
    rows.append(("  of which tensormem recording and submitting it (host)", "us/op", tm.get("record_us"), None, False))
    rows.append(("alloc+free 1 MiB (caching allocator)", "k/s", tb(tm, "alloc_free_per_s"), tb(pt, "alloc_free_per_s"), True))

    # Issue 33's targets on an H100, by figure: tensormem's speed at least this share of PyTorch's.
    targets = {f"matmul {s}^3 f32": 0.5 for s in (2048, 4096)}
    targets.update({"elementwise add 16 Mi f32 (r+r+w)": 0.85, "sum over rows of 1024": 0.6, "one tiny in-place op (add_ of 4)": 0.5})
    fmt = lambda v: "-" if v is None else (f"{v:.3g}" if abs(v) < 100 else f"{v:,.0f}")
    print(f"tensormem: {tm.get('adapter', '(no result)')}  |  PyTorch: {pt.get('adapter', '(no result)')} {pt.get('torch_version', '')}")
    print()
    print("| figure | unit | tensormem | PyTorch | tm/torch speed | target |")
    print("| --- | --- | ---: | ---: | ---: | --- |")
    for what, unit, a, b, higher in rows:
        ratio, target = "-", ""
        goal = next((t for name, t in targets.items() if what.startswith(name)), None)
        if a and b:
            speed = a / b if higher else b / a
            ratio = f"{speed:.2f}x"
            if goal is not None:
                target = f"{'met' if speed >= goal else 'missed'} (>= {goal:.2f}x)"
        elif goal is not None:
            target = f">= {goal:.2f}x"
        print(f"| {what} | {unit} | {fmt(a)} | {fmt(b)} | {ratio} | {target} |")


if __name__ == "__main__":
    main()
