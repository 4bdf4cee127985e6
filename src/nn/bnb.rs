//! bitsandbytes' 4-bit weights as QLoRA loads them (`BitsAndBytesConfig(load_in_4bit=True,
//! bnb_4bit_quant_type="nf4", bnb_4bit_use_double_quant=True,
//! bnb_4bit_compute_dtype=torch.bfloat16)`), written after bitsandbytes 0.49.2:
//!
//! - `Params4bit._quantize` moves the 16-bit weight to the GPU and calls
//!   `functional.quantize_4bit(w, blocksize=64, compress_statistics=True, quant_type="nf4")`,
//!   whose CUDA kernel (`backends/cuda/ops.py`, `bitsandbytes::quantize_4bit`) makes
//!   `absmax = torch.empty((blocks,), float32)` (blocks = ceil(n / 64)) and the packed weight
//!   `out = torch.empty(((n + 1) // 2, 1), uint8)`; then `get_4bit_type("nf4")` makes the code
//!   (`torch.tensor(16 values)`, divided in place by `data.abs().max()`); with double
//!   quantisation `offset = _absmax.mean()` and `quantize_blockwise(_absmax - offset,
//!   blocksize=256)` quantises the absmax to uint8 (`torch.empty_like(A, dtype=uint8)`) with a
//!   float32 absmax per 256 of them, and keeps a copy of the 256-value dynamic map
//!   (`code.to(A.device, copy=True)`); the map itself (`name2qmap["dynamic"]`) is made on the
//!   device once per process. `_absmax`, `_absmax - offset` and the 16-bit weight are freed.
//! - `Linear4bit.forward` runs `bnb.matmul_4bit(x, weight.t(), quant_state)`, i.e.
//!   `MatMul4Bit.apply`: `F.linear(A, F.dequantize_4bit(B, quant_state).to(A.dtype).t(), bias)`.
//!   `dequantize_4bit` first dequantises the absmax (`dequantize_blockwise`: a float32
//!   [blocks], plus the offset in place), then makes the weight, `torch.empty(shape,
//!   dtype=quant_state.dtype)`: an [out, in] temporary in the weight's original type, freed
//!   once the linear has run. The Function saves only the packed weight (`ctx.tensors = (None,
//!   B)`), not its input. Its backward dequantises again for `grad_A = grad_output @ W`.
//!
//! (bitsandbytes 0.50 added a fused `gemm_4bit` kernel that skips the forward's temporary for
//! up to 1,536 rows; its backward still dequantises.)

use crate::autograd;
use crate::device::Device;
use crate::tensor::{DType, Result, Tensor, TensorError};
use crate::trace::Category;

/// How a model's base linears are stored (`quantize`).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Quantize {
    /// In the model's type.
    None,
    /// NF4 with double quantisation, as QLoRA's `BitsAndBytesConfig`.
    Nf4,
}

/// `bnb_4bit_compute_dtype=torch.bfloat16`: the type `Linear4bit` computes in.
pub const COMPUTE_DTYPE_4BIT: DType = DType::BF16;

/// `Params4bit`'s blocksize (`quantize_4bit`'s default, 64 on CUDA).
pub const BLOCKSIZE_4BIT: usize = 64;
/// The blocksize of the double quantisation (`quantize_blockwise(..., blocksize=256)`).
pub const BLOCKSIZE_NESTED: usize = 256;
/// Values in bitsandbytes' dynamic map (`create_dynamic_map()`, float32).
pub const DYNAMIC_MAP_VALUES: usize = 256;
/// Values in the NF4 code (`get_4bit_type("nf4")`, float32).
pub const NF4_VALUES: usize = 16;

/// A weight stored as bitsandbytes stores it for QLoRA, with its `QuantState`.
pub struct Quant4bit {
    /// The weight's shape, [out, in] (`quant_state.shape`).
    pub shape: [usize; 2],
    /// The type the weight had when quantised (`quant_state.dtype`): what dequantising makes.
    pub dtype: DType,
    /// The packed weight (`Params4bit.data`): uint8 [(n + 1) / 2, 1], two 4-bit values a byte.
    pub packed: Tensor,
    /// `quant_state.absmax`: one uint8 per 64-value block (the absmax quantised to 8 bits).
    pub absmax: Tensor,
    /// `quant_state.code`: the NF4 values, float32 [16].
    pub code: Tensor,
    /// `quant_state.offset`: the mean of the absmax, a float32 scalar.
    pub offset: Tensor,
    /// `quant_state.state2.absmax`: float32, one per 256 absmax values.
    pub absmax2: Tensor,
    /// `quant_state.state2.code`: a copy of the dynamic map, float32 [256].
    pub code2: Tensor,
}

/// The bytes a weight of `n` elements keeps in 4 bits with double quantisation, each tensor
/// exact (no allocator rounding): the packed weight, the uint8 absmax, the float32 second-level
/// absmax, the dynamic map's copy, the offset and the NF4 code.
pub fn quant4bit_bytes(n: u64) -> u64 {
    let blocks = n.div_ceil(BLOCKSIZE_4BIT as u64);
    n.div_ceil(2) + blocks + 4 * blocks.div_ceil(BLOCKSIZE_NESTED as u64) + 4 * DYNAMIC_MAP_VALUES as u64 + 4 + 4 * NF4_VALUES as u64
}

/// `name2qmap["dynamic"]`: bitsandbytes' signed dynamic map, made on the device the first time
/// `quantize_blockwise` runs without a code (once per process).
#[track_caller]
pub fn dynamic_map(device: &Device) -> Result<Tensor> {
    let _state = device.category(Category::Parameter);
    device.empty_tensor(&[DYNAMIC_MAP_VALUES], DType::F32, "create_dynamic_map")
}

impl Quant4bit {
    /// `Params4bit._quantize`: quantises `weight` (the 16-bit weight on the device, freed by the
    /// caller once this returns) to NF4 with double quantisation.
    #[track_caller]
    pub fn quantize(weight: &Tensor) -> Result<Quant4bit> {
        let device = weight.device().clone();
        let &[outputs, inputs] = weight.shape() else {
            return Err(TensorError::Shape(format!("quantize_4bit: a linear's weight is 2-D, got {:?}", weight.shape())));
        };
        if !matches!(weight.dtype(), DType::F32 | DType::F16 | DType::BF16) {
            return Err(TensorError::DType(format!(
                "Blockwise 4bit quantization only supports 16/32-bit floats, but got {}",
                weight.dtype().torch_type_name()
            )));
        }
        let _no_grad = autograd::no_grad();
        let _tag = device.category(Category::Parameter);
        let n = outputs * inputs;
        let blocks = n.div_ceil(BLOCKSIZE_4BIT);
        // torch.ops.bitsandbytes.quantize_4bit: absmax, then the packed output.
        let absmax_f32 = device.empty_tensor(&[blocks], DType::F32, "bitsandbytes::quantize_4bit")?;
        let packed = device.empty_tensor(&[n.div_ceil(2), 1], DType::U8, "bitsandbytes::quantize_4bit")?;
        // get_4bit_type("nf4"): torch.tensor(data, device), then data.div_(data.abs().max()).
        let code = device.empty_tensor(&[NF4_VALUES], DType::F32, "get_4bit_type")?;
        drop((device.empty_tensor(&[NF4_VALUES], DType::F32, "abs")?, device.empty_tensor(&[], DType::F32, "max")?));
        // compress_statistics: offset = _absmax.mean(); quantize_blockwise(_absmax - offset, 256).
        let offset = device.empty_tensor(&[], DType::F32, "mean")?;
        let centred = device.empty_tensor(&[blocks], DType::F32, "sub")?;
        let nested = blocks.div_ceil(BLOCKSIZE_NESTED);
        let absmax2 = device.empty_tensor(&[nested], DType::F32, "bitsandbytes::quantize_blockwise")?;
        let absmax = device.empty_tensor(&[blocks], DType::U8, "bitsandbytes::quantize_blockwise")?;
        let code2 = device.empty_tensor(&[DYNAMIC_MAP_VALUES], DType::F32, "to")?;
        // quantize_blockwise returns: its argument goes, then `del _absmax`.
        drop(centred);
        drop(absmax_f32);
        Ok(Quant4bit { shape: [outputs, inputs], dtype: weight.dtype(), packed, absmax, code, offset, absmax2, code2 })
    }

    /// The bytes this weight keeps (exact, without allocator rounding).
    pub fn bytes(&self) -> u64 {
        [&self.packed, &self.absmax, &self.code, &self.offset, &self.absmax2, &self.code2].iter().map(|t| (t.numel() * t.dtype().size()) as u64).sum()
    }

    /// `Linear4bit.forward` with `bnb_4bit_compute_dtype`: x cast to `compute`, `matmul_4bit`
    /// (`MatMul4Bit`), the result cast back to x's type. Simulated only: tensormem has no 4-bit
    /// kernels.
    #[track_caller]
    pub fn linear(&self, x: &Tensor, bias: Option<&Tensor>, compute: DType) -> Result<Tensor> {
        let device = x.device().clone();
        if !device.is_sim() {
            return Err(TensorError::Unsupported(
                "4-bit weights (quantize=4bit) are simulated only: tensormem has no bitsandbytes kernels on the GPU; run on a sim: device".into(),
            ));
        }
        let input_dtype = x.dtype();
        let x = x.to(compute)?;
        let bias = bias.map(|b| b.to(compute)).transpose()?;
        let output = {
            // Inside an autograd.Function's forward nothing is recorded.
            let _no_grad = autograd::no_grad();
            let weight = dequantize(&device, self.shape, self.dtype)?;
            // `.to(A.dtype)`: a copy when the weight was quantised from another type.
            let weight = weight.to(x.dtype())?;
            x.linear(&weight, bias.as_ref())?
        };
        let output = if autograd::records(&[&x]) {
            let (shape, dtype) = (self.shape, self.dtype);
            autograd::record(
                "MatMul4BitBackward",
                &[&x],
                output,
                &[],
                Box::new(move |_saved, g| {
                    // grad_A = grad_output @ dequantize_4bit(B).to(grad_output.dtype).
                    let weight = dequantize(g.device(), shape, dtype)?.to(g.dtype())?;
                    Ok(vec![Some(g.matmul(&weight)?)])
                }),
            )
        } else {
            output
        };
        output.to(input_dtype)
    }
}

/// `F.dequantize_4bit(B, quant_state)` of a weight of `shape` quantised from `dtype`: the absmax
/// dequantised (float32 [blocks], the offset added in place, freed on return), then the weight
/// [out, in] in its original type. Forward and backward both run it.
#[track_caller]
fn dequantize(device: &Device, shape: [usize; 2], dtype: DType) -> Result<Tensor> {
    let blocks = (shape[0] * shape[1]).div_ceil(BLOCKSIZE_4BIT);
    let absmax = device.empty_tensor(&[blocks], DType::F32, "bitsandbytes::dequantize_blockwise")?;
    let weight = device.empty_tensor(&shape, dtype, "bitsandbytes::dequantize_4bit")?;
    drop(absmax);
    Ok(weight)
}
