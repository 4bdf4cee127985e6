//! Causal multi-head self-attention, written out as PyTorch code without a fused kernel writes
//! it: the [batch, heads, T, T] scores and probabilities are real allocations that autograd
//! keeps (the T^2 term of a transformer's activation memory).

use super::{Init, Linear, Module, child};
use crate::autograd;
use crate::device::Device;
use crate::tensor::{DType, Result, Tensor, TensorError};

/// Where a token's position enters attention.
#[derive(Debug, Clone, Copy, PartialEq)]
pub enum PositionEncoding {
    /// Outside attention (GPT-2 adds learned position embeddings to the input).
    None,
    /// Rotary embeddings on queries and keys, with base `theta` (10,000 in RoFormer and Llama).
    Rope { theta: f64 },
}

/// The query, key and value projections: three linears, or GPT-2's one `c_attn` split three ways.
enum Projections {
    Separate { q: Linear, k: Linear, v: Linear },
    Fused(Linear),
}

pub struct CausalSelfAttention {
    pub name: String,
    projections: Projections,
    pub out: Linear,
    pub heads: usize,
    /// Dropout on the attention probabilities (in training).
    pub dropout: f64,
    /// The causal mask and the rotary tables for the longest sequence: registered buffers,
    /// made with the module; a shorter sequence uses their top-left corner (a view).
    buffers: Buffers,
}

struct Buffers {
    context: usize,
    mask: Tensor,
    rope: Option<(Tensor, Tensor)>,
}

impl CausalSelfAttention {
    /// Separate q, k, v and output projections of `dim` features (`q_proj`, `k_proj`,
    /// `v_proj`, `o_proj`), as Llama names them, for sequences up to `context`.
    #[track_caller]
    #[allow(clippy::too_many_arguments)]
    pub fn new(
        device: &Device,
        name: &str,
        dim: usize,
        heads: usize,
        context: usize,
        bias: bool,
        positions: PositionEncoding,
        dtype: DType,
    ) -> Result<CausalSelfAttention> {
        check_heads(name, dim, heads, positions)?;
        let linear = |n: &str| Linear::new(device, &child(name, n), dim, dim, bias, dtype);
        let projections = Projections::Separate { q: linear("q_proj")?, k: linear("k_proj")?, v: linear("v_proj")? };
        let out = linear("o_proj")?;
        let buffers = Buffers::new(device, name, context, dim / heads, positions, dtype)?;
        Ok(CausalSelfAttention { name: name.to_string(), projections, out, heads, dropout: 0.0, buffers })
    }

    /// GPT-2's layout: one `c_attn` projection to 3 x dim, split into q, k and v; `c_proj` out.
    #[track_caller]
    pub fn fused(device: &Device, name: &str, dim: usize, heads: usize, context: usize, init: Init, dtype: DType) -> Result<CausalSelfAttention> {
        let positions = PositionEncoding::None;
        check_heads(name, dim, heads, positions)?;
        let c_attn = Linear::with_init(device, &child(name, "c_attn"), dim, 3 * dim, true, dtype, init)?;
        let c_proj = Linear::with_init(device, &child(name, "c_proj"), dim, dim, true, dtype, init)?;
        let buffers = Buffers::new(device, name, context, dim / heads, positions, dtype)?;
        Ok(CausalSelfAttention { name: name.to_string(), projections: Projections::Fused(c_attn), out: c_proj, heads, dropout: 0.0, buffers })
    }

    /// x [batch, T, dim] -> [batch, T, dim].
    #[track_caller]
    pub fn forward(&self, x: &Tensor, training: bool) -> Result<Tensor> {
        let _scope = x.device().module_scope(&self.name);
        let [b, t, c] = x.shape() else {
            return Err(TensorError::Shape(format!("{}: input must be [batch, T, features], got {:?}", self.name, x.shape())));
        };
        if *t > self.buffers.context {
            return Err(TensorError::Shape(format!("{}: a sequence of {t} is longer than the context of {}", self.name, self.buffers.context)));
        }
        let (b, t, c) = (*b as isize, *t as isize, *c as isize);
        let (h, d) = (self.heads as isize, c / self.heads as isize);
        let (q, k, v) = match &self.projections {
            Projections::Separate { q, k, v } => (q.forward(x)?, k.forward(x)?, v.forward(x)?),
            Projections::Fused(c_attn) => {
                let qkv = c_attn.forward(x)?;
                (qkv.narrow(2, 0, c as usize)?, qkv.narrow(2, c as usize, c as usize)?, qkv.narrow(2, 2 * c as usize, c as usize)?)
            }
        };
        // [batch, heads, T, head size]: views.
        let heads = |p: Tensor| p.view(&[b, t, h, d])?.transpose(1, 2);
        let (q, k, v) = (heads(q)?, heads(k)?, heads(v)?);
        let (q, k) = match &self.buffers.rope {
            Some((cos, sin)) => {
                let (cos, sin) = (cos.narrow(0, 0, t as usize)?, sin.narrow(0, 0, t as usize)?);
                (rotate(&q, &cos, &sin)?, rotate(&k, &cos, &sin)?)
            }
            None => (q, k),
        };
        let mask = self.buffers.mask.narrow(0, 0, t as usize)?.narrow(1, 0, t as usize)?;
        let scores = q.matmul(&k.transpose(-2, -1)?)?.mul_scalar(1.0 / (d as f64).sqrt())?;
        // Python frees a temporary when the call it was passed to returns (a Rust temporary lives
        // to the end of the statement): the masked scores go before dropout runs.
        let masked = scores.masked_fill(&mask, f64::NEG_INFINITY)?;
        let weights = masked.softmax(-1)?;
        drop(masked);
        let probs = weights.dropout(self.dropout, training)?;
        drop(weights);
        let y = probs.matmul(&v)?.transpose(1, 2)?.contiguous()?.view(&[b, t, c])?;
        self.out.forward(&y)
    }
}

fn check_heads(name: &str, dim: usize, heads: usize, positions: PositionEncoding) -> Result<()> {
    if heads == 0 || !dim.is_multiple_of(heads) {
        return Err(TensorError::Shape(format!("{name}: {dim} features do not split into {heads} heads")));
    }
    if matches!(positions, PositionEncoding::Rope { .. }) && !(dim / heads).is_multiple_of(2) {
        return Err(TensorError::Shape(format!("{name}: rotary embeddings need an even head size, got {}", dim / heads)));
    }
    Ok(())
}

impl Buffers {
    /// The mask (bool [context, context]) and, for RoPE, the cos and sin tables.
    fn new(device: &Device, name: &str, context: usize, head_size: usize, positions: PositionEncoding, dtype: DType) -> Result<Buffers> {
        let _no_grad = autograd::no_grad();
        let _scope = device.module_scope(name);
        // Position j is hidden from query i when j > i.
        let at = device.arange(context, DType::I32)?;
        let mask = at.view(&[1, context as isize])?.gt(&at.view(&[context as isize, 1])?)?;
        let rope = match positions {
            PositionEncoding::Rope { theta } => Some(rope_tables(device, context, head_size, theta, dtype)?),
            PositionEncoding::None => None,
        };
        Ok(Buffers { context, mask, rope })
    }
}

/// The rotary angles [T, head size / 2]: position * theta^(-2i / head size) for each of the
/// head's frequency pairs.
pub(super) fn rotary_angles(device: &Device, t: usize, d: usize, theta: f64) -> Result<Tensor> {
    let half = d / 2;
    let inverse: Vec<f32> = (0..half).map(|i| theta.powf(-2.0 * i as f64 / d as f64) as f32).collect();
    let frequencies = device.from_slice(&inverse, &[1, half])?;
    device.arange(t, DType::F32)?.view(&[t as isize, 1])?.mul(&frequencies)
}

/// cos and sin [T, head size] of the rotary angles, each frequency used for both halves (the
/// rotate-half form).
fn rope_tables(device: &Device, t: usize, d: usize, theta: f64, dtype: DType) -> Result<(Tensor, Tensor)> {
    let angles = rotary_angles(device, t, d, theta)?;
    let angles = Tensor::cat(&[&angles, &angles], 1)?;
    Ok((angles.cos()?.to(dtype)?, angles.sin()?.to(dtype)?))
}

/// x * cos + rotate_half(x) * sin, where rotate_half(x) = cat(-x2, x1) over the halves.
#[track_caller]
pub(super) fn rotate(x: &Tensor, cos: &Tensor, sin: &Tensor) -> Result<Tensor> {
    let d = *x.shape().last().expect("4-D");
    let (x1, x2) = (x.narrow(-1, 0, d / 2)?, x.narrow(-1, d / 2, d / 2)?);
    let rotated = Tensor::cat(&[&x2.neg()?, &x1], -1)?;
    x.mul(cos)?.add(&rotated.mul(sin)?)
}

impl Module for Projections {
    fn visit_parameters(&self, visit: &mut dyn FnMut(String, &Tensor)) {
        match self {
            Projections::Separate { q, k, v } => [q, k, v].iter().for_each(|l| l.visit_parameters(visit)),
            Projections::Fused(c_attn) => c_attn.visit_parameters(visit),
        }
    }
}

parameters!(CausalSelfAttention { projections, out });
