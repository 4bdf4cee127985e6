//! The allocator's state as data: `torch.cuda.memory_snapshot()`'s segments, a state restored
//! from a snapshot's segments, and the invariants the blocks, pools and stats keep.

use super::*;

impl<S: SegmentSource> CachingAllocator<S> {
    /// `torch.cuda.memory_snapshot()` for this device: segments sorted by address, one per
    /// contiguous mapped range. Like PyTorch it records a `snapshot` trace entry.
    pub fn snapshot_segments(&mut self) -> Vec<trace::Segment> {
        let segments = self.segments();
        self.record_snapshot_entry();
        segments
    }

    /// The `snapshot` trace entry that `snapshot_segments` records: its size is the bytes in
    /// active blocks, the segments' `active_size` summed, which the stats keep (a replay marks
    /// with it where the program took a snapshot, without making the segments).
    pub fn record_snapshot_entry(&mut self) {
        let total_active = self.stats.active_bytes.all().current.max(0) as u64;
        self.record(Action::Snapshot, 0, total_active, 0, 0, None);
    }

    /// `torch.cuda.memory._snapshot()` of this one device: segments, its trace, and the settings.
    /// As in PyTorch (`NativeCachingAllocator::snapshot` takes each device's `trace()` before its
    /// `snapshot()`), the trace ends before the `snapshot` entry this call records: a file shows
    /// the entries of earlier snapshots only.
    pub fn snapshot(&mut self) -> trace::Snapshot {
        let trace = self.history.entries();
        let segments = self.snapshot_segments();
        let mut device_traces = vec![trace::Trace::new(); self.device.max(0) as usize];
        device_traces.push(trace);
        trace::Snapshot {
            segments,
            device_traces,
            allocator_settings: Some(self.config.to_snapshot_settings()),
            external_annotations: Some(self.history.annotations()),
            tensormem: None,
        }
    }

    /// `snapshot()` of tensormem's own recording on `device`: its `tensormem` key says which
    /// clock the entries' `time_us` come from.
    pub fn snapshot_on(&mut self, device: &str) -> trace::Snapshot {
        let mut snapshot = self.snapshot();
        snapshot.tensormem = self.history.time_source().name().map(|time| trace::Recording { time: time.into(), device: device.into() });
        snapshot
    }

    /// The current segments, without recording anything.
    pub fn segments(&self) -> Vec<trace::Segment> {
        let mut out = Vec::new();
        for (i, head) in self.blocks.iter().enumerate() {
            if !head.live || !head.mapped || head.prev.is_some_and(|prev| self.b(prev).mapped) {
                continue;
            }
            let mut seg = trace::Segment {
                device: self.device,
                address: head.ptr,
                total_size: 0,
                allocated_size: 0,
                active_size: 0,
                requested_size: 0,
                stream: head.stream as i64,
                segment_type: if head.small { trace::PoolKind::Small } else { trace::PoolKind::Large },
                segment_pool_id: self.pools[head.pool as usize].id,
                is_expandable: head.is_expandable(),
                frames: head.segment_context.clone().unwrap_or_else(trace::no_frames),
                blocks: Vec::new(),
            };
            let mut at = Some(BlockId::at(i));
            while let Some(id) = at.filter(|&id| self.b(id).mapped) {
                let b = self.b(id);
                let active = b.allocated || b.event_count > 0 || b.stream_uses.is_some();
                seg.total_size += b.size;
                if b.allocated {
                    seg.allocated_size += b.size;
                }
                if active {
                    seg.active_size += b.size;
                    seg.requested_size += b.requested_size;
                }
                seg.blocks.push(trace::Block {
                    address: b.ptr,
                    size: b.size,
                    requested_size: b.requested_size,
                    state: if b.allocated {
                        trace::BlockState::ActiveAllocated
                    } else if active {
                        trace::BlockState::ActivePendingFree
                    } else {
                        trace::BlockState::Inactive
                    },
                    frames: b.context.clone().unwrap_or_else(trace::no_frames),
                });
                at = b.next;
            }
            out.push(seg);
        }
        out.sort_by_key(|s| s.address);
        out
    }

    /// The largest cached free block (`cacheInfo`), 0 if none.
    pub fn largest_free_block(&self) -> u64 {
        self.pools.iter().flat_map(|p| &p.free).map(BlockPool::largest).max().unwrap_or(0)
    }

    /// Bytes reserved from the device (all pools).
    pub fn reserved(&self) -> u64 {
        self.total_allocated_memory
    }

    /// Puts a recorded state in place (replay starts from it): each segment with its blocks, as
    /// a snapshot shows them. Expandable ranges of one (stream, pool) become one expandable segment
    /// starting at the lowest range, with unmapped space between ranges. Stats then count this
    /// state as current, with peaks equal to it and nothing accumulated. Only for a fresh allocator.
    pub fn restore(&mut self, segments: &[trace::Segment]) -> Result<(), AllocError> {
        if !self.blocks.is_empty() {
            return Err(AllocError::Unsupported("restore needs a fresh allocator".into()));
        }
        if !self.source.supports_expandable() && segments.iter().any(|s| s.is_expandable) {
            return Err(AllocError::Unsupported("this device cannot map expandable segments".into()));
        }
        // Each private pool a segment names, made with one user: a state taken from a running
        // program does not say how many graphs or scopes use a pool, only that it exists.
        for seg in segments {
            if seg.segment_pool_id != DEFAULT_POOL && self.pool_slot(seg.segment_pool_id).is_none() {
                self.create_or_incref_pool(seg.segment_pool_id)?;
            }
        }
        let mut expandable: BTreeMap<(u32, Stream, bool), Vec<&trace::Segment>> = BTreeMap::new();
        let starts: std::collections::BTreeSet<u64> = segments.iter().map(|s| s.address).collect();
        for seg in segments {
            let small = seg.segment_type == trace::PoolKind::Small;
            let owner = self.pool_slot(seg.segment_pool_id).expect("made above");
            if seg.is_expandable {
                expandable.entry((owner, seg.stream as Stream, small)).or_default().push(seg);
                continue;
            }
            if !self.source.adopt(seg.address, seg.total_size) {
                return Err(AllocError::Unsupported(format!(
                    "segment at {:#x} overlaps another, or this device cannot take over existing memory",
                    seg.address
                )));
            }
            let pool = StatType::for_pool(small);
            self.stats.segment.increase(pool, 1);
            if seg.total_size >= self.config.max_split_size {
                self.stats.oversize_segments.increase(1);
            }
            self.pools[owner as usize].segments += 1;
            let chain = seg.blocks.iter().map(Some).collect();
            self.restore_chain(chain, seg, None, seg.blocks.len() > 1);
        }
        for ((pool, _, small), mut ranges) in expandable {
            self.pools[pool as usize].segments += 1;
            ranges.sort_by_key(|s| s.address);
            let page_size = if small { SMALL_BUFFER } else { LARGE_BUFFER };
            let base = ranges[0].address;
            let last = ranges[ranges.len() - 1];
            let used = last.address + last.total_size - base;
            let total = self.capacity.unwrap_or(DEFAULT_EXPANDABLE_SPAN).min(MAX_EXPANDABLE_SPAN);
            // The reservation may not run into the next range in use above it.
            let room = starts.range(base + used..).next().map_or(u64::MAX, |&next| next - base);
            let max_pages = ((total + total / 8) / page_size).min(room / page_size).max(used.div_ceil(page_size));
            let mut es = ExpandableSegment { base, page_size, max_pages, mapped: Vec::new(), live: true };
            let unmapped =
                |addr: u64, size: u64| trace::Block { address: addr, size, requested_size: 0, state: trace::BlockState::Inactive, frames: trace::no_frames() };
            let mut gaps = Vec::new();
            let mut chain: Vec<Option<&trace::Block>> = Vec::new();
            let mut at = base;
            for seg in &ranges {
                if (seg.address - base) % page_size != 0 || seg.total_size % page_size != 0 {
                    return Err(AllocError::Unsupported(format!(
                        "expandable range {:#x} (+{}) is not aligned to {page_size}-byte pages",
                        seg.address, seg.total_size
                    )));
                }
                if seg.address > at {
                    gaps.push(unmapped(at, seg.address - at));
                    chain.push(None);
                }
                if !self.source.adopt(seg.address, seg.total_size) {
                    return Err(AllocError::Unsupported(format!("expandable range at {:#x} overlaps other memory", seg.address)));
                }
                let first = (seg.address - base) / page_size;
                let pages = seg.total_size / page_size;
                es.mapped.resize((first + pages) as usize, false);
                es.mapped[first as usize..].fill(true);
                chain.extend(seg.blocks.iter().map(Some));
                at = seg.address + seg.total_size;
            }
            gaps.push(unmapped(at, base + max_pages * page_size - at));
            chain.push(None);
            self.expandable.push(es);
            let index = ExpandableId::at(self.expandable.len() - 1);
            let mut gaps = gaps.iter();
            let chain = chain.into_iter().map(|b| b.or_else(|| gaps.next())).collect();
            self.restore_chain(chain, ranges[0], Some(index), true);
        }
        self.stats.reset_accumulated();
        self.stats.reset_peak();
        Ok(())
    }

    /// Links one segment's blocks in address order. In an expandable chain, blocks on unmapped
    /// pages are the address space between (and after) the mapped ranges.
    fn restore_chain(&mut self, chain: Vec<Option<&trace::Block>>, seg: &trace::Segment, expandable: Option<ExpandableId>, split: bool) {
        let small = seg.segment_type == trace::PoolKind::Small;
        let stream = seg.stream as Stream;
        let pool = StatType::for_pool(small);
        let owner = self.pool_slot(seg.segment_pool_id).expect("restore made every segment's pool");
        let mut prev: Option<BlockId> = None;
        for blk in chain.into_iter().flatten() {
            let mut block = Block::new(stream, blk.size, small, blk.address, seg.address, owner);
            block.expandable = expandable;
            block.prev = prev;
            block.requested_size = blk.requested_size;
            block.context = Some(blk.frames.clone()).filter(|f| !f.is_empty());
            if let Some(expandable) = expandable {
                let es = &self.expandable[expandable.index()];
                block.mapped = es.mapped.get(es.page_left(blk.address) as usize).copied().unwrap_or(false);
            }
            if prev.is_none() {
                block.segment_context = Some(seg.frames.clone()).filter(|f| !f.is_empty());
            }
            let mapped = block.mapped;
            let id = self.new_block(block);
            if let Some(prev) = prev {
                self.bm(prev).next = Some(id);
            }
            prev = Some(id);
            if !mapped {
                self.unmapped_insert(id);
                continue;
            }
            self.total_allocated_memory += blk.size;
            self.stats.reserved_bytes.increase(pool, blk.size);
            match blk.state {
                trace::BlockState::Inactive => {
                    self.pool_insert(id);
                    if split && expandable.is_none() {
                        self.stats.inactive_split.increase(pool, 1);
                        self.stats.inactive_split_bytes.increase(pool, blk.size);
                    }
                }
                state => {
                    let s = &mut self.stats;
                    s.active.increase(pool, 1);
                    s.active_bytes.increase(pool, blk.size);
                    s.requested_bytes.increase(pool, blk.requested_size);
                    if state == trace::BlockState::ActiveAllocated {
                        self.blocks[id.index()].allocated = true;
                        if let Some(index) = &mut self.pointer_index {
                            index.insert(blk.address, id);
                        }
                        s.allocation.increase(pool, 1);
                        s.allocated_bytes.increase(pool, blk.size);
                        if blk.size >= self.config.max_split_size {
                            s.oversize_allocations.increase(1);
                        }
                    } else {
                        // Pending free: one outstanding event on an unknown stream.
                        self.blocks[id.index()].event_count = 1;
                        self.events.entry(Stream::MAX).or_default().0.push_back(id);
                    }
                }
            }
        }
    }

    /// Re-derives every current stat from the blocks and checks the pools, links and stats
    /// agree (the invariants of PyTorch's `_check_memory_stat_consistency`). For tests.
    pub fn check_invariants(&self) -> Result<(), String> {
        let mut expected = DeviceStats::default();
        let mut reserved_total = 0;
        for (i, b) in self.blocks.iter().enumerate() {
            let id = BlockId::at(i);
            if !b.live {
                continue;
            }
            if let Some(prev) = b.prev.map(|prev| self.b(prev))
                && (prev.next != Some(id) || prev.ptr + prev.size != b.ptr)
            {
                return Err(format!("block {:#x}: broken prev link", b.ptr));
            }
            if let Some(next) = b.next.map(|next| self.b(next))
                && (next.prev != Some(id) || b.ptr + b.size != next.ptr)
            {
                return Err(format!("block {:#x}: broken next link", b.ptr));
            }
            let pool = &self.pools[b.pool as usize].free[pool_index(b.small)];
            // Freed during a capture while other streams used it: waiting, not free.
            let active = b.allocated || b.event_count > 0 || b.stream_uses.is_some();
            let in_blocks = pool.get(b.stream, b.size, b.ptr) == Some(id);
            let in_unmapped = pool.unmapped.get(&(b.stream, b.ptr)) == Some(&id);
            match (b.mapped, active) {
                (true, false) if !in_blocks => return Err(format!("free block {:#x} missing from its pool", b.ptr)),
                (true, true) if in_blocks => return Err(format!("active block {:#x} is in the free pool", b.ptr)),
                (false, _) if !in_unmapped => return Err(format!("unmapped block {:#x} missing from its set", b.ptr)),
                _ => {}
            }
            if self.pointer_index.as_ref().is_some_and(|index| b.allocated != (index.get(&b.ptr) == Some(&id))) {
                return Err(format!("block {:#x}: allocated flag disagrees with the address map", b.ptr));
            }
            if !active && b.mapped {
                for n in [b.prev, b.next].into_iter().flatten().map(|n| self.b(n)) {
                    if !n.allocated && n.event_count == 0 && n.stream_uses.is_none() && n.mapped {
                        return Err(format!("free blocks {:#x} and {:#x} were not coalesced", b.ptr, n.ptr));
                    }
                }
            }
            if !b.mapped {
                continue;
            }
            let t = StatType::for_pool(b.small);
            reserved_total += b.size;
            expected.reserved_bytes.increase(t, b.size);
            if b.prev.is_none() && !b.is_expandable() {
                expected.segment.increase(t, 1);
            }
            if b.allocated {
                expected.allocation.increase(t, 1);
                expected.allocated_bytes.increase(t, b.size);
            }
            if active {
                expected.active.increase(t, 1);
                expected.active_bytes.increase(t, b.size);
                expected.requested_bytes.increase(t, b.requested_size);
            } else if b.is_split() && !b.is_expandable() {
                expected.inactive_split.increase(t, 1);
                expected.inactive_split_bytes.increase(t, b.size);
            }
        }
        let mut segments_per_pool = vec![0u32; self.pools.len()];
        for b in self.blocks.iter().filter(|b| b.live && b.prev.is_none()) {
            segments_per_pool[b.pool as usize] += 1;
        }
        for (pool, &count) in self.pools.iter().zip(&segments_per_pool).skip(1) {
            if pool.segments != count {
                return Err(format!("pool {:?} counts {} segment(s) but owns {count}", pool.id, pool.segments));
            }
            if !pool.live && count > 0 {
                return Err(format!("erased pool {:?} still owns {count} segment(s)", pool.id));
            }
        }
        if reserved_total != self.total_allocated_memory {
            return Err(format!("reserved bytes {} != total_allocated_memory {}", reserved_total, self.total_allocated_memory));
        }
        for ((name, want), (_, have)) in expected.arrays().into_iter().zip(self.stats.arrays()) {
            for t in StatType::ALL {
                if want.get(t).current != have.get(t).current {
                    return Err(format!("{name}.{}.current is {} but the blocks say {}", t.key(), have.get(t).current, want.get(t).current));
                }
                if have.get(t).peak < have.get(t).current {
                    return Err(format!("{name}.{}: peak below current", t.key()));
                }
            }
        }
        let s = &self.stats;
        let (alloc, active, reserved) = (s.allocated_bytes.all().current, s.active_bytes.all().current, s.reserved_bytes.all().current);
        if !(alloc <= active && active <= reserved) {
            return Err(format!("allocated {alloc} <= active {active} <= reserved {reserved} does not hold"));
        }
        Ok(())
    }
}
