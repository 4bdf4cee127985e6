"""Twin of `tensormem run intermediates` (src/scenarios/seeds.rs `intermediates`): a + b, a
matmul, and add_ on a leaf that requires grad (refused), then under no_grad."""
import os
import sys

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))

import torch  # noqa: E402

import common  # noqa: E402

NAME = "intermediates"
VARIANTS = []
PARAMETERS = []
FIX_SETTINGS = None


def program(rec, v):
    dev = rec.device
    a, b = torch.randn(1000, 1000, device=dev), torch.randn(1000, 1000, device=dev)
    rec.step("a, b = randn(1000, 1000) x 2")
    c = a + b
    rec.step("c = a + b")
    del c, a, b  # the Rust block's end: c, then a and b
    a, b = torch.randn(1000, 2000, device=dev), torch.randn(2000, 500, device=dev)
    rec.step("a, b = randn(1000, 2000), randn(2000, 500)")
    c = torch.matmul(a, b)
    rec.step("c = matmul(a, b)")
    del c, a, b
    a = torch.randn(1000, 1000, device=dev)
    a.requires_grad_(True)
    rec.step("a = randn(1000, 1000, requires_grad=True)")
    try:
        a.add_(torch.randn(1000, 1000, device=dev))
        refusal = "ran"
    except RuntimeError as e:
        refusal = f"refused: {str(e).splitlines()[0]}"
    rec.step(f"a.add_(randn(1000, 1000)) {refusal}")
    with torch.no_grad():
        a.add_(torch.randn(1000, 1000, device=dev))
    rec.step("with no_grad: a.add_(randn(1000, 1000))")


if __name__ == "__main__":
    common.main(globals())
