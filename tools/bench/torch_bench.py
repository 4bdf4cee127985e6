#!/usr/bin/env python3
"""PyTorch's figures for what `tensormem bench --json` measures, with its JSON field names.

    python3 tools/bench/torch_bench.py [--sizes 1024,2048,4096] [--device cuda|cpu] [--no-fresh]

Prints one JSON object:
  matmul           [{m, n, k, kernel, gflops, tf32_gflops}]: fp32 square torch.mm, TF32 off
                   (`gflops`, the figure to compare) and, for reference only, with TF32 on;
  copy_gbps        y.copy_(x) of elementwise_elements f32 (a device-to-device cudaMemcpy),
                   bytes read + written;
  elementwise_gbps x + y (output from the caching allocator), 12 bytes per element;
  elementwise_copy_gbps  torch.neg(x, out=y): a kernel that reads n and writes n floats (what
                   tensormem's copy_ kernel does; PyTorch's own copy_ is a cudaMemcpy);
  reduction_gbps   [rows.sum(-1) over rows of 1024, x.sum()], bytes read;
  cached_op_loop_per_s   x + x of 64 Ki f32 per second (outputs from the caching allocator);
  fresh_buffer_op_loop_per_s  the same loop in a child process with
                   PYTORCH_NO_CUDA_MEMORY_CACHING=1 (cudaMalloc/cudaFree per output);
  dispatch_us      one in-place add of 4 elements (a.add_(b)), wall time per op with the GPU
                   waited for every 256 ops, as tensormem measures it;
  alloc_free_per_s torch.empty of 1 MiB dropped at once, per second (the caching allocator);
  plus adapter, torch_version, device.
Bandwidth and matmul figures: CUDA events around a batch of calls, after warm-up, median of
several batches. Loops (dispatch, small ops, alloc): wall clock with torch.cuda.synchronize.
`--device cpu` only checks the script (figures are CPU ones).
"""

import argparse
import json
import os
import statistics
import subprocess
import sys
import time

import torch


def sync(dev):
    if dev.type == "cuda":
        torch.cuda.synchronize(dev)


def seconds_per_call(fn, dev, target_s=0.05, repeats=7, warmup=3, max_iters=2000):
    """Median over `repeats` batches of seconds per call; each batch runs about target_s."""
    for _ in range(warmup):
        fn()
    sync(dev)
    t0 = time.perf_counter()
    fn()
    sync(dev)
    one = max(time.perf_counter() - t0, 1e-6)
    iters = int(min(max_iters, max(3, target_s / one)))
    samples = []
    for _ in range(repeats):
        if dev.type == "cuda":
            start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
            start.record()
            for _ in range(iters):
                fn()
            end.record()
            end.synchronize()
            samples.append(start.elapsed_time(end) / 1e3 / iters)
        else:
            t0 = time.perf_counter()
            for _ in range(iters):
                fn()
            samples.append((time.perf_counter() - t0) / iters)
    return statistics.median(samples)


def wall_per_call(fn, dev, batch, target_s=0.1, repeats=5):
    """Median over `repeats` rounds of wall seconds per call, the GPU waited for every `batch` calls."""
    for _ in range(batch):
        fn()
    sync(dev)
    samples = []
    for _ in range(repeats):
        calls = 0
        t0 = time.perf_counter()
        while True:
            for _ in range(batch):
                fn()
            sync(dev)
            calls += batch
            if time.perf_counter() - t0 >= target_s:
                break
        samples.append((time.perf_counter() - t0) / calls)
    return statistics.median(samples)


def filled(shape, dev):
    n = 1
    for s in shape:
        n *= s
    return (torch.arange(n, dtype=torch.float32, device=dev) * 7919 % 1000 / 1000).reshape(shape)


def small_op_loop_per_s(dev):
    x = filled([64 << 10], dev)
    return 1.0 / wall_per_call(lambda: x + x, dev, batch=64)


def main():
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--sizes", default="256,512,1024", help="square matmul sizes, comma-separated (tensormem's default 256,512,1024)")
    parser.add_argument("--device", default="cuda", help="cuda (default) or cpu (checks the script only)")
    parser.add_argument("--elements", type=int, default=16 << 20, help="f32 elements of the bandwidth figures (16 Mi, as tensormem)")
    parser.add_argument("--no-fresh", action="store_true", help="skip the child process with PYTORCH_NO_CUDA_MEMORY_CACHING=1")
    parser.add_argument("--loop-only", action="store_true", help=argparse.SUPPRESS)
    args = parser.parse_args()
    dev = torch.device(args.device)
    if dev.type == "cuda" and not torch.cuda.is_available():
        sys.exit("torch sees no CUDA device (use --device cpu to check the script)")

    if args.loop_only:  # the child of fresh_buffer_op_loop_per_s
        print(json.dumps({"per_s": small_op_loop_per_s(dev)}))
        return

    torch.backends.cuda.matmul.allow_tf32 = False
    torch.backends.cudnn.allow_tf32 = False
    torch.set_float32_matmul_precision("highest")
    sizes = [int(s) for s in args.sizes.split(",") if s.strip()]
    report = {
        "adapter": (f"{torch.cuda.get_device_name(dev)} (CUDA {torch.version.cuda})" if dev.type == "cuda" else "CPU"),
        "torch_version": torch.__version__,
        "device": str(dev),
    }

    matmul = []
    for s in sizes:
        a, b = filled([s, s], dev), filled([s, s], dev)
        out = torch.empty(s, s, device=dev)
        flops = 2.0 * s ** 3
        t = seconds_per_call(lambda: torch.mm(a, b, out=out), dev)
        torch.backends.cuda.matmul.allow_tf32 = True
        t32 = seconds_per_call(lambda: torch.mm(a, b, out=out), dev) if dev.type == "cuda" else t
        torch.backends.cuda.matmul.allow_tf32 = False
        matmul.append({"m": s, "n": s, "k": s, "kernel": "torch.mm fp32 (TF32 off)", "gflops": flops / t / 1e9, "tf32_gflops": flops / t32 / 1e9})
        del a, b, out
    report["matmul"] = matmul

    n = args.elements
    x, y = filled([n], dev), filled([n], dev)
    report["copy_gbps"] = 8.0 * n / seconds_per_call(lambda: y.copy_(x), dev) / 1e9
    report["elementwise_gbps"] = 12.0 * n / seconds_per_call(lambda: x + y, dev) / 1e9
    report["elementwise_copy_gbps"] = 8.0 * n / seconds_per_call(lambda: torch.neg(x, out=y), dev) / 1e9
    rows = x.view(n // 1024, 1024)
    report["reduction_gbps"] = [
        4.0 * n / seconds_per_call(lambda: rows.sum(-1), dev) / 1e9,
        4.0 * n / seconds_per_call(lambda: x.sum(), dev) / 1e9,
    ]
    report["elementwise_elements"] = n
    del x, y, rows

    report["cached_op_loop_per_s"] = small_op_loop_per_s(dev)
    a, b = filled([4], dev), filled([4], dev)
    report["dispatch_us"] = 1e6 * wall_per_call(lambda: a.add_(b), dev, batch=256)
    del a, b

    if args.no_fresh or dev.type != "cuda":
        report["fresh_buffer_op_loop_per_s"] = None
    else:
        env = dict(os.environ, PYTORCH_NO_CUDA_MEMORY_CACHING="1")
        try:
            child = subprocess.run([sys.executable, os.path.abspath(__file__), "--loop-only", "--device", args.device],
                                   env=env, capture_output=True, text=True, timeout=60)
            report["fresh_buffer_op_loop_per_s"] = json.loads(child.stdout.strip().splitlines()[-1])["per_s"] if child.returncode == 0 else None
        except (subprocess.TimeoutExpired, ValueError, IndexError):
            report["fresh_buffer_op_loop_per_s"] = None

    count = 20_000
    sync(dev)
    t0 = time.perf_counter()
    for _ in range(count):
        torch.empty(1 << 18, dtype=torch.float32, device=dev)
    sync(dev)
    report["alloc_free_per_s"] = count / (time.perf_counter() - t0)
    print(json.dumps(report))


if __name__ == "__main__":
    main()
