//! `torch.nn.parallel.DistributedDataParallel` as each rank's allocator sees it: the module's
//! state broadcast from rank 0 in flattened buckets at construction, then gradient buckets
//! the reducer keeps (`gradient_as_bucket_view=False`, the default: each `.grad` is written
//! into its bucket's view, the bucket all-reduced in place and copied back, so every rank holds
//! its gradients twice). The first buckets hold everything, one per type; at the second
//! forward they are rebuilt as 1 MiB then 25 MiB buckets in the order gradients arrived.
//! With `gradient_as_bucket_view=True` the buckets are the gradients: as each gradient is
//! accumulated, the reducer copies it into its bucket and makes the parameter's `.grad` that
//! view, so the gradient backward made is freed at once and every rank holds its gradients once.

use crate::autograd::{self, HookHandle};
use crate::device::Device;
use crate::tensor::{Buffer, DType, Result, Tensor, TensorError};
use crate::trace::Category;
use std::cell::RefCell;
use std::collections::VecDeque;
use std::rc::Rc;

/// `_DEFAULT_FIRST_BUCKET_BYTES`: the first bucket closes at 1 MiB.
pub const DDP_FIRST_BUCKET_BYTES: u64 = 1 << 20;
/// `bucket_cap_mb=25`.
pub const DDP_BUCKET_BYTES: u64 = 25 << 20;
/// `_sync_module_states`' `broadcast_bucket_size`: 250 MiB.
pub const DDP_BROADCAST_BUCKET_BYTES: u64 = 250 << 20;

/// `compute_bucket_assignment_by_size`: tensors in order, grouped by type; a group's bucket
/// closes as soon as it holds at least its limit (the first limit, then each next one, the last
/// repeating), and the buckets are sorted by the first tensor they hold. Returns indices into
/// `tensors`, bucket by bucket.
pub fn bucket_assignment(tensors: &[(usize, DType)], limits: &[u64]) -> Vec<Vec<usize>> {
    let mut buckets = bucket_assignment_unsorted(tensors, limits);
    buckets.sort_by_key(|b| b[0]);
    buckets
}

/// [`bucket_assignment`] without the sort: the closed buckets in the order they closed, then
/// the ones left open.
fn bucket_assignment_unsorted(tensors: &[(usize, DType)], limits: &[u64]) -> Vec<Vec<usize>> {
    struct Open {
        dtype: DType,
        indices: Vec<usize>,
        bytes: u64,
        limit: usize,
    }
    let mut open: Vec<Open> = Vec::new();
    let mut closed: Vec<Vec<usize>> = Vec::new();
    for (i, &(numel, dtype)) in tensors.iter().enumerate() {
        let slot = match open.iter().position(|b| b.dtype == dtype) {
            Some(slot) => slot,
            None => {
                open.push(Open { dtype, indices: Vec::new(), bytes: 0, limit: 0 });
                open.len() - 1
            }
        };
        let bucket = &mut open[slot];
        bucket.indices.push(i);
        bucket.bytes += numel as u64 * dtype.size() as u64;
        if bucket.bytes >= limits[bucket.limit] {
            closed.push(std::mem::take(&mut bucket.indices));
            bucket.bytes = 0;
            bucket.limit = (bucket.limit + 1).min(limits.len() - 1);
        }
    }
    closed.extend(open.into_iter().map(|b| b.indices).filter(|i| !i.is_empty()));
    closed
}

/// The reducer's buckets.
pub struct Ddp {
    device: Device,
    params: Vec<Tensor>,
    /// Buffers, not tensors: the first bucket holds every gradient, more elements than a tensor
    /// indexes in wasm.
    buckets: Vec<Buffer>,
    /// With `gradient_as_bucket_view=True`: the buckets as tensors, each parameter's view into
    /// its bucket, and the hooks that make each gradient that view (held to be removed with
    /// the wrapper).
    views: Option<Rc<RefCell<BucketViews>>>,
    _hooks: Vec<HookHandle>,
    /// The parameters in the order their gradients became ready in the first backward.
    ready: Option<Vec<usize>>,
    rebuilt: bool,
}

#[derive(Default)]
struct BucketViews {
    buckets: Vec<Tensor>,
    /// Per parameter: its gradient's place in its bucket.
    of_param: Vec<Option<Tensor>>,
    /// The parameters in the order their gradients arrived (the hooks see it), and which have.
    arrived: Vec<usize>,
    has_arrived: Vec<bool>,
}

impl Ddp {
    /// Wraps a model whose trainable parameters are `params` and whose every parameter, frozen
    /// ones included, is `module_states` (both in registration order): broadcasts the module
    /// from rank 0, then makes the first buckets: with `find_unused_parameters=False` (the
    /// default) one per type, holding every parameter (`[sys.maxsize]` limits, "put all params
    /// in one bucket initially"). `bucket_views`: `gradient_as_bucket_view=True`.
    pub fn new(device: &Device, params: &[Tensor], module_states: &[Tensor], bucket_views: bool) -> Result<Ddp> {
        broadcast_coalesced(device, module_states.iter())?;
        let shared: Vec<Tensor> = params.iter().map(Tensor::share).collect();
        let views = bucket_views.then(|| {
            Rc::new(RefCell::new(BucketViews { of_param: params.iter().map(|_| None).collect(), has_arrived: vec![false; params.len()], ..Default::default() }))
        });
        let hooks = match &views {
            Some(views) => shared.iter().enumerate().map(|(i, p)| autograd::register_post_accumulate_grad_hook(p, gradient_into_bucket(views, i))).collect(),
            None => Vec::new(),
        };
        let mut ddp = Ddp { device: device.clone(), params: shared, buckets: Vec::new(), views, _hooks: hooks, ready: None, rebuilt: false };
        let tensors: Vec<(usize, DType)> = params.iter().map(|p| (p.numel(), p.dtype())).collect();
        let mut assignment = bucket_assignment(&tensors, &[u64::MAX]);
        assignment.reverse();
        ddp.allocate(&assignment, &(0..params.len()).collect::<Vec<_>>())?;
        Ok(ddp)
    }

    /// After a backward: the first one's gradient-ready order is what the rebuild follows (the
    /// reducer's autograd hooks record it).
    pub fn after_backward(&mut self) {
        if self.ready.is_some() {
            return;
        }
        self.ready = Some(match &self.views {
            Some(views) => views.borrow().arrived.clone(),
            None => {
                // A gradient's tensor id orders it by when it was made in backward.
                let mut ready: Vec<usize> = (0..self.params.len()).filter(|&i| self.params[i].grad().is_some()).collect();
                ready.sort_by_key(|&i| self.params[i].grad().map(|g| g.id()));
                ready
            }
        });
    }

    /// `_pre_forward`'s `_rebuild_buckets`, once, at the forward after the first backward:
    /// buckets of 1 MiB then 25 MiB over the parameters in the order their gradients became
    /// ready (the old buckets are released first).
    pub fn before_forward(&mut self) -> Result<()> {
        let Some(ready) = self.ready.as_ref().filter(|_| !self.rebuilt) else { return Ok(()) };
        self.rebuilt = true;
        let ready = ready.clone();
        let tensors: Vec<(usize, DType)> = ready.iter().map(|&i| (self.params[i].numel(), self.params[i].dtype())).collect();
        // In gradient-ready order: no sort (the C++ sorts only without indices).
        let mut assignment = bucket_assignment_unsorted(&tensors, &[DDP_FIRST_BUCKET_BYTES, DDP_BUCKET_BYTES]);
        for bucket in &mut assignment {
            for i in bucket.iter_mut() {
                *i = ready[*i];
            }
        }
        self.buckets.clear();
        if let Some(views) = &self.views {
            let mut views = views.borrow_mut();
            views.buckets.clear();
            views.of_param.iter_mut().for_each(|v| *v = None);
        }
        self.allocate(&assignment, &(0..self.params.len()).collect::<Vec<_>>())
    }

    fn allocate(&mut self, assignment: &[Vec<usize>], index: &[usize]) -> Result<()> {
        let _gradients = self.device.category(Category::Gradient);
        let _scope = self.device.scope("DistributedDataParallel.reducer");
        for bucket in assignment {
            let bytes = bucket.iter().map(|&i| self.params[index[i]].numel() as u64 * self.params[index[i]].dtype().size() as u64).sum::<u64>();
            let Some(views) = &self.views else {
                self.buckets.push(self.device.buffer(bytes, "empty")?);
                continue;
            };
            // The bucket as a flat tensor of its type, each parameter's gradient a view of it.
            let dtype = self.params[index[bucket[0]]].dtype();
            let numel = usize::try_from(bytes / dtype.size() as u64)
                .map_err(|_| TensorError::Shape(format!("a gradient bucket of {bytes} bytes is too large for this build: use ddp_reducer=buckets")))?;
            let flat = self.device.empty_tensor(&[numel], dtype, "empty")?;
            let mut views = views.borrow_mut();
            let mut offset = 0;
            for &i in bucket {
                let p = &self.params[index[i]];
                let shape: Vec<isize> = p.shape().iter().map(|&d| d as isize).collect();
                let view = flat.narrow(0, offset, p.numel())?.view(&shape)?;
                offset += p.numel();
                // `initialize_bucket_views`: a gradient that exists is copied into its view.
                if let Some(grad) = p.grad() {
                    let _no_grad = autograd::no_grad();
                    view.copy_(&grad)?;
                    p.set_grad(Some(view.share()));
                }
                views.of_param[index[i]] = Some(view);
            }
            views.buckets.push(flat);
        }
        Ok(())
    }
}

/// The reducer's hook for parameter `i` (`mark_variable_ready` with bucket views): the
/// gradient just accumulated is copied into the parameter's view of its bucket, which becomes
/// its `.grad`; the gradient backward made is freed. A gradient that is the view already (one
/// accumulated into in place) stays.
fn gradient_into_bucket(views: &Rc<RefCell<BucketViews>>, i: usize) -> impl Fn(&Tensor) -> Result<()> + 'static {
    let views = Rc::clone(views);
    move |leaf| {
        let view = {
            let mut views = views.borrow_mut();
            if !std::mem::replace(&mut views.has_arrived[i], true) {
                views.arrived.push(i);
            }
            views.of_param[i].as_ref().map(Tensor::share)
        };
        let (Some(view), Some(grad)) = (view, leaf.grad()) else { return Ok(()) };
        if grad.id() != view.id() {
            let _no_grad = autograd::no_grad();
            view.copy_(&grad)?;
            leaf.set_grad(Some(view));
        }
        Ok(())
    }
}

/// `_broadcast_coalesced(tensors, 250 MiB)`: the tensors in buckets of at least 250 MiB, at
/// most two in flight, each flattened into a new tensor (a bucket of one tensor is its own
/// flat view), copied back and freed when it finishes.
fn broadcast_coalesced<'a>(device: &Device, tensors: impl Iterator<Item = &'a Tensor>) -> Result<()> {
    let tensors: Vec<(usize, DType)> = tensors.map(|t| (t.numel(), t.dtype())).collect();
    let _scope = device.scope("DistributedDataParallel._sync_module_states");
    let mut in_flight: VecDeque<Option<Buffer>> = VecDeque::new();
    for bucket in bucket_assignment(&tensors, &[DDP_BROADCAST_BUCKET_BYTES]) {
        if in_flight.len() == 2 {
            in_flight.pop_front();
        }
        let bytes = bucket.iter().map(|&i| tensors[i].0 as u64 * tensors[i].1.size() as u64).sum::<u64>();
        in_flight.push_back(if bucket.len() == 1 { None } else { Some(device.buffer(bytes, "cat")?) });
    }
    Ok(())
}
