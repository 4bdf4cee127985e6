//! Private memory pools: what CUDA graphs capture into and what `torch.cuda.MemPool` holds.
//!
//! Followed from PyTorch's `c10/cuda/CUDACachingAllocator.cpp` (the 2.9/2.10 main branch, which
//! has `create_or_incref_pool` and `MemPool`), `aten/src/ATen/cuda/CUDAGraph.cpp` and
//! `torch/cuda/memory.py`; docs/private-pools.md has the rules with their sources. In short:
//! - A pool has its own small and large free blocks. While a pool is being allocated to
//!   (`begin_allocate_to_pool`), requests whose stream (or thread) its filter takes go there, the
//!   latest begun pool first; a pool never takes cached blocks of another, and a block freed
//!   at any time goes back to the pool that owns its segment.
//! - `use_count` counts graphs and scopes using the pool. At 0 the pool is freeable: `empty_cache`
//!   then returns its whole free segments, and a freeable pool left with no segment is erased.
//! - Ids: `(0, N)` for pools a user made (`graph_pool_handle()`, `MemPool()`), `(N, 0)` for one a
//!   graph made for itself; `(0, 0)` is the default pool.

use super::*;

/// A memory pool's id as PyTorch writes it (`MempoolId_t`, a snapshot's `segment_pool_id`).
pub type PoolId = (i64, i64);

/// The default pool: every allocation no private pool takes.
pub const DEFAULT_POOL: PoolId = (0, 0);

/// Which requests a pool being allocated to takes (PyTorch's filter function).
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum PoolFilter {
    /// A CUDA graph capture: requests on any stream taking part in it (the capture stream and the
    /// side streams forked into the capture), from any thread.
    Streams(Vec<Stream>),
    /// `torch.cuda.use_mem_pool`: requests of one thread (see `set_current_thread`), on any stream.
    Thread(u32),
}

impl PoolFilter {
    fn takes(&self, stream: Stream, thread: u32) -> bool {
        match self {
            PoolFilter::Streams(streams) => streams.contains(&stream),
            PoolFilter::Thread(t) => *t == thread,
        }
    }
}

/// One memory pool: the default one or a private one (`PrivatePool`).
#[derive(Debug, Clone)]
pub(super) struct MemoryPool {
    pub(super) id: PoolId,
    /// Free blocks, `[small, large]`.
    pub(super) free: [BlockPool; 2],
    /// Graphs and `use_mem_pool` scopes using it (`use_count`; a new pool starts at 1).
    pub(super) use_count: u32,
    /// Segments it owns (`cudaMalloc_count`).
    pub(super) segments: u32,
    /// False once erased (no user and no segment left).
    pub(super) live: bool,
    /// What its blocks' trace entries carry: the pool's id (none for the default pool).
    pub(super) entry_extra: Option<std::sync::Arc<EntryExtra>>,
    /// `MemPool(use_on_oom=True)`: a default request the device cannot serve may take one of
    /// its free blocks before anything is freed (`try_mempool_fallback`).
    pub(super) use_on_oom: bool,
    /// `MemPool(no_split=True)`: a block is never split, one allocation per segment.
    pub(super) no_split: bool,
}

impl MemoryPool {
    pub(super) fn new(id: PoolId) -> MemoryPool {
        let entry_extra = (id != DEFAULT_POOL).then(|| std::sync::Arc::new(EntryExtra { pool_id: Some(id), ..Default::default() }));
        MemoryPool {
            id,
            free: [BlockPool::default(), BlockPool::default()],
            use_count: 1,
            segments: 0,
            live: true,
            entry_extra,
            use_on_oom: false,
            no_split: false,
        }
    }

    /// A private pool nothing uses any more: `empty_cache` may return its segments.
    pub(super) fn is_freeable(&self) -> bool {
        self.live && self.id != DEFAULT_POOL && self.use_count == 0
    }
}

impl<S: SegmentSource> CachingAllocator<S> {
    /// A new pool id, as `graph_pool_handle()` / `MemPool()` (`user_made`: `(0, N)`) or a graph
    /// capture given no pool (`(N, 0)`) make one. It names no pool until something begins
    /// allocating to it or `create_or_incref_pool` makes it.
    pub fn new_pool_id(&mut self, user_made: bool) -> PoolId {
        let ids = &mut self.next_pool_ids;
        if user_made {
            ids.0 += 1;
            (0, ids.0 - 1)
        } else {
            ids.1 += 1;
            (ids.1 - 1, 0)
        }
    }

    /// The thread later requests come from (for `PoolFilter::Thread`); 0 until set.
    pub fn set_current_thread(&mut self, thread: u32) {
        self.current_thread = thread;
    }

    pub(super) fn pool_slot(&self, id: PoolId) -> Option<u32> {
        if id == DEFAULT_POOL {
            return Some(0);
        }
        self.pools.iter().position(|p| p.live && p.id == id).map(|i| i as u32)
    }

    /// `create_or_incref_pool` (what `MemPool()` does): makes the pool with one user, or adds a
    /// user to it. A pool that has no user left but still holds memory cannot be taken up again.
    pub fn create_or_incref_pool(&mut self, id: PoolId) -> Result<(), AllocError> {
        if id == DEFAULT_POOL || (id.0 != 0 && id.1 != 0) {
            return Err(AllocError::Unsupported(format!("{id:?} is not a private pool's id: one of its two numbers must be 0, the other not")));
        }
        match self.pool_slot(id) {
            None => self.pools.push(MemoryPool::new(id)),
            Some(i) => {
                let pool = &mut self.pools[i as usize];
                if pool.use_count == 0 {
                    return Err(AllocError::Unsupported(format!(
                        "pool {id:?} was released and still holds {} segment(s): it cannot be used again",
                        pool.segments
                    )));
                }
                pool.use_count += 1;
            }
        }
        Ok(())
    }

    /// `beginAllocateToPool`: from now on the requests `filter` takes go to pool `id` (made or
    /// given one more user first), until `end_allocate_to_pool`. The pool begun last is asked first.
    pub fn begin_allocate_to_pool(&mut self, id: PoolId, filter: PoolFilter) -> Result<(), AllocError> {
        self.create_or_incref_pool(id)?;
        if self.captures_underway.iter().any(|(underway, _)| *underway == id) {
            // PyTorch counts the user before it checks, so do we.
            return Err(AllocError::Unsupported(format!("beginAllocateToPool: already recording to pool {id:?}")));
        }
        self.captures_underway.push((id, filter));
        Ok(())
    }

    /// `endAllocateToPool`: requests stop going to pool `id`. Its users are unchanged.
    pub fn end_allocate_to_pool(&mut self, id: PoolId) -> Result<(), AllocError> {
        match self.captures_underway.iter().position(|(underway, _)| *underway == id) {
            Some(i) => {
                self.captures_underway.remove(i);
                Ok(())
            }
            None => Err(AllocError::Unsupported(format!("endAllocateToPool: not currently recording to pool {id:?}"))),
        }
    }

    /// `releasePool`: one user of pool `id` is gone (a graph reset, a `MemPool` dropped, a
    /// `use_mem_pool` scope left). With none left the pool is freeable; nothing is freed yet.
    pub fn release_pool(&mut self, id: PoolId) -> Result<(), AllocError> {
        let index = self.private_pool(id)?;
        let pool = &mut self.pools[index as usize];
        if pool.use_count == 0 {
            return Err(AllocError::Unsupported(format!("pool {id:?} has no user left to release")));
        }
        pool.use_count -= 1;
        Ok(())
    }

    /// `setUseOnOOM` (`MemPool(use_on_oom=True)`; its destructor turns it off first).
    pub fn set_use_on_oom(&mut self, id: PoolId, use_on_oom: bool) -> Result<(), AllocError> {
        let index = self.private_pool(id)?;
        self.pools[index as usize].use_on_oom = use_on_oom;
        Ok(())
    }

    /// `setNoSplit` (`MemPool(no_split=True)`): the pool's blocks are never split.
    pub fn set_no_split(&mut self, id: PoolId) -> Result<(), AllocError> {
        let index = self.private_pool(id)?;
        self.pools[index as usize].no_split = true;
        Ok(())
    }

    fn private_pool(&self, id: PoolId) -> Result<u32, AllocError> {
        self.pool_slot(id).filter(|&i| i != 0).ok_or_else(|| AllocError::Unsupported(format!("no private pool {id:?}")))
    }

    /// `try_mempool_fallback`: a default-pool request the device refused takes a free block
    /// of a `use_on_oom` pool, if one fits (same stream); a request already going to a private
    /// pool does not. Nothing is allocated from the device for it.
    pub(super) fn try_mempool_fallback(&mut self, p: &mut Params) -> bool {
        if p.pool != 0 {
            return false;
        }
        let fallbacks: Vec<u32> = (1..self.pools.len() as u32).filter(|&i| self.pools[i as usize].live && self.pools[i as usize].use_on_oom).collect();
        for pool in fallbacks {
            let mut q = Params { pool, block: None, ..*p };
            if self.get_free_block(&mut q) {
                *p = q;
                return true;
            }
        }
        false
    }

    /// `getPoolUseCount`: the users of pool `id`, or None if there is no such pool (never made,
    /// or erased).
    pub fn pool_use_count(&self, id: PoolId) -> Option<u32> {
        self.pool_slot(id).filter(|&i| i != 0).map(|i| self.pools[i as usize].use_count)
    }

    /// Private pools alive now, with their users: the default pool is not listed.
    pub fn private_pools(&self) -> Vec<(PoolId, u32)> {
        self.pools.iter().skip(1).filter(|p| p.live).map(|p| (p.id, p.use_count)).collect()
    }

    /// Bytes cached free in private pools: what an out-of-memory message says they hold.
    pub(super) fn free_in_private_pools(&self) -> u64 {
        let blocks = &self.blocks;
        self.pools.iter().skip(1).filter(|p| p.live).flat_map(|p| &p.free).flat_map(BlockPool::ids).map(|id| blocks[id.index()].size).sum()
    }

    /// `emptyCache(mempool_id)` for one private pool: returns its whole free segments if it is
    /// freeable (and erases it if it is then empty); a pool still in use keeps everything.
    pub fn empty_cache_of_pool(&mut self, id: PoolId) {
        self.release_cached_blocks(&None, id);
    }

    /// `get_pool`: the pool a request on `stream` goes to. While pools are being allocated to,
    /// the latest begun whose filter takes the request; otherwise the default pool.
    pub(super) fn get_pool(&self, stream: Stream) -> u32 {
        for (id, filter) in self.captures_underway.iter().rev() {
            // A pool released and emptied while still being allocated to is gone (PyTorch leaves
            // that undefined): its requests go to the pools below it.
            if filter.takes(stream, self.current_thread)
                && let Some(slot) = self.pool_slot(*id)
            {
                return slot;
            }
        }
        0
    }

    /// `insert_events_deferred_until_no_capture`: blocks freed during a capture while other streams
    /// used them. The uses recorded during the capture belong to the graph and are dropped;
    /// the others get their events now, and a block left with none is free at once.
    pub(super) fn insert_events_deferred_until_no_capture(&mut self, ctx: &Option<Frames>) {
        if !self.captures_underway.is_empty() || self.deferred_until_no_capture.is_empty() {
            return;
        }
        for id in std::mem::take(&mut self.deferred_until_no_capture) {
            if let Some(during) = self.capture_stream_uses.remove(&id) {
                let b = self.bm(id);
                if let Some(uses) = &mut b.stream_uses {
                    uses.retain(|s| !during.contains(s));
                    if uses.is_empty() {
                        b.stream_uses = None;
                    }
                }
            }
            self.insert_events(id);
            if self.b(id).event_count == 0 {
                self.free_block(id, ctx);
            }
        }
    }
}
