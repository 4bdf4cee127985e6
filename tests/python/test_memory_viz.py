"""PyTorch's own reader of memory snapshots, `torch/cuda/_memory_viz.py` (from the torch wheel
named in memory-viz-requirements.txt; scripts/test-python.sh extracts it), on the files tensormem
writes: graph captures with private pools, the RL worker's pools restored, and real PyTorch
snapshots replayed.

`_memory_viz` reads keys by name and checks as it goes: `stats` (segsum) asserts that each
segment's blocks add up to its size, `trace` names every entry, `filter_alloc_free_pairs`
complains of a free without its request. The HTML it writes (`trace_plot`) loads MemoryViz.js,
which cannot be fetched here: what it needs of a file that the Python side does not check (an
`unknown` category beside others) is checked by hand. Where its answers carry figures, they must be
tensormem's own (`summary --json`, the doctor's private-pools evidence); on a replayed real file,
its printouts must be those of the original, byte for byte.

Environment: MEMORY_VIZ (the extracted `_memory_viz.py`), TENSORMEM_CLI, TENSORMEM_FIXTURES.
"""

import ast
import importlib.util
import io
import json
import os
import pickle
import re
import subprocess
import sys
import tempfile
import unittest

import counting
from collections import defaultdict
from contextlib import redirect_stdout
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
FIXTURES = Path(os.environ.get("TENSORMEM_FIXTURES", ROOT.parent / "shared/fixtures/pytorch-snapshots"))
CLI = os.environ.get("TENSORMEM_CLI", str(ROOT / "target/release/tensormem"))
MEMORY_VIZ = Path(os.environ["MEMORY_VIZ"]) if "MEMORY_VIZ" in os.environ else None
# vLLM's two private pools in a verl RL worker: a state with no trace.
RL_WORKER = ROOT / "tests/data/real/verl-mem.pickle"
# Scenarios whose snapshots have private pools (and their eager twin, which has none).
SCENARIOS = [
    ("cuda-graph-step", "mode=graph"),
    ("cuda-graph-step", "mode=eager"),
    ("cuda-graph-pools", "pools=own"),
    ("cuda-graph-pools", "pools=shared"),
]


def memory_viz():
    """The module, or None where it could not be fetched (never under CI=true)."""
    if MEMORY_VIZ is None or not MEMORY_VIZ.is_file():
        if os.environ.get("CI") == "true":
            raise AssertionError(f"{MEMORY_VIZ} is missing: scripts/test-python.sh fetches it")
        return None
    spec = importlib.util.spec_from_file_location("pytorch_memory_viz", MEMORY_VIZ)
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def tensormem(*args):
    done = subprocess.run([CLI, *args], capture_output=True, text=True, timeout=600)
    if done.returncode != 0:
        raise AssertionError(f"tensormem {' '.join(args)}: exit {done.returncode}\n{done.stderr}")
    return done.stdout


def pytorch(command, path):
    """`python _memory_viz.py COMMAND FILE`, as a user runs it."""
    done = subprocess.run([sys.executable, str(MEMORY_VIZ), command, str(path)], capture_output=True, text=True, timeout=600)
    if done.returncode != 0:
        raise AssertionError(f"_memory_viz.py {command} {path}: exit {done.returncode}\n{done.stderr}")
    return done.stdout


def load(path):
    with open(path, "rb") as f:
        return pickle.load(f)


def without_times(printed):
    """`trace`'s printout with the entries it prints whole (segment maps, snapshots) as dicts,
    less the keys a replay does not carry: it re-decides a run and has no clock of its own."""
    lines = []
    for line in printed.splitlines():
        if line.startswith("{"):
            entry = ast.literal_eval(line)
            for key in ("time_us", "compile_context", "user_metadata"):
                entry.pop(key, None)
            lines.append(entry)
        else:
            lines.append(line)
    return lines


class PyTorchsReader(unittest.TestCase):
    @classmethod
    def setUpClass(cls):
        cls.viz = memory_viz()
        cls.folder = tempfile.TemporaryDirectory()
        cls.dir = Path(cls.folder.name)

    @classmethod
    def tearDownClass(cls):
        cls.folder.cleanup()

    def setUp(self):
        if self.viz is None:
            self.skipTest(f"{MEMORY_VIZ} is not there (scripts/test-python.sh fetches it)")

    def check_against_tensormem(self, path):
        """`stats`, `trace` and the module's readers on one file, against tensormem's figures."""
        data = load(path)
        (summary,) = [json.loads(line) for line in tensormem("summary", str(path), "--json").splitlines() if line.strip()]
        stats = summary["memory_stats"]
        printed = pytorch("stats", path)
        self.assertIn(f"segments: {stats['segment.all.current']}\n", printed)
        self.assertIn(f"total_reserved: {self.viz.Bytes(stats['reserved_bytes.all.current'])}\n", printed)
        self.assertEqual(sum(self.viz.calc_active(s) for s in data["segments"]), stats["allocated_bytes.all.current"])
        # A device with no trace prints nothing.
        self.assertEqual(re.findall(r"\n(\d+) entries\n", pytorch("trace", path)), [str(summary["events"])] if summary["events"] else [])

        # The segments' flame graph (its lines, not the SVG): each segment's lines add up to its
        # size, and so each pool's to what it reserves.
        lines = self.viz.segments(data, format_flamegraph=lambda text: text)
        by_segment = defaultdict(int)
        for line in lines.splitlines():
            prefix, size = line.rsplit(" ", 1)
            by_segment[int(re.match(r"stream_-?\d+;seg_(\d+);", prefix).group(1))] += int(size)
        self.assertEqual(dict(by_segment), {s["address"]: s["total_size"] for s in data["segments"]})
        pools = defaultdict(int)
        for s in data["segments"]:
            pools[tuple(s["segment_pool_id"])] += by_segment[s["address"]]
        private = {pool: size for pool, size in pools.items() if pool != (0, 0)}

        # PyTorch's web viewer (pytorch.org/memory_viz, and the page `trace_plot` writes) fails on
        # a snapshot whose entries name categories but not `unknown` (MemoryViz.js's
        # annotate_snapshot pushes it onto a misspelt list): `_profile_to_snapshot` always has it.
        categories = {e["category"] for trace in data["device_traces"] for e in trace if "category" in e}
        self.assertTrue(not categories or "unknown" in categories, categories)

        # Every free completed was requested, and what is allocated but never freed in the trace
        # is still allocated in the segments.
        complaints = io.StringIO()
        with redirect_stdout(complaints):
            unpaired = self.viz.filter_alloc_free_pairs(load(path))
        self.assertEqual(complaints.getvalue(), "")
        live = {b["address"] for s in data["segments"] for b in s["blocks"] if b["state"] == "active_allocated"}
        for trace in unpaired["device_traces"]:
            self.assertLessEqual({e["addr"] for e in trace if e["action"] == "alloc"}, live)
        return data, private

    def test_graph_captures_are_read_with_their_pools(self):
        seen = {}
        for scenario, setting in SCENARIOS:
            with self.subTest(f"{scenario} {setting}"):
                path = self.dir / f"{scenario}-{setting.replace('=', '-')}.pickle"
                tensormem("run", scenario, "--set", setting, "--snapshot", str(path))
                _, private = self.check_against_tensormem(path)
                seen[(scenario, setting)] = sorted(private)
                # What each pool reserves, as the doctor says it (PyTorch's reader knows no pools).
                doctor = json.loads(tensormem("doctor", str(path), "--json"))
                evidence = [f["evidence"] for f in doctor["findings"] if f["kind"] == "private-pools"]
                self.assertEqual({tuple(p["pool"]): p["reserved_bytes"] for e in evidence for p in e["pools"]}, private)
        # A graph captured with no pool gets one of its own, (N, 0); graphs given one handle share
        # it, (0, 1); eager has none.
        self.assertEqual(seen.get(("cuda-graph-step", "mode=eager")), [])
        self.assertEqual(seen.get(("cuda-graph-step", "mode=graph")), [(1, 0)])
        self.assertEqual(seen.get(("cuda-graph-pools", "pools=shared")), [(0, 1)])
        own = seen.get(("cuda-graph-pools", "pools=own"), [])
        self.assertGreater(len(own), 1)
        self.assertTrue(all(pool[1] == 0 for pool in own))

    def test_the_rl_workers_pools_restored_and_written_read_as_the_original(self):
        out = self.dir / "verl-replayed.pickle"
        tensormem("replay", str(RL_WORKER), "--snapshot", str(out))
        _, private = self.check_against_tensormem(out)
        _, recorded = self.check_against_tensormem(RL_WORKER)
        # vLLM's pools: its KV cache's 20.30 GiB in 24 segments, and 558 MiB in 44.
        self.assertEqual(private, recorded)
        self.assertEqual(private, {(0, 1): 585105408, (0, 2): 21793603584})
        self.assertEqual(pytorch("stats", out), pytorch("stats", RL_WORKER))
        # Segment by segment, pools included: what _memory_viz reads and what it does not.
        self.assertEqual(load(out)["segments"], load(RL_WORKER)["segments"])

    def test_real_snapshots_replayed_and_written_print_as_the_originals(self):
        files = sorted(FIXTURES.glob("*.pickle")) if FIXTURES.is_dir() else []
        if not files:
            if os.environ.get("CI") == "true":
                raise AssertionError(f"fixture folder {FIXTURES} is missing")
            self.skipTest(f"no fixtures in {FIXTURES}")
        for path in files:
            with self.subTest(path.name):
                out = self.dir / f"replayed-{path.name}"
                tensormem("replay", str(path), "--snapshot", str(out))
                self.assertEqual(pytorch("stats", out), pytorch("stats", path))
                # A replay on an unlimited card is not refused where the program was: it makes
                # the cache flush before a recorded oom, but not the oom (tests/replay.rs replays
                # those at the card's capacity).
                if any(e["action"] == "oom" for trace in load(path)["device_traces"] for e in trace):
                    continue
                self.assertEqual(without_times(pytorch("trace", out)), without_times(pytorch("trace", path)))


if __name__ == "__main__":
    counting.run(sys.modules[__name__], "memory_viz", "PyTorch's _memory_viz")
