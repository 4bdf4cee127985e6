//! A decoder-only transformer language model in the two shapes the scenarios size: GPT-2's
//! (learned positions, LayerNorm, GELU MLP, biases, fused qkv, tied embeddings) and a Llama-style
//! one (RoPE, RMSNorm, SwiGLU, no biases, untied head).

use super::parallel::{Hooks, run_block};
use super::{Activation, Block, CausalSelfAttention, Embedding, Init, LayerNorm, Linear, Mlp, Norm, PositionEncoding, RmsNorm, child, cross_entropy};
use crate::autograd::{self, checkpoint};
use crate::device::Device;
use crate::tensor::{DType, Result, Tensor, TensorError};
use std::rc::Rc;

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Architecture {
    Gpt2,
    Llama,
}

#[derive(Debug, Clone, PartialEq)]
pub struct TransformerConfig {
    pub architecture: Architecture,
    pub vocab: usize,
    /// The longest sequence (GPT-2's learned position table has this many rows).
    pub context: usize,
    pub dim: usize,
    pub layers: usize,
    pub heads: usize,
    /// The feed-forward width.
    pub hidden: usize,
    pub dropout: f64,
    pub dtype: DType,
}

impl TransformerConfig {
    /// GPT-2 small as published (124,439,808 parameters), float32, no dropout.
    pub fn gpt2_small() -> TransformerConfig {
        TransformerConfig {
            architecture: Architecture::Gpt2,
            vocab: 50257,
            context: 1024,
            dim: 768,
            layers: 12,
            heads: 12,
            hidden: 3072,
            dropout: 0.0,
            dtype: DType::F32,
        }
    }
}

/// The model: `forward(ids)` gives logits, `loss(ids, targets)` the mean cross-entropy.
pub struct Transformer {
    pub config: TransformerConfig,
    pub wte: Embedding,
    /// GPT-2's learned positions.
    pub wpe: Option<Embedding>,
    /// Shared so that a checkpointed block can be run again in backward.
    pub blocks: Vec<Rc<Block>>,
    pub norm: Norm,
    /// None when tied to the token embedding (GPT-2).
    pub head: Option<Linear>,
    /// Checkpoint each block (keep its input, recompute it in backward).
    pub checkpointing: bool,
    /// A data-parallel strategy's hooks around each block.
    pub hooks: Hooks,
}

impl Transformer {
    #[track_caller]
    pub fn new(device: &Device, config: TransformerConfig) -> Result<Transformer> {
        let c = &config;
        let gpt2 = c.architecture == Architecture::Gpt2;
        let std = Init::Normal(0.02);
        let wte = Embedding::new(device, if gpt2 { "transformer.wte" } else { "tok_embeddings" }, c.vocab, c.dim, c.dtype, std)?;
        let wpe = if gpt2 { Some(Embedding::new(device, "transformer.wpe", c.context, c.dim, c.dtype, std)?) } else { None };
        let blocks = (0..c.layers)
            .map(|i| {
                let name = if gpt2 { format!("transformer.h.{i}") } else { format!("layers.{i}") };
                let norm = |n: &str| -> Result<Norm> {
                    Ok(if gpt2 {
                        Norm::Layer(LayerNorm::new(device, &child(&name, n), c.dim, c.dtype)?)
                    } else {
                        Norm::Rms(RmsNorm::new(device, &child(&name, n), c.dim, 1e-5, c.dtype)?)
                    })
                };
                let norm1 = norm(if gpt2 { "ln_1" } else { "attention_norm" })?;
                let mut attn = if gpt2 {
                    CausalSelfAttention::fused(device, &child(&name, "attn"), c.dim, c.heads, c.context, std, c.dtype)?
                } else {
                    CausalSelfAttention::new(
                        device,
                        &child(&name, "attention"),
                        c.dim,
                        c.heads,
                        c.context,
                        false,
                        PositionEncoding::Rope { theta: 10_000.0 },
                        c.dtype,
                    )?
                };
                attn.dropout = c.dropout;
                let norm2 = norm(if gpt2 { "ln_2" } else { "ffn_norm" })?;
                let mlp = if gpt2 {
                    let mlp = child(&name, "mlp");
                    Mlp::Plain {
                        fc: Linear::with_init(device, &child(&mlp, "c_fc"), c.dim, c.hidden, true, c.dtype, std)?,
                        proj: Linear::with_init(device, &child(&mlp, "c_proj"), c.hidden, c.dim, true, c.dtype, std)?,
                        activation: Activation::Gelu,
                    }
                } else {
                    let ff = child(&name, "feed_forward");
                    Mlp::SwiGlu {
                        w1: Linear::new(device, &child(&ff, "w1"), c.dim, c.hidden, false, c.dtype)?,
                        w2: Linear::new(device, &child(&ff, "w2"), c.hidden, c.dim, false, c.dtype)?,
                        w3: Linear::new(device, &child(&ff, "w3"), c.dim, c.hidden, false, c.dtype)?,
                    }
                };
                Ok(Rc::new(Block { name, norm1, attn, norm2, mlp, dropout: c.dropout }))
            })
            .collect::<Result<Vec<_>>>()?;
        let norm = if gpt2 {
            Norm::Layer(LayerNorm::new(device, "transformer.ln_f", c.dim, c.dtype)?)
        } else {
            Norm::Rms(RmsNorm::new(device, "norm", c.dim, 1e-5, c.dtype)?)
        };
        let head = if gpt2 { None } else { Some(Linear::new(device, "output", c.dim, c.vocab, false, c.dtype)?) };
        Ok(Transformer { config, wte, wpe, blocks, norm, head, checkpointing: false, hooks: None })
    }

    /// ids [batch, T] (int64) -> logits [batch, T, vocab].
    #[track_caller]
    pub fn forward(&self, ids: &Tensor, training: bool) -> Result<Tensor> {
        let [_, t] = ids.shape() else {
            return Err(TensorError::Shape(format!("token ids must be [batch, T], got {:?}", ids.shape())));
        };
        if *t > self.config.context {
            return Err(TensorError::Shape(format!("a sequence of {t} tokens is longer than the context of {}", self.config.context)));
        }
        let mut x = self.wte.forward(ids)?;
        if let Some(wpe) = &self.wpe {
            // GPT-2: learned positions, then dropout on the sum (`transformer.drop`).
            let positions = ids.device().arange(*t, DType::I64)?;
            x = x.add(&wpe.forward(&positions)?)?;
            let _scope = ids.device().scope("transformer.drop");
            x = x.dropout(self.config.dropout, training)?;
        }
        for (i, block) in self.blocks.iter().enumerate() {
            x = run_block(&self.hooks, i, &x, |x| {
                if self.checkpointing && autograd::is_grad_enabled() {
                    let block = Rc::clone(block);
                    checkpoint(move |t| block.forward(&t[0], training), &[x])
                } else {
                    block.forward(x, training)
                }
            })?;
        }
        let x = self.norm.forward(&x)?;
        match &self.head {
            Some(head) => head.forward(&x),
            None => {
                let _scope = ids.device().scope("lm_head");
                x.matmul(&self.wte.weight.t()?)
            }
        }
    }

    /// The mean next-token cross-entropy of `forward(ids)` against `targets` [batch, T].
    #[track_caller]
    pub fn loss(&self, ids: &Tensor, targets: &Tensor, training: bool) -> Result<Tensor> {
        let logits = self.forward(ids, training)?;
        let _scope = ids.device().scope("loss");
        cross_entropy(&logits.view(&[-1, self.config.vocab as isize])?, &targets.view(&[-1])?)
    }
}

parameters!(Transformer { wte, wpe, blocks, norm, head });
