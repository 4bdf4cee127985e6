"""Twin of `tensormem run broadcast-temporaries` (src/scenarios/seeds.rs
`broadcast_temporaries`): x + y broadcast (fix) versus y.expand_as(x).contiguous() first (mistake)."""
import os
import sys

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))

import torch  # noqa: E402

import common  # noqa: E402

NAME = "broadcast-temporaries"
VARIANTS = ["mistake", "fix"]
PARAMETERS = [
    ("rows", "1000", {"type": "integer", "min": 1, "max": 1048576}),
    ("cols", "1000", {"type": "integer", "min": 1, "max": 1048576}),
    ("depth", "100", {"type": "integer", "min": 1, "max": 1048576}),
]
FIX_SETTINGS = None


def program(rec, v):
    dev = rec.device
    shape = (v.int("rows"), v.int("cols"), v.int("depth"))
    x = torch.randn(*shape, device=dev)
    y = torch.randn(*shape[2:], device=dev)
    rec.step("x = randn(rows, cols, depth), y = randn(depth)")
    if v.fix():
        result = x + y
    else:
        expanded = y.expand(*shape).contiguous()
        rec.step("y.expand_as(x).contiguous(): a full-size copy")
        result = x + expanded
        del expanded
    rec.step("result = x + y")
    del result
    del y, x


if __name__ == "__main__":
    common.main(globals())
