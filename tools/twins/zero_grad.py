"""Twin of `tensormem run zero-grad` (src/scenarios/pitfalls.rs `zero_grad`): no zero_grad
(mistake) versus zero_grad(set_to_none) each step (fix)."""
import os
import sys

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))

import torch  # noqa: E402

import common  # noqa: E402


import models  # noqa: E402

NAME = "zero-grad"
VARIANTS = ["mistake", "fix"]
PARAMETERS = common.PITFALL_PARAMETERS + [("set_to_none", "true", {"type": "flag"})]
FIX_SETTINGS = None


def program(rec, v):
    net, ids, targets = models.pitfall_model(rec, v)
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
