//! Private pools (CUDA graphs, `torch.cuda.MemPool`), rule by rule as PyTorch's
//! `CUDACachingAllocator.cpp` implements them (docs/private-pools.md names each rule's source):
//! exact segments, addresses and bytes.

use tensormem::alloc::*;
use tensormem::trace::BlockState;

const MIB: u64 = 1024 * 1024;
const S: Stream = 0;
const T: Stream = 7;

fn allocator() -> VirtualAllocator {
    let mut a = VirtualAllocator::virtual_with(AllocatorConfig::default());
    a.record_memory_history(true, RecordContext::State, 100_000);
    a
}

/// Segments owned by `pool`.
fn segments_of(a: &VirtualAllocator, pool: PoolId) -> usize {
    a.segments().iter().filter(|s| s.segment_pool_id == pool).count()
}

fn reserved(a: &VirtualAllocator) -> u64 {
    a.stats().reserved_bytes.all().current as u64
}

fn block_state(a: &VirtualAllocator, ptr: u64) -> BlockState {
    a.segments().iter().flat_map(|s| &s.blocks).find(|b| b.address == ptr).map(|b| b.state).expect("a block at that address")
}

/// `torch.cuda.graph(g, pool=id, stream=s)` entered: requests on `s` go to the pool.
fn capture(a: &mut VirtualAllocator, id: PoolId, stream: Stream) {
    a.begin_allocate_to_pool(id, PoolFilter::Streams(vec![stream])).unwrap();
}

/// A capture into `pool` that allocates `bytes` and frees them: the pool keeps them cached.
fn cache_in(a: &mut VirtualAllocator, pool: PoolId, bytes: u64) {
    capture(a, pool, S);
    let x = a.malloc(bytes, S, None).unwrap();
    a.free_allocation(&x, None).unwrap();
    a.end_allocate_to_pool(pool).unwrap();
}

#[test]
fn pool_ids_come_from_two_counters() {
    let mut a = allocator();
    assert_eq!(a.new_pool_id(true), (0, 1), "graph_pool_handle()");
    assert_eq!(a.new_pool_id(true), (0, 2), "MemPool()");
    assert_eq!(a.new_pool_id(false), (1, 0), "a capture given no pool");
    assert_eq!(a.new_pool_id(true), (0, 3));
    assert_eq!(a.new_pool_id(false), (2, 0));
}

#[test]
fn a_handle_makes_no_pool_until_something_allocates_to_it() {
    let mut a = allocator();
    let h = a.new_pool_id(true);
    assert_eq!(a.pool_use_count(h), None);
    capture(&mut a, h, S);
    assert_eq!(a.pool_use_count(h), Some(1));
    assert_eq!(segments_of(&a, h), 0, "no memory until the first request");
    assert!(a.create_or_incref_pool((1, 1)).is_err(), "(1, 1) is no pool id");
}

#[test]
fn each_begin_adds_a_user_and_each_release_takes_one_away() {
    let mut a = allocator();
    let p = a.new_pool_id(true);
    for _ in 0..2 {
        capture(&mut a, p, S);
        a.end_allocate_to_pool(p).unwrap();
    }
    assert_eq!(a.pool_use_count(p), Some(2), "end leaves the users alone");
    a.release_pool(p).unwrap();
    assert_eq!(a.pool_use_count(p), Some(1));
    a.release_pool(p).unwrap();
    assert_eq!(a.pool_use_count(p), Some(0), "freeable, but still there until empty_cache");
    assert!(a.release_pool(p).is_err(), "no user left to release");
    a.empty_cache();
    assert_eq!(a.pool_use_count(p), None, "a freeable pool with no segment is erased");
    assert!(a.release_pool(p).is_err());
}

#[test]
fn begin_twice_end_unknown_and_reviving_a_released_pool_are_errors() {
    let mut a = allocator();
    let p = a.new_pool_id(true);
    capture(&mut a, p, S);
    let err = a.begin_allocate_to_pool(p, PoolFilter::Streams(vec![S])).unwrap_err();
    assert!(err.to_string().contains("already recording"), "{err}");
    assert_eq!(a.pool_use_count(p), Some(2), "PyTorch counts the user before it checks");
    let q = a.new_pool_id(true);
    let err = a.end_allocate_to_pool(q).unwrap_err();
    assert!(err.to_string().contains("not currently recording"), "{err}");
    // A released pool that still holds a live block cannot be taken up again.
    let x = a.malloc(MIB, S, None).unwrap();
    a.end_allocate_to_pool(p).unwrap();
    a.release_pool(p).unwrap();
    a.release_pool(p).unwrap();
    a.empty_cache();
    assert_eq!(a.pool_use_count(p), Some(0));
    let err = a.begin_allocate_to_pool(p, PoolFilter::Streams(vec![S])).unwrap_err();
    assert!(err.to_string().contains("cannot be used again"), "{err}");
    a.free_allocation(&x, None).unwrap();
    a.check_invariants().unwrap();
}

#[test]
fn a_mempool_has_one_user_and_use_mem_pool_adds_one_for_its_scope() {
    let mut a = allocator();
    let p = a.new_pool_id(true);
    a.create_or_incref_pool(p).unwrap();
    assert_eq!(a.pool_use_count(p), Some(1));
    a.begin_allocate_to_pool(p, PoolFilter::Thread(0)).unwrap();
    assert_eq!(a.pool_use_count(p), Some(2), "inside `with use_mem_pool(p)`");
    let x = a.malloc(3 * MIB, S, None).unwrap();
    a.end_allocate_to_pool(p).unwrap();
    a.release_pool(p).unwrap();
    assert_eq!(a.pool_use_count(p), Some(1), "after the scope");
    a.free_allocation(&x, None).unwrap();
    a.empty_cache();
    assert_eq!(segments_of(&a, p), 1, "a pool in use keeps its free segments");
    // `del pool`: releasePool, then emptyCache(id).
    a.release_pool(p).unwrap();
    a.empty_cache_of_pool(p);
    assert_eq!(segments_of(&a, p), 0);
    assert_eq!(a.pool_use_count(p), None);
    assert_eq!(reserved(&a), 0);
}

#[test]
fn a_private_pool_never_takes_the_default_pools_cached_blocks_nor_gives_them_its_own() {
    let mut a = allocator();
    let d = a.malloc(MIB, S, None).unwrap();
    a.free_allocation(&d, None).unwrap();
    let p = a.new_pool_id(true);
    capture(&mut a, p, S);
    let x = a.malloc(MIB, S, None).unwrap();
    assert_ne!(x.segment, d.segment, "a new segment for the pool");
    assert_eq!((segments_of(&a, DEFAULT_POOL), segments_of(&a, p)), (1, 1));
    assert_eq!(reserved(&a), 4 * MIB);
    a.end_allocate_to_pool(p).unwrap();
    a.free_allocation(&x, None).unwrap();
    // Freed after the capture, x went back to the pool: the default request takes its own block.
    let y = a.malloc(MIB, S, None).unwrap();
    assert_eq!(y.ptr, d.ptr);
    let z = a.malloc(MIB, S, None).unwrap();
    assert_eq!(z.segment, d.segment, "the rest of the default segment, not the pool's free block");
    let w = a.malloc(MIB, S, None).unwrap();
    assert_ne!(w.segment, x.segment, "a new default segment instead");
    assert_eq!((segments_of(&a, DEFAULT_POOL), segments_of(&a, p)), (2, 1));
    a.check_invariants().unwrap();
}

#[test]
fn a_capture_takes_its_own_streams_and_use_mem_pool_its_own_thread() {
    let mut a = allocator();
    let p = a.new_pool_id(true);
    capture(&mut a, p, S);
    a.malloc(4 * MIB, T, None).unwrap();
    a.malloc(4 * MIB, S, None).unwrap();
    assert_eq!((segments_of(&a, DEFAULT_POOL), segments_of(&a, p)), (1, 1), "the other stream stays in the default pool");
    a.end_allocate_to_pool(p).unwrap();

    // test_mempool_ctx_multithread: another thread allocating during the scope is not routed.
    let q = a.new_pool_id(true);
    a.set_current_thread(1);
    a.begin_allocate_to_pool(q, PoolFilter::Thread(1)).unwrap();
    a.malloc(4 * MIB, S, None).unwrap();
    a.malloc(4 * MIB, T, None).unwrap();
    assert_eq!(segments_of(&a, q), 2, "every stream of the thread");
    a.set_current_thread(2);
    a.malloc(30 * MIB, S, None).unwrap();
    assert_eq!((segments_of(&a, DEFAULT_POOL), segments_of(&a, q)), (2, 2));
    a.check_invariants().unwrap();
}

#[test]
fn nested_pools_take_requests_latest_first() {
    // test_nested_mempool: 20 MiB requests in p1, p2, p3 nested, then leaving each.
    let mut a = allocator();
    let (p1, p2, p3) = (a.new_pool_id(true), a.new_pool_id(true), a.new_pool_id(true));
    let each = |a: &mut VirtualAllocator| a.malloc(20 * MIB, S, None).unwrap();
    a.begin_allocate_to_pool(p1, PoolFilter::Thread(0)).unwrap();
    each(&mut a);
    a.begin_allocate_to_pool(p2, PoolFilter::Thread(0)).unwrap();
    each(&mut a);
    a.begin_allocate_to_pool(p3, PoolFilter::Thread(0)).unwrap();
    each(&mut a);
    a.end_allocate_to_pool(p3).unwrap();
    each(&mut a);
    a.end_allocate_to_pool(p2).unwrap();
    each(&mut a);
    a.end_allocate_to_pool(p1).unwrap();
    each(&mut a);
    assert_eq!([p1, p2, p3, DEFAULT_POOL].map(|p| segments_of(&a, p)), [2, 2, 1, 1]);
}

#[test]
fn blocks_freed_during_a_capture_serve_it_again_on_the_same_stream_only() {
    let mut a = allocator();
    let p = a.new_pool_id(true);
    capture(&mut a, p, S);
    let x = a.malloc(512, S, None).unwrap();
    a.free_allocation(&x, None).unwrap();
    assert_eq!(a.malloc(512, S, None).unwrap().ptr, x.ptr);
    let t = a.malloc(4 * MIB, S, None).unwrap();
    a.free_allocation(&t, None).unwrap();
    a.end_allocate_to_pool(p).unwrap();
    // A second graph sharing the pool on another stream does not reuse the first one's blocks.
    capture(&mut a, p, T);
    let u = a.malloc(4 * MIB, T, None).unwrap();
    assert_ne!(u.segment, t.segment);
    a.end_allocate_to_pool(p).unwrap();
    // On the same stream it does.
    capture(&mut a, p, S);
    assert_eq!(a.malloc(4 * MIB, S, None).unwrap().ptr, t.ptr);
    assert_eq!(segments_of(&a, p), 3, "small, large on S, large on T");
    a.check_invariants().unwrap();
}

#[test]
fn a_block_another_stream_used_during_a_capture_waits_until_the_capture_ends() {
    let mut a = allocator();
    let p = a.new_pool_id(true);
    capture(&mut a, p, S);
    let x = a.malloc(4 * MIB, S, None).unwrap();
    a.record_stream_allocation(&x, T).unwrap();
    a.free_allocation(&x, None).unwrap();
    assert_eq!(block_state(&a, x.ptr), BlockState::ActivePendingFree);
    let y = a.malloc(4 * MIB, S, None).unwrap();
    assert_ne!(y.ptr, x.ptr, "not reusable during the capture");
    a.end_allocate_to_pool(p).unwrap();
    assert_eq!(block_state(&a, x.ptr), BlockState::ActivePendingFree, "nothing happens until the next request");
    // The next request outside any capture: T's use was part of the graph, so no event waits.
    a.malloc(512, S, None).unwrap();
    assert_eq!(block_state(&a, x.ptr), BlockState::Inactive);
    capture(&mut a, p, S);
    assert_eq!(a.malloc(4 * MIB, S, None).unwrap().ptr, x.ptr);
    a.check_invariants().unwrap();
}

#[test]
fn a_use_recorded_before_the_capture_still_needs_its_event() {
    let mut a = allocator();
    let p = a.new_pool_id(true);
    let x = a.malloc(4 * MIB, S, None).unwrap();
    a.record_stream_allocation(&x, T).unwrap();
    capture(&mut a, p, S);
    a.free_allocation(&x, None).unwrap();
    a.end_allocate_to_pool(p).unwrap();
    a.malloc(512, S, None).unwrap();
    assert_eq!(block_state(&a, x.ptr), BlockState::ActivePendingFree, "T's work was not part of the graph");
    a.stream_work_completed(T);
    a.malloc(512, S, None).unwrap();
    assert_eq!(block_state(&a, x.ptr), BlockState::Inactive);
    a.check_invariants().unwrap();
}

#[test]
fn running_out_during_a_capture_frees_no_cache() {
    let mut a = allocator();
    a.set_capacity(Some(30 * MIB));
    let d = a.malloc(4 * MIB, S, None).unwrap();
    a.free_allocation(&d, None).unwrap();
    let p = a.new_pool_id(true);
    capture(&mut a, p, S);
    let err = a.malloc(4 * MIB, S, None).unwrap_err();
    assert!(matches!(err, AllocError::OutOfMemory(_)), "{err}");
    assert!(!err.to_string().contains("private pools"), "the pool holds nothing free yet: {err}");
    assert_eq!(reserved(&a), 20 * MIB, "the default pool's cached segment survives");
    a.end_allocate_to_pool(p).unwrap();
    // The same request outside the capture goes to the default pool's cached block.
    let x = a.malloc(4 * MIB, S, None).unwrap();
    assert_eq!(x.ptr, d.ptr);
    // A pool with free blocks it cannot lend: the message says how much they are.
    a.free_allocation(&x, None).unwrap();
    a.set_capacity(Some(42 * MIB));
    let q = a.new_pool_id(true);
    capture(&mut a, q, S);
    let y = a.malloc(4 * MIB, S, None).unwrap();
    a.free_allocation(&y, None).unwrap();
    a.end_allocate_to_pool(q).unwrap();
    let held = a.malloc(20 * MIB, S, None).unwrap();
    let err = a.malloc(20 * MIB, S, None).unwrap_err();
    // PyTorch counts the pools' free blocks as allocated, and not as reserved but unallocated.
    assert!(
        err.to_string().contains(
            "Of the allocated memory 40.00 MiB is allocated by tensormem, with 20.00 MiB allocated in private pools (e.g., CUDA Graphs), and 0 bytes is reserved"
        ),
        "{err}"
    );
    a.free_allocation(&held, None).unwrap();
}

#[test]
fn running_out_outside_a_capture_frees_released_pools_but_not_pools_in_use() {
    let mut a = allocator();
    a.set_capacity(Some(50 * MIB));
    let (p, q) = (a.new_pool_id(true), a.new_pool_id(true));
    for pool in [p, q] {
        cache_in(&mut a, pool, 4 * MIB);
    }
    a.release_pool(q).unwrap();
    assert_eq!(reserved(&a), 40 * MIB);
    // 8 MiB needs a 20 MiB segment: 60 MiB > 50, so the cache goes, but only q's.
    a.malloc(8 * MIB, S, None).unwrap();
    assert_eq!(a.pool_use_count(q), None, "q released and erased");
    assert_eq!([p, DEFAULT_POOL].map(|pool| segments_of(&a, pool)), [1, 1]);
    assert_eq!(a.stats().num_alloc_retries, 1);
    a.check_invariants().unwrap();
}

#[test]
fn empty_cache_keeps_pools_in_use_and_frees_released_ones_down_to_their_live_blocks() {
    let mut a = allocator();
    let p = a.new_pool_id(true);
    capture(&mut a, p, S);
    let x = a.malloc(4 * MIB, S, None).unwrap();
    let y = a.malloc(18 * MIB, S, None).unwrap();
    a.free_allocation(&y, None).unwrap();
    a.end_allocate_to_pool(p).unwrap();
    let d = a.malloc(30 * MIB, S, None).unwrap();
    a.free_allocation(&d, None).unwrap();
    a.empty_cache();
    assert_eq!([p, DEFAULT_POOL].map(|pool| segments_of(&a, pool)), [2, 0], "in use: kept whole");
    a.release_pool(p).unwrap();
    a.empty_cache();
    assert_eq!(segments_of(&a, p), 1, "the segment x splits stays");
    assert_eq!(a.pool_use_count(p), Some(0), "and so does the pool");
    a.free_allocation(&x, None).unwrap();
    a.empty_cache();
    assert_eq!(segments_of(&a, p), 0);
    assert_eq!(a.pool_use_count(p), None);
    assert_eq!(reserved(&a), 0);
    a.check_invariants().unwrap();
}

#[test]
fn emptying_one_pool_leaves_the_rest_and_a_capture_shields_only_the_default_pool() {
    let mut a = allocator();
    let (p, q) = (a.new_pool_id(true), a.new_pool_id(true));
    for pool in [p, q] {
        cache_in(&mut a, pool, 4 * MIB);
    }
    let d = a.malloc(30 * MIB, S, None).unwrap();
    a.free_allocation(&d, None).unwrap();
    a.empty_cache_of_pool(p);
    assert_eq!([p, q, DEFAULT_POOL].map(|pool| segments_of(&a, pool)), [1, 1, 1], "p is in use: nothing happens");
    a.release_pool(p).unwrap();
    a.empty_cache_of_pool(p);
    assert_eq!([p, q, DEFAULT_POOL].map(|pool| segments_of(&a, pool)), [0, 1, 1], "only p");
    // test_mempool_emptycache_multithread: a scope underway keeps the default pool's cache.
    a.release_pool(q).unwrap();
    let r = a.new_pool_id(true);
    a.begin_allocate_to_pool(r, PoolFilter::Thread(1)).unwrap();
    a.empty_cache();
    assert_eq!([q, DEFAULT_POOL].map(|pool| segments_of(&a, pool)), [0, 1]);
    a.end_allocate_to_pool(r).unwrap();
    a.empty_cache();
    assert_eq!(segments_of(&a, DEFAULT_POOL), 0);
    a.check_invariants().unwrap();
}

#[test]
fn graphs_sharing_a_pool_reuse_what_an_earlier_one_freed_and_free_it_when_all_are_gone() {
    let mut a = allocator();
    let h = a.new_pool_id(true);
    capture(&mut a, h, S);
    let out = a.malloc(MIB, S, None).unwrap();
    let tmp = a.malloc(MIB, S, None).unwrap();
    a.free_allocation(&tmp, None).unwrap();
    a.end_allocate_to_pool(h).unwrap();
    capture(&mut a, h, S);
    let second = a.malloc(MIB, S, None).unwrap();
    assert_eq!(second.ptr, tmp.ptr, "the first graph's freed temporary, never its output");
    a.end_allocate_to_pool(h).unwrap();
    assert_eq!(a.pool_use_count(h), Some(2));
    a.release_pool(h).unwrap();
    a.release_pool(h).unwrap();
    a.empty_cache();
    assert_eq!(segments_of(&a, h), 1, "outputs outlive their graphs");
    a.free_allocation(&out, None).unwrap();
    a.free_allocation(&second, None).unwrap();
    a.empty_cache();
    assert_eq!((segments_of(&a, h), a.pool_use_count(h)), (0, None));
}

#[test]
fn a_graph_tree_keeps_its_pool_alive_with_an_empty_capture() {
    // cudagraph_trees: one handle, an empty capture holding it, warm-ups in use_mem_pool scopes.
    let mut a = allocator();
    let h = a.new_pool_id(true);
    capture(&mut a, h, S);
    a.end_allocate_to_pool(h).unwrap();
    a.begin_allocate_to_pool(h, PoolFilter::Thread(0)).unwrap();
    let x = a.malloc(4 * MIB, S, None).unwrap();
    a.free_allocation(&x, None).unwrap();
    a.end_allocate_to_pool(h).unwrap();
    a.release_pool(h).unwrap();
    assert_eq!(a.pool_use_count(h), Some(1));
    a.empty_cache();
    assert_eq!(segments_of(&a, h), 1);
}

#[test]
fn a_mempool_a_graph_also_uses_is_freed_when_the_graph_goes() {
    let mut a = allocator();
    let p = a.new_pool_id(true);
    a.create_or_incref_pool(p).unwrap();
    capture(&mut a, p, S);
    let x = a.malloc(4 * MIB, S, None).unwrap();
    a.end_allocate_to_pool(p).unwrap();
    a.free_allocation(&x, None).unwrap();
    assert_eq!(a.pool_use_count(p), Some(2));
    // `del pool`: the graph still uses it, so emptyCache(id) does nothing.
    a.release_pool(p).unwrap();
    a.empty_cache_of_pool(p);
    assert_eq!(segments_of(&a, p), 1);
    // The graph reset: the next empty_cache frees it.
    a.release_pool(p).unwrap();
    a.empty_cache();
    assert_eq!((segments_of(&a, p), a.pool_use_count(p)), (0, None));
}

#[test]
fn pools_count_in_the_same_stats_and_show_in_the_snapshot() {
    let mut a = allocator();
    let (user, graph) = (a.new_pool_id(true), a.new_pool_id(false));
    a.malloc(MIB, S, None).unwrap();
    capture(&mut a, user, S);
    a.malloc(MIB, S, None).unwrap();
    a.end_allocate_to_pool(user).unwrap();
    capture(&mut a, graph, S);
    a.malloc(5 * MIB, S, None).unwrap();
    a.end_allocate_to_pool(graph).unwrap();
    let s = a.stats();
    assert_eq!(s.segment.get(StatType::SmallPool).current, 2, "small segments of both pools");
    assert_eq!(s.segment.get(StatType::LargePool).current, 1);
    assert_eq!(reserved(&a), (2 + 2 + 20) * MIB);
    assert_eq!(s.allocated_bytes.all().current as u64, 7 * MIB);
    let mut ids: Vec<PoolId> = a.segments().iter().map(|s| s.segment_pool_id).collect();
    ids.sort();
    assert_eq!(ids, [DEFAULT_POOL, (0, 1), (1, 0)]);
    a.check_invariants().unwrap();
}

#[test]
fn a_state_with_private_pools_is_restored_with_them() {
    let mut a = allocator();
    let p = a.new_pool_id(true);
    a.malloc(4 * MIB, S, None).unwrap();
    capture(&mut a, p, S);
    let x = a.malloc(4 * MIB, S, None).unwrap();
    let y = a.malloc(4 * MIB, S, None).unwrap();
    a.free_allocation(&y, None).unwrap();
    a.end_allocate_to_pool(p).unwrap();
    let segments = a.segments();

    let mut b = allocator();
    b.restore(&segments).unwrap();
    b.check_invariants().unwrap();
    assert_eq!(b.segments(), segments, "every segment in its pool");
    assert_eq!(b.pool_use_count(p), Some(1), "a restored pool is in use");
    // The pool's free block serves neither the default pool ...
    let z = b.malloc(4 * MIB, S, None).unwrap();
    assert_ne!(z.segment, x.segment);
    // ... nor is lost to the pool's own next capture.
    capture(&mut b, p, S);
    assert_eq!(b.malloc(4 * MIB, S, None).unwrap().ptr, y.ptr);
    b.check_invariants().unwrap();
    let err = allocator()
        .restore(
            &segments
                .iter()
                .cloned()
                .map(|mut s| {
                    s.segment_pool_id = (3, 4);
                    s
                })
                .collect::<Vec<_>>(),
        )
        .unwrap_err();
    assert!(err.to_string().contains("(3, 4)"), "{err}");
}

/// `test_graph_memory_stats_and_use_result_after_destroy_graph`: `b = a.clone()` then five
/// times `b = b.clone() + 1` captured on a side stream, for tensors of three sizes: the
/// segments and bytes the pool reserves during the capture, and what the live output keeps once
/// the graph is gone and the cache emptied.
#[test]
fn pytorchs_graph_memory_stats_test() {
    for (bytes, segments, during, after) in
        [(MIB + 512, 1, 20 * MIB, 20 * MIB), (10 * MIB - 512, 2, 40 * MIB, 20 * MIB), (10 * MIB + 512, 3, 36 * MIB, 12 * MIB)]
    {
        let mut a = allocator();
        let input = a.malloc(bytes, 0, None).unwrap();
        let before = reserved(&a);
        let g = a.new_pool_id(false);
        capture(&mut a, g, T);
        let mut b = a.malloc(bytes, T, None).unwrap();
        for _ in 0..5 {
            let clone = a.malloc(bytes, T, None).unwrap();
            let plus_one = a.malloc(bytes, T, None).unwrap();
            a.free_allocation(&clone, None).unwrap();
            a.free_allocation(&b, None).unwrap();
            b = plus_one;
        }
        a.end_allocate_to_pool(g).unwrap();
        assert_eq!((segments_of(&a, g), reserved(&a) - before), (segments, during), "{bytes} bytes, during the capture");
        a.release_pool(g).unwrap();
        a.empty_cache();
        assert_eq!((segments_of(&a, g), reserved(&a) - before), (1, after), "{bytes} bytes, after `del g; empty_cache()`");
        a.free_allocation(&b, None).unwrap();
        a.free_allocation(&input, None).unwrap();
        a.check_invariants().unwrap();
    }
}

#[test]
fn a_snapshot_with_private_pools_is_written_and_read_back_byte_for_byte() {
    let mut a = allocator();
    let (user, graph) = (a.new_pool_id(true), a.new_pool_id(false));
    a.malloc(MIB, S, None).unwrap();
    cache_in(&mut a, user, 4 * MIB);
    capture(&mut a, graph, T);
    a.malloc(30 * MIB, T, None).unwrap();
    a.end_allocate_to_pool(graph).unwrap();
    let snapshot = a.snapshot();
    let pickle = tensormem::trace::to_pickle(&snapshot);
    let back = tensormem::trace::load(&pickle).unwrap();
    let mut ids: Vec<PoolId> = back.segments.iter().map(|s| s.segment_pool_id).collect();
    ids.sort();
    assert_eq!(ids, [DEFAULT_POOL, (0, 1), (1, 0)]);
    assert_eq!(back.segments, snapshot.segments);
    assert_eq!(tensormem::trace::to_pickle(&back), pickle);
    let json = tensormem::trace::to_json(&snapshot);
    assert_eq!(tensormem::trace::load(json.as_bytes()).unwrap().segments, snapshot.segments);
}

#[test]
fn a_private_pools_entries_name_it() {
    let mut a = allocator();
    let p = a.new_pool_id(true);
    let d = a.malloc(MIB, S, None).unwrap();
    a.free_allocation(&d, None).unwrap();
    cache_in(&mut a, p, 4 * MIB);
    let trace = a.history().entries();
    let pools: Vec<(tensormem::trace::Action, Option<PoolId>)> = trace.iter().map(|e| (e.action, e.pool_id())).collect();
    use tensormem::trace::Action::*;
    assert_eq!(
        pools,
        [
            (SegmentAlloc, None),
            (Alloc, None),
            (FreeRequested, None),
            (FreeCompleted, None),
            (SegmentAlloc, Some(p)),
            (Alloc, Some(p)),
            (FreeRequested, Some(p)),
            (FreeCompleted, Some(p)),
        ]
    );
}

/// tensormem's own recordings of the graph scenarios, replayed: each entry that names a pool is
/// allocated into it, and a cache flush that returns a pool's segments releases the pool first,
/// so every decision and the final state are the recording's. Without the entries' pool ids
/// (released PyTorch versions), the final segments' pools route the allocations made in them.
#[test]
fn recordings_that_capture_graphs_replay_decision_for_decision() {
    use tensormem::replay::{ReplayOptions, replay_device};
    use tensormem::scenarios::{self, RunRequest};
    for (scenario, set) in [("cuda-graph-step", vec![]), ("cuda-graph-pools", vec![]), ("cuda-graph-pools", vec![("pools", "shared")])] {
        let request = RunRequest { scenario: scenario.into(), set: set.iter().map(|(k, v)| (k.to_string(), v.to_string())).collect(), ..Default::default() };
        let run = scenarios::run(&request).unwrap();
        let r = replay_device(&run.snapshot, 0, &ReplayOptions::default(), &mut |_, _| {}).unwrap();
        assert_eq!((r.segment_alloc_match, r.address_match), (1.0, 1.0), "{scenario} {set:?}: {:?}", r.first_divergence);
        assert!(r.final_state_match, "{scenario} {set:?}: {:?}", r.first_divergence);
        assert!(r.first_divergence.is_none(), "{scenario} {set:?}: {:?}", r.first_divergence);

        // As PyTorch 2.11 and earlier write it: the segments name their pools, the entries do
        // not. The pools of the segments alive at the end route the allocations made in them.
        let mut released = run.snapshot.clone();
        let named = released.device_traces[0].iter().filter(|e| e.pool_id().is_some()).count();
        assert!(named > 1000, "{scenario} {set:?}: {named} entries name a pool");
        released.device_traces[0].edit(|e| {
            if let Some(extra) = e.extra.as_mut() {
                std::sync::Arc::make_mut(extra).pool_id = None;
            }
        });
        assert!(released.device_traces[0].iter().all(|e| e.pool_id().is_none()));
        let r = replay_device(&released, 0, &ReplayOptions::default(), &mut |_, _| {}).unwrap();
        assert_eq!((r.segment_alloc_match, r.address_match), (1.0, 1.0), "{scenario} {set:?} without pool_id: {:?}", r.first_divergence);
        assert!(r.final_state_match, "{scenario} {set:?} without pool_id: {:?}", r.first_divergence);
        assert!(r.first_divergence.is_none(), "{scenario} {set:?} without pool_id: {:?}", r.first_divergence);
    }
}

#[test]
fn a_use_on_oom_pool_lends_its_free_blocks_before_anything_is_freed_and_others_never_do() {
    let mut a = allocator();
    a.set_capacity(Some(70 * MIB));
    let (lender, plain) = (a.new_pool_id(true), a.new_pool_id(true));
    for (pool, bytes) in [(lender, 40 * MIB), (plain, 30 * MIB)] {
        a.create_or_incref_pool(pool).unwrap();
        a.begin_allocate_to_pool(pool, PoolFilter::Thread(0)).unwrap();
        let x = a.malloc(bytes, S, None).unwrap();
        a.free_allocation(&x, None).unwrap();
        a.end_allocate_to_pool(pool).unwrap();
        a.release_pool(pool).unwrap();
    }
    a.set_use_on_oom(lender, true).unwrap();
    assert_eq!(reserved(&a), 70 * MIB);
    // The device is full: the default request takes the lender's free block, split.
    let x = a.malloc(30 * MIB, S, None).unwrap();
    let lender_segment = a.segments().into_iter().find(|s| s.segment_pool_id == lender).unwrap();
    assert_eq!((x.segment, x.size), (lender_segment.address, 30 * MIB));
    assert_eq!((reserved(&a), a.stats().num_alloc_retries), (70 * MIB, 0));
    // The lender has 10 MiB left; the plain pool's free 30 MiB is never lent.
    let err = a.malloc(30 * MIB, S, None).unwrap_err();
    assert!(matches!(err, AllocError::OutOfMemory(_)), "{err}");
    assert_eq!([lender, plain].map(|p| segments_of(&a, p)), [1, 1]);
    // x went back to the pool it came from.
    a.free_allocation(&x, None).unwrap();
    assert_eq!(block_state(&a, lender_segment.address), BlockState::Inactive);
    a.check_invariants().unwrap();
}

#[test]
fn a_no_split_pool_holds_one_allocation_per_segment() {
    // test_mempool_no_split.
    let mut a = allocator();
    let p = a.new_pool_id(true);
    a.create_or_incref_pool(p).unwrap();
    a.set_no_split(p).unwrap();
    a.begin_allocate_to_pool(p, PoolFilter::Thread(0)).unwrap();
    let x = a.malloc(MIB, S, None).unwrap();
    let y = a.malloc(512, S, None).unwrap();
    let z = a.malloc(4 * MIB, S, None).unwrap();
    a.end_allocate_to_pool(p).unwrap();
    assert_eq!([x.size, y.size, z.size], [2 * MIB, 2 * MIB, 20 * MIB], "each takes its whole segment");
    assert_eq!(segments_of(&a, p), 3);
    assert!(a.segments().iter().all(|s| s.blocks.len() == 1));
    // The default pool still splits.
    let d = a.malloc(512, S, None).unwrap();
    assert_eq!(d.size, 512);
    a.check_invariants().unwrap();
}

#[test]
fn dropping_a_mem_pool_replays_as_emptying_only_that_pool() {
    use tensormem::replay::{ReplayOptions, replay_device};
    let dev = tensormem::Device::sim(tensormem::SimOptions::preset("H100-80GB"));
    dev.record_memory_history(true, RecordContext::State, 100_000);
    // The default pool caches a free segment; a MemPool's scope allocates; dropping it empties it.
    drop(dev.empty(&[256 * 1024], tensormem::DType::F32).unwrap());
    let pool = dev.mem_pool().unwrap();
    {
        let _scope = dev.use_mem_pool(&pool).unwrap();
        drop(dev.empty(&[256 * 1024], tensormem::DType::F32).unwrap());
    }
    drop(pool);
    let snapshot = dev.snapshot();
    let frees = snapshot.device_traces[0].iter().filter(|e| e.action == tensormem::trace::Action::SegmentFree).count();
    assert_eq!(frees, 1, "only the pool's segment");
    let r = replay_device(&snapshot, 0, &ReplayOptions::default(), &mut |_, _| {}).unwrap();
    assert!(r.final_state_match && r.first_divergence.is_none(), "{:?}", r.first_divergence);
}

/// `torch.cuda.graph` empties the cache as it begins; the first graph alive makes the random
/// generator's seed and offset (8 bytes each, default pool), which the last graph gone frees. A
/// capture refused (its pool already taking another capture's allocations) leaves nothing held.
#[test]
fn a_graph_capture_empties_the_cache_and_holds_the_generators_state_while_graphs_live() {
    let dev = tensormem::Device::sim(tensormem::SimOptions::preset("H100-80GB"));
    let allocated = || dev.memory_stats()["allocated_bytes.all.current"];
    let reserved = || dev.memory_stats()["reserved_bytes.all.current"];
    drop(dev.empty(&[256 * 1024], tensormem::DType::F32).unwrap());
    assert_eq!((allocated(), reserved()), (0, 2 * MIB as i64), "a cached segment");
    let handle = dev.graph_pool_handle();
    let first = dev.capture_graph(Some(handle)).unwrap();
    assert_eq!((allocated(), reserved()), (1024, 2 * MIB as i64), "the cache emptied, then two 512-byte blocks in a new segment");
    assert!(dev.capture_graph(Some(handle)).is_err(), "the pool already takes this capture's allocations");
    let first = first.end().unwrap();
    let second = dev.capture_graph(None).unwrap().end().unwrap();
    assert_eq!(allocated(), 1024, "made once for every graph");
    drop(first);
    assert_eq!(allocated(), 1024);
    drop(second);
    assert_eq!(allocated(), 0, "the last graph gone frees them");
}
