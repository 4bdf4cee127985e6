//! Runs a graph backward as PyTorch's engine does on one device: a node runs once every
//! gradient for it has arrived (summed in its input buffer), the most recently recorded ready
//! node first, leaves (`AccumulateGrad`) as soon as they are ready; what a node saved is freed
//! right after it runs unless the graph is retained.

use crate::tensor::graph::{Edge, Node};
use crate::tensor::{Result, Tensor, TensorError};
use crate::trace::Category;
use rustc_hash::{FxHashMap, FxHashSet};
use std::collections::BinaryHeap;
use std::rc::Rc;

/// A node or a leaf, by identity.
#[derive(Clone, Copy, PartialEq, Eq, Hash)]
enum Key {
    Node(usize),
    Leaf(u64),
}

fn key(edge: &Edge) -> Key {
    match edge {
        Edge::Node(n) => Key::Node(Rc::as_ptr(n) as usize),
        Edge::Leaf(t) => Key::Leaf(t.id()),
    }
}

/// PyTorch gives `AccumulateGrad` the highest sequence number, so leaves are updated as soon as
/// their gradient is complete.
fn priority(edge: &Edge) -> u64 {
    match edge {
        Edge::Node(n) => n.sequence,
        Edge::Leaf(_) => u64::MAX,
    }
}

struct Ready {
    priority: u64,
    edge: Edge,
}

impl PartialEq for Ready {
    fn eq(&self, other: &Ready) -> bool {
        self.priority == other.priority
    }
}
impl Eq for Ready {}
impl PartialOrd for Ready {
    fn partial_cmp(&self, other: &Ready) -> Option<std::cmp::Ordering> {
        Some(self.cmp(other))
    }
}
impl Ord for Ready {
    fn cmp(&self, other: &Ready) -> std::cmp::Ordering {
        self.priority.cmp(&other.priority)
    }
}

fn run_backward(root: &Tensor, grad: Tensor, retain_graph: bool) -> Result<()> {
    // Backward's own ops record nothing (no create_graph).
    let _no_grad = super::no_grad();
    let _thread = root.device().autograd_thread();
    let root = match root.grad_fn() {
        Some(node) => Edge::Node(node),
        None => Edge::Leaf(root.share()),
    };
    // How many gradients each node and leaf waits for.
    let mut dependencies: FxHashMap<Key, usize> = FxHashMap::default();
    let mut seen: FxHashSet<Key> = FxHashSet::default();
    let mut stack = vec![root.clone()];
    while let Some(edge) = stack.pop() {
        if let Edge::Node(node) = &edge
            && seen.insert(key(&edge))
        {
            for next in node.edges.iter().flatten() {
                *dependencies.entry(key(next)).or_default() += 1;
                stack.push(next.clone());
            }
        }
    }
    let mut buffers: FxHashMap<Key, Tensor> = FxHashMap::default();
    buffers.insert(key(&root), grad);
    let mut ready = BinaryHeap::from([Ready { priority: priority(&root), edge: root }]);
    while let Some(Ready { edge, .. }) = ready.pop() {
        let grad = buffers.remove(&key(&edge));
        match &edge {
            Edge::Leaf(leaf) => {
                if let Some(grad) = grad {
                    accumulate(leaf, grad)?;
                }
            }
            Edge::Node(node) => {
                let grads = match grad {
                    Some(grad) => run_node(node, grad, retain_graph)?,
                    None => node.edges.iter().map(|_| None).collect(),
                };
                for (next, g) in node.edges.iter().zip(grads) {
                    let Some(next) = next else { continue };
                    let k = key(next);
                    if let Some(g) = g {
                        add_to_buffer(&mut buffers, k, g, &node.origin)?;
                    }
                    let waiting = dependencies.get_mut(&k).expect("every edge was counted");
                    *waiting -= 1;
                    if *waiting == 0 {
                        ready.push(Ready { priority: priority(next), edge: next.clone() });
                    }
                }
            }
        }
    }
    Ok(())
}

fn run_node(node: &Node, grad: Tensor, retain_graph: bool) -> Result<Vec<Option<Tensor>>> {
    let device = grad.device().clone();
    let _labelled = device.backward_of(&node.origin);
    let saved = node.saved()?;
    let grads = (node.backward)(&saved, &grad)?;
    drop(saved);
    // `validate_outputs`, input by input: summed back to a broadcast input's shape, then
    // converted to its dtype, each replacing (and so freeing) the gradient before it.
    let grads = grads
        .into_iter()
        .zip(&node.inputs)
        .enumerate()
        .map(|(i, (g, (shape, dtype)))| {
            let Some(mut g) = g else { return Ok(None) };
            if g.shape() != shape.as_slice() {
                if !g.expands_from(shape) {
                    return Err(TensorError::Autograd(format!(
                        "Function {} returned an invalid gradient at index {i} - got {:?} but expected shape compatible with {shape:?}",
                        node.name,
                        g.shape()
                    )));
                }
                g = g.sum_to(shape)?;
            }
            if g.dtype() != *dtype {
                g = g.to(*dtype)?;
            }
            Ok(Some(g))
        })
        .collect::<Result<Vec<_>>>()?;
    // As PyTorch's `evaluate_function`: the incoming gradient goes when `call_function`
    // returns, then the node releases what it saved.
    drop(grad);
    if !retain_graph {
        node.release();
    }
    Ok(grads)
}

/// Sums a gradient into a node's input buffer as PyTorch's `InputBuffer` does: in place when
/// the gradient already there is held by nothing else, otherwise into a new tensor. A view
/// never is: PyTorch's views keep their base (and so a second reference to the storage), even
/// those backward makes without grad mode.
/// A sum it makes is named as the backward of `from`, the node whose gradient arrived
/// (PyTorch's autograd thread records no stack).
fn add_to_buffer(buffers: &mut FxHashMap<Key, Tensor>, k: Key, g: Tensor, from: &crate::device::Origin) -> Result<()> {
    match buffers.remove(&k) {
        None => {
            buffers.insert(k, g);
        }
        // `can_accumulate_inplace`: dense in any order of dimensions, not only row-major.
        Some(old) if old.unique() && !old.is_view() && old.layout().is_dense() && old.shape() == g.shape() => {
            old.add_(&g)?;
            buffers.insert(k, old);
        }
        Some(old) => {
            let _labelled = g.device().backward_of(from);
            buffers.insert(k, old.add(&g)?);
        }
    }
    Ok(())
}

/// `AccumulateGrad`: the first gradient becomes the leaf's `.grad` (taken as it is when nothing
/// else holds it and it is contiguous, else copied); later ones are added in place.
fn accumulate(leaf: &Tensor, grad: Tensor) -> Result<()> {
    let device = leaf.device();
    match leaf.grad() {
        None if grad.unique() && grad.is_contiguous() => {
            // Made by the node that computed it; now it is the leaf's gradient.
            device.categorize_recent(grad.data_ptr(), Category::Gradient);
            leaf.set_grad(Some(grad))
        }
        None => {
            let _gradient = device.category(Category::Gradient);
            // `clone_obey_contract`: a contiguous parameter's gradient is contiguous.
            leaf.set_grad(Some(grad.copy_for("clone")?))
        }
        Some(existing) => {
            existing.add_(&grad)?;
        }
    }
    super::run_post_accumulate_grad_hook(leaf)
}

impl Tensor {
    /// `backward()`: the gradient of this scalar with respect to every leaf that requires grad,
    /// accumulated into their `.grad`. Frees what the graph saved.
    #[track_caller]
    pub fn backward(&self) -> Result<()> {
        self.backward_with(None, false)
    }

    /// `backward(gradient, retain_graph)`.
    #[track_caller]
    pub fn backward_with(&self, gradient: Option<&Tensor>, retain_graph: bool) -> Result<()> {
        if !self.requires_grad() {
            return Err(TensorError::Autograd("element 0 of tensors does not require grad and does not have a grad_fn".into()));
        }
        let grad = match gradient {
            Some(g) if g.shape() != self.shape() => {
                return Err(TensorError::Shape(format!("backward: gradient of shape {:?} for a tensor of shape {:?}", g.shape(), self.shape())));
            }
            Some(g) => g.share(),
            None if self.numel() == 1 => {
                let _no_grad = super::no_grad();
                let ones = self.device().empty_tensor(self.shape(), self.dtype(), "ones_like")?;
                ones.fill_(1.0)?;
                ones
            }
            None => return Err(TensorError::Autograd("grad can be implicitly created only for scalar outputs".into())),
        };
        // `torch.autograd.backward` holds its `grad_tensors` (the implicit ones_like too) until
        // the engine returns: the seed lives through the whole backward.
        let seed = grad.share();
        let result = run_backward(self, grad, retain_graph);
        drop(seed);
        result
    }
}
