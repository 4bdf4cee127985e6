//! CUDA graphs and `torch.cuda.MemPool` as the allocator sees them: memory allocated while a
//! graph is captured, or inside `use_mem_pool`, comes from a private pool that only that graph
//! (or pool) uses again, and it stays reserved while anything uses the pool.
//!
//! A captured graph here runs nothing when replayed: a replay allocates nothing, which is all
//! the memory story needs (the kernels ran while capturing). The names follow PyTorch's
//! (`torch.cuda.graph`, `graph_pool_handle`, `MemPool`, `use_mem_pool`); the pool rules are the
//! allocator's (`alloc::caching::pools`).

use super::{Device, DeviceError};
use crate::alloc::{PoolFilter, PoolId};

impl Device {
    /// `torch.cuda.graph_pool_handle()`: an id for a pool graphs can share (`(0, N)`). No pool
    /// exists until a capture uses it.
    pub fn graph_pool_handle(&self) -> PoolId {
        self.0.alloc.borrow_mut().new_pool_id(true)
    }

    /// `with torch.cuda.graph(g, pool=pool):` entered on the current stream: until
    /// [`GraphCapture::end`], every allocation on that stream goes to the graph's pool (`pool`, or
    /// a new one of its own). Allocations on other streams do not.
    ///
    /// As PyTorch's context manager does, it first synchronizes and empties the cache ("free as
    /// much memory as we can for the graph", `torch.cuda.graph.__enter__`). Then
    /// `CUDAGraph::capture_begin` registers the random generator with the graph: the first graph
    /// alive makes its seed and offset tensors (8 bytes each, on the capture stream, in the
    /// default pool: before `beginAllocateToPool`), kept until the last graph is gone
    /// (`CUDAGeneratorState::register_graph`; PyTorch 2.11 still does it eagerly).
    #[track_caller]
    pub fn capture_graph(&self, pool: Option<PoolId>) -> Result<GraphCapture, DeviceError> {
        self.synchronize();
        self.empty_cache();
        if self.0.graphs.get() == 0 {
            let made = [self.allocate(8, "at::CUDAGeneratorState::register_graph")?, self.allocate(8, "at::CUDAGeneratorState::register_graph")?];
            self.0.graph_rng_state.borrow_mut().extend(made);
        }
        self.0.graphs.set(self.0.graphs.get() + 1);
        let begun = {
            let mut alloc = self.0.alloc.borrow_mut();
            let pool = pool.unwrap_or_else(|| alloc.new_pool_id(false));
            alloc.begin_allocate_to_pool(pool, PoolFilter::Streams(vec![self.0.stream.get()])).map(|()| pool)
        };
        match begun {
            Ok(pool) => Ok(GraphCapture { device: self.clone(), pool, ended: false }),
            // No graph was made (the pool already taking a capture's allocations): it lets go of
            // the generator's state as a graph gone would.
            Err(e) => {
                self.graph_gone();
                Err(e.into())
            }
        }
    }

    /// A graph gone (`CUDAGeneratorState::unregister_graph`): the last one frees the
    /// generator's seed and offset.
    fn graph_gone(&self) {
        let left = self.0.graphs.get().saturating_sub(1);
        self.0.graphs.set(left);
        if left == 0 {
            for block in self.0.graph_rng_state.take() {
                self.release(&block);
            }
        }
    }

    /// `torch.cuda.MemPool()`: a pool of the program's own, alive while the handle is.
    pub fn mem_pool(&self) -> Result<MemPool, DeviceError> {
        self.mem_pool_with(false, false)
    }

    /// `torch.cuda.MemPool(use_on_oom=..., no_split=...)`: `use_on_oom` lends the pool's free
    /// blocks to requests the device refuses; `no_split` keeps one allocation per segment.
    pub fn mem_pool_with(&self, use_on_oom: bool, no_split: bool) -> Result<MemPool, DeviceError> {
        let mut alloc = self.0.alloc.borrow_mut();
        let id = alloc.new_pool_id(true);
        alloc.create_or_incref_pool(id)?;
        alloc.set_use_on_oom(id, use_on_oom)?;
        if no_split {
            alloc.set_no_split(id)?;
        }
        Ok(MemPool { device: self.clone(), id })
    }

    /// `with torch.cuda.use_mem_pool(pool):` every allocation until the guard drops goes to
    /// `pool`, on every stream (the engine runs one thread).
    #[must_use = "the pool is used only while the guard lives"]
    pub fn use_mem_pool(&self, pool: &MemPool) -> Result<MemPoolScope, DeviceError> {
        self.0.alloc.borrow_mut().begin_allocate_to_pool(pool.id, PoolFilter::Thread(0))?;
        Ok(MemPoolScope { device: self.clone(), id: pool.id })
    }

    /// `torch.cuda.empty_cache()` for one pool (`MemPool`'s destructor does it): its whole free
    /// segments go back if nothing uses the pool any more.
    pub fn empty_cache_of_pool(&self, pool: PoolId) {
        self.0.alloc.borrow_mut().empty_cache_of_pool(pool);
        if let Some(g) = self.gpu_context() {
            // Submits recorded work, then destroys the released segments' buffers.
            g.submit();
        }
    }

    /// The private pools alive, with how many graphs and scopes use each.
    pub fn private_pools(&self) -> Vec<(PoolId, u32)> {
        self.0.alloc.borrow().private_pools()
    }
}

/// A graph being captured (the `with torch.cuda.graph(...)` block).
pub struct GraphCapture {
    device: Device,
    pool: PoolId,
    ended: bool,
}

impl GraphCapture {
    pub fn pool(&self) -> PoolId {
        self.pool
    }

    /// Leaves the block: allocations go where they did before. The graph keeps its pool in use
    /// until it is dropped (`g.reset()` or `del g`).
    pub fn end(mut self) -> Result<CudaGraph, DeviceError> {
        self.ended = true;
        self.device.0.alloc.borrow_mut().end_allocate_to_pool(self.pool)?;
        Ok(CudaGraph { device: self.device.clone(), pool: self.pool })
    }
}

impl Drop for GraphCapture {
    /// A capture abandoned (an error inside the block): PyTorch's `capture_end` still runs in
    /// the context manager's exit, and the graph it made goes at once.
    fn drop(&mut self) {
        if !self.ended {
            {
                let mut alloc = self.device.0.alloc.borrow_mut();
                let _ = alloc.end_allocate_to_pool(self.pool);
                let _ = alloc.release_pool(self.pool);
            }
            self.device.graph_gone();
        }
    }
}

/// A captured graph: it keeps its pool in use. Its outputs live in the pool, so the memory a
/// replay writes is the memory the capture allocated.
pub struct CudaGraph {
    device: Device,
    pool: PoolId,
}

impl CudaGraph {
    /// `g.pool()`: to share with a later capture (`torch.cuda.graph(g2, pool=g.pool())`).
    pub fn pool(&self) -> PoolId {
        self.pool
    }

    /// `g.replay()`: runs the captured work in the pool's memory; the allocator sees nothing.
    pub fn replay(&self) {}
}

impl Drop for CudaGraph {
    /// `g.reset()`: one user of the pool fewer; `empty_cache()` frees the pool once none is left.
    fn drop(&mut self) {
        let _ = self.device.0.alloc.borrow_mut().release_pool(self.pool);
        self.device.graph_gone();
    }
}

/// `torch.cuda.MemPool()`.
pub struct MemPool {
    device: Device,
    id: PoolId,
}

impl MemPool {
    pub fn id(&self) -> PoolId {
        self.id
    }
}

impl Drop for MemPool {
    /// `del pool`: releases it and empties its cache (nothing, if a graph still uses it).
    fn drop(&mut self) {
        {
            let mut alloc = self.device.0.alloc.borrow_mut();
            let _ = alloc.set_use_on_oom(self.id, false);
            let _ = alloc.release_pool(self.id);
        }
        self.device.empty_cache_of_pool(self.id);
    }
}

/// The `with use_mem_pool(pool):` block.
pub struct MemPoolScope {
    device: Device,
    id: PoolId,
}

impl Drop for MemPoolScope {
    fn drop(&mut self) {
        let mut alloc = self.device.0.alloc.borrow_mut();
        let _ = alloc.end_allocate_to_pool(self.id);
        let _ = alloc.release_pool(self.id);
    }
}
