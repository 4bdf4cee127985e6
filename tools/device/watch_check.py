#!/usr/bin/env python3
"""Issue 35's check of ``tensormem.watch()`` on a real CUDA device (run by tools/device/h100.sh).

The wheel (target/wheels/*.whl, copied into .gl/wheel/ by tools/device/prepare.sh) is unpacked into
a folder put on PYTHONPATH: the lent machine has PyTorch but no network, and its pip may not
install into the system's Python. Three scripts then run as a user would write them:

  oom     an MLP whose activations outgrow the card, trained under ``@tensormem.watch(...)``: it
          must end with PyTorch's own OutOfMemoryError, print the diagnosis (the request first),
          and leave a snapshot whose out-of-memory the doctor reproduces by replay, as
          ``tensormem replay --capacity`` does;
  normal  the same model at a batch that fits: it must end normally, print its peak and write
          its snapshot, which replays exactly;
  nocuda  the normal script with no visible CUDA device: watch() says it needs CUDA and the
          script runs unchanged (on the CPU).

Everything each printed lands in OUT/watch/<name>.out|.err; the last lines say PASS or FAIL per
check, and the exit status is 0 when all passed.

    python3 tools/device/watch_check.py --wheel .gl/wheel/tensormem-*.whl --out $OUT/watch
"""

import argparse
import glob
import json
import os
import re
import subprocess
import sys
import tempfile
import textwrap
import time
import zipfile

MODEL = """
import sys, torch, tensormem

def model_and_data(rows, device):
    layers = []
    for _ in range(12):
        layers += [torch.nn.Linear(4096, 4096), torch.nn.ReLU()]
    model = torch.nn.Sequential(*layers).to(device)
    return model, torch.optim.AdamW(model.parameters(), lr=1e-4), torch.randn(rows, 4096, device=device)

@tensormem.watch(path=sys.argv[1])
def train(rows):
    device = "cuda" if torch.cuda.is_available() else "cpu"
    model, optimizer, x = model_and_data(rows, device)
    for step in range(3):
        loss = model(x).square().mean()
        loss.backward()
        optimizer.step()
        optimizer.zero_grad(set_to_none=True)
    print(f"trained 3 steps on {device}, last loss {loss.item():.4f}")

train(int(sys.argv[2]))
"""

SCRIPTS = {
    # 2**19 rows: each layer's output is 8 GiB, and autograd keeps one per layer (ReLU's output,
    # the next Linear's input): the forward runs out at its ninth layer on an 80 GB card.
    "oom": (1 << 19, {}),
    "normal": (4096, {}),
    "nocuda": (256, {"CUDA_VISIBLE_DEVICES": ""}),
}


def main():
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--wheel", required=True, help="the wheel (a glob is expanded)")
    parser.add_argument("--out", required=True, help="folder for the scripts, outputs and snapshots")
    parser.add_argument("--timeout", type=float, default=100, help="seconds per script")
    args = parser.parse_args()
    out = os.path.abspath(args.out)
    os.makedirs(out, exist_ok=True)
    wheels = sorted(glob.glob(args.wheel))
    if not wheels:
        print(f"FAIL no wheel matches {args.wheel} (run tools/device/prepare.sh)")
        return 1
    # Outside OUT: what is under OUT comes back from the lent machine, and the library is 13 MB.
    site = tempfile.mkdtemp(prefix="tensormem-wheel-")
    with zipfile.ZipFile(wheels[-1]) as wheel:
        wheel.extractall(site)
    env = dict(os.environ, PYTHONPATH=site + os.pathsep + os.environ.get("PYTHONPATH", ""), PYTHONUNBUFFERED="1")
    script = os.path.join(out, "train.py")
    with open(script, "w") as f:
        f.write(textwrap.dedent(MODEL))

    results = []

    def check(name, ok, detail=""):
        results.append((name, bool(ok), detail))
        print(f"{'PASS' if ok else 'FAIL'} {name}{': ' + detail if detail else ''}", flush=True)

    def run(name, argv, extra_env=None, timeout=args.timeout):
        started = time.monotonic()
        try:
            done = subprocess.run(argv, env=dict(env, **(extra_env or {})), capture_output=True, text=True, timeout=timeout)
            rc, stdout, stderr = done.returncode, done.stdout, done.stderr
        except subprocess.TimeoutExpired as e:
            rc, stdout, stderr = "timeout", e.stdout or "", e.stderr or ""
            stdout = stdout.decode(errors="replace") if isinstance(stdout, bytes) else stdout
            stderr = stderr.decode(errors="replace") if isinstance(stderr, bytes) else stderr
        took = time.monotonic() - started
        for suffix, text in (("out", stdout), ("err", stderr)):
            with open(os.path.join(out, f"{name}.{suffix}"), "w") as f:
                f.write(text)
        print(f"== {name}: exit {rc} in {took:.1f} s ({' '.join(argv[1:])})", flush=True)
        print(textwrap.indent((stdout + stderr)[-6000:], "   "), flush=True)
        return rc, stdout, stderr

    cli = [sys.executable, "-m", "tensormem"]
    for name, (rows, extra_env) in SCRIPTS.items():
        snapshot = os.path.join(out, f"{name}.pickle")
        rc, stdout, stderr = run(name, [sys.executable, script, snapshot, str(rows)], extra_env)
        if name == "oom":
            check("oom: the script's own OutOfMemoryError reaches it", rc == 1 and "OutOfMemoryError" in stderr, f"exit {rc}")
            check("oom: the request is said first", "tensormem: out of memory on cuda:" in stderr)
            check("oom: the doctor's diagnosis printed, the out-of-memory first", re.search(r"<tensormem diagnosis: \d+ findings>\n  \[oom\] ", stderr) is not None)
            check("oom: where the file is", f"snapshot written to {snapshot}" in stderr)
            check("oom: the snapshot written", os.path.exists(snapshot))
            if os.path.exists(snapshot):
                drc, dout, _ = run("oom-doctor", cli + ["doctor", snapshot, "--json"])
                oom = [f for line in dout.splitlines() if line.startswith("{") for f in json.loads(line).get("findings", []) if f.get("kind") == "oom"]
                evidence = oom[0].get("evidence", {}) if oom else {}
                brief = {k: v for k, v in evidence.items() if k != "live"}
                check("oom: the doctor finds the out-of-memory", drc == 0 and oom, json.dumps(brief)[:600])
                check("oom: reproduced by replay", evidence.get("reproduced_by_replay") is True)
                capacity = evidence.get("capacity_bytes")
                if capacity:
                    rrc, rout, _ = run("oom-replay", cli + ["replay", snapshot, "--capacity", str(capacity), "--json"])
                    replays = [json.loads(line) for line in rout.splitlines() if line.startswith("{")]
                    check("oom: `tensormem replay --capacity` runs out too", rrc == 0 and any(r.get("first_oom_event") is not None for r in replays),
                          ", ".join(f"device {r.get('device')}: first_oom_event {r.get('first_oom_event')}, segment match {r.get('segment_alloc_match')}" for r in replays))
        elif name == "normal":
            check("normal: ends normally", rc == 0, f"exit {rc}")
            check("normal: prints the peak", "peaked at" in stderr)
            check("normal: the snapshot written", os.path.exists(snapshot))
            if os.path.exists(snapshot):
                rrc, rout, _ = run("normal-replay", cli + ["replay", snapshot, "--json"])
                replays = [json.loads(line) for line in rout.splitlines() if line.startswith("{")]
                check("normal: replay reproduces it", rrc == 0 and replays and all(r.get("segment_alloc_match") == 1.0 and r.get("final_state_match") for r in replays),
                      ", ".join(f"device {r.get('device')}: segments {r.get('segment_alloc_match')}, addresses {r.get('address_match')}" for r in replays))
        else:
            check("nocuda: says it needs CUDA", "needs PyTorch with CUDA" in stderr)
            check("nocuda: the script runs unchanged", rc == 0 and "trained 3 steps on cpu" in stdout, f"exit {rc}")
            check("nocuda: no snapshot", not os.path.exists(snapshot))

    failed = [r for r in results if not r[1]]
    print(f"watch: {len(results) - len(failed)} of {len(results)} checks passed")
    return 1 if failed else 0


if __name__ == "__main__":
    sys.exit(main())
