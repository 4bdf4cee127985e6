"""Twin of `tensormem run zero-grad` (src/scenarios/pitfalls.rs `zero_grad`): no zero_grad
(mistake) versus zero_grad(set_to_none) each step (fix)."""
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


NAME = "zero-grad"
VARIANTS = ["mistake", "fix"]
PARAMETERS = MODEL_PARAMETERS + [("set_to_none", "true", {"type": "flag"})]
FIX_SETTINGS = None


def program(rec, v):
    net, ids, targets = model(rec, v)
    optimizer = torch.optim.SGD(net.ordered_parameters(), lr=1e-3, momentum=0.0, weight_decay=0.0, foreach=True)
    set_to_none = v.flag("set_to_none")
    for step in range(1, v.int("steps") + 1):
        if v.fix():
            optimizer.zero_grad(set_to_none=set_to_none)
            rec.step(f"step {step}: zero_grad(set_to_none={'true' if set_to_none else 'false'})")
        net.loss(ids, targets, True).backward()
        rec.step(f"step {step}: backward")
        optimizer.step()
        rec.step(f"step {step}: optimizer.step()")


if __name__ == "__main__":
    common.main(globals())
