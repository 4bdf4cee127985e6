//! PyTorch's native CUDA caching allocator (`DeviceCachingAllocator`), one device, no GPU types.
//!
//! The structure mirrors `c10/cuda/CUDACachingAllocator.cpp` so that each rule can be checked
//! against it: `malloc` -> `get_free_block` / `alloc_block` / release-and-retry -> `alloc_found_block`;
//! `free` -> `free_block` (coalescing); `release_cached_blocks` = `empty_cache`; expandable
//! segments map pages into one growing address range per (stream, pool).
//!
//! Three parts live in files of their own: `caching/expandable.rs` (mapping and unmapping an
//! expandable segment's pages), `caching/pools.rs` (private pools: CUDA graphs and `MemPool`) and
//! `caching/state.rs` (snapshot, restore and the invariants).

use super::config::AllocatorConfig;
use super::constants::*;
use super::history::{History, RecordContext};
use super::index::{FreeIndex, Key, key, key_size};
use super::oom::OutOfMemoryError;
use super::source::SegmentSource;
use super::stats::{DeviceStats, StatType};
use crate::trace::{self, Action, EntryExtra, Frames, TraceEntry};
use rustc_hash::FxHashMap;
use std::collections::{BTreeMap, VecDeque};

mod expandable;
mod pools;
mod state;

use expandable::ExpandableSegment;
use pools::MemoryPool;
pub use pools::{DEFAULT_POOL, PoolFilter, PoolId};

/// A stream, compared as an unsigned pointer like `cudaStream_t` (0 = the default stream).
pub type Stream = u64;

/// An index into one of the allocator's vectors, stored as one more than itself so that `None`
/// costs no space: `Option<BlockId>` is four bytes, as the index is.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, PartialOrd, Ord)]
struct Slot(std::num::NonZeroU32);

impl Slot {
    fn at(index: usize) -> Slot {
        let raw = u32::try_from(index + 1).ok().and_then(std::num::NonZeroU32::new);
        Slot(raw.expect("fewer than 2^32 - 1 entries"))
    }

    fn index(self) -> usize {
        self.0.get() as usize - 1
    }
}

/// A block's place in the allocator's `blocks` (where PyTorch holds a `Block*`).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, PartialOrd, Ord)]
struct BlockId(Slot);

impl BlockId {
    fn at(index: usize) -> BlockId {
        BlockId(Slot::at(index))
    }

    fn index(self) -> usize {
        self.0.index()
    }

    /// As the free-block index stores it.
    fn raw(self) -> u32 {
        self.0.0.get()
    }

    fn from_raw(raw: u32) -> BlockId {
        BlockId(Slot(std::num::NonZeroU32::new(raw).expect("a stored block id")))
    }
}

/// An expandable segment's place in the allocator's `expandable`.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
struct ExpandableId(Slot);

impl ExpandableId {
    fn at(index: usize) -> ExpandableId {
        ExpandableId(Slot::at(index))
    }

    fn index(self) -> usize {
        self.0.index()
    }
}

/// What `malloc` hands out: where the tensor's bytes live. It is also the handle that frees
/// them (`free_allocation`), as PyTorch's device allocator frees a `Block*`.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Allocation {
    /// Device address of the block (the trace's `addr`).
    pub ptr: u64,
    /// Bytes the block occupies (rounded; may exceed the request by the unsplit remainder).
    pub size: u64,
    /// Base address of the segment that holds it; `ptr - segment` is the offset in that segment.
    pub segment: u64,
    /// None: taken straight from the device ([`Allocation::uncached`]).
    block: Option<BlockId>,
    /// Which handing-out of the block this is: a stale copy (the block was freed and given to
    /// another tensor since) no longer matches, so freeing it fails instead of freeing the new
    /// owner's memory.
    generation: u64,
}

impl Allocation {
    /// Memory taken straight from the device, bypassing the cache (as PyTorch's allocator does
    /// under `PYTORCH_NO_CUDA_MEMORY_CACHING=1`): its own segment, given back on free.
    pub fn uncached(segment: u64, size: u64) -> Allocation {
        Allocation { ptr: segment, size, segment, block: None, generation: 0 }
    }

    pub fn is_uncached(&self) -> bool {
        self.block.is_none()
    }
}

#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum AllocError {
    #[error(transparent)]
    OutOfMemory(#[from] Box<OutOfMemoryError>),
    #[error("invalid device pointer: {0:#x} is not an allocation of this allocator")]
    InvalidPointer(u64),
    #[error("{0}")]
    Unsupported(String),
}

#[derive(Debug, Clone)]
struct Block {
    stream: Stream,
    size: u64,
    requested_size: u64,
    small: bool,
    ptr: u64,
    /// Base address of the segment (or expandable reservation) holding the block.
    segment: u64,
    /// Index into the allocator's `pools` of the memory pool that owns the block's segment
    /// (0: the default pool). A freed block always goes back there.
    pool: u32,
    allocated: bool,
    /// False for the unmapped address space of an expandable segment.
    mapped: bool,
    prev: Option<BlockId>,
    next: Option<BlockId>,
    /// Outstanding cross-stream uses that must finish before the block is reusable.
    event_count: u32,
    gc_count_base: i64,
    /// The expandable segment holding the block, if it is one's.
    expandable: Option<ExpandableId>,
    /// Other streams that used the block (`record_stream`); rare, so boxed to keep blocks small.
    #[allow(clippy::box_collection)]
    stream_uses: Option<Box<Vec<Stream>>>,
    context: Option<Frames>,
    segment_context: Option<Frames>,
    live: bool,
    /// The generation of the last `Allocation` handed out for it.
    generation: u64,
}

impl Block {
    fn new(stream: Stream, size: u64, small: bool, ptr: u64, segment: u64, pool: u32) -> Block {
        Block {
            stream,
            size,
            requested_size: 0,
            small,
            ptr,
            segment,
            pool,
            allocated: false,
            mapped: true,
            prev: None,
            next: None,
            event_count: 0,
            gc_count_base: 0,
            expandable: None,
            stream_uses: None,
            context: None,
            segment_context: None,
            live: true,
            generation: 0,
        }
    }

    fn is_split(&self) -> bool {
        self.prev.is_some() || self.next.is_some()
    }

    fn is_expandable(&self) -> bool {
        self.expandable.is_some()
    }
}

/// Free blocks of one pool, ordered like `BlockComparatorSize` (stream, size, address): one
/// index per stream, streams in pointer order. Unmapped ranges of expandable segments are ordered
/// like `BlockComparatorAddress` (stream, address).
#[derive(Debug, Default, Clone)]
struct BlockPool {
    streams: Vec<(Stream, FreeIndex)>,
    unmapped: BTreeMap<(Stream, u64), BlockId>,
    get_free_blocks_call_count: i64,
}

impl BlockPool {
    fn stream(&self, stream: Stream) -> Option<&FreeIndex> {
        self.streams.iter().find(|(s, _)| *s == stream).map(|(_, m)| m)
    }

    fn stream_mut(&mut self, stream: Stream) -> &mut FreeIndex {
        let i = match self.streams.iter().position(|(s, _)| *s >= stream) {
            Some(i) if self.streams[i].0 == stream => i,
            Some(i) => {
                self.streams.insert(i, (stream, FreeIndex::default()));
                i
            }
            None => {
                self.streams.push((stream, FreeIndex::default()));
                self.streams.len() - 1
            }
        };
        &mut self.streams[i].1
    }

    fn insert(&mut self, stream: Stream, size: u64, ptr: u64, id: BlockId) -> bool {
        self.stream_mut(stream).insert(key(size, ptr), id.raw())
    }

    fn remove(&mut self, stream: Stream, size: u64, ptr: u64) {
        if let Some((_, m)) = self.streams.iter_mut().find(|(s, _)| *s == stream) {
            m.remove(key(size, ptr));
        }
    }

    fn get(&self, stream: Stream, size: u64, ptr: u64) -> Option<BlockId> {
        self.stream(stream)?.get(key(size, ptr)).map(BlockId::from_raw)
    }

    /// Every free block in (stream, size, address) order.
    fn ids(&self) -> Vec<BlockId> {
        self.streams.iter().flat_map(|(_, m)| m.entries().into_iter().map(|(_, id)| BlockId::from_raw(id))).collect()
    }

    fn largest(&self) -> u64 {
        self.streams.iter().filter_map(|(_, m)| m.prev_before(Key::MAX)).map(|(k, _)| key_size(k)).max().unwrap_or(0)
    }
}

/// The pieces of a request, like PyTorch's `AllocParams`.
#[derive(Clone, Copy)]
struct Params {
    stream: Stream,
    size: u64,
    small: bool,
    alloc_size: u64,
    /// The memory pool the request goes to (`get_pool`): an index into `pools`.
    pool: u32,
    /// The block found or made for the request (None until then).
    block: Option<BlockId>,
}

/// One device's caching allocator.
pub struct CachingAllocator<S: SegmentSource> {
    config: AllocatorConfig,
    device: i64,
    /// Device memory in bytes (the card simulated, or the adapter's budget); None: unlimited.
    capacity: Option<u64>,
    /// Device memory used outside the allocator (CUDA context, other processes).
    external_usage: u64,
    allowed_memory_maximum: Option<u64>,
    source: S,
    blocks: Vec<Block>,
    free_ids: Vec<BlockId>,
    /// The memory pools, each with its small and large free blocks: the default pool first,
    /// then private ones in the order they were made (`graph_pools`; an erased one stays as a
    /// dead slot, so block indices into it never move).
    pools: Vec<MemoryPool>,
    /// Pools being allocated to, oldest first, each with the streams it takes (`captures_underway`).
    captures_underway: Vec<(PoolId, PoolFilter)>,
    /// The thread the caller runs on, for `PoolFilter::Thread` (`use_mem_pool` routes one thread).
    current_thread: u32,
    /// Freed blocks other streams used during a capture: their events wait until no capture is
    /// underway (`needs_events_deferred_until_no_capture`).
    deferred_until_no_capture: Vec<BlockId>,
    /// Streams recorded on a block while a capture was underway (`block_to_cudagraph_stream_uses`).
    capture_stream_uses: FxHashMap<BlockId, Vec<Stream>>,
    /// The next ids `new_pool_id` hands out: (user-made, graph-made), both from 1 as in PyTorch.
    next_pool_ids: (i64, i64),
    /// Blocks handed out and not yet freed, by address (PyTorch's `allocated_blocks`, which lives
    /// a layer above its device allocator). Built on the first call by address, so callers that
    /// free by handle never pay for it.
    pointer_index: Option<FxHashMap<u64, BlockId>>,
    /// Outstanding cross-stream events, per stream, oldest first, and how many at the front are done.
    events: BTreeMap<Stream, (VecDeque<BlockId>, usize)>,
    expandable: Vec<ExpandableSegment>,
    total_allocated_memory: u64,
    stats: DeviceStats,
    history: History,
    /// Allocations handed out so far: each one's generation.
    handed_out: u64,
}

const SMALL: usize = 0;
const LARGE: usize = 1;

fn pool_index(small: bool) -> usize {
    if small { SMALL } else { LARGE }
}

/// `round_size`: the block size a request of `size` bytes gets.
pub fn round_size(size: u64, config: &AllocatorConfig) -> u64 {
    if size < MIN_BLOCK_SIZE {
        return MIN_BLOCK_SIZE;
    }
    let divisions = config.divisions_for(size);
    // Saturating: replay may meet any size; malloc refuses anything near the top anyway.
    if divisions > 1 && size > MIN_BLOCK_SIZE.saturating_mul(divisions) {
        roundup_power2_next_division(size, divisions)
    } else {
        size.div_ceil(MIN_BLOCK_SIZE).saturating_mul(MIN_BLOCK_SIZE)
    }
}

/// Rounds up to the next of `divisions` equal steps between two powers of two.
pub fn roundup_power2_next_division(size: u64, divisions: u64) -> u64 {
    if size.is_power_of_two() {
        return size;
    }
    let floor = 1u64 << (63 - size.leading_zeros());
    let step = floor >> (63 - divisions.leading_zeros());
    if step == 0 {
        return floor.saturating_mul(2);
    }
    size.checked_next_multiple_of(step).unwrap_or(u64::MAX)
}

/// `get_allocation_size`: the segment size requested when no cached block fits.
pub fn allocation_size(rounded: u64) -> u64 {
    if rounded <= SMALL_SIZE {
        SMALL_BUFFER
    } else if rounded < MIN_LARGE_ALLOC {
        LARGE_BUFFER
    } else {
        rounded.checked_next_multiple_of(ROUND_LARGE).unwrap_or(u64::MAX)
    }
}

impl<S: SegmentSource> CachingAllocator<S> {
    pub fn new(config: AllocatorConfig, source: S) -> CachingAllocator<S> {
        let stats = DeviceStats { max_split_size: config.max_split_size_stat(), ..Default::default() };
        let mut allocator = CachingAllocator {
            config,
            device: 0,
            capacity: None,
            external_usage: 0,
            allowed_memory_maximum: None,
            source,
            blocks: Vec::new(),
            free_ids: Vec::new(),
            pools: vec![MemoryPool::new(DEFAULT_POOL)],
            captures_underway: Vec::new(),
            current_thread: 0,
            deferred_until_no_capture: Vec::new(),
            capture_stream_uses: FxHashMap::default(),
            next_pool_ids: (1, 1),
            pointer_index: None,
            events: BTreeMap::new(),
            expandable: Vec::new(),
            total_allocated_memory: 0,
            stats,
            history: History::default(),
            handed_out: 0,
        };
        allocator.update_allowed_maximum();
        allocator
    }

    pub fn with_capacity(mut self, capacity: u64) -> Self {
        self.set_capacity(Some(capacity));
        self
    }

    pub fn with_device(mut self, device: i64) -> Self {
        self.device = device;
        self
    }

    pub fn set_capacity(&mut self, capacity: Option<u64>) {
        self.capacity = capacity;
        self.update_allowed_maximum();
    }

    pub fn capacity(&self) -> Option<u64> {
        self.capacity
    }

    /// Memory the device uses outside this allocator (counted against capacity).
    pub fn set_external_usage(&mut self, bytes: u64) {
        self.external_usage = bytes;
    }

    /// `torch.cuda.set_per_process_memory_fraction`: reserved memory may not exceed
    /// `fraction * capacity`; needs a capacity.
    pub fn set_memory_fraction(&mut self, fraction: f64) -> Result<(), AllocError> {
        if !(0.0..=1.0).contains(&fraction) {
            return Err(AllocError::Unsupported(format!("invalid fraction: {fraction}. Please set within [0, 1].")));
        }
        if self.capacity.is_none() {
            return Err(AllocError::Unsupported("a memory fraction needs a device capacity".into()));
        }
        self.config.per_process_memory_fraction = Some(fraction);
        self.update_allowed_maximum();
        Ok(())
    }

    fn update_allowed_maximum(&mut self) {
        self.allowed_memory_maximum = match (self.config.per_process_memory_fraction, self.capacity) {
            (Some(f), Some(c)) => Some((f * c as f64) as u64),
            _ => None,
        };
    }

    pub fn config(&self) -> &AllocatorConfig {
        &self.config
    }

    pub fn device(&self) -> i64 {
        self.device
    }

    pub fn stats(&self) -> &DeviceStats {
        &self.stats
    }

    pub fn source(&self) -> &S {
        &self.source
    }

    pub fn source_mut(&mut self) -> &mut S {
        &mut self.source
    }

    pub fn reset_peak_stats(&mut self) {
        self.stats.reset_peak();
    }

    pub fn reset_accumulated_stats(&mut self) {
        self.stats.reset_accumulated();
    }

    /// Bytes the device has free by our accounting (PyTorch asks cudaMemGetInfo).
    pub fn device_free(&self) -> u64 {
        self.memory_limit().saturating_sub(self.total_allocated_memory + self.external_usage)
    }

    /// The capacity; without one the device is as large as the counters allow: PyTorch's
    /// statistics are signed 64-bit, so a replay of absurd requests runs out of memory instead
    /// of wrapping them.
    fn memory_limit(&self) -> u64 {
        self.capacity.unwrap_or(i64::MAX as u64)
    }

    // ---------------------------------------------------------------- block storage

    fn b(&self, id: BlockId) -> &Block {
        &self.blocks[id.index()]
    }

    fn bm(&mut self, id: BlockId) -> &mut Block {
        &mut self.blocks[id.index()]
    }

    fn new_block(&mut self, block: Block) -> BlockId {
        match self.free_ids.pop() {
            Some(id) => {
                self.blocks[id.index()] = block;
                id
            }
            None => {
                self.blocks.push(block);
                BlockId::at(self.blocks.len() - 1)
            }
        }
    }

    /// Links a new block right after `id` in its segment (PyTorch's `Block::splice`).
    fn insert_after(&mut self, id: BlockId, mut block: Block) -> BlockId {
        let next = self.b(id).next;
        block.prev = Some(id);
        block.next = next;
        let new = self.new_block(block);
        if let Some(next) = next {
            self.bm(next).prev = Some(new);
        }
        self.bm(id).next = Some(new);
        new
    }

    /// Links a new block right before `id` in its segment.
    fn insert_before(&mut self, id: BlockId, mut block: Block) -> BlockId {
        let prev = self.b(id).prev;
        block.prev = prev;
        block.next = Some(id);
        let new = self.new_block(block);
        if let Some(prev) = prev {
            self.bm(prev).next = Some(new);
        }
        self.bm(id).prev = Some(new);
        new
    }

    fn delete_block(&mut self, id: BlockId) {
        let b = self.bm(id);
        b.live = false;
        b.context = None;
        b.segment_context = None;
        self.free_ids.push(id);
    }

    fn pool_insert(&mut self, id: BlockId) {
        let b = &self.blocks[id.index()];
        let pool = &mut self.pools[b.pool as usize].free[pool_index(b.small)];
        let count = pool.get_free_blocks_call_count;
        let inserted = pool.insert(b.stream, b.size, b.ptr, id);
        debug_assert!(inserted, "block inserted twice into its pool");
        self.blocks[id.index()].gc_count_base = count;
    }

    fn pool_remove(&mut self, id: BlockId) {
        let b = &self.blocks[id.index()];
        self.pools[b.pool as usize].free[pool_index(b.small)].remove(b.stream, b.size, b.ptr);
    }

    fn unmapped_insert(&mut self, id: BlockId) {
        let b = &self.blocks[id.index()];
        self.pools[b.pool as usize].free[pool_index(b.small)].unmapped.insert((b.stream, b.ptr), id);
    }

    fn unmapped_remove(&mut self, id: BlockId) {
        let b = &self.blocks[id.index()];
        self.pools[b.pool as usize].free[pool_index(b.small)].unmapped.remove(&(b.stream, b.ptr));
    }

    #[inline]
    /// Records an entry about a block of pool `pool` (an index into `pools`): a private pool's
    /// entries name it (`pool_id`), as newer PyTorch versions write.
    fn record(&mut self, action: Action, addr: u64, size: u64, stream: Stream, pool: u32, frames: Option<Frames>) {
        if self.history.records(action) {
            let mut entry = TraceEntry::new(action, addr, size, stream as i64);
            if self.history.context() >= RecordContext::Alloc {
                entry.frames = frames;
            }
            entry.extra = self.pools[pool as usize].entry_extra.clone();
            self.history.push(entry);
        }
    }

    fn keep_state_context(&self, ctx: Option<Frames>) -> Option<Frames> {
        if self.history.context() >= RecordContext::State { ctx } else { None }
    }

    // ---------------------------------------------------------------- malloc

    /// Allocates `orig_size` bytes on `stream`. `ctx` is the stack to remember (frames).
    pub fn malloc(&mut self, orig_size: u64, stream: Stream, ctx: Option<Frames>) -> Result<Allocation, AllocError> {
        if orig_size >= ONE_EXABYTE {
            return Err(OutOfMemoryError::more_than_exabyte(self.device).into());
        }
        let ctx = self.keep_state_context(ctx);
        // Events cannot be queried while a graph is being captured: their blocks wait until after.
        if self.captures_underway.is_empty() {
            self.process_events(&ctx);
        }
        let size = round_size(orig_size, &self.config);
        let small = size <= SMALL_SIZE;
        let pool = self.get_pool(stream);
        let mut p = Params { stream, size, small, alloc_size: allocation_size(size), pool, block: None };

        if !self.get_free_block(&mut p) {
            self.get_new_block(&mut p, orig_size, &ctx)?;
        }
        let block = p.block.expect("a block was found or made");
        let split = self.should_split(block, p.size);
        Ok(self.alloc_found_block(&p, orig_size, ctx, split))
    }

    /// The slow path: no cached block fits. Asks the device, frees cache and retries as PyTorch
    /// does, and fails with an out-of-memory error when nothing helps.
    #[cold]
    #[inline(never)]
    fn get_new_block(&mut self, p: &mut Params, orig_size: u64, ctx: &Option<Frames>) -> Result<(), AllocError> {
        if self.allowed_memory_maximum.is_some() && self.config.garbage_collection_threshold > 0.0 {
            self.garbage_collect_cached_blocks(ctx);
        }
        // The last resort, freeing every cached segment, is not tried while any pool is being
        // allocated to (a capture cannot free memory its graph may use).
        let found = self.alloc_block(p, false, ctx)
            || self.try_mempool_fallback(p)
            || (self.release_available_cached_blocks(p, ctx) && self.alloc_block(p, false, ctx))
            || (self.captures_underway.is_empty() && self.release_cached_blocks(ctx, DEFAULT_POOL) && self.alloc_block(p, true, ctx));
        if found {
            return Ok(());
        }
        let device_free = self.device_free();
        if self.history.records(Action::Oom) {
            let mut entry = TraceEntry::new(Action::Oom, 0, p.size, p.stream as i64).with_extra(EntryExtra {
                device_free: Some(device_free),
                pool_id: self.pools[p.pool as usize].entry_extra.as_ref().and_then(|x| x.pool_id),
                ..Default::default()
            });
            if self.history.context() >= RecordContext::Alloc {
                entry.frames = ctx.clone();
            }
            self.history.push(entry);
        }
        self.stats.num_ooms += 1;
        let all = StatType::All;
        Err(Box::new(OutOfMemoryError {
            device: self.device,
            requested: orig_size,
            tried_to_allocate: p.alloc_size,
            total_capacity: self.capacity,
            free: device_free,
            allowed: self.allowed_memory_maximum,
            allocated: self.stats.allocated_bytes.get(all).current as u64,
            reserved: self.stats.reserved_bytes.get(all).current as u64,
            in_private_pools: self.free_in_private_pools(),
            expandable_segments: self.config.expandable_segments,
            more_than_exabyte: false,
        })
        .into())
    }

    fn should_split(&self, id: BlockId, size: u64) -> bool {
        let b = self.b(id);
        if self.pools[b.pool as usize].no_split {
            return false;
        }
        let remaining = b.size - size;
        if b.small || self.config.expandable_segments { remaining >= MIN_BLOCK_SIZE } else { size < self.config.max_split_size && remaining > SMALL_SIZE }
    }

    fn get_free_block(&mut self, p: &mut Params) -> bool {
        let gc_on = self.allowed_memory_maximum.is_some() && self.config.garbage_collection_threshold > 0.0;
        let pool = &mut self.pools[p.pool as usize].free[pool_index(p.small)];
        if gc_on {
            pool.get_free_blocks_call_count += 1;
        }
        let Some(free) = pool.stream(p.stream) else { return false };
        let Some((mut k, raw)) = free.lower_bound(key(p.size, 0)) else { return false };
        let mut id = BlockId::from_raw(raw);
        let blocks = &self.blocks;
        if blocks[id.index()].is_expandable() {
            if self.config.expandable_segments {
                // Best fit counts the unmapped space right after a block as part of it.
                let expandable_size = |id: BlockId| {
                    let b = &blocks[id.index()];
                    let unmapped_after = b.next.map(|next| &blocks[next.index()]).filter(|next| !next.mapped);
                    b.size + unmapped_after.map_or(0, |next| next.size)
                };
                while let Some((nk, next)) = free.next_after(k) {
                    let next = BlockId::from_raw(next);
                    if blocks[id.index()].is_expandable() && expandable_size(next) < expandable_size(id) {
                        (k, id) = (nk, next);
                    } else {
                        break;
                    }
                }
            } else {
                // Expandable segments were turned off: leave their blocks alone.
                loop {
                    match free.next_after(k) {
                        Some((nk, next)) => (k, id) = (nk, BlockId::from_raw(next)),
                        None => return false,
                    }
                    if !blocks[id.index()].is_expandable() {
                        break;
                    }
                }
            }
        }
        let block_size = blocks[id.index()].size;
        let max_split = self.config.max_split_size;
        // An oversize block never serves a request that could split, nor one far smaller than itself.
        if p.size < max_split && block_size >= max_split {
            return false;
        }
        if p.size >= max_split && block_size >= p.size.saturating_add(self.config.max_non_split_rounding_size) {
            return false;
        }
        self.pool_remove(id);
        p.block = Some(id);
        true
    }

    fn alloc_found_block(&mut self, p: &Params, orig_size: u64, ctx: Option<Frames>, split: bool) -> Allocation {
        let pool = StatType::for_pool(p.small);
        let mut id = p.block.expect("a block was found or made");
        let already_split = self.b(id).is_split();
        let expandable = self.b(id).is_expandable();
        if split {
            // The allocated part takes the low addresses; the remainder stays free above it.
            let remaining = id;
            let r = self.b(remaining);
            let mut block = Block::new(p.stream, p.size, p.small, r.ptr, r.segment, r.pool);
            block.expandable = r.expandable;
            id = self.insert_before(remaining, block);
            let rem = self.bm(remaining);
            rem.ptr += p.size;
            rem.size -= p.size;
            let rem_size = rem.size;
            self.pool_insert(remaining);
            if !expandable {
                if already_split {
                    // An already-split free block shrinks by the allocated size.
                    self.stats.inactive_split_bytes.decrease(pool, p.size);
                } else {
                    // A new free remainder splits off a previously whole block.
                    self.stats.inactive_split_bytes.increase(pool, rem_size);
                    self.stats.inactive_split.increase(pool, 1);
                }
            }
        } else if already_split && !expandable {
            let size = self.b(id).size;
            self.stats.inactive_split_bytes.decrease(pool, size);
            self.stats.inactive_split.decrease(pool, 1);
        }
        self.handed_out += 1;
        let generation = self.handed_out;
        let b = self.bm(id);
        b.allocated = true;
        b.generation = generation;
        b.requested_size = orig_size;
        b.context = ctx.clone();
        let (ptr, size, segment) = (b.ptr, b.size, b.segment);
        self.record(Action::Alloc, ptr, orig_size, p.stream, p.pool, ctx);
        if let Some(index) = &mut self.pointer_index {
            index.insert(ptr, id);
        }
        let s = &mut self.stats;
        s.allocation.increase(pool, 1);
        s.allocated_bytes.increase(pool, size);
        s.active.increase(pool, 1);
        s.active_bytes.increase(pool, size);
        s.requested_bytes.increase(pool, orig_size);
        if size >= self.config.max_split_size {
            s.oversize_allocations.increase(1);
        }
        Allocation { ptr, size, segment, block: Some(id), generation }
    }

    // ---------------------------------------------------------------- free

    fn pointer_index(&mut self) -> &mut FxHashMap<u64, BlockId> {
        let blocks = &self.blocks;
        self.pointer_index
            .get_or_insert_with(|| blocks.iter().enumerate().filter(|(_, b)| b.live && b.allocated).map(|(i, b)| (b.ptr, BlockId::at(i))).collect())
    }

    /// The allocated block an `Allocation` names, if it is still allocated.
    fn allocated_block(&self, a: &Allocation) -> Result<BlockId, AllocError> {
        // `get`: an allocation from another allocator may name no block of this one.
        match a.block.and_then(|id| Some((id, self.blocks.get(id.index())?))) {
            Some((id, b)) if b.live && b.allocated && b.ptr == a.ptr && b.generation == a.generation => Ok(id),
            _ => Err(AllocError::InvalidPointer(a.ptr)),
        }
    }

    /// Frees an allocation (the tensor's last reference dropped). If other streams used it
    /// (`record_stream`), it stays active until their work completes.
    pub fn free_allocation(&mut self, a: &Allocation, ctx: Option<Frames>) -> Result<(), AllocError> {
        let id = self.allocated_block(a)?;
        if let Some(index) = &mut self.pointer_index {
            index.remove(&a.ptr);
        }
        self.free_block_id(id, ctx);
        Ok(())
    }

    /// Frees the allocation at address `ptr`.
    pub fn free(&mut self, ptr: u64, ctx: Option<Frames>) -> Result<(), AllocError> {
        let id = self.pointer_index().remove(&ptr).ok_or(AllocError::InvalidPointer(ptr))?;
        self.free_block_id(id, ctx);
        Ok(())
    }

    fn free_block_id(&mut self, id: BlockId, ctx: Option<Frames>) {
        let ctx = if self.history.context() >= RecordContext::All { ctx } else { None };
        let recording = self.history.is_recording();
        let b = &mut self.blocks[id.index()];
        b.allocated = false;
        let (ptr, size, requested, stream, small, owner) = (b.ptr, b.size, b.requested_size, b.stream, b.small, b.pool);
        let frames = if recording { ctx.clone().or_else(|| b.context.clone()) } else { None };
        let pool = StatType::for_pool(small);
        self.stats.allocation.decrease(pool, 1);
        self.stats.allocated_bytes.decrease(pool, size);
        self.record(Action::FreeRequested, ptr, requested, stream, owner, frames);
        if size >= self.config.max_split_size {
            self.stats.oversize_allocations.decrease(1);
        }
        if self.b(id).stream_uses.is_none() {
            self.free_block(id, &ctx);
        } else if !self.captures_underway.is_empty() {
            // Events cannot be recorded into a capture: the block waits, active, until none is underway.
            self.deferred_until_no_capture.push(id);
        } else {
            self.capture_stream_uses.remove(&id);
            self.insert_events(id);
        }
    }

    /// `Tensor.record_stream` by address: the block was used on `stream` too; its reuse waits for
    /// that work.
    pub fn record_stream(&mut self, ptr: u64, stream: Stream) -> Result<(), AllocError> {
        let id = *self.pointer_index().get(&ptr).ok_or(AllocError::InvalidPointer(ptr))?;
        self.add_stream_use(id, stream);
        Ok(())
    }

    /// `record_stream` for an allocation handle.
    pub fn record_stream_allocation(&mut self, a: &Allocation, stream: Stream) -> Result<(), AllocError> {
        let id = self.allocated_block(a)?;
        self.add_stream_use(id, stream);
        Ok(())
    }

    fn add_stream_use(&mut self, id: BlockId, stream: Stream) {
        let b = self.bm(id);
        if b.stream != stream {
            let uses = b.stream_uses.get_or_insert_with(Default::default);
            if !uses.contains(&stream) {
                uses.push(stream);
            }
            if !self.captures_underway.is_empty() {
                let during = self.capture_stream_uses.entry(id).or_default();
                if !during.contains(&stream) {
                    during.push(stream);
                }
            }
        }
    }

    fn insert_events(&mut self, id: BlockId) {
        let streams = self.bm(id).stream_uses.take().map(|b| *b).unwrap_or_default();
        for stream in streams {
            self.bm(id).event_count += 1;
            self.events.entry(stream).or_default().0.push_back(id);
        }
    }

    /// The device finished all work submitted so far on `stream`: its events are complete. As with
    /// cudaEventQuery, the allocator notices at its next `malloc` (or `empty_cache`).
    pub fn stream_work_completed(&mut self, stream: Stream) {
        if let Some((queue, done)) = self.events.get_mut(&stream) {
            *done = queue.len();
        }
    }

    /// Completes every outstanding event of the block at `ptr` now (replay: the trace says when).
    pub fn complete_pending_free(&mut self, ptr: u64, ctx: Option<Frames>) -> Result<(), AllocError> {
        let id = self.pending_block_at(ptr).ok_or(AllocError::InvalidPointer(ptr))?;
        for (queue, done) in self.events.values_mut() {
            let before = queue.len();
            let mut index = 0;
            queue.retain(|&b| {
                let keep = b != id;
                if !keep && index < *done {
                    *done -= 1;
                }
                index += 1;
                keep
            });
            debug_assert!(queue.len() <= before);
        }
        self.events.retain(|_, (q, _)| !q.is_empty());
        self.bm(id).event_count = 0;
        let ctx = if self.history.context() >= RecordContext::All { ctx } else { None };
        self.free_block(id, &ctx);
        Ok(())
    }

    fn pending_block_at(&self, ptr: u64) -> Option<BlockId> {
        self.events.values().flat_map(|(q, _)| q.iter().copied()).find(|&id| self.b(id).ptr == ptr && !self.b(id).allocated)
    }

    fn process_events(&mut self, ctx: &Option<Frames>) {
        self.insert_events_deferred_until_no_capture(ctx);
        if self.events.is_empty() {
            return;
        }
        let mut completed = Vec::new();
        for (queue, done) in self.events.values_mut() {
            completed.extend(queue.drain(..*done));
            *done = 0;
        }
        self.events.retain(|_, (q, _)| !q.is_empty());
        // One at a time, as PyTorch does: a neighbour still waiting on its events must not merge.
        for id in completed {
            let b = self.bm(id);
            b.event_count -= 1;
            if b.event_count == 0 {
                self.free_block(id, ctx);
            }
        }
    }

    fn synchronize_and_free_events(&mut self, ctx: &Option<Frames>) {
        self.insert_events_deferred_until_no_capture(ctx);
        self.stats.num_sync_all_streams += 1;
        for queue in self.events.values_mut() {
            queue.1 = queue.0.len();
        }
        self.process_events(ctx);
    }

    fn free_block(&mut self, id: BlockId, ctx: &Option<Frames>) {
        let recording = self.history.is_recording();
        let b = &mut self.blocks[id.index()];
        debug_assert!(!b.allocated && b.event_count == 0 && b.stream_uses.is_none());
        let context = b.context.take();
        let frames = if recording { ctx.clone().or(context) } else { None };
        let (ptr, original_size, requested, stream, small, prev, next, owner) = (b.ptr, b.size, b.requested_size, b.stream, b.small, b.prev, b.next, b.pool);
        self.record(Action::FreeCompleted, ptr, requested, stream, owner, frames);
        let mut net_blocks: i64 = 0;
        let mut net_bytes: i64 = 0;
        for candidate in [prev, next] {
            let subsumed = self.try_merge_blocks(id, candidate);
            if subsumed > 0 {
                net_blocks -= 1;
                net_bytes -= subsumed as i64;
            }
        }
        self.pool_insert(id);
        let b = self.b(id);
        if b.is_split() {
            net_blocks += 1;
            net_bytes += b.size as i64;
        }
        let pool = StatType::for_pool(small);
        let s = &mut self.stats;
        // Fully free pages of expandable segments can always be returned, so they never count
        // as inactive_split (as in PyTorch).
        if !self.blocks[id.index()].is_expandable() {
            if net_blocks > 0 {
                s.inactive_split.increase(pool, net_blocks as u64);
            } else if net_blocks < 0 {
                s.inactive_split.decrease(pool, (-net_blocks) as u64);
            }
            if net_bytes > 0 {
                s.inactive_split_bytes.increase(pool, net_bytes as u64);
            } else if net_bytes < 0 {
                s.inactive_split_bytes.decrease(pool, (-net_bytes) as u64);
            }
        }
        s.active.decrease(pool, 1);
        s.active_bytes.decrease(pool, original_size);
        s.requested_bytes.decrease(pool, requested);
    }

    /// Merges free neighbour `src` into `dst`; returns the bytes subsumed (0: no merge).
    fn try_merge_blocks(&mut self, dst: BlockId, src: Option<BlockId>) -> u64 {
        let Some(src) = src else { return 0 };
        let s = self.b(src);
        if s.allocated || s.event_count > 0 || s.stream_uses.is_some() || s.mapped != self.b(dst).mapped {
            return 0;
        }
        let (s_ptr, s_size, s_prev, s_next, s_mapped) = (s.ptr, s.size, s.prev, s.next, s.mapped);
        if s_mapped {
            self.pool_remove(src);
        } else {
            self.unmapped_remove(src);
        }
        if self.b(dst).prev == Some(src) {
            let seg_ctx = self.bm(src).segment_context.take();
            let d = self.bm(dst);
            d.ptr = s_ptr;
            d.prev = s_prev;
            d.segment_context = seg_ctx;
            if let Some(s_prev) = s_prev {
                self.bm(s_prev).next = Some(dst);
            }
        } else {
            self.bm(dst).next = s_next;
            if let Some(s_next) = s_next {
                self.bm(s_next).prev = Some(dst);
            }
        }
        self.bm(dst).size += s_size;
        self.delete_block(src);
        s_size
    }

    // ---------------------------------------------------------------- getting memory

    fn alloc_block(&mut self, p: &mut Params, is_retry: bool, ctx: &Option<Frames>) -> bool {
        if is_retry {
            self.stats.num_alloc_retries += 1;
        }
        let size = p.alloc_size;
        if let Some(max) = self.allowed_memory_maximum
            && self.total_allocated_memory + size > max
        {
            return false;
        }
        if self.config.expandable_segments && self.source.supports_expandable() {
            return match self.try_allocate_expandable_block(p.pool, p.stream, p.small, p.size, ctx) {
                Some(id) => {
                    p.block = Some(id);
                    true
                }
                None => false,
            };
        }
        if !self.device_has_room(size) {
            return false;
        }
        let Some(ptr) = self.source.allocate(size) else { return false };
        self.total_allocated_memory += size;
        let mut block = Block::new(p.stream, size, p.small, ptr, ptr, p.pool);
        block.segment_context = ctx.clone();
        p.block = Some(self.new_block(block));
        self.pools[p.pool as usize].segments += 1;
        let pool = StatType::for_pool(p.small);
        self.stats.segment.increase(pool, 1);
        self.stats.reserved_bytes.increase(pool, size);
        if size >= self.config.max_split_size {
            self.stats.oversize_segments.increase(1);
        }
        self.stats.num_device_alloc += 1;
        self.record(Action::SegmentAlloc, ptr, size, p.stream, p.pool, ctx.clone());
        true
    }

    fn device_has_room(&self, bytes: u64) -> bool {
        self.total_allocated_memory.saturating_add(self.external_usage).saturating_add(bytes) <= self.memory_limit()
    }

    /// Frees cached oversize blocks until `max(request, max_split_size)` bytes are returned.
    fn release_available_cached_blocks(&mut self, p: &Params, ctx: &Option<Frames>) -> bool {
        let max_split = self.config.max_split_size;
        if max_split == u64::MAX {
            return false;
        }
        let key_size_ = p.size.max(max_split);
        let pool = &self.pools[p.pool as usize].free[pool_index(p.small)];
        let blocks = &self.blocks;
        let usable = |id: BlockId| !blocks[id.index()].is_expandable();
        let Some(free) = pool.stream(p.stream) else { return false };
        let mut single = free.lower_bound(key(key_size_, 0));
        while let Some((k, id)) = single {
            if usable(BlockId::from_raw(id)) {
                break;
            }
            single = free.next_after(k);
        }
        if let Some((_, id)) = single {
            self.release_block(BlockId::from_raw(id), ctx);
            return true;
        }
        // No single block is large enough: free oversize blocks from the largest down.
        let mut victims = Vec::new();
        let mut released = 0;
        let mut below = free.prev_before(key(key_size_, 0));
        while let Some((k, raw)) = below {
            let id = BlockId::from_raw(raw);
            if released >= key_size_ || key_size(k) < max_split {
                break;
            }
            if usable(id) {
                released += key_size(k);
                victims.push(id);
            }
            below = free.prev_before(k);
        }
        for id in victims {
            self.release_block(id, ctx);
        }
        released >= key_size_
    }

    /// `empty_cache`: waits for outstanding events, then returns every whole free segment and
    /// unmaps every free page of expandable segments. Partially used segments stay. Private pools
    /// still in use keep theirs; those no graph or scope uses any more give theirs back too.
    pub fn empty_cache(&mut self) {
        self.release_cached_blocks(&None, DEFAULT_POOL);
    }

    /// `release_cached_blocks(context, mempool_id)`: `DEFAULT_POOL` releases the default pool
    /// (unless a pool is being allocated to) and every freeable private pool; another id only
    /// that pool, and only if it is freeable. A freeable pool left with no segment is erased.
    fn release_cached_blocks(&mut self, ctx: &Option<Frames>, target: PoolId) -> bool {
        if target == DEFAULT_POOL && self.captures_underway.is_empty() {
            self.synchronize_and_free_events(ctx);
            self.release_blocks(0, false, ctx);
            self.release_blocks(0, true, ctx);
        }
        for index in 1..self.pools.len() as u32 {
            let pool = &self.pools[index as usize];
            if !pool.is_freeable() || (target != DEFAULT_POOL && pool.id != target) {
                continue;
            }
            if target != DEFAULT_POOL {
                self.synchronize_and_free_events(ctx);
            }
            self.release_blocks(index, false, ctx);
            self.release_blocks(index, true, ctx);
            let pool = &mut self.pools[index as usize];
            if pool.segments == 0 {
                pool.live = false;
            }
        }
        true
    }

    fn release_blocks(&mut self, pool: u32, small: bool, ctx: &Option<Frames>) {
        let ids: Vec<BlockId> = self.pools[pool as usize].free[pool_index(small)].ids();
        let mut to_unmap = Vec::new();
        for id in ids {
            let b = self.b(id);
            if b.is_expandable() {
                to_unmap.push(id);
            } else if !b.is_split() {
                self.release_block(id, ctx);
            }
        }
        for id in to_unmap {
            self.unmap_block(id, ctx);
            if !self.b(id).is_split() {
                self.release_expandable_segment(id);
            }
        }
    }

    fn release_block(&mut self, id: BlockId, ctx: &Option<Frames>) {
        let b = self.b(id);
        debug_assert!(!b.is_expandable() && !b.is_split());
        let (ptr, size, stream, small, pool) = (b.ptr, b.size, b.stream, b.small, b.pool);
        let frames = ctx.clone().or_else(|| b.segment_context.clone());
        self.pools[pool as usize].segments -= 1;
        self.stats.num_device_free += 1;
        self.record(Action::SegmentFree, ptr, size, stream, pool, frames);
        self.source.free(ptr, size);
        self.total_allocated_memory -= size;
        let pool = StatType::for_pool(small);
        self.stats.segment.decrease(pool, 1);
        self.stats.reserved_bytes.decrease(pool, size);
        if size >= self.config.max_split_size {
            self.stats.oversize_segments.decrease(1);
        }
        self.pool_remove(id);
        self.delete_block(id);
    }

    /// Frees unsplit large cached blocks older than average until reserved memory is back under
    /// `garbage_collection_threshold * allowed`.
    fn garbage_collect_cached_blocks(&mut self, ctx: &Option<Frames>) {
        let Some(allowed) = self.allowed_memory_maximum else { return };
        let threshold = (self.config.garbage_collection_threshold * allowed as f64) as u64;
        if self.total_allocated_memory <= threshold {
            return;
        }
        let target = self.total_allocated_memory - threshold;
        // Only the default pool's blocks age and are collected, as in PyTorch.
        let clock = self.pools[0].free[LARGE].get_free_blocks_call_count;
        let freeable =
            |a: &Self| -> Vec<BlockId> { a.pools[0].free[LARGE].ids().into_iter().filter(|&id| !a.b(id).is_split() && !a.b(id).is_expandable()).collect() };
        let age = |a: &Self, id: BlockId| (clock - a.b(id).gc_count_base) as f64;
        let mut candidates = freeable(self);
        let mut total_age: f64 = candidates.iter().map(|&id| age(self, id)).sum();
        let mut reclaimed = 0;
        while reclaimed < target && !candidates.is_empty() {
            let threshold_age = total_age / candidates.len() as f64;
            let mut freed_any = false;
            for id in std::mem::take(&mut candidates) {
                if age(self, id) >= threshold_age {
                    freed_any = true;
                    reclaimed += self.b(id).size;
                    total_age -= age(self, id);
                    self.release_block(id, ctx);
                } else {
                    candidates.push(id);
                }
            }
            if !freed_any {
                break;
            }
        }
    }

    // ---------------------------------------------------------------- history

    /// `torch.cuda.memory._record_memory_history`.
    pub fn record_memory_history(&mut self, enabled: bool, context: RecordContext, max_entries: usize) {
        self.history.configure(enabled, context, max_entries);
    }

    pub fn history(&self) -> &History {
        &self.history
    }

    /// Moves a modelled clock forward: the program says how long its work took.
    pub fn advance_time_us(&mut self, us: f64) {
        self.history.advance_time_us(us);
    }

    pub fn history_mut(&mut self) -> &mut History {
        &mut self.history
    }
}

/// Address space an expandable segment reserves when the device has no stated capacity.
const DEFAULT_EXPANDABLE_SPAN: u64 = 1 << 40;
/// The largest device an expandable segment spans (2^56 bytes: more than any card, and 9/8 of
/// it in pages still fits in 64-bit addresses).
const MAX_EXPANDABLE_SPAN: u64 = 1 << 56;
