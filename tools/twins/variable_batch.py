"""Twin of `tensormem run variable-batch`: batched inference whose batch size wobbles
(src/scenarios/variable_batch.rs `variable_batch`). The fix is expandable segments."""
import os
import sys

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))

import torch  # noqa: E402

import common  # noqa: E402

NAME = "variable-batch"
VARIANTS = ["mistake", "fix"]
PARAMETERS = [
    ("layers", "8", {"type": "integer", "min": 1, "max": 1000}),
    ("hidden", "1024", {"type": "integer", "min": 1, "max": 18446744073709551615}),
    ("seq", "128", {"type": "integer", "min": 1, "max": 18446744073709551615}),
    ("batches", "32,31,33,30,34,29,36,31,38,27,40,33", {"type": "integers", "min": 1, "max": 18446744073709551615, "max_len": 10000}),
]
FIX_SETTINGS = "expandable_segments:True"


def program(rec, v):
    dev = rec.device
    hidden, seq = v.int("hidden"), v.int("seq")
    wide = 4 * hidden
    weights = []
    for _ in range(v.int("layers")):
        fc1 = torch.randn(hidden, wide, device=dev)
        weights.append((fc1, torch.randn(wide, hidden, device=dev)))
        del fc1
    rec.step("weights loaded")
    for batch in v.ints("batches"):
        x = torch.randn(batch * seq, hidden, device=dev)
        for fc1, fc2 in weights:
            h = x.matmul(fc1)
            torch._C._nn.gelu_(h)  # GELU in place (Tensor has no gelu_ method)
            y = h.matmul(fc2)
            # The wide activation is freed first, then the block's input (replaced by y).
            del h
            x = y
            del y
        del x
        rec.step(f"batch {batch}")


if __name__ == "__main__":
    common.main(globals())
