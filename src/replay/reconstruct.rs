//! The allocator state at the start of a trace, found by undoing the trace's events from the
//! snapshot's final segments (as MemoryViz does). Most real traces start mid-run: the ring
//! buffer dropped their beginning.
//!
//! Undoing a free must re-create a block whose size the trace does not record (only the request).
//! PyTorch's rules settle it: a small-pool or expandable block is exactly `round_size(request)`; a
//! large-pool block is that size unless the free space after it is at most 1 MiB, which PyTorch
//! would not have split off, so the block owns it. Hence in a large pool no free block of 1 MiB or
//! less follows an active one; when undoing leaves such a gap, it belongs to the block before it.

use crate::alloc::constants::{SMALL_BUFFER, SMALL_SIZE};
use crate::alloc::{AllocatorConfig, round_size};
use crate::trace::{self, Action, BlockState, Frames, PoolKind, TraceEntry};
use std::collections::BTreeMap;

#[derive(Debug, Clone)]
struct WBlock {
    size: u64,
    requested: u64,
    state: BlockState,
    frames: BlockFrames,
    /// Re-created by undoing a free: its extent was inferred, not read from the snapshot.
    inferred: bool,
}

/// A block's stack, by where it is: cloning an entry's `Frames` for every undone free touched
/// the reference count of a stack far away in memory (a cache miss and an atomic add per
/// event, a third of the reconstruction); only the blocks of the start state need theirs.
#[derive(Debug, Clone)]
enum BlockFrames {
    None,
    Read(Frames),
    /// `trace[i].frames`.
    OfEntry(usize),
}

impl BlockFrames {
    fn get(&self, trace: &[TraceEntry]) -> Frames {
        match self {
            BlockFrames::Read(frames) => frames.clone(),
            BlockFrames::OfEntry(i) => trace[*i].frames.clone().unwrap_or_else(trace::no_frames),
            BlockFrames::None => trace::no_frames(),
        }
    }
}

#[derive(Debug, Clone)]
struct WSegment {
    stream: i64,
    /// `segment_pool_id`: the pool owning it (a segment re-created by undoing its free belongs
    /// to the pool its entry names, else to the default pool).
    pool: (i64, i64),
    small: bool,
    expandable: bool,
    frames: Frames,
    blocks: BTreeMap<u64, WBlock>,
}

impl WSegment {
    fn end(&self) -> u64 {
        self.blocks.iter().next_back().map_or(0, |(a, b)| a + b.size)
    }
}

/// The state at the start of the trace, plus what did not add up.
#[derive(Debug, Clone, Default)]
pub struct StartState {
    pub segments: Vec<trace::Segment>,
    pub warnings: Vec<String>,
}

struct Work<'a> {
    config: &'a AllocatorConfig,
    segments: BTreeMap<u64, WSegment>,
    warnings: Vec<String>,
    /// Events that could not be undone, beyond those named in `warnings`.
    unexplained: usize,
    /// The extent of the segment `segment_at` found last (None once a segment event is undone:
    /// only those change segments).
    last_segment: Option<(u64, u64)>,
}

/// The events that do not add up named one by one; the rest are counted in one line (a file
/// without its final segments would otherwise name every event of its trace).
const NAMED_WARNINGS: usize = 5;

impl Work<'_> {
    fn warn(&mut self, index: usize, e: &TraceEntry, what: &str) {
        if self.warnings.len() < NAMED_WARNINGS {
            self.warnings.push(format!("event {index} ({} at {:#x}): {what}", e.action.name(), e.addr));
        } else {
            self.unexplained += 1;
        }
    }

    fn segment_at(&mut self, addr: u64) -> Option<(u64, &mut WSegment)> {
        // Events in a row mostly touch one segment: a key lookup is half a range's cost.
        if let Some((base, end)) = self.last_segment
            && (base..end).contains(&addr)
        {
            return Some((base, self.segments.get_mut(&base).expect("the segment last found")));
        }
        let (&base, seg) = self.segments.range_mut(..=addr).next_back()?;
        let end = seg.end();
        self.last_segment = Some((base, end));
        (addr < end).then_some((base, seg))
    }

    fn undo(&mut self, index: usize, e: &TraceEntry) {
        match e.action {
            Action::Alloc => self.undo_alloc(index, e),
            Action::FreeRequested => {
                let ok = self
                    .segment_at(e.addr)
                    .and_then(|(_, s)| s.blocks.get_mut(&e.addr))
                    .filter(|b| b.state == BlockState::ActivePendingFree)
                    .map(|b| b.state = BlockState::ActiveAllocated)
                    .is_some();
                if !ok {
                    self.warn(index, e, "no pending block there to un-free");
                }
            }
            Action::FreeCompleted => self.undo_free(index, e),
            Action::SegmentAlloc | Action::SegmentMap => {
                self.undo_segment_alloc(index, e);
                self.last_segment = None;
            }
            Action::SegmentFree | Action::SegmentUnmap => {
                self.undo_segment_free(index, e);
                self.last_segment = None;
            }
            Action::Snapshot | Action::Oom | Action::Annotate => {}
        }
    }

    fn undo_alloc(&mut self, index: usize, e: &TraceEntry) {
        let Some((_, seg)) = self.segment_at(e.addr) else {
            return self.warn(index, e, "no segment holds it");
        };
        match seg.blocks.get_mut(&e.addr) {
            Some(b) if b.state == BlockState::ActiveAllocated => {
                b.state = BlockState::Inactive;
                b.inferred = false;
                coalesce(seg, e.addr);
            }
            _ => self.warn(index, e, "no allocated block starts there"),
        }
    }

    fn undo_free(&mut self, index: usize, e: &TraceEntry) {
        let size = round_size(e.size, self.config);
        let max_split = self.config.max_split_size;
        let tolerance = self.config.max_non_split_rounding_size;
        let Some((_, seg)) = self.segment_at(e.addr) else {
            return self.warn(index, e, "no segment holds it");
        };
        // The free block holding it and the block before that, in one walk of the map.
        let mut around = seg.blocks.range_mut(..=e.addr);
        let Some((&start, free)) = around.next_back() else {
            return self.warn(index, e, "no block holds it");
        };
        let end = start + free.size;
        if free.state != BlockState::Inactive || e.addr.saturating_add(size) > end {
            return self.warn(index, e, "its bytes are not free at that point");
        }
        let exact = seg.small || seg.expandable;
        let slack = end - (e.addr + size);
        let block_end = if exact {
            e.addr + size
        } else if size >= max_split {
            // Oversize blocks are never split; they may exceed the request by the tolerance.
            if end - e.addr < size.saturating_add(tolerance) { end } else { e.addr + size }
        } else if slack <= SMALL_SIZE {
            end
        } else {
            e.addr + size
        };
        let freed =
            WBlock { size: block_end - e.addr, requested: e.size, state: BlockState::ActivePendingFree, frames: BlockFrames::OfEntry(index), inferred: true };
        // A free gap of at most 1 MiB left before it, after an inferred active block, is that block's.
        let gap = e.addr - start;
        let absorbed = !exact
            && gap > 0
            && gap <= SMALL_SIZE
            && match around.next_back() {
                Some((_, before)) if before.state != BlockState::Inactive && before.inferred => {
                    before.size += gap;
                    true
                }
                _ => false,
            };
        if gap == 0 {
            *free = freed;
        } else {
            if absorbed {
                seg.blocks.remove(&start);
            } else {
                *free = free_block(gap);
            }
            seg.blocks.insert(e.addr, freed);
        }
        if block_end < end {
            seg.blocks.insert(block_end, free_block(end - block_end));
        }
    }

    fn undo_segment_alloc(&mut self, index: usize, e: &TraceEntry) {
        let Some((base, seg)) = self.segment_at(e.addr) else {
            return self.warn(index, e, "no segment there");
        };
        let end = e.addr.saturating_add(e.size);
        let free_over_range = seg.blocks.range(..end).filter(|(a, b)| **a + b.size > e.addr).all(|(_, b)| b.state == BlockState::Inactive);
        if !free_over_range || end > seg.end() {
            return self.warn(index, e, "the segment is not free at that point");
        }
        // Cut [addr, end) out; an expandable range may leave a left and a right part.
        let seg = self.segments.remove(&base).unwrap();
        let (mut left, mut right) = (BTreeMap::new(), BTreeMap::new());
        for (a, b) in seg.blocks.iter() {
            let b_end = a + b.size;
            if b_end <= e.addr {
                left.insert(*a, b.clone());
            } else if *a >= end {
                right.insert(*a, b.clone());
            } else {
                // A free block straddling the cut keeps its parts outside it.
                if *a < e.addr {
                    left.insert(*a, free_block(e.addr - a));
                }
                if b_end > end {
                    right.insert(end, free_block(b_end - end));
                }
            }
        }
        for part in [left, right] {
            if let Some(&start) = part.keys().next() {
                self.segments.insert(start, WSegment { blocks: part, ..seg.clone() });
            }
        }
    }

    fn undo_segment_free(&mut self, index: usize, e: &TraceEntry) {
        let Some(end) = e.addr.checked_add(e.size).filter(|_| e.size > 0) else {
            return self.warn(index, e, "impossible range");
        };
        let overlaps = self.segments.range(..end).next_back().is_some_and(|(_, s)| s.end() > e.addr);
        if overlaps {
            return self.warn(index, e, "the range overlaps a segment that exists at that point");
        }
        let small = if e.action == Action::SegmentFree {
            e.size == SMALL_BUFFER
        } else {
            // Unmapped pages: small-pool pages are 2 MiB, large-pool pages 20 MiB.
            !e.size.is_multiple_of(20 << 20)
        };
        let block = free_block(e.size);
        let seg = WSegment {
            stream: e.stream,
            pool: e.pool_id().unwrap_or((0, 0)),
            small,
            expandable: e.action == Action::SegmentUnmap,
            frames: e.frames.clone().unwrap_or_else(trace::no_frames),
            blocks: BTreeMap::from([(e.addr, block)]),
        };
        self.segments.insert(e.addr, seg);
        if e.action == Action::SegmentUnmap {
            self.merge_expandable_neighbours(e.addr);
        }
    }

    /// Mapped ranges of one expandable segment that touch are one snapshot segment.
    fn merge_expandable_neighbours(&mut self, addr: u64) {
        let mut base = addr;
        if let Some((&prev, p)) = self.segments.range(..addr).next_back()
            && p.expandable
            && p.end() == addr
        {
            let seg = self.segments.remove(&addr).unwrap();
            let p = self.segments.get_mut(&prev).unwrap();
            p.blocks.extend(seg.blocks);
            coalesce(p, addr);
            base = prev;
        }
        let end = self.segments[&base].end();
        if let Some(next) = self.segments.remove(&end) {
            if next.expandable {
                let seg = self.segments.get_mut(&base).unwrap();
                seg.blocks.extend(next.blocks);
                coalesce(seg, end);
            } else {
                self.segments.insert(end, next);
            }
        }
    }
}

fn free_block(size: u64) -> WBlock {
    WBlock { size, requested: 0, state: BlockState::Inactive, frames: BlockFrames::None, inferred: false }
}

/// Merges the free block at `addr` with free neighbours.
fn coalesce(seg: &mut WSegment, addr: u64) {
    let mut around = seg.blocks.range_mut(..=addr);
    let Some((_, block)) = around.next_back().filter(|(a, b)| **a == addr && b.state == BlockState::Inactive) else {
        return;
    };
    let size = block.size;
    let (addr, size) = match around.next_back() {
        Some((&prev, p)) if p.state == BlockState::Inactive => {
            p.size += size;
            let merged = p.size;
            seg.blocks.remove(&addr);
            (prev, merged)
        }
        _ => (addr, size),
    };
    let end = addr + size;
    if let Some(next) = seg.blocks.get(&end).filter(|n| n.state == BlockState::Inactive) {
        let next_size = next.size;
        seg.blocks.remove(&end);
        seg.blocks.get_mut(&addr).expect("the block being merged").size += next_size;
    }
}

/// Undoes `trace` from `final_segments` (one device's) back to the trace's first event.
pub fn start_state(final_segments: &[&trace::Segment], trace: &[TraceEntry], config: &AllocatorConfig) -> StartState {
    let mut work = Work { config, segments: BTreeMap::new(), warnings: Vec::new(), unexplained: 0, last_segment: None };
    for s in final_segments {
        let blocks = s
            .blocks
            .iter()
            .map(|b| {
                (b.address, WBlock { size: b.size, requested: b.requested_size, state: b.state, frames: BlockFrames::Read(b.frames.clone()), inferred: false })
            })
            .collect();
        let seg = WSegment {
            stream: s.stream,
            pool: s.segment_pool_id,
            small: s.segment_type == PoolKind::Small,
            expandable: s.is_expandable,
            frames: s.frames.clone(),
            blocks,
        };
        work.segments.insert(s.address, seg);
    }
    for (index, e) in trace.iter().enumerate().rev() {
        work.undo(index, e);
    }
    let segments = work
        .segments
        .iter()
        .map(|(&address, s)| {
            let blocks: Vec<trace::Block> = s
                .blocks
                .iter()
                .map(|(&a, b)| trace::Block { address: a, size: b.size, requested_size: b.requested, state: b.state, frames: b.frames.get(trace) })
                .collect();
            let active = |b: &&trace::Block| b.state.is_active();
            trace::Segment {
                device: 0,
                address,
                total_size: blocks.iter().map(|b| b.size).sum(),
                allocated_size: blocks.iter().filter(|b| b.state == BlockState::ActiveAllocated).map(|b| b.size).sum(),
                active_size: blocks.iter().filter(active).map(|b| b.size).sum(),
                requested_size: blocks.iter().filter(active).map(|b| b.requested_size).sum(),
                stream: s.stream,
                segment_type: if s.small { PoolKind::Small } else { PoolKind::Large },
                segment_pool_id: s.pool,
                is_expandable: s.expandable,
                frames: s.frames.clone(),
                blocks,
            }
        })
        .collect();
    let mut warnings = work.warnings;
    if work.unexplained > 0 {
        warnings.push(format!(
            "{} more events like these: the snapshot's final segments do not account for them (were its segments dropped, or the file edited?)",
            work.unexplained
        ));
    }
    StartState { segments, warnings }
}
