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
import pickle
import subprocess
import sys
import threading

from ._tensormem import TensormemError, UsageError, __version__
from ._results import Diagnosis, Result, Results
from ._watch import watch
from ._page import serve, show

__all__ = [
    "doctor", "summary", "replay", "predict", "run", "fit", "scenarios",
    "watch", "show", "serve", "Diagnosis", "Result", "Results", "TensormemError", "UsageError", "__version__",
]


def _snapshot(snapshot):
    """The tool arguments and the source of the snapshot given as a path, bytes or a dict: None
    for a path (the tool reads the file), else a function that writes it to a binary stream."""
    if isinstance(snapshot, (str, os.PathLike)):
        path = os.fspath(snapshot)
        looks_like_text = path.lstrip()[:1] in ("{", "[") or "\n" in path or len(path) > 4096
        if isinstance(path, str) and looks_like_text and not os.path.exists(path):
            raise UsageError(
                f"a str is a snapshot's path, and this one ({len(path):,} characters) holds a snapshot's text: "
                "pass it as bytes (text.encode()) or as the dict json.loads gives"
            )
        if _own_stream(path):
            # This process's own descriptor (a pipe, stdin): the tool's process has other ones.
            return {}, lambda stream: _copy_from(path, stream)
        return {"file": path}, None
    if isinstance(snapshot, (bytes, bytearray, memoryview)):
        data = memoryview(snapshot)
        return {}, lambda stream: stream.write(data)
    if isinstance(snapshot, dict):
        return {}, lambda stream: _PlainPickler(stream, protocol=4).dump(snapshot)
    raise TypeError(
        "a snapshot is a path, the bytes of a snapshot file, or the dict torch.cuda.memory._snapshot() returns; "
        f"got {type(snapshot).__name__}"
    )


def _own_stream(path):
    """Whether `path` names one of this process's open descriptors (`/dev/stdin`, `/dev/fd/N`,
    `/proc/self/fd/N`), which mean something else in another process."""
    own = ("/dev/stdin", "/dev/fd/", "/proc/self/", f"/proc/{os.getpid()}/", "/proc/thread-self/")
    return isinstance(path, str) and path.startswith(own)


def _copy_from(path, stream):
    with open(path, "rb") as source:
        while chunk := source.read(1 << 20):
            stream.write(chunk)


class _PlainPickler(pickle.Pickler):
    """Pickles a snapshot dict as _dump_snapshot would, streamed to the tool as it is made (a
    3-million-entry dict never exists twice), and only plain data: the reader refuses any class."""

    def reducer_override(self, value):
        # Called only for what pickle does not write itself (not dict, list, tuple, str, bytes,
        # int, float, bool, None).
        raise TypeError(
            "a snapshot dict holds plain data (dicts, lists, tuples, str, int, float, bool, None); "
            f"found {type(value).__name__}"
        )


def _call(name, arguments, write_snapshot=None):
    """Runs one tool in a process of its own (`tensormem mcp --call --python`): nothing it does,
    running out of memory included, can end this interpreter, and Ctrl-C stops it. Returns its
    output lines as dicts."""
    arguments = {key: value for key, value in arguments.items() if value is not None}
    request = json.dumps({"name": name, "arguments": arguments, "snapshot": write_snapshot is not None}).encode() + b"\n"
    if not sys.executable:
        raise TensormemError("cannot start the tool: this interpreter does not know its own executable (sys.executable is empty)")
    # The tool's interpreter finds this very package, wherever this one found it.
    package_folder = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
    python_path = os.pathsep.join(p for p in (package_folder, os.environ.get("PYTHONPATH")) if p)
    env = dict(os.environ, TENSORMEM_PARENT_PID=str(os.getpid()), PYTHONPATH=python_path)
    child = subprocess.Popen(
        [sys.executable, "-m", "tensormem", "mcp", "--call", "--python"],
        stdin=subprocess.PIPE, stdout=subprocess.PIPE, stderr=subprocess.PIPE, env=env,
    )
    answer, errors = [], []
    readers = [
        threading.Thread(target=lambda: answer.append(child.stdout.read()), daemon=True),
        threading.Thread(target=lambda: errors.append(child.stderr.read()), daemon=True),
    ]
    with child:  # its pipes closed and the process waited for, however this ends
        try:
            for reader in readers:
                reader.start()
            try:
                child.stdin.write(request)
                if write_snapshot is not None:
                    write_snapshot(child.stdin)
                child.stdin.close()
            except BrokenPipeError:
                pass  # the tool stopped reading (a file it refused): its answer says why
            child.wait()
            for reader in readers:
                reader.join()
        finally:
            if child.poll() is None:  # interrupted (Ctrl-C) or failed here: the tool stops too
                child.kill()
            try:
                child.stdin.close()  # what is still buffered has nowhere to go
            except OSError:
                pass
    return _answer(name, child.returncode, b"".join(answer), b"".join(errors).decode(errors="replace"))


def _answer(name, status, out, errors):
    try:
        reply = json.loads(out)
    except ValueError:
        lines = [line.strip() for line in errors.splitlines() if line.strip()]
        last = next((line for line in reversed(lines) if "memory allocation of" in line), lines[-1] if lines else "no message")
        if "memory allocation of" in errors:
            raise MemoryError(f"tensormem ran out of memory in {name} ({last}); this interpreter is unharmed") from None
        how = f"was killed by signal {-status}" if status < 0 else f"ended with status {status}"
        raise TensormemError(f"tensormem's {name} {how} without an answer: {last}") from None
    if "error" in reply:
        raise (UsageError if reply.get("code") == 2 else TensormemError)(reply["error"])
    return [json.loads(line) for line in reply["lines"]]


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
    recordings = list(recordings)
    for recording in recordings:
        path = recording.get("file") if isinstance(recording, dict) else str(recording).rpartition("@")[0]
        if isinstance(path, (str, os.PathLike)) and _own_stream(os.fspath(path)):
            raise UsageError(f"predict reads each recording from a file: {path} is this process's own stream; save it to a file first")
    arguments = {"recordings": recordings, "to": to, "fit": fit, "capacity": _size(capacity), "device": device, "alloc_conf": alloc_conf}
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
