"""Twin of `tensormem run lm-train` (src/scenarios/training.rs, src/nn/lm.rs): a training step
of the recorded run's own pre-norm LM (einsum linears, RoPE on halves, softmax and log_softmax
written out, the handwritten AdamW by default), after `warmup` warm-up steps (one by default;
0 records the very first step, where the optimizer makes its state)."""
import os
import sys

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))

import torch  # noqa: E402

import common  # noqa: E402

import models  # noqa: E402

NAME = "lm-train"
VARIANTS = []
PARAMETERS = [
    ("size", "medium", {"type": "choice", "options": ["small", "medium", "large", "xl", "2.7b"]}),
] + common.STEP_PARAMETERS("4", "128", "handwritten-adamw", "float32")
FIX_SETTINGS = None


def program(rec, v):
    models.check_fits(v, 10_000)
    dim, hidden, layers, heads = models.LM_SIZES[v.choice("size")]
    net = models.Lm(10_000, dim, hidden, layers, heads, v.int("context"), models.DTYPES[v.choice("dtype")], rec.device)
    net.checkpointing = v.flag("checkpointing")
    rec.count_parameters(net.ordered_parameters())
    models.train(rec, v, net, 10_000, net.forward, net.loss)


if __name__ == "__main__":
    common.main(globals())
