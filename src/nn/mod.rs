//! Layers with PyTorch's memory. A module allocates its parameters when it is built (tagged
//! `parameter`, as leaves that require grad) and runs its forward under its own scope, named
//! by its path in the model as `named_parameters()` names it (`h.3.attn.q_proj`), so that every
//! allocation it causes, backward included, carries that name in its frames.

#[macro_use]
mod parameters;

mod attention;
pub mod bnb;
mod hf;
mod lm;
mod loss;
mod model;
pub mod optim;
pub mod parallel;

pub use attention::{CausalSelfAttention, PositionEncoding};
pub use bnb::{Quant4bit, Quantize};
pub use hf::{
    AttentionImplementation, Family, HF_PRESETS, HfConfig, HfModel, HfRmsNorm, KV_CACHE_SCOPES, KvCache, LORA_TARGETS, LlamaDecoderLayer, LlamaForCausalLM,
    LoraAdapter, LoraConfig, Projection,
};
pub use lm::{LM_SIZE_NAMES, LM_SIZES, Lm, LmBlock, LmConfig};
pub use loss::{cross_entropy, mse_loss};
pub use model::{Architecture, Transformer, TransformerConfig};
pub use parameters::{Field, Module, child};

use crate::device::Device;
use crate::tensor::{DType, Result, Tensor, TensorError};
use crate::trace::Category;

/// How a parameter starts: what its PyTorch module's `reset_parameters` draws.
#[derive(Debug, Clone, Copy)]
pub enum Init {
    /// Normal(0, std): Embedding (std 1), GPT-2's linears (0.02).
    Normal(f64),
    /// Uniform(-bound, bound): Linear's kaiming_uniform with a = sqrt(5) is bound 1/sqrt(in).
    Uniform(f64),
    Ones,
    Zeros,
}

/// A new parameter: one allocation, initialised in place, then marked as requiring grad. Under
/// [`Device::defer_parameters`] it has a shape and no memory (its strategy holds the memory).
#[track_caller]
pub fn parameter(device: &Device, shape: &[usize], dtype: DType, init: Init) -> Result<Tensor> {
    let _tag = device.category(Category::Parameter);
    let p = match init {
        _ if device.parameters_deferred() => device.unbacked(shape, dtype)?,
        Init::Normal(std) => {
            let p = device.randn(shape, dtype)?;
            p.mul_scalar_(std)?;
            p
        }
        Init::Uniform(bound) => {
            let p = device.rand(shape, dtype)?;
            p.mul_scalar_(2.0 * bound)?.sub_scalar_(bound)?;
            p
        }
        Init::Ones => device.ones(shape, dtype)?,
        Init::Zeros => device.zeros(shape, dtype)?,
    };
    p.requires_grad_(true)?;
    Ok(p)
}

/// `nn.Linear`: y = x @ weight.T + bias, weight [out, in].
pub struct Linear {
    pub name: String,
    pub weight: Tensor,
    pub bias: Option<Tensor>,
}

impl Linear {
    /// With PyTorch's default initialisation (uniform in +-1/sqrt(in) for both).
    #[track_caller]
    pub fn new(device: &Device, name: &str, inputs: usize, outputs: usize, bias: bool, dtype: DType) -> Result<Linear> {
        let bound = 1.0 / (inputs.max(1) as f64).sqrt();
        Linear::with_init(device, name, inputs, outputs, bias, dtype, Init::Uniform(bound))
    }

    /// With the weight drawn from `init` and the bias zero (GPT-2's initialisation).
    #[track_caller]
    pub fn with_init(device: &Device, name: &str, inputs: usize, outputs: usize, bias: bool, dtype: DType, init: Init) -> Result<Linear> {
        let weight = parameter(device, &[outputs, inputs], dtype, init)?;
        let bias_init = if matches!(init, Init::Uniform(_)) { init } else { Init::Zeros };
        let bias = if bias { Some(parameter(device, &[outputs], dtype, bias_init)?) } else { None };
        Ok(Linear { name: name.to_string(), weight, bias })
    }

    /// `F.linear` (see `Tensor::linear`).
    #[track_caller]
    pub fn forward(&self, x: &Tensor) -> Result<Tensor> {
        let _scope = x.device().module_scope(&self.name);
        let inputs = self.weight.shape()[1];
        if x.shape().last() != Some(&inputs) {
            return Err(TensorError::Shape(format!("{}: input {:?} does not end in {inputs} features", self.name, x.shape())));
        }
        x.linear(&self.weight, self.bias.as_ref())
    }
}

parameters!(Linear in name { weight, bias });

/// `nn.Embedding`: rows of a [count, dim] table picked by int64 ids.
pub struct Embedding {
    pub name: String,
    pub weight: Tensor,
}

impl Embedding {
    #[track_caller]
    pub fn new(device: &Device, name: &str, count: usize, dim: usize, dtype: DType, init: Init) -> Result<Embedding> {
        Ok(Embedding { name: name.to_string(), weight: parameter(device, &[count, dim], dtype, init)? })
    }

    #[track_caller]
    pub fn forward(&self, ids: &Tensor) -> Result<Tensor> {
        let _scope = ids.device().module_scope(&self.name);
        self.weight.embedding(ids)
    }
}

parameters!(Embedding in name { weight });

/// `nn.LayerNorm` over the last dimension, with weight (ones) and bias (zeros).
pub struct LayerNorm {
    pub name: String,
    pub weight: Tensor,
    pub bias: Tensor,
    pub eps: f64,
}

impl LayerNorm {
    #[track_caller]
    pub fn new(device: &Device, name: &str, dim: usize, dtype: DType) -> Result<LayerNorm> {
        let weight = parameter(device, &[dim], dtype, Init::Ones)?;
        let bias = parameter(device, &[dim], dtype, Init::Zeros)?;
        Ok(LayerNorm { name: name.to_string(), weight, bias, eps: 1e-5 })
    }

    #[track_caller]
    pub fn forward(&self, x: &Tensor) -> Result<Tensor> {
        let _scope = x.device().module_scope(&self.name);
        x.layer_norm(&self.weight, &self.bias, self.eps)
    }
}

parameters!(LayerNorm in name { weight, bias });

/// `nn.RMSNorm` over the last dimension, as PyTorch's `F.rms_norm` composes it:
/// `x * rsqrt(x.pow(2).mean(-1, keepdim=True).add_(eps)) * weight`.
pub struct RmsNorm {
    pub name: String,
    pub weight: Tensor,
    pub eps: f64,
}

impl RmsNorm {
    #[track_caller]
    pub fn new(device: &Device, name: &str, dim: usize, eps: f64, dtype: DType) -> Result<RmsNorm> {
        Ok(RmsNorm { name: name.to_string(), weight: parameter(device, &[dim], dtype, Init::Ones)?, eps })
    }

    #[track_caller]
    pub fn forward(&self, x: &Tensor) -> Result<Tensor> {
        let _scope = x.device().module_scope(&self.name);
        // Llama's `x * torch.rsqrt(x.pow(2).mean(-1, keepdim=True) + eps) * weight`. Python
        // frees each temporary as soon as the next op has its result (a Rust chain would keep
        // them to the end of the statement, and the cache would place later blocks elsewhere).
        let mean_square = x.pow_scalar(2.0)?.mean(&[-1], true)?;
        let shifted = mean_square.add_scalar(self.eps)?;
        drop(mean_square);
        let rstd = shifted.rsqrt()?;
        drop(shifted);
        let normed = x.mul(&rstd)?;
        drop(rstd);
        normed.mul(&self.weight)
    }
}

parameters!(RmsNorm in name { weight });

/// The feed-forward half of a transformer block.
pub enum Mlp {
    /// `c_proj(act(c_fc(x)))`, GPT-2's (with GELU).
    Plain { fc: Linear, proj: Linear, activation: Activation },
    /// SwiGLU: `w2(silu(w1(x)) * w3(x))`, Llama's.
    SwiGlu { w1: Linear, w2: Linear, w3: Linear },
}

/// An elementwise activation (`nn.GELU`, `nn.SiLU`, `nn.ReLU`).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Activation {
    Gelu,
    /// transformers' `NewGELUActivation` (GPT-2's `gelu_new`), written out in Python ops:
    /// `0.5 * x * (1 + tanh(sqrt(2 / pi) * (x + 0.044715 * x^3)))`; autograd keeps x, the tanh,
    /// `0.5 * x` and `1 + tanh`.
    GeluNew,
    Silu,
    Relu,
}

impl Activation {
    #[track_caller]
    pub fn forward(self, x: &Tensor) -> Result<Tensor> {
        match self {
            Activation::Gelu => x.gelu(),
            Activation::GeluNew => {
                let inner = x.add(&x.pow_scalar(3.0)?.mul_scalar(0.044715)?)?.mul_scalar((2.0 / std::f64::consts::PI).sqrt())?;
                x.mul_scalar(0.5)?.mul(&inner.tanh()?.add_scalar(1.0)?)
            }
            Activation::Silu => x.silu(),
            Activation::Relu => x.relu(),
        }
    }
}

impl Mlp {
    #[track_caller]
    pub fn forward(&self, x: &Tensor) -> Result<Tensor> {
        match self {
            // Each statement ends where Python's call returns, which frees the arguments it was
            // passed (what autograd does not keep): a Rust temporary would live to the end of a
            // chained statement, after the next allocation.
            Mlp::Plain { fc, proj, activation } => {
                let hidden = activation.forward(&fc.forward(x)?)?;
                proj.forward(&hidden)
            }
            Mlp::SwiGlu { w1, w2, w3 } => {
                let gate = w1.forward(x)?.silu()?;
                let up = w3.forward(x)?;
                let hidden = gate.mul(&up)?;
                drop((gate, up));
                w2.forward(&hidden)
            }
        }
    }
}

impl Module for Mlp {
    fn visit_parameters(&self, visit: &mut dyn FnMut(String, &Tensor)) {
        match self {
            Mlp::Plain { fc, proj, .. } => [fc, proj].iter().for_each(|l| l.visit_parameters(visit)),
            Mlp::SwiGlu { w1, w2, w3 } => [w1, w2, w3].iter().for_each(|l| l.visit_parameters(visit)),
        }
    }
}

/// A norm layer: LayerNorm (GPT-2) or RMSNorm (Llama).
pub enum Norm {
    Layer(LayerNorm),
    Rms(RmsNorm),
}

impl Norm {
    #[track_caller]
    pub fn forward(&self, x: &Tensor) -> Result<Tensor> {
        match self {
            Norm::Layer(n) => n.forward(x),
            Norm::Rms(n) => n.forward(x),
        }
    }
}

impl Module for Norm {
    fn visit_parameters(&self, visit: &mut dyn FnMut(String, &Tensor)) {
        match self {
            Norm::Layer(n) => n.visit_parameters(visit),
            Norm::Rms(n) => n.visit_parameters(visit),
        }
    }
}

/// A pre-norm transformer block: `x + attn(norm1(x))`, then `x + mlp(norm2(x))`.
pub struct Block {
    pub name: String,
    pub norm1: Norm,
    pub attn: CausalSelfAttention,
    pub norm2: Norm,
    pub mlp: Mlp,
    /// Dropout after the attention and the MLP (in training).
    pub dropout: f64,
}

impl Block {
    #[track_caller]
    pub fn forward(&self, x: &Tensor, training: bool) -> Result<Tensor> {
        let _scope = x.device().module_scope(&self.name);
        // As Python runs `x = x + F.dropout(self.attn(self.norm1(x)))`: each call's arguments
        // go when it returns, before the next allocation.
        let attended = self.attn.forward(&self.norm1.forward(x)?, training)?;
        let dropped = attended.dropout(self.dropout, training)?;
        drop(attended);
        let x = x.add(&dropped)?;
        drop(dropped);
        let transformed = self.mlp.forward(&self.norm2.forward(&x)?)?;
        let dropped = transformed.dropout(self.dropout, training)?;
        drop(transformed);
        x.add(&dropped)
    }
}

parameters!(Block { norm1, attn, norm2, mlp });

/// `nn.LSTMCell`: one step of an LSTM, `(h, c) = cell(x, (h, c))`. Carrying `h` and `c` from
/// step to step without `detach()` keeps every step's graph alive: the hidden-state pitfall.
pub struct LstmCell {
    pub name: String,
    pub input: Linear,
    pub hidden: Linear,
}

impl LstmCell {
    #[track_caller]
    pub fn new(device: &Device, name: &str, inputs: usize, hidden: usize, dtype: DType) -> Result<LstmCell> {
        let bound = 1.0 / (hidden.max(1) as f64).sqrt();
        let linear = |n: &str, i: usize| Linear::with_init(device, &child(name, n), i, 4 * hidden, true, dtype, Init::Uniform(bound));
        Ok(LstmCell { name: name.to_string(), input: linear("ih", inputs)?, hidden: linear("hh", hidden)? })
    }

    /// The next hidden and cell states from the input [batch, inputs] and the current states
    /// [batch, hidden]. Gates in PyTorch's order: input, forget, cell, output.
    #[track_caller]
    pub fn forward(&self, x: &Tensor, h: &Tensor, c: &Tensor) -> Result<(Tensor, Tensor)> {
        let _scope = x.device().module_scope(&self.name);
        let gates = self.input.forward(x)?.add(&self.hidden.forward(h)?)?;
        let n = h.shape()[1];
        let gate = |k: usize| gates.narrow(1, k * n, n);
        let (i, f, g, o) = (gate(0)?.sigmoid()?, gate(1)?.sigmoid()?, gate(2)?.tanh()?, gate(3)?.sigmoid()?);
        let c = f.mul(c)?.add(&i.mul(&g)?)?;
        let h = o.mul(&c.tanh()?)?;
        Ok((h, c))
    }
}

parameters!(LstmCell { input, hidden });
