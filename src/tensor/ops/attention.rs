//! `F.scaled_dot_product_attention(q, k, v, is_causal=True, enable_gqa=True)` as CUDA's flash
//! attention runs it: no [T, T] scores or probabilities, only the output, the log-sum-exp of
//! each row (float32) and the RNG state's seed and offset are made, and saved with q, k and v
//! for backward. Its memory only: the simulation device runs it, the GPU refuses it (no kernel
//! yet).

use crate::tensor::autocast::{self as amp, Policy};
use crate::tensor::graph::{self, Save};
use crate::tensor::{DType, Result, Tensor, TensorError};

/// flash-attn's rounding of the sequence (128) and the head size (32) in its backward buffers.
fn round_up(n: usize, m: usize) -> usize {
    n.div_ceil(m) * m
}

impl Tensor {
    /// Causal attention of q [batch, heads, T, d] over k and v [batch, kv_heads, T, d]
    /// (`kv_heads` divides `heads`: grouped-query attention without repeating k and v), scaled
    /// by 1/sqrt(d). The output is shaped as q, made as `empty_like(q)` (q's layout); the
    /// float32 log-sum-exp [batch, heads, T] is the other allocation. Backward
    /// (`_flash_attention_backward`) makes dq, dk and dv as q, k and v, and while it runs a
    /// float32 softmax_d [batch, heads, T rounded to 128] and dq_accum [batch, T rounded to 128,
    /// heads, d rounded to 32]; with grouped heads dk and dv are first made for every query
    /// head ([batch, T, heads, d]) and summed.
    #[track_caller]
    pub fn scaled_dot_product_attention(&self, k: &Tensor, v: &Tensor) -> Result<Tensor> {
        // Autocast runs it in the lower precision (CUDA's autocast lists it so): q, k, v cast.
        if let Some((cast, _autocast_off)) = amp::cast_inputs(Policy::LowerPrecision, &[self, k, v])? {
            return cast[0].scaled_dot_product_attention(&cast[1], &cast[2]);
        }
        let device = self.device().clone();
        if !device.is_sim() {
            return Err(TensorError::Unsupported(
                "scaled_dot_product_attention (attn=sdpa) is simulated only: run it on a sim: device, or use attn=eager".into(),
            ));
        }
        let (&[b, h, t, d], &[kb, kvh, kt, kd]) = (self.shape(), k.shape()) else {
            return Err(TensorError::Shape(format!("scaled_dot_product_attention takes 4-D q, k, v, got {:?} and {:?}", self.shape(), k.shape())));
        };
        if v.shape() != k.shape() || kb != b || kt != t || kd != d || kvh == 0 || !h.is_multiple_of(kvh) {
            return Err(TensorError::Shape(format!(
                "scaled_dot_product_attention: q {:?}, k {:?}, v {:?} do not match (k and v alike, their heads dividing q's)",
                self.shape(),
                k.shape(),
                v.shape()
            )));
        }
        if self.dtype() != k.dtype() || self.dtype() != v.dtype() {
            return Err(TensorError::DType(format!(
                "Expected query, key, and value to have the same dtype, but got query.dtype: {} key.dtype: {} and value.dtype: {} instead.",
                self.dtype().torch_type_name(),
                k.dtype().torch_type_name(),
                v.dtype().torch_type_name()
            )));
        }
        if !matches!(self.dtype(), DType::F16 | DType::BF16) {
            return Err(TensorError::Unsupported(format!(
                "scaled_dot_product_attention is simulated as CUDA's flash kernel, which takes float16 or bfloat16; {} q, k, v would run the memory-efficient or math kernel (not simulated): use dtype=bfloat16, amp=bfloat16 or attn=eager",
                self.dtype()
            )));
        }
        // As PyTorch 2.11 allocated them on the H100: the RNG state's seed and offset (int64
        // scalars, saved for backward even without dropout), the output, the log-sum-exp, and
        // 256 bytes the launch takes and gives back at once.
        let op = "_scaled_dot_product_flash_attention";
        let seed = device.empty_tensor(&[], DType::I64, op)?;
        let offset = device.empty_tensor(&[], DType::I64, op)?;
        let out = device.empty_tensor(self.shape(), self.dtype(), op)?;
        let lse = device.empty_tensor(&[b, h, t], DType::F32, op)?;
        drop(device.empty_tensor(&[256], DType::U8, op)?);
        if !graph::records(&[self, k, v]) {
            return Ok(out);
        }
        let dtype = self.dtype();
        // Released in this order after backward, as PyTorch's node releases them.
        let saves = [
            Some(Save::Input(self)),
            Some(Save::Input(k)),
            Some(Save::Input(v)),
            Some(Save::Input(&lse)),
            Some(Save::Output),
            Some(Save::Input(&offset)),
            Some(Save::Input(&seed)),
        ];
        Ok(graph::record(
            "ScaledDotProductFlashAttentionBackward0",
            &[self, k, v],
            out,
            &saves,
            Box::new(move |saved, _g| {
                let device = saved[0].as_ref().expect("saved").device().clone();
                let op = "_scaled_dot_product_flash_attention_backward";
                // As q, k, v: [batch, T, heads, d] transposed to [batch, heads, T, d].
                let made_as = |heads: usize| -> Result<Tensor> { device.empty_tensor(&[b, t, heads, d], dtype, op)?.transpose(1, 2) };
                let (dq, dk, dv) = (made_as(h)?, made_as(kvh)?, made_as(kvh)?);
                let expanded =
                    if kvh != h { Some((device.empty_tensor(&[b, t, h, d], dtype, op)?, device.empty_tensor(&[b, t, h, d], dtype, op)?)) } else { None };
                let softmax_d = device.empty_tensor(&[b, h, round_up(t, 128)], DType::F32, op)?;
                let dq_accum = device.empty_tensor(&[b, round_up(t, 128), h, round_up(d, 32)], DType::F32, op)?;
                drop((softmax_d, dq_accum, expanded));
                Ok(vec![Some(dq), Some(dk), Some(dv)])
            }),
        ))
    }
}
