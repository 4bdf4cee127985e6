//! Reverse-mode autograd with PyTorch's memory behaviour: each differentiable op that sees an
//! input requiring grad records a node holding the tensors PyTorch's `derivatives.yaml` saves
//! for it (the tensor layer's `graph`: real allocations, kept alive until backward frees them or
//! the graph is dropped), and `backward` runs the nodes in PyTorch's order, summing gradients as
//! its engine does and accumulating them into the leaves' `grad`.

mod checkpoint;
mod engine;

pub use crate::tensor::graph::{GradMode, Node, enable_grad, inference_mode, is_grad_enabled, no_grad};
/// For ops defined above the tensor layer (a quantized linear, a collective) to record themselves.
pub(crate) use crate::tensor::graph::{record, records};
pub use checkpoint::checkpoint;

use crate::tensor::{Result, Tensor};
use std::cell::RefCell;
use std::rc::Rc;

thread_local! {
    /// Per leaf (by tensor id): the hook run after a gradient is accumulated into it.
    static POST_ACCUMULATE_GRAD_HOOKS: RefCell<rustc_hash::FxHashMap<u64, PostAccumulateGradHook>> = RefCell::default();
}

type PostAccumulateGradHook = Rc<dyn Fn(&Tensor) -> Result<()>>;

/// `Tensor.register_post_accumulate_grad_hook(hook)`: `hook(leaf)` runs each time backward has
/// accumulated a gradient into `leaf`, until the handle drops (one hook a leaf here).
#[must_use = "the hook holds only while its handle lives"]
pub struct HookHandle(u64);

impl Drop for HookHandle {
    fn drop(&mut self) {
        POST_ACCUMULATE_GRAD_HOOKS.with(|h| h.borrow_mut().remove(&self.0));
    }
}

pub fn register_post_accumulate_grad_hook(leaf: &Tensor, hook: impl Fn(&Tensor) -> Result<()> + 'static) -> HookHandle {
    POST_ACCUMULATE_GRAD_HOOKS.with(|h| h.borrow_mut().insert(leaf.id(), Rc::new(hook)));
    HookHandle(leaf.id())
}

/// Runs `leaf`'s post-accumulate-grad hook, if it has one.
fn run_post_accumulate_grad_hook(leaf: &Tensor) -> Result<()> {
    let hook = POST_ACCUMULATE_GRAD_HOOKS.with(|h| h.borrow().get(&leaf.id()).cloned());
    hook.map_or(Ok(()), |hook| hook(leaf))
}
