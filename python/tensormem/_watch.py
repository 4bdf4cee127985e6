"""``tensormem.watch()``: records a script's CUDA memory history and, when the block ends or runs
out of memory, writes the snapshot (whole, under a name no other snapshot has), prints the
doctor's diagnosis and the file's path, and lets the script's own exception go on untouched.

Blocks nest and may run in several threads: recording starts with the first open block and
stops when the last one ends (PyTorch drops the history when recording stops), and each block
writes a file of its own."""

import contextlib
import copy
import datetime
import os
import pickle
import sys
import threading


def _say(message):
    print(f"tensormem: {message}", file=sys.stderr, flush=True)


# What all watch() blocks of this process share, under one lock.
_lock = threading.Lock()
_open = []  # the blocks recording now, outermost first
_observed = []  # the torch modules PyTorch's out-of-memory observer is attached to (once each)


class watch(contextlib.ContextDecorator):
    """Use as ``with tensormem.watch():`` or ``@tensormem.watch()``.

    path: where the snapshot goes (default ``tensormem-<time>.pickle`` in the current folder); a
    file already there is never replaced: the snapshot goes to the first free ``NAME-2.pickle``,
    ``NAME-3.pickle``, ... beside it. max_entries, stacks: ``torch.cuda.memory._record_memory_history``'s
    (stacks "python" keeps recording cheaper; "all" adds C++ frames), for the outermost block.
    open: serve the page on the snapshot afterwards and open it. diagnose: print the doctor's
    findings (on by default).
    """

    def __init__(self, path=None, *, max_entries=100_000, stacks="python", open=False, diagnose=True, device=None):
        self.path = path
        self.max_entries = max_entries
        self.stacks = stacks
        self.open = open
        self.diagnose = diagnose
        self.device = device
        self.written = None  # the snapshot's path, once written
        self._torch = None
        self._oom = None
        self._thread = None

    def _recreate_cm(self):
        # As a decorator, each call is a block of its own (threads, recursion).
        return copy.copy(self)

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
        self._oom = None
        self._thread = threading.get_ident()
        with _lock:
            if not any(w._torch is torch for w in _open):
                # The out-of-memory observer can be attached only once CUDA is initialised.
                torch.cuda.init()
                torch.cuda.memory._record_memory_history(max_entries=self.max_entries, stacks=self.stacks)
            if not any(t is torch for t in _observed):
                # PyTorch keeps every observer for good: one for the process, which tells the
                # blocks open at the time.
                torch._C._cuda_attach_out_of_memory_observer(_on_out_of_memory)
                _observed.append(torch)
            _open.append(self)
        return self

    def __exit__(self, kind, error, traceback):
        torch = self._torch
        if torch is None:
            return False
        self._torch = None
        try:
            snapshot = self._oom[2] if self._oom is not None else torch.cuda.memory._snapshot()
        except Exception as failure:  # never hide the script's own exception behind ours
            snapshot = None
            _say(f"could not take the snapshot: {failure}")
        try:
            with _lock:
                _open.remove(self)
                # Only the last block stops recording (under the lock: a block opening now
                # starts it again after), the ones still open record on.
                if not any(w._torch is torch for w in _open):
                    torch.cuda.memory._record_memory_history(enabled=None)
            if snapshot is not None:
                self._report(snapshot)
        except Exception as failure:
            _say(f"could not write or diagnose the snapshot: {failure}")
        return False

    def _report(self, snapshot):
        default = f"tensormem-{datetime.datetime.now().strftime('%Y%m%d-%H%M%S')}.pickle"
        wanted = os.path.abspath(os.fspath(self.path or default))
        path = _write_new(wanted, snapshot)
        self.written = path
        if self.path is not None and path != wanted:
            _say(f"{wanted} exists and is kept")
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


def _on_out_of_memory(device, requested, device_allocated, device_free):
    """PyTorch's out-of-memory observer, called inside the failing allocation: the snapshot now
    still holds every tensor that was live, before the exception unwinds the script's frames and
    frees them. It goes to the blocks of the failing thread (to every open block when none is)."""
    try:
        with _lock:
            waiting = [(w, w._torch) for w in _open if w._oom is None and w._torch is not None]
        if not waiting:
            return
        mine = [(w, torch) for w, torch in waiting if w._thread == threading.get_ident()] or waiting
        snapshot = mine[0][1].cuda.memory._snapshot()
        for w, _ in mine:
            w._oom = (device, requested, snapshot)
    except Exception:  # raised here, it would replace PyTorch's OutOfMemoryError in the script
        pass


def _write_new(path, snapshot):
    """Pickles the snapshot as torch.cuda.memory._dump_snapshot does, whole, to `path` or, when a
    file is there already, to the first free ``NAME-2.ext``, ``NAME-3.ext``, ...: never over
    another file, even one another process or thread writes at the same moment. Returns the
    path written."""
    stem, ext = os.path.splitext(path)
    temporary = _write_temporary(os.path.dirname(path) or ".", snapshot)
    try:
        n = 1
        while True:
            candidate = path if n == 1 else f"{stem}-{n}{ext}"
            if _publish(temporary, candidate):
                return candidate
            n += 1
    finally:
        with contextlib.suppress(OSError):
            os.remove(temporary)


def _write_temporary(folder, snapshot):
    """The snapshot pickled to a hidden temporary file in `folder` (a crash leaves no half file
    under a snapshot's name)."""
    # An ordinary file, under the umask (mkstemp's would be private, 0600).
    while True:
        temporary = os.path.join(folder, f".tensormem-{os.getpid()}-{os.urandom(4).hex()}.part")
        try:
            fd = os.open(temporary, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o666)
            break
        except FileExistsError:
            continue
    try:
        with os.fdopen(fd, "wb") as f:
            pickle.dump(snapshot, f)
    except BaseException:
        with contextlib.suppress(OSError):
            os.remove(temporary)
        raise
    return temporary


def _publish(temporary, path):
    """Gives the whole file `path` as its name unless that name is taken; False if it is."""
    try:
        os.link(temporary, path)  # atomic, and fails where the name exists
        return True
    except FileExistsError:
        return False
    except OSError:
        pass  # a file system without hard links: reserve the name, then rename over it
    try:
        os.close(os.open(path, os.O_CREAT | os.O_EXCL | os.O_WRONLY, 0o644))
    except FileExistsError:
        return False
    os.replace(temporary, path)
    return True
