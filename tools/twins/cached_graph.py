"""Twin of `tensormem run cached-graph` (src/scenarios/techniques.rs `cached_graph`): a
checkpointed result cached on the module (mistake) or not (fix)."""
import os
import sys

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))

import torch  # noqa: E402

import common  # noqa: E402

import models  # noqa: E402

NAME = "cached-graph"
VARIANTS = ["mistake", "fix"]
PARAMETERS = [
    ("batch", "64", {"type": "integer", "min": 1, "max": 65536}),
    ("width", "2048", {"type": "integer", "min": 1, "max": 65536}),
    ("steps", "3", {"type": "integer", "min": 1, "max": 1000}),
]
FIX_SETTINGS = None


def program(rec, v):
    dev = rec.device
    batch, width = v.int("batch"), v.int("width")
    layer1 = models.linear(width, width, True, torch.float32, dev)
    layer2 = models.linear(width, width, True, torch.float32, dev)
    params = list(layer1.parameters()) + list(layer2.parameters())
    rec.count_parameters(params)
    optimizer = torch.optim.SGD(params, lr=1e-3, momentum=0.0, weight_decay=0.0, foreach=True)
    cached = None
    rec.step("model")
    for step in range(1, v.int("steps") + 1):
        optimizer.zero_grad(set_to_none=True)
        x = torch.randn(batch, width, device=dev)
        # The reentrant checkpoint passes gradients only when an input requires grad: the
        # classic workaround marks the batch.
        x.requires_grad_(True)
        intermediate = models.checkpoint(lambda t: torch.tanh(layer1(t)), x)
        if not v.fix():
            cached = intermediate  # self.cached_intermediate = intermediate
        out = models.checkpoint(lambda t: torch.tanh(layer2(t)), intermediate)
        del intermediate
        rec.step(f"step {step}: forward")
        out.pow(2).mean().backward()
        optimizer.step()
        rec.step(f"step {step}: backward and step")
        del out, x
    del cached


if __name__ == "__main__":
    common.main(globals())
