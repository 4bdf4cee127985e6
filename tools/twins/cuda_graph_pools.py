"""Twin of `tensormem run cuda-graph-pools` (src/scenarios/graphs.rs `graph_pools`): the
pitfalls' model under no_grad, one CUDA graph captured per batch size (each keeping its static
input and its logits), each graph with a pool of its own or all sharing one handle's pool. On
the CPU the forwards run eagerly."""
import contextlib
import os
import sys

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))

import torch  # noqa: E402

import common  # noqa: E402


import models  # noqa: E402

NAME = "cuda-graph-pools"
VARIANTS = []
PARAMETERS = [
    ("context", "128", {"type": "integer", "min": 1, "max": 8192}),
    ("batches", "8,4,2,1", {"type": "integers", "min": 1, "max": 4096, "max_len": 64}),
    ("pools", "own", {"type": "choice", "options": ["own", "shared"]}),
]
FIX_SETTINGS = None


def program(rec, v):
    context = v.int("context")
    net = models.llama_small(context, rec.device)
    rec.count_parameters(net.ordered_parameters())
    rec.step("model")
    shared = torch.cuda.graph_pool_handle() if rec.cuda and v.choice("pools") == "shared" else None
    stream = torch.cuda.Stream() if rec.cuda else None
    graphs = []
    with torch.no_grad(), torch.cuda.stream(stream) if stream is not None else contextlib.nullcontext():
        for batch in v.ints("batches"):
            # Only the ids kept: the targets go at once, as `let (ids, _) = ...` drops them in Rust
            # (`ids, _ = ...` would keep them until the next batch).
            ids = models._token_batch(rec.device, batch, context, 1000)[0]
            graph = torch.cuda.CUDAGraph() if rec.cuda else None
            with torch.cuda.graph(graph, pool=shared, stream=stream) if graph is not None else contextlib.nullcontext():
                logits = net(ids, False)
            graphs.append((graph, ids, logits))
            rec.step(f"captured batch {batch}")


if __name__ == "__main__":
    common.main(globals())
