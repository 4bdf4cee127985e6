//! Autocast, in the tensor layer as PyTorch keeps it a dispatch key inside ATen (`crate::amp`
//! is its public face). Mixed precision as PyTorch's `torch.amp` does it: an autocast scope in which ops cast their
//! inputs by the op's policy (matmuls to f16, exp, log, losses and norms to f32), keeping the
//! f16 copies of the weights it cast until the outermost scope ends (its cast cache), and a
//! gradient scaler for the loss (`nn::optim::GradScaler`: it steps optimizers, so it lives
//! with them).
//!
//! Ops apply their policy at entry, as PyTorch's `Autocast` dispatch key does before autograd
//! records anything: casts are recorded ops (`ToCopyBackward0`), and an op saves its f16 inputs
//! for backward, not the f32 ones. While the op then runs, autocast is off, so the ops it is
//! made of do not cast again (PyTorch redispatches below the key).

use super::{DType, Result, Tensor};
use std::cell::{Cell, RefCell};
use std::collections::BTreeMap;

thread_local! {
    /// The lower-precision type ops cast to; None outside autocast (or in a disabled scope).
    static DTYPE: Cell<Option<DType>> = const { Cell::new(None) };
    /// Autocast scopes entered and not yet left (enabled or not), as PyTorch's nesting count.
    static NESTING: Cell<usize> = const { Cell::new(0) };
    /// Set while an op that applied its policy runs.
    static EXCLUDED: Cell<bool> = const { Cell::new(false) };
    /// The cast cache: f32 weights (leaves that require grad) by id, to their f16 copies.
    /// Ordered, so that the copies are freed in the same order on every device (ids differ).
    static CACHE: RefCell<BTreeMap<u64, Tensor>> = const { RefCell::new(BTreeMap::new()) };
}

/// An autocast scope; leaving it restores the scope before, and leaving the outermost one
/// frees the cached casts.
#[must_use = "autocast holds only while the guard lives"]
pub struct Autocast {
    before: Option<DType>,
}

impl Drop for Autocast {
    fn drop(&mut self) {
        let left = NESTING.with(|n| {
            n.set(n.get() - 1);
            n.get()
        });
        if left == 0 {
            // Taken out first: dropping the casts frees memory, which may log.
            let cached = CACHE.with(|c| std::mem::take(&mut *c.borrow_mut()));
            drop(cached);
        }
        DTYPE.with(|d| d.set(self.before));
    }
}

fn enter(dtype: Option<DType>) -> Autocast {
    NESTING.with(|n| n.set(n.get() + 1));
    Autocast { before: DTYPE.with(|d| d.replace(dtype)) }
}

/// `torch.autocast("cuda", dtype)`: ops in the scope run in `dtype` (float16 or bfloat16)
/// where PyTorch's autocast runs them in lower precision.
pub fn autocast(dtype: DType) -> Result<Autocast> {
    if !matches!(dtype, DType::F16 | DType::BF16) {
        return Err(super::TensorError::DType(format!(
            "In CUDA autocast, but the target dtype is not supported. Disabling autocast. CUDA Autocast only supports dtypes of torch.float16 and torch.bfloat16 currently (got {dtype})."
        )));
    }
    Ok(enter(Some(dtype)))
}

/// `torch.autocast("cuda", enabled=False)`: ops inside run in their inputs' types.
pub fn autocast_disabled() -> Autocast {
    enter(None)
}

/// Whether ops now cast (`torch.is_autocast_enabled()`).
pub fn is_autocast_enabled() -> bool {
    DTYPE.with(Cell::get).is_some()
}

/// Bytes the cast cache holds (each cast's storage).
pub fn cached_bytes() -> u64 {
    CACHE.with(|c| c.borrow().values().map(Tensor::storage_bytes).sum())
}

/// Autocast stays off while this lives: the op that applied its policy is running.
pub(crate) struct Excluded {
    before: bool,
}

impl Drop for Excluded {
    fn drop(&mut self) {
        EXCLUDED.with(|e| e.set(self.before));
    }
}

/// The autocast dtype if an op entered now should apply its policy, with autocast excluded
/// for the op's own run.
fn applies() -> Option<(DType, Excluded)> {
    let dtype = DTYPE.with(Cell::get)?;
    if EXCLUDED.with(Cell::get) {
        return None;
    }
    Some((dtype, Excluded { before: EXCLUDED.with(|e| e.replace(true)) }))
}

/// Autocast's op lists (`autocast_mode.h`), as far as tensormem has the ops.
#[derive(Clone, Copy)]
pub(crate) enum Policy {
    /// `lower_precision_fp`: mm, bmm, addmm, matmul, linear: every float input to the autocast
    /// dtype, weights through the cache.
    LowerPrecision,
    /// `fp32`: exp, log, rsqrt, pow, layer_norm, mse_loss: float inputs to f32.
    Fp32,
}

/// Autocast's eligible inputs: floating point, not double.
fn eligible(t: &Tensor) -> bool {
    t.dtype().is_float() && t.dtype() != DType::F64
}

/// The inputs of an op with `policy` as autocast hands them to the op, and the guard that
/// keeps autocast off while the op runs; None when autocast does not apply. Casts are
/// ordinary recorded `to` ops; an f32 weight (a leaf that requires grad, not a view) cast to
/// the autocast dtype is cached, so every use in the scope shares one copy.
#[track_caller]
pub(crate) fn cast_inputs(policy: Policy, inputs: &[&Tensor]) -> Result<Option<(Vec<Tensor>, Excluded)>> {
    let Some((lower, excluded)) = applies() else { return Ok(None) };
    let to = match policy {
        Policy::LowerPrecision => lower,
        Policy::Fp32 => DType::F32,
    };
    // PyTorch casts in a C++ argument pack, which GCC (its Linux builds) evaluates last to
    // first: a linear's bias is cast before its weight, and the weight before the input.
    let mut cast = Vec::with_capacity(inputs.len());
    for t in inputs.iter().rev() {
        cast.push(if !eligible(t) || t.dtype() == to {
            t.share()
        } else if to == lower && t.dtype() == DType::F32 && t.requires_grad() && t.is_leaf() && !t.is_view() {
            cached_cast(t, to)?
        } else {
            t.to(to)?
        });
    }
    cast.reverse();
    Ok(Some((cast, excluded)))
}

#[track_caller]
fn cached_cast(t: &Tensor, to: DType) -> Result<Tensor> {
    if let Some(hit) = CACHE.with(|c| c.borrow().get(&t.id()).map(Tensor::share)) {
        return Ok(hit);
    }
    let cast = t.to(to)?;
    CACHE.with(|c| c.borrow_mut().insert(t.id(), cast.share()));
    Ok(cast)
}

/// `fp32_set_opt_dtype` (softmax, log_softmax, sum): under autocast an op on an eligible
/// input produces float32 (reading f16 directly, without a copy), with autocast excluded
/// while it runs; None when autocast does not apply.
pub(crate) fn fp32_output(input: &Tensor) -> Option<Excluded> {
    if !eligible(input) {
        return None;
    }
    applies().map(|(_, excluded)| excluded)
}
