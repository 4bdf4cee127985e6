"""Twin of `tensormem run seed-basics` (src/scenarios/seeds.rs `seed_basics`): randn(n, n, n),
a batched matmul with its reversed transpose, del and empty_cache."""
import os
import sys

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))

import torch  # noqa: E402

import common  # noqa: E402

NAME = "seed-basics"
VARIANTS = []
PARAMETERS = [("n", "1000", {"type": "integer", "min": 1, "max": 1600})]
FIX_SETTINGS = None


def program(rec, v):
    dev = rec.device
    n = v.int("n")
    rec.step("initial")
    large = torch.randn(n, n, n, device=dev)
    rec.step("after creating large tensor")
    # `.T` of a 3-D tensor reverses its dimensions (deprecated in PyTorch: written as permute).
    result = torch.matmul(large, large.permute(2, 1, 0))
    rec.step("after matrix multiplication")
    del large, result
    rec.step("after del (the cache keeps the segments)")
    if dev.type == "cuda":
        torch.cuda.empty_cache()
    rec.step("after empty_cache")


if __name__ == "__main__":
    common.main(globals())
