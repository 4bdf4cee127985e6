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
use crate::trace::{self, Action, BlockState, Entry, Frames, PoolKind, Trace};
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
    fn get(&self, trace: &Trace) -> Frames {
        match self {
            BlockFrames::Read(frames) => frames.clone(),
            BlockFrames::OfEntry(i) => frames_of(trace.at(*i)),
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
        self.blocks.last_key_value().map_or(0, |(a, b)| a + b.size)
    }
}

/// The segments by base address: the bases sorted, each with the slot its segment lives in
/// while it exists. Finding the segment that holds an address is a binary search of the bases
/// (events in a step touch segment after segment, so the one found last rarely serves: a
/// search of a map was a third of the reconstruction), and segments are added or removed
/// only by segment events, which are few.
#[derive(Default)]
struct Segments {
    bases: Vec<u64>,
    /// `slot_of[i]`: the slot of the segment at `bases[i]`.
    slot_of: Vec<usize>,
    slots: Vec<Option<WSegment>>,
    free_slots: Vec<usize>,
}

impl Segments {
    /// Adds the segment at `base`, in place of any there.
    fn insert(&mut self, base: u64, seg: WSegment) {
        match self.bases.binary_search(&base) {
            Ok(i) => self.slots[self.slot_of[i]] = Some(seg),
            Err(i) => {
                let slot = match self.free_slots.pop() {
                    Some(slot) => {
                        self.slots[slot] = Some(seg);
                        slot
                    }
                    None => {
                        self.slots.push(Some(seg));
                        self.slots.len() - 1
                    }
                };
                self.bases.insert(i, base);
                self.slot_of.insert(i, slot);
            }
        }
    }

    fn remove(&mut self, base: u64) -> Option<WSegment> {
        let i = self.bases.binary_search(&base).ok()?;
        self.bases.remove(i);
        let slot = self.slot_of.remove(i);
        self.free_slots.push(slot);
        self.slots[slot].take()
    }

    fn slot(&mut self, slot: usize) -> &mut WSegment {
        self.slots[slot].as_mut().expect("a listed slot holds its segment")
    }

    fn slot_of_base(&self, base: u64) -> Option<usize> {
        Some(self.slot_of[self.bases.binary_search(&base).ok()?])
    }

    fn get_mut(&mut self, base: u64) -> Option<&mut WSegment> {
        let slot = self.slot_of_base(base)?;
        Some(self.slot(slot))
    }

    /// The last segment starting at or before `addr` (`inclusive`) or before it, with its base
    /// and slot.
    fn last_before(&self, addr: u64, inclusive: bool) -> Option<(u64, usize, &WSegment)> {
        let n = self.bases.partition_point(|&b| b < addr || (inclusive && b == addr));
        let i = n.checked_sub(1)?;
        let slot = self.slot_of[i];
        Some((self.bases[i], slot, self.slots[slot].as_ref().expect("a listed slot holds its segment")))
    }

    fn iter(&self) -> impl Iterator<Item = (u64, &WSegment)> {
        self.bases.iter().zip(&self.slot_of).map(|(&base, &slot)| (base, self.slots[slot].as_ref().expect("a listed slot holds its segment")))
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
    segments: Segments,
    warnings: Vec<String>,
    /// Events that could not be undone, beyond those named in `warnings`.
    unexplained: usize,
    /// Segments `segment_at` found lately (base, end and slot), one for each 2 MiB of address
    /// space modulo `RECENT` (the last one searched for there, which may end before the address
    /// searched: it then serves no one): events in a step touch segment after
    /// segment, and most come back to one found before. Forgotten once a segment event is
    /// undone (only those add, cut or join segments), and never kept for final segments that
    /// overlap or whose blocks leave gaps (no allocator writes them): only contiguous blocks
    /// keep a segment's end where it was.
    recent: Box<[Option<(u64, u64, usize)>; RECENT]>,
    /// The final segments are disjoint and tiled by their blocks (`Work::tiled`).
    tiled: bool,
}

/// Ways of `Work::recent`.
const RECENT: usize = 256;

/// The events that do not add up named one by one; the rest are counted in one line (a file
/// without its final segments would otherwise name every event of its trace).
const NAMED_WARNINGS: usize = 5;

impl Work<'_> {
    fn warn(&mut self, index: usize, e: Entry<'_>, what: &str) {
        if self.warnings.len() < NAMED_WARNINGS {
            self.warnings.push(format!("event {index} ({} at {:#x}): {what}", e.action.name(), e.addr));
        } else {
            self.unexplained += 1;
        }
    }

    fn segment_at(&mut self, addr: u64) -> Option<(u64, &mut WSegment)> {
        let way = (addr >> 21) as usize % RECENT;
        if let Some((base, end, slot)) = self.recent[way]
            && (base..end).contains(&addr)
        {
            debug_assert_eq!(self.segments.slot_of_base(base), Some(slot), "a segment remembered after a segment event");
            return Some((base, self.segments.slot(slot)));
        }
        let (base, slot, seg) = self.segments.last_before(addr, true)?;
        let end = seg.end();
        if self.tiled {
            self.recent[way] = Some((base, end, slot));
        }
        (addr < end).then_some((base, self.segments.slot(slot)))
    }

    /// Whether the segments are disjoint and each is its blocks end to end from its address.
    fn tiled(&self) -> bool {
        let mut segments_end = 0;
        self.segments.iter().all(|(base, s)| {
            let mut end = base;
            let contiguous = s.blocks.iter().all(|(&a, b)| {
                let next = a == end;
                end = a.saturating_add(b.size);
                next
            });
            let disjoint = base >= segments_end;
            segments_end = end;
            contiguous && disjoint
        })
    }

    fn undo(&mut self, index: usize, e: Entry<'_>) {
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
                self.recent.fill(None);
            }
            Action::SegmentFree | Action::SegmentUnmap => {
                self.undo_segment_free(index, e);
                self.recent.fill(None);
            }
            Action::Snapshot | Action::Oom | Action::Annotate => {}
        }
    }

    fn undo_alloc(&mut self, index: usize, e: Entry<'_>) {
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

    fn undo_free(&mut self, index: usize, e: Entry<'_>) {
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
        // A free gap of at most 1 MiB left before it belongs to an inferred active block just
        // before the gap (the module's comment says why).
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

    fn undo_segment_alloc(&mut self, index: usize, e: Entry<'_>) {
        let Some((base, seg)) = self.segment_at(e.addr) else {
            return self.warn(index, e, "no segment there");
        };
        let end = e.addr.saturating_add(e.size);
        let free_over_range = seg.blocks.range(..end).filter(|(a, b)| **a + b.size > e.addr).all(|(_, b)| b.state == BlockState::Inactive);
        if !free_over_range || end > seg.end() {
            return self.warn(index, e, "the segment is not free at that point");
        }
        // Cut [addr, end) out; an expandable range may leave a left and a right part.
        let seg = self.segments.remove(base).expect("the segment just found");
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

    fn undo_segment_free(&mut self, index: usize, e: Entry<'_>) {
        let Some(end) = e.addr.checked_add(e.size).filter(|_| e.size > 0) else {
            return self.warn(index, e, "impossible range");
        };
        let overlaps = self.segments.last_before(end, false).is_some_and(|(_, _, s)| s.end() > e.addr);
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
            frames: frames_of(e),
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
        if let Some((prev, prev_slot, p)) = self.segments.last_before(addr, false)
            && p.expandable
            && p.end() == addr
        {
            let seg = self.segments.remove(addr).expect("the segment just added");
            let p = self.segments.slot(prev_slot);
            p.blocks.extend(seg.blocks);
            coalesce(p, addr);
            base = prev;
        }
        let end = self.segments.get_mut(base).expect("the segment just added or joined").end();
        if let Some(next) = self.segments.remove(end) {
            if next.expandable {
                let seg = self.segments.get_mut(base).expect("the segment just added or joined");
                seg.blocks.extend(next.blocks);
                coalesce(seg, end);
            } else {
                self.segments.insert(end, next);
            }
        }
    }
}

fn frames_of(e: Entry<'_>) -> Frames {
    e.frames.clone().unwrap_or_else(trace::no_frames)
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
    // (A block of no bytes would find itself as its neighbour.)
    if let Some(next) = seg.blocks.get(&end).filter(|n| end != addr && n.state == BlockState::Inactive) {
        let next_size = next.size;
        seg.blocks.remove(&end);
        seg.blocks.get_mut(&addr).expect("the block being merged").size += next_size;
    }
}

/// Undoes `trace` from `final_segments` (one device's) back to the trace's first event.
pub fn start_state(final_segments: &[&trace::Segment], trace: &Trace, config: &AllocatorConfig) -> StartState {
    let mut work = Work { config, segments: Segments::default(), warnings: Vec::new(), unexplained: 0, recent: Box::new([None; RECENT]), tiled: false };
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
    work.tiled = work.tiled();
    for (index, e) in trace.iter().enumerate().rev() {
        work.undo(index, e);
    }
    let segments = work
        .segments
        .iter()
        .map(|(address, s)| {
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

#[cfg(test)]
mod tests {
    //! Snapshots no allocator writes (segments that overlap, blocks with gaps or of no bytes):
    //! the reconstruction must neither panic nor answer from a segment it looked up earlier.
    use super::*;
    use crate::trace::TraceEntry;
    use BlockState::*;

    fn segment(address: u64, expandable: bool, blocks: &[(u64, u64, BlockState)]) -> trace::Segment {
        trace::Segment {
            device: 0,
            address,
            total_size: blocks.iter().map(|b| b.1).sum(),
            allocated_size: 0,
            active_size: 0,
            requested_size: 0,
            stream: 0,
            segment_type: PoolKind::Large,
            segment_pool_id: (0, 0),
            is_expandable: expandable,
            frames: trace::no_frames(),
            blocks: blocks
                .iter()
                .map(|&(address, size, state)| trace::Block { address, size, requested_size: size, state, frames: trace::no_frames() })
                .collect(),
        }
    }

    fn undo(segments: &[trace::Segment], trace: &[TraceEntry]) -> StartState {
        start_state(&segments.iter().collect::<Vec<_>>(), &trace.iter().cloned().collect(), &AllocatorConfig::default())
    }

    fn states(s: &StartState) -> Vec<(u64, u64, BlockState)> {
        s.segments.iter().flat_map(|s| s.blocks.iter().map(|b| (b.address, b.size, b.state))).collect()
    }

    #[test]
    fn an_address_in_a_segment_that_overlaps_the_last_one_found_is_looked_up_again() {
        // Segment A (0, 4096) overlaps segment B at 0x400: 0x400 is B's (the last segment
        // starting at or below it), even right after A was found for address 0.
        let segments = [segment(0, false, &[(0, 4096, ActiveAllocated)]), segment(0x400, false, &[(0x400, 512, ActiveAllocated)])];
        let trace = [TraceEntry::new(Action::Alloc, 0x400, 512, 0), TraceEntry::new(Action::Alloc, 0, 4096, 0)];
        let start = undo(&segments, &trace);
        assert_eq!(start.warnings, Vec::<String>::new());
        assert_eq!(states(&start), [(0, 4096, Inactive), (0x400, 512, Inactive)]);
        // And the other way round: 0 after 0x400.
        let start = undo(&segments, &[TraceEntry::new(Action::Alloc, 0, 4096, 0), TraceEntry::new(Action::Alloc, 0x400, 512, 0)]);
        assert_eq!(start.warnings, Vec::<String>::new());
    }

    #[test]
    fn a_segment_whose_end_moved_is_measured_again() {
        // Undoing the alloc at 0x800 merges its block into the free one at 0 (0 to 1024: the
        // gap is lost), so the segment ends at 1024 and 0x600 is in no segment any more.
        let segments = [segment(0, false, &[(0, 512, Inactive), (2048, 512, ActiveAllocated)])];
        let start = undo(&segments, &[TraceEntry::new(Action::Alloc, 0x600, 512, 0), TraceEntry::new(Action::Alloc, 0x800, 512, 0)]);
        assert_eq!(start.warnings, ["event 0 (alloc at 0x600): no segment holds it"]);
    }

    #[test]
    fn blocks_of_no_bytes_and_expandable_neighbours_without_a_first_block_do_not_panic() {
        let segments = [segment(0, false, &[(0, 512, ActiveAllocated), (512, 0, ActiveAllocated), (1024, 512, ActiveAllocated)])];
        let start = undo(&segments, &[TraceEntry::new(Action::Alloc, 512, 0, 0)]);
        assert_eq!(start.warnings, Vec::<String>::new());
        assert_eq!(states(&start), [(0, 512, ActiveAllocated), (512, 0, Inactive), (1024, 512, ActiveAllocated)]);
        let segments = [segment(0x20_0000, true, &[(0x20_0200, 0x1f_fe00, Inactive)])];
        let start = undo(&segments, &[TraceEntry::new(Action::SegmentUnmap, 0, 0x20_0000, 0)]);
        assert_eq!(start.segments.len(), 1, "the unmapped range joins its expandable neighbour");
    }
}
