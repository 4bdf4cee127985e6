"""Records the doctor's labelled corpus: ordinary PyTorch programs, each a known mistake or a clean
counterpart, as PyTorch's own caching allocator records them on an NVIDIA GPU (issue 31).

    python3 tools/corpus/record.py OUT_DIR [--only NAME...] [--device cuda|cpu]

Each program runs in a process of its own (a fresh allocator, as a user's script has), records
with `torch.cuda.memory._record_memory_history(stacks="python")` (the Python-only stacks many
users record; `clean-train-all-stacks` with C++ frames too), and writes OUT_DIR/NAME.pickle. The
labels, written from the code below, are in tests/data/corpus/labels.json: which finding kinds
the doctor must report among the first two problems (`expect`), which it must not report
(`absent`), and which it can only call inconclusive (`inconclusive`). On the CPU the programs
only run (a check of the Python). Small models, a few iterations: files of kilobytes to a few
megabytes.
"""

import argparse
import os
import subprocess
import sys
import time

import torch
from torch import nn

MIB = 1 << 20


def mlp(width=1024, depth=4):
    layers = []
    for _ in range(depth):
        layers += [nn.Linear(width, width), nn.GELU()]
    return nn.Sequential(*layers, nn.Linear(width, 10))


def batches(device, n, batch=256, width=1024):
    return [torch.randn(batch, width, device=device) for _ in range(n)]


def discarded_forward(device, no_grad):
    """An evaluation loop that throws each forward's result away (`out = model(x)`), without
    no_grad (the mistake: every forward's graph lives until `out` is rebound) or under it."""
    model = mlp().to(device)
    model.eval()
    data = batches(device, 6)
    results = []
    for x in data:
        if no_grad:
            with torch.no_grad():
                out = model(x)
        else:
            out = model(x)
        results.append(out.argmax(dim=1))
    return results


def inference_mode(device):
    """Batched inference entirely under torch.inference_mode(): clean."""
    model = mlp().to(device)
    with torch.inference_mode():
        preds = [model(x).softmax(dim=1).argmax(dim=1) for x in batches(device, 6)]
    return preds


def clean_train(device):
    """A clean training loop whose model is built on the CPU and moved with model.to(device)
    before the loop (the setup the doctor took for a first forward): AdamW, zero_grad."""
    model = mlp()
    model.to(device)
    opt = torch.optim.AdamW(model.parameters(), lr=1e-3)
    loss_fn = nn.CrossEntropyLoss()
    for x in batches(device, 5):
        y = torch.randint(0, 10, (x.shape[0],), device=device)
        opt.zero_grad(set_to_none=True)
        loss = loss_fn(model(x), y)
        loss.backward()
        opt.step()


def loss_history(device, fix):
    """Validation-loss accumulation: `total += loss` keeps every forward's graph (the mistake);
    `total += loss.item()` does not."""
    model = mlp().to(device)
    loss_fn = nn.CrossEntropyLoss()
    total = 0.0
    for x in batches(device, 5):
        y = torch.randint(0, 10, (x.shape[0],), device=device)
        loss = loss_fn(model(x), y)
        total += loss.item() if fix else loss
    return total


def empty_cache_train(device):
    """Training with a large temporary per step, then the program's own torch.cuda.empty_cache()
    before more steps: the cached blocks it had are given back (no fragmentation to report
    from before it)."""
    model = mlp().to(device)
    opt = torch.optim.SGD(model.parameters(), lr=1e-3, momentum=0.9)
    loss_fn = nn.CrossEntropyLoss()
    for step, x in enumerate(batches(device, 6, batch=512)):
        y = torch.randint(0, 10, (x.shape[0],), device=device)
        big = torch.randn(64 * MIB // 4 + step * 4096, device=device)  # a growing scratch buffer
        opt.zero_grad(set_to_none=True)
        loss = loss_fn(model(x), y) + big.mean() * 0
        loss.backward()
        opt.step()
        del big
        if step == 2 and device == "cuda":
            torch.cuda.empty_cache()


def grad_accumulation(device):
    """Deliberate gradient accumulation: four backwards per optimizer step (grads kept on
    purpose, not a mistake)."""
    model = mlp().to(device)
    opt = torch.optim.AdamW(model.parameters(), lr=1e-3)
    loss_fn = nn.CrossEntropyLoss()
    data = batches(device, 8, batch=64)
    opt.zero_grad(set_to_none=True)
    for i, x in enumerate(data):
        y = torch.randint(0, 10, (x.shape[0],), device=device)
        (loss_fn(model(x), y) / 4).backward()
        if (i + 1) % 4 == 0:
            opt.step()
            opt.zero_grad(set_to_none=True)


def hand_written_optimizer(device):
    """SGD written by hand: `p -= lr * p.grad` under no_grad, and the `p.data = p.data - ...`
    form that re-makes each parameter's storage (neither is optimizer state)."""
    model = mlp().to(device)
    loss_fn = nn.CrossEntropyLoss()
    for step, x in enumerate(batches(device, 5)):
        y = torch.randint(0, 10, (x.shape[0],), device=device)
        model.zero_grad(set_to_none=True)
        loss_fn(model(x), y).backward()
        with torch.no_grad():
            for p in model.parameters():
                if step % 2 == 0:
                    p -= 1e-3 * p.grad
                else:
                    p.data = p.data - 1e-3 * p.grad


def dump_before_backward(device):
    """A snapshot dumped between a forward and its backward (as a debugging user does): the
    graph alive at the dump is the forward's own, to be freed by the backward never recorded."""
    model = mlp().to(device)
    loss_fn = nn.CrossEntropyLoss()
    x = batches(device, 1)[0]
    y = torch.randint(0, 10, (x.shape[0],), device=device)
    loss = loss_fn(model(x), y)
    return loss  # the dump happens here, with the graph alive


PROGRAMS = {
    "discarded-forward-mistake": lambda d: discarded_forward(d, no_grad=False),
    "discarded-forward-fix": lambda d: discarded_forward(d, no_grad=True),
    "inference-mode": inference_mode,
    "clean-train": clean_train,
    "clean-train-all-stacks": clean_train,
    "loss-history-mistake": lambda d: loss_history(d, fix=False),
    "loss-history-fix": lambda d: loss_history(d, fix=True),
    "empty-cache-train": empty_cache_train,
    "grad-accumulation": grad_accumulation,
    "hand-written-optimizer": hand_written_optimizer,
    "dump-before-backward": dump_before_backward,
}


def run_one(name, out_dir, device):
    """Runs one program in this process, recording it on CUDA."""
    torch.manual_seed(0)
    cuda = device == "cuda"
    if cuda:
        torch.cuda.init()
        stacks = "all" if name.endswith("all-stacks") else "python"
        torch.cuda.memory._record_memory_history(max_entries=1 << 20, stacks=stacks)
    keep = PROGRAMS[name](device)
    if cuda:
        torch.cuda.synchronize()
        path = os.path.join(out_dir, f"{name}.pickle")
        torch.cuda.memory._dump_snapshot(path)
        torch.cuda.memory._record_memory_history(enabled=None)
        print(f"{name}: {os.path.getsize(path)} bytes, peak {torch.cuda.max_memory_allocated() / MIB:.1f} MiB allocated")
    else:
        print(f"{name}: ran on the CPU")
    del keep


def main():
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("out_dir")
    parser.add_argument("--only", nargs="*", default=None)
    parser.add_argument("--device", default="cuda" if torch.cuda.is_available() else "cpu")
    parser.add_argument("--one", help=argparse.SUPPRESS)
    args = parser.parse_args()
    os.makedirs(args.out_dir, exist_ok=True)
    if args.one:
        run_one(args.one, args.out_dir, args.device)
        return
    failed = 0
    for name in args.only or PROGRAMS:
        started = time.time()
        done = subprocess.run([sys.executable, __file__, args.out_dir, "--device", args.device, "--one", name], timeout=120)
        failed += done.returncode != 0
        print(f"  ({time.time() - started:.1f} s)", flush=True)
    sys.exit(1 if failed else 0)


if __name__ == "__main__":
    main()
