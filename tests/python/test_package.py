"""The Python package as a user gets it: the wheel installed in a fresh virtual environment
(scripts/test-python.sh builds it once). Its command line must answer as the cargo-built one,
and its API give the same answers from a path, bytes and the unpickled snapshot dict.

Environment: TENSORMEM_CLI (the cargo-built CLI), TENSORMEM_FIXTURES (PyTorch snapshots);
run with this venv's python: `python tests/python/test_package.py`.
"""

import contextlib
import datetime
import io
import json
import os
import pickle
import shutil
import subprocess
import sys
import tempfile
import unittest
import urllib.request
from contextlib import redirect_stderr
from pathlib import Path

import counting
import tensormem

FIXTURES = Path(os.environ.get("TENSORMEM_FIXTURES", Path(__file__).resolve().parents[3] / "shared/fixtures/pytorch-snapshots"))
RECORDINGS = FIXTURES.parent / "predict-inputs"
CARGO_CLI = os.environ.get("TENSORMEM_CLI", str(Path(__file__).resolve().parents[2] / "target/release/tensormem"))
# The wheel's command, next to this interpreter in the virtual environment.
WHEEL_CLI = shutil.which("tensormem", path=str(Path(sys.executable).parent))


def snapshots():
    if not FIXTURES.is_dir():
        if os.environ.get("CI") == "true":
            raise AssertionError(f"fixture folder {FIXTURES} is missing")
        return []
    return sorted(p for p in FIXTURES.iterdir() if p.suffix == ".pickle")


def output(command, *args):
    done = subprocess.run([command, *args], capture_output=True, text=True, timeout=600)
    return done.returncode, done.stdout, done.stderr


def lines(text):
    return [json.loads(line) for line in text.splitlines() if line.strip()]


class CommandLine(unittest.TestCase):
    def test_the_wheel_installs_the_command(self):
        self.assertIsNotNone(WHEEL_CLI, "pip install put no tensormem command beside python")

    def test_doctor_json_equals_the_cargo_built_cli_on_every_fixture(self):
        files = snapshots()
        if not files:
            self.skipTest(f"no fixtures in {FIXTURES}")
        for path in files:
            with self.subTest(path.name):
                ours = output(WHEEL_CLI, "doctor", str(path), "--json")
                cargo = output(CARGO_CLI, "doctor", str(path), "--json")
                self.assertEqual(ours[0], 0, ours[2])
                self.assertEqual(ours, cargo)

    def test_summary_replay_and_errors_equal_the_cargo_built_cli(self):
        files = snapshots()
        if not files:
            self.skipTest(f"no fixtures in {FIXTURES}")
        for args in (["summary", str(files[0]), "--json"], ["replay", str(files[0]), "--json", "--alloc-conf", "expandable_segments:True"],
                     ["doctor", "/no/such/file.pickle"], ["run", "no-such-scenario"], ["no-such-command"]):
            with self.subTest(" ".join(args)):
                self.assertEqual(output(WHEEL_CLI, *args), output(CARGO_CLI, *args))

    def test_python_dash_m_is_the_same_command(self):
        code, out, _ = output(sys.executable, "-m", "tensormem", "--version")
        self.assertEqual((code, out), (0, f"tensormem {tensormem.__version__}\n"))


class Api(unittest.TestCase):
    def test_the_same_findings_from_a_path_bytes_and_the_unpickled_dict(self):
        files = snapshots()
        if not files:
            self.skipTest(f"no fixtures in {FIXTURES}")
        for path in files[:3]:
            with self.subTest(path.name):
                cli = lines(output(CARGO_CLI, "doctor", str(path), "--json")[1])[0]
                self.assertEqual(tensormem.doctor(path), cli)
                self.assertEqual(tensormem.doctor(str(path)), cli)
                self.assertEqual(tensormem.doctor(path.read_bytes()), cli)
                with open(path, "rb") as f:
                    as_dict = pickle.load(f)  # a PyTorch snapshot is plain dicts and lists
                self.assertEqual(tensormem.doctor(as_dict), cli)
                self.assertIsInstance(tensormem.doctor(as_dict), tensormem.Diagnosis)

    def test_summary_and_replay_per_device_as_the_cli(self):
        files = snapshots()
        if not files:
            self.skipTest(f"no fixtures in {FIXTURES}")
        path = str(files[0])
        self.assertEqual(tensormem.summary(path), lines(output(CARGO_CLI, "summary", path, "--json")[1]))
        replayed = tensormem.replay(path, alloc_conf="expandable_segments:True", capacity="24GiB")
        cli = lines(output(CARGO_CLI, "replay", path, "--json", "--alloc-conf", "expandable_segments:True", "--capacity", "24GiB")[1])
        self.assertEqual(replayed, cli)
        self.assertIn("device=", repr(replayed))

    def test_run_fit_scenarios_and_predict_as_the_cli(self):
        self.assertEqual(tensormem.run("seed-basics"), lines(output(CARGO_CLI, "run", "seed-basics", "--json")[1])[0])
        settings = {"batch": 4, "context": 128}
        set_args = ["--set", "batch=4", "--set", "context=128"]
        self.assertEqual(tensormem.run("lm-train", settings=settings), lines(output(CARGO_CLI, "run", "lm-train", *set_args, "--json")[1])[0])
        self.assertEqual(tensormem.scenarios(), lines(output(CARGO_CLI, "scenarios", "--json")[1])[0])
        fit = tensormem.fit("lm-train", strategies=["ddp"], cards=["H100-80GB"])
        self.assertEqual(fit, lines(output(CARGO_CLI, "fit", "lm-train", "--strategies", "ddp", "--cards", "H100-80GB", "--json")[1])[0])
        small, big = RECORDINGS / "gpt2-train-ctx256.pickle", RECORDINGS / "gpt2-train-ctx512.pickle"
        if not small.is_file():
            self.skipTest(f"no recordings in {RECORDINGS}")
        predicted = tensormem.predict({small: {"context": 256}, big: "context=512"}, to={"context": 1024})
        cli = lines(output(CARGO_CLI, "predict", f"{small}@context=256", f"{big}@context=512", "--to", "context=1024", "--json")[1])[0]
        self.assertEqual(predicted, cli)

    def test_errors_are_python_exceptions_with_the_cli_message(self):
        _, _, stderr = output(CARGO_CLI, "doctor", "/no/such/file.pickle")
        with self.assertRaises(tensormem.TensormemError) as caught:
            tensormem.doctor("/no/such/file.pickle")
        self.assertEqual(f"error: {caught.exception}\n", stderr)
        with self.assertRaises(tensormem.UsageError) as caught:
            tensormem.run("no-such-scenario")
        self.assertIn("known: ", str(caught.exception))
        with self.assertRaises(tensormem.TensormemError) as caught:
            tensormem.doctor(b"not a snapshot")
        self.assertIn("<snapshot>", str(caught.exception))
        with self.assertRaises(TypeError):
            tensormem.doctor(12)
        with self.assertRaises(TypeError):
            tensormem.doctor({"segments": [object()]})
        with self.assertRaises(tensormem.UsageError):
            tensormem.doctor()

    def test_a_diagnosis_prints_its_findings_and_a_table_in_a_notebook(self):
        files = snapshots()
        if not files:
            self.skipTest(f"no fixtures in {FIXTURES}")
        diagnosis = tensormem.doctor(files[0])
        text, html = repr(diagnosis), diagnosis._repr_html_()
        for finding in diagnosis.findings:
            mark = "?" if finding.get("confidence") == "inconclusive" else ""
            self.assertIn(f"[{finding['kind']}{mark}] {finding['title']}", text)
        self.assertEqual(html.count("<tr>"), len(diagnosis.findings) + 1)

    def test_what_the_trace_cannot_decide_is_printed_apart(self):
        # Built from the JSON the doctor returns: one decided finding, one inconclusive.
        diagnosis = tensormem._results.Diagnosis({"findings": [
            {"kind": "missing-no-grad", "title": "maybe", "confidence": "inconclusive"},
            {"kind": "peak", "title": "the peak", "confidence": "high", "fix": "shrink it"},
        ]})
        self.assertEqual(repr(diagnosis).splitlines(), [
            "<tensormem diagnosis: 2 findings>",
            "  [peak] the peak",
            "      fix: shrink it",
            "  the trace cannot decide (inconclusive):",
            "  [missing-no-grad?] maybe",
        ])


class Page(unittest.TestCase):
    def test_serve_from_the_wheel_serves_the_page_and_the_snapshot(self):
        files = snapshots()
        if not files:
            self.skipTest(f"no fixtures in {FIXTURES}")
        for given in (files[0], files[0].read_bytes()):
            url = tensormem.serve(given)
            base, _, query = url.partition("?")
            self.assertTrue(query.startswith("file=/snapshot/"), url)
            with urllib.request.urlopen(base, timeout=30) as page:
                self.assertIn(b"<html", page.read().lower())
            with urllib.request.urlopen(base + "pkg/tensormem_bg.wasm", timeout=30) as wasm:
                self.assertEqual(wasm.read(4), b"\0asm")
            with urllib.request.urlopen(base + query[len("file=/"):], timeout=30) as snapshot:
                self.assertEqual(snapshot.read(), files[0].read_bytes())


    def test_show_in_a_notebook_displays_the_page_in_the_output_cell(self):
        files = snapshots()
        if not files:
            self.skipTest(f"no fixtures in {FIXTURES}")
        shown = []
        ipython = type(sys)("IPython")
        display = type(sys)("IPython.display")
        ipython.get_ipython = lambda: object()  # a running kernel
        display.IFrame = lambda url, width, height: ("IFrame", url, width, height)
        display.display = shown.append
        ipython.display = display
        saved = {name: sys.modules.get(name) for name in ("IPython", "IPython.display")}
        sys.modules.update({"IPython": ipython, "IPython.display": display})
        try:
            url = tensormem.show(files[0], height=500)
        finally:
            for name, module in saved.items():
                if module is None:
                    sys.modules.pop(name, None)
                else:
                    sys.modules[name] = module
        self.assertEqual(shown, [("IFrame", url, "100%", 500)])
        with urllib.request.urlopen(url.partition("?")[0], timeout=30) as page:
            self.assertEqual(page.status, 200)


class Watch(unittest.TestCase):
    """Without CUDA (no GPU here): watch() says so and runs the block unchanged."""

    def test_without_cuda_the_block_runs_and_its_exception_is_untouched(self):
        try:
            import torch

            if torch.cuda.is_available():
                self.skipTest("a CUDA device is present: the recording path runs instead")
        except ImportError:
            pass
        said = io.StringIO()
        with redirect_stderr(said), tensormem.watch():
            ran = sum(range(10))
        self.assertEqual(ran, 45)
        self.assertIn("watch() needs PyTorch with CUDA", said.getvalue())

        mine = KeyError("the script's own")

        @tensormem.watch()
        def script():
            raise mine

        with redirect_stderr(io.StringIO()), self.assertRaises(KeyError) as caught:
            script()
        self.assertIs(caught.exception, mine)

    def test_an_out_of_memory_is_diagnosed_from_the_snapshot_taken_when_it_happened(self):
        """torch stood in for by a fake whose calls are those watch() makes, replaying a real
        out-of-memory snapshot: the recording, the observer, the file, the diagnosis."""
        recorded = FIXTURES / "expandable-3gpu-oom.pickle"
        if not recorded.is_file():
            self.skipTest(f"no {recorded}")
        with open(recorded, "rb") as f:
            at_the_failure = pickle.load(f)
        calls = []

        class OutOfMemoryError(RuntimeError):
            pass

        class Fake:
            pass

        torch = Fake()
        torch.cuda = Fake()
        torch.cuda.memory = Fake()
        torch._C = Fake()
        torch.cuda.is_available = lambda: True
        torch.cuda.init = lambda: calls.append("init")
        torch.cuda.memory._record_memory_history = lambda **kw: calls.append(("record", kw))
        # After the exception the script's tensors are gone: the end-of-block snapshot is empty.
        torch.cuda.memory._snapshot = lambda: at_the_failure if "oom" in calls else {"segments": [], "device_traces": []}
        torch._C._cuda_attach_out_of_memory_observer = lambda observer: calls.append(("observer", observer))
        folder = tempfile.mkdtemp()
        path = os.path.join(folder, "oom.pickle")
        said = io.StringIO()
        failure = OutOfMemoryError("CUDA out of memory. Tried to allocate 4.94 GiB")
        sys.modules["torch"] = torch
        try:
            with redirect_stderr(said), self.assertRaises(OutOfMemoryError) as caught, tensormem.watch(path, max_entries=1000):
                observer = next(c[1] for c in calls if c[0] == "observer")
                calls.append("oom")
                observer(1, 5308694528, 0, 95682560)  # the allocator calls it inside the failing malloc
                calls.remove("oom")
                raise failure
        finally:
            del sys.modules["torch"]
        self.assertIs(caught.exception, failure)
        self.assertEqual(calls[:2], ["init", ("record", {"max_entries": 1000, "stacks": "python"})])
        self.assertEqual(calls[-1], ("record", {"enabled": None}))
        with open(path, "rb") as f:
            self.assertEqual(pickle.load(f), at_the_failure)
        self.assertEqual(os.listdir(folder), ["oom.pickle"])
        text = said.getvalue()
        self.assertIn("out of memory on cuda:1 asking for 4.94 GiB (5308694528 bytes)", text)
        expected = tensormem.doctor(recorded)
        oom = next(f for f in expected.findings if f["kind"] == "oom")
        # The out-of-memory is the first finding printed, with its fix, then the file's place.
        first = text.index("  [")
        self.assertEqual(text[first:].split("\n")[0], f"  [oom] {oom['title']}")
        self.assertIn(f"fix: {oom['fix']}", text)
        self.assertIn(f"snapshot written to {path}", text)

    def test_a_block_that_ends_normally_prints_its_peak_and_writes_its_snapshot(self):
        files = snapshots()
        if not files:
            self.skipTest(f"no fixtures in {FIXTURES}")
        with open(files[0], "rb") as f:
            at_the_end = pickle.load(f)

        class Fake:
            pass

        torch = Fake()
        torch.cuda, torch._C = Fake(), Fake()
        torch.cuda.memory = Fake()
        torch.cuda.is_available = lambda: True
        torch.cuda.init = lambda: None
        torch.cuda.memory._record_memory_history = lambda **kw: None
        torch.cuda.memory._snapshot = lambda: at_the_end
        torch._C._cuda_attach_out_of_memory_observer = lambda observer: None
        path = os.path.join(tempfile.mkdtemp(), "end.pickle")
        said = io.StringIO()
        sys.modules["torch"] = torch
        try:
            with redirect_stderr(said), tensormem.watch(path, diagnose=False):
                pass
        finally:
            del sys.modules["torch"]
        with open(path, "rb") as f:
            self.assertEqual(pickle.load(f), at_the_end)
        lines = said.getvalue().splitlines()
        devices = tensormem.summary(files[0])
        peaks = [line for line in lines if " peaked at " in line]
        self.assertEqual(len(peaks), len(devices))
        for line, device in zip(peaks, devices):
            self.assertTrue(line.startswith(f"tensormem: cuda:{device['device']} peaked at "), line)
        from tensormem._results import _size

        self.assertIn(f"{_size(devices[0]['trace_peak_allocated_bytes'])} allocated", peaks[0])
        self.assertEqual(lines[-1], f"tensormem: snapshot written to {path} (open it with `tensormem serve {path}`)")

    def test_the_snapshot_is_written_whole_and_never_over_another_file(self):
        from tensormem._watch import _write_new

        folder = tempfile.mkdtemp()
        path = os.path.join(folder, "snap.pickle")
        self.assertEqual(_write_new(path, {"segments": [], "device_traces": [[]]}), path)
        with self.assertRaises(TypeError):  # cannot pickle a generator: the write fails midway
            _write_new(path, {"segments": [(i for i in ())]})
        self.assertEqual(os.listdir(folder), ["snap.pickle"], "no temporary left, nothing else written")
        # The name is taken: the next free one, the first file untouched.
        self.assertEqual(_write_new(path, {"segments": [], "device_traces": [[], []]}), os.path.join(folder, "snap-2.pickle"))
        with open(path, "rb") as f:
            self.assertEqual(pickle.load(f), {"segments": [], "device_traces": [[]]})
        umask = os.umask(0o022)
        os.umask(umask)
        self.assertEqual(oct(os.stat(path).st_mode & 0o777), oct(0o666 & ~umask), "an ordinary file, as _dump_snapshot writes")

    def stand_in(self):
        """`torch` stood in for by fake_torch on the first fixture's snapshot while the block runs
        (the test skipped without fixtures); yields the log of its calls."""
        files = snapshots()
        if not files:
            self.skipTest(f"no fixtures in {FIXTURES}")
        torch, calls = fake_torch(files[0])

        @contextlib.contextmanager
        def installed():
            sys.modules["torch"] = torch
            try:
                yield torch, calls
            finally:
                del sys.modules["torch"]

        return installed()

    def test_a_sweep_of_out_of_memory_blocks_in_one_second_keeps_every_snapshot(self):
        folder = tempfile.mkdtemp()
        cwd = os.getcwd()
        os.chdir(folder)
        said = io.StringIO()
        try:
            with self.stand_in() as (torch, calls), redirect_stderr(said):
                for batch in (64, 32, 16):  # each try runs out of memory at once: the same second
                    with self.assertRaises(MemoryError), tensormem.watch(diagnose=False):
                        torch.observers[-1](0, batch << 30, 80 << 30, 10 << 30)
                        raise MemoryError(f"CUDA out of memory. Tried to allocate {batch} GiB")
                # The same path asked for twice: the second goes beside it.
                for _ in range(2):
                    with tensormem.watch("mine.pickle", diagnose=False):
                        pass
        finally:
            os.chdir(cwd)
        written = [line.split("snapshot written to ")[1].split(" (")[0] for line in said.getvalue().splitlines() if "snapshot written to" in line]
        self.assertEqual(len(written), 5)
        self.assertEqual(len(set(written)), 5, written)
        self.assertEqual(sorted(os.listdir(folder)), sorted(os.path.basename(w) for w in written))
        self.assertEqual(written[3:], [os.path.join(folder, "mine.pickle"), os.path.join(folder, "mine-2.pickle")])
        self.assertIn(f"{os.path.join(folder, 'mine.pickle')} exists and is kept", said.getvalue())
        self.assertEqual(len([c for c in calls if c[0] == "observer"]), 1, "one observer for the process: PyTorch keeps each for good")

    def test_nested_blocks_record_until_the_outermost_ends(self):
        folder = tempfile.mkdtemp()
        with self.stand_in() as (_, calls), redirect_stderr(io.StringIO()):
            with tensormem.watch(os.path.join(folder, "outer.pickle"), diagnose=False):
                with tensormem.watch(os.path.join(folder, "inner.pickle"), diagnose=False, max_entries=5):
                    pass
                calls.append("the outer block goes on")
        recording = [c for c in calls if c[0] in ("record", "snapshot") or c == "the outer block goes on"]
        self.assertEqual(recording, [
            ("record", {"max_entries": 100_000, "stacks": "python"}),
            ("snapshot", True),  # the inner block's, recording on
            "the outer block goes on",
            ("snapshot", True),  # the outer block's, still recording
            ("record", {"enabled": None}),
        ])
        self.assertEqual(sorted(os.listdir(folder)), ["inner.pickle", "outer.pickle"])

    def test_blocks_in_threads_each_write_their_own_snapshot(self):
        import threading

        folder = tempfile.mkdtemp()
        path = os.path.join(folder, "run.pickle")
        decorated = os.path.join(folder, "decorated.pickle")
        started = threading.Barrier(4)
        recorded = [("record", {"max_entries": 100_000, "stacks": "python"}), ("record", {"enabled": None})]

        def block():
            with tensormem.watch(path, diagnose=False):
                started.wait()

        # As a decorator, each call is a block of its own, in threads and recursively.
        @tensormem.watch(decorated, diagnose=False)
        def step(depth):
            if depth:
                step(depth - 1)
            else:
                started.wait()

        def in_threads(*runs):
            threads = [threading.Thread(target=target, args=args) for target, args in runs]
            for t in threads:
                t.start()
            for t in threads:
                t.join()

        with self.stand_in() as (_, calls), redirect_stderr(io.StringIO()):
            in_threads(*[(block, ())] * 4)
            self.assertEqual(sorted(os.listdir(folder)), ["run-2.pickle", "run-3.pickle", "run-4.pickle", "run.pickle"])
            self.assertEqual([c for c in calls if c[0] == "record"], recorded)
            del calls[:]
            in_threads((step, (0,)), (step, (0,)), (step, (0,)), (step, (1,)))
        self.assertEqual(len([n for n in os.listdir(folder) if n.startswith("decorated")]), 5)
        self.assertEqual([c for c in calls if c[0] == "record"], recorded)


# A Python that runs `-m tensormem ARGS` with 16 MiB of address space to spare once imported.
TIGHT_PYTHON = """#!PYTHON
import resource, sys
from tensormem import __main__ as command
size = int(open("/proc/self/statm").read().split()[0]) * resource.getpagesize()
resource.setrlimit(resource.RLIMIT_AS, (size + (16 << 20), size + (16 << 20)))
sys.argv = sys.argv[2:]
command.main()
"""


def fake_torch(snapshot_file):
    """A stand-in for torch with CUDA: the calls watch() makes, logged in `calls`; its snapshot
    is a real PyTorch snapshot, and `observers` holds the out-of-memory observers attached."""
    with open(snapshot_file, "rb") as f:
        snapshot = pickle.load(f)
    calls, state = [], {"recording": False}

    class Fake:
        pass

    torch = Fake()
    torch.cuda, torch._C, torch.cuda.memory = Fake(), Fake(), Fake()
    torch.observers = []
    torch.cuda.is_available = lambda: True
    torch.cuda.init = lambda: None

    def record(**kw):
        state["recording"] = kw.get("enabled", "all") is not None
        calls.append(("record", kw))

    def take():
        calls.append(("snapshot", state["recording"]))
        return snapshot

    def attach(observer):
        torch.observers.append(observer)
        calls.append(("observer", observer))

    torch.cuda.memory._record_memory_history = record
    torch.cuda.memory._snapshot = take
    torch._C._cuda_attach_out_of_memory_observer = attach
    return torch, calls


class Robust(unittest.TestCase):
    """Issue 49: what a careless or unlucky user does from Python ends in an answer or a clear
    error, never in a killed interpreter, a hang or a lost file."""

    def test_a_snapshot_dict_is_streamed_and_a_tool_out_of_memory_is_a_memory_error(self):
        if not os.path.exists("/proc/self/statm"):
            self.skipTest("no /proc/self/statm to bound the tool's memory by")
        base = 0x7F0000000000
        frames = [{"filename": "x.py", "line": 1, "name": "f"}]
        trace = [{"action": "segment_alloc", "addr": base, "size": 20 << 20, "stream": 0, "time_us": 0, "frames": frames}]
        for i in range(200_000):
            for action in ("alloc", "free_requested", "free_completed"):
                trace.append({"action": action, "addr": base, "size": 512, "stream": 0, "time_us": i, "frames": frames})
        snapshot = {"segments": [], "device_traces": [trace]}
        self.assertEqual(tensormem.summary(snapshot)[0]["trace_peak_allocated_bytes"], 512)
        # The tool's process gets 16 MiB of address space beyond what it has once imported: the
        # tool's allocation fails, Rust aborts there, and this interpreter raises MemoryError.
        wrapper = os.path.join(tempfile.mkdtemp(), "python")
        with open(wrapper, "w") as f:
            f.write(TIGHT_PYTHON.replace("PYTHON", sys.executable))
        os.chmod(wrapper, 0o755)
        real, sys.executable = sys.executable, wrapper
        try:
            with self.assertRaises(MemoryError) as caught:
                tensormem.summary(snapshot)
        finally:
            sys.executable = real
        self.assertIn("memory allocation of", str(caught.exception))
        self.assertIn("this interpreter is unharmed", str(caught.exception))
        self.assertEqual(tensormem.summary(snapshot)[0]["trace_peak_allocated_bytes"], 512, "and the next call works")
        with self.assertRaises(TypeError) as caught:
            tensormem.summary({"segments": [], "device_traces": [[{"action": "alloc", "addr": 0, "size": 512, "time_us": datetime.datetime.now()}]]})
        self.assertIn("found datetime", str(caught.exception))

    def test_a_pipe_of_this_process_is_read_whole(self):
        files = snapshots()
        if not files:
            self.skipTest(f"no fixtures in {FIXTURES}")
        import threading

        data = files[0].read_bytes()
        read, write = os.pipe()

        def slowly():
            with os.fdopen(write, "wb") as w:
                w.write(data[:100])
                w.flush()
                import time

                time.sleep(0.3)
                w.write(data[100:])

        writer = threading.Thread(target=slowly)
        writer.start()
        try:
            piped = tensormem.summary(f"/proc/self/fd/{read}")
        finally:
            writer.join()
            os.close(read)
        whole = tensormem.summary(files[0])
        self.assertEqual([d["trace_peak_allocated_bytes"] for d in piped], [d["trace_peak_allocated_bytes"] for d in whole])

    def test_a_named_pipe_without_a_writer_is_an_error_in_bounded_time(self):
        import time

        folder = tempfile.mkdtemp()
        fifo = os.path.join(folder, "f.pickle")
        os.mkfifo(fifo)
        os.environ["TENSORMEM_PIPE_WAIT"] = "0.5"
        try:
            start = time.monotonic()
            with self.assertRaises(tensormem.TensormemError) as caught:
                tensormem.doctor(fifo)
            self.assertLess(time.monotonic() - start, 30)
            self.assertIn("named pipe", str(caught.exception))
            with self.assertRaises(tensormem.TensormemError) as caught:
                tensormem.serve(fifo)
            self.assertIn("not a regular file", str(caught.exception))
        finally:
            del os.environ["TENSORMEM_PIPE_WAIT"]

    def test_a_str_holding_a_snapshots_text_is_refused_in_a_line(self):
        text = json.dumps({"segments": [], "device_traces": [[{"action": "alloc", "addr": i, "size": 512} for i in range(20_000)]]})
        with self.assertRaises(tensormem.UsageError) as caught:
            tensormem.doctor(text)
        message = str(caught.exception)
        self.assertLess(len(message), 300, message)
        self.assertIn("pass it as bytes", message)
        self.assertEqual(tensormem.summary(text.encode())[0]["trace_peak_allocated_bytes"], 20_000 * 512, "as bytes it is read")

    def test_a_comma_in_a_setting_value_sets_nothing_else(self):
        with self.assertRaises(tensormem.UsageError) as caught:
            tensormem.run("seed-basics", settings={"n": "5,n=7"})
        self.assertIn("holds another setting", str(caught.exception))
        self.assertEqual(tensormem.run("variable-batch", settings={"batches": "3,4"})["parameters"]["batches"], [3, 4])

    def test_a_killed_interpreter_takes_its_server_and_temporary_copy_with_it(self):
        files = snapshots()
        if not files:
            self.skipTest(f"no fixtures in {FIXTURES}")
        import time

        folder = tempfile.mkdtemp()
        code = f"import os, tensormem\nprint(tensormem.serve(open({str(files[0])!r}, 'rb').read()), flush=True)\nos.abort()"
        child = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=120, env=dict(os.environ, TMPDIR=folder))
        url = child.stdout.strip()
        self.assertTrue(url.startswith("http://127.0.0.1:"), child.stderr)
        self.assertLess(child.returncode, 0, "the interpreter died")
        deadline = time.monotonic() + 30
        while time.monotonic() < deadline and os.listdir(folder):
            time.sleep(0.1)
        self.assertEqual(os.listdir(folder), [], "the temporary copy is removed")
        with self.assertRaises(OSError):
            urllib.request.urlopen(url, timeout=5)


if __name__ == "__main__":
    if os.environ.get("CI") == "true":
        snapshots()  # a missing fixture folder fails under CI
    counting.run(sys.modules[__name__], "python", "Python package")
