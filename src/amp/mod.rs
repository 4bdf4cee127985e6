//! Mixed precision's public face: `autocast` scopes (ops in them cast their inputs by PyTorch's
//! autocast lists), with the gradient scaler in `nn::optim::GradScaler`. Autocast itself is in
//! the tensor layer (`tensor::autocast`), as PyTorch keeps it a dispatch key inside ATen: ops
//! apply their policy at entry, before autograd records anything.

pub use crate::tensor::autocast::{Autocast, autocast, autocast_disabled, cached_bytes, is_autocast_enabled};
pub(crate) use crate::tensor::autocast::{Policy, cast_inputs};
