"""Twin of `tensormem run grad-fn-history` (src/scenarios/pitfalls.rs `grad_fn_history`):
graph_stats.append(output.grad_fn) in a loop without backward (mistake) versus dropping it (fix)."""
import os
import sys

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))


import common  # noqa: E402


import models  # noqa: E402

NAME = "grad-fn-history"
VARIANTS = ["mistake", "fix"]
PARAMETERS = common.PITFALL_PARAMETERS
FIX_SETTINGS = None


def program(rec, v):
    net, ids, targets = models.pitfall_model(rec, v)
    graphs = []
    for step in range(1, v.int("steps") + 1):
        output = net.loss(ids, targets, True)
        if not v.fix():
            graphs.append(output.grad_fn)
        del output
        rec.step(f"step {step}: {'output dropped' if v.fix() else 'graph_stats.append(output.grad_fn)'}")


if __name__ == "__main__":
    common.main(globals())
