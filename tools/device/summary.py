#!/usr/bin/env python3
"""The compact summary of tools/device/h100.sh's results in OUT (a few kB, printed last).

    python3 tools/device/summary.py OUT

Steps (exit, seconds), the adapter, the op suite's counts and failures, the bench table, and
the watch() checks, one line per twin run."""

import json
import os
import re
import sys

MIB = 1 << 20


def read(out, name):
    try:
        with open(os.path.join(out, name), errors="replace") as f:
            return f.read()
    except OSError:
        return ""


def steps(out):
    print("## steps (name: exit, seconds of limit)")
    parts = []
    for line in read(out, "steps.tsv").splitlines():
        f = line.split("\t")
        if len(f) == 4:
            name, rc, took, lim = f
            flag = "" if rc in ("0", "skipped") else (" TIMEOUT" if rc in ("124", "137") else " FAIL")
            parts.append(f"{name}: {rc}{flag}, {took}/{lim} s")
    print("; ".join(parts) or "(none)")


def adapter(out):
    print("\n## adapter")
    backend = read(out, "backend.txt").strip()
    print(f"nvidia-smi: {read(out, 'nvidia_smi.out').strip().splitlines()[:1] or read(out, 'nvidia_smi.err').strip()[:200]}")
    print(f"torch: {read(out, 'torch.out').strip() or read(out, 'torch.err').strip()[-200:]}")
    info = read(out, "info.out") or read(out, "info_gl.out")
    lines = [line for line in info.splitlines() if line.split(":")[0] in ("adapter", "driver", "f16")]
    print(f"tensormem info (WGPU_BACKEND={backend}): " + (" | ".join(x.strip() for x in lines) or "FAILED: " + read(out, "info.err").strip()[-300:]))


def gpu_ops(out, step="gpu_ops", title="op suite (tests/gpu_ops.rs)"):
    print(f"\n## {title}")
    text = read(out, f"{step}.out") + "\n" + read(out, f"{step}.err")
    results = re.findall(r"^test result: .*$", text, re.M)
    ok = re.findall(r"^test (\S+) \.\.\. ok$", text, re.M)
    failed = re.findall(r"^test (\S+) \.\.\. FAILED$", text, re.M)
    skipped = sorted(set(re.findall(r"^SKIPPED (\S+):", text, re.M)))
    slow = sorted(set(re.findall(r"^test (\S+) has been running for over 60 seconds", text, re.M)))
    print(results[-1] if results else f"no result line (stopped?): {len(ok)} ok, {len(failed)} failed so far")
    print(f"{step}: {len(ok) - len(skipped)} passed, {len(failed)} failed, {len(skipped)} skipped")
    if failed:
        print("failed: " + ", ".join(failed))
        # The first panic message of each failure, shortened.
        for name in failed[:6]:
            m = re.search(r"---- " + re.escape(name) + r" stdout ----\n(.*?)(?:\n\n|\Z)", text, re.S)
            if m:
                msg = " ".join(m.group(1).split())
                print(f"  {name}: {msg[:240]}")
    # One test at a time, the harness names a test before running it: the one with no result.
    started = re.findall(r"^test (\S+) \.\.\. ?$", text, re.M)
    unfinished = [s for s in slow + started if s not in ok and s not in failed]
    if unfinished:
        print("still running when stopped: " + ", ".join(unfinished))
        samples(out, step)
    if skipped:
        print("skipped: " + ", ".join(skipped))


def gpu_ops_again(out):
    """The suite again (h100.sh): 16 tests at a time where it passed one at a time, else the
    tests it did not pass without measured matmul kernels."""
    if read(out, "gpu_ops_parallel.out") or read(out, "gpu_ops_parallel.err"):
        gpu_ops(out, "gpu_ops_parallel", "the op suite again, 16 tests at a time")
    if read(out, "gpu_ops_rule.out") or read(out, "gpu_ops_rule.err"):
        gpu_ops(out, "gpu_ops_rule", "the tests it did not pass, with TENSORMEM_MATMUL=heuristic (no measured kernels)")


def samples(out, step):
    """Where a stopped step waited (h100.sh's sampler): its threads at the last sample, and the
    innermost frames of each thread's stack, where they were taken."""
    text = read(out, f"{step}.samples")
    if not text:
        return
    blocks = re.split(r"^--- ", text, flags=re.M)
    threads = [b for b in blocks if re.match(r"\d+ s\n", b)]
    if threads:
        print(f"{step} threads at {threads[-1].splitlines()[0]}:")
        for line in threads[-1].splitlines()[1:16]:
            print("  " + line.strip())
    stacks = [b for b in blocks if b.startswith("stacks")]
    if stacks:
        # gdb: "Thread N (...)" then "#0 ..." frames; /proc: "[tid] comm syscall: ..." lines.
        shown = [line.strip()[:160] for line in stacks[-1].splitlines() if re.match(r"\s*(Thread \d|#[0-3] |\[\d+\])", line)]
        print(f"{step} stacks ({len(shown)} lines; all in {step}.samples):")
        for line in shown[:40]:
            print("  " + line)


def bench(out):
    print("\n## bench: tensormem vs PyTorch (same card)")
    table = read(out, "bench_table.md").strip()
    print(table or "(no table)")
    for name in ("tensormem_bench", "torch_bench"):
        err = read(out, name + ".err").strip()
        if err and not read(out, name + ".out").strip():
            print(f"{name} failed: {err[-300:]}")


def watch(out):
    print("\n## tensormem.watch() from the wheel (tools/device/watch_check.py)")
    text = read(out, "watch.out")
    lines = [line for line in text.splitlines() if re.match(r"^(PASS|FAIL|watch:)", line)]
    print("\n".join(lines) or "(no result) " + read(out, "watch.err").strip()[-400:])


def twins(out):
    print("\n## twins: PyTorch on the card vs tensormem run --device sim:H100-80GB (MiB; diff = tm - torch)")
    try:
        report = json.loads(read(out, "twins/report.json"))
    except ValueError:
        print("(no twins/report.json) " + read(out, "twins.out").strip()[-600:] + read(out, "twins.err").strip()[-600:])
        return
    print(f"GPU: {report.get('gpu')}")
    pct = lambda a, b: "-" if a is None or b is None else (f"{100.0 * (b - a) / a:+.1f}%" if a else f"{(b - a) / MIB:+.1f}")
    m = lambda x: "-" if x is None else f"{x / MIB:.0f}"
    counts = {"compared": 0, "error": 0, "skipped": 0}
    for r in report.get("rows", []):
        label = r["scenario"] + (f"/{r['variant']}" if r.get("variant") else "")
        if "error" in r:
            counts["skipped" if r["error"].startswith("skipped") else "error"] += 1
            print(f"{label:34} ERROR {' '.join(r['error'].split())[:110]}")
            continue
        counts["compared"] += 1
        pt, tm, rp = r.get("pytorch") or {}, r.get("tensormem") or {}, r.get("replay") or {}
        pa, pr, ta, tr = pt.get("peak_allocated_bytes"), pt.get("peak_reserved_bytes"), tm.get("peak_allocated_bytes"), tm.get("peak_reserved_bytes")
        oom = (" torchOOM" if pt.get("out_of_memory") else "") + (" tmOOM" if tm.get("out_of_memory") else "")
        steps_ne = f"{len(r.get('steps_differing', []))}/{len(tm.get('steps', []))}" + ("!n" if "steps_count" in r else "")
        replay = f"{100 * rp['segment_alloc_match']:.0f}/{100 * rp['address_match']:.0f}%" if "segment_alloc_match" in rp else "-"
        kinds = lambda d: "-" if not d else ("err" if "error" in d else ",".join(k for k in d["kinds"] if k != "peak") or "peak")
        print(f"{label:34} alloc {m(pa)}/{m(ta)} {pct(pa, ta)}  resv {m(pr)}/{m(tr)} {pct(pr, tr)}  steps!= {steps_ne}  replay {replay}"
              f"  doc {kinds(r.get('doctor_pytorch'))}|{kinds(r.get('doctor_tensormem'))}{oom}  {r.get('twin_seconds', '')}s")
    print(f"twins: {counts['compared']} compared, {counts['error']} errors or not run, {counts['skipped']} skipped")


def main():
    out = sys.argv[1] if len(sys.argv) > 1 else os.environ.get("OUT", "/tmp/out")
    print("=" * 30 + " SUMMARY " + "=" * 30)
    for part in (steps, adapter, gpu_ops, gpu_ops_again, bench, watch, twins):
        try:
            part(out)
        except Exception as e:  # a summary never fails the run
            print(f"({part.__name__}: summary failed: {e!r})")


if __name__ == "__main__":
    main()
