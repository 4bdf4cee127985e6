//! The `lm` presets: the pre-norm Transformer language model of the recorded PyTorch training
//! run in `fixtures/pytorch-snapshots/gpt-medium-ctx128-training.pickle`, written op for op as
//! its Python is, because its memory is the ops' memory: linears are `einsum`s (a `bmm` whose
//! weight gradient comes back transposed, so AccumulateGrad copies it: every weight gradient is
//! allocated twice), RoPE splits each head in halves and concatenates, the causal mask is built
//! in every block, softmax and the loss's log_softmax are written out (max, subtract, exp, sum,
//! divide) and the loss picks each target with `gather` (which keeps the whole negated
//! log-probabilities). RMSNorm, SwiGLU, no biases, an untied head.

use super::attention::rotary_angles;
use super::parallel::{Hooks, run_block};
use super::{Embedding, Init, Linear, RmsNorm, child};
use crate::autograd::{self, checkpoint};
use crate::device::Device;
use crate::tensor::{DType, Result, Tensor, TensorError};
use std::rc::Rc;

/// A model size: d_model, d_ff, layers, heads.
#[derive(Debug, Clone, PartialEq)]
pub struct LmConfig {
    pub vocab: usize,
    pub dim: usize,
    pub hidden: usize,
    pub layers: usize,
    pub heads: usize,
    /// The longest sequence (the rotary tables' length).
    pub context: usize,
    pub dtype: DType,
}

/// The sizes, as `(name, d_model, d_ff, layers, heads)`.
pub const LM_SIZES: [(&str, usize, usize, usize, usize); 5] =
    [("small", 768, 3072, 12, 12), ("medium", 1024, 4096, 24, 16), ("large", 1280, 5120, 36, 20), ("xl", 1600, 6400, 48, 25), ("2.7b", 2560, 10240, 32, 32)];

/// The sizes' names, in the table's order.
pub const LM_SIZE_NAMES: [&str; LM_SIZES.len()] = {
    let mut names = [""; LM_SIZES.len()];
    let mut i = 0;
    while i < names.len() {
        names[i] = LM_SIZES[i].0;
        i += 1;
    }
    names
};

impl LmConfig {
    /// A size by name, with the vocabulary of 10,000 tokens.
    pub fn preset(size: &str, context: usize, dtype: DType) -> Option<LmConfig> {
        let &(_, dim, hidden, layers, heads) = LM_SIZES.iter().find(|s| s.0 == size)?;
        Some(LmConfig { vocab: 10_000, dim, hidden, layers, heads, context, dtype })
    }

    /// The parameter count from the shapes: embedding and output, and per block four d x d
    /// attention weights, three d x d_ff feed-forward weights and two norms; the final norm.
    pub fn parameter_count(&self) -> u64 {
        let (v, d, f) = (self.vocab as u64, self.dim as u64, self.hidden as u64);
        2 * v * d + self.layers as u64 * (4 * d * d + 3 * d * f + 2 * d) + d
    }
}

/// One block: attention and SwiGLU feed-forward, each after an RMSNorm, each added back.
pub struct LmBlock {
    pub name: String,
    wq: Linear,
    wk: Linear,
    wv: Linear,
    wo: Linear,
    w1: Linear,
    w2: Linear,
    w3: Linear,
    attention_norm: RmsNorm,
    ffn_norm: RmsNorm,
    /// This rank's heads (all of them without tensor parallelism), each of `head_size`.
    heads: usize,
    head_size: usize,
    /// cos and sin of the rotary angles, [context, head size / 2].
    rope: (Tensor, Tensor),
}

pub struct Lm {
    pub config: LmConfig,
    pub tok_embeddings: Embedding,
    /// Shared so that a checkpointed block can be run again in backward.
    pub blocks: Vec<Rc<LmBlock>>,
    pub norm: RmsNorm,
    pub output: Linear,
    /// Checkpoint each block (keep its input, recompute it in backward).
    pub checkpointing: bool,
    /// A data-parallel strategy's hooks around each block.
    pub hooks: Hooks,
}

impl Lm {
    #[track_caller]
    pub fn new(device: &Device, config: LmConfig) -> Result<Lm> {
        Lm::tensor_parallel(device, config, 1)
    }

    /// One rank's share under tensor parallelism of degree `tp` (torchtitan's plan): wq, wk, wv,
    /// w1 and w3 split by their outputs (`tp` times fewer heads and d_ff features), wo and w2 by
    /// their inputs, the embedding and the output over the vocabulary (logits and loss on 1/tp
    /// of it); norms whole. `config` stays the whole model's except that its vocabulary becomes
    /// the rank's share.
    #[track_caller]
    pub fn tensor_parallel(device: &Device, mut config: LmConfig, tp: usize) -> Result<Lm> {
        let c = &config;
        if c.heads == 0 || !c.dim.is_multiple_of(c.heads) || !(c.dim / c.heads).is_multiple_of(2) {
            return Err(TensorError::Shape(format!("{} features do not split into {} heads of an even size", c.dim, c.heads)));
        }
        if tp == 0 || !c.heads.is_multiple_of(tp) || !c.hidden.is_multiple_of(tp) {
            return Err(TensorError::Shape(format!("tp={tp}: {} heads and {} feed-forward features do not split evenly over {tp} ranks", c.heads, c.hidden)));
        }
        let head_size = c.dim / c.heads;
        let (heads, hidden) = (c.heads / tp, c.hidden / tp);
        config.vocab = config.vocab.div_ceil(tp);
        let c = &config;
        let tok_embeddings = Embedding::new(device, "tok_embeddings", c.vocab, c.dim, c.dtype, Init::Normal(1.0))?;
        let rope = rope_tables(device, c.context, head_size, c.dtype)?;
        let blocks = (0..c.layers)
            .map(|i| {
                let name = format!("layers.{i}");
                let linear = |path: &str, inputs: usize, outputs: usize| Linear::new(device, &child(&name, path), inputs, outputs, false, c.dtype);
                let local = heads * head_size;
                Ok(Rc::new(LmBlock {
                    wq: linear("attention.wq", c.dim, local)?,
                    wk: linear("attention.wk", c.dim, local)?,
                    wv: linear("attention.wv", c.dim, local)?,
                    wo: linear("attention.wo", local, c.dim)?,
                    w1: linear("feed_forward.w1", c.dim, hidden)?,
                    w2: linear("feed_forward.w2", hidden, c.dim)?,
                    w3: linear("feed_forward.w3", c.dim, hidden)?,
                    attention_norm: RmsNorm::new(device, &child(&name, "attention_norm"), c.dim, 1e-5, c.dtype)?,
                    ffn_norm: RmsNorm::new(device, &child(&name, "ffn_norm"), c.dim, 1e-5, c.dtype)?,
                    heads,
                    head_size,
                    rope: (rope.0.share(), rope.1.share()),
                    name,
                }))
            })
            .collect::<Result<Vec<_>>>()?;
        let norm = RmsNorm::new(device, "norm", c.dim, 1e-5, c.dtype)?;
        let output = Linear::new(device, "output", c.dim, c.vocab, false, c.dtype)?;
        Ok(Lm { config, tok_embeddings, blocks, norm, output, checkpointing: false, hooks: None })
    }

    /// ids [batch, T] (int64) -> logits [batch, T, vocab].
    #[track_caller]
    pub fn forward(&self, ids: &Tensor) -> Result<Tensor> {
        let [_, t] = ids.shape() else {
            return Err(TensorError::Shape(format!("token ids must be [batch, T], got {:?}", ids.shape())));
        };
        if *t > self.config.context {
            return Err(TensorError::Shape(format!("a sequence of {t} tokens is longer than the context of {}", self.config.context)));
        }
        let mut x = self.tok_embeddings.forward(ids)?;
        for (i, block) in self.blocks.iter().enumerate() {
            x = run_block(&self.hooks, i, &x, |x| {
                if self.checkpointing && autograd::is_grad_enabled() {
                    let block = Rc::clone(block);
                    checkpoint(move |t| block.forward(&t[0]), &[x])
                } else {
                    block.forward(x)
                }
            })?;
        }
        let x = self.norm.forward(&x)?;
        einsum_linear(&x, &self.output)
    }

    /// The mean next-token loss of `logits` [batch, T, vocab] against `targets` [batch, T],
    /// as the run's own code computes it: log_softmax written out, then `-logp.gather(...)`.
    #[track_caller]
    pub fn loss(&self, logits: &Tensor, targets: &Tensor) -> Result<Tensor> {
        let _scope = logits.device().scope("loss");
        let logits = logits.view(&[-1, self.config.vocab as isize])?;
        let log_probs = {
            let (max, _) = logits.max_dim(-1, true)?;
            let shifted = logits.sub(&max)?;
            drop(max);
            let log_sum = shifted.exp()?.sum(&[-1], true)?.log()?;
            shifted.sub(&log_sum)?
        };
        let negated = log_probs.neg()?;
        drop(log_probs);
        negated.gather(-1, &targets.view(&[-1, 1])?)?.mean(&[], false)
    }
}

impl LmBlock {
    #[track_caller]
    pub fn forward(&self, x: &Tensor) -> Result<Tensor> {
        let _scope = x.device().module_scope(&self.name);
        // As Python runs `x = x + self.attention(self.attention_norm(x))`: a call's argument
        // goes when the call returns, the call's result when the add has its output. (Under
        // no_grad, as a checkpointed block's forward runs, nothing else holds them.)
        let normed = self.attention_norm.forward(x)?;
        let attended = self.attention(&normed)?;
        drop(normed);
        let x = x.add(&attended)?;
        drop(attended);
        let normed = self.ffn_norm.forward(&x)?;
        let transformed = self.feed_forward(&normed)?;
        drop(normed);
        x.add(&transformed)
    }

    /// SwiGLU with silu written out: w2(w1(h) * sigmoid(w1(h)) * w3(h)).
    #[track_caller]
    fn feed_forward(&self, h: &Tensor) -> Result<Tensor> {
        let _scope = h.device().module_scope(&child(&self.name, "feed_forward"));
        let projected = einsum_linear(h, &self.w1)?;
        // Python's `gate = gate * gate.sigmoid()` frees the sigmoid, then the rebound gate.
        let gate = projected.mul(&projected.sigmoid()?)?;
        drop(projected);
        let up = einsum_linear(h, &self.w3)?;
        let out = einsum_linear(&gate.mul(&up)?, &self.w2)?;
        // The locals go at return in the order Python assigned them: gate, then up.
        drop((gate, up));
        Ok(out)
    }

    #[track_caller]
    fn attention(&self, x: &Tensor) -> Result<Tensor> {
        let device = x.device().clone();
        let _scope = device.module_scope(&child(&self.name, "attention"));
        let [b, t, _] = *x.shape() else {
            return Err(TensorError::Shape(format!("{}: input must be [batch, T, features], got {:?}", self.name, x.shape())));
        };
        let (h, d) = (self.heads, self.head_size);
        // rearrange 'b t (h d) -> b h t d': views.
        let heads = |p: Tensor| p.view(&[b as isize, t as isize, h as isize, d as isize])?.transpose(1, 2);
        let (cos, sin) = (self.rope.0.narrow(0, 0, t)?, self.rope.1.narrow(0, 0, t)?);
        let (q_in, k_in, v) = (heads(einsum_linear(x, &self.wq)?)?, heads(einsum_linear(x, &self.wk)?)?, heads(einsum_linear(x, &self.wv)?)?);
        let (q, k) = (rotate_halves(&q_in, &cos, &sin)?, rotate_halves(&k_in, &cos, &sin)?);
        // The causal mask, made here on every call: query i sees key j when i >= j.
        let mask = {
            let at = device.arange(t, DType::I64)?;
            at.view(&[t as isize, 1])?.ge(&at.view(&[1, t as isize])?)?
        };
        let scores_in = q.matmul(&k.transpose(-2, -1)?)?.div_scalar((d as f64).sqrt())?;
        let scores = mask.where_(&scores_in, &device.full(&[], f64::NEG_INFINITY, scores_in.dtype())?)?;
        let probs = softmax(&scores)?;
        drop(scores);
        // einsum makes a contiguous copy of the permuted v for its bmm; rearrange back copies.
        let y = probs.matmul(&v)?.transpose(1, 2)?.reshape(&[b as isize, t as isize, (h * d) as isize])?;
        let out = einsum_linear(&y, &self.wo)?;
        // Python releases a returning function's locals in the order they were first assigned
        // (q, k, v, q_in, ...), where Rust would drop them last first; the order decides which
        // cached blocks later requests reuse. (A tuple drops its fields in order.)
        drop((q, k, v, q_in, k_in, mask, scores_in, probs, y));
        Ok(out)
    }
}

/// softmax over the last dim, written out: x - max, exp, / sum. Autograd keeps max's indices,
/// the exponentials, their sum and the result.
#[track_caller]
fn softmax(x: &Tensor) -> Result<Tensor> {
    let (max, _) = x.max_dim(-1, true)?;
    let e = x.sub(&max)?.exp()?;
    drop(max);
    e.div(&e.sum(&[-1], true)?)
}

/// `torch.einsum("bti,oi->bto", x, weight)`: one bmm of x as [1, b*t, in] by the transposed
/// weight, under the linear's scope. Unlike `F.linear` (whose mm backward returns the weight's
/// gradient in the weight's layout), bmm's backward gives it transposed, and AccumulateGrad
/// copies it.
#[track_caller]
fn einsum_linear(x: &Tensor, linear: &Linear) -> Result<Tensor> {
    let _scope = x.device().module_scope(&linear.name);
    let [outputs, inputs] = *linear.weight.shape() else { unreachable!("a linear's weight is 2-D") };
    let mut shape: Vec<isize> = x.shape().iter().map(|&n| n as isize).collect();
    if shape.pop() != Some(inputs as isize) {
        return Err(TensorError::Shape(format!("{}: input {:?} does not end in {inputs} features", linear.name, x.shape())));
    }
    shape.push(outputs as isize);
    let y = x.reshape(&[1, -1, inputs as isize])?.bmm(&linear.weight.t()?.unsqueeze(0)?)?;
    y.view(&shape)
}

/// RoPE on halves: (x1 cos - x2 sin, x1 sin + x2 cos), concatenated.
#[track_caller]
fn rotate_halves(x: &Tensor, cos: &Tensor, sin: &Tensor) -> Result<Tensor> {
    let half = x.shape()[3] / 2;
    let (x1, x2) = (x.narrow(-1, 0, half)?, x.narrow(-1, half, half)?);
    // `x1 * cos - x2 * sin`: Python frees the two products as soon as their difference exists,
    // the left one first (a Rust chain would free the right one first).
    let python_order = |left: Tensor, right: Tensor, op: fn(&Tensor, &Tensor) -> Result<Tensor>| {
        let out = op(&left, &right)?;
        drop(left);
        drop(right);
        Ok::<_, TensorError>(out)
    };
    let first = python_order(x1.mul(cos)?, x2.mul(sin)?, |a, b| a.sub(b))?;
    let second = python_order(x1.mul(sin)?, x2.mul(cos)?, |a, b| a.add(b))?;
    python_order(first, second, |a, b| Tensor::cat(&[a, b], -1))
}

/// cos and sin [context, head size / 2] of the rotary angles (base 10,000): buffers.
fn rope_tables(device: &Device, context: usize, head_size: usize, dtype: DType) -> Result<(Tensor, Tensor)> {
    let _no_grad = autograd::no_grad();
    let _scope = device.scope("rope");
    let angles = rotary_angles(device, context, head_size, 10_000.0)?;
    Ok((angles.cos()?.to(dtype)?, angles.sin()?.to(dtype)?))
}

// The run's optimizer order: attention, feed-forward, then the norms.
parameters!(LmBlock { wq, wk, wv, wo, w1, w2, w3, attention_norm, ffn_norm });

parameters!(Lm { tok_embeddings, blocks, norm, output });
