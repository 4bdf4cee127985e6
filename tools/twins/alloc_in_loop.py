"""Twin of `tensormem run alloc-in-loop` (src/scenarios/seeds.rs `alloc_in_loop`): zeros(n, n)
every iteration (mistake) versus one buffer zeroed in place (fix)."""
import os
import sys

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))

import torch  # noqa: E402

import common  # noqa: E402

NAME = "alloc-in-loop"
VARIANTS = ["mistake", "fix"]
PARAMETERS = [
    ("n", "1024", {"type": "integer", "min": 1, "max": 16384}),
    ("steps", "10", {"type": "integer", "min": 1, "max": 10000}),
]
FIX_SETTINGS = None


def program(rec, v):
    dev = rec.device
    n = v.int("n")
    batch = torch.randn(n, n, device=dev)
    reused = torch.zeros(n, n, device=dev) if v.fix() else None
    rec.step("batch, and temp = zeros(n, n) allocated once" if v.fix() else "batch")
    for step in range(1, v.int("steps") + 1):
        if reused is not None:
            temp = reused.zero_()
        else:
            temp = torch.zeros(n, n, device=dev)
        temp.add_(batch)
        del temp
        rec.step(f"iteration {step}")
    del reused, batch


if __name__ == "__main__":
    common.main(globals())
