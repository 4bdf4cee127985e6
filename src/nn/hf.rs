//! Models from a Hugging Face `config.json`, built as `transformers` builds them:
//! `LlamaForCausalLM` (and the same graph under `MistralForCausalLM` and `Qwen2ForCausalLM`:
//! grouped-query attention, RMSNorm, SwiGLU, RoPE, Qwen2's q/k/v biases, tied or untied
//! embeddings) and `GPT2LMHeadModel`. Written op for op after `modeling_llama.py`: the rotary
//! cos/sin made once per forward in float32 and cast to the hidden states' type, RMSNorm in
//! float32 (`hidden_states.to(torch.float32)` ... `weight * hidden_states.to(input_dtype)`),
//! `repeat_kv` (an expand and a reshape: a copy of k and v per layer when heads share them),
//! eager attention (scores, an additive 4-D causal mask built once per forward, softmax in
//! float32 cast back, dropout, `transpose(1, 2).contiguous()`) or SDPA (`attn=sdpa`: flash
//! attention's allocations, k and v not repeated), and the causal-LM loss, which upcasts the
//! logits to float32 (`logits.float()`) before `cross_entropy`; the forward runs with
//! `use_cache=False` (no DynamicCache holds k and v). LoRA as PEFT injects it (`Projection`).
//! GPT-2 is tensormem's `Transformer` (nn.Linear where transformers has Conv1D: the same
//! shapes) with `gelu_new` written out as `NewGELUActivation` is.

use super::attention::rotate;
use super::bnb::{COMPUTE_DTYPE_4BIT, Quant4bit, Quantize};
use super::parallel::{Hooks, run_block};
use super::{Activation, Block, Embedding, Init, Linear, Mlp, Module, Transformer, TransformerConfig, child, cross_entropy};
use crate::autograd::{self, checkpoint};
use crate::device::Device;
use crate::tensor::{DType, Result, Tensor, TensorError};
use serde_json::Value;
use std::rc::Rc;

/// The configs shipped with tensormem: (name, config.json). Each is the model's `config.json`
/// on the Hugging Face Hub, copied value for value:
/// - `llama-3-8b`: meta-llama/Meta-Llama-3-8B/config.json (8,030,261,248 parameters)
/// - `mistral-7b`: mistralai/Mistral-7B-v0.1/config.json (7,241,732,096)
/// - `qwen2.5-7b`: Qwen/Qwen2.5-7B/config.json (7,615,616,512)
/// - `gpt2`: openai-community/gpt2/config.json (124,439,808)
pub const HF_PRESETS: [(&str, &str); 5] = [
    ("llama-3-8b", include_str!("hf_configs/llama-3-8b.json")),
    ("llama-3-70b", include_str!("hf_configs/llama-3-70b.json")),
    ("mistral-7b", include_str!("hf_configs/mistral-7b.json")),
    ("qwen2.5-7b", include_str!("hf_configs/qwen2.5-7b.json")),
    ("gpt2", include_str!("hf_configs/gpt2.json")),
];

/// The architectures tensormem builds (`architectures[0]`, or `model_type` without it).
const ARCHITECTURES: [(&str, &str, Family); 4] = [
    ("LlamaForCausalLM", "llama", Family::Llama),
    ("MistralForCausalLM", "mistral", Family::Mistral),
    ("Qwen2ForCausalLM", "qwen2", Family::Qwen2),
    ("GPT2LMHeadModel", "gpt2", Family::Gpt2),
];

/// Which modeling file builds the model.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Family {
    Llama,
    Mistral,
    Qwen2,
    Gpt2,
}

/// How attention is computed (`attn_implementation`).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum AttentionImplementation {
    /// `eager_attention_forward`: the scores and the softmax are real [batch, heads, T, T]
    /// tensors that autograd keeps.
    Eager,
    /// `sdpa_attention_forward`: `F.scaled_dot_product_attention(..., is_causal=True,
    /// enable_gqa=True)` as CUDA's flash kernel runs it (no causal mask, k and v not repeated,
    /// only the output and a float32 log-sum-exp per row kept). Simulated only.
    Sdpa,
}

/// A parsed `config.json`: what the model's shapes need.
#[derive(Debug, Clone, PartialEq)]
pub struct HfConfig {
    /// `architectures[0]` as the file names it (or the class its `model_type` maps to).
    pub architecture: String,
    pub family: Family,
    pub vocab: usize,
    pub hidden: usize,
    pub intermediate: usize,
    pub layers: usize,
    pub heads: usize,
    pub kv_heads: usize,
    pub head_dim: usize,
    pub max_positions: usize,
    pub norm_eps: f64,
    pub rope_theta: f64,
    pub tie_word_embeddings: bool,
    /// Biases on q, k and v (Llama's `attention_bias`; always on in Qwen2).
    pub qkv_bias: bool,
    /// A bias on o_proj (Llama's `attention_bias`; never in Qwen2 or Mistral).
    pub o_bias: bool,
    /// Biases on gate, up and down (Llama's `mlp_bias`).
    pub mlp_bias: bool,
    /// Dropout on the attention probabilities in training (`attention_dropout`, GPT-2's
    /// `attn_pdrop`).
    pub attention_dropout: f64,
    /// GPT-2's `resid_pdrop` (also used for `embd_pdrop`).
    pub residual_dropout: f64,
    pub initializer_range: f64,
}

/// The largest config.json read (Hugging Face's are a few kilobytes; a label map can make one
/// larger, never megabytes).
const CONFIG_LIMIT: u64 = 4 << 20;

/// The deepest model built: eight times the deepest released (Llama-3.1-405B has 126 layers).
pub const MAX_LAYERS: usize = 1024;

impl HfConfig {
    /// A preset's name, a `config.json` path, or the JSON text itself (starting with `{`).
    pub fn load(spec: &str) -> std::result::Result<HfConfig, String> {
        let spec = spec.trim();
        if let Some((_, text)) = HF_PRESETS.iter().find(|(name, _)| *name == spec) {
            return HfConfig::parse(text);
        }
        if spec.starts_with('{') {
            return HfConfig::parse(spec);
        }
        let presets: Vec<&str> = HF_PRESETS.iter().map(|(n, _)| *n).collect();
        if let Err(e) = std::fs::metadata(spec) {
            return Err(format!("config {spec:?} is neither a preset ({}) nor a readable config.json: {e}", presets.join(", ")));
        }
        let text = crate::files::read_small(std::path::Path::new(spec), CONFIG_LIMIT, "a config.json")?;
        HfConfig::parse(&text).map_err(|e| format!("{spec}: {e}"))
    }

    /// A `config.json`'s text.
    pub fn parse(text: &str) -> std::result::Result<HfConfig, String> {
        let json: Value = serde_json::from_str(text).map_err(|e| format!("config.json is not JSON: {e}"))?;
        let Value::Object(map) = &json else { return Err("config.json must be a JSON object".into()) };
        let model_type = map.get("model_type").and_then(Value::as_str);
        let named = map.get("architectures").and_then(Value::as_array).and_then(|a| a.first()).and_then(Value::as_str);
        let supported = || ARCHITECTURES.iter().map(|a| a.0).collect::<Vec<_>>().join(", ");
        let &(architecture, _, family) = match (named, model_type) {
            (Some(name), _) => {
                ARCHITECTURES.iter().find(|a| a.0 == name).ok_or_else(|| format!("architecture {name:?} is not supported; tensormem builds {}", supported()))?
            }
            (None, Some(kind)) => {
                ARCHITECTURES.iter().find(|a| a.1 == kind).ok_or_else(|| format!("model_type {kind:?} is not supported; tensormem builds {}", supported()))?
            }
            (None, None) => return Err(format!("config.json names no architecture (\"architectures\" or \"model_type\"); tensormem builds {}", supported())),
        };
        let field = |name: &str| map.get(name).filter(|v| !v.is_null());
        let count = |name: &str| -> std::result::Result<usize, String> {
            let value = field(name).ok_or_else(|| format!("{architecture}: config.json lacks {name:?}"))?;
            value
                .as_u64()
                .filter(|&n| n > 0)
                .and_then(|n| usize::try_from(n).ok())
                .ok_or_else(|| format!("{architecture}: {name:?} must be a positive whole number, got {value}"))
        };
        let optional_count = |name: &str, default: usize| if field(name).is_some() { count(name) } else { Ok(default) };
        let number = |name: &str, default: f64| -> std::result::Result<f64, String> {
            match field(name) {
                None => Ok(default),
                Some(v) => v.as_f64().ok_or_else(|| format!("{architecture}: {name:?} must be a number, got {v}")),
            }
        };
        let flag = |name: &str, default: bool| -> std::result::Result<bool, String> {
            match field(name) {
                None => Ok(default),
                Some(v) => v.as_bool().ok_or_else(|| format!("{architecture}: {name:?} must be true or false, got {v}")),
            }
        };
        let config = if family == Family::Gpt2 {
            // GPT2Config: n_embd, n_layer, n_head, n_positions; n_inner null = 4 x n_embd;
            // embeddings tied to the output.
            let hidden = count("n_embd")?;
            let heads = count("n_head")?;
            HfConfig {
                architecture: architecture.into(),
                family,
                vocab: count("vocab_size")?,
                hidden,
                intermediate: optional_count("n_inner", 4 * hidden)?,
                layers: count("n_layer")?,
                heads,
                kv_heads: heads,
                head_dim: hidden / heads,
                max_positions: count("n_positions")?,
                norm_eps: number("layer_norm_epsilon", 1e-5)?,
                rope_theta: 0.0,
                tie_word_embeddings: flag("tie_word_embeddings", true)?,
                qkv_bias: true,
                o_bias: true,
                mlp_bias: true,
                attention_dropout: number("attn_pdrop", 0.1)?,
                residual_dropout: number("resid_pdrop", 0.1)?,
                initializer_range: number("initializer_range", 0.02)?,
            }
        } else {
            let hidden = count("hidden_size")?;
            let heads = count("num_attention_heads")?;
            // As LlamaConfig: num_key_value_heads defaults to num_attention_heads, head_dim to
            // hidden_size / num_attention_heads.
            let kv_heads = optional_count("num_key_value_heads", heads)?;
            let attention_bias = family == Family::Llama && flag("attention_bias", false)?;
            HfConfig {
                architecture: architecture.into(),
                family,
                vocab: count("vocab_size")?,
                hidden,
                intermediate: count("intermediate_size")?,
                layers: count("num_hidden_layers")?,
                heads,
                kv_heads,
                head_dim: optional_count("head_dim", hidden / heads)?,
                max_positions: optional_count("max_position_embeddings", 2048)?,
                norm_eps: number("rms_norm_eps", 1e-6)?,
                rope_theta: number("rope_theta", 10_000.0)?,
                tie_word_embeddings: flag("tie_word_embeddings", false)?,
                // Qwen2Attention: q, k, v with bias=True, o_proj without.
                qkv_bias: family == Family::Qwen2 || attention_bias,
                o_bias: attention_bias,
                mlp_bias: family == Family::Llama && flag("mlp_bias", false)?,
                attention_dropout: number("attention_dropout", 0.0)?,
                residual_dropout: 0.0,
                initializer_range: number("initializer_range", 0.02)?,
            }
        };
        config.validate()?;
        Ok(config)
    }

    fn validate(&self) -> std::result::Result<(), String> {
        let a = &self.architecture;
        if self.layers > MAX_LAYERS {
            return Err(format!(
                "{a}: {} layers is more than {MAX_LAYERS}: no model is that deep (released ones have at most about 130), so tensormem refuses it rather than build it",
                self.layers
            ));
        }
        if !self.heads.is_multiple_of(self.kv_heads) {
            return Err(format!("{a}: {} attention heads do not share {} key/value heads evenly", self.heads, self.kv_heads));
        }
        if self.family == Family::Gpt2 && !self.hidden.is_multiple_of(self.heads) {
            return Err(format!("{a}: n_embd {} does not split into {} heads", self.hidden, self.heads));
        }
        if self.family != Family::Gpt2 && (self.head_dim == 0 || !self.head_dim.is_multiple_of(2)) {
            return Err(format!("{a}: rotary embeddings need an even head size, got {}", self.head_dim));
        }
        for (name, p) in [("attention dropout", self.attention_dropout), ("dropout", self.residual_dropout)] {
            if !(0.0..=1.0).contains(&p) {
                return Err(format!("{a}: {name} must be between 0 and 1, got {p}"));
            }
        }
        Ok(())
    }

    /// One rank's share under tensor parallelism of degree `tp`, as torchtitan's plan for
    /// Llama splits it: q, k, v, gate and up column-wise (their outputs: `tp` times fewer heads
    /// and intermediate features), o and down row-wise (their inputs), the embedding and the
    /// output over the vocabulary (the logits and the loss on 1/tp of it, `loss_parallel`); norms
    /// and biases of row-wise layers whole. Without sequence parallelism each rank keeps the
    /// whole [batch, T, hidden] activations between them.
    pub fn tensor_parallel(&self, tp: usize) -> std::result::Result<HfConfig, String> {
        if tp == 1 {
            return Ok(self.clone());
        }
        if self.family == Family::Gpt2 {
            return Err("tp: tensor parallelism is built for the Llama family (q, k, v, o, gate, up, down) so far, not GPT2LMHeadModel".into());
        }
        for (what, n) in [("attention heads", self.heads), ("key/value heads", self.kv_heads), ("intermediate features", self.intermediate)] {
            if !n.is_multiple_of(tp) {
                return Err(format!("tp={tp}: the {n} {what} do not split evenly over {tp} ranks"));
            }
        }
        Ok(HfConfig {
            heads: self.heads / tp,
            kv_heads: self.kv_heads / tp,
            intermediate: self.intermediate / tp,
            vocab: self.vocab.div_ceil(tp),
            ..self.clone()
        })
    }

    /// The parameter count, from the shapes alone (what `sum(p.numel() for p in
    /// model.parameters())` prints; a tied head counts once).
    pub fn parameter_count(&self) -> u64 {
        let (h, i, v) = (self.hidden as u64, self.intermediate as u64, self.vocab as u64);
        let bias = |on: bool, n: u64| if on { n } else { 0 };
        let head = if self.tie_word_embeddings { 0 } else { v * h };
        if self.family == Family::Gpt2 {
            let layer = (h * 3 * h + 3 * h) + (h * h + h) + (h * i + i) + (i * h + h) + 4 * h;
            return v * h + self.max_positions as u64 * h + self.layers as u64 * layer + 2 * h + head;
        }
        let (q, kv) = ((self.heads * self.head_dim) as u64, (self.kv_heads * self.head_dim) as u64);
        let attention = h * q + bias(self.qkv_bias, q) + 2 * (h * kv + bias(self.qkv_bias, kv)) + q * h + bias(self.o_bias, h);
        let mlp = 3 * h * i + bias(self.mlp_bias, 2 * i + h);
        v * h + self.layers as u64 * (attention + mlp + 2 * h) + h + head
    }
}

/// A model built from a config.
pub enum HfModel {
    Llama(LlamaForCausalLM),
    Gpt2(Transformer),
}

impl HfModel {
    /// Builds the model's parameters in `dtype` (as `from_config(config, torch_dtype=...)`).
    #[track_caller]
    pub fn new(device: &Device, config: &HfConfig, dtype: DType, context: usize, lora: Option<&LoraConfig>) -> Result<HfModel> {
        HfModel::with_quantization(device, config, dtype, context, lora, Quantize::None)
    }

    /// As `new`, the decoder layers' linears stored as `quantize` asks (`BitsAndBytesConfig`);
    /// a quantised base trains only through LoRA.
    #[track_caller]
    pub fn with_quantization(
        device: &Device,
        config: &HfConfig,
        dtype: DType,
        context: usize,
        lora: Option<&LoraConfig>,
        quantize: Quantize,
    ) -> Result<HfModel> {
        if quantize != Quantize::None && (lora.is_none() || config.family == Family::Gpt2) {
            return Err(TensorError::Unsupported(
                "quantize=4bit: a 4-bit base cannot be trained itself (bitsandbytes' Params4bit has no gradient); train LoRA adapters on it (lora > 0, Llama family)".into(),
            ));
        }
        if lora.is_some() && config.family == Family::Gpt2 {
            return Err(TensorError::Shape("LoRA is built for the Llama family (q_proj, ..., down_proj); GPT2LMHeadModel's Conv1D layers are not yet".into()));
        }
        if context > config.max_positions && config.family == Family::Gpt2 {
            return Err(TensorError::Shape(format!("GPT-2's learned positions cover {} tokens: context {context} is longer", config.max_positions)));
        }
        Ok(match config.family {
            Family::Gpt2 => {
                let c = TransformerConfig {
                    architecture: super::Architecture::Gpt2,
                    vocab: config.vocab,
                    context: config.max_positions,
                    dim: config.hidden,
                    layers: config.layers,
                    heads: config.heads,
                    hidden: config.intermediate,
                    dropout: config.residual_dropout,
                    dtype,
                };
                let mut model = Transformer::new(device, c)?;
                // GPT2MLP's act: ACT2FN["gelu_new"] (NewGELUActivation), written out.
                for block in &mut model.blocks {
                    if let Some(Block { mlp: Mlp::Plain { activation, .. }, .. }) = Rc::get_mut(block) {
                        *activation = Activation::GeluNew;
                    }
                }
                HfModel::Gpt2(model)
            }
            _ => HfModel::Llama(LlamaForCausalLM::with_quantization(device, config.clone(), dtype, lora, quantize)?),
        })
    }

    /// The parameters that require grad (all of them in a full fine-tune, the adapters under
    /// LoRA), as the Trainer hands them to the optimizer.
    pub fn trainable_parameters(&self) -> Vec<Tensor> {
        self.parameters().into_iter().filter(Tensor::requires_grad).collect()
    }

    /// Attention as `attn_implementation` asks (GPT-2 is built with eager attention only).
    pub fn set_attention(&mut self, attention: AttentionImplementation) -> Result<()> {
        match self {
            HfModel::Llama(m) => m.attention = attention,
            HfModel::Gpt2(_) if attention == AttentionImplementation::Eager => {}
            HfModel::Gpt2(_) => return Err(TensorError::Unsupported("GPT2LMHeadModel is built with eager attention only (attn=eager)".into())),
        }
        Ok(())
    }

    /// Each decoder layer's name and parameters, in forward order.
    pub fn blocks(&self) -> Vec<(String, Vec<Tensor>)> {
        match self {
            HfModel::Llama(m) => m.layers.iter().enumerate().map(|(i, l)| (format!("model.layers.{i}"), l.parameters())).collect(),
            HfModel::Gpt2(m) => m.blocks.iter().enumerate().map(|(i, b)| (format!("transformer.h.{i}"), b.parameters())).collect(),
        }
    }

    /// A data-parallel strategy's hooks around each decoder layer.
    pub fn set_hooks(&mut self, hooks: super::parallel::Hooks) {
        match self {
            HfModel::Llama(m) => m.hooks = hooks,
            HfModel::Gpt2(m) => m.hooks = hooks,
        }
    }

    pub fn set_checkpointing(&mut self, on: bool) {
        match self {
            HfModel::Llama(m) => m.checkpointing = on,
            HfModel::Gpt2(m) => m.checkpointing = on,
        }
    }

    pub fn vocab(&self) -> usize {
        match self {
            HfModel::Llama(m) => m.config.vocab,
            HfModel::Gpt2(m) => m.config.vocab,
        }
    }

    /// ids [batch, T] -> logits [batch, T, vocab] (training mode: dropout on).
    #[track_caller]
    pub fn forward(&self, ids: &Tensor) -> Result<Tensor> {
        match self {
            HfModel::Llama(m) => m.forward(ids),
            HfModel::Gpt2(m) => m.forward(ids, true),
        }
    }

    /// `ForCausalLMLoss`: the logits upcast to float32 (`logits.float()`), flattened, and
    /// `cross_entropy` against the (already shifted) targets.
    #[track_caller]
    pub fn loss(&self, logits: &Tensor, targets: &Tensor) -> Result<Tensor> {
        let _scope = logits.device().scope("loss");
        let logits = logits.to(DType::F32)?;
        cross_entropy(&logits.view(&[-1, self.vocab() as isize])?, &targets.view(&[-1])?)
    }
}

impl Module for HfModel {
    fn named_parameters(&self) -> Vec<(String, Tensor)> {
        match self {
            HfModel::Llama(m) => m.named_parameters(),
            HfModel::Gpt2(m) => m.named_parameters(),
        }
    }
}

/// `LlamaRMSNorm`: `weight * (x.float() * rsqrt(x.float().pow(2).mean(-1) + eps)).to(dtype)`.
pub struct HfRmsNorm {
    pub name: String,
    pub weight: Tensor,
    pub eps: f64,
}

impl HfRmsNorm {
    #[track_caller]
    fn new(device: &Device, name: &str, dim: usize, eps: f64, dtype: DType) -> Result<HfRmsNorm> {
        Ok(HfRmsNorm { name: name.to_string(), weight: super::parameter(device, &[dim], dtype, Init::Ones)?, eps })
    }

    #[track_caller]
    pub fn forward(&self, x: &Tensor) -> Result<Tensor> {
        let _scope = x.device().module_scope(&self.name);
        let input_dtype = x.dtype();
        let h = x.to(DType::F32)?;
        let variance = h.pow_scalar(2.0)?.mean(&[-1], true)?;
        let h = h.mul(&variance.add_scalar(self.eps)?.rsqrt()?)?;
        self.weight.mul(&h.to(input_dtype)?)
    }
}

impl Module for HfRmsNorm {
    fn named_parameters(&self) -> Vec<(String, Tensor)> {
        vec![(child(&self.name, "weight"), self.weight.share())]
    }
}

/// LoRA as PEFT's `LoraConfig` asks for it: rank `r`, `lora_alpha`, the targeted linears
/// (`q_proj`, ...), no dropout, no bias.
#[derive(Debug, Clone, PartialEq)]
pub struct LoraConfig {
    pub rank: usize,
    pub alpha: f64,
    pub targets: Vec<&'static str>,
}

/// The linears of a Llama-family layer LoRA can target, as PEFT's `target_modules` names them.
pub const LORA_TARGETS: [&str; 7] = ["q_proj", "k_proj", "v_proj", "o_proj", "gate_proj", "up_proj", "down_proj"];

impl LoraConfig {
    /// `q,k,v,o` (or `q_proj,v_proj`, `gate,up,down`): the targets, in `LORA_TARGETS`' order.
    pub fn parse_targets(text: &str) -> std::result::Result<Vec<&'static str>, String> {
        let mut targets = Vec::new();
        for name in text.split(',').map(str::trim) {
            let full = if name.ends_with("_proj") { name.to_string() } else { format!("{name}_proj") };
            let Some(&target) = LORA_TARGETS.iter().find(|t| **t == full) else {
                return Err(format!("lora_targets: {name:?} is not a linear of the layer; use q, k, v, o, gate, up, down"));
            };
            if !targets.contains(&target) {
                targets.push(target);
            }
        }
        targets.sort_by_key(|t| LORA_TARGETS.iter().position(|x| x == t));
        Ok(targets)
    }

    /// The trainable parameters: r x (in + out) for every targeted linear of every layer.
    pub fn trainable_count(&self, config: &HfConfig) -> u64 {
        let (h, i) = (config.hidden as u64, config.intermediate as u64);
        let (q, kv) = ((config.heads * config.head_dim) as u64, (config.kv_heads * config.head_dim) as u64);
        let per_layer: u64 = self
            .targets
            .iter()
            .map(|t| match *t {
                "q_proj" => h + q,
                "k_proj" | "v_proj" => h + kv,
                "o_proj" => q + h,
                _ => h + i,
            })
            .sum();
        self.rank as u64 * per_layer * config.layers as u64
    }
}

/// A linear with an optional LoRA adapter (PEFT's `lora.Linear`: the frozen `base_layer`,
/// `lora_A` [r, in] and `lora_B` [out, r]).
pub struct Projection {
    /// The base layer; with a 4-bit base its `weight` is the packed uint8 `Params4bit`.
    pub base: Linear,
    pub lora: Option<LoraAdapter>,
    /// The base stored in 4 bits (`bnb.nn.Linear4bit`, quantize=4bit), with its quant state.
    pub quant: Option<Quant4bit>,
}

pub struct LoraAdapter {
    pub a: Linear,
    pub b: Linear,
    pub scaling: f64,
}

impl Projection {
    /// PEFT's forward: `result = base_layer(x)`; `x = x.to(lora_A.weight.dtype)`;
    /// `result = result + lora_B(lora_A(x)) * scaling`; `result.to(the base's result type)`.
    #[track_caller]
    pub fn forward(&self, x: &Tensor) -> Result<Tensor> {
        if let Some(quant) = &self.quant {
            return self.forward_4bit(quant, x);
        }
        let result = self.base.forward(x)?;
        let Some(lora) = &self.lora else { return Ok(result) };
        let result_dtype = result.dtype();
        let x = x.to(lora.a.weight.dtype())?;
        let delta = lora.b.forward(&lora.a.forward(&x)?)?;
        let _scope = x.device().module_scope(&lora.b.name);
        result.add(&delta.mul_scalar(lora.scaling)?)?.to(result_dtype)
    }

    /// PEFT's `lora.bnb.Linear4bit.forward`: `result = base_layer(x)` (bitsandbytes'
    /// `Linear4bit`), `result = result.clone()` ("As per Tim Dettmers, for 4bit, we need to
    /// defensively clone here"), then without autocast x cast to the adapter's type,
    /// `output = lora_B(lora_A(x)) * scaling`, `output.to(result.dtype)`, `result + output`.
    #[track_caller]
    fn forward_4bit(&self, quant: &Quant4bit, x: &Tensor) -> Result<Tensor> {
        let result = {
            let _scope = x.device().module_scope(&self.base.name);
            let [_, inputs] = quant.shape;
            if x.shape().last() != Some(&inputs) {
                return Err(TensorError::Shape(format!("{}: input {:?} does not end in {inputs} features", self.base.name, x.shape())));
            }
            quant.linear(x, self.base.bias.as_ref(), COMPUTE_DTYPE_4BIT)?
        };
        let Some(lora) = &self.lora else { return Ok(result) };
        let result = result.clone()?;
        let convert = !crate::amp::is_autocast_enabled();
        let x = if convert { x.to(lora.a.weight.dtype())? } else { x.share() };
        let output = lora.b.forward(&lora.a.forward(&x)?)?;
        let _scope = x.device().module_scope(&lora.b.name);
        let output = output.mul_scalar(lora.scaling)?;
        let output = if convert { output.to(result.dtype())? } else { output };
        result.add(&output)
    }

    /// The base weight's shape, [out, in] (kept by the quant state when stored in 4 bits).
    fn shape(&self) -> [usize; 2] {
        match &self.quant {
            Some(quant) => quant.shape,
            None => {
                let [outputs, inputs] = *self.base.weight.shape() else { unreachable!("a linear's weight is 2-D") };
                [outputs, inputs]
            }
        }
    }

    /// `replace_with_bnb_linear` and loading: the base's weight quantised to NF4 (double
    /// quantisation); the 16-bit weight is freed, the packed one becomes the (frozen) parameter.
    #[track_caller]
    fn quantize(&mut self) -> Result<()> {
        let quant = Quant4bit::quantize(&self.base.weight)?;
        self.base.weight = quant.packed.share();
        self.quant = Some(quant);
        Ok(())
    }

    /// Adds an adapter as PEFT injects it: `lora_A` with nn.Linear's initialisation, `lora_B`
    /// zeros, in float32 when the base is float16 or bfloat16 (`autocast_adapter_dtype=True`);
    /// the base layer is renamed `...base_layer`.
    #[track_caller]
    fn add_lora(&mut self, device: &Device, rank: usize, alpha: f64) -> Result<()> {
        let name = self.base.name.clone();
        let [outputs, inputs] = self.shape();
        // A 4-bit base's weight is uint8: PEFT leaves the adapters in float32 (its
        // `_move_adapter_to_device_of_base_layer` casts only to a floating-point base type).
        let base_dtype = self.quant.as_ref().map_or(self.base.weight.dtype(), |_| DType::F32);
        let dtype = match base_dtype {
            DType::F16 | DType::BF16 => DType::F32,
            other => other,
        };
        let a = Linear::new(device, &child(&name, "lora_A.default"), inputs, rank, false, dtype)?;
        let b = Linear::with_init(device, &child(&name, "lora_B.default"), rank, outputs, false, dtype, Init::Zeros)?;
        self.base.name = child(&name, "base_layer");
        self.lora = Some(LoraAdapter { a, b, scaling: alpha / rank as f64 });
        Ok(())
    }
}

impl Module for Projection {
    fn named_parameters(&self) -> Vec<(String, Tensor)> {
        let mut out = self.base.named_parameters();
        if let Some(lora) = &self.lora {
            out.extend(lora.a.named_parameters());
            out.extend(lora.b.named_parameters());
        }
        out
    }
}

/// One `LlamaDecoderLayer`.
pub struct LlamaDecoderLayer {
    pub name: String,
    q_proj: Projection,
    k_proj: Projection,
    v_proj: Projection,
    o_proj: Projection,
    gate_proj: Projection,
    up_proj: Projection,
    down_proj: Projection,
    input_layernorm: HfRmsNorm,
    post_attention_layernorm: HfRmsNorm,
    heads: usize,
    kv_heads: usize,
    head_dim: usize,
    attention_dropout: f64,
}

/// `LlamaForCausalLM` (and Mistral's and Qwen2's, which build the same graph).
pub struct LlamaForCausalLM {
    pub config: HfConfig,
    pub embed_tokens: Embedding,
    /// Shared so that a checkpointed layer can be run again in backward.
    pub layers: Vec<Rc<LlamaDecoderLayer>>,
    pub norm: HfRmsNorm,
    /// `model.rotary_emb.inv_freq`: a float32 buffer of head_dim / 2.
    pub inv_freq: Tensor,
    /// None when tied to `embed_tokens` (`tie_word_embeddings`).
    pub lm_head: Option<Linear>,
    pub attention: AttentionImplementation,
    /// Gradient checkpointing of every decoder layer.
    pub checkpointing: bool,
    /// A data-parallel strategy's hooks around each decoder layer.
    pub hooks: Hooks,
    /// What bitsandbytes keeps on the device for the whole process with a 4-bit base (its
    /// dynamic map).
    pub quant_maps: Vec<Tensor>,
}

impl LlamaForCausalLM {
    /// Parameters in registration order, initialised as `_init_weights` does (normal with
    /// `initializer_range` for linears and the embedding, zero biases, norms at one).
    #[track_caller]
    pub fn new(device: &Device, config: HfConfig, dtype: DType, lora: Option<&LoraConfig>) -> Result<LlamaForCausalLM> {
        LlamaForCausalLM::with_quantization(device, config, dtype, lora, Quantize::None)
    }

    /// As `new`, with `quantize=4bit` every linear of the decoder layers stored as
    /// bitsandbytes' `Linear4bit` (transformers' `replace_with_bnb_linear` replaces every
    /// nn.Linear but those in `modules_to_not_convert`, which holds the output embedding,
    /// `lm_head`): the embedding, the norms and lm_head stay in `dtype`. Each weight is made in
    /// `dtype` and quantised at once, as loading does weight by weight.
    #[track_caller]
    pub fn with_quantization(device: &Device, config: HfConfig, dtype: DType, lora: Option<&LoraConfig>, quantize: Quantize) -> Result<LlamaForCausalLM> {
        let c = &config;
        let init = Init::Normal(c.initializer_range);
        let embed_tokens = Embedding::new(device, "model.embed_tokens", c.vocab, c.hidden, dtype, init)?;
        // bitsandbytes' name2qmap["dynamic"], made on the device by the first quantize_blockwise.
        let quant_maps = if quantize == Quantize::Nf4 { vec![super::bnb::dynamic_map(device)?] } else { Vec::new() };
        let (q, kv) = (c.heads * c.head_dim, c.kv_heads * c.head_dim);
        let mut layers = (0..c.layers)
            .map(|i| {
                let name = format!("model.layers.{i}");
                let linear = |path: &str, inputs: usize, outputs: usize, bias: bool| -> Result<Projection> {
                    let mut projection =
                        Projection { base: Linear::with_init(device, &child(&name, path), inputs, outputs, bias, dtype, init)?, lora: None, quant: None };
                    if quantize == Quantize::Nf4 {
                        projection.quantize()?;
                    }
                    Ok(projection)
                };
                let norm = |path: &str| HfRmsNorm::new(device, &child(&name, path), c.hidden, c.norm_eps, dtype);
                Ok(LlamaDecoderLayer {
                    q_proj: linear("self_attn.q_proj", c.hidden, q, c.qkv_bias)?,
                    k_proj: linear("self_attn.k_proj", c.hidden, kv, c.qkv_bias)?,
                    v_proj: linear("self_attn.v_proj", c.hidden, kv, c.qkv_bias)?,
                    o_proj: linear("self_attn.o_proj", q, c.hidden, c.o_bias)?,
                    gate_proj: linear("mlp.gate_proj", c.hidden, c.intermediate, c.mlp_bias)?,
                    up_proj: linear("mlp.up_proj", c.hidden, c.intermediate, c.mlp_bias)?,
                    down_proj: linear("mlp.down_proj", c.intermediate, c.hidden, c.mlp_bias)?,
                    input_layernorm: norm("input_layernorm")?,
                    post_attention_layernorm: norm("post_attention_layernorm")?,
                    heads: c.heads,
                    kv_heads: c.kv_heads,
                    head_dim: c.head_dim,
                    attention_dropout: c.attention_dropout,
                    name,
                })
            })
            .collect::<Result<Vec<_>>>()?;
        let norm = HfRmsNorm::new(device, "model.norm", c.hidden, c.norm_eps, dtype)?;
        // LlamaRotaryEmbedding's buffer: inv_freq [head_dim / 2], made in float32 explicitly (it
        // stays so under from_pretrained(torch_dtype=...), which casts no buffer).
        let inv_freq = {
            let _no_grad = autograd::no_grad();
            let _scope = device.scope("model.rotary_emb");
            let inverse: Vec<f32> = (0..c.head_dim / 2).map(|i| c.rope_theta.powf(-2.0 * i as f64 / c.head_dim as f64) as f32).collect();
            device.from_slice(&inverse, &[c.head_dim / 2])?
        };
        let lm_head = if c.tie_word_embeddings { None } else { Some(Linear::with_init(device, "lm_head", c.hidden, c.vocab, false, dtype, init)?) };
        let mut model = LlamaForCausalLM {
            config,
            embed_tokens,
            layers: Vec::new(),
            norm,
            inv_freq,
            lm_head,
            attention: AttentionImplementation::Eager,
            checkpointing: false,
            hooks: None,
            quant_maps,
        };
        if let Some(lora) = lora {
            // get_peft_model: every base parameter frozen, then the adapters injected layer by
            // layer, target by target.
            let base: Vec<Tensor> = model.parameters().into_iter().chain(layers.iter().flat_map(|l| l.parameters())).collect();
            for p in &base {
                p.requires_grad_(false)?;
            }
            for layer in &mut layers {
                for target in &lora.targets {
                    layer.projection_mut(target).add_lora(device, lora.rank, lora.alpha)?;
                }
            }
        }
        model.layers = layers.into_iter().map(Rc::new).collect();
        Ok(model)
    }

    /// ids [batch, T] (int64) -> logits [batch, T, vocab], in training mode.
    #[track_caller]
    pub fn forward(&self, ids: &Tensor) -> Result<Tensor> {
        let device = ids.device().clone();
        let [b, t] = *ids.shape() else {
            return Err(TensorError::Shape(format!("token ids must be [batch, T], got {:?}", ids.shape())));
        };
        let x = self.embed_tokens.forward(ids)?;
        if self.checkpointing && !self.embed_tokens.weight.requires_grad() {
            // PEFT with gradient checkpointing calls `enable_input_require_grads()`: a hook makes
            // the frozen embedding's output require grad, so that the reentrant checkpoint of
            // the first layer has an input to backpropagate to.
            x.requires_grad_(true)?;
        }
        let dtype = x.dtype();
        // LlamaRotaryEmbedding: cos and sin [1, T, head_dim], made in float32 once per forward
        // (autocast off), then cast to the hidden states' type.
        let (cos, sin) = {
            let _scope = device.scope("model.rotary_emb");
            let _autocast_off = crate::amp::autocast_disabled();
            let half = self.config.head_dim / 2;
            // cache_position = arange(T); position_ids = cache_position.unsqueeze(0).
            let positions = device.arange(t, DType::I64)?.unsqueeze(0)?;
            let inv_freq = self.inv_freq.view(&[1, half as isize, 1])?;
            let positions = positions.unsqueeze(1)?.to(DType::F32)?;
            let freqs = inv_freq.matmul(&positions)?.transpose(1, 2)?;
            let emb = Tensor::cat(&[&freqs, &freqs], -1)?;
            // `emb.cos() * self.attention_scaling` (1.0 without rope scaling): a new tensor.
            let cos = emb.cos()?.mul_scalar(1.0)?.to(dtype)?;
            let sin = emb.sin()?.mul_scalar(1.0)?.to(dtype)?;
            (cos, sin)
        };
        // The eager causal mask (`_prepare_4d_causal_attention_mask_with_cache_position`): [T, T]
        // in the model's type, 0 where a key is seen and the type's minimum where it is not,
        // made once per forward and expanded to [batch, 1, T, T].
        // SDPA: no mask (without padding the mask is skipped and attention runs with is_causal).
        let mask = if self.attention == AttentionImplementation::Sdpa {
            None
        } else {
            let _scope = device.scope("model.causal_mask");
            let at = device.arange(t, DType::I64)?;
            let seen = at.view(&[t as isize, 1])?.ge(&at.view(&[1, t as isize])?)?;
            let zero = device.full(&[], 0.0, dtype)?;
            let min = device.full(&[], dtype_min(dtype), dtype)?;
            // One [T, T] mask, expanded (a view) to [batch, 1, T, T].
            Some(seen.where_(&zero, &min)?.view(&[1, 1, t as isize, t as isize])?.expand(&[b, 1, t, t])?)
        };
        let rope = Rc::new((cos, sin, mask));
        let mut x = x;
        for (i, layer) in self.layers.iter().enumerate() {
            x = run_block(&self.hooks, i, &x, |x| {
                if self.checkpointing && autograd::is_grad_enabled() {
                    let (layer, rope) = (Rc::clone(layer), Rc::clone(&rope));
                    checkpoint(move |h| layer.forward(&h[0], &rope.0, &rope.1, rope.2.as_ref()), &[x])
                } else {
                    layer.forward(x, &rope.0, &rope.1, rope.2.as_ref())
                }
            })?;
        }
        let x = self.norm.forward(&x)?;
        match &self.lm_head {
            Some(head) => head.forward(&x),
            None => {
                let _scope = device.module_scope("lm_head");
                x.linear(&self.embed_tokens.weight, None)
            }
        }
    }
}

/// The scopes a KV cache's allocations are made in, named as transformers' methods that make
/// them (`cache_utils.py`).
pub const KV_CACHE_SCOPES: [&str; 2] = ["DynamicLayer.update", "StaticLayer.lazy_initialization"];

/// The key/value cache `generate` keeps: transformers' `DynamicCache` (each layer's keys and
/// values grow by `torch.cat([past, new], dim=-2)`: a new tensor of the grown size, the old one
/// freed) or `StaticCache` (each layer's [batch, kv_heads, max_len, head_dim] keys and values
/// made with `torch.zeros` at the layer's first update, then written in place with
/// `index_copy_`).
pub struct KvCache {
    /// `Some(max_len)`: a static cache of that many positions.
    pub static_len: Option<usize>,
    /// Per layer: (keys, values), once the layer has seen a token.
    pub layers: Vec<Option<(Tensor, Tensor)>>,
    /// The positions seen so far (`get_seq_length()`).
    pub seen: usize,
}

impl KvCache {
    pub fn new(layers: usize, static_len: Option<usize>) -> KvCache {
        KvCache { static_len, layers: (0..layers).map(|_| None).collect(), seen: 0 }
    }

    /// The bytes the cache holds now.
    pub fn bytes(&self) -> u64 {
        self.layers.iter().flatten().map(|(k, v)| (k.numel() * k.dtype().size() + v.numel() * v.dtype().size()) as u64).sum()
    }

    /// `DynamicLayer.update` / `StaticLayer.update`: the layer's keys and values after adding
    /// `k`, `v` [batch, kv_heads, q, head_dim] at position `past`.
    #[track_caller]
    fn update(&mut self, layer: usize, k: &Tensor, v: &Tensor, past: usize) -> Result<(Tensor, Tensor)> {
        let slot = &mut self.layers[layer];
        let device = k.device().clone();
        match self.static_len {
            None => {
                // Named as transformers' frame is: the doctor knows a cache from a leak by it.
                let _scope = device.scope(KV_CACHE_SCOPES[0]);
                // `self.keys = torch.cat([self.keys, key_states], dim=-2)`: the first update cats
                // onto an empty tensor (a copy of k), every later one makes the grown tensor and
                // frees the old keys before the values are grown.
                let (keys, values) = match slot.take() {
                    None => {
                        let keys = Tensor::cat(&[k], -2)?;
                        (keys, Tensor::cat(&[v], -2)?)
                    }
                    Some((old_k, old_v)) => {
                        let keys = Tensor::cat(&[&old_k, k], -2)?;
                        drop(old_k);
                        let values = Tensor::cat(&[&old_v, v], -2)?;
                        (keys, values)
                    }
                };
                *slot = Some((keys.share(), values.share()));
                Ok((keys, values))
            }
            Some(max_len) => {
                let &[b, kv, q, d] = k.shape() else { unreachable!("4-D heads") };
                if past + q > max_len {
                    return Err(TensorError::Shape(format!("static cache of {max_len} positions is full: position {} does not fit", past + q)));
                }
                if slot.is_none() {
                    // StaticLayer.lazy_initialization: torch.zeros for the keys, then the values.
                    let _scope = device.scope(KV_CACHE_SCOPES[1]);
                    let keys = k.device().zeros(&[b, kv, max_len, d], k.dtype())?;
                    let values = k.device().zeros(&[b, kv, max_len, d], v.dtype())?;
                    *slot = Some((keys, values));
                }
                let (keys, values) = slot.as_ref().expect("made above");
                // index_copy_(2, cache_position, key_states): in place, nothing allocated.
                keys.narrow(2, past, q)?.copy_(k)?;
                values.narrow(2, past, q)?.copy_(v)?;
                Ok((keys.share(), values.share()))
            }
        }
    }
}

impl LlamaForCausalLM {
    /// A forward of `generate` under inference_mode: ids [batch, q] (the prompt, then one token)
    /// with the cache holding the positions before them; returns the logits of the last position
    /// only, [batch, 1, vocab] (`logits_to_keep=1`, which generate passes since transformers
    /// 4.45, prefill included): the final norm runs over every position, the head over the last.
    #[track_caller]
    pub fn forward_cached(&self, ids: &Tensor, cache: &mut KvCache) -> Result<Tensor> {
        let device = ids.device().clone();
        let [b, q] = *ids.shape() else {
            return Err(TensorError::Shape(format!("token ids must be [batch, T], got {:?}", ids.shape())));
        };
        let past = cache.seen;
        let kv_len = cache.static_len.unwrap_or(past + q);
        let x = self.embed_tokens.forward(ids)?;
        let dtype = x.dtype();
        // cache_position = arange(past, past + q); position_ids its unsqueeze(0).
        let positions: Vec<i64> = (past..past + q).map(|p| p as i64).collect();
        let cache_position = device.from_slice(&positions, &[q])?;
        let (cos, sin) = {
            let _scope = device.scope("model.rotary_emb");
            let _autocast_off = crate::amp::autocast_disabled();
            let half = self.config.head_dim / 2;
            let inv_freq = self.inv_freq.view(&[1, half as isize, 1])?;
            let positions = cache_position.unsqueeze(0)?.unsqueeze(1)?.to(DType::F32)?;
            let freqs = inv_freq.matmul(&positions)?.transpose(1, 2)?;
            let emb = Tensor::cat(&[&freqs, &freqs], -1)?;
            let cos = emb.cos()?.mul_scalar(1.0)?.to(dtype)?;
            let sin = emb.sin()?.mul_scalar(1.0)?.to(dtype)?;
            (cos, sin)
        };
        // The eager mask [q, kv_len] (a key is seen where its position <= the query's; a static
        // cache's unwritten positions are masked), in the model's type, expanded to
        // [batch, 1, q, kv_len].
        let mask = {
            let _scope = device.scope("model.causal_mask");
            let keys = device.arange(kv_len, DType::I64)?;
            let seen = cache_position.view(&[q as isize, 1])?.ge(&keys.view(&[1, kv_len as isize])?)?;
            let zero = device.full(&[], 0.0, dtype)?;
            let min = device.full(&[], dtype_min(dtype), dtype)?;
            seen.where_(&zero, &min)?.view(&[1, 1, q as isize, kv_len as isize])?.expand(&[b, 1, q, kv_len])?
        };
        let mut x = x;
        for (i, layer) in self.layers.iter().enumerate() {
            x = layer.forward_with_cache(&x, &cos, &sin, Some(&mask), Some((&mut *cache, i, past)))?;
        }
        cache.seen = past + q;
        let x = self.norm.forward(&x)?;
        // hidden_states[:, slice(-1, None), :]: a view of the last position.
        let x = x.narrow(1, q - 1, 1)?;
        match &self.lm_head {
            Some(head) => head.forward(&x),
            None => {
                let _scope = device.module_scope("lm_head");
                x.linear(&self.embed_tokens.weight, None)
            }
        }
    }
}

/// The most negative finite value of a type (`torch.finfo(dtype).min`).
fn dtype_min(dtype: DType) -> f64 {
    match dtype {
        DType::F16 => -65504.0,
        DType::BF16 => -3.3895313892515355e38,
        _ => f32::MIN as f64,
    }
}

impl LlamaDecoderLayer {
    fn projection_mut(&mut self, name: &str) -> &mut Projection {
        match name {
            "q_proj" => &mut self.q_proj,
            "k_proj" => &mut self.k_proj,
            "v_proj" => &mut self.v_proj,
            "o_proj" => &mut self.o_proj,
            "gate_proj" => &mut self.gate_proj,
            "up_proj" => &mut self.up_proj,
            _ => &mut self.down_proj,
        }
    }

    #[track_caller]
    pub fn forward(&self, x: &Tensor, cos: &Tensor, sin: &Tensor, mask: Option<&Tensor>) -> Result<Tensor> {
        self.forward_with_cache(x, cos, sin, mask, None)
    }

    /// The layer, its attention reading the keys and values `cache` (the cache, this layer's
    /// index, the positions before x) returns after adding x's (generate, in eval mode).
    #[track_caller]
    fn forward_with_cache(&self, x: &Tensor, cos: &Tensor, sin: &Tensor, mask: Option<&Tensor>, cache: Option<(&mut KvCache, usize, usize)>) -> Result<Tensor> {
        let _scope = x.device().module_scope(&self.name);
        let h = self.attention(&self.input_layernorm.forward(x)?, cos, sin, mask, cache)?;
        let x = x.add(&h)?;
        let h = self.mlp(&self.post_attention_layernorm.forward(&x)?)?;
        x.add(&h)
    }

    /// `LlamaMLP`: `down_proj(act_fn(gate_proj(x)) * up_proj(x))` with SiLU.
    #[track_caller]
    fn mlp(&self, x: &Tensor) -> Result<Tensor> {
        let _scope = x.device().module_scope(&child(&self.name, "mlp"));
        let gate = self.gate_proj.forward(x)?.silu()?;
        self.down_proj.forward(&gate.mul(&self.up_proj.forward(x)?)?)
    }

    /// `LlamaAttention` with `eager_attention_forward`.
    #[track_caller]
    fn attention(&self, x: &Tensor, cos: &Tensor, sin: &Tensor, mask: Option<&Tensor>, cache: Option<(&mut KvCache, usize, usize)>) -> Result<Tensor> {
        let _scope = x.device().module_scope(&child(&self.name, "self_attn"));
        let [b, t, _] = *x.shape() else {
            return Err(TensorError::Shape(format!("{}: input must be [batch, T, features], got {:?}", self.name, x.shape())));
        };
        let (bi, ti, d) = (b as isize, t as isize, self.head_dim as isize);
        // view(batch, T, -1, head_dim).transpose(1, 2): views.
        let heads = |p: Tensor| p.view(&[bi, ti, -1, d])?.transpose(1, 2);
        let q = heads(self.q_proj.forward(x)?)?;
        let k = heads(self.k_proj.forward(x)?)?;
        let v = heads(self.v_proj.forward(x)?)?;
        // apply_rotary_pos_emb: cos, sin unsqueezed to [1, 1, T, head_dim].
        let (cos, sin) = (cos.unsqueeze(1)?, sin.unsqueeze(1)?);
        let (q, k) = (rotate(&q, &cos, &sin)?, rotate(&k, &cos, &sin)?);
        // generate: past_key_values.update(k, v, layer_idx); dropout off (eval mode).
        let training = cache.is_none();
        let (k, v) = match cache {
            Some((cache, index, past)) => cache.update(index, &k, &v, past)?,
            None => (k, v),
        };
        let Some(mask) = mask else {
            // sdpa_attention_forward: k and v as they are (enable_gqa), then
            // `attn_output.transpose(1, 2).contiguous()`.
            let y = q.scaled_dot_product_attention(&k, &v)?.transpose(1, 2)?.contiguous()?;
            return self.o_proj.forward(&y.reshape(&[bi, ti, -1])?);
        };
        let n_rep = self.heads / self.kv_heads;
        let (k, v) = (repeat_kv(&k, n_rep)?, repeat_kv(&v, n_rep)?);
        let scores = q.matmul(&k.transpose(2, 3)?)?.mul_scalar(1.0 / (self.head_dim as f64).sqrt())?;
        let scores = scores.add(mask)?;
        let probs = scores.softmax_to_dtype(-1, DType::F32)?.to(q.dtype())?;
        drop(scores);
        let probs = probs.dropout(self.attention_dropout, training)?;
        let y = probs.matmul(&v)?.transpose(1, 2)?.contiguous()?;
        self.o_proj.forward(&y.reshape(&[bi, ti, -1])?)
    }
}

/// `repeat_kv`: each key/value head repeated for the `n_rep` query heads sharing it, as
/// `x[:, :, None].expand(b, kv, n_rep, T, d).reshape(b, kv * n_rep, T, d)` (a copy when
/// `n_rep > 1`, the tensor itself otherwise).
#[track_caller]
fn repeat_kv(x: &Tensor, n_rep: usize) -> Result<Tensor> {
    if n_rep == 1 {
        return Ok(x.share());
    }
    let &[b, kv, t, d] = x.shape() else { unreachable!("4-D heads") };
    x.unsqueeze(2)?.expand(&[b, kv, n_rep, t, d])?.reshape(&[b as isize, (kv * n_rep) as isize, t as isize, d as isize])
}

impl Module for LlamaDecoderLayer {
    fn named_parameters(&self) -> Vec<(String, Tensor)> {
        [&self.q_proj, &self.k_proj, &self.v_proj, &self.o_proj, &self.gate_proj, &self.up_proj, &self.down_proj]
            .into_iter()
            .flat_map(Projection::named_parameters)
            .chain(self.input_layernorm.named_parameters())
            .chain(self.post_attention_layernorm.named_parameters())
            .collect()
    }
}

impl Module for LlamaForCausalLM {
    fn named_parameters(&self) -> Vec<(String, Tensor)> {
        let mut out = self.embed_tokens.named_parameters();
        out.extend(self.layers.iter().flat_map(|l| l.named_parameters()));
        out.extend(self.norm.named_parameters());
        out.extend(self.lm_head.iter().flat_map(Module::named_parameters));
        out
    }
}
