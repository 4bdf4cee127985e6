//! One replay: the allocator under the settings asked, fed the trace's events one by one and
//! compared with what the recording says it did (`Run`).

use super::{Divergence, Figures, RecordedOom, ReplayOptions, Replayed, StartMode, StartState, ratio};
use crate::alloc::{AllocError, AllocatorConfig, DEFAULT_POOL, PoolFilter, PoolId, RecordContext, VirtualAllocator, VirtualSegments};
use crate::report;
use crate::trace::{self, Action, BlockState, Trace};
use rustc_hash::FxHashMap;

/// The segment calls an allocator made, as `Figures` counts them, and its device allocations
/// in order (for `segment_alloc_match`).
#[derive(Default)]
pub(super) struct SegmentCalls {
    allocs: usize,
    frees: usize,
    maps: usize,
    unmaps: usize,
    pub(super) device_allocs: Vec<(Action, u64)>,
    /// History entries already counted.
    tallied: usize,
}

pub(super) struct Run<'a> {
    pub(super) alloc: VirtualAllocator,
    trace: &'a Trace,
    /// Recorded address -> our address, for live allocations made during the replay.
    ptrs: FxHashMap<u64, u64>,
    /// Recorded allocations our allocator could not make (smaller capacity): their frees are skipped.
    failed: rustc_hash::FxHashSet<u64>,
    /// Of those, the ones freed on another stream whose completion is still to come.
    failed_pending: rustc_hash::FxHashSet<u64>,
    /// Where to stop (`until`): no event at or after it is replayed, not even half a pair.
    stop: usize,
    /// The stop fell inside a burst of segment releases: the replay ends before the burst.
    halted: bool,
    /// Index of the first recorded segment event still waiting for the alloc that made it.
    pub(super) pending_since: Option<usize>,
    /// Recorded segment events since the last alloc, to compare with what our malloc did.
    pending_segment_events: Vec<(Action, u64, u64)>,
    recorded_device_allocs: Vec<(Action, u64)>,
    /// Our side: the segment calls our allocator made, tallied from its history after each step
    /// (`tally_history`), which is then cleared unless the replayed snapshot is kept: a long
    /// trace's history would be a second copy of the trace.
    pub(super) ours: SegmentCalls,
    pub(super) divergence: Option<Divergence>,
    pub(super) allocs: usize,
    pub(super) address_hits: usize,
    ooms: usize,
    /// A replayed snapshot is asked for: the recorded stacks go to the allocator, and its
    /// history is kept.
    keep_snapshot: bool,
    compare_addresses: bool,
    /// Segments are placed by our address model; segment calls are compared by size.
    own_addresses: bool,
    pub(super) first_oom_event: Option<usize>,
    pub(super) first_oom_message: Option<String>,
    pub(super) recorded_oom: Option<RecordedOom>,
    /// Where the entries name no pool: the final segments' private pools, each from the entry
    /// that mapped it.
    pub(super) inferred_pools: super::pools::PrivateRanges,
}

impl<'a> Run<'a> {
    /// The run's allocator, under `config`, holding the trace's start state as `options.start`
    /// asks: the recorded segments and blocks, or the live allocations placed afresh. Also
    /// returns, when the start state alone does not fit the capacity, what ran out.
    /// `highest`: the end of the highest range (address plus size) an entry of the trace names.
    #[allow(clippy::too_many_arguments)]
    pub(super) fn set_up(
        trace: &'a Trace,
        highest: u64,
        final_segments: &[&trace::Segment],
        start: &StartState,
        config: &AllocatorConfig,
        device: i64,
        options: &ReplayOptions,
        warnings: &mut Vec<String>,
    ) -> (Run<'a>, Option<String>) {
        // Fresh virtual addresses start above everything the file mentions, so they never collide.
        let highest = final_segments.iter().map(|s| s.address.saturating_add(s.total_size)).fold(highest, u64::max);
        let allocator = |base: u64| {
            let mut alloc = VirtualAllocator::new(config.clone(), VirtualSegments::starting_at(base)).with_device(device);
            alloc.set_capacity(options.capacity);
            alloc
        };
        let mut run = Run::new(trace, allocator(highest.max(crate::alloc::VIRTUAL_BASE).saturating_add(1 << 30)), options);
        let context = if options.keep_snapshot { RecordContext::All } else { RecordContext::Never };
        // Without a snapshot to keep, the history is only counted for device calls: the other
        // entries need not be made.
        run.alloc.history_mut().record_segment_calls_only(!options.keep_snapshot);
        let out_of_memory_at_start = match options.start {
            StartMode::Recorded | StartMode::Empty => {
                let oom = run.restore_start(&start.segments, options.capacity, warnings, || allocator(highest.saturating_add(1 << 30)));
                run.alloc.record_memory_history(true, context, usize::MAX);
                oom
            }
            StartMode::Replaced => {
                // The placed blocks keep their stacks, but the trace starts after them: the replayed
                // trace then has the file's events (plus its own segment calls), so the two line up.
                run.alloc.record_memory_history(true, context, usize::MAX);
                let oom = run.replace_start(&start.segments);
                run.alloc.history_mut().clear();
                oom
            }
        };
        if out_of_memory_at_start.is_some() {
            run.ooms += 1;
        }
        (run, out_of_memory_at_start)
    }

    /// A run of `trace` on `alloc`, nothing replayed yet.
    fn new(trace: &'a Trace, alloc: VirtualAllocator, options: &ReplayOptions) -> Run<'a> {
        Run {
            alloc,
            trace,
            ptrs: FxHashMap::default(),
            failed: Default::default(),
            failed_pending: Default::default(),
            stop: options.until.map_or(trace.len(), |u| u.min(trace.len())),
            halted: false,
            pending_since: None,
            pending_segment_events: Vec::new(),
            recorded_device_allocs: Vec::new(),
            ours: SegmentCalls::default(),
            divergence: None,
            allocs: 0,
            address_hits: 0,
            ooms: 0,
            keep_snapshot: options.keep_snapshot,
            // From a replaced start every address differs by construction.
            compare_addresses: options.start == StartMode::Recorded && !options.own_addresses,
            own_addresses: options.own_addresses,
            first_oom_event: None,
            first_oom_message: None,
            recorded_oom: None,
            inferred_pools: Default::default(),
        }
    }

    /// The private pool that `e`, the entry at `i`, was allocated in: as it names it, else as
    /// inferred.
    fn private_pool_of(&self, i: usize, e: &trace::Entry) -> Option<PoolId> {
        e.pool_id().or_else(|| self.inferred_pools.pool_of(i, e.addr)).filter(|&p| p != DEFAULT_POOL)
    }

    /// Restores the recorded segments and blocks; where the allocator refuses them, the run
    /// starts empty on `fresh()` instead, with a warning. Returns the out-of-memory message when
    /// the state alone reserves more than `capacity`.
    fn restore_start(
        &mut self,
        segments: &[trace::Segment],
        capacity: Option<u64>,
        warnings: &mut Vec<String>,
        fresh: impl FnOnce() -> VirtualAllocator,
    ) -> Option<String> {
        if let Err(e) = self.alloc.restore(segments) {
            warnings.push(format!("the start state could not be restored ({e}); replay starts empty"));
            self.alloc = fresh();
        }
        let reserved = self.alloc.reserved();
        capacity.filter(|&c| c < reserved).map(|capacity| {
            format!(
                "the recorded start state alone reserves {}, more than the capacity of {}; try the replaced start",
                crate::alloc::format_size(reserved),
                crate::alloc::format_size(capacity)
            )
        })
    }

    /// Feeds the trace through the allocator up to `stop`. Returns the index of the first event
    /// not replayed and, if `curves`, reserved bytes at each position.
    pub(super) fn play(&mut self, curves: bool, progress: &mut dyn FnMut(usize, usize)) -> (usize, Vec<f64>) {
        let mut reserved_curve = Vec::new();
        let mut sample = |alloc: &VirtualAllocator, upto: usize| {
            if curves {
                reserved_curve.resize(upto, alloc.reserved() as f64);
            }
        };
        sample(&self.alloc, 1);
        let end = self.stop;
        let mut i = 0;
        while i < end && !self.halted {
            if i % 4096 == 0 {
                progress(i, end);
            }
            i = self.step(i);
            self.tally_history();
            sample(&self.alloc, i + 1);
        }
        progress(end, end);
        (i, reserved_curve)
    }

    /// Counts the segment calls recorded since the last tally; the history is then cleared
    /// unless the replayed snapshot is kept.
    fn tally_history(&mut self) {
        let ours = &mut self.ours;
        for e in self.alloc.history().since(ours.tallied) {
            match e.action {
                Action::SegmentAlloc => ours.allocs += 1,
                Action::SegmentFree => ours.frees += 1,
                Action::SegmentMap => ours.maps += 1,
                Action::SegmentUnmap => ours.unmaps += 1,
                _ => continue,
            }
            if matches!(e.action, Action::SegmentAlloc | Action::SegmentMap) {
                ours.device_allocs.push((e.action, e.size));
            }
        }
        if self.keep_snapshot {
            ours.tallied = self.alloc.history().len();
        } else {
            self.alloc.history_mut().clear();
            ours.tallied = 0;
        }
    }

    /// Our side of the comparison: the segment calls tallied from the allocator's history, and
    /// peaks from its statistics.
    pub(super) fn replayed(&self) -> Replayed {
        let stats = self.alloc.stats();
        Replayed {
            figures: Figures {
                segment_allocs: self.ours.allocs,
                segment_frees: self.ours.frees,
                segment_maps: self.ours.maps,
                segment_unmaps: self.ours.unmaps,
                peak_reserved_bytes: stats.reserved_bytes.all().peak as u64,
                peak_allocated_bytes: stats.allocated_bytes.all().peak as u64,
            },
            ooms: self.ooms,
            memory_stats: report::memory_stats(stats),
        }
    }

    /// The fraction of recorded device allocations our allocator made in the same order with
    /// the same sizes (up to the first that differs).
    pub(super) fn segment_alloc_match(&self) -> f64 {
        let matched = self.recorded_device_allocs.iter().zip(&self.ours.device_allocs).take_while(|(r, o)| *r == *o).count();
        ratio(matched, self.recorded_device_allocs.len())
    }

    /// Places the allocations live at the start (`segments` as reconstructed) with this run's
    /// allocator, in address order; blocks waiting on another stream stay pending. Returns the
    /// out-of-memory message if they do not all fit.
    fn replace_start(&mut self, segments: &[trace::Segment]) -> Option<String> {
        let mut blocks: Vec<(&trace::Block, i64)> =
            segments.iter().flat_map(|s| s.blocks.iter().filter(|b| b.state.is_active()).map(move |b| (b, s.stream))).collect();
        blocks.sort_by_key(|(b, _)| b.address);
        let mut oom = None;
        for (b, stream) in blocks {
            let frames = self.keep_snapshot.then(|| b.frames.clone());
            match self.alloc.malloc(b.requested_size, stream as u64, frames) {
                Ok(a) => {
                    if a.ptr != b.address {
                        self.ptrs.insert(b.address, a.ptr);
                    }
                    if b.state == BlockState::ActivePendingFree {
                        let _ = self.alloc.record_stream(a.ptr, u64::MAX - 1);
                        let _ = self.alloc.free(a.ptr, None);
                    }
                }
                Err(e) => {
                    if b.state == BlockState::ActivePendingFree {
                        self.failed_pending.insert(b.address);
                    } else {
                        self.failed.insert(b.address);
                    }
                    if oom.is_none() {
                        oom = Some(format!("the allocations live at the start of the trace do not fit: {e}"));
                    }
                }
            }
        }
        oom
    }

    /// Keeps the first divergence; `reason` is only worded for that one (a trace whose
    /// addresses never match would word one per alloc).
    fn diverge(&mut self, event: usize, reason: impl FnOnce() -> String) {
        if self.divergence.is_none() {
            self.divergence = Some(Divergence { event, reason: reason() });
        }
    }

    fn our_ptr(&self, recorded: u64) -> u64 {
        self.ptrs.get(&recorded).copied().unwrap_or(recorded)
    }

    /// Handles the event at `i`; returns the index of the next one.
    fn step(&mut self, i: usize) -> usize {
        match self.trace.at(i).action {
            Action::SegmentAlloc | Action::SegmentMap => self.segment_made(i),
            Action::SegmentFree | Action::SegmentUnmap => self.cache_release(i),
            Action::Alloc => self.malloc(i),
            Action::FreeRequested => self.free_requested(i),
            Action::FreeCompleted => self.free_completed(i),
            Action::Oom => self.failed_request(i),
            Action::Snapshot => {
                // The program took a snapshot here: the replayed trace marks it too, with the
                // replayed active bytes.
                self.alloc.record_snapshot_entry();
                i + 1
            }
            Action::Annotate => {
                if self.alloc.history().records(Action::Annotate) {
                    // Without its time, as every replayed entry: the replay has no clock.
                    let annotation = trace::TraceEntry { time_us: None, ..self.trace.at(i).owned() };
                    self.alloc.history_mut().push(annotation);
                }
                i + 1
            }
        }
    }

    /// A recorded `oom`: PyTorch asked for `size` bytes here and could not have them, with its
    /// cache already freed (the trace's segment frees just before). On a card of a given
    /// capacity the replay asks for the same bytes: running out too reproduces the failure;
    /// fitting is where the replay parts from the recording, and the block is freed at once,
    /// as the program never held it. An unlimited card (no capacity) is not asked: everything
    /// fits there.
    fn failed_request(&mut self, i: usize) -> usize {
        let e = self.trace.at(i);
        let device_free = e.device_free();
        let reserved = self.alloc.reserved();
        self.recorded_oom.get_or_insert(RecordedOom {
            event: i,
            request_bytes: e.size,
            device_free_bytes: device_free,
            reserved_bytes: reserved,
            capacity_estimate_bytes: device_free.map(|free| reserved.saturating_add(free)),
        });
        if self.alloc.capacity().is_none() {
            return i + 1;
        }
        // A request into a private pool (during a capture) failed there, without the last resort.
        let routed = e.pool_id().filter(|&p| p != DEFAULT_POOL);
        if let Some(pool) = routed
            && let Err(err) = self.route_to_pool(pool, e.stream as u64)
        {
            self.diverge(i, || format!("failed request into pool {pool:?}: {err}"));
        }
        let e = self.trace.at(i);
        let result = self.alloc.malloc(e.size, e.stream as u64, None);
        if let Some(pool) = routed {
            let _ = self.alloc.end_allocate_to_pool(pool);
            let _ = self.alloc.release_pool(pool);
        }
        let e = self.trace.at(i);
        match result {
            Ok(a) => {
                let _ = self.alloc.free(a.ptr, None);
                self.diverge(i, || format!("PyTorch ran out of memory asking for {} bytes here; at this capacity the replay fits them", e.size));
            }
            Err(AllocError::OutOfMemory(oom)) => {
                self.ooms += 1;
                self.first_oom_event.get_or_insert(i);
                self.first_oom_message.get_or_insert_with(|| oom.to_string());
            }
            Err(err) => self.diverge(i, || format!("the request PyTorch failed to get failed otherwise here: {err}")),
        }
        i + 1
    }

    /// A recorded segment_alloc / segment_map: PyTorch records it before the alloc that caused
    /// it, so it waits for that alloc, and our source is told the recorded address to hand out.
    fn segment_made(&mut self, i: usize) -> usize {
        let e = self.trace.at(i);
        self.pending_since.get_or_insert(i);
        self.recorded_device_allocs.push((e.action, e.size));
        self.pending_segment_events.push((e.action, e.addr, e.size));
        let source = self.alloc.source_mut();
        match (self.own_addresses, e.action) {
            (true, _) => {}
            (false, Action::SegmentAlloc) => source.hint(e.addr, e.size),
            (false, _) => source.hint_reservation(e.addr),
        }
        i + 1
    }

    /// A burst of segment_free / segment_unmap starting at `i`: one cache flush.
    fn cache_release(&mut self, i: usize) -> usize {
        let end = self.trace.range(i..).position(|e| !matches!(e.action, Action::SegmentFree | Action::SegmentUnmap)).map_or(self.trace.len(), |n| i + n);
        if end > self.stop {
            // Half a cache flush cannot be replayed: the state is the one before it.
            self.halted = true;
            return i;
        }
        let before = self.alloc.history().len();
        // A private pool whose segments the flush returns had no user left (its graphs deleted,
        // its MemPool dropped): the trace does not say when, only that it was so by now.
        let mut released: Vec<PoolId> = self.trace.range(i..end).filter_map(|e| e.pool_id()).filter(|&p| p != DEFAULT_POOL).collect();
        released.sort_unstable();
        released.dedup();
        for &pool in &released {
            while self.alloc.pool_use_count(pool).is_some_and(|users| users > 0) {
                let _ = self.alloc.release_pool(pool);
            }
        }
        // Only private pools' segments: `emptyCache(id)` (a MemPool dropped), which leaves the
        // default pool's cache alone; otherwise `empty_cache()`.
        let only_pools = !released.is_empty() && self.trace.range(i..end).all(|e| e.pool_id().is_some_and(|p| p != DEFAULT_POOL));
        if only_pools {
            for &pool in &released {
                self.alloc.empty_cache_of_pool(pool);
            }
        } else {
            self.alloc.empty_cache();
        }
        let mut ours = self.segment_events_since(before);
        let mut recorded: Vec<(Action, u64, u64)> = self.trace.range(i..end).map(|e| (e.action, e.addr, e.size)).collect();
        ours.sort();
        recorded.sort();
        if !self.same_segment_calls(&ours, &recorded) {
            self.diverge(i, || format!("cache release: recorded {} segment release(s), replay made {}", recorded.len(), ours.len()));
        }
        end
    }

    /// A recorded alloc: ours should get the recorded address and make the segment calls
    /// recorded since the last alloc.
    fn malloc(&mut self, i: usize) -> usize {
        let e = self.trace.at(i);
        self.allocs += 1;
        let before = self.alloc.history().len();
        let frames = if self.keep_snapshot { e.frames.clone() } else { None };
        // The replayed entry says what the memory is for, as the recorded one did.
        self.alloc.history_mut().set_category(e.category);
        // An entry that names a private pool was allocated while that pool took its stream's
        // requests (a graph's capture, a use_mem_pool scope): so is its replay.
        let routed = self.private_pool_of(i, &e);
        if let Some(pool) = routed
            && let Err(err) = self.route_to_pool(pool, e.stream as u64)
        {
            self.diverge(i, || format!("alloc into pool {pool:?}: {err}"));
        }
        let result = self.alloc.malloc(e.size, e.stream as u64, frames);
        if let Some(pool) = routed {
            let _ = self.alloc.end_allocate_to_pool(pool);
            let _ = self.alloc.release_pool(pool);
        }
        self.alloc.history_mut().set_category(None);
        match result {
            Ok(a) => {
                if a.ptr == e.addr {
                    self.address_hits += 1;
                } else if self.compare_addresses {
                    self.diverge(i, || format!("alloc of {} bytes: recorded address {:#x}, replay gave {:#x}", e.size, e.addr, a.ptr));
                }
                if a.ptr == e.addr {
                    self.ptrs.remove(&e.addr);
                } else {
                    self.ptrs.insert(e.addr, a.ptr);
                }
                self.failed.remove(&e.addr);
            }
            Err(AllocError::OutOfMemory(oom)) => {
                self.ooms += 1;
                self.first_oom_event.get_or_insert(i);
                self.first_oom_message.get_or_insert_with(|| oom.to_string());
                self.failed.insert(e.addr);
                self.diverge(i, || format!("alloc of {} bytes ran out of memory in the replay", e.size));
            }
            Err(err) => self.diverge(i, || format!("alloc failed: {err}")),
        }
        let ours = self.segment_events_since(before);
        let recorded = std::mem::take(&mut self.pending_segment_events);
        self.pending_since = None;
        if !self.same_segment_calls(&ours, &recorded) {
            self.diverge(i, || format!("alloc of {} bytes: recorded {}; replay made {}", e.size, describe(&recorded), describe(&ours)));
        }
        self.alloc.source_mut().clear_hints();
        i + 1
    }

    /// Sends the next request on `stream` to `pool`, made (with one user, its owner) if this
    /// replay has not met it yet.
    fn route_to_pool(&mut self, pool: PoolId, stream: u64) -> Result<(), AllocError> {
        if self.alloc.pool_use_count(pool).is_none() {
            self.alloc.create_or_incref_pool(pool)?;
        }
        self.alloc.begin_allocate_to_pool(pool, PoolFilter::Streams(vec![stream]))
    }

    /// A recorded free_requested: immediate when its free_completed follows at once, else the
    /// block stays pending (used on another stream) until the trace says it completed.
    fn free_requested(&mut self, i: usize) -> usize {
        let e = self.trace.at(i);
        let completes_next = self.trace.get(i + 1).is_some_and(|n| n.action == Action::FreeCompleted && n.addr == e.addr);
        if self.failed.remove(&e.addr) {
            // Never allocated in this replay: skip its free and, later, its completion.
            if completes_next {
                return i + 2;
            }
            self.failed_pending.insert(e.addr);
            return i + 1;
        }
        let ptr = self.our_ptr(e.addr);
        // Stopping between the two halves of a free leaves the block pending, as it was.
        let immediate = completes_next && i + 1 < self.stop;
        if !immediate {
            // Used on another stream: stays active until the trace says it completed.
            let _ = self.alloc.record_stream(ptr, u64::MAX - 1);
        }
        // The recorded stack of the free (PyTorch's, or the allocation's when it kept no other).
        let frames = if self.keep_snapshot { e.frames.clone() } else { None };
        if let Err(err) = self.alloc.free(ptr, frames) {
            self.diverge(i, || format!("free: {err}"));
        }
        if immediate {
            self.ptrs.remove(&e.addr);
            return i + 2;
        }
        i + 1
    }

    /// A recorded free_completed of a pending free.
    fn free_completed(&mut self, i: usize) -> usize {
        let e = self.trace.at(i);
        if self.failed_pending.remove(&e.addr) {
            return i + 1;
        }
        let ptr = self.our_ptr(e.addr);
        self.ptrs.remove(&e.addr);
        let frames = if self.keep_snapshot { e.frames.clone() } else { None };
        if let Err(err) = self.alloc.complete_pending_free(ptr, frames) {
            self.diverge(i, || format!("free completion: {err}"));
        }
        i + 1
    }

    /// Whether two lists of segment calls agree: at the same addresses, unless ours are our own.
    fn same_segment_calls(&self, ours: &[(Action, u64, u64)], recorded: &[(Action, u64, u64)]) -> bool {
        if !self.own_addresses {
            return ours == recorded;
        }
        let sizes = |calls: &[(Action, u64, u64)]| {
            let mut v: Vec<(Action, u64)> = calls.iter().map(|&(a, _, size)| (a, size)).collect();
            v.sort();
            v
        };
        sizes(ours) == sizes(recorded)
    }

    /// The segment calls (alloc, free, map, unmap) our allocator recorded since history entry
    /// `before`, as (action, address, size).
    fn segment_events_since(&self, before: usize) -> Vec<(Action, u64, u64)> {
        self.alloc.history().since(before).iter().filter(|e| e.action.is_segment_call()).map(|e| (e.action, e.addr, e.size)).collect()
    }
}

/// "segment_alloc of 76.00 MiB at 0x7f0..., ..." for a divergence message.
fn describe(events: &[(Action, u64, u64)]) -> String {
    if events.is_empty() {
        return "no device memory call".into();
    }
    let mut parts: Vec<String> =
        events.iter().take(3).map(|(a, addr, size)| format!("{} of {} at {addr:#x}", a.name(), crate::alloc::format_size(*size))).collect();
    if events.len() > 3 {
        parts.push(format!("and {} more", events.len() - 3));
    }
    parts.join(", ")
}
