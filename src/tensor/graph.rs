//! The graph a tensor op records when autograd tracks its inputs: grad mode, the nodes
//! (PyTorch's `Node`, holding what `derivatives.yaml` saves) and their edges. The tensor layer
//! owns it because every differentiable op records itself here; the autograd module above runs
//! the recorded graph backward (its engine), checkpoints and hooks.

use super::{Result, Tensor, TensorError};
use crate::device::Origin;
use crate::dtype::DType;
use std::cell::{Cell, RefCell};
use std::rc::Rc;

thread_local! {
    static GRAD_ENABLED: Cell<bool> = const { Cell::new(true) };
    static NEXT_SEQUENCE: Cell<u64> = const { Cell::new(0) };
}

/// Whether ops record a graph (`torch.is_grad_enabled()`).
pub fn is_grad_enabled() -> bool {
    GRAD_ENABLED.with(Cell::get)
}

/// Sets grad mode until the guard drops, which restores the mode before.
#[must_use = "grad mode holds only while the guard lives"]
pub struct GradMode {
    before: bool,
}

impl Drop for GradMode {
    fn drop(&mut self) {
        GRAD_ENABLED.with(|g| g.set(self.before));
    }
}

fn set_grad_mode(enabled: bool) -> GradMode {
    GradMode { before: GRAD_ENABLED.with(|g| g.replace(enabled)) }
}

/// `torch.no_grad()`: ops record nothing, so nothing is saved for backward.
pub fn no_grad() -> GradMode {
    set_grad_mode(false)
}

/// `torch.inference_mode()`: as `no_grad` here (the memory is the same: nothing saved).
pub fn inference_mode() -> GradMode {
    set_grad_mode(false)
}

/// `torch.enable_grad()`.
pub fn enable_grad() -> GradMode {
    set_grad_mode(true)
}

/// Where a gradient goes: the node that made an input, or the leaf it accumulates into
/// (PyTorch's `AccumulateGrad`, which holds the leaf).
pub(crate) enum Edge {
    Node(Rc<Node>),
    Leaf(Tensor),
}

impl Clone for Edge {
    fn clone(&self) -> Edge {
        match self {
            Edge::Node(n) => Edge::Node(n.clone()),
            Edge::Leaf(t) => Edge::Leaf(t.share()),
        }
    }
}

/// A tensor saved for backward, with the version it had then: an in-place change before
/// backward is PyTorch's error.
pub(crate) struct Saved {
    pub tensor: Tensor,
    version: u64,
    /// Whether the op saved its own output (named so in the error).
    is_output: bool,
}

/// Computes the gradients of a node's inputs from what it saved (by slot: None where the op
/// saved nothing in that slot) and the gradient of its output.
pub(crate) type BackwardFn = Box<dyn Fn(&[Option<Tensor>], &Tensor) -> Result<Vec<Option<Tensor>>>>;

/// One recorded op (PyTorch's `Node`, named as its `grad_fn` is: `MulBackward0`).
pub struct Node {
    pub(crate) name: &'static str,
    /// Larger for later nodes: among ready nodes the engine runs the latest first, as PyTorch's.
    pub(crate) sequence: u64,
    /// One per input of the op; None where that input needs no gradient.
    pub(crate) edges: Vec<Option<Edge>>,
    /// Each input's shape and dtype (PyTorch's `InputMetadata`): the engine sums a gradient of
    /// a broadcast input back to its shape and converts one computed in another type (an f32
    /// gradient of an f16 input), input by input, as PyTorch's `validate_outputs` does.
    pub(crate) inputs: Vec<(Vec<usize>, DType)>,
    saved: RefCell<Option<Vec<Option<Saved>>>>,
    pub(crate) backward: BackwardFn,
    /// Where the op was recorded: its backward's allocations are labelled so.
    pub(crate) origin: Origin,
}

impl Drop for Node {
    /// Takes apart the graph this node alone holds in the order Rust's own recursive drop would
    /// (each edge's node whole before the next edge, then the saved tensors, a saved tensor's
    /// storage before the node that made it), so the trace's frees are the same, but with a
    /// stack of its own: recursion one frame per op overflowed the thread's on a model of
    /// thousands of layers.
    fn drop(&mut self) {
        enum Work {
            Edges(std::vec::IntoIter<Option<Edge>>),
            Saved(std::vec::IntoIter<Option<Saved>>),
            /// A node whose edges and saved tensors were taken: the rest of it drops.
            Finish(Node),
        }
        fn take_apart(node: &mut Node, work: &mut Vec<Work>) {
            let saved = node.saved.get_mut().take().unwrap_or_default();
            work.push(Work::Saved(saved.into_iter()));
            work.push(Work::Edges(std::mem::take(&mut node.edges).into_iter()));
        }
        fn release(node: Rc<Node>, work: &mut Vec<Work>) {
            // Shared: another holder keeps it, and dropping this handle only counts down.
            if let Ok(mut node) = Rc::try_unwrap(node) {
                let at = work.len();
                take_apart(&mut node, work);
                work.insert(at, Work::Finish(node));
            }
        }
        // A node already taken apart (the last step below drops it) has nothing left to do.
        if self.edges.is_empty() && self.saved.get_mut().is_none() {
            return;
        }
        let mut work = Vec::new();
        take_apart(self, &mut work);
        while let Some(item) = work.pop() {
            match item {
                Work::Edges(mut edges) => {
                    let Some(edge) = edges.next() else { continue };
                    work.push(Work::Edges(edges));
                    match edge {
                        Some(Edge::Node(node)) => release(node, &mut work),
                        Some(Edge::Leaf(leaf)) => drop(leaf),
                        None => {}
                    }
                }
                Work::Saved(mut saved) => {
                    let Some(entry) = saved.next() else { continue };
                    work.push(Work::Saved(saved));
                    let Some(entry) = entry else { continue };
                    // The tensor's own fields go first (its storage), then the node that made it.
                    let made_by = entry.tensor.take_grad_fn_if_last();
                    drop(entry);
                    if let Some(node) = made_by {
                        release(node, &mut work);
                    }
                }
                Work::Finish(node) => drop(node),
            }
        }
    }
}

impl Node {
    pub fn name(&self) -> &'static str {
        self.name
    }

    /// The saved tensors, checked against in-place changes; an error once backward freed them.
    pub(crate) fn saved(&self) -> Result<Vec<Option<Tensor>>> {
        let saved = self.saved.borrow();
        let Some(saved) = saved.as_ref() else {
            return Err(TensorError::Autograd(
                "Trying to backward through the graph a second time (or directly access saved tensors after they have already been freed). Saved intermediate values of the graph are freed when you call .backward() or autograd.grad(). Specify retain_graph=True if you need to backward through the graph a second time or if you need to access saved tensors after calling backward.".into(),
            ));
        };
        for s in saved.iter().flatten() {
            let now = s.tensor.version();
            if now != s.version {
                let which = if s.is_output { format!(", which is output 0 of {}", self.name) } else { String::new() };
                return Err(TensorError::Autograd(format!(
                    "one of the variables needed for gradient computation has been modified by an inplace operation: [{} {:?}]{which}, is at version {now}; expected version {} instead. Hint: enable anomaly detection to find the operation that failed to compute its gradient, with torch.autograd.set_detect_anomaly(True).",
                    s.tensor.dtype().torch_type_name(),
                    s.tensor.shape(),
                    s.version
                )));
            }
        }
        Ok(saved.iter().map(|s| s.as_ref().map(|s| s.tensor.share())).collect())
    }

    /// Frees what the node saved (after backward without `retain_graph`).
    pub(crate) fn release(&self) {
        self.saved.borrow_mut().take();
    }
}

/// What an op saves: its inputs as they are, its output without its `grad_fn` (as PyTorch's
/// `SavedVariable` stores an output, so that the node and its output do not hold each other).
pub(crate) enum Save<'a> {
    Input(&'a Tensor),
    Output,
}

/// Records `op` if grad mode is on and an input requires grad: `output` gets a node whose edges
/// lead to the inputs' nodes (or leaves), holding what `save` names (slots an op fills only when
/// a gradient needs them are None otherwise). Returns the output.
#[track_caller]
pub(crate) fn record(name: &'static str, inputs: &[&Tensor], output: Tensor, save: &[Option<Save>], backward: BackwardFn) -> Tensor {
    if !records(inputs) {
        return output;
    }
    let edges = inputs.iter().map(|t| edge_of(t)).collect();
    let input_meta = inputs.iter().map(|t| (t.shape().to_vec(), t.dtype())).collect();
    let saved = save
        .iter()
        .map(|s| {
            s.as_ref().map(|s| match s {
                Save::Input(t) => Saved { tensor: t.share(), version: t.version(), is_output: false },
                Save::Output => Saved { tensor: output.alias(), version: output.version(), is_output: true },
            })
        })
        .collect();
    let sequence = NEXT_SEQUENCE.with(|n| n.replace(n.get() + 1));
    let origin = output.device().origin(std::panic::Location::caller(), name);
    let node = Rc::new(Node { name, sequence, edges, inputs: input_meta, saved: RefCell::new(Some(saved)), backward, origin });
    output.set_grad_fn(node);
    output
}

/// Whether an op on `inputs` is recorded: grad mode is on and an input requires grad. Ops ask
/// first, so that an untracked op builds no node, closure or saved list.
pub(crate) fn records(inputs: &[&Tensor]) -> bool {
    is_grad_enabled() && inputs.iter().any(|t| t.requires_grad())
}

/// Where the gradient of `t` goes: its node, its leaf, or nowhere.
fn edge_of(t: &Tensor) -> Option<Edge> {
    if !t.requires_grad() {
        return None;
    }
    Some(match t.grad_fn() {
        Some(node) => Edge::Node(node),
        None => Edge::Leaf(t.share()),
    })
}
