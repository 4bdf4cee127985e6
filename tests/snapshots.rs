//! Reading and writing real PyTorch snapshots.

mod common;

use tensormem::trace::{self, Action, BlockState};

#[test]
fn every_fixture_loads_with_shared_frames() {
    let Some(dir) = common::fixtures_dir() else { return };
    for name in common::FIXTURES {
        let data = std::fs::read(dir.join(name)).unwrap();
        let t = std::time::Instant::now();
        let snap = trace::load(&data).unwrap_or_else(|e| panic!("{name}: {e}"));
        eprintln!("{name}: {} bytes in {:?}", data.len(), t.elapsed());
        assert!(!snap.segments.is_empty(), "{name}");
        for seg in &snap.segments {
            let total: u64 = seg.blocks.iter().map(|b| b.size).sum();
            assert_eq!(total, seg.total_size, "{name}: blocks cover segment {:#x}", seg.address);
            let allocated: u64 = seg.blocks.iter().filter(|b| b.state == BlockState::ActiveAllocated).map(|b| b.size).sum();
            assert_eq!(allocated, seg.allocated_size, "{name}");
        }
    }
}

#[test]
fn gpt_forward_matches_python_counts() {
    let Some(path) = common::fixture("gpt-ctx128-forward.pickle") else { return };
    let snap = trace::load_file(&path).unwrap();
    // Counted with Python's pickle module (restricted to plain data).
    assert_eq!(snap.segments.len(), 405);
    assert_eq!(snap.device_traces.len(), 1);
    let trace = &snap.device_traces[0];
    assert_eq!(trace.len(), 8227);
    let count = |a: Action| trace.iter().filter(|e| e.action == a).count();
    assert_eq!(count(Action::Alloc), 3113);
    assert_eq!(count(Action::FreeRequested), 2468);
    assert_eq!(count(Action::SegmentAlloc), 178);
    assert_eq!(trace.at(0).addr, 140036741822464);
    assert_eq!(trace.at(0).size, 4);
    assert_eq!(trace.at(0).time_us, Some(1748329299514852));
    let frames = trace.at(0).frames.as_ref().unwrap();
    assert_eq!(frames[0].name, "torch::unwind::unwind()");
    assert_eq!(frames[0].filename, "??");
    // Frames shared in the file are shared in memory: 9,233 frame lists hold 761 distinct stacks.
    let mut distinct: Vec<*const trace::Frame> = trace
        .iter()
        .filter_map(|e| e.frames.as_ref())
        .chain(snap.segments.iter().flat_map(|s| s.blocks.iter().map(|b| &b.frames)))
        .map(|f| f.as_ptr())
        .collect();
    distinct.sort();
    distinct.dedup();
    assert!(distinct.len() <= 761, "{} distinct frame lists in memory", distinct.len());
    let settings = snap.allocator_settings.as_ref().unwrap();
    assert_eq!(settings["max_split_size"], -1);
    assert_eq!(settings["expandable_segments"], false);
}

#[test]
fn pickle_and_json_round_trip() {
    let Some(dir) = common::fixtures_dir() else { return };
    for name in common::FIXTURES {
        let snap = trace::load_file(&dir.join(name)).unwrap();
        let from_pickle = trace::load(&trace::to_pickle(&snap)).unwrap_or_else(|e| panic!("{name}: {e}"));
        assert_eq!(from_pickle, snap, "{name} via pickle");
        // JSON repeats every stack (MemoryViz needs it so): check it on the smaller files.
        if name.starts_with("small") || name.starts_with("tiny") || name.starts_with("eor") {
            let from_json = trace::load(trace::to_json(&snap).as_bytes()).unwrap_or_else(|e| panic!("{name}: {e}"));
            assert_eq!(from_json, snap, "{name} via JSON");
        }
    }
}

/// A G3 snapshot writes `compile_context` and `user_metadata` on every entry: every entry with
/// the same values shares one copy, and they are written back as they were read.
#[test]
fn the_keys_every_entry_repeats_are_stored_once() {
    let Some(path) = common::fixture("gpt-medium-ctx128-training.pickle") else { return };
    let snap = trace::load_file(&path).unwrap();
    let entries = &snap.device_traces[0];
    assert!(entries.iter().all(|e| e.compile_context().is_some()), "a G3 trace names a compile context on every entry");
    let distinct: std::collections::HashSet<_> = entries.iter().filter_map(|e| e.extra.as_ref()).map(std::sync::Arc::as_ptr).collect();
    let values: std::collections::HashSet<_> = entries.iter().filter_map(|e| e.extra.as_deref()).collect();
    assert_eq!(distinct.len(), values.len(), "one copy per distinct set of values");
    assert!(distinct.len() < 10, "{} copies for {} entries", distinct.len(), entries.len());
    let again = trace::load(&trace::to_pickle(&snap)).unwrap();
    assert_eq!(again.device_traces, snap.device_traces);
}

/// PyTorch splits a long reduction over several blocks and takes a buffer and semaphores for
/// it from the caching allocator: the sim device makes the same allocations in the same order
/// for the recorded ops.
#[test]
fn split_reductions_allocate_what_the_recorded_ones_did() {
    use tensormem::{CudaCard, DType, Device, Multiprocessors, SimOptions};
    let Some(dir) = common::fixtures_dir() else { return };
    let recorded = |name: &str, events: std::ops::RangeInclusive<usize>| -> Vec<(Action, u64)> {
        let snap = trace::load_file(&dir.join(name)).unwrap();
        snap.device_traces[0].range(events).filter(|e| matches!(e.action, Action::Alloc | Action::FreeRequested)).map(|e| (e.action, e.size)).collect()
    };
    let ours = |dev: &Device, op: &dyn Fn() -> tensormem::Tensor| -> Vec<(Action, u64)> {
        let before = dev.snapshot().device_traces[0].len();
        let _result = op();
        dev.snapshot().device_traces[0]
            .range(before..)
            .filter(|e| matches!(e.action, Action::Alloc | Action::FreeRequested))
            .map(|e| (e.action, e.size))
            .collect()
    };
    // small-state.pickle, `loss = out.sum()` of a [512, 1024] float32 (events 26-32): the
    // output, 256 bytes for 64 blocks' partial sums, 4 of semaphores.
    let dev = Device::sim(SimOptions::preset("H100-80GB"));
    let out = dev.zeros(&[512, 1024], DType::F32).unwrap();
    let theirs = recorded("small-state.pickle", 26..=32);
    assert_eq!(theirs, [(Action::Alloc, 4), (Action::Alloc, 256), (Action::Alloc, 4), (Action::FreeRequested, 4), (Action::FreeRequested, 256)]);
    assert_eq!(ours(&dev, &|| out.sum(&[], false).unwrap()), theirs);
    // Integer sums accumulate in their output's type (here int32, as `sum(dtype=torch.int32)`).
    let ints = dev.zeros(&[512, 1024], DType::I32).unwrap();
    assert_eq!(ours(&dev, &|| ints.sum(&[], false).unwrap()), theirs);
    // eor-nn-legacy-with-snapshots.pickle, `.mean()` of 1,966,080 floats (events 82-88) on a
    // card with 144 blocks of 512 threads in flight (72 SMs of 1,024 threads, as a Turing
    // Quadro RTX 8000): 576 bytes. An H100 would split it over 240 blocks.
    let card = SimOptions {
        cuda: Some(CudaCard { multiprocessors: Multiprocessors { count: 72, max_threads_each: 1024, warp_size: 32 }, capability: (7, 5), rocm: false }),
        ..SimOptions::preset("H100-80GB")
    };
    let dev = Device::sim(card);
    let image = dev.zeros(&[10, 3, 256, 256], DType::F32).unwrap();
    let theirs = recorded("eor-nn-legacy-with-snapshots.pickle", 82..=88);
    assert_eq!(theirs[1], (Action::Alloc, 576));
    assert_eq!(ours(&dev, &|| image.mean(&[], false).unwrap()), theirs);
    let h100 = Device::sim(SimOptions::preset("H100-80GB"));
    let image = h100.zeros(&[10, 3, 256, 256], DType::F32).unwrap();
    assert_eq!(ours(&h100, &|| image.mean(&[], false).unwrap())[1], (Action::Alloc, 960));
}

/// PyTorch names an allocation of no known category `unknown` (`_profile_to_snapshot`, behind
/// `torch.cuda._memory_viz.profile_plot`), and MemoryViz, given any category, fails on a
/// snapshot whose categories lack it (its `annotate_snapshot` pushes onto a misspelt list). So
/// `unknown` reads as no category, and a trace with categories is written with `unknown` on its
/// other allocations, in pickles and JSON alike; a trace with none is written with none.
#[test]
fn allocations_of_no_known_category_are_unknown() {
    use tensormem::trace::{Category, Snapshot, Trace, TraceEntry};
    let text = br#"{"segments": [], "device_traces": [[
        {"action": "alloc", "addr": 0, "size": 512, "stream": 0, "category": "unknown"},
        {"action": "alloc", "addr": 512, "size": 512, "stream": 0, "category": "parameter"},
        {"action": "free_requested", "addr": 0, "size": 512, "stream": 0}]]}"#;
    let snap = trace::load(text).unwrap();
    let read = |s: &Snapshot| s.trace_of(0).iter().map(|e| e.category).collect::<Vec<_>>();
    assert_eq!(read(&snap), [None, Some(Category::Parameter), None]);
    let pickle = trace::to_pickle(&snap);
    assert_eq!(read(&trace::load(&pickle).unwrap()), read(&snap));
    assert_eq!(trace::to_pickle(&trace::load(&pickle).unwrap()), pickle, "written and read back byte for byte");
    // As Python reads them: `unknown` on the allocation without one, nothing on the free.
    let json: serde_json::Value = serde_json::from_str(&trace::to_json(&snap)).unwrap();
    let written: Vec<Option<&str>> = json["device_traces"][0].as_array().unwrap().iter().map(|e| e["category"].as_str()).collect();
    assert_eq!(written, [Some("unknown"), Some("parameter"), None]);
    assert_eq!(pickle.windows(7).filter(|w| w == b"unknown").count(), 1);
    // Every allocation has one: the first other entry carries `unknown`, for MemoryViz.
    let all = trace::load(
        br#"{"segments": [], "device_traces": [[
        {"action": "alloc", "addr": 0, "size": 512, "stream": 0, "category": "input"},
        {"action": "free_requested", "addr": 0, "size": 512, "stream": 0},
        {"action": "free_completed", "addr": 0, "size": 512, "stream": 0}]]}"#,
    )
    .unwrap();
    let json: serde_json::Value = serde_json::from_str(&trace::to_json(&all)).unwrap();
    let written: Vec<Option<&str>> = json["device_traces"][0].as_array().unwrap().iter().map(|e| e["category"].as_str()).collect();
    assert_eq!(written, [Some("input"), Some("unknown"), None]);
    let pickle = trace::to_pickle(&all);
    assert_eq!(read(&trace::load(&pickle).unwrap()), [Some(Category::Input), None, None]);
    assert_eq!(trace::to_pickle(&trace::load(&pickle).unwrap()), pickle);
    // No category anywhere: none written.
    let plain = Snapshot { device_traces: vec![Trace::from(vec![TraceEntry::new(Action::Alloc, 0, 512, 0)])], ..Default::default() };
    assert!(!trace::to_json(&plain).contains("category"));
    assert!(!trace::to_pickle(&plain).windows(8).any(|w| w == b"category"));
}
