//! LoRA as PEFT injects it: a `Projection` is a linear with, where targeted, its adapter.

use super::*;

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
        // `result = result + lora_B(lora_A(x)) * scaling`, freeing as Python does: lora_A's
        // output when lora_B returns, lora_B's once scaled, the scaled one once summed, then
        // the base's result as the name is rebound; the sum when `.to` rebinds it again.
        let delta = lora.b.forward(&lora.a.forward(&x)?)?;
        let _scope = x.device().module_scope(&lora.b.name);
        let scaled = delta.mul_scalar(lora.scaling)?;
        drop(delta);
        let sum = result.add(&scaled)?;
        drop((scaled, result));
        let out = sum.to(result_dtype)?;
        drop(sum);
        Ok(out)
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
    pub(super) fn quantize(&mut self) -> Result<()> {
        let quant = Quant4bit::quantize(&self.base.weight)?;
        self.base.weight = quant.packed.share();
        self.quant = Some(quant);
        Ok(())
    }

    /// Adds an adapter as PEFT injects it: `lora_A` with nn.Linear's initialisation, `lora_B`
    /// zeros, made on the CPU and moved to the base's device in the base's floating-point type
    /// (`_move_adapter_to_device_of_base_layer`); the base layer is renamed `...base_layer`.
    /// A float16 or bfloat16 adapter becomes float32 later, when the whole model is wrapped
    /// (`cast_adapter_to_float32`).
    #[track_caller]
    pub(super) fn add_lora(&mut self, device: &Device, rank: usize, alpha: f64) -> Result<()> {
        let name = self.base.name.clone();
        let [outputs, inputs] = self.shape();
        // A 4-bit base's weight is uint8: PEFT leaves the adapters in float32 (it casts only to
        // a floating-point base type).
        let mut dtype = self.quant.as_ref().map_or(self.base.weight.dtype(), |_| DType::F32);
        if device.parameters_deferred() {
            // No memory behind the parameters yet: they are made in their final type.
            dtype = float32_adapter(dtype);
        }
        let a = Linear::new(device, &child(&name, "lora_A.default"), inputs, rank, false, dtype)?;
        let b = Linear::with_init(device, &child(&name, "lora_B.default"), rank, outputs, false, dtype, Init::Zeros)?;
        self.base.name = child(&name, "base_layer");
        self.lora = Some(LoraAdapter { a, b, scaling: alpha / rank as f64 });
        Ok(())
    }

    /// PeftModel's `_cast_adapter_dtype` (`autocast_adapter_dtype=True`): each float16 or
    /// bfloat16 weight of the adapter, `lora_A` then `lora_B`, becomes float32 by
    /// `param.data = param.data.to(torch.float32)`: the copy first, then the old one freed.
    #[track_caller]
    pub(super) fn cast_adapter_to_float32(&mut self) -> Result<()> {
        let Some(lora) = &mut self.lora else { return Ok(()) };
        for linear in [&mut lora.a, &mut lora.b] {
            let dtype = float32_adapter(linear.weight.dtype());
            if dtype != linear.weight.dtype() {
                let _no_grad = autograd::no_grad();
                let weight = linear.weight.to(dtype)?;
                weight.requires_grad_(true)?;
                linear.weight = weight;
            }
        }
        Ok(())
    }
}

/// The type PEFT keeps an adapter in: float32 for a float16 or bfloat16 one.
fn float32_adapter(dtype: DType) -> DType {
    match dtype {
        DType::F16 | DType::BF16 => DType::F32,
        other => other,
    }
}

parameters!(LoraAdapter { a, b });
parameters!(Projection { base, lora });
