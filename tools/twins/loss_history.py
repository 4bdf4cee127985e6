"""Twin of `tensormem run loss-history` (src/scenarios/pitfalls.rs `loss_history`):
losses.append(loss) (mistake) versus losses.append(loss.item()) (fix)."""
import os
import sys

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))

import torch  # noqa: E402

import common  # noqa: E402


import models  # noqa: E402

NAME = "loss-history"
VARIANTS = ["mistake", "fix"]
PARAMETERS = common.PITFALL_PARAMETERS + [("backward", "true", {"type": "flag"})]
FIX_SETTINGS = None


def program(rec, v):
    net, ids, targets = models.pitfall_model(rec, v)
    optimizer = torch.optim.SGD(net.ordered_parameters(), lr=1e-3, momentum=0.0, weight_decay=0.0, foreach=True)
    losses = []
    for step in range(1, v.int("steps") + 1):
        optimizer.zero_grad(set_to_none=True)
        loss = net.loss(ids, targets, True)
        if v.flag("backward"):
            loss.backward()
            optimizer.step()
        if v.fix():
            losses.append(loss.item())
        else:
            losses.append(loss)
        rec.step(f"step {step}: {'loss.item()' if v.fix() else 'loss'} kept")
        del loss


if __name__ == "__main__":
    common.main(globals())
