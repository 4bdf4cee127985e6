//! Data parallelism over several GPUs, one rank at a time: what each rank's caching allocator
//! sees under PyTorch's `DistributedDataParallel` (`ddp`), DDP with
//! `ZeroRedundancyOptimizer` (`zero1`: optimizer state partitioned by parameter), gradients
//! reduce-scattered into flat shards after each block (`zero2`), and FSDP's full sharding
//! (`fsdp`; `hsdp` shards within a node and replicates across nodes).
//!
//! Collectives move bytes between ranks but allocate on each rank exactly what one rank does:
//! NCCL writes in place into buffers the caching allocator gave, on a stream of its own. So a
//! rank is simulated alone, and ranks whose allocations are identical (all of them, except
//! under `zero1`'s uneven partition) are simulated once.

mod ddp;
mod fully_shard;
mod sharded;
mod strategy;
mod zero;

pub use ddp::{DDP_BROADCAST_BUCKET_BYTES, DDP_BUCKET_BYTES, DDP_FIRST_BUCKET_BYTES, Ddp, bucket_assignment};
pub use fully_shard::{FullyShard, shard_sizes};
pub use sharded::{Sharded, shard_numel};
pub use strategy::{DataParallel, RankWrapper, Replica, Strategy, Unwrapped};
pub use zero::partition_parameters;

use crate::autograd;
use crate::tensor::{Result, Tensor, TensorError};
use std::rc::Rc;

/// The stream NCCL's all-gathers allocate on (FSDP's `all_gather_stream`).
pub const ALL_GATHER_STREAM: crate::alloc::Stream = 1;
/// The stream reduce-scatters allocate on (FSDP's `reduce_scatter_stream`).
pub const REDUCE_SCATTER_STREAM: crate::alloc::Stream = 2;

/// How ddp and zero1 all-reduce the gradients (`ddp_reducer`).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum DdpReducer {
    /// torch's `DistributedDataParallel` (`gradient_as_bucket_view=False`, its default): the
    /// reducer's buckets, one more copy of every gradient.
    Buckets,
    /// torch's `DistributedDataParallel(gradient_as_bucket_view=True)`: the gradients are views
    /// of the buckets, held once.
    Views,
    /// No reducer: each gradient all-reduced in place after backward, as a hand-written DDP
    /// does (`dist.all_reduce(p.grad)` over the parameters); parameters broadcast in place.
    None,
}

impl DdpReducer {
    pub const NAMES: &'static [&'static str] = &["buckets", "views", "none"];

    pub fn parse(name: &str) -> Option<DdpReducer> {
        Some(match name {
            "buckets" => DdpReducer::Buckets,
            "views" => DdpReducer::Views,
            "none" => DdpReducer::None,
            _ => return None,
        })
    }
}

/// The ranks and how they split the work: `tp` ranks split each layer (tensor parallelism,
/// innermost: ranks `k * tp .. (k + 1) * tp` hold one model replica), and the `world / tp`
/// replicas train data-parallel under `strategy`.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Parallel {
    pub world: usize,
    pub tp: usize,
    pub strategy: Strategy,
    /// GPUs per node: `hsdp` shards over this many ranks.
    pub node: usize,
    /// fsdp, hsdp: a block's gathered parameters are freed after its forward (FULL_SHARD) or
    /// kept until its backward has run (`reshard_after_forward=False`, SHARD_GRAD_OP).
    pub reshard_after_forward: bool,
    /// fsdp, hsdp: 1 (FlatParameter shards, `FullyShardedDataParallel`) or 2 (per-parameter
    /// shards, `fully_shard`).
    pub fsdp_version: u8,
    /// ddp, zero1: torch's reducer (its buckets, or gradients as views of them) or none.
    pub ddp_reducer: DdpReducer,
}

impl Parallel {
    pub fn single() -> Parallel {
        Parallel { world: 1, tp: 1, strategy: Strategy::DDP, node: 8, reshard_after_forward: true, fsdp_version: 1, ddp_reducer: DdpReducer::Buckets }
    }

    /// The data-parallel ranks: model replicas.
    pub fn dp(&self) -> usize {
        self.world / self.tp
    }

    /// A rank's place among the replicas.
    pub fn dp_rank(&self, rank: usize) -> usize {
        rank / self.tp
    }

    /// A rank's place in its shard group.
    pub fn shard_rank(&self, rank: usize) -> usize {
        self.dp_rank(rank) % self.shard_world()
    }

    /// The replicas one shard is split over: all of them, or a node's under `hsdp`.
    pub fn shard_world(&self) -> usize {
        self.strategy.shard_world(self)
    }

    /// Whether parameters live in shards between uses (FSDP, HSDP).
    pub fn shards_parameters(&self) -> bool {
        self.strategy.shards_parameters()
    }
}

/// What a strategy does around each block (one FSDP unit: a transformer layer): the module
/// hooks FSDP registers. `block` counts from 0 in forward order.
pub trait BlockHooks {
    fn pre_forward(&self, block: usize) -> Result<()>;
    fn post_forward(&self, block: usize) -> Result<()>;
    /// The block's output gradient has arrived; its backward is about to run.
    fn pre_backward(&self, block: usize) -> Result<()>;
    /// The block's backward has run: every gradient of its parameters is accumulated.
    fn post_backward(&self, block: usize) -> Result<()>;
}

/// Hooks a model runs its blocks with (None: no strategy).
pub type Hooks = Option<Rc<dyn BlockHooks>>;

/// Runs block `block` as `f(x)` inside its hooks: pre-forward, then identity nodes on its input
/// and output whose backward runs the post- and pre-backward hooks (as PyTorch's
/// `BackwardHookFunction`: views, no memory). Checkpointing belongs inside `f`: a recomputation
/// in backward runs no forward hooks.
#[track_caller]
pub fn run_block(hooks: &Hooks, block: usize, x: &Tensor, f: impl FnOnce(&Tensor) -> Result<Tensor>) -> Result<Tensor> {
    let Some(hooks) = hooks else { return f(x) };
    hooks.pre_forward(block)?;
    let after = Rc::clone(hooks);
    let x = backward_hook(x, move || after.post_backward(block));
    let y = f(&x)?;
    hooks.post_forward(block)?;
    let before = Rc::clone(hooks);
    Ok(backward_hook(&y, move || before.pre_backward(block)))
}

/// `x` itself, with `hook` run when its gradient passes backward.
#[track_caller]
fn backward_hook(x: &Tensor, hook: impl Fn() -> Result<()> + 'static) -> Tensor {
    if !autograd::records(&[x]) {
        return x.share();
    }
    autograd::record(
        "BackwardHookFunctionBackward",
        &[x],
        x.alias(),
        &[],
        Box::new(move |_, g| {
            let _named = g.device().hook_frames();
            hook()?;
            Ok(vec![Some(g.share())])
        }),
    )
}

/// Checks a strategy against the ranks: a shard group must divide the world.
pub fn check(parallel: &Parallel) -> std::result::Result<(), String> {
    if parallel.tp == 0 || !parallel.world.is_multiple_of(parallel.tp) {
        return Err(format!("tp={} must divide world={}: the ranks are world / tp replicas of tp ranks each", parallel.tp, parallel.world));
    }
    if parallel.dp() == 1 && parallel.strategy.needs_replicas() {
        let ranks = if parallel.tp > 1 { format!("world={} with tp={} is one replica", parallel.world, parallel.tp) } else { "world=1 is one GPU".into() };
        return Err(format!("strategy={} shards over several data-parallel ranks: set world ({ranks})", parallel.strategy.name()));
    }
    parallel.strategy.check(parallel)
}

/// A refusal for the GPU device: ranks are simulated.
pub fn needs_sim() -> TensorError {
    TensorError::Unsupported("several GPUs are simulated on the sim device (--device sim:CARD): this machine has one GPU".into())
}
