#!/usr/bin/env python3
"""Checks the PyTorch twins without a GPU.

(a) One twin per scenario of `tensormem scenarios --json`, with the same name, variants and
    parameters (names, defaults and kinds, in order), read from the twins' literals without
    importing torch; and every twin compiles (py_compile).
(b) Only where `import torch` works: every twin runs on the CPU (`--device cpu`, no snapshot) at
    small sizes, each variant, and its labelled steps are the ones `tensormem run` records with
    the same settings (same count, same labels: the twins mark the same steps). The 7B `oom`
    twin is not run on the CPU.

    python3 tools/twins/check.py [--tensormem PATH] [--python PYTHON] [--skip-run] [--live]

Prints one line per check and a closing `twins: N passed, M failed, K skipped`; exits 1 on any
failure.
"""

import argparse
import ast
import glob
import json
import os
import re
import py_compile
import shutil
import subprocess
import sys
import tempfile
import time
import types

HERE = os.path.dirname(os.path.abspath(__file__))
ROOT = os.path.dirname(os.path.dirname(HERE))
# Modules of tools/twins/ that are not twins.
NOT_TWINS = {"common.py", "models.py", "check.py", "run_all.py"}

# Small sizes for the CPU runs (each also checked against `tensormem run` at the same settings);
# several settings where a parameter changes the program's path.
CPU_SETTINGS = {
    "variable-batch": ["layers=2,hidden=32,seq=4,batches=3,2,4"],
    "seed-basics": ["n=16"],
    "intermediates": [""],
    "views-vs-copies": ["n=64"],
    "inplace-chain": ["n=64"],
    "broadcast-temporaries": ["rows=16,cols=16,depth=8"],
    "contiguous": ["n=64,steps=2"],
    "alloc-in-loop": ["n=64,steps=3"],
    "eval-no-grad": ["batch=2,context=16,steps=2", "batch=2,context=16,steps=2,guard=inference_mode"],
    "loss-history": ["batch=2,context=16,steps=2", "batch=2,context=16,steps=2,backward=false"],
    "zero-grad": ["batch=2,context=16,steps=2", "batch=2,context=16,steps=2,set_to_none=false"],
    "grad-fn-history": ["batch=2,context=16,steps=2"],
    "rnn-hidden": ["batch=4,timesteps=3,hidden=16,steps=2"],
    "cached-graph": ["batch=4,width=32,steps=2"],
    "cuda-graph-step": ["batch=2,context=16,steps=2", "mode=eager,batch=2,context=16,steps=2"],
    "cuda-graph-pools": ["context=16,batches=2,1", "context=16,batches=2,1,pools=shared"],
    "optimizer-state": ["batch=2,context=16,steps=2", "optimizer=sgd,batch=2,context=16,steps=2", "optimizer=momentum,batch=2,context=16,steps=2",
                        "foreach=false,batch=2,context=16,steps=2"],
    "grad-accumulation": ["batch=5,micro_batches=2,context=16,steps=1"],
    "checkpointing": ["layers=2,batch=2,context=16"],
    "mixed-precision": ["batch=2,context=16,steps=1", "amp=false,batch=2,context=16,steps=1"],
    "lm-train": ["size=small,batch=1,context=8", "size=small,batch=1,context=4,amp=true",
                 "size=small,batch=1,context=8,optimizer=adamw,amp=true,checkpointing=true,steps=2",
                 "size=small,batch=1,context=4,amp=bfloat16,warmup=0",
                 "size=small,batch=1,context=8,optimizer=adamw,foreach=false,warmup=0"],
    "gpt2-train": ["size=small,batch=1,context=8", "size=small,batch=1,context=8,optimizer=sgd,checkpointing=true",
                   "size=small,batch=1,context=8,amp=bfloat16,warmup=2,steps=2", "size=small,batch=1,context=8,amp=float16,warmup=0",
                   "size=small,batch=1,context=8,foreach=false"],
    # A 7B model: 27 GB of float32 parameters, not for a CPU check.
    "oom": None,
    # A small Llama with grouped-query attention, given as JSON text; and GPT-2 (124M).
    "hf-train": ['config={"architectures": ["LlamaForCausalLM"], "hidden_size": 64, "intermediate_size": 128, '
                 '"num_hidden_layers": 2, "num_attention_heads": 4, "num_key_value_heads": 2, "vocab_size": 1000},'
                 'batch=1,context=8,dtype=float32',
                 'config={"architectures": ["Qwen2ForCausalLM"], "hidden_size": 64, "intermediate_size": 128, '
                 '"num_hidden_layers": 2, "num_attention_heads": 4, "num_key_value_heads": 2, "vocab_size": 1000},'
                 'batch=1,context=8,dtype=float32,lora=4,lora_targets=q,k,v,o',
                 "config=gpt2,batch=1,context=8,dtype=float32"],
    "hf-generate": ['config={"architectures": ["LlamaForCausalLM"], "hidden_size": 64, "intermediate_size": 128, '
                    '"num_hidden_layers": 2, "num_attention_heads": 4, "num_key_value_heads": 2, "vocab_size": 1000},'
                    'batch=2,prompt=8,new_tokens=3,dtype=float32',
                    'config={"architectures": ["LlamaForCausalLM"], "hidden_size": 64, "intermediate_size": 128, '
                    '"num_hidden_layers": 2, "num_attention_heads": 4, "num_key_value_heads": 2, "vocab_size": 1000},'
                    'batch=2,prompt=8,new_tokens=3,dtype=float32,cache=static'],
}


def twin_file(name):
    return os.path.join(HERE, name.replace("-", "_") + ".py")


def read_literals(path, names=None):
    """The upper-case module-level assignments of a file, evaluated without imports or builtins;
    `names` are what they may refer to (a twin's `common.PITFALL_PARAMETERS`)."""
    tree = ast.parse(open(path).read(), path)
    values = dict(names or {})
    for node in tree.body:
        if isinstance(node, ast.Assign) and all(isinstance(t, ast.Name) and t.id.isupper() for t in node.targets):
            value = eval(compile(ast.Expression(node.value), path, "eval"), {"__builtins__": {}}, dict(values))
            for t in node.targets:
                values[t.id] = value
    return values


# What twins may name from common.py (torch-free, so read the same way).
COMMON = types.SimpleNamespace(**read_literals(os.path.join(HERE, "common.py")))


def find_tensormem(given):
    for path in [given, os.environ.get("TENSORMEM"), os.path.join(ROOT, "target/debug/tensormem"), os.path.join(ROOT, "target/release/tensormem")]:
        if path and os.path.isfile(path) and os.access(path, os.X_OK):
            return [path]
    if shutil.which("tensormem"):
        return [shutil.which("tensormem")]
    return ["cargo", "run", "-q", "-p", "native-runner", "--"]


class Tally:
    def __init__(self):
        self.passed = self.failed = self.skipped = 0

    def ok(self, what):
        self.passed += 1
        print(f"ok       {what}")

    def fail(self, what, why):
        self.failed += 1
        print(f"FAILED   {what}: {why}")

    def skip(self, what, why):
        # One word after SKIPPED, as the Rust tests print theirs: scripts/test.sh counts them.
        self.skipped += 1
        print(f"SKIPPED twins_{re.sub(r'[^A-Za-z0-9_]', '_', what)}: {why}")


def check_declarations(scenarios, tally):
    listed = set()
    for s in scenarios:
        name = s["name"]
        listed.add(os.path.basename(twin_file(name)))
        path = twin_file(name)
        what = f"declares {name}"
        if not os.path.exists(path):
            tally.fail(what, f"no twin {os.path.relpath(path, ROOT)}")
            continue
        try:
            lit = read_literals(path, {"common": COMMON})
        except Exception as e:  # noqa: BLE001
            tally.fail(what, f"cannot read its declarations: {e}")
            continue
        want_params = [(p["name"], p["default"], p["kind"]) for p in s["parameters"]]
        got_params = [tuple(p) for p in lit.get("PARAMETERS", [])]
        problems = []
        if lit.get("NAME") != name:
            problems.append(f"NAME is {lit.get('NAME')!r}")
        if list(lit.get("VARIANTS", [])) != list(s["variants"]):
            problems.append(f"VARIANTS {lit.get('VARIANTS')} != {s['variants']}")
        if got_params != want_params:
            problems.append(f"PARAMETERS {got_params} != {want_params}")
        if "FIX_SETTINGS" not in lit:
            problems.append("no FIX_SETTINGS")
        if problems:
            tally.fail(what, "; ".join(problems))
        else:
            tally.ok(what)
    for path in sorted(glob.glob(os.path.join(HERE, "*.py"))):
        base = os.path.basename(path)
        if base not in NOT_TWINS and base not in listed:
            tally.fail(f"twin {base}", "no scenario of that name in `tensormem scenarios`")


def check_compiles(tally):
    with tempfile.TemporaryDirectory() as tmp:
        for path in sorted(glob.glob(os.path.join(HERE, "*.py"))):
            what = f"compiles {os.path.basename(path)}"
            try:
                py_compile.compile(path, cfile=os.path.join(tmp, "out.pyc"), doraise=True)
                tally.ok(what)
            except py_compile.PyCompileError as e:
                tally.fail(what, str(e))


def labels_match(ours, theirs):
    if len(ours) != len(theirs):
        return False
    for a, b in zip(ours, theirs):
        # A refused op's label carries each side's own error message.
        if " refused: " in b:
            if not a.startswith(b.split(" refused: ")[0] + " refused: "):
                return False
        elif a != b:
            return False
    return True


def live_note(ours, theirs):
    """The largest difference, over the steps, between the twin's live CPU tensor bytes
    (torch.profiler) and tensormem's requested bytes."""
    worst = None
    for a, b in zip(ours["steps"], theirs["steps"]):
        if a.get("requested_bytes") is None:
            return ""
        d = a["requested_bytes"] - b["requested_bytes"]
        if worst is None or abs(d) > abs(worst[0]):
            worst = (d, b["label"], b["requested_bytes"])
    if worst is None or worst[0] == 0:
        return ", live bytes equal at every step"
    return f", live bytes differ by at most {worst[0]:+,} B (of {worst[2]:,}) at {worst[1]!r}"


def check_runs(scenarios, tensormem, python, tally, live=False):
    for s in scenarios:
        name = s["name"]
        settings = CPU_SETTINGS.get(name, [""])
        if settings is None:
            tally.skip(f"runs {name} on the CPU", "too large for a CPU check")
            continue
        for setting in settings:
            for variant in s["variants"] or [None]:
                what = f"runs {name}" + (f" --variant {variant}" if variant else "") + (f" --set {setting}" if setting else "")
                extra = (["--variant", variant] if variant else []) + (["--set", setting] if setting else [])
                started = time.monotonic()
                twin = subprocess.run([python, twin_file(name), "--device", "cpu"] + (["--cpu-memory"] if live else []) + extra,
                                      capture_output=True, text=True)
                seconds = time.monotonic() - started
                if twin.returncode != 0:
                    tally.fail(what, f"exit {twin.returncode}: {twin.stderr.strip().splitlines()[-1:] }")
                    continue
                try:
                    ours = json.loads(twin.stdout.strip().splitlines()[-1])
                except (ValueError, IndexError) as e:
                    tally.fail(what, f"no JSON summary ({e})")
                    continue
                run = subprocess.run(tensormem + ["run", name, "--json"] + extra, capture_output=True, text=True, cwd=ROOT)
                if run.returncode != 0:
                    tally.fail(what, f"tensormem run failed: {run.stderr.strip()}")
                    continue
                theirs = json.loads(run.stdout)
                a, b = [x["label"] for x in ours["steps"]], [x["label"] for x in theirs["steps"]]
                if not labels_match(a, b):
                    tally.fail(what, f"steps differ from tensormem's:\n  twin:      {a}\n  tensormem: {b}")
                elif ours["parameters"] != theirs["parameters"]:
                    tally.fail(what, f"parameters {ours['parameters']} != tensormem's {theirs['parameters']}")
                elif ours["model_parameters"] != theirs["model_parameters"]:
                    tally.fail(what, f"model_parameters {ours['model_parameters']} != tensormem's {theirs['model_parameters']}")
                else:
                    tally.ok(f"{what} ({len(a)} steps, {seconds:.1f} s{live_note(ours, theirs) if live else ''})")


def main():
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--tensormem", help="the tensormem binary (default: target/debug/tensormem, else cargo run)")
    parser.add_argument("--python", default=sys.executable, help="the Python that runs the twins (needs torch for part b)")
    parser.add_argument("--skip-run", action="store_true", help="only part (a)")
    parser.add_argument("--live", action="store_true",
                        help="also compare, at each step, the twin's live CPU tensor bytes (torch.profiler) with tensormem's "
                             "requested bytes (informational: CPU kernels differ from CUDA's in places)")
    args = parser.parse_args()
    started = time.monotonic()
    tensormem = find_tensormem(args.tensormem)
    listed = subprocess.run(tensormem + ["scenarios", "--json"], capture_output=True, text=True, cwd=ROOT)
    if listed.returncode != 0:
        print(f"FAILED   tensormem scenarios --json: {listed.stderr.strip()}")
        print("twins: 0 passed, 1 failed")
        sys.exit(1)
    scenarios = json.loads(listed.stdout)
    tally = Tally()
    check_declarations(scenarios, tally)
    check_compiles(tally)
    has_torch = subprocess.run([args.python, "-c", "import torch"], capture_output=True).returncode == 0
    if args.skip_run:
        tally.skip("CPU runs", "--skip-run")
    elif not has_torch:
        tally.skip("CPU runs", f"`import torch` fails in {args.python} (pip install torch to run the twins on the CPU)")
    else:
        check_runs(scenarios, tensormem, args.python, tally, args.live)
    print(f"({time.monotonic() - started:.1f} s)")
    line = f"twins: {tally.passed} passed, {tally.failed} failed"
    print(line + (f", {tally.skipped} skipped" if tally.skipped else ""))
    sys.exit(1 if tally.failed else 0)


if __name__ == "__main__":
    main()
