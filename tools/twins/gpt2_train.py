"""Twin of `tensormem run gpt2-train` (src/scenarios/training.rs, src/nn/model.rs): GPT-2 as
published (learned positions, LayerNorm, GELU, biases, tied embeddings, dropout 0.1, vocabulary
50,257) with torch.optim.AdamW by default, after `warmup` warm-up steps (one by default;
0 records the very first step, where the optimizer makes its state)."""
import os
import sys

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))

import torch  # noqa: E402

import common  # noqa: E402

import torch.nn.functional as F  # noqa: E402

import models  # noqa: E402

NAME = "gpt2-train"
VARIANTS = []
PARAMETERS = [
    ("size", "small", {"type": "choice", "options": ["small", "medium", "large", "xl"]}),
] + common.STEP_PARAMETERS("8", "1024", "adamw", "float32")
FIX_SETTINGS = None

# GPT-2's published sizes: d_model, layers, heads (d_ff is 4 x d_model).
SIZES = {"small": (768, 12, 12), "medium": (1024, 24, 16), "large": (1280, 36, 20), "xl": (1600, 48, 25)}


def program(rec, v):
    if v.int("context") > 1024:
        raise SystemExit(f"GPT-2's learned positions cover 1024 tokens: context={v.int('context')} is longer")
    models.check_fits(v, 50257)
    dim, layers, heads = SIZES[v.choice("size")]
    config = dict(architecture="gpt2", vocab=50257, context=1024, dim=dim, layers=layers, heads=heads, hidden=4 * dim,
                  dropout=0.1, dtype=models.DTYPES[v.choice("dtype")])
    net = models.Transformer(config, rec.device)
    net.checkpointing = v.flag("checkpointing")
    rec.count_parameters(net.ordered_parameters())
    models.train(rec, v, net, 50257, lambda ids: net(ids, True), lambda logits, targets: F.cross_entropy(logits.view(-1, 50257), targets.view(-1)))


if __name__ == "__main__":
    common.main(globals())
