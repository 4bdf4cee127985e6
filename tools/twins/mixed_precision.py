"""Twin of `tensormem run mixed-precision` (src/scenarios/techniques.rs `mixed_precision`):
autocast and GradScaler, with the loss computed after the autocast block (mistake) or inside it
(fix); amp=false is the float32 baseline."""
import os
import sys

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))

import torch  # noqa: E402

import common  # noqa: E402


import models  # noqa: E402


NAME = "mixed-precision"
VARIANTS = ["mistake", "fix"]
PARAMETERS = [
    ("amp", "true", {"type": "flag"}),
    ("batch", "8", {"type": "integer", "min": 1, "max": 4096}),
    ("context", "128", {"type": "integer", "min": 1, "max": 8192}),
    ("steps", "2", {"type": "integer", "min": 1, "max": 1000}),
]
FIX_SETTINGS = None


def program(rec, v):
    dev = rec.device
    net, ids, targets = models.small_lm_and_batch(rec, 4, v.int("batch"), v.int("context"))
    optimizer = torch.optim.AdamW(net.ordered_parameters(), lr=1e-3, weight_decay=0.01, foreach=True)
    scaler = models.grad_scaler(dev) if v.flag("amp") else None
    for step in range(1, v.int("steps") + 1):
        optimizer.zero_grad(set_to_none=True)
        autocast = models.autocast(dev, True) if scaler is not None else None
        if autocast is not None:
            autocast.__enter__()
        logits = net(ids)
        rec.step(f"step {step}: forward")
        if v.fix():
            loss = net.loss(logits, targets)
            if autocast is not None:
                autocast.__exit__(None, None, None)
        else:
            # The seed's mistake: the loss after the autocast block.
            if autocast is not None:
                autocast.__exit__(None, None, None)
            loss = net.loss(logits, targets)
        rec.step(f"step {step}: loss")
        if scaler is not None:
            scaler.scale(loss).backward()
            rec.step(f"step {step}: backward")
            scaler.step(optimizer)
            scaler.update()
        else:
            loss.backward()
            rec.step(f"step {step}: backward")
            optimizer.step()
        rec.step(f"step {step}: optimizer step")
        del loss, logits


if __name__ == "__main__":
    common.main(globals())
