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
//!
//! `config` reads the config.json, `llama` builds the Llama family (with its KV cache), `lora`
//! injects the adapters; `HfModel` here is either model.

mod config;
mod llama;
mod lora;

/// transformers' KV-cache scope names, which the analysis knows (`crate::pytorch`).
pub use crate::pytorch::KV_CACHE_SCOPES;
pub use config::{AttentionImplementation, Family, HF_PRESETS, HfConfig};
pub use llama::{HfRmsNorm, KvCache, LlamaDecoderLayer, LlamaForCausalLM};
pub use lora::{LORA_TARGETS, LoraAdapter, LoraConfig, Projection};

use super::bnb::{COMPUTE_DTYPE_4BIT, Quant4bit, Quantize};
use super::parallel::{Hooks, run_block};
use super::{Activation, Block, Embedding, Init, Linear, Mlp, Module, Transformer, TransformerConfig, child, cross_entropy};
use crate::autograd::{self, checkpoint};
use crate::device::Device;
use crate::tensor::{DType, Result, Tensor, TensorError};
use serde_json::Value;
use std::rc::Rc;

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
        if quantize != Quantize::None && (lora.is_none() || !config.arch.lora) {
            return Err(TensorError::Unsupported(
                "quantize=4bit: a 4-bit base cannot be trained itself (bitsandbytes' Params4bit has no gradient); train LoRA adapters on it (lora > 0, Llama family)".into(),
            ));
        }
        if lora.is_some() && !config.arch.lora {
            return Err(TensorError::Shape("LoRA is built for the Llama family (q_proj, ..., down_proj); GPT2LMHeadModel's Conv1D layers are not yet".into()));
        }
        if context > config.max_positions && !config.arch.rotary {
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
    fn visit_parameters(&self, visit: &mut dyn FnMut(String, &Tensor)) {
        match self {
            HfModel::Llama(m) => m.visit_parameters(visit),
            HfModel::Gpt2(m) => m.visit_parameters(visit),
        }
    }
}
