"""``tensormem.watch()``: records a script's CUDA memory history and, when the block ends or runs
out of memory, writes the snapshot (whole, then renamed into place), prints the doctor's
diagnosis and the file's path, and lets the script's own exception go on untouched."""

import contextlib
import datetime
import os
import pickle
import sys
import tempfile


def _say(message):
    print(f"tensormem: {message}", file=sys.stderr, flush=True)


class watch(contextlib.ContextDecorator):
    """Use as ``with tensormem.watch():`` or ``@tensormem.watch()``.

    path: where the snapshot goes (default ``tensormem-<time>.pickle`` in the current folder).
    max_entries, stacks: ``torch.cuda.memory._record_memory_history``'s (stacks "python" keeps
    recording cheaper; "all" adds C++ frames). open: serve the page on the snapshot afterwards
    and open it. diagnose: print the doctor's findings (on by default).
    """

    def __init__(self, path=None, *, max_entries=100_000, stacks="python", open=False, diagnose=True, device=None):
        self.path = path
        self.max_entries = max_entries
        self.stacks = stacks
        self.open = open
        self.diagnose = diagnose
        self.device = device
        self._torch = None
        self._oom = None
        self._active = False

    def __enter__(self):
        try:
            import torch
        except ImportError:
            _say("watch() needs PyTorch with CUDA (torch is not installed): running without recording")
            return self
        if not torch.cuda.is_available():
            _say("watch() needs PyTorch with CUDA (no CUDA device): running without recording")
            return self
        self._torch = torch
        # The out-of-memory observer can be attached only once CUDA is initialised.
        torch.cuda.init()
        torch.cuda.memory._record_memory_history(max_entries=self.max_entries, stacks=self.stacks)
        self._active = True
        torch._C._cuda_attach_out_of_memory_observer(self._on_out_of_memory)
        return self

    def _on_out_of_memory(self, device, requested, device_allocated, device_free):
        # Called inside the failing allocation: the snapshot now still holds every tensor that
        # was live, before the exception unwinds the script's frames and frees them.
        if self._active and self._oom is None:
            self._oom = (device, requested, self._torch.cuda.memory._snapshot())

    def __exit__(self, kind, error, traceback):
        if not self._active:
            return False
        self._active = False
        torch = self._torch
        try:
            snapshot = self._oom[2] if self._oom is not None else torch.cuda.memory._snapshot()
            torch.cuda.memory._record_memory_history(enabled=None)
            self._report(snapshot, error)
        except Exception as failure:  # never hide the script's own exception behind ours
            _say(f"could not write or diagnose the snapshot: {failure}")
        return False

    def _report(self, snapshot, error):
        path = self.path or f"tensormem-{datetime.datetime.now().strftime('%Y%m%d-%H%M%S')}.pickle"
        path = os.path.abspath(os.fspath(path))
        _write_whole(path, snapshot)
        from . import doctor, summary
        from ._results import _size

        if self._oom is not None:
            device, requested, _ = self._oom
            _say(f"out of memory on cuda:{device} asking for {_size(requested)} ({requested} bytes); the snapshot was taken at that moment")
        for device in summary(path, device=self.device):
            _say(
                f"cuda:{device['device']} peaked at {_size(device['trace_peak_allocated_bytes'])} allocated, "
                f"{_size(device['trace_peak_reserved_bytes'])} reserved (torch.cuda.max_memory_reserved)"
            )
        replay_command = ""
        if self.diagnose:
            diagnosis = doctor(path, device=self.device)
            print(diagnosis, file=sys.stderr, flush=True)
            for finding in diagnosis.findings:
                capacity = finding.get("evidence", {}).get("capacity_bytes")
                if finding.get("kind") == "oom" and capacity:
                    replay_command = f"; `tensormem replay {path} --capacity {capacity}` replays the failure"
        _say(f"snapshot written to {path} (open it with `tensormem serve {path}`{replay_command})")
        if self.open:
            from ._page import show

            show(path)


def _write_whole(path, snapshot):
    """Pickles the snapshot as torch.cuda.memory._dump_snapshot does, into a temporary file in
    the same folder renamed over `path`: a crash never leaves half a file."""
    folder = os.path.dirname(path) or "."
    fd, temporary = tempfile.mkstemp(prefix=".tensormem-", suffix=".part", dir=folder)
    try:
        with os.fdopen(fd, "wb") as f:
            pickle.dump(snapshot, f)
        os.replace(temporary, path)
    except BaseException:
        with contextlib.suppress(OSError):
            os.remove(temporary)
        raise
