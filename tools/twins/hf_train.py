"""Twin of `tensormem run hf-train` (src/scenarios/training.rs, src/nn/hf.rs): a full fine-tune
(or LoRA) step of a model built by transformers from a config.json (a path, the JSON text, or
one of tensormem's presets in src/nn/hf_configs/), with eager attention, use_cache=False, the
loss as ForCausalLMLoss computes it (logits.float(), then cross_entropy), torch.optim.AdamW,
after `warmup` warm-up steps. LoRA: peft.get_peft_model with LoraConfig(r, lora_alpha,
target_modules, lora_dropout=0.0); only the adapters go to the optimizer. quantize=4bit: the
decoder layers' linears as bitsandbytes' NF4 Linear4bit (double quantisation, bfloat16 compute).

Needs `transformers` (and `peft` for lora > 0, `bitsandbytes` and a CUDA GPU for quantize=4bit
or optimizer=adamw8bit) besides torch."""
import json
import os
import sys

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))

import torch  # noqa: E402

import common  # noqa: E402

import torch.nn.functional as F  # noqa: E402

import models  # noqa: E402

NAME = "hf-train"
VARIANTS = []
PARAMETERS = [
    ("config", "llama-3-8b", {"type": "text", "max_len": 4096}),
] + common.STEP_PARAMETERS("1", "512", "adamw", "bfloat16") + [
    ("lora", "0", {"type": "integer", "min": 0, "max": 4096}),
    ("lora_alpha", "8", {"type": "integer", "min": 1, "max": 1048576}),
    ("lora_targets", "q,v", {"type": "text", "max_len": 64}),
    ("quantize", "none", {"type": "choice", "options": ["none", "4bit"]}),
    ("attn", "eager", {"type": "choice", "options": ["eager", "sdpa"]}),
]
FIX_SETTINGS = None

presets_dir = os.path.join(os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__)))), "src", "nn", "hf_configs")


def load_config(spec):
    """HfConfig::load: a preset's name, the JSON text, or a config.json path."""
    spec = spec.strip()
    preset = os.path.join(presets_dir, spec + ".json")
    if "/" not in spec and os.path.isfile(preset):
        return json.load(open(preset))
    if spec.startswith("{"):
        return json.loads(spec)
    return json.load(open(spec))


class Net(torch.nn.Module):
    """The transformers model, with the scenario's `ordered_parameters` (what the optimizer gets)."""

    def __init__(self, model):
        super().__init__()
        self.model = model

    def ordered_parameters(self):
        return [p for p in self.model.parameters() if p.requires_grad]


def quantize_4bit(model, device):
    """quantize=4bit: every nn.Linear of the decoder layers (transformers' replace_with_bnb_linear
    skips lm_head) becomes bitsandbytes' Linear4bit as BitsAndBytesConfig(load_in_4bit=True,
    bnb_4bit_quant_type="nf4", bnb_4bit_use_double_quant=True, bnb_4bit_compute_dtype=bfloat16)
    loads it: the weight (already on the device) quantised by Params4bit._quantize, then the
    16-bit original freed."""
    try:
        import bitsandbytes as bnb
    except ImportError:
        raise SystemExit("quantize=4bit is bitsandbytes' 4-bit storage: this twin needs bitsandbytes (and a CUDA GPU) installed")
    if device.type != "cuda":
        raise SystemExit("quantize=4bit: bitsandbytes' 4-bit kernels run on a CUDA GPU (--device cuda)")
    for layer in model.model.layers:
        for parent in (layer.self_attn, layer.mlp):
            for name, old in list(parent.named_children()):
                if not isinstance(old, torch.nn.Linear):
                    continue
                new = bnb.nn.Linear4bit(old.in_features, old.out_features, bias=old.bias is not None, compute_dtype=torch.bfloat16,
                                        compress_statistics=True, quant_type="nf4", device="meta")
                new.weight = bnb.nn.Params4bit(old.weight.data, requires_grad=False, compress_statistics=True, quant_type="nf4", module=new)
                if old.bias is not None:
                    new.bias = torch.nn.Parameter(old.bias.data, requires_grad=False)
                new.weight._quantize(device)
                setattr(parent, name, new)
                del old, new
    model.is_loaded_in_4bit = True


def import_model_module(config):
    """Imports the model's module before the device context, as a program does at its top:
    imported inside it, its imports allocate on the GPU (transformers imports torchaudio, whose
    kaldi.py makes a 4-byte tensor), which no program of the scenario does. Recordings made
    before this show that 512-byte block."""
    try:
        from transformers.models.auto.modeling_auto import MODEL_FOR_CAUSAL_LM_MAPPING

        MODEL_FOR_CAUSAL_LM_MAPPING[type(config)]
    except (ImportError, KeyError):
        pass  # from_config says what is wrong


def program(rec, v):
    import transformers

    raw = load_config(v.text("config"))
    # HfConfig::parse: architectures[0] names the class, model_type where it is missing.
    kinds = {"LlamaForCausalLM": "llama", "MistralForCausalLM": "mistral", "Qwen2ForCausalLM": "qwen2", "GPT2LMHeadModel": "gpt2"}
    raw = dict(raw)
    model_type = kinds.get((raw.get("architectures") or [None])[0]) or raw.pop("model_type", None)
    raw.pop("model_type", None)
    config = transformers.AutoConfig.for_model(model_type, **raw)
    vocab = config.vocab_size
    if config.model_type == "gpt2" and v.int("context") > config.n_positions:
        raise SystemExit(f"GPT-2's learned positions cover {config.n_positions} tokens: context={v.int('context')} is longer")
    models.check_fits(v, vocab)
    dtype = models.DTYPES[v.choice("dtype")]
    # Parameters made on the device in their type, as `from_config(..., torch_dtype=dtype)`.
    import_model_module(config)
    with rec.device:
        model = transformers.AutoModelForCausalLM.from_config(config, torch_dtype=dtype, attn_implementation=v.choice("attn"))
    model.train()
    if v.flag("checkpointing"):
        model.gradient_checkpointing_enable()
    if v.choice("quantize") == "4bit":
        if v.int("lora") == 0:
            raise SystemExit("quantize=4bit needs lora > 0: a 4-bit base cannot be trained itself (bitsandbytes' Params4bit gets no gradient), QLoRA trains adapters on it")
        quantize_4bit(model, rec.device)
    rec.count_parameters(list(model.parameters()))
    if v.int("lora") > 0:
        import peft

        targets = [t if t.endswith("_proj") else t + "_proj" for t in v.text("lora_targets").split(",")]
        lora = peft.LoraConfig(r=v.int("lora"), lora_alpha=v.int("lora_alpha"), target_modules=targets, lora_dropout=0.0, bias="none")
        model = peft.get_peft_model(model, lora)
        rec.count_parameters(list(model.parameters()))
    net = Net(model)

    def forward(ids):
        return model(input_ids=ids, use_cache=False).logits

    def loss_of(logits, targets):
        # ForCausalLMLoss: logits.float() (a float32 copy of 16-bit logits), then cross_entropy.
        return F.cross_entropy(logits.float().view(-1, vocab), targets.view(-1))

    models.train(rec, v, net, vocab, forward, loss_of)


if __name__ == "__main__":
    common.main(globals())
