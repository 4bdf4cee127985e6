"""Twin of `tensormem run inplace-chain` (src/scenarios/seeds.rs `inplace_chain`): x = x + 1
(mistake) versus x += 1 (fix)."""
import os
import sys

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))

import torch  # noqa: E402

import common  # noqa: E402

NAME = "inplace-chain"
VARIANTS = ["mistake", "fix"]
PARAMETERS = [("n", "1000", {"type": "integer", "min": 1, "max": 32768})]
FIX_SETTINGS = None


def program(rec, v):
    dev = rec.device
    n = v.int("n")
    x = torch.randn(n, n, device=dev)
    rec.step("x = randn(n, n)")
    if v.fix():
        x += 1
        rec.step("x += 1")
        x *= 2
        rec.step("x *= 2")
        x.relu_()
        rec.step("x.relu_()")
    else:
        x = x + 1
        rec.step("x = x + 1")
        x = x * 2
        rec.step("x = x * 2")
        x = torch.relu(x)
        rec.step("x = torch.relu(x)")
    del x


if __name__ == "__main__":
    common.main(globals())
