"""Twin of `tensormem run eval-no-grad` (src/scenarios/pitfalls.rs `eval_no_grad`): validation
batches with grad mode on (mistake) or under no_grad / inference_mode (fix)."""
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


NAME = "eval-no-grad"
VARIANTS = ["mistake", "fix"]
PARAMETERS = MODEL_PARAMETERS + [("guard", "no_grad", {"type": "choice", "options": ["no_grad", "inference_mode"]})]
FIX_SETTINGS = None


def program(rec, v):
    net, ids, targets = model(rec, v)
    if not v.fix():
        guard = None
    elif v.choice("guard") == "inference_mode":
        guard = torch.inference_mode()
    else:
        guard = torch.no_grad()
    if guard is not None:
        guard.__enter__()
    val_loss = None
    for batch in range(1, v.int("steps") + 1):
        val_loss = net.loss(ids, targets, False)
        rec.step(f"validation batch {batch}")
    del val_loss
    if guard is not None:
        guard.__exit__(None, None, None)


if __name__ == "__main__":
    common.main(globals())
