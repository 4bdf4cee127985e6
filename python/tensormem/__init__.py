"""tensormem: see, replay and diagnose PyTorch GPU memory.

Each function returns what the command line's ``--json`` prints, as dicts (and lists of them):
``doctor``, ``summary``, ``replay``, ``predict``, ``run``, ``fit`` and ``scenarios``. A snapshot is
a path, the bytes of a file ``torch.cuda.memory._dump_snapshot`` wrote (pickle) or a JSON
snapshot, or the dict ``torch.cuda.memory._snapshot()`` returns (read as data: nothing is
unpickled or executed). Failures raise ``TensormemError`` (``UsageError`` for a wrong request)
with the command line's message.

``watch()`` records a script's memory and diagnoses it when it ends or runs out of memory;
``show(snapshot)`` opens the page on a snapshot (in a notebook, in the output cell).
"""

import json
import os

from ._tensormem import TensormemError, UsageError, __version__
from ._tensormem import tool as _tool
from ._results import Diagnosis, Result, Results
from ._watch import watch
from ._page import serve, show

__all__ = [
    "doctor", "summary", "replay", "predict", "run", "fit", "scenarios",
    "watch", "show", "serve", "Diagnosis", "Result", "Results", "TensormemError", "UsageError", "__version__",
]


def _snapshot(snapshot):
    """The tool arguments and bytes that stand for a snapshot given as a path, bytes or a dict."""
    if isinstance(snapshot, (str, os.PathLike)):
        return {"file": os.fspath(snapshot)}, None
    if isinstance(snapshot, (bytes, bytearray, memoryview)):
        return {}, bytes(snapshot)
    if isinstance(snapshot, dict):
        return {}, _dict_to_json(snapshot)
    raise TypeError(
        "a snapshot is a path, the bytes of a snapshot file, or the dict torch.cuda.memory._snapshot() returns; "
        f"got {type(snapshot).__name__}"
    )


def _dict_to_json(snapshot):
    """A snapshot dict as JSON bytes (the JSON snapshot format tensormem reads)."""
    def plain(value):
        # Called only for what JSON cannot hold (lists, tuples, dicts and scalars it writes).
        raise TypeError(f"a snapshot dict holds plain data (dicts, lists, str, int, float, bool, None); found {type(value).__name__}")
    return json.dumps(snapshot, default=plain, allow_nan=False).encode()


def _call(name, arguments, snapshot_bytes=None):
    arguments = {key: value for key, value in arguments.items() if value is not None}
    return [json.loads(line) for line in _tool(name, json.dumps(arguments), snapshot_bytes)]


def doctor(snapshot=None, *, scenario=None, variant=None, settings=None, device=None, capacity=None):
    """The doctor's findings on a snapshot (or on a scenario's simulated run), as
    ``tensormem doctor --json``: the OOM first, then what to fix, each with its evidence."""
    if (snapshot is None) == (scenario is None):
        raise UsageError("doctor takes a snapshot or scenario=NAME (one of them)")
    arguments = {"scenario": scenario, "variant": variant, "set": settings, "device": _device(device), "capacity": _size(capacity)}
    data = None
    if snapshot is not None:
        extra, data = _snapshot(snapshot)
        arguments.update(extra)
    return Diagnosis(_call("doctor", arguments, data)[0])


def summary(snapshot, *, device=None):
    """Each device's ``memory_stats()`` after a replay and the trace's peaks (``tensormem summary --json``)."""
    arguments, data = _snapshot(snapshot)
    arguments["device"] = device
    return Results(Result(line, "summary") for line in _call("summary", arguments, data))


def replay(snapshot, *, device=None, alloc_conf=None, capacity=None, start=None):
    """Each device's trace replayed through the caching allocator, under other settings if asked
    (``alloc_conf`` as PYTORCH_CUDA_ALLOC_CONF, ``capacity`` a size such as "24GiB")."""
    arguments, data = _snapshot(snapshot)
    arguments.update({"device": device, "alloc_conf": alloc_conf, "capacity": _size(capacity), "start": start})
    return Results(Result(line, "replay") for line in _call("replay", arguments, data))


def predict(recordings, *, to=None, fit=None, capacity=None, device=None, alloc_conf=None):
    """A program's memory at other values of a setting, from its own recordings: ``recordings``
    maps each recording's path to its values (``{"a.pickle": {"context": 256}}`` or
    ``{"a.pickle": "context=256"}``), or is a list of "PATH@name=value" strings, as
    ``tensormem predict``."""
    if isinstance(recordings, dict):
        recordings = [{"file": os.fspath(path), "values": values} for path, values in recordings.items()]
    arguments = {"recordings": list(recordings), "to": to, "fit": fit, "capacity": _size(capacity), "device": device, "alloc_conf": alloc_conf}
    return Result(_call("predict", arguments)[0], "prediction")


def run(name, *, variant=None, settings=None, device=None, capacity=None, alloc_conf=None, steps=None, cublas_workspace_config=None):
    """Runs a scenario on the simulated card (``device="sim:H100-80GB"`` by default), as
    ``tensormem run --json``."""
    arguments = {
        "name": name, "variant": variant, "set": settings, "device": _device(device), "capacity": _size(capacity),
        "alloc_conf": alloc_conf, "steps": steps, "cublas_workspace_config": cublas_workspace_config,
    }
    return Result(_call("run", arguments)[0], "run")


def fit(name, *, settings=None, vary=None, strategies=None, cards=None):
    """The largest batch (or context) that fits, per strategy and card (``tensormem fit --json``)."""
    arguments = {"name": name, "set": settings, "vary": vary, "strategies": strategies, "cards": cards}
    return Result(_call("fit", arguments)[0], "fit")


def scenarios():
    """The scenarios, with their parameters and variants (``tensormem scenarios --json``)."""
    return _call("scenarios", {})[0]


def _device(device):
    return None if device is None else str(device)


def _size(size):
    """A size as the command line writes it: bytes as a number, or text such as "24GiB"."""
    return None if size is None else str(size)
