"""Twin of `tensormem run oom` (src/scenarios/training.rs): a Llama-style 7B (the lm family at
d_model 4096, d_ff 11008, 32 layers, 32 heads, vocabulary 32,000) trained in float32 with AdamW on
an 80 GB card: the first optimizer step runs out of memory."""
import os
import sys

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))

import torch  # noqa: E402

import common  # noqa: E402

import models  # noqa: E402

NAME = "oom"
VARIANTS = []
PARAMETERS = common.STEP_PARAMETERS("1", "512", "adamw", "float32")
FIX_SETTINGS = None


def program(rec, v):
    models.check_fits(v, 32_000)
    net = models.Lm(32_000, 4096, 11008, 32, 32, v.int("context"), models.DTYPES[v.choice("dtype")], rec.device)
    net.checkpointing = v.flag("checkpointing")
    rec.count_parameters(net.ordered_parameters())
    models.train(rec, v, net, 32_000, net.forward, net.loss)


if __name__ == "__main__":
    common.main(globals())
