"""Twin of `tensormem run optimizer-state` (src/scenarios/techniques.rs `optimizer_state`):
what SGD, SGD with momentum and Adam keep (torch.optim, foreach unless foreach=false)."""
import os
import sys

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))

import torch  # noqa: E402

import common  # noqa: E402


import models  # noqa: E402


NAME = "optimizer-state"
VARIANTS = []
PARAMETERS = [
    ("optimizer", "adam", {"type": "choice", "options": ["sgd", "momentum", "adam"]}),
    ("foreach", "true", {"type": "flag"}),
    ("batch", "8", {"type": "integer", "min": 1, "max": 4096}),
    ("context", "128", {"type": "integer", "min": 1, "max": 8192}),
    ("steps", "2", {"type": "integer", "min": 1, "max": 1000}),
]
FIX_SETTINGS = None


def program(rec, v):
    net, ids, targets = models.small_lm_and_batch(rec, 4, v.int("batch"), v.int("context"))
    params = net.ordered_parameters()
    # foreach=False: the single-tensor loops (SGD's, without weight decay, allocates as its foreach path).
    foreach = v.flag("foreach")
    if v.choice("optimizer") == "sgd":
        optimizer = torch.optim.SGD(params, lr=1e-2, momentum=0.0, weight_decay=0.0, foreach=foreach)
    elif v.choice("optimizer") == "momentum":
        optimizer = torch.optim.SGD(params, lr=1e-2, momentum=0.9, weight_decay=0.0, foreach=foreach)
    else:
        optimizer = torch.optim.Adam(params, lr=1e-3, weight_decay=0.0, foreach=foreach)
    for step in range(1, v.int("steps") + 1):
        optimizer.zero_grad(set_to_none=True)
        net.loss(net(ids), targets).backward()
        rec.step(f"step {step}: backward")
        optimizer.step()
        rec.step(f"step {step}: optimizer.step()")


if __name__ == "__main__":
    common.main(globals())
