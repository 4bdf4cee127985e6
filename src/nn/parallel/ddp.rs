//! `torch.nn.parallel.DistributedDataParallel` as each rank's allocator sees it: the module's
//! state broadcast from rank 0 in flattened buckets at construction, then gradient buckets
//! the reducer keeps (`gradient_as_bucket_view=False`, the default: each `.grad` is written
//! into its bucket's view, the bucket all-reduced in place and copied back, so every rank holds
//! its gradients twice). The first buckets hold everything, one per type; at the second
//! forward they are rebuilt as 1 MiB then 25 MiB buckets in the order gradients arrived.

use crate::device::Device;
use crate::tensor::{Buffer, DType, Result, Tensor};
use crate::trace::Category;
use std::collections::VecDeque;

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
    /// The parameters in the order their gradients became ready in the first backward.
    ready: Option<Vec<usize>>,
    rebuilt: bool,
}

impl Ddp {
    /// Wraps a model whose trainable parameters are `params` and whose every parameter, frozen
    /// ones included, is `module_states` (both in registration order): broadcasts the module
    /// from rank 0, then makes the first buckets: with `find_unused_parameters=False` (the
    /// default) one per type, holding every parameter (`[sys.maxsize]` limits, "put all params
    /// in one bucket initially").
    pub fn new(device: &Device, params: &[Tensor], module_states: &[Tensor]) -> Result<Ddp> {
        broadcast_coalesced(device, module_states.iter())?;
        let shared = params.iter().map(Tensor::share).collect();
        let mut ddp = Ddp { device: device.clone(), params: shared, buckets: Vec::new(), ready: None, rebuilt: false };
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
        // A gradient's tensor id orders it by when it was made in backward.
        let mut ready: Vec<usize> = (0..self.params.len()).filter(|&i| self.params[i].grad().is_some()).collect();
        ready.sort_by_key(|&i| self.params[i].grad().map(|g| g.id()));
        self.ready = Some(ready);
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
        self.allocate(&assignment, &(0..self.params.len()).collect::<Vec<_>>())
    }

    fn allocate(&mut self, assignment: &[Vec<usize>], index: &[usize]) -> Result<()> {
        let _gradients = self.device.category(Category::Gradient);
        let _scope = self.device.scope("DistributedDataParallel.reducer");
        for bucket in assignment {
            let bytes = bucket.iter().map(|&i| self.params[index[i]].numel() as u64 * self.params[index[i]].dtype().size() as u64).sum::<u64>();
            self.buckets.push(self.device.buffer(bytes, "empty")?);
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
