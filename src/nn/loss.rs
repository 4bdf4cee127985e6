//! Losses, reduced by their mean as PyTorch's default `reduction="mean"`.

use crate::amp::{self, Policy};
use crate::tensor::{DType, Result, Tensor, TensorError};

/// `F.cross_entropy(logits, targets)`: logits [N, classes], int64 targets [N];
/// `nll_loss(log_softmax(logits, 1), targets)`. The log-probabilities (N x classes) are what
/// log_softmax saves for backward: at a language model's vocabulary, often the largest single
/// activation.
#[track_caller]
pub fn cross_entropy(logits: &Tensor, targets: &Tensor) -> Result<Tensor> {
    let [n, classes] = logits.shape() else {
        return Err(TensorError::Shape(format!("cross_entropy expects [N, classes] logits, got {:?} (flatten the batch first)", logits.shape())));
    };
    if targets.shape() != [*n] || targets.dtype() != DType::I64 {
        return Err(TensorError::Shape(format!("cross_entropy expects int64 targets [{n}], got {:?} {}", targets.shape(), targets.dtype())));
    }
    let log_probs = logits.log_softmax(1)?;
    // Each row's target log-probability, picked from the flattened rows.
    let rows = logits.device().arange(*n, DType::I64)?.mul_scalar(*classes as f64)?.add(targets)?;
    log_probs.view(&[-1])?.index_select(0, &rows)?.mean(&[], false)?.neg()
}

/// `F.mse_loss(input, target)`: mean of the squared differences.
#[track_caller]
pub fn mse_loss(input: &Tensor, target: &Tensor) -> Result<Tensor> {
    if input.shape() != target.shape() {
        return Err(TensorError::Shape(format!("mse_loss of {:?} and {:?}", input.shape(), target.shape())));
    }
    // On autocast's float32 list.
    if let Some((cast, _autocast_off)) = amp::cast_inputs(Policy::Fp32, &[input, target])? {
        return mse_loss(&cast[0], &cast[1]);
    }
    input.sub(target)?.pow_scalar(2.0)?.mean(&[], false)
}
