//! The autograd side of a tensor: `requires_grad`, `grad`, `grad_fn`, `detach`, the
//! version counter in-place ops bump, and PyTorch's refusals.

use super::graph::{self, Node};
use super::{Result, Tensor, TensorError};
use std::rc::Rc;

impl Tensor {
    /// `requires_grad`.
    pub fn requires_grad(&self) -> bool {
        self.requires_grad.get()
    }

    /// `requires_grad_()`: only on leaves, and only for floating dtypes (PyTorch's errors).
    pub fn requires_grad_(&self, requires_grad: bool) -> Result<&Tensor> {
        if !self.is_leaf() {
            return Err(TensorError::Autograd(
                "you can only change requires_grad flags of leaf variables. If you want to use a computed variable in a subgraph that doesn't require differentiation use var_no_grad = var.detach().".into(),
            ));
        }
        if requires_grad && !self.dtype.is_float() {
            return Err(TensorError::Autograd("only Tensors of floating point dtype can require gradients".into()));
        }
        self.requires_grad.set(requires_grad);
        Ok(self)
    }

    /// A leaf: made by the user, not by a recorded op.
    pub fn is_leaf(&self) -> bool {
        self.grad_fn.borrow().is_none()
    }

    /// The op that made this tensor, as PyTorch names it (`MulBackward0`); None for leaves.
    pub fn grad_fn(&self) -> Option<Rc<Node>> {
        self.grad_fn.borrow().clone()
    }

    pub(crate) fn set_grad_fn(&self, node: Rc<Node>) {
        *self.grad_fn.borrow_mut() = Some(node);
        self.requires_grad.set(true);
    }

    /// The gradient accumulated by `backward` (`.grad`).
    pub fn grad(&self) -> Option<Tensor> {
        self.grad.borrow().as_ref().map(Tensor::share)
    }

    /// Sets or clears `.grad` (`p.grad = None` frees it, as `zero_grad(set_to_none=True)` does).
    pub fn set_grad(&self, grad: Option<Tensor>) {
        *self.grad.borrow_mut() = grad;
    }

    /// `detach()`: a new tensor over the same storage (and version counter), outside the graph.
    pub fn detach(&self) -> Tensor {
        self.alias()
    }

    /// A new tensor over the same storage and layout, with no grad_fn.
    pub(crate) fn alias(&self) -> Tensor {
        Tensor::from_parts(self.storage.clone(), self.layout.clone(), self.dtype, true)
    }

    /// Whether nothing else holds this tensor or its memory (PyTorch's `can_accumulate_inplace`:
    /// one use of the tensor, one of its storage): the engine may then write into it or take it
    /// instead of copying it. A view shares its base's storage, so it is never unique.
    pub(crate) fn unique(&self) -> bool {
        Rc::strong_count(&self.0) == 1 && Rc::strong_count(&self.storage) == 1
    }

    /// The version counter (`_version`): in-place writes to this storage so far.
    pub fn version(&self) -> u64 {
        self.storage.version.get()
    }

    /// Checks that an in-place op may write this tensor, as PyTorch does: not a leaf that
    /// requires grad while grad mode is on. `differentiated` says whether the op records itself
    /// when the graph tracks self or `others`; an op that does not, and a write through a
    /// tracked view (whose base's history this engine does not rebase), are refused rather
    /// than given a wrong gradient.
    pub(crate) fn check_inplace(&self, op: &str, others: &[&Tensor], differentiated: bool) -> Result<()> {
        if !graph::is_grad_enabled() {
            return Ok(());
        }
        if self.requires_grad() && self.is_leaf() {
            return Err(TensorError::Autograd("a leaf Variable that requires grad is being used in an in-place operation.".into()));
        }
        let tracked = self.requires_grad() || others.iter().any(|t| t.requires_grad());
        if tracked && !differentiated {
            return Err(TensorError::Unsupported(format!("{op}: this in-place op is not differentiated on tensors the graph tracks; use the out-of-place op")));
        }
        if tracked && self.is_view {
            return Err(TensorError::Unsupported(format!(
                "{op}: an in-place write through a view of a tensor the graph tracks is not differentiated yet; use the out-of-place op"
            )));
        }
        Ok(())
    }

    /// Marks an in-place write: saved copies of this storage are now stale.
    pub(crate) fn bump_version(&self) {
        self.storage.version.set(self.storage.version.get() + 1);
    }
}

/// What an op that autograd does not differentiate yet says when an input requires grad: an
/// error, rather than a gradient that silently stops there.
pub(crate) fn not_differentiated_yet(op: &str, inputs: &[&Tensor]) -> Result<()> {
    if graph::is_grad_enabled() && inputs.iter().any(|t| t.requires_grad()) {
        return Err(TensorError::Unsupported(format!(
            "{op}: autograd does not differentiate this op yet, and an input requires grad; run it under autograd::no_grad() or detach() the input"
        )));
    }
    Ok(())
}
