"""Twin of `tensormem run grad-fn-history` (src/scenarios/pitfalls.rs `grad_fn_history`):
graph_stats.append(output.grad_fn) in a loop without backward (mistake) versus dropping it (fix)."""
import os
import sys

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))

import torch  # noqa: E402

import common  # noqa: E402


import models  # noqa: E402

# The pitfalls' parameters (src/scenarios/pitfalls.rs `model_parameters`).
MODEL_PARAMETERS = [
    ("batch", "8", {"type": "integer", "min": 1, "max": 4096}),
    ("context", "128", {"type": "integer", "min": 1, "max": 8192}),
    ("steps", "4", {"type": "integer", "min": 1, "max": 1000}),
]


def model(rec, v):
    """The Llama-style model (4 layers of width 256, vocabulary 1000) and one batch."""
    dev = rec.device
    net = models.llama_small(v.int("context"), dev)
    rec.count_parameters(net.ordered_parameters())
    ids, targets = common.token_batch(torch, dev, v.int("batch"), v.int("context"), 1000)
    rec.step("model and batch")
    return net, ids, targets


NAME = "grad-fn-history"
VARIANTS = ["mistake", "fix"]
PARAMETERS = MODEL_PARAMETERS
FIX_SETTINGS = None


def program(rec, v):
    net, ids, targets = model(rec, v)
    graphs = []
    for step in range(1, v.int("steps") + 1):
        output = net.loss(ids, targets, True)
        if not v.fix():
            graphs.append(output.grad_fn)
        del output
        rec.step(f"step {step}: {'output dropped' if v.fix() else 'graph_stats.append(output.grad_fn)'}")


if __name__ == "__main__":
    common.main(globals())
