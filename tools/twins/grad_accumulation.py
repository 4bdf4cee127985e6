"""Twin of `tensormem run grad-accumulation` (src/scenarios/techniques.rs `grad_accumulation`):
the whole batch at once (mistake) or in micro-batches whose gradients accumulate (fix)."""
import os
import sys

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))

import torch  # noqa: E402

import common  # noqa: E402


import models  # noqa: E402


NAME = "grad-accumulation"
VARIANTS = ["mistake", "fix"]
PARAMETERS = [
    ("batch", "32", {"type": "integer", "min": 1, "max": 4096}),
    ("micro_batches", "4", {"type": "integer", "min": 1, "max": 4096}),
    ("context", "128", {"type": "integer", "min": 1, "max": 8192}),
    ("steps", "2", {"type": "integer", "min": 1, "max": 1000}),
]
FIX_SETTINGS = None


def program(rec, v):
    batch, context = v.int("batch"), v.int("context")
    micro_batches = min(v.int("micro_batches"), batch) if v.fix() else 1
    net, ids, targets = models.small_lm_and_batch(rec, 4, batch, context)
    optimizer = torch.optim.AdamW(net.ordered_parameters(), lr=1e-3, weight_decay=0.01, foreach=True)
    # Micro-batch k takes rows [k * rows, (k + 1) * rows) (the last takes the rest).
    rows = batch // micro_batches
    for step in range(1, v.int("steps") + 1):
        optimizer.zero_grad(set_to_none=True)
        for k in range(micro_batches):
            length = batch - k * rows if k + 1 == micro_batches else rows
            ids_k, targets_k = ids.narrow(0, k * rows, length), targets.narrow(0, k * rows, length)
            loss = net.loss(net(ids_k), targets_k) / micro_batches
            loss.backward()
            rec.step(f"step {step}: micro-batch {k + 1} backward")
            del loss, ids_k, targets_k
        optimizer.step()
        rec.step(f"step {step}: optimizer.step()")


if __name__ == "__main__":
    common.main(globals())
