#!/usr/bin/env python3
"""Runs every PyTorch twin on CUDA and compares it with tensormem's simulation of the same scenario.

    python3 tools/twins/run_all.py [--only NAME ...] [--tensormem PATH] [--device sim:H100-80GB]

For each scenario of `tensormem scenarios --json`, each of its variants and each setting
OTHER_SETTINGS names for it (the eager step, the shared pool):
  1. the twin runs on the GPU and writes its snapshot, target/twins/<name>[-<variant>].pickle,
     and its summary (.json: steps and peaks, as `tensormem run --json`);
  2. `tensormem run NAME [--variant V] --device sim:H100-80GB --json` simulates it (its trace
     written beside, .tensormem.pickle);
  3. `tensormem replay` replays PyTorch's snapshot through tensormem's allocator (the share of
     segment decisions and addresses it matches);
  4. where the binary has `tensormem doctor`, the finding kinds on PyTorch's snapshot and on the
     scenario.
Then a table: PyTorch's peak allocated and reserved, tensormem's, their differences, the labelled
steps whose allocated bytes differ, the replay's match, the doctor's kinds; and
target/twins/report.json with everything. Without a CUDA device (or without torch) it says so
and exits 0. It exits 1 only when a twin or tensormem fails to run.
"""

import argparse
import json
import os
import signal
import subprocess
import sys
import time

HERE = os.path.dirname(os.path.abspath(__file__))
ROOT = os.path.dirname(os.path.dirname(HERE))
sys.path.insert(0, HERE)
from check import find_tensormem, twin_file  # noqa: E402

MIB = 1 << 20


def mib(n):
    return "-" if n is None else f"{n / MIB:,.1f}"


def diff(a, b):
    if a is None or b is None:
        return "-"
    d = b - a
    pct = f" ({100.0 * d / a:+.2f}%)" if a else ""
    return f"{d / MIB:+,.2f}{pct}"


def run(cmd, **kw):
    return subprocess.run(cmd, capture_output=True, text=True, cwd=ROOT, **kw)


def cuda_status(python):
    probe = run([python, "-c", "import torch, json; print(json.dumps([torch.__version__, torch.cuda.is_available(), "
                 "torch.cuda.get_device_name(0) if torch.cuda.is_available() else None]))"])
    if probe.returncode != 0:
        return None, f"`import torch` fails in {python}: {probe.stderr.strip().splitlines()[-1:]}"
    version, available, name = json.loads(probe.stdout.strip().splitlines()[-1])
    if not available:
        return None, f"torch {version} sees no CUDA device"
    return f"{name}, torch {version}", None


def doctor_kinds(tensormem, args):
    out = run(tensormem + ["doctor"] + args + ["--json"])
    if out.returncode != 0:
        return {"error": (out.stderr.strip() or out.stdout.strip())[:300]}
    try:
        findings = json.loads(out.stdout)["findings"]
    except (ValueError, KeyError) as e:
        return {"error": f"unreadable doctor output: {e}"}
    return {"kinds": [f.get("kind") for f in findings], "findings": findings}


def main():
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--only", nargs="*", help="only these scenarios")
    parser.add_argument("--variant", choices=["mistake", "fix"], help="only this variant")
    parser.add_argument("--tensormem", help="the tensormem binary (default: target/debug/tensormem, else cargo run)")
    parser.add_argument("--python", default=sys.executable, help="the Python with torch (CUDA) that runs the twins")
    parser.add_argument("--device", default="sim:H100-80GB", help="tensormem's simulated card (default sim:H100-80GB)")
    parser.add_argument("--out-dir", default=os.path.join(ROOT, "target", "twins"))
    parser.add_argument("--stacks", choices=["python", "all"], default="python", help="stacks the twins record")
    parser.add_argument("--natural-lifetimes", action="store_true",
                        help="the twins free what natural PyTorch code frees where tensormem keeps it (models.py's `# tensormem keeps`)")
    parser.add_argument("--cpu-dry-run", action="store_true", help="test this script without a GPU: the twins run on the CPU (no snapshot, no peaks)")
    args = parser.parse_args()

    gpu, why = cuda_status(args.python)
    if args.cpu_dry_run:
        gpu = "CPU (dry run)"
    elif gpu is None:
        print(f"No CUDA device: {why}. The twins need an NVIDIA GPU and PyTorch with CUDA; nothing was run.")
        sys.exit(0)
    tensormem = find_tensormem(args.tensormem)
    listed = run(tensormem + ["scenarios", "--json"])
    if listed.returncode != 0:
        print(f"tensormem scenarios failed: {listed.stderr.strip()}")
        sys.exit(1)
    scenarios = json.loads(listed.stdout)
    if args.only:
        unknown = set(args.only) - {s["name"] for s in scenarios}
        if unknown:
            print(f"unknown scenarios: {', '.join(sorted(unknown))}")
            sys.exit(2)
        scenarios = [s for s in scenarios if s["name"] in args.only]
    has_doctor = run(tensormem + ["doctor", "--help"]).returncode == 0
    os.makedirs(args.out_dir, exist_ok=True)
    print(f"GPU: {gpu}; tensormem on {args.device}; doctor: {'yes' if has_doctor else 'not in this binary'}", flush=True)

    rows, failures = [], 0
    # report.json is rewritten after every run, and a SIGTERM (`timeout`) or Ctrl-C stops the
    # loop in order: the runs done so far keep their results, the table is still printed.
    signal.signal(signal.SIGTERM, signal.default_int_handler)
    try:
        failures = run_scenarios(args, scenarios, tensormem, has_doctor, gpu, rows)
    except KeyboardInterrupt:
        if rows and "steps_differing" not in rows[-1] and "error" not in rows[-1]:
            rows[-1]["error"] = "interrupted (run_all.py was stopped)"
        failures = sum(1 for r in rows if "error" in r)
        print("\nstopped: the table holds the runs done so far", flush=True)
    save_report(args, gpu, rows)
    print_table(rows, args.out_dir)
    sys.exit(1 if failures else 0)


def save_report(args, gpu, rows):
    write_report(args.out_dir, gpu, args.device, rows)


def write_report(out_dir, gpu, device, rows):
    """OUT_DIR/report.json, whole or not at all (written beside it, then renamed over it): a
    stop mid-write keeps the previous report."""
    path = os.path.join(out_dir, "report.json")
    with open(path + ".tmp", "w") as f:
        json.dump({"gpu": gpu, "device": device, "rows": rows}, f, indent=1)
    os.replace(path + ".tmp", path)


def ran_out_of_memory(sim):
    """The summary of a `tensormem run` that exits non-zero because the scenario ran out of
    memory (its JSON is printed first, `out_of_memory` set): a result to compare, as PyTorch's
    run of the same program may run out too. None for any other failure."""
    try:
        summary = json.loads(sim.stdout)
    except ValueError:
        return None
    return summary if summary.get("out_of_memory") else None


# Settings recorded besides each scenario's defaults: the other side of a comparison its
# scenario teaches, where that side is a parameter rather than a variant.
OTHER_SETTINGS = {"cuda-graph-step": ["mode=eager"], "cuda-graph-pools": ["pools=shared"]}


def run_scenarios(args, scenarios, tensormem, has_doctor, gpu, rows):
    failures = 0
    for s in scenarios:
        name = s["name"]
        variants = [v for v in (s["variants"] or [None]) if args.variant in (None, v) or v is None]
        others = [(None, setting) for setting in OTHER_SETTINGS.get(name, []) if args.variant is None]
        for variant, setting in [(v, None) for v in variants] + others:
            stem = os.path.join(args.out_dir, name + (f"-{variant}" if variant else "") + (f"-{setting.replace('=', '-')}" if setting else ""))
            vargs = (["--variant", variant] if variant else []) + (["--set", setting] if setting else [])
            label = " ".join([name] + vargs)
            row = {"scenario": name, "variant": variant, "setting": setting, "snapshot": stem + ".pickle"}
            save_report(args, gpu, rows)
            rows.append(row)
            print(f"== {label}", flush=True)
            if not os.path.exists(twin_file(name)):
                row["error"] = "no twin"
                failures += 1
                continue
            started = time.monotonic()
            target = ["--device", "cpu"] if args.cpu_dry_run else ["--device", "cuda", "--out", stem + ".pickle"]
            twin = run([args.python, twin_file(name)] + target + ["--summary", stem + ".json", "--stacks", args.stacks] + vargs
                       + (["--natural-lifetimes"] if args.natural_lifetimes else []))
            row["twin_seconds"] = round(time.monotonic() - started, 1)
            if twin.returncode != 0:
                row["error"] = f"twin failed (exit {twin.returncode}): {twin.stderr.strip()[-600:]}"
                print(row["error"])
                failures += 1
                continue
            row["pytorch"] = json.loads(twin.stdout.strip().splitlines()[-1])
            sim = run(tensormem + ["run", name, "--device", args.device, "--json", "--snapshot", stem + ".tensormem.pickle"] + vargs)
            summary = ran_out_of_memory(sim) if sim.returncode != 0 else json.loads(sim.stdout)
            if summary is None:
                row["error"] = f"tensormem run failed: {sim.stderr.strip()[-600:]}"
                print(row["error"])
                failures += 1
                continue
            row["tensormem"] = summary
            replay = run(tensormem + ["replay", stem + ".pickle", "--json"]) if not args.cpu_dry_run else None
            if replay is None:
                row["replay"] = None
            elif replay.returncode == 0:
                devices = [json.loads(line) for line in replay.stdout.splitlines() if line.strip()]
                traced = [d for d in devices if d.get("events")] or devices
                row["replay"] = traced[0] if traced else None
            else:
                row["replay"] = {"error": replay.stderr.strip()[-300:]}
            if has_doctor and not args.cpu_dry_run:
                row["doctor_pytorch"] = doctor_kinds(tensormem, [stem + ".pickle"])
                row["doctor_tensormem"] = doctor_kinds(tensormem, ["--scenario", name, "--device", args.device] + vargs)
            torch_steps, sim_steps = row["pytorch"]["steps"], row["tensormem"]["steps"]
            row["steps_differing"] = [
                {"label": b["label"], "pytorch": a["allocated_bytes"], "tensormem": b["allocated_bytes"]}
                for a, b in zip(torch_steps, sim_steps) if a["allocated_bytes"] != b["allocated_bytes"]
            ]
            if len(torch_steps) != len(sim_steps):
                row["steps_count"] = [len(torch_steps), len(sim_steps)]
    return failures


def print_table(rows, out_dir):
    header = ["scenario", "variant", "torch alloc MiB", "torch resv MiB", "tm alloc MiB", "tm resv MiB", "alloc diff MiB", "resv diff MiB",
              "steps !=", "replay seg/addr", "doctor torch", "doctor tm"]
    table = []
    for r in rows:
        pt, tm = r.get("pytorch") or {}, r.get("tensormem") or {}
        rp = r.get("replay") or {}
        oom = lambda x: " OOM" if x.get("out_of_memory") else ""
        kinds = lambda d: "-" if not d else ("error" if "error" in d else ",".join(k for k in d["kinds"] if k != "peak") or "(peak only)")
        if "error" in r:
            table.append([r["scenario"], r["variant"] or r.get("setting") or "", "ERROR: " + r["error"].splitlines()[0][:80]] + [""] * (len(header) - 3))
            continue
        table.append([
            r["scenario"], r["variant"] or r.get("setting") or "",
            mib(pt.get("peak_allocated_bytes")) + oom(pt), mib(pt.get("peak_reserved_bytes")),
            mib(tm.get("peak_allocated_bytes")) + oom(tm), mib(tm.get("peak_reserved_bytes")),
            diff(pt.get("peak_allocated_bytes"), tm.get("peak_allocated_bytes")), diff(pt.get("peak_reserved_bytes"), tm.get("peak_reserved_bytes")),
            f"{len(r['steps_differing'])}/{len(tm.get('steps', []))}" + (" (count differs)" if "steps_count" in r else ""),
            (f"{100 * rp['segment_alloc_match']:.0f}%/{100 * rp['address_match']:.0f}%" if "segment_alloc_match" in rp else "-"),
            kinds(r.get("doctor_pytorch")), kinds(r.get("doctor_tensormem")),
        ])
    widths = [max(len(str(x)) for x in col) for col in zip(header, *table)]
    print()
    for line in [header] + table:
        print("  ".join(str(x).ljust(w) for x, w in zip(line, widths)).rstrip())
    print(f"\nalloc/resv diff = tensormem - PyTorch. PyTorch's figures include what tensormem does not model "
          f"(cuBLAS workspaces; see tools/twins/README.md). Full report: {os.path.relpath(os.path.join(out_dir, 'report.json'), ROOT)}")


if __name__ == "__main__":
    main()
