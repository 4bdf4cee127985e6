"""Twin of `tensormem run contiguous` (src/scenarios/seeds.rs `contiguous`): a transposed tensor
in an x = x + 1 loop, with (fix) or without contiguous() first."""
import os
import sys

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))

import torch  # noqa: E402

import common  # noqa: E402

NAME = "contiguous"
VARIANTS = ["mistake", "fix"]
PARAMETERS = [
    ("n", "2048", {"type": "integer", "min": 1, "max": 16384}),
    ("steps", "5", {"type": "integer", "min": 1, "max": 1000}),
]
FIX_SETTINGS = None


def program(rec, v):
    dev = rec.device
    n = v.int("n")
    x = torch.randn(n, n, device=dev).transpose(0, 1)
    rec.step("x = randn(n, n).transpose(0, 1): a view")
    if v.fix():
        x = x.contiguous()
        rec.step("x = x.contiguous(): one copy, then the original is freed")
    for step in range(1, v.int("steps") + 1):
        x = x + 1
        rec.step(f"x = x + 1 (step {step})")
    del x


if __name__ == "__main__":
    common.main(globals())
