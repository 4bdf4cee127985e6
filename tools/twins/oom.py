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
PARAMETERS = [
    ("batch", "1", {"type": "integer", "min": 1, "max": 65536}),
    ("context", "512", {"type": "integer", "min": 1, "max": 1048576}),
    ("optimizer", "adamw", {"type": "choice", "options": ["handwritten-adamw", "adamw", "adam", "sgd"]}),
    ("foreach", "true", {"type": "flag"}),
    ("dtype", "float32", {"type": "choice", "options": ["float32", "bfloat16", "float16"]}),
    ("amp", "false", {"type": "choice", "options": ["false", "float16", "bfloat16"], "aliases": [["true", "float16"]]}),
    ("checkpointing", "false", {"type": "flag"}),
    ("warmup", "1", {"type": "integer", "min": 0, "max": 1000}),
    ("steps", "1", {"type": "integer", "min": 1, "max": 1000}),
]
FIX_SETTINGS = None


def program(rec, v):
    models.check_fits(v, 32_000)
    net = models.Lm(32_000, 4096, 11008, 32, 32, v.int("context"), models.DTYPES[v.choice("dtype")], rec.device)
    net.checkpointing = v.flag("checkpointing")
    rec.count_parameters(net.ordered_parameters())
    models.train(rec, v, net, 32_000, net.forward, net.loss)


if __name__ == "__main__":
    common.main(globals())
