"""Twin of `tensormem run views-vs-copies` (src/scenarios/seeds.rs `views_vs_copies`)."""
import os
import sys

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))

import torch  # noqa: E402

import common  # noqa: E402

NAME = "views-vs-copies"
VARIANTS = []
PARAMETERS = [("n", "2048", {"type": "integer", "min": 2, "max": 16384})]
FIX_SETTINGS = None


def program(rec, v):
    dev = rec.device
    n = v.int("n")
    x = torch.randn(n, n, device=dev)
    rec.step("x = randn(n, n)")
    views = [x.view(-1), x.t(), x.narrow(0, 0, n // 2), x.reshape(n // 2, -1)]
    rec.step("view(-1), t(), narrow(0, 0, n/2), reshape(n/2, -1): views")
    clone = x.clone()
    rec.step("clone(): a copy")
    flat = x.t().reshape(-1)
    rec.step("t().reshape(-1): no strides express it, so a copy")
    dense = x.t().contiguous()
    rec.step("t().contiguous(): a copy")
    same = x.contiguous()
    rec.step("contiguous() of a contiguous tensor: itself")
    del clone, flat, dense, same
    rec.step("del the copies")
    del x
    rec.step("del x: the views still hold its storage")
    del views
    rec.step("del the views: x's storage is freed")


if __name__ == "__main__":
    common.main(globals())
