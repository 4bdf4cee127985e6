//! Expandable segments (`expandable_segments:True`): one growing address range per (stream,
//! pool) whose pages are mapped as blocks need them and unmapped when released, as
//! `ExpandableSegment` and the allocator's `map_block` / `unmap_block` do in PyTorch.

use super::*;

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

    /// Maps pages covering `[ptr, ptr + size)`; returns the mapped range (size 0: refused).
    fn es_map(&mut self, es: ExpandableId, ptr: u64, size: u64) -> (u64, u64) {
        let seg = &self.expandable[es.index()];
        let (begin, end) = (seg.page_left(ptr), seg.page_right(ptr + size));
        debug_assert_eq!(seg.base + begin * seg.page_size, ptr);
        let page = seg.page_size;
        let range = |b: u64, e: u64| (seg.base + b * page, (e - b) * page);
        if begin == end {
            return range(begin, end);
        }
        let (start, bytes) = range(begin, end);
        if !self.device_has_room(bytes) || !self.source.map(start, bytes) {
            return (start, 0);
        }
        let seg = &mut self.expandable[es.index()];
        if seg.mapped.len() < end as usize {
            seg.mapped.resize(end as usize, false);
        }
        for i in begin..end {
            debug_assert!(!seg.mapped[i as usize]);
            seg.mapped[i as usize] = true;
        }
        (start, bytes)
    }

    /// Unmaps the whole pages inside `[ptr, ptr + size)`; returns the unmapped range.
    fn es_unmap(&mut self, es: ExpandableId, ptr: u64, size: u64) -> (u64, u64) {
        let seg = &mut self.expandable[es.index()];
        let (begin, end) = (seg.page_right(ptr), seg.page_left(ptr + size));
        if begin >= end {
            return (ptr, 0);
        }
        for i in begin..end {
            seg.mapped[i as usize] = false;
        }
        seg.trim();
        let (start, bytes) = (seg.base + begin * seg.page_size, (end - begin) * seg.page_size);
        self.source.unmap(start, bytes);
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
        let (uptr, usize_) = self.es_unmap(es.expect("only an expandable segment's block is unmapped"), ptr, size);
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
                free.expandable = es;
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
        let (base, size) = (self.expandable[es].base, self.expandable[es].size());
        self.unmapped_remove(id);
        self.pools[b_pool as usize].segments -= 1;
        self.expandable[es].live = false;
        self.source.release_reservation(base, size);
        self.delete_block(id);
    }
}
