#!/usr/bin/env python3
"""tools/twins/run_all.py within a time budget, for tools/device/h100.sh.

    python3 tools/device/twins.py --tensormem .gl/bin/tensormem --deadline EPOCH_SECONDS
        [--shards 3] [--out-dir target/twins] [--skip hf-generate] [--run-all-args ...]

Two phases, each a set of run_all.py processes with `--only`, then one merged report:
  1. the light scenarios (every one but HEAVY), split over --shards run_all.py processes that
     run at the same time (each twin is its own process: PyTorch's peaks are per process, so
     running side by side changes no figure; together they stay under 25 GB of the card);
  2. HEAVY, one after the other in one run_all.py, alone on the card (oom and hf-train fill it).
Each phase ends by its deadline: its run_all.py processes get SIGTERM, which run_all.py turns
into an orderly stop (the runs done so far are kept in its report.json). Then the rows of all
reports, in `tensormem scenarios` order, go to OUT_DIR/report.json and the table is printed as
run_all.py prints it. Exits 1 when a row has an error, 0 otherwise."""

import argparse
import json
import os
import signal
import subprocess
import sys
import time

HERE = os.path.dirname(os.path.abspath(__file__))
ROOT = os.path.dirname(os.path.dirname(HERE))
TWINS = os.path.join(ROOT, "tools", "twins")
sys.path.insert(0, TWINS)

# Scenarios that need the card alone or take long, in the order they run (most wanted first).
HEAVY = ["gpt2-train", "oom", "hf-train", "hf-generate"]
# Light scenarios of a few GB, spread over different shards.
BIG_LIGHT = ["seed-basics", "lm-train"]


# Set by SIGTERM/SIGINT (an outer `timeout`): every phase stops now, the merge still runs.
STOP = []


def stop(signum, frame):
    STOP.append(signum)


def log(msg):
    print(f"[twins {time.strftime('%H:%M:%S')}] {msg}", flush=True)


def run_phase(name, groups, args, deadline):
    """Starts one run_all.py per group of scenario names, waits until all end or the deadline."""
    procs = []
    for i, only in enumerate(groups):
        if not only:
            continue
        out_dir = os.path.join(args.out_dir, f"{name}-{i}")
        os.makedirs(out_dir, exist_ok=True)
        cmd = [args.python, os.path.join(TWINS, "run_all.py"), "--tensormem", args.tensormem, "--out-dir", out_dir,
               "--only", *only] + args.run_all_args
        logf = open(os.path.join(args.out_dir, f"{name}-{i}.log"), "w")
        log(f"{name}-{i}: {' '.join(only)}")
        procs.append((subprocess.Popen(cmd, cwd=ROOT, stdout=logf, stderr=subprocess.STDOUT, start_new_session=True), logf, f"{name}-{i}"))
    stopped = False
    while any(p.poll() is None for p, _, _ in procs):
        if (time.time() >= deadline or STOP) and not stopped:
            log(f"{name}: {'stopped' if STOP else 'deadline reached'}, stopping what still runs (SIGTERM)")
            for p, _, _ in procs:
                if p.poll() is None:
                    p.send_signal(signal.SIGTERM)
            stopped = True
            grace = time.time() + (5 if STOP else 15)
        if stopped and time.time() >= grace:
            for p, _, label in procs:
                if p.poll() is None:
                    log(f"{label}: still running after SIGTERM, killed")
                    try:
                        os.killpg(p.pid, signal.SIGKILL)
                    except ProcessLookupError:
                        pass
            break
        time.sleep(0.5)
    for p, logf, label in procs:
        p.wait()
        logf.close()
        log(f"{label}: exit {p.returncode}")


def main():
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--tensormem", required=True)
    parser.add_argument("--deadline", type=float, required=True, help="epoch seconds by which everything must have ended")
    parser.add_argument("--shards", type=int, default=3)
    parser.add_argument("--out-dir", default=os.path.join(ROOT, "target", "twins"))
    parser.add_argument("--python", default=sys.executable)
    parser.add_argument("--skip", nargs="*", default=[], help="scenarios not to run")
    parser.add_argument("--heavy-reserve", type=float, default=60, help="seconds kept for the heavy phase when the light one is slow")
    parser.add_argument("--run-all-args", nargs=argparse.REMAINDER, default=[], help="passed on to every run_all.py (last option)")
    args = parser.parse_args()
    args.tensormem = os.path.abspath(args.tensormem)
    signal.signal(signal.SIGTERM, stop)
    signal.signal(signal.SIGINT, stop)
    os.makedirs(args.out_dir, exist_ok=True)

    import run_all  # noqa: E402  (imports no torch itself)

    if "--cpu-dry-run" not in args.run_all_args:
        gpu, why = run_all.cuda_status(args.python)
        if gpu is None:
            log(f"No CUDA device: {why}. Nothing was run.")
            print("twins: 0 compared, 0 failed or not run, 0 skipped (no CUDA device)")
            sys.exit(1)
        log(f"GPU: {gpu}")

    listed = subprocess.run([args.tensormem, "scenarios", "--json"], capture_output=True, text=True, cwd=ROOT)
    if listed.returncode != 0:
        log(f"tensormem scenarios failed: {listed.stderr.strip()}")
        sys.exit(1)
    order = [s["name"] for s in json.loads(listed.stdout)]
    runs = {s["name"]: max(1, len(s["variants"] or [])) for s in json.loads(listed.stdout)}
    wanted = [n for n in order if n not in args.skip]
    light = [n for n in wanted if n not in HEAVY]
    heavy = [n for n in HEAVY if n in wanted]

    # Light scenarios over the shards: the big ones first, one per shard, then by runs, each to
    # the shard with the fewest runs so far.
    shards = [[] for _ in range(max(1, args.shards))]
    load = [0] * len(shards)
    for n in [n for n in BIG_LIGHT if n in light] + [n for n in light if n not in BIG_LIGHT]:
        i = load.index(min(load))
        shards[i].append(n)
        load[i] += runs[n] + (2 if n in BIG_LIGHT else 0)
    # Keep tensormem's order inside each shard (the table is sorted at the end anyway).
    shards = [sorted(s, key=order.index) for s in shards]

    started = time.time()
    log(f"{len(light)} light scenarios on {len(shards)} shards, then {heavy}; {args.deadline - started:.0f} s left")
    light_deadline = args.deadline - (args.heavy_reserve if heavy else 0)
    run_phase("light", shards, args, light_deadline)
    if heavy and time.time() < args.deadline - 5 and not STOP:
        log(f"heavy phase: {args.deadline - time.time():.0f} s left")
        run_phase("heavy", [heavy], args, args.deadline)
    elif heavy:
        log("no time left for the heavy phase")

    # Merge.
    rows, gpu, device = [], None, None
    for entry in sorted(os.listdir(args.out_dir)):
        path = os.path.join(args.out_dir, entry, "report.json")
        if not (entry.startswith("light-") or entry.startswith("heavy-")) or not os.path.isfile(path):
            continue
        try:
            report = json.load(open(path))
        except ValueError as e:
            log(f"{path}: unreadable ({e})")
            continue
        gpu, device = report.get("gpu") or gpu, report.get("device") or device
        rows.extend(report.get("rows", []))
    done = {(r["scenario"], r["variant"]) for r in rows}
    for n in wanted:
        if n not in {r["scenario"] for r in rows}:
            rows.append({"scenario": n, "variant": None, "error": "not run (out of time)"})
    for n in args.skip:
        rows.append({"scenario": n, "variant": None, "error": "skipped (--skip)"})
    rows.sort(key=lambda r: (order.index(r["scenario"]) if r["scenario"] in order else len(order), str(r.get("variant"))))
    run_all.write_report(args.out_dir, gpu, device, rows)
    ok = sum(1 for r in rows if "error" not in r)
    failed = sum(1 for r in rows if "error" in r and not r["error"].startswith("skipped"))
    log(f"{ok} of {len(rows)} runs compared, {failed} failed or not run ({len(done)} started) in {time.time() - started:.0f} s; GPU: {gpu}")
    run_all.print_table(rows, args.out_dir)
    print(f"twins: {ok} compared, {failed} failed or not run, {len(rows) - ok - failed} skipped")
    sys.exit(1 if failed else 0)


if __name__ == "__main__":
    main()
