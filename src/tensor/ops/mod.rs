//! Ops with PyTorch's names and broadcasting, by kernel family. Each reads strided inputs
//! directly; each output is one allocation; in-place ops allocate nothing. On the simulation
//! device the same allocations happen and the kernels are skipped.

mod attention;
mod cuda_embedding;
mod cuda_reduce;
mod elementwise;
mod factory;
mod fused;
mod index;
mod matmul;
mod random;
mod reduce;
mod rows;

pub(crate) use crate::kernels::elementwise::Unary;

use super::layout::{Layout, MAX_DIMS};
use super::{DType, Result, Tensor, TensorError};
use crate::device::Bindings;
use crate::kernels::meta::META_DIMS;
use crate::kernels::{Strided, WgslScalar};

/// The value type of `dtype` in kernels (f32 stands in for f16 when checking before a device
/// is involved); errors name the dtypes that run on the GPU.
fn values(dtype: DType, device: &crate::device::Device) -> Result<WgslScalar> {
    let native = device.adapter().is_none_or(|a| a.native_f16);
    Ok(WgslScalar::of(dtype, native)?)
}

/// Binds the operands (in order) for one dispatch.
fn bind(tensors: &[&Tensor]) -> Result<Bindings> {
    let args = tensors
        .iter()
        .map(|t| t.arg()?.ok_or_else(|| TensorError::Unsupported("an empty tensor cannot be a kernel operand".into())))
        .collect::<Result<Vec<_>>>()?;
    Ok(Bindings::new(&args, &tensors.iter().map(|t| t.dtype.size() as u64).collect::<Vec<_>>())?)
}

/// A layout as kernel metadata; `base` is where the operand starts in its binding.
fn strided(l: &Layout, base: u32) -> Strided {
    let mut strides = [0; META_DIMS];
    for (s, &l) in strides.iter_mut().zip(&l.strides) {
        *s = l as u32;
    }
    Strided { offset: base + l.offset as u32, strides }
}

/// A shape as kernel metadata (unused dimensions 1).
fn shape_meta(shape: &[usize]) -> [u32; META_DIMS] {
    let mut out = [1; META_DIMS];
    for (o, &n) in out.iter_mut().zip(shape) {
        *o = n as u32;
    }
    out
}

// The metadata has room for every dimension a tensor may have.
const _: () = assert!(MAX_DIMS == META_DIMS);

fn check_u32(t: &Tensor) -> Result<()> {
    if t.layout.storage_span() > u32::MAX as usize {
        return Err(TensorError::Unsupported(format!("tensor of {} elements: kernels index with 32 bits", t.layout.storage_span())));
    }
    Ok(())
}

impl Tensor {
    /// Refuses integer and bool tensors where PyTorch requires a floating dtype.
    pub(super) fn float_only(&self, op: &str) -> Result<()> {
        if !self.dtype.is_float() {
            return Err(TensorError::DType(format!("{op} of {} tensors: PyTorch requires a floating dtype", self.dtype)));
        }
        Ok(())
    }

    fn same_device(&self, other: &Tensor) -> Result<()> {
        if self.device() != other.device() {
            return Err(TensorError::Unsupported("tensors are on different devices".into()));
        }
        Ok(())
    }

    /// Whether the op writing `self` from `inputs` launches a kernel: on a GPU, when there is
    /// anything to write. The sim device launches nothing; it charges its modelled clock by the
    /// bytes the op moves (`self` written, each input read once) and by `flops`. Only matmul
    /// passes FLOPs: the other ops do a few per element, far below any card's FLOP-per-byte
    /// balance (20 for f32 on an H100), so their bytes bound them.
    pub(super) fn launches(&self, inputs: &[&Tensor], flops: u64) -> bool {
        let device = self.device();
        if !device.is_sim() {
            return self.numel() > 0;
        }
        // In u64: on wasm32 a usize product wraps at 4 GiB, and the sim device's tensors go far beyond.
        let bytes = std::iter::once(self).chain(inputs.iter().copied()).map(|t| t.numel() as u64 * t.dtype.size() as u64).sum();
        device.model_op(bytes, flops, matches!(self.dtype, DType::F16 | DType::BF16));
        false
    }
}
