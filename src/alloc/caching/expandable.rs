//! Expandable segments (`expandable_segments:True`): one growing address range per (stream,
//! pool) whose pages are mapped as blocks need them and unmapped when released. As in PyTorch,
//! the segment (`ExpandableSegment`) owns its pages and maps them through the device; the
//! allocator (`map_block` / `unmap_block`) decides which blocks need them.

use super::*;

/// One growing address range of an expandable segment, mapped in pages (PyTorch's
/// `ExpandableSegment`: `map`, `unmap`, `size`).
#[derive(Debug, Clone)]
pub(super) struct ExpandableSegment {
    pub(super) base: u64,
    pub(super) page_size: u64,
    pub(super) max_pages: u64,
    /// Which pages are backed; trailing unmapped pages are trimmed like PyTorch's handle list.
    pub(super) mapped: Vec<bool>,
    pub(super) live: bool,
}

impl ExpandableSegment {
    pub(super) fn size(&self) -> u64 {
        self.max_pages * self.page_size
    }

    pub(super) fn page_left(&self, p: u64) -> u64 {
        (p - self.base) / self.page_size
    }

    fn page_right(&self, p: u64) -> u64 {
        (p - self.base).div_ceil(self.page_size)
    }

    /// The pages `[ptr, ptr + size)` needs mapped, as an address range: (start, bytes).
    fn covering(&self, ptr: u64, size: u64) -> (u64, u64) {
        let (begin, end) = (self.page_left(ptr), self.page_right(ptr + size));
        (self.base + begin * self.page_size, (end - begin) * self.page_size)
    }

    /// Maps the pages covering `[ptr, ptr + size)` through the device; false if it refuses.
    fn map(&mut self, source: &mut impl SegmentSource, ptr: u64, size: u64) -> bool {
        let (start, bytes) = self.covering(ptr, size);
        if !source.map(start, bytes) {
            return false;
        }
        let (begin, end) = (self.page_left(start), self.page_left(start + bytes));
        if self.mapped.len() < end as usize {
            self.mapped.resize(end as usize, false);
        }
        for i in begin..end {
            debug_assert!(!self.mapped[i as usize]);
            self.mapped[i as usize] = true;
        }
        true
    }

    /// Unmaps the whole pages inside `[ptr, ptr + size)`; returns the unmapped range.
    fn unmap(&mut self, source: &mut impl SegmentSource, ptr: u64, size: u64) -> (u64, u64) {
        let (begin, end) = (self.page_right(ptr), self.page_left(ptr + size));
        if begin >= end {
            return (ptr, 0);
        }
        for i in begin..end {
            self.mapped[i as usize] = false;
        }
        // Trailing unmapped pages go, as PyTorch's handle list shrinks.
        while self.mapped.last() == Some(&false) {
            self.mapped.pop();
        }
        let (start, bytes) = (self.base + begin * self.page_size, (end - begin) * self.page_size);
        source.unmap(start, bytes);
        (start, bytes)
    }

    /// Gives the whole address range back to the device; the segment is gone.
    fn release(&mut self, source: &mut impl SegmentSource) {
        source.release_reservation(self.base, self.size());
        self.live = false;
    }
}

impl<S: SegmentSource> CachingAllocator<S> {
    /// Lowest address with enough free + unmapped room on this stream, or a new segment.
    fn find_expandable_block(&mut self, pool: u32, stream: Stream, small: bool, size: u64) -> Option<BlockId> {
        let allocatable = |a: &Self, id: BlockId| {
            let b = a.b(id);
            !b.allocated && b.event_count == 0 && b.stream_uses.is_none()
        };
        let has_room = |a: &Self, from: BlockId| {
            let (mut bytes, mut at) = (0, Some(from));
            while let Some(id) = at.filter(|&id| bytes < size && allocatable(a, id)) {
                bytes += a.b(id).size;
                at = a.b(id).next;
            }
            bytes >= size
        };
        let unmapped: Vec<BlockId> =
            self.pools[pool as usize].free[pool_index(small)].unmapped.range((stream, 0)..).take_while(|(k, _)| k.0 == stream).map(|(_, &id)| id).collect();
        for mut c in unmapped {
            if let Some(prev) = self.b(c).prev.filter(|&prev| allocatable(self, prev)) {
                c = prev;
            }
            if has_room(self, c) {
                return Some(c);
            }
        }
        let page_size = if small { SMALL_BUFFER } else { LARGE_BUFFER };
        // Address space for 9/8 of the device, as PyTorch reserves.
        // A capacity beyond any address space (near 2^64 bytes) reserves the largest span
        // a 64-bit address space takes instead of overflowing.
        let total = self.capacity.unwrap_or(DEFAULT_EXPANDABLE_SPAN).min(MAX_EXPANDABLE_SPAN);
        let max_pages = (total + total / 8).div_ceil(page_size);
        let base = self.source.reserve(max_pages * page_size)?;
        self.expandable.push(ExpandableSegment { base, page_size, max_pages, mapped: Vec::new(), live: true });
        self.pools[pool as usize].segments += 1;
        let mut block = Block::new(stream, max_pages * page_size, small, base, base, pool);
        block.mapped = false;
        block.expandable = Some(ExpandableId::at(self.expandable.len() - 1));
        let id = self.new_block(block);
        self.unmapped_insert(id);
        Some(id)
    }

    /// Maps pages covering `[ptr, ptr + size)` if the device has room; returns the mapped range
    /// (size 0: nothing to map, or refused).
    fn es_map(&mut self, es: ExpandableId, ptr: u64, size: u64) -> (u64, u64) {
        let (start, bytes) = self.expandable[es.index()].covering(ptr, size);
        debug_assert_eq!(start, ptr);
        if bytes == 0 || !self.device_has_room(bytes) || !self.expandable[es.index()].map(&mut self.source, ptr, size) {
            return (start, 0);
        }
        (start, bytes)
    }

    fn map_block(&mut self, id: BlockId, size: u64, ctx: &Option<Frames>) -> bool {
        let b = self.b(id);
        debug_assert!(!b.mapped && size <= b.size);
        let (es, ptr, b_size, stream, small, segment, pool) = (b.expandable, b.ptr, b.size, b.stream, b.small, b.segment, b.pool);
        let (mapped_ptr, mapped_size) = self.es_map(es.expect("an unmapped block is an expandable segment's"), ptr, size);
        if mapped_size == 0 {
            return false;
        }
        self.unmapped_remove(id);
        self.bm(id).mapped = true;
        if mapped_size < b_size {
            let mut rest = Block::new(stream, b_size - mapped_size, small, ptr + mapped_size, segment, pool);
            rest.mapped = false;
            rest.expandable = es;
            let rest_id = self.insert_after(id, rest);
            self.unmapped_insert(rest_id);
            self.bm(id).size = mapped_size;
        }
        let (prev, next) = (self.b(id).prev, self.b(id).next);
        self.try_merge_blocks(id, prev);
        self.try_merge_blocks(id, next);
        self.pool_insert(id);
        self.total_allocated_memory += mapped_size;
        self.stats.reserved_bytes.increase(StatType::for_pool(small), mapped_size);
        self.stats.num_device_alloc += 1;
        self.record(Action::SegmentMap, mapped_ptr, mapped_size, stream, pool, ctx.clone());
        let b = self.bm(id);
        if b.prev.is_none() && b.segment_context.is_none() {
            b.segment_context = ctx.clone();
        }
        true
    }

    pub(super) fn try_allocate_expandable_block(&mut self, pool: u32, stream: Stream, small: bool, size: u64, ctx: &Option<Frames>) -> Option<BlockId> {
        let mut candidate = self.find_expandable_block(pool, stream, small, size)?;
        if !self.b(candidate).mapped {
            let want = self.b(candidate).size.min(size);
            if !self.map_block(candidate, want, ctx) {
                return None;
            }
        }
        while self.b(candidate).size < size {
            // candidate is free and followed by unmapped space: map some and merge.
            let remaining = size - self.b(candidate).size;
            let next = self.b(candidate).next.expect("a block short of its size is followed by unmapped space");
            let want = remaining.min(self.b(next).size);
            if !self.map_block(next, want, ctx) {
                return None;
            }
            candidate = next;
        }
        self.pool_remove(candidate);
        Some(candidate)
    }

    pub(super) fn unmap_block(&mut self, id: BlockId, ctx: &Option<Frames>) {
        let b = self.b(id);
        let (es, ptr, size, stream, small, segment, pool) = (b.expandable, b.ptr, b.size, b.stream, b.small, b.segment, b.pool);
        let es = es.expect("only an expandable segment's block is unmapped");
        let (uptr, usize_) = self.expandable[es.index()].unmap(&mut self.source, ptr, size);
        if usize_ == 0 {
            return;
        }
        self.pool_remove(id);
        // Free pages' worth of bytes on either side stay mapped, as free blocks.
        let before = uptr - ptr;
        let after = size - (before + usize_);
        for (at, bytes, is_before) in [(ptr, before, true), (uptr + usize_, after, false)] {
            if bytes > 0 {
                let mut free = Block::new(stream, bytes, small, at, segment, pool);
                free.expandable = Some(es);
                let fid = if is_before { self.insert_before(id, free) } else { self.insert_after(id, free) };
                self.pool_insert(fid);
            }
        }
        let b = self.bm(id);
        b.ptr = uptr;
        b.size = usize_;
        b.mapped = false;
        let frames = ctx.clone().or_else(|| b.segment_context.clone());
        let (prev, next) = (b.prev, b.next);
        self.try_merge_blocks(id, prev);
        self.try_merge_blocks(id, next);
        self.unmapped_insert(id);
        self.total_allocated_memory -= usize_;
        self.stats.reserved_bytes.decrease(StatType::for_pool(small), usize_);
        self.stats.num_device_free += 1;
        self.record(Action::SegmentUnmap, uptr, usize_, stream, pool, frames);
    }

    pub(super) fn release_expandable_segment(&mut self, id: BlockId) {
        let b = self.b(id);
        let (es, b_pool) = (b.expandable.expect("an expandable segment's block").index(), b.pool);
        debug_assert!(!b.mapped && b.size == self.expandable[es].size());
        self.unmapped_remove(id);
        self.pools[b_pool as usize].segments -= 1;
        self.expandable[es].release(&mut self.source);
        self.delete_block(id);
    }
}
