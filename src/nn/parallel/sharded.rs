//! Flat shards, one rank's share: FSDP's full sharding (`fsdp`, `hsdp`) and ZeRO-2 (`zero2`).
//!
//! Each unit (a block, and the root: every parameter outside the blocks) flattens its
//! parameters, per type and per trainable-or-frozen, pads them to a multiple of the ranks and
//! keeps 1/ranks of them. The optimizer sees only these shards: its state is 1/ranks of the
//! model's. After a unit's backward its gradients are reduce-scattered: a flat buffer of the
//! unit's padded size on the compute stream (FSDP1's padded unsharded gradient), the unsharded
//! gradients freed, and the rank's shard of the sum on the reduce-scatter stream, which becomes
//! the shard's gradient.
//!
//! Under `fsdp` the parameters themselves live only as shards (they are made without memory,
//! as on the meta device). A unit's full parameters are all-gathered into a flat buffer on the
//! all-gather stream before its forward and before its backward, and freed after each; the
//! root's stay from the start of forward to the end of backward, and in backward the next
//! unit's gather is issued with the current one's (`BACKWARD_PRE` prefetch). With
//! `reshard_after_forward` false (SHARD_GRAD_OP) a block's stay from its forward to the end of
//! its backward. Under `zero2` every
//! rank keeps the full parameters, and the shards are views of them.

use super::{ALL_GATHER_STREAM, BlockHooks, Parallel, REDUCE_SCATTER_STREAM};
use crate::device::Device;
use crate::tensor::{Buffer, DType, Result, Tensor, TensorError};
use crate::trace::Category;
use std::cell::{Cell, RefCell};

/// One rank's share of a flat parameter of `numel` elements over `ranks`: padded to a multiple
/// of the ranks, then split evenly.
pub fn shard_numel(numel: usize, ranks: usize) -> usize {
    numel.div_ceil(ranks)
}

/// [`shard_numel`] of a sum counted in u64 (a unit can hold more elements than a 32-bit
/// platform's usize), which must itself fit a tensor.
fn shard_of(params: &[Tensor], ranks: usize) -> Result<usize> {
    let numel: u64 = params.iter().map(|p| p.numel() as u64).sum();
    usize::try_from(numel.div_ceil(ranks as u64))
        .map_err(|_| TensorError::Shape(format!("a shard of {numel} elements over {ranks} ranks has more elements than this platform indexes")))
}

/// A unit's parameters of one type, trainable or frozen, flattened.
struct FlatGroup {
    params: Vec<Tensor>,
    dtype: DType,
    trainable: bool,
    /// This rank's shard: what the optimizer updates.
    shard: Tensor,
}

struct Unit {
    name: String,
    groups: Vec<FlatGroup>,
    /// The all-gathered flat parameters while the unit is unsharded.
    gathered: RefCell<Vec<Buffer>>,
    /// Its gradients were reduce-scattered in this backward.
    reduced: Cell<bool>,
}

/// The shards of a model on one rank.
pub struct Sharded {
    device: Device,
    /// The blocks in forward order, then the root.
    units: Vec<Unit>,
    ranks: usize,
    shards_parameters: bool,
    reshard_after_forward: bool,
}

impl Sharded {
    /// Shards `blocks` (each a name and its parameters) and the `root`'s parameters over the
    /// ranks of `parallel`. Under fsdp the parameters must have been made deferred.
    pub fn new(device: &Device, blocks: Vec<(String, Vec<Tensor>)>, root: Vec<Tensor>, parallel: &Parallel) -> Result<Sharded> {
        let ranks = parallel.shard_world();
        let shards_parameters = parallel.shards_parameters();
        let _parameters = device.category(Category::Parameter);
        let mut units = Vec::with_capacity(blocks.len() + 1);
        for (name, params) in blocks.into_iter().chain([("root".to_string(), root)]) {
            let _scope = device.scope(&format!("FSDP.{name}"));
            let mut groups: Vec<FlatGroup> = Vec::new();
            for p in params {
                let (dtype, trainable) = (p.dtype(), p.requires_grad());
                match groups.iter_mut().find(|g| g.dtype == dtype && g.trainable == trainable) {
                    Some(g) => g.params.push(p),
                    None => groups.push(FlatGroup { params: vec![p], dtype, trainable, shard: device.unbacked(&[0], dtype)? }),
                }
            }
            for g in &mut groups {
                let numel = shard_of(&g.params, ranks)?;
                g.shard = if shards_parameters { device.empty(&[numel], g.dtype)? } else { device.unbacked(&[numel], g.dtype)? };
                g.shard.requires_grad_(g.trainable)?;
            }
            units.push(Unit { name, groups, gathered: RefCell::new(Vec::new()), reduced: Cell::new(false) });
        }
        Ok(Sharded { device: device.clone(), units, ranks, shards_parameters, reshard_after_forward: parallel.reshard_after_forward })
    }

    /// The trainable shards, root first, as the optimizer takes them.
    pub fn optimizer_parameters(&self) -> Vec<Tensor> {
        let root = self.units.last().into_iter();
        root.chain(&self.units[..self.units.len() - 1]).flat_map(|u| u.groups.iter().filter(|g| g.trainable).map(|g| g.shard.share())).collect()
    }

    fn root(&self) -> usize {
        self.units.len() - 1
    }

    /// The root's pre-forward: its parameters gathered for the whole step.
    pub fn begin_forward(&self) -> Result<()> {
        self.gather(self.root())
    }

    /// The end of backward (FSDP's final callback): the units whose gradients did not pass a
    /// block's input (a frozen first block's input) are reduced, then the root, and the root
    /// resharded.
    pub fn finish_backward(&self) -> Result<()> {
        for unit in 0..self.units.len() {
            if !self.units[unit].reduced.get() {
                self.reduce(unit)?;
            }
            self.reshard(unit);
            self.units[unit].reduced.set(false);
        }
        Ok(())
    }

    fn gather(&self, unit: usize) -> Result<()> {
        let u = &self.units[unit];
        if !self.shards_parameters || !u.gathered.borrow().is_empty() {
            return Ok(());
        }
        let _stream = self.device.stream(ALL_GATHER_STREAM);
        let _parameters = self.device.category(Category::Parameter);
        let _scope = self.device.scope(&format!("FSDP.{}.all_gather", u.name));
        let bytes = |g: &FlatGroup| g.shard.numel() as u64 * g.dtype.size() as u64 * self.ranks as u64;
        let gathered = u.groups.iter().map(|g| self.device.buffer(bytes(g), "all_gather")).collect::<Result<Vec<_>>>()?;
        *u.gathered.borrow_mut() = gathered;
        Ok(())
    }

    fn reshard(&self, unit: usize) {
        self.units[unit].gathered.borrow_mut().clear();
    }

    /// Reduce-scatters a unit's gradients into its shards' gradients.
    fn reduce(&self, unit: usize) -> Result<()> {
        let u = &self.units[unit];
        u.reduced.set(true);
        let _gradients = self.device.category(Category::Gradient);
        let _scope = self.device.scope(&format!("FSDP.{}.reduce_scatter", u.name));
        for g in u.groups.iter().filter(|g| g.trainable && g.params.iter().any(|p| p.grad().is_some())) {
            let shard = g.shard.numel();
            // The padded flat gradient, on the compute stream where backward made it.
            let input = self.device.buffer(shard as u64 * g.dtype.size() as u64 * self.ranks as u64, "reduce_scatter")?;
            for p in &g.params {
                p.set_grad(None);
            }
            let output = {
                let _stream = self.device.stream(REDUCE_SCATTER_STREAM);
                self.device.empty(&[shard], g.dtype)?
            };
            drop(input);
            match g.shard.grad() {
                None => g.shard.set_grad(Some(output)),
                Some(sum) => {
                    sum.add_(&output)?;
                }
            }
        }
        Ok(())
    }
}

impl BlockHooks for Sharded {
    fn pre_forward(&self, block: usize) -> Result<()> {
        self.gather(block)
    }

    fn post_forward(&self, block: usize) -> Result<()> {
        if self.reshard_after_forward {
            self.reshard(block);
        }
        Ok(())
    }

    fn pre_backward(&self, block: usize) -> Result<()> {
        self.gather(block)?;
        match block.checked_sub(1) {
            Some(next) => self.gather(next),
            None => Ok(()),
        }
    }

    fn post_backward(&self, block: usize) -> Result<()> {
        self.reduce(block)?;
        self.reshard(block);
        Ok(())
    }
}
