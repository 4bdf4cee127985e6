"""Twin of `tensormem run checkpointing` (src/scenarios/techniques.rs `checkpointing`): one
training step without (mistake) and with (fix) every block checkpointed."""
import os
import sys

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))

import torch  # noqa: E402

import common  # noqa: E402


import models  # noqa: E402


NAME = "checkpointing"
VARIANTS = ["mistake", "fix"]
PARAMETERS = [
    ("layers", "4", {"type": "integer", "min": 1, "max": 512}),
    ("batch", "8", {"type": "integer", "min": 1, "max": 4096}),
    ("context", "256", {"type": "integer", "min": 1, "max": 8192}),
]
FIX_SETTINGS = None


def program(rec, v):
    net, ids, targets = models.small_lm_and_batch(rec, v.int("layers"), v.int("batch"), v.int("context"))
    net.checkpointing = v.fix()
    optimizer = torch.optim.AdamW(net.ordered_parameters(), lr=1e-3, weight_decay=0.01, foreach=True)
    logits = net(ids)
    rec.step("forward")
    loss = net.loss(logits, targets)
    rec.step("loss")
    loss.backward()
    rec.step("backward")
    optimizer.step()
    rec.step("optimizer step")
    del loss, logits


if __name__ == "__main__":
    common.main(globals())
