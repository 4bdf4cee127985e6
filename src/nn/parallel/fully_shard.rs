//! FSDP2 (`fully_shard`, `fsdp_version=2`): per-parameter shards, as torchtitan and accelerate's
//! `fsdp_version: 2` run it (torch/distributed/fsdp/_fully_shard).
//!
//! - Each parameter keeps a padded dim-0 shard of `ceil(dim0 / ranks)` rows (one allocation per
//!   parameter); the optimizer steps the rank's real rows, fewer on the last ranks when dim0 does
//!   not divide.
//! - A block's unshard allocates one flat all-gather output (every shard of the block times the
//!   ranks) on the all-gather stream, then copies it out into one unsharded buffer per parameter
//!   on the compute stream. In forward the previous block's output is released only once this
//!   one's exists (two alive); in backward it goes right after the copy-out, and the next block's
//!   all-gather is issued (prefetched) after this one's.
//! - After a block's backward: its unsharded parameters freed, the previous block's reduce-scatter
//!   input released, a flat input of the padded gradients allocated on the compute stream, the
//!   unsharded gradients freed, and the output on the reduce-scatter stream: the rank's sharded
//!   gradients are views of it (it lives until they are all dropped).
//! - The root is not resharded after forward.

use super::{ALL_GATHER_STREAM, BlockHooks, Parallel, REDUCE_SCATTER_STREAM};
use crate::device::Device;
use crate::tensor::{Buffer, Result, Tensor, TensorError};
use crate::trace::Category;
use std::cell::{Cell, RefCell};

/// A parameter's shard: `padded` elements kept, `local` of them the rank's real ones.
struct Shard {
    param: Tensor,
    padded: usize,
    /// Keeps the padded shard's memory.
    _storage: Option<Tensor>,
    /// What the optimizer steps: the rank's rows (no memory of its own).
    local: Tensor,
}

impl Shard {
    fn padded_bytes(&self) -> u64 {
        self.padded as u64 * self.param.dtype().size() as u64
    }
}

struct Group {
    name: String,
    shards: Vec<Shard>,
    /// The unsharded parameters while the group is unsharded (one buffer each).
    unsharded: RefCell<Vec<Buffer>>,
    /// A prefetched all-gather output, waiting for its copy-out.
    prefetched: RefCell<Option<Buffer>>,
    reduced: Cell<bool>,
}

/// The padded shard of a parameter of `shape` over `ranks` (dim 0 split), and the rank's real
/// elements of it.
pub fn shard_sizes(shape: &[usize], ranks: usize, rank: usize) -> (usize, usize) {
    let (dim0, rest) = match shape.split_first() {
        Some((&d, rest)) => (d, rest.iter().product::<usize>()),
        None => (1, 1),
    };
    let rows = dim0.div_ceil(ranks);
    let local = dim0.saturating_sub(rank * rows).min(rows);
    (rows * rest, local * rest)
}

/// One rank's FSDP2 state.
pub struct FullyShard {
    device: Device,
    /// The blocks in forward order, then the root.
    groups: Vec<Group>,
    ranks: usize,
    reshard_after_forward: bool,
    /// Forward's last all-gather output, kept until the next block's exists.
    saved: RefCell<Option<Buffer>>,
    /// The last reduce-scatter input, kept until the next block's post-backward.
    reduce_input: RefCell<Option<Buffer>>,
}

impl FullyShard {
    /// Shards `blocks` and the `root` for rank `rank` of `parallel`'s shard group. The
    /// parameters must have been made deferred.
    pub fn new(device: &Device, blocks: Vec<(String, Vec<Tensor>)>, root: Vec<Tensor>, parallel: &Parallel, rank: usize) -> Result<FullyShard> {
        let ranks = parallel.shard_world();
        let rank = rank % ranks;
        let _parameters = device.category(Category::Parameter);
        let mut groups = Vec::with_capacity(blocks.len() + 1);
        for (name, params) in blocks.into_iter().chain([("root".to_string(), root)]) {
            let _scope = device.scope(&format!("FSDP.{name}"));
            let shards = params
                .into_iter()
                .map(|param| {
                    let (padded, local) = shard_sizes(param.shape(), ranks, rank);
                    let storage = (padded > 0).then(|| device.zeros(&[padded], param.dtype())).transpose()?;
                    let view = device.unbacked(&[local], param.dtype())?;
                    view.requires_grad_(param.requires_grad())?;
                    Ok(Shard { param, padded, _storage: storage, local: view })
                })
                .collect::<Result<Vec<_>>>()?;
            groups.push(Group { name, shards, unsharded: RefCell::new(Vec::new()), prefetched: RefCell::new(None), reduced: Cell::new(false) });
        }
        Ok(FullyShard {
            device: device.clone(),
            groups,
            ranks,
            reshard_after_forward: parallel.reshard_after_forward,
            saved: RefCell::new(None),
            reduce_input: RefCell::new(None),
        })
    }

    /// The trainable shards' real rows, root first, as the optimizer takes them.
    pub fn optimizer_parameters(&self) -> Vec<Tensor> {
        let root = self.groups.last().into_iter();
        root.chain(&self.groups[..self.groups.len() - 1]).flat_map(|g| g.shards.iter().filter(|s| s.param.requires_grad()).map(|s| s.local.share())).collect()
    }

    fn root(&self) -> usize {
        self.groups.len() - 1
    }

    /// The root's pre-forward.
    pub fn begin_forward(&self) -> Result<()> {
        self.unshard(self.root(), true)
    }

    /// The root's post-forward: the last all-gather output released.
    pub fn end_forward(&self) {
        self.saved.take();
    }

    /// The final callback of backward: groups not yet reduced (a block whose input needs no
    /// gradient), then the root; everything resharded, the last reduce-scatter input released.
    pub fn finish_backward(&self) -> Result<()> {
        for group in 0..self.groups.len() {
            if !self.groups[group].reduced.get() {
                self.reduce(group)?;
            }
            self.reshard(group);
            self.groups[group].reduced.set(false);
            self.groups[group].prefetched.take();
        }
        self.reduce_input.take();
        Ok(())
    }

    fn all_gather_output(&self, g: &Group) -> Result<Buffer> {
        let _stream = self.device.stream(ALL_GATHER_STREAM);
        let bytes = g.shards.iter().map(Shard::padded_bytes).sum::<u64>() * self.ranks as u64;
        self.device.buffer(bytes, "all_gather")
    }

    /// `unshard` and `wait_for_unshard`: the flat all-gather output (prefetched, or made now),
    /// then one unsharded buffer per parameter copied out of it.
    fn unshard(&self, group: usize, forward: bool) -> Result<()> {
        let g = &self.groups[group];
        if !g.unsharded.borrow().is_empty() {
            return Ok(());
        }
        let _parameters = self.device.category(Category::Parameter);
        let _scope = self.device.scope(&format!("FSDP.{}.all_gather", g.name));
        let output = match g.prefetched.take() {
            Some(output) => output,
            None => self.all_gather_output(g)?,
        };
        if forward {
            // The previous block's output is released once this one's exists.
            self.saved.take();
        }
        let unsharded =
            g.shards.iter().map(|s| self.device.buffer(s.padded_bytes() * self.ranks as u64, "split_with_sizes_copy")).collect::<Result<Vec<_>>>()?;
        *g.unsharded.borrow_mut() = unsharded;
        if forward {
            *self.saved.borrow_mut() = Some(output);
        }
        Ok(())
    }

    fn prefetch(&self, group: usize) -> Result<()> {
        let g = &self.groups[group];
        if !g.unsharded.borrow().is_empty() || g.prefetched.borrow().is_some() {
            return Ok(());
        }
        let _parameters = self.device.category(Category::Parameter);
        let _scope = self.device.scope(&format!("FSDP.{}.all_gather", g.name));
        *g.prefetched.borrow_mut() = Some(self.all_gather_output(g)?);
        Ok(())
    }

    fn reshard(&self, group: usize) {
        self.groups[group].unsharded.borrow_mut().clear();
    }

    /// `post_backward` and `foreach_reduce`.
    fn reduce(&self, group: usize) -> Result<()> {
        let g = &self.groups[group];
        g.reduced.set(true);
        let with_grads: Vec<&Shard> = g.shards.iter().filter(|s| s.param.grad().is_some()).collect();
        self.reshard(group);
        if with_grads.is_empty() {
            return Ok(());
        }
        let dtype = with_grads[0].param.dtype();
        if with_grads.iter().any(|s| s.param.dtype() != dtype) {
            return Err(TensorError::Unsupported(format!("FSDP2 unit {}: gradients of several types in one group are not simulated", g.name)));
        }
        let _gradients = self.device.category(Category::Gradient);
        let _scope = self.device.scope(&format!("FSDP.{}.reduce_scatter", g.name));
        // The previous group's input is released before this one is made.
        self.reduce_input.take();
        let padded: usize = with_grads.iter().map(|s| s.padded).sum();
        let input = self.device.buffer(padded as u64 * dtype.size() as u64 * self.ranks as u64, "reduce_scatter")?;
        for s in &with_grads {
            s.param.set_grad(None);
        }
        let output = {
            let _stream = self.device.stream(REDUCE_SCATTER_STREAM);
            self.device.empty(&[padded], dtype)?
        };
        let mut offset = 0;
        for s in &with_grads {
            let view = output.narrow(0, offset, s.local.numel())?;
            offset += s.padded;
            match s.local.grad() {
                Some(sum) => {
                    sum.add_(&view)?;
                }
                None => s.local.set_grad(Some(view)),
            }
        }
        *self.reduce_input.borrow_mut() = Some(input);
        Ok(())
    }
}

impl BlockHooks for FullyShard {
    fn pre_forward(&self, block: usize) -> Result<()> {
        self.unshard(block, true)
    }

    fn post_forward(&self, block: usize) -> Result<()> {
        if self.reshard_after_forward {
            self.reshard(block);
        }
        Ok(())
    }

    fn pre_backward(&self, block: usize) -> Result<()> {
        self.unshard(block, false)?;
        match block.checked_sub(1) {
            Some(next) => self.prefetch(next),
            None => Ok(()),
        }
    }

    fn post_backward(&self, block: usize) -> Result<()> {
        self.reduce(block)
    }
}
