"""Twin of `tensormem run cuda-graph-step` (src/scenarios/graphs.rs `graph_step`): a training
step of the pitfalls' model with Adam, run eagerly, or warmed up on a side stream and captured
into a CUDA graph (PyTorch's whole-network capture example), then replayed.

torch.optim.Adam can be captured only with capturable=True, which keeps each parameter's step
count on the device (one 512-byte block each); tensormem's Adam keeps it on the host, so the
graph mode's figures differ by those blocks. On the CPU both modes run eagerly."""
import contextlib
import os
import sys

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))

import torch  # noqa: E402

import common  # noqa: E402


import models  # noqa: E402

NAME = "cuda-graph-step"
VARIANTS = []
PARAMETERS = common.PITFALL_PARAMETERS + [("mode", "graph", {"type": "choice", "options": ["graph", "eager"]})]
FIX_SETTINGS = None


def program(rec, v):
    net, ids, targets = models.pitfall_model(rec, v)
    graph_mode = v.choice("mode") == "graph"
    optimizer = torch.optim.Adam(net.ordered_parameters(), lr=1e-3, weight_decay=0.0, foreach=True, capturable=graph_mode and rec.cuda)

    def step(zero_grad):
        if zero_grad:
            optimizer.zero_grad(set_to_none=True)
        net.loss(ids, targets, True).backward()
        optimizer.step()

    if not graph_mode:
        for s in range(1, v.int("steps") + 1):
            step(True)
            rec.step(f"eager step {s}")
        return
    side = torch.cuda.Stream() if rec.cuda else None
    if side is not None:
        side.wait_stream(torch.cuda.current_stream())
    with torch.cuda.stream(side) if side is not None else contextlib.nullcontext():
        for _ in range(3):
            step(True)
    if side is not None:
        torch.cuda.current_stream().wait_stream(side)
    rec.step("3 warm-up steps on a side stream")
    # Gradients set to None before the capture: backward makes them inside it, in the pool.
    optimizer.zero_grad(set_to_none=True)
    graph = torch.cuda.CUDAGraph() if rec.cuda else None
    with torch.cuda.graph(graph) if graph is not None else contextlib.nullcontext():
        step(False)
    rec.step("captured: forward, backward and optimizer step")
    if rec.cuda:
        torch.cuda.empty_cache()
    rec.step("torch.cuda.empty_cache()")
    for s in range(1, v.int("steps") + 1):
        if graph is not None:
            graph.replay()
        rec.step(f"replay {s}")


if __name__ == "__main__":
    common.main(globals())
