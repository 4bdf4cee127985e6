//! `private-pools`: memory held in pools of their own by CUDA graphs (`torch.cuda.graph`,
//! `torch.compile(mode="reduce-overhead")`) and by `torch.cuda.MemPool`, which the rest of the
//! program cannot use. Read from the snapshot's segments (their `segment_pool_id`): the trace of
//! PyTorch's releases does not say which pool an allocation went to, so this looks at the state
//! the file ends in, not at its peak.
//!
//! Its bytes are the pools' cached free bytes: memory reserved that no live tensor holds and no
//! allocation outside the pool can get. What deleting the pools' owners would give back is
//! measured by the allocator: the state restored, every pool released, `empty_cache()`.

use super::Material;
use super::kinds::{Kind, Role};
use super::{DoctorError, Finding, PRIVATE_POOLS, Patient, size};
use crate::alloc::{DEFAULT_POOL, PoolId, VirtualAllocator};
use crate::replay;
use crate::trace::Segment;
use serde::{Deserialize, Serialize};

pub(super) const KIND: Kind = Kind {
    name: PRIVATE_POOLS,
    label: "private pools",
    about: "memory CUDA graphs' and MemPools' own pools hold, which no other allocation can use",
    role: Role::Problem,
    find: |x| find(&x.patient),
    material: Material { share: 0.05, min_bytes: 20 << 20 },
};

#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct Pool {
    /// `segment_pool_id`: `(0, N)` a pool the program made (`graph_pool_handle()`, `MemPool()`),
    /// `(N, 0)` one a CUDA graph made for itself.
    pub pool: PoolId,
    pub segments: usize,
    pub reserved_bytes: u64,
    /// Blocks of live tensors, and of tensors freed but waiting on another stream.
    pub active_bytes: u64,
    /// Cached free blocks: only allocations into this pool can use them.
    pub free_bytes: u64,
}

#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct PrivatePoolsEvidence {
    pub device: i64,
    /// Every device segment's bytes, and the private pools' share.
    pub reserved_bytes: u64,
    pub private_reserved_bytes: u64,
    pub private_free_bytes: u64,
    /// What `empty_cache()` returns once nothing uses the pools (their graphs deleted, their
    /// MemPools dropped), by the allocator on the restored state; None if it could not restore it.
    pub returned_if_released_bytes: Option<u64>,
    pub pools: Vec<Pool>,
}

fn find(p: &Patient) -> Result<Option<Finding>, DoctorError> {
    let segments: Vec<&Segment> = p.snapshot.segments_of(p.device).collect();
    let mut pools: Vec<Pool> = Vec::new();
    for s in segments.iter().filter(|s| s.segment_pool_id != DEFAULT_POOL) {
        let active: u64 = s.blocks.iter().filter(|b| b.state.is_active()).map(|b| b.size).sum();
        let pool = match pools.iter_mut().find(|q| q.pool == s.segment_pool_id) {
            Some(pool) => pool,
            None => {
                pools.push(Pool { pool: s.segment_pool_id, segments: 0, reserved_bytes: 0, active_bytes: 0, free_bytes: 0 });
                pools.last_mut().expect("just pushed")
            }
        };
        pool.segments += 1;
        pool.reserved_bytes += s.total_size;
        pool.active_bytes += active;
        pool.free_bytes += s.total_size - active;
    }
    if pools.is_empty() {
        return Ok(None);
    }
    pools.sort_by(|a, b| b.reserved_bytes.cmp(&a.reserved_bytes).then(a.pool.cmp(&b.pool)));
    let reserved: u64 = segments.iter().map(|s| s.total_size).sum();
    let private: u64 = pools.iter().map(|q| q.reserved_bytes).sum();
    let free: u64 = pools.iter().map(|q| q.free_bytes).sum();
    if !KIND.material.holds(free, reserved) {
        return Ok(None);
    }
    let returned = returned_if_released(p, &segments, &pools)?;
    let title = format!(
        "Private pools (CUDA graphs, MemPool) hold {} of the {} reserved; {} of it is cached free, which only their own allocations can use",
        size(private),
        size(reserved),
        size(free)
    );
    let why = "Memory allocated while a CUDA graph is captured (torch.cuda.graph, torch.compile's reduce-overhead mode) or \
               inside torch.cuda.use_mem_pool comes from a private pool. Its freed blocks stay there for that graph's replays or \
               that pool's allocations: the rest of the program cannot use them, and torch.cuda.empty_cache() returns a pool's \
               free segments only once no graph or MemPool uses it any more."
        .to_string();
    let given_back = match returned {
        Some(bytes) => format!(
            "empty_cache() then returns {} (measured: this state restored, every pool released, the cache emptied); the rest \
             holds live tensors, such as the graphs' outputs and static inputs.",
            size(bytes)
        ),
        None => "empty_cache() then returns their wholly free segments.".to_string(),
    };
    let fix = format!(
        "If the graphs or MemPools that own these pools are no longer needed, delete them (del g or g.reset(), del pool): \
         {given_back} While they are needed, hold less: let graphs share one pool (torch.cuda.graph(g, \
         pool=torch.cuda.graph_pool_handle()), or pool=g1.pool()), capturing the largest batch first so the smaller ones \
         reuse what it freed; capture fewer sizes; keep use_mem_pool scopes to the allocations that need them."
    );
    let evidence = PrivatePoolsEvidence {
        device: p.device,
        reserved_bytes: reserved,
        private_reserved_bytes: private,
        private_free_bytes: free,
        returned_if_released_bytes: returned,
        pools,
    };
    Ok(Some(Finding::new(title, free, evidence, why, fix)))
}

/// Reserved bytes `empty_cache()` returns once every private pool is released, from the
/// allocator on the snapshot's state; None where that state cannot be restored.
fn returned_if_released(p: &Patient, segments: &[&Segment], pools: &[Pool]) -> Result<Option<u64>, DoctorError> {
    let mut alloc = VirtualAllocator::virtual_with(replay::recorded_config(p.snapshot)?);
    let state: Vec<Segment> = segments.iter().map(|s| (*s).clone()).collect();
    if alloc.restore(&state).is_err() {
        return Ok(None);
    }
    let before = alloc.reserved();
    for pool in pools {
        if alloc.release_pool(pool.pool).is_err() {
            return Ok(None);
        }
    }
    // Only the pools' segments: the default pool's cache is another finding's business.
    for pool in pools {
        alloc.empty_cache_of_pool(pool.pool);
    }
    Ok(Some(before - alloc.reserved()))
}
