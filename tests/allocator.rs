//! Every rule of PyTorch's caching allocator, with exact byte values (reference section 1).

use tensormem::alloc::*;
use tensormem::trace::{Action, BlockState};

const KIB: u64 = 1024;
const MIB: u64 = 1024 * 1024;

fn allocator(conf: &str) -> VirtualAllocator {
    let mut a = VirtualAllocator::virtual_with(AllocatorConfig::parse(conf).unwrap());
    a.record_memory_history(true, RecordContext::State, 100_000);
    a
}

fn cur(s: &StatArray) -> i64 {
    s.all().current
}

fn check(a: &VirtualAllocator) {
    a.check_invariants().unwrap();
}

#[test]
fn one_byte_takes_512_bytes_of_a_2mib_segment() {
    let mut a = allocator("");
    let x = a.malloc(1, 0, None).unwrap();
    assert_eq!(x.size, 512);
    assert_eq!(cur(&a.stats().allocated_bytes), 512);
    assert_eq!(cur(&a.stats().requested_bytes), 1);
    assert_eq!(cur(&a.stats().reserved_bytes), 2 * MIB as i64);
    assert_eq!(a.stats().reserved_bytes.get(StatType::SmallPool).current, 2 * MIB as i64);
    assert_eq!(a.stats().segment.get(StatType::SmallPool).current, 1);
    // The remainder of the small segment is a free split block.
    assert_eq!(cur(&a.stats().inactive_split_bytes), (2 * MIB - 512) as i64);
    check(&a);
}

#[test]
fn round_size_rules() {
    let c = AllocatorConfig::default();
    assert_eq!(round_size(0, &c), 512);
    assert_eq!(round_size(512, &c), 512);
    assert_eq!(round_size(513, &c), 1024);
    assert_eq!(round_size(4_000_000, &c), 4_000_256);
    let four = AllocatorConfig::parse("roundup_power2_divisions:4").unwrap();
    // Divisions apply only above 512 * divisions (2048): 1200 still rounds to 512 multiples.
    assert_eq!(round_size(1200, &four), 1536);
    assert_eq!(round_size(5000, &four), 5120);
    assert_eq!(round_size(4096, &four), 4096);
    assert_eq!(roundup_power2_next_division(1200, 4), 1280);
    assert_eq!(round_size(300 * MIB + 1, &four), 320 * MIB);
    let list = AllocatorConfig::parse("roundup_power2_divisions:[256:1,512:2,>:8]").unwrap();
    assert_eq!(round_size(600 * MIB, &list), 768 * MIB);
    assert_eq!(round_size(2000 * MIB + 1, &list), 2048 * MIB);
}

#[test]
fn segment_sizes() {
    assert_eq!(allocation_size(512), 2 * MIB);
    assert_eq!(allocation_size(MIB), 2 * MIB);
    assert_eq!(allocation_size(MIB + 512), 20 * MIB);
    assert_eq!(allocation_size(10 * MIB - 512), 20 * MIB);
    assert_eq!(allocation_size(10 * MIB), 10 * MIB);
    assert_eq!(allocation_size(11 * MIB + 512), 12 * MIB);
    let mut a = allocator("");
    let x = a.malloc(5_000_000, 0, None).unwrap();
    assert_eq!(x.size, 5_000_192);
    assert_eq!(cur(&a.stats().reserved_bytes), 20 * MIB as i64);
    assert_eq!(a.stats().segment.get(StatType::LargePool).current, 1);
    let trace = a.history().entries();
    assert_eq!(trace.at(0).action, Action::SegmentAlloc);
    assert_eq!(trace.at(0).size, 20 * MIB);
    assert_eq!((trace.at(1).action, trace.at(1).size), (Action::Alloc, 5_000_000));
    check(&a);
}

#[test]
fn large_pool_splits_only_above_one_mib() {
    let mut a = allocator("");
    // 19 MiB from a 20 MiB segment leaves exactly 1 MiB: not split, the block keeps it.
    let x = a.malloc(19 * MIB, 0, None).unwrap();
    assert_eq!(x.size, 20 * MIB);
    assert_eq!(cur(&a.stats().allocated_bytes), 20 * MIB as i64);
    assert_eq!(cur(&a.stats().requested_bytes), 19 * MIB as i64);
    assert_eq!(cur(&a.stats().inactive_split), 0);
    a.free(x.ptr, None).unwrap();
    // 512 bytes less leaves 1 MiB + 512: split.
    let y = a.malloc(19 * MIB - 512, 0, None).unwrap();
    assert_eq!(y.size, 19 * MIB - 512);
    assert_eq!(y.ptr, x.ptr, "best fit reuses the cached segment");
    assert_eq!(cur(&a.stats().inactive_split_bytes), (MIB + 512) as i64);
    assert_eq!(cur(&a.stats().inactive_split), 1);
    check(&a);
}

#[test]
fn small_pool_splits_at_512_bytes() {
    let mut a = allocator("");
    let x = a.malloc(MIB, 0, None).unwrap();
    let y = a.malloc(MIB - 512, 0, None).unwrap();
    assert_eq!(y.ptr, x.ptr + MIB);
    assert_eq!(y.size, MIB - 512);
    // Exactly 512 bytes remain, split off as a free block.
    assert_eq!(cur(&a.stats().inactive_split_bytes), 512);
    let z = a.malloc(100, 0, None).unwrap();
    assert_eq!((z.ptr, z.size), (y.ptr + y.size, 512));
    assert_eq!(cur(&a.stats().inactive_split), 0);
    assert_eq!(cur(&a.stats().segment), 1);
    check(&a);
}

#[test]
fn best_fit_is_smallest_then_lowest_address_per_stream() {
    let mut a = allocator("");
    let big = a.malloc(40 * MIB, 0, None).unwrap();
    let small = a.malloc(30 * MIB, 0, None).unwrap();
    let other_stream = a.malloc(30 * MIB, 7, None).unwrap();
    a.free(big.ptr, None).unwrap();
    a.free(small.ptr, None).unwrap();
    a.free(other_stream.ptr, None).unwrap();
    // 25 MiB fits both; the 30 MiB block is the best fit (split: 5 MiB remain > 1 MiB).
    let x = a.malloc(25 * MIB, 0, None).unwrap();
    assert_eq!(x.ptr, small.ptr);
    // Stream 7's cached block is never used by stream 0.
    let y = a.malloc(30 * MIB, 0, None).unwrap();
    assert_eq!(y.ptr, big.ptr);
    let z = a.malloc(30 * MIB, 0, None).unwrap();
    assert_ne!(z.ptr, other_stream.ptr);
    assert_eq!(cur(&a.stats().segment), 4);
    check(&a);
}

#[test]
fn oversize_blocks_inside_and_outside_the_tolerance() {
    let mut a = allocator("max_split_size_mb:64");
    assert_eq!(a.stats().max_split_size, 64 * MIB as i64);
    let x = a.malloc(100 * MIB, 0, None).unwrap();
    assert_eq!(a.stats().oversize_allocations.current, 1);
    assert_eq!(a.stats().oversize_segments.current, 1);
    a.free(x.ptr, None).unwrap();
    // 90 MiB may reuse a 100 MiB oversize block (100 < 90 + 20), whole: oversize is never split.
    let y = a.malloc(90 * MIB, 0, None).unwrap();
    assert_eq!((y.ptr, y.size), (x.ptr, 100 * MIB));
    a.free(y.ptr, None).unwrap();
    // 80 MiB may not (100 >= 80 + 20): a new 80 MiB segment.
    let z = a.malloc(80 * MIB, 0, None).unwrap();
    assert_ne!(z.ptr, x.ptr);
    assert_eq!(z.size, 80 * MIB);
    // A splittable request (< max_split_size) never takes an oversize block.
    let w = a.malloc(30 * MIB, 0, None).unwrap();
    assert_ne!(w.ptr, x.ptr);
    assert_eq!(cur(&a.stats().segment), 3);
    assert_eq!(a.stats().oversize_segments.current, 2);
    check(&a);
}

#[test]
fn free_coalesces_neighbours() {
    let mut a = allocator("");
    let x = a.malloc(4 * MIB, 0, None).unwrap();
    let y = a.malloc(4 * MIB, 0, None).unwrap();
    let z = a.malloc(4 * MIB, 0, None).unwrap();
    assert_eq!((y.ptr, z.ptr), (x.ptr + 4 * MIB, x.ptr + 8 * MIB));
    assert_eq!(cur(&a.stats().inactive_split), 1);
    a.free(y.ptr, None).unwrap();
    assert_eq!(cur(&a.stats().inactive_split), 2);
    a.free(x.ptr, None).unwrap();
    assert_eq!(cur(&a.stats().inactive_split), 2, "x merged into y's free block");
    assert_eq!(cur(&a.stats().inactive_split_bytes), (8 + 8) as i64 * MIB as i64);
    a.free(z.ptr, None).unwrap();
    assert_eq!(cur(&a.stats().inactive_split), 0, "the whole segment is one free block again");
    let seg = &a.segments()[0];
    assert_eq!(seg.blocks.len(), 1);
    assert_eq!(seg.blocks[0].size, 20 * MIB);
    check(&a);
}

#[test]
fn empty_cache_frees_only_whole_free_segments() {
    let mut a = allocator("");
    let x = a.malloc(5 * MIB, 0, None).unwrap();
    let _y = a.malloc(5 * MIB, 0, None).unwrap();
    let z = a.malloc(30 * MIB, 0, None).unwrap();
    a.free(x.ptr, None).unwrap();
    a.free(z.ptr, None).unwrap();
    assert_eq!(cur(&a.stats().reserved_bytes), 50 * MIB as i64);
    a.empty_cache();
    assert_eq!(cur(&a.stats().reserved_bytes), 20 * MIB as i64, "the 20 MiB segment still holds y");
    assert_eq!(a.stats().reserved_bytes.all().peak, 50 * MIB as i64);
    assert_eq!(cur(&a.stats().allocated_bytes), 5 * MIB as i64);
    assert_eq!(a.stats().num_device_free, 1);
    assert_eq!(a.stats().num_sync_all_streams, 1);
    let frees: Vec<_> = a.history().entries().to_vec().into_iter().filter(|e| e.action == Action::SegmentFree).collect();
    assert_eq!(frees.len(), 1);
    assert_eq!((frees[0].addr, frees[0].size), (z.ptr, 30 * MIB));
    check(&a);
}

#[test]
fn out_of_memory_frees_the_cache_retries_then_fails_with_pytorchs_facts() {
    let mut a = allocator("").with_capacity(100 * MIB);
    let x = a.malloc(60 * MIB, 0, None).unwrap();
    a.free(x.ptr, None).unwrap();
    // 70 MiB does not fit beside the cached 60 MiB: the cache is released and the retry works.
    let y = a.malloc(70 * MIB, 0, None).unwrap();
    assert_eq!(a.stats().num_alloc_retries, 1);
    assert_eq!(cur(&a.stats().reserved_bytes), 70 * MIB as i64);
    let err = a.malloc(40 * MIB, 0, None).unwrap_err();
    let AllocError::OutOfMemory(oom) = &err else { panic!("{err}") };
    assert_eq!(oom.tried_to_allocate, 40 * MIB);
    assert_eq!(oom.free, 30 * MIB);
    assert_eq!(oom.allocated, 70 * MIB);
    assert_eq!(
        err.to_string(),
        "Out of memory. Tried to allocate 40.00 MiB. GPU 0 has a total capacity of 100.00 MiB of which 30.00 MiB is free. \
         Of the allocated memory 70.00 MiB is allocated by tensormem, and 0 bytes is reserved by tensormem but unallocated. \
         If reserved but unallocated memory is large try setting PYTORCH_CUDA_ALLOC_CONF=expandable_segments:True to avoid \
         fragmentation.  See documentation for Memory Management  \
         (https://docs.pytorch.org/docs/stable/notes/cuda.html#optimizing-memory-usage-with-pytorch-cuda-alloc-conf)"
    );
    assert_eq!(a.stats().num_ooms, 1);
    assert_eq!(a.stats().num_alloc_retries, 2);
    let oom = a.history().entries().to_vec().into_iter().find(|e| e.action == Action::Oom).unwrap();
    assert_eq!((oom.size, oom.device_free()), (40 * MIB, Some(30 * MIB)));
    // A small request still fits: "Tried to allocate" names the segment, 2 MiB.
    a.malloc(100, 0, None).unwrap();
    a.free(y.ptr, None).unwrap();
    check(&a);
}

#[test]
fn fragmentation_oom_reports_reserved_but_unallocated() {
    let mut a = allocator("").with_capacity(60 * MIB);
    // Three 20 MiB segments, each with a 6 MiB tensor kept and 14 MiB free but split.
    let mut temporaries = Vec::new();
    for _ in 0..3 {
        a.malloc(6 * MIB, 0, None).unwrap();
        temporaries.push(a.malloc(14 * MIB, 0, None).unwrap());
    }
    for t in temporaries {
        a.free(t.ptr, None).unwrap();
    }
    let err = a.malloc(15 * MIB, 0, None).unwrap_err();
    let AllocError::OutOfMemory(oom) = err else { panic!() };
    assert_eq!(oom.reserved, 60 * MIB);
    assert_eq!(oom.allocated, 18 * MIB);
    assert_eq!(oom.reserved_but_unallocated(), 42 * MIB);
    check(&a);
}

#[test]
fn exabyte_requests_are_refused() {
    let mut a = allocator("");
    let err = a.malloc(1 << 60, 0, None).unwrap_err();
    assert_eq!(err.to_string(), "Out of memory. Tried to allocate more than 1EB memory.");
}

#[test]
fn memory_fraction_limits_reserved() {
    let mut a = allocator("").with_capacity(100 * MIB);
    a.set_memory_fraction(0.5).unwrap();
    a.malloc(40 * MIB, 0, None).unwrap();
    let err = a.malloc(20 * MIB, 0, None).unwrap_err();
    let AllocError::OutOfMemory(oom) = &err else { panic!() };
    assert_eq!(oom.allowed, Some(50 * MIB));
    assert!(err.to_string().contains("50.00 MiB allowed; "), "{err}");
    assert!(a.set_memory_fraction(1.5).is_err());
}

#[test]
fn garbage_collection_reclaims_old_cached_blocks() {
    let mut a = allocator("garbage_collection_threshold:0.5").with_capacity(100 * MIB);
    a.set_memory_fraction(1.0).unwrap();
    let x = a.malloc(30 * MIB, 0, None).unwrap();
    let y = a.malloc(30 * MIB, 0, None).unwrap();
    a.free(x.ptr, None).unwrap();
    a.free(y.ptr, None).unwrap();
    // Reserved 60 MiB > 0.5 * 100: the next miss frees cached blocks before asking for more.
    a.malloc(40 * MIB, 0, None).unwrap();
    assert_eq!(cur(&a.stats().reserved_bytes), 40 * MIB as i64);
    assert_eq!(a.stats().num_alloc_retries, 0, "GC, not the last-resort flush, made room");
    check(&a);
}

#[test]
fn cross_stream_free_is_pending_until_the_stream_completes() {
    let mut a = allocator("");
    let x = a.malloc(4 * MIB, 0, None).unwrap();
    a.record_stream(x.ptr, 5).unwrap();
    a.free(x.ptr, None).unwrap();
    assert_eq!(cur(&a.stats().allocated_bytes), 0);
    assert_eq!(cur(&a.stats().active_bytes), 4 * MIB as i64);
    let seg = &a.segments()[0];
    assert_eq!(seg.blocks[0].state, BlockState::ActivePendingFree);
    check(&a);
    // Not reusable yet: the next block goes after it.
    let y = a.malloc(4 * MIB, 0, None).unwrap();
    assert_eq!(y.ptr, x.ptr + 4 * MIB);
    a.stream_work_completed(5);
    // Noticed at the next malloc, which can then reuse it.
    let z = a.malloc(4 * MIB, 0, None).unwrap();
    assert_eq!(z.ptr, x.ptr);
    let actions: Vec<Action> = a.history().entries().iter().map(|e| e.action).collect();
    let completed = actions.iter().position(|&a| a == Action::FreeCompleted).unwrap();
    assert_eq!(&actions[completed..], &[Action::FreeCompleted, Action::Alloc]);
    check(&a);
}

#[test]
fn empty_cache_waits_for_pending_frees() {
    let mut a = allocator("");
    let x = a.malloc(30 * MIB, 0, None).unwrap();
    a.record_stream(x.ptr, 9).unwrap();
    a.free(x.ptr, None).unwrap();
    a.empty_cache();
    assert_eq!(cur(&a.stats().reserved_bytes), 0);
    assert_eq!(cur(&a.stats().active), 0);
    check(&a);
}

#[test]
fn invalid_free_is_an_error() {
    let mut a = allocator("");
    assert_eq!(a.free(0x1234, None).unwrap_err(), AllocError::InvalidPointer(0x1234));
    let x = a.malloc(10, 0, None).unwrap();
    a.free(x.ptr, None).unwrap();
    assert!(a.free(x.ptr, None).is_err(), "double free");
}

#[test]
fn a_stale_allocation_handle_frees_nothing() {
    let mut a = allocator("");
    let first = a.malloc(1000, 0, None).unwrap();
    let copy = first;
    a.free_allocation(&first, None).unwrap();
    // The cached block goes to the next request of its size: same block, same address.
    let second = a.malloc(1000, 0, None).unwrap();
    assert_eq!(second.ptr, copy.ptr);
    assert_eq!(a.free_allocation(&copy, None).unwrap_err(), AllocError::InvalidPointer(copy.ptr), "a stale copy must not free the new owner");
    assert_eq!(a.stats().allocation.all().current, 1);
    a.free_allocation(&second, None).unwrap();
    assert_eq!(a.stats().allocation.all().current, 0);
    check(&a);
}

#[test]
fn peak_and_accumulated_resets() {
    let mut a = allocator("");
    let x = a.malloc(30 * MIB, 0, None).unwrap();
    a.free(x.ptr, None).unwrap();
    let s = a.stats().allocated_bytes.all();
    assert_eq!((s.current, s.peak, s.allocated, s.freed), (0, 30 * MIB as i64, 30 * MIB as i64, 30 * MIB as i64));
    a.reset_peak_stats();
    assert_eq!(a.stats().allocated_bytes.all().peak, 0);
    assert_eq!(a.stats().reserved_bytes.all().peak, 30 * MIB as i64, "reserved is still held");
    a.reset_accumulated_stats();
    assert_eq!(a.stats().allocated_bytes.all().allocated, 0);
    assert_eq!(a.stats().num_device_alloc, 0);
}

#[test]
fn expandable_segments_map_pages_into_one_growing_segment() {
    let mut a = allocator("expandable_segments:True").with_capacity(1 << 30);
    let x = a.malloc(5 * MIB, 0, None).unwrap();
    // One 20 MiB page is mapped; the block is split with the small-pool rule (exact size).
    assert_eq!(x.size, 5 * MIB);
    assert_eq!(cur(&a.stats().reserved_bytes), 20 * MIB as i64);
    assert_eq!(cur(&a.stats().segment), 0, "expandable mappings are not counted as segments");
    assert_eq!(a.stats().num_device_alloc, 1);
    let y = a.malloc(30 * MIB, 0, None).unwrap();
    assert_eq!(y.ptr, x.ptr + 5 * MIB, "the segment grows in place");
    assert_eq!(cur(&a.stats().reserved_bytes), 40 * MIB as i64);
    let maps: Vec<(u64, u64)> = a.history().entries().iter().filter(|e| e.action == Action::SegmentMap).map(|e| (e.addr, e.size)).collect();
    assert_eq!(maps, vec![(x.ptr, 20 * MIB), (x.ptr + 20 * MIB, 20 * MIB)]);
    let segs = a.segments();
    assert_eq!(segs.len(), 1);
    assert!(segs[0].is_expandable);
    assert_eq!(segs[0].total_size, 40 * MIB);
    check(&a);
    a.free(y.ptr, None).unwrap();
    a.empty_cache();
    // The page holding x stays; the second page is unmapped.
    assert_eq!(cur(&a.stats().reserved_bytes), 20 * MIB as i64);
    a.free(x.ptr, None).unwrap();
    a.empty_cache();
    assert_eq!(cur(&a.stats().reserved_bytes), 0);
    assert_eq!(a.stats().num_device_free, 2);
    check(&a);
}

#[test]
fn expandable_segments_respect_capacity() {
    let mut a = allocator("expandable_segments:True").with_capacity(100 * MIB);
    let x = a.malloc(70 * MIB, 0, None).unwrap();
    assert_eq!(cur(&a.stats().reserved_bytes), 80 * MIB as i64);
    // 30 MiB would fit (10 MiB free + one more page = 100 MiB); 40 MiB needs two pages.
    let err = a.malloc(40 * MIB, 0, None).unwrap_err();
    assert!(matches!(err, AllocError::OutOfMemory(_)), "{err}");
    assert!(!err.to_string().contains("try setting"), "no expandable hint when it is on: {err}");
    a.free(x.ptr, None).unwrap();
    a.malloc(90 * MIB, 0, None).unwrap();
    check(&a);
}

#[test]
fn history_ring_buffer_keeps_the_newest_entries() {
    let mut a = allocator("");
    a.record_memory_history(true, RecordContext::All, 3);
    for _ in 0..3 {
        let x = a.malloc(100, 0, None).unwrap();
        a.free(x.ptr, None).unwrap();
    }
    let e = a.history().entries();
    assert_eq!(e.len(), 3);
    let actions: Vec<Action> = e.iter().map(|e| e.action).collect();
    assert_eq!(actions, vec![Action::Alloc, Action::FreeRequested, Action::FreeCompleted]);
    a.record_memory_history(false, RecordContext::Never, 3);
    assert!(a.history().entries().is_empty());
}

#[test]
fn snapshot_segments_describe_blocks_and_record_a_snapshot_entry() {
    let mut a = allocator("");
    let x = a.malloc(3 * KIB, 0, None).unwrap();
    let segs = a.snapshot_segments();
    assert_eq!(segs.len(), 1);
    let s = &segs[0];
    assert_eq!((s.total_size, s.allocated_size, s.requested_size), (2 * MIB, 3 * KIB, 3 * KIB));
    assert_eq!(s.blocks[0].address, x.ptr);
    assert_eq!(s.blocks[0].state, BlockState::ActiveAllocated);
    assert_eq!(s.blocks[1].state, BlockState::Inactive);
    let last = a.history().entries().pop().unwrap();
    assert_eq!((last.action, last.size), (Action::Snapshot, 3 * KIB));
}

/// PyTorch's `_snapshot()` takes each device's trace before its segments, and the segments
/// record the `snapshot` entry: a file's trace shows earlier snapshots, never its own.
#[test]
fn a_snapshots_trace_ends_before_its_own_snapshot_entry() {
    let mut a = allocator("");
    a.record_memory_history(true, RecordContext::Alloc, 100);
    let x = a.malloc(3 * KIB, 0, None).unwrap();
    let first = a.snapshot();
    let actions = |s: &tensormem::trace::Snapshot| s.trace_of(0).iter().map(|e| (e.action, e.size)).collect::<Vec<_>>();
    assert_eq!(actions(&first), [(Action::SegmentAlloc, 2 * MIB), (Action::Alloc, 3 * KIB)]);
    a.free_allocation(&x, None).unwrap();
    let second = a.snapshot();
    assert_eq!(
        actions(&second),
        [
            (Action::SegmentAlloc, 2 * MIB),
            (Action::Alloc, 3 * KIB),
            (Action::Snapshot, 3 * KIB),
            (Action::FreeRequested, 3 * KIB),
            (Action::FreeCompleted, 3 * KIB)
        ]
    );
}

#[test]
fn restore_rebuilds_a_recorded_state() {
    let mut a = allocator("");
    let x = a.malloc(5 * MIB, 0, None).unwrap();
    let _y = a.malloc(100, 0, None).unwrap();
    let segs = a.segments();
    let mut b = allocator("");
    b.restore(&segs).unwrap();
    assert_eq!(b.segments(), segs);
    assert_eq!(b.stats().allocated_bytes.all().current, a.stats().allocated_bytes.all().current);
    assert_eq!(b.stats().inactive_split_bytes.all().current, a.stats().inactive_split_bytes.all().current);
    b.check_invariants().unwrap();
    b.free(x.ptr, None).unwrap();
    b.check_invariants().unwrap();
}

#[test]
fn segment_address_hints_never_land_on_memory_in_use() {
    let mut a = allocator("");
    let x = a.malloc(30 * MIB, 0, None).unwrap();
    // Replay hints a recorded address; if our state diverged, it may be taken. It must be refused.
    a.source_mut().hint(x.segment + 10 * MIB, 40 * MIB);
    let y = a.malloc(40 * MIB, 0, None).unwrap();
    assert!(y.ptr >= x.ptr + 30 * MIB, "{:#x} overlaps {:#x}", y.ptr, x.ptr);
    a.free(x.ptr, None).unwrap();
    a.empty_cache();
    a.source_mut().hint(x.segment, 20 * MIB);
    let z = a.malloc(20 * MIB, 0, None).unwrap();
    assert_eq!(z.ptr, x.ptr, "a freed range can be taken again");
    check(&a);
}

/// An expandable segment reserves address space for 9/8 of the device: a capacity near 2^64
/// (a what-if of an absurd card) reserves the largest span instead of overflowing.
#[test]
fn expandable_segments_on_a_card_of_any_capacity() {
    for capacity in [u64::MAX, u64::MAX / 2, 1 << 60] {
        let mut a = allocator("expandable_segments:True");
        a.set_capacity(Some(capacity));
        let x = a.malloc(30 * MIB, 0, None).unwrap();
        let y = a.malloc(100, 0, None).unwrap();
        // Large pool: two 20 MiB pages mapped; small pool: one 2 MiB page.
        assert_eq!(cur(&a.stats().reserved_bytes), (2 * 20 + 2) as i64 * MIB as i64, "capacity {capacity}");
        a.free(x.ptr, None).unwrap();
        a.free(y.ptr, None).unwrap();
        check(&a);
    }
}
