//! The data-parallel strategies, one type each and one row in `STRATEGIES`: a strategy's name
//! and help (which the CLI, MCP, the page and `fit` read from here), what its ranks hold, and
//! what it wraps around one rank's training step. Adding one: a type implementing
//! `DataParallel`, and its row.

use super::{Ddp, DdpReducer, FullyShard, Hooks, Parallel, Sharded, partition_parameters, shard_sizes};
use crate::device::Device;
use crate::dtype::DType;
use crate::tensor::{Result, Tensor};
use std::rc::Rc;
use std::sync::LazyLock;

/// The model a strategy wraps, as it needs it.
pub trait Replica {
    /// The parameters that train, in registration order.
    fn trainable(&self) -> Vec<Tensor>;
    /// Every parameter, frozen ones included.
    fn all_parameters(&self) -> Vec<Tensor>;
    /// Each block's name and parameters, in forward order (FSDP's units).
    fn blocks(&self) -> Vec<(String, Vec<Tensor>)>;
    fn set_hooks(&mut self, hooks: Hooks);
}

/// What a strategy does at the edges of one rank's forward and backward.
pub trait RankWrapper {
    /// Before each forward (the root's pre-forward; DDP's bucket rebuild).
    fn before_forward(&mut self) -> Result<()> {
        Ok(())
    }
    /// After each forward (the root's post-forward).
    fn after_forward(&mut self) {}
    /// After each backward (the final callback; DDP's gradient-ready order).
    fn after_backward(&mut self) -> Result<()> {
        Ok(())
    }
}

/// No wrapper: one replica, or in-place collectives that allocate nothing.
pub struct Unwrapped;
impl RankWrapper for Unwrapped {}

/// One way of spreading parameters, gradients and optimizer state over data-parallel ranks.
pub trait DataParallel: Sync {
    fn name(&self) -> &'static str;
    /// What it does, for `--help` and the page (a phrase after its name).
    fn help(&self) -> &'static str;
    /// Whether it shards over several data-parallel ranks (every strategy but plain DDP).
    fn needs_replicas(&self) -> bool {
        true
    }
    /// Whether parameters live in shards between uses.
    fn shards_parameters(&self) -> bool {
        false
    }
    /// The replicas one shard is split over.
    fn shard_world(&self, parallel: &Parallel) -> usize {
        parallel.dp()
    }
    /// Whether "what fits" compares it unless told otherwise (`tensormem fit`, the page).
    fn in_fit_table(&self) -> bool {
        true
    }
    /// Its own refusals of a set of ranks.
    fn check(&self, _parallel: &Parallel) -> std::result::Result<(), String> {
        Ok(())
    }
    /// Ranks that allocate alike, each class in rank order: all of them, but where
    /// `fully_shard` (fsdp_version=2) gives the last ranks fewer rows.
    fn rank_classes(&self, parallel: &Parallel, parameters: &[Tensor]) -> Vec<Vec<usize>> {
        if self.shards_parameters() && parallel.fsdp_version == 2 {
            return fully_shard_classes(parallel, parameters);
        }
        vec![(0..parallel.world).collect()]
    }
    /// Wraps one rank's model: the wrapper, and the parameters the rank's optimizer steps.
    fn wrap(&self, device: &Device, model: &mut dyn Replica, parallel: &Parallel, rank: usize) -> Result<(Box<dyn RankWrapper>, Vec<Tensor>)>;
}

/// A strategy of the registry (copied freely; equal when it is the same row).
#[derive(Clone, Copy)]
pub struct Strategy(&'static dyn DataParallel);

impl PartialEq for Strategy {
    fn eq(&self, other: &Strategy) -> bool {
        self.name() == other.name()
    }
}
impl Eq for Strategy {}

impl std::fmt::Debug for Strategy {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(self.name())
    }
}

impl std::ops::Deref for Strategy {
    type Target = dyn DataParallel;
    fn deref(&self) -> &Self::Target {
        self.0
    }
}

/// The registry, in the order the CLI and the page list them.
const STRATEGIES: [Strategy; 5] = [Strategy(&DdpStrategy), Strategy(&Zero1), Strategy(&Zero2), Strategy(&Fsdp), Strategy(&Hsdp)];

impl Strategy {
    pub const DDP: Strategy = STRATEGIES[0];

    /// Every strategy's name, in the registry's order.
    pub fn names() -> &'static [&'static str] {
        static NAMES: LazyLock<Vec<&'static str>> = LazyLock::new(|| STRATEGIES.iter().map(|s| s.name()).collect());
        &NAMES
    }

    /// The `strategy` parameter's help: each strategy with what it does.
    pub fn parameter_help() -> &'static str {
        static HELP: LazyLock<String> = LazyLock::new(|| {
            let items: Vec<String> = STRATEGIES.iter().map(|s| format!("{} ({})", s.name(), s.help())).collect();
            let (last, rest) = items.split_last().expect("strategies");
            format!("with world > 1: {} or {last}", rest.join(", "))
        });
        &HELP
    }

    /// The strategies "what fits" compares unless told otherwise.
    pub fn fit_defaults() -> &'static [&'static str] {
        static NAMES: LazyLock<Vec<&'static str>> = LazyLock::new(|| STRATEGIES.iter().filter(|s| s.in_fit_table()).map(|s| s.name()).collect());
        &NAMES
    }

    pub fn parse(name: &str) -> Option<Strategy> {
        STRATEGIES.into_iter().find(|s| s.name() == name)
    }
}

/// torch's `DistributedDataParallel`: everything on every rank.
struct DdpStrategy;
/// DDP with `ZeroRedundancyOptimizer`.
struct Zero1;
/// Gradients and optimizer state in flat shards.
struct Zero2;
/// FULL_SHARD: parameters in shards too.
struct Fsdp;
/// FSDP within a node, replicated across nodes (HYBRID_SHARD).
struct Hsdp;

/// DDP's reducer as `ddp_reducer` asks, around a rank that steps `stepped`.
fn wrap_ddp(device: &Device, model: &dyn Replica, parallel: &Parallel, stepped: Vec<Tensor>) -> Result<(Box<dyn RankWrapper>, Vec<Tensor>)> {
    let wrapper: Box<dyn RankWrapper> = match parallel.ddp_reducer {
        DdpReducer::Buckets | DdpReducer::Views => {
            Box::new(Ddp::new(device, &model.trainable(), &model.all_parameters(), parallel.ddp_reducer == DdpReducer::Views)?)
        }
        // Broadcasts and all-reduces in place allocate nothing.
        DdpReducer::None => Box::new(Unwrapped),
    };
    Ok((wrapper, stepped))
}

impl DataParallel for DdpStrategy {
    fn name(&self) -> &'static str {
        "ddp"
    }
    fn help(&self) -> &'static str {
        "DistributedDataParallel: everything on every rank, gradients all-reduced from buckets the reducer keeps: one of every gradient, \
         rebuilt after the first backward as 1 MiB then 25 MiB ones"
    }
    fn needs_replicas(&self) -> bool {
        false
    }
    fn wrap(&self, device: &Device, model: &mut dyn Replica, parallel: &Parallel, _rank: usize) -> Result<(Box<dyn RankWrapper>, Vec<Tensor>)> {
        wrap_ddp(device, model, parallel, model.trainable())
    }
}

/// ZeroRedundancyOptimizer's partition of every parameter (frozen ones too) over `world`
/// data-parallel ranks: each rank's parameter indices, largest first.
fn zero1_partition(parameters: &[Tensor], world: usize) -> Vec<Vec<usize>> {
    let numels: Vec<usize> = parameters.iter().map(Tensor::numel).collect();
    partition_parameters(&numels, world)
}

/// The trainable parameters a rank steps under zero1, of the indices it `owns`, in the order
/// its local optimizer holds them.
fn zero1_owned(parameters: &[Tensor], owns: &[usize]) -> Vec<Tensor> {
    owns.iter().map(|&i| &parameters[i]).filter(|p| p.requires_grad()).map(Tensor::share).collect()
}

impl DataParallel for Zero1 {
    fn name(&self) -> &'static str {
        "zero1"
    }
    fn help(&self) -> &'static str {
        "DDP with ZeroRedundancyOptimizer: each parameter's optimizer state on one rank"
    }
    /// Each rank owns a different set of parameters: ranks that step the same shapes and types
    /// allocate alike.
    fn rank_classes(&self, parallel: &Parallel, parameters: &[Tensor]) -> Vec<Vec<usize>> {
        type Owned = Vec<(Vec<usize>, DType)>;
        let mut classes: Vec<(Owned, Vec<usize>)> = Vec::new();
        // Partitioned once: a partition per rank would cost world x world x parameters.
        let partition = zero1_partition(parameters, parallel.dp());
        for rank in 0..parallel.world {
            let shapes: Owned = zero1_owned(parameters, &partition[parallel.dp_rank(rank)]).iter().map(|p| (p.shape().to_vec(), p.dtype())).collect();
            match classes.iter_mut().find(|(s, _)| *s == shapes) {
                Some((_, ranks)) => ranks.push(rank),
                None => classes.push((shapes, vec![rank])),
            }
        }
        classes.into_iter().map(|(_, ranks)| ranks).collect()
    }
    fn wrap(&self, device: &Device, model: &mut dyn Replica, parallel: &Parallel, rank: usize) -> Result<(Box<dyn RankWrapper>, Vec<Tensor>)> {
        let all = model.all_parameters();
        let stepped = zero1_owned(&all, &zero1_partition(&all, parallel.dp())[parallel.dp_rank(rank)]);
        wrap_ddp(device, model, parallel, stepped)
    }
}

/// Zero2, fsdp and hsdp: each block a unit of flat shards (`Sharded`), or under fsdp and hsdp
/// with `fsdp_version=2` of per-parameter shards (`FullyShard`), run through the model's hooks.
fn wrap_sharded(device: &Device, model: &mut dyn Replica, parallel: &Parallel, rank: usize) -> Result<(Box<dyn RankWrapper>, Vec<Tensor>)> {
    let blocks = model.blocks();
    let in_blocks: std::collections::HashSet<u64> = blocks.iter().flat_map(|(_, ps)| ps.iter().map(Tensor::id)).collect();
    let root = model.all_parameters().into_iter().filter(|p| !in_blocks.contains(&p.id())).collect();
    if parallel.shards_parameters() && parallel.fsdp_version == 2 {
        let fully = Rc::new(FullyShard::new(device, blocks, root, parallel, rank)?);
        model.set_hooks(Some(Rc::clone(&fully) as _));
        let stepped = fully.optimizer_parameters();
        Ok((Box::new(fully), stepped))
    } else {
        let sharded = Rc::new(Sharded::new(device, blocks, root, parallel)?);
        model.set_hooks(Some(Rc::clone(&sharded) as _));
        let stepped = sharded.optimizer_parameters();
        Ok((Box::new(sharded), stepped))
    }
}

/// `fully_shard`'s last ranks step fewer rows where dim 0 does not divide: ranks with the same
/// local sizes allocate alike.
fn fully_shard_classes(parallel: &Parallel, parameters: &[Tensor]) -> Vec<Vec<usize>> {
    let mut classes: Vec<(Vec<usize>, Vec<usize>)> = Vec::new();
    for rank in 0..parallel.world {
        let local: Vec<usize> = parameters.iter().map(|p| shard_sizes(p.shape(), parallel.shard_world(), parallel.shard_rank(rank)).1).collect();
        match classes.iter_mut().find(|(l, _)| *l == local) {
            Some((_, ranks)) => ranks.push(rank),
            None => classes.push((local, vec![rank])),
        }
    }
    classes.into_iter().map(|(_, ranks)| ranks).collect()
}

impl DataParallel for Zero2 {
    fn name(&self) -> &'static str {
        "zero2"
    }
    fn help(&self) -> &'static str {
        "gradients and optimizer state in flat shards, one per data-parallel rank, reduce-scattered after each block"
    }
    fn wrap(&self, device: &Device, model: &mut dyn Replica, parallel: &Parallel, rank: usize) -> Result<(Box<dyn RankWrapper>, Vec<Tensor>)> {
        wrap_sharded(device, model, parallel, rank)
    }
}

impl DataParallel for Fsdp {
    fn name(&self) -> &'static str {
        "fsdp"
    }
    fn help(&self) -> &'static str {
        "FULL_SHARD: parameters too; a block's parameters all-gathered while it runs"
    }
    fn shards_parameters(&self) -> bool {
        true
    }
    fn wrap(&self, device: &Device, model: &mut dyn Replica, parallel: &Parallel, rank: usize) -> Result<(Box<dyn RankWrapper>, Vec<Tensor>)> {
        wrap_sharded(device, model, parallel, rank)
    }
}

impl DataParallel for Hsdp {
    fn name(&self) -> &'static str {
        "hsdp"
    }
    fn help(&self) -> &'static str {
        "fsdp within a node, replicated across nodes"
    }
    fn shards_parameters(&self) -> bool {
        true
    }
    /// On one node it is fsdp; across nodes it needs `node` and `world` chosen together.
    fn in_fit_table(&self) -> bool {
        false
    }
    fn shard_world(&self, parallel: &Parallel) -> usize {
        (parallel.node / parallel.tp).clamp(1, parallel.dp())
    }
    fn check(&self, parallel: &Parallel) -> std::result::Result<(), String> {
        if parallel.node < parallel.tp || !parallel.node.is_multiple_of(parallel.tp) {
            return Err(format!("hsdp shards within a node: node={} must be a multiple of tp={} (a node holds whole replicas)", parallel.node, parallel.tp));
        }
        if !parallel.dp().is_multiple_of(parallel.shard_world()) {
            return Err(format!(
                "hsdp shards within a node of {} GPUs: world={} is not a whole number of nodes (set world to a multiple of {}, or node to a divisor of {})",
                parallel.node, parallel.world, parallel.node, parallel.world
            ));
        }
        Ok(())
    }
    fn wrap(&self, device: &Device, model: &mut dyn Replica, parallel: &Parallel, rank: usize) -> Result<(Box<dyn RankWrapper>, Vec<Tensor>)> {
        wrap_sharded(device, model, parallel, rank)
    }
}

impl RankWrapper for Ddp {
    fn before_forward(&mut self) -> Result<()> {
        Ddp::before_forward(self)
    }
    fn after_backward(&mut self) -> Result<()> {
        Ddp::after_backward(self);
        Ok(())
    }
}

impl RankWrapper for Rc<Sharded> {
    fn before_forward(&mut self) -> Result<()> {
        self.begin_forward()
    }
    fn after_backward(&mut self) -> Result<()> {
        self.finish_backward()
    }
}

impl RankWrapper for Rc<FullyShard> {
    fn before_forward(&mut self) -> Result<()> {
        self.begin_forward()
    }
    fn after_forward(&mut self) {
        self.end_forward()
    }
    fn after_backward(&mut self) -> Result<()> {
        self.finish_backward()
    }
}
