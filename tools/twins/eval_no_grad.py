"""Twin of `tensormem run eval-no-grad` (src/scenarios/pitfalls.rs `eval_no_grad`): validation
batches with grad mode on (mistake) or under no_grad / inference_mode (fix)."""
import os
import sys

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))

import torch  # noqa: E402

import common  # noqa: E402


import models  # noqa: E402

NAME = "eval-no-grad"
VARIANTS = ["mistake", "fix"]
PARAMETERS = common.PITFALL_PARAMETERS + [("guard", "no_grad", {"type": "choice", "options": ["no_grad", "inference_mode"]})]
FIX_SETTINGS = None


def program(rec, v):
    net, ids, targets = models.pitfall_model(rec, v)
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
