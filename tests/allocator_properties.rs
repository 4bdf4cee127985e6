//! Property tests: random alloc / free / cross-stream free / empty_cache sequences under every
//! setting, with every current stat recomputed from the blocks after each step.

use proptest::prelude::*;
use tensormem::alloc::{AllocError, AllocatorConfig, RecordContext, VirtualAllocator};

#[derive(Debug, Clone)]
enum Op {
    Malloc { size: u64, stream: u64 },
    Free { pick: usize },
    FreeUsedElsewhere { pick: usize },
    StreamDone,
    EmptyCache,
}

fn op() -> impl Strategy<Value = Op> {
    let size = prop_oneof![0u64..2048, 0u64..(1 << 20), (1u64 << 20)..(12 << 20), (10u64 << 20)..(200 << 20),];
    prop_oneof![
        6 => (size, prop_oneof![Just(0u64), Just(3u64)]).prop_map(|(size, stream)| Op::Malloc { size, stream }),
        4 => any::<usize>().prop_map(|pick| Op::Free { pick }),
        1 => any::<usize>().prop_map(|pick| Op::FreeUsedElsewhere { pick }),
        1 => Just(Op::StreamDone),
        1 => Just(Op::EmptyCache),
    ]
}

fn configs() -> impl Strategy<Value = (&'static str, Option<u64>)> {
    (
        prop_oneof![
            Just(""),
            Just("max_split_size_mb:64"),
            Just("roundup_power2_divisions:4"),
            Just("expandable_segments:True"),
            Just("max_split_size_mb:32,expandable_segments:True"),
            Just("garbage_collection_threshold:0.6,per_process_memory_fraction:0.9"),
        ],
        prop_oneof![Just(None), Just(Some(512u64 << 20))],
    )
}

proptest! {
    #![proptest_config(ProptestConfig { cases: 192, ..ProptestConfig::default() })]

    #[test]
    fn stats_always_match_the_blocks((conf, capacity) in configs(), ops in prop::collection::vec(op(), 1..160)) {
        let mut a = VirtualAllocator::virtual_with(AllocatorConfig::parse(conf).unwrap());
        // A memory fraction (and so garbage collection) needs a device size.
        let capacity = capacity.or(conf.contains("fraction").then_some(1 << 30));
        a.set_capacity(capacity);
        a.record_memory_history(true, RecordContext::State, 1000);
        let mut live: Vec<(u64, u64)> = Vec::new();
        for op in ops {
            match op {
                Op::Malloc { size, stream } => match a.malloc(size, stream, None) {
                    Ok(x) => {
                        prop_assert!(x.size >= size.max(1));
                        prop_assert_eq!(x.ptr % 512, 0, "blocks stay 512-byte aligned");
                        for &(p, s) in &live {
                            prop_assert!(x.ptr + x.size <= p || p + s <= x.ptr, "live blocks overlap");
                        }
                        live.push((x.ptr, x.size));
                    }
                    Err(AllocError::OutOfMemory(oom)) => {
                        prop_assert!(capacity.is_some(), "no capacity, no OOM");
                        prop_assert!(oom.reserved <= capacity.unwrap());
                    }
                    Err(e) => prop_assert!(false, "{e}"),
                },
                Op::Free { pick } | Op::FreeUsedElsewhere { pick } if !live.is_empty() => {
                    let (ptr, _) = live.swap_remove(pick % live.len());
                    if matches!(op, Op::FreeUsedElsewhere { .. }) {
                        a.record_stream(ptr, 42).unwrap();
                    }
                    a.free(ptr, None).unwrap();
                }
                Op::Free { .. } | Op::FreeUsedElsewhere { .. } => {}
                Op::StreamDone => a.stream_work_completed(42),
                Op::EmptyCache => {
                    let before = a.stats().reserved_bytes.all().current;
                    let peak = a.stats().reserved_bytes.all().peak;
                    a.empty_cache();
                    prop_assert!(a.stats().reserved_bytes.all().current <= before, "empty_cache never grows reserved");
                    prop_assert_eq!(a.stats().reserved_bytes.all().peak, peak);
                }
            }
            if let Err(e) = a.check_invariants() {
                prop_assert!(false, "{}", e);
            }
            if let Some(c) = capacity {
                prop_assert!(a.reserved() <= c);
            }
        }
        // Everything freed and flushed: nothing is left.
        for (ptr, _) in live.drain(..) {
            a.free(ptr, None).unwrap();
        }
        a.empty_cache();
        prop_assert_eq!(a.reserved(), 0);
        prop_assert_eq!(a.stats().allocated_bytes.all().current, 0);
        a.check_invariants().map_err(TestCaseError::fail)?;
    }
}
