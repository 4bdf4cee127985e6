"""Twin of `tensormem run hf-generate` (src/scenarios/generation.rs, src/nn/hf.rs): greedy
`model.generate` of a model built by transformers from a config.json (a path, the JSON text, or
one of tensormem's presets in src/nn/hf_configs/), eager attention, under inference_mode, with
`max_new_tokens=new_tokens` and a DynamicCache (cache=dynamic, transformers' default) or a
StaticCache of prompt + new_tokens positions (cache=static). The steps are marked where
generate runs its stopping criteria: `prefill` after the first forward, `decode k` after the
forward that made token k + 1 (the outputs and the float32 logits still referenced).

Needs `transformers` (4.45 or later: logits_to_keep) besides torch."""
import os
import sys

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))

import torch  # noqa: E402

import common  # noqa: E402

import hf_train  # noqa: E402

import models  # noqa: E402

NAME = "hf-generate"
VARIANTS = []
PARAMETERS = [
    ("config", "llama-3-8b", {"type": "text", "max_len": 4096}),
    ("batch", "1", {"type": "integer", "min": 1, "max": 4096}),
    ("prompt", "512", {"type": "integer", "min": 1, "max": 1048576}),
    ("new_tokens", "256", {"type": "integer", "min": 1, "max": 32768}),
    ("dtype", "bfloat16", {"type": "choice", "options": ["bfloat16", "float16", "float32"]}),
    ("cache", "dynamic", {"type": "choice", "options": ["dynamic", "static"]}),
    ("attn", "eager", {"type": "choice", "options": ["eager"]}),
]
FIX_SETTINGS = None


def program(rec, v):
    import transformers

    raw = dict(hf_train.load_config(v.text("config")))
    kinds = {"LlamaForCausalLM": "llama", "MistralForCausalLM": "mistral", "Qwen2ForCausalLM": "qwen2", "GPT2LMHeadModel": "gpt2"}
    model_type = kinds.get((raw.get("architectures") or [None])[0]) or raw.pop("model_type", None)
    raw.pop("model_type", None)
    if model_type == "gpt2":
        raise SystemExit("hf-generate builds the Llama family (LlamaForCausalLM, MistralForCausalLM, Qwen2ForCausalLM) so far, not GPT2LMHeadModel")
    config = transformers.AutoConfig.for_model(model_type, **raw)
    hf_train.import_model_module(config)
    with rec.device:
        model = transformers.AutoModelForCausalLM.from_config(config, torch_dtype=models.DTYPES[v.choice("dtype")], attn_implementation=v.choice("attn"))
    model.eval()
    rec.count_parameters(list(model.parameters()))
    batch, prompt, new_tokens = v.int("batch"), v.int("prompt"), v.int("new_tokens")
    # The prompt alone, as the scenario makes it (a name such as `_` would keep targets alive).
    ids = common.token_ids(torch, rec.device, batch, prompt, config.vocab_size)
    rec.step("model and prompt")

    class Mark(transformers.StoppingCriteria):
        """Called once per forward, after input_ids has grown by the new token."""

        def __init__(self):
            self.calls = 0

        def __call__(self, input_ids, scores, **kwargs):
            rec.step("prefill" if self.calls == 0 else f"decode {self.calls}")
            self.calls += 1
            return torch.zeros(input_ids.shape[0], dtype=torch.bool, device=input_ids.device)

    options = dict(max_new_tokens=new_tokens, min_new_tokens=new_tokens, do_sample=False, num_beams=1,
                   stopping_criteria=transformers.StoppingCriteriaList([Mark()]), pad_token_id=0)
    if v.choice("cache") == "static":
        options["cache_implementation"] = "static"
    with torch.inference_mode():
        out = model.generate(ids, attention_mask=torch.ones_like(ids), **options)
    del out


if __name__ == "__main__":
    common.main(globals())
