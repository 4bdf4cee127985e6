//! Losses, reduced by their mean as PyTorch's default `reduction="mean"`.

use crate::amp::{self, Policy};
use crate::tensor::{Result, Tensor, TensorError};

/// `F.cross_entropy(logits, targets)`: logits [N, classes], int64 targets [N]; as ATen's
/// `cross_entropy_loss`, `nll_loss(log_softmax(logits, 1, dtype=logits.dtype), targets)`. The
/// log-probabilities (N x classes) are what backward keeps: at a language model's vocabulary,
/// often the largest single activation. Under autocast they stay in the logits' f16 (the
/// explicit dtype), and nll_loss, on the float32 list, keeps an f32 copy besides: 6 bytes per
/// logit.
#[track_caller]
pub fn cross_entropy(logits: &Tensor, targets: &Tensor) -> Result<Tensor> {
    if logits.ndim() != 2 {
        return Err(TensorError::Shape(format!("cross_entropy expects [N, classes] logits, got {:?} (flatten the batch first)", logits.shape())));
    }
    logits.log_softmax_to_dtype(1, logits.dtype())?.nll_loss(targets)
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
