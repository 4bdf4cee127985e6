"""What every twin shares: the command line, the recording and the JSON summary.

A twin is a PyTorch program that does what one tensormem scenario does, op for op, so that
PyTorch's caching allocator sees the same requests as tensormem's. Each twin module defines

    NAME = "inplace-chain"                   # the scenario's name in `tensormem scenarios`
    VARIANTS = ["mistake", "fix"]            # or [] for a scenario without variants
    PARAMETERS = [("n", "1000", {"type": "integer", "min": 1, "max": 32768}), ...]
    FIX_SETTINGS = None                      # PYTORCH_CUDA_ALLOC_CONF the fix variant brings

as literals (tools/twins/check.py reads them without importing torch and compares them with
`tensormem scenarios --json`), and a `program(rec, v)` run by `main`:

    python3 tools/twins/inplace_chain.py [--variant fix] [--set n=2048] [--out S.pickle] [--device cuda]

On CUDA it records the whole run with `torch.cuda.memory._record_memory_history`, writes the
snapshot (`--out`), and prints one JSON object with the field names of `tensormem run --json`:
`steps` (label, allocated_bytes, reserved_bytes, max_allocated_bytes, requested_bytes,
max_requested_bytes after each labelled step), `peak_allocated_bytes`
(torch.cuda.max_memory_allocated() over the run), `peak_reserved_bytes`, `out_of_memory`,
`parameters`, `model_parameters`. On the CPU (`--device cpu`) it only runs the program (a check
that the Python works): the byte fields are null.
"""

import argparse
import json
import os
import sys
import time

# `tensormem run`'s recorder keeps 1 << 22 trace entries.
DEFAULT_MAX_ENTRIES = 1 << 22


class Values:
    """The checked parameter values (as `Values` in src/scenarios/mod.rs)."""

    def __init__(self, values, variant):
        self.map = values
        self.variant = variant

    def int(self, name):
        return self.map[name]

    def ints(self, name):
        return self.map[name]

    def flag(self, name):
        return self.map[name]

    def choice(self, name):
        return self.map[name]

    def text(self, name):
        return self.map[name]

    def fix(self):
        return self.variant == "fix"


# The pitfalls' parameters (src/scenarios/pitfalls.rs `model_parameters`), shared by their twins.
PITFALL_PARAMETERS = [
    ("batch", "8", {"type": "integer", "min": 1, "max": 4096}),
    ("context", "128", {"type": "integer", "min": 1, "max": 8192}),
    ("steps", "4", {"type": "integer", "min": 1, "max": 1000}),
]


# A training step's parameters after the model's own (src/scenarios/training.rs `step_parameters`),
# shared by lm-train, gpt2-train, oom and hf-train. A lambda so that check.py, which reads the
# twins' literals without imports, can call it.
STEP_PARAMETERS = lambda batch, context, optimizer, dtype: [  # noqa: E731
    ("batch", batch, {"type": "integer", "min": 1, "max": 65536}),
    ("context", context, {"type": "integer", "min": 1, "max": 1048576}),
    ("optimizer", optimizer, {"type": "choice", "options": ["handwritten-adamw", "adamw", "adam", "sgd", "adamw-fused", "adamw8bit"]}),
    ("foreach", "true", {"type": "flag"}),
    ("dtype", dtype, {"type": "choice", "options": ["float32", "bfloat16", "float16"]}),
    ("amp", "false", {"type": "choice", "options": ["false", "float16", "bfloat16"], "aliases": [["true", "float16"]]}),
    ("checkpointing", "false", {"type": "flag"}),
    ("warmup", "1", {"type": "integer", "min": 0, "max": 1000}),
    ("steps", "1", {"type": "integer", "min": 1, "max": 1000}),
    ("accumulation", "1", {"type": "integer", "min": 1, "max": 1024}),
    ("master_weights", "false", {"type": "flag"}),
    ("world", "1", {"type": "integer", "min": 1, "max": 65536}),
    ("strategy", "ddp", {"type": "choice", "options": ["ddp", "zero1", "zero2", "fsdp", "hsdp"]}),
    ("ddp_reducer", "buckets", {"type": "choice", "options": ["buckets", "views", "none"]}),
    ("tp", "1", {"type": "integer", "min": 1, "max": 1024}),
    ("node", "8", {"type": "integer", "min": 1, "max": 1024}),
    ("fsdp_version", "1", {"type": "choice", "options": ["1", "2"]}),
    ("reshard_after_forward", "true", {"type": "flag"}),
    ("rank", "0", {"type": "integer", "min": 0, "max": 65535}),
]

def split_settings(text):
    """`--set a=1,b=2`: splits on commas that start a new `key=` (batches=32,31,33 keeps its commas)."""
    items = []
    for part in text.split(","):
        if items and "=" not in part:
            items[-1] += "," + part
        else:
            items.append(part)
    return items


def parse_value(name, kind, text):
    text = text.strip()

    def whole(t, lo, hi):
        try:
            n = int(t.strip())
        except ValueError:
            n = None
        if n is None or not lo <= n <= hi:
            raise ValueError(f"{name} must be a whole number from {lo} to {hi}, got {text!r}")
        return n

    t = kind["type"]
    if t == "integer":
        return whole(text, kind["min"], kind["max"])
    if t == "integers":
        values = [whole(p, kind["min"], kind["max"]) for p in text.split(",")]
        if not values or len(values) > kind["max_len"]:
            raise ValueError(f"{name} takes 1 to {kind['max_len']} comma-separated numbers, got {len(values)}")
        return values
    if t == "flag":
        if text in ("true", "1", "yes"):
            return True
        if text in ("false", "0", "no"):
            return False
        raise ValueError(f"{name} must be true or false, got {text!r}")
    if t == "choice":
        if text in kind["options"]:
            return text
        # Another spelling of an option (`amp=true` is `amp=float16`), read as that option.
        aliases = dict(kind.get("aliases", []))
        if text in aliases:
            return aliases[text]
        listed = f" ({', '.join(f'{a} = {o}' for a, o in kind.get('aliases', []))})" if aliases else ""
        raise ValueError(f"{name} must be one of {', '.join(kind['options'])}{listed}, got {text!r}")
    if t == "text":
        if not text or len(text.encode()) > kind["max_len"]:
            raise ValueError(f"{name} takes 1 to {kind['max_len']} bytes of text, got {len(text.encode())}")
        return text
    raise ValueError(f"{name}: unknown kind {t!r}")


def parse_args(name, parameters, variants, argv=None):
    parser = argparse.ArgumentParser(prog=f"{name} twin", description=f"PyTorch twin of the tensormem scenario {name}")
    parser.add_argument("--set", action="append", default=[], metavar="KEY=VALUE", help="parameter values, as `tensormem run --set`")
    parser.add_argument("--variant", choices=["mistake", "fix"], help="mistake (default) or fix, for scenarios with variants")
    parser.add_argument("--out", help="write the snapshot here (.pickle, torch.cuda.memory._dump_snapshot); CUDA only")
    parser.add_argument("--device", default="cuda", help="cuda (default; records the trace) or cpu (runs the program only)")
    parser.add_argument("--max-entries", type=int, default=DEFAULT_MAX_ENTRIES, help="trace entries kept (_record_memory_history's max_entries)")
    parser.add_argument("--stacks", choices=["python", "all"], default="python", help="stacks recorded (all adds C++ frames: much slower to dump)")
    parser.add_argument("--summary", help="also write the JSON summary to this file")
    parser.add_argument("--natural-lifetimes", action="store_true",
                        help="free what natural PyTorch code frees where tensormem's program keeps it alive "
                             "(models.py's `# tensormem keeps` lines); the twin then differs from the scenario there")
    parser.add_argument("--cpu-memory", action="store_true",
                        help="on the CPU: fill the steps' requested_bytes and max_requested_bytes from torch.profiler's memory "
                             "events (live tensor bytes as asked, no caching; CPU kernels may differ from CUDA's)")
    args = parser.parse_args(argv)
    known = [p[0] for p in parameters]
    given = {}
    for item in args.set:
        for pair in split_settings(item):
            key, sep, value = pair.partition("=")
            if not sep:
                parser.error(f"--set takes KEY=VALUE, got {pair!r}")
            if key not in known:
                parser.error(f"unknown parameter {key!r}; parameters: {', '.join(known) or '(none)'}")
            given[key] = value
    if args.variant and not variants:
        parser.error(f"{name} has no variants (asked for {args.variant!r})")
    variant = (args.variant or "mistake") if variants else None
    values = {}
    for pname, default, kind in parameters:
        try:
            values[pname] = parse_value(pname, kind, given.get(pname, default))
        except ValueError as e:
            parser.error(str(e))
    return args, Values(values, variant)


class Recorder:
    """Labelled steps, as `Recorder` in src/scenarios/mod.rs: allocated and reserved after each,
    the peak since the previous one (then the peak is reset), and the peaks over the whole run."""

    def __init__(self, torch, device):
        self.torch = torch
        self.device = device
        self.cuda = device.type == "cuda"
        self.steps = []
        self.model_parameters = None
        self.peaks = (0, 0)

    def step(self, label):
        torch = self.torch
        # A zero-length record_function range: the snapshot's external_annotations then mark
        # every step (PyTorch versions that record annotations), to align the two traces.
        with torch.profiler.record_function(f"tensormem step: {label}"):
            pass
        if not self.cuda:
            self.steps.append({"label": label, "allocated_bytes": None, "reserved_bytes": None, "max_allocated_bytes": None,
                               "requested_bytes": None, "max_requested_bytes": None})
            print(f"  {label}", file=sys.stderr)
            return
        stats = torch.cuda.memory_stats(self.device)
        step = {
            "label": label,
            "allocated_bytes": torch.cuda.memory_allocated(self.device),
            "reserved_bytes": torch.cuda.memory_reserved(self.device),
            "max_allocated_bytes": torch.cuda.max_memory_allocated(self.device),
            "requested_bytes": stats.get("requested_bytes.all.current"),
            "max_requested_bytes": stats.get("requested_bytes.all.peak"),
        }
        self.steps.append(step)
        print(f"  {label}: allocated {step['allocated_bytes']:,} B, reserved {step['reserved_bytes']:,} B", file=sys.stderr)
        self.fold_peaks()
        torch.cuda.reset_peak_memory_stats(self.device)

    def fold_peaks(self):
        if self.cuda:
            torch = self.torch
            self.peaks = (max(self.peaks[0], torch.cuda.max_memory_allocated(self.device)),
                          max(self.peaks[1], torch.cuda.max_memory_reserved(self.device)))

    def count_parameters(self, params):
        # A bitsandbytes 4-bit weight stores two elements per byte: counted by its elements, as
        # PEFT's get_nb_trainable_parameters does (and tensormem's model_parameters).
        self.model_parameters = sum(p.numel() * (2 if type(p).__name__ == "Params4bit" else 1) for p in params)


def start_recording(torch, args, device):
    """`_record_memory_history` with every alloc and free and their stacks; where this PyTorch
    has it, `global_record_annotations` (record_function ranges recorded without a profiler:
    the step markers)."""
    options = dict(enabled="all", context="all", stacks=args.stacks, max_entries=args.max_entries, device=device)
    for extra in ({"global_record_annotations": True}, {}):
        try:
            torch.cuda.memory._record_memory_history(**options, **extra)
            return
        except TypeError:  # an older signature
            continue
    torch.cuda.memory._record_memory_history("all", max_entries=args.max_entries)


def cpu_requested_bytes(profiler, steps):
    """Live CPU tensor bytes at each step marker (and their peak since the previous one), from
    the profiler's [memory] events in time order."""
    events = profiler.events()
    # An op's own allocations count at its start (what it frees inside itself is netted out);
    # frees after it are [memory] events of their own.
    changes = sorted((e.time_range.start, e.cpu_memory_usage if e.name == "[memory]" else e.self_cpu_memory_usage)
                     for e in events if e.name == "[memory]" or e.self_cpu_memory_usage)
    marks = sorted(e.time_range.start for e in events if e.name.startswith("tensormem step: "))
    live = peak = i = 0
    for step, mark in zip(steps, marks):
        while i < len(changes) and changes[i][0] <= mark:
            live += changes[i][1]
            peak = max(peak, live)
            i += 1
        step["requested_bytes"], step["max_requested_bytes"] = live, peak
        peak = live


def token_batch(torch, device, batch, context, vocab):
    """`token_batch` of src/scenarios/mod.rs: ids (i * 7919 % vocab) and next-token targets,
    [batch, context] int64, each one allocation on the device (made on the host, copied)."""
    ids = token_list(batch, context, vocab)
    targets = [(t + 1) % vocab for t in ids]
    return device_ids(torch, device, ids, batch, context), device_ids(torch, device, targets, batch, context)


def token_ids(torch, device, batch, context, vocab):
    """The ids of `token_batch` alone (a prompt: generation makes no targets)."""
    return device_ids(torch, device, token_list(batch, context, vocab), batch, context)


def token_list(batch, context, vocab):
    """The ids on the host: i * 7919 % vocab."""
    return [(i * 7919) % vocab for i in range(batch * context)]


def device_ids(torch, device, values, batch, context):
    """Token ids made on the host and copied to the device: one allocation there."""
    return torch.tensor(values, dtype=torch.int64).view(batch, context).to(device)


def main(module_globals, argv=None):
    """Parses the command line, runs the twin's `program`, prints the JSON summary."""
    name = module_globals["NAME"]
    parameters = module_globals["PARAMETERS"]
    variants = module_globals["VARIANTS"]
    fix_settings = module_globals.get("FIX_SETTINGS")
    program = module_globals["program"]
    args, values = parse_args(name, parameters, variants, argv)

    settings = os.environ.get("PYTORCH_CUDA_ALLOC_CONF", "")
    if values.fix() and fix_settings:
        settings = ",".join(s for s in (settings, fix_settings) if s)
        # Before torch initialises CUDA's allocator, which reads it once.
        os.environ["PYTORCH_CUDA_ALLOC_CONF"] = settings
    import torch

    device = torch.device(args.device)
    if device.type == "cuda":
        if not torch.cuda.is_available():
            print(json.dumps({"scenario": name, "error": "no CUDA device"}))
            sys.exit(3)
        if device.index is None:
            device = torch.device("cuda", torch.cuda.current_device())
        if values.fix() and fix_settings and hasattr(torch.cuda.memory, "_set_allocator_settings"):
            # In case CUDA was initialised before (the environment variable is then too late).
            torch.cuda.memory._set_allocator_settings(fix_settings)
        torch.cuda.init()
        start_recording(torch, args, device)
        torch.cuda.reset_peak_memory_stats(device)
    elif args.out:
        print(f"--out needs a CUDA device (no snapshot on {device})", file=sys.stderr)
    torch.manual_seed(0)

    if args.natural_lifetimes and "models" in sys.modules:
        sys.modules["models"].NATURAL_LIFETIMES = True
    rec = Recorder(torch, device)
    out_of_memory = None
    started = time.monotonic()
    print(f"{name} ({values.variant or 'no variant'}) on {device}", file=sys.stderr)
    profiler = None
    if args.cpu_memory and device.type == "cpu":
        profiler = torch.profiler.profile(activities=[torch.profiler.ProfilerActivity.CPU], profile_memory=True)
        profiler.__enter__()
    try:
        program(rec, values)
    except torch.OutOfMemoryError as e:
        # As tensormem: running out of memory is a result, the steps before it kept.
        out_of_memory = str(e).splitlines()[0] if str(e) else "out of memory"
    seconds = time.monotonic() - started
    rec.fold_peaks()
    if profiler is not None:
        profiler.__exit__(None, None, None)
        cpu_requested_bytes(profiler, rec.steps)

    snapshot = None
    if device.type == "cuda":
        torch.cuda.synchronize(device)
        if args.out:
            os.makedirs(os.path.dirname(os.path.abspath(args.out)), exist_ok=True)
            torch.cuda.memory._dump_snapshot(args.out)
            snapshot = args.out
        torch.cuda.memory._record_memory_history(enabled=None, device=device)
        device_name = torch.cuda.get_device_name(device)
        capacity = torch.cuda.get_device_properties(device).total_memory
    else:
        device_name, capacity = str(device), None

    summary = {
        "scenario": name,
        "variant": values.variant,
        "device": device_name,
        "capacity_bytes": capacity,
        "settings": settings or "(defaults)",
        "parameters": values.map,
        "model_parameters": rec.model_parameters,
        "steps": rec.steps,
        "peak_allocated_bytes": rec.peaks[0] if device.type == "cuda" else None,
        "peak_reserved_bytes": rec.peaks[1] if device.type == "cuda" else None,
        "out_of_memory": out_of_memory,
        "snapshot": snapshot,
        "natural_lifetimes": args.natural_lifetimes,
        "torch_version": torch.__version__,
        "seconds": round(seconds, 3),
    }
    text = json.dumps(summary)
    print(text)
    if args.summary:
        with open(args.summary, "w") as f:
            f.write(text + "\n")
