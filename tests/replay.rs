//! Replaying real PyTorch traces reproduces PyTorch's decisions; replaying under other settings
//! answers "what if".

mod common;

use tensormem::alloc::{AllocatorConfig, RecordContext, VirtualAllocator};
use tensormem::replay::{DeviceReplay, KnownStart, ReplayOptions, StartMode, replay_device, replay_snapshot};
use tensormem::trace::{self, Action};

fn replay(name: &str, options: &ReplayOptions) -> Option<Vec<DeviceReplay>> {
    let path = common::fixture(name)?;
    let snap = trace::load_file(&path).unwrap();
    Some(replay_snapshot(&snap, options, &mut |_, _| {}).unwrap())
}

fn assert_faithful(name: &str, r: &DeviceReplay) {
    assert_eq!(r.segment_alloc_match, 1.0, "{name} device {}: {:?}", r.device, r.first_divergence);
    assert_eq!(r.address_match, 1.0, "{name} device {}: {:?}", r.device, r.first_divergence);
    assert!(r.final_state_match, "{name} device {}: {:?}", r.device, r.first_divergence);
    assert_eq!(r.first_divergence, None, "{name}");
    assert!(r.warnings.is_empty(), "{name}: {:?}", r.warnings);
    assert_eq!(r.recorded.peak_reserved_bytes, r.replayed.figures.peak_reserved_bytes, "{name}");
    assert_eq!(r.recorded.segment_allocs, r.replayed.figures.segment_allocs, "{name}");
    assert_eq!(r.recorded.segment_frees, r.replayed.figures.segment_frees, "{name}");
    assert_eq!(r.replayed.ooms, 0);
}

#[test]
fn non_expandable_traces_reproduce_every_decision() {
    // (file, events, recorded segment_allocs, peak reserved bytes)
    for (name, events, segment_allocs, peak) in [
        ("eor-nn-legacy-with-snapshots.pickle", 5803, 7, 134_217_728),
        ("finetune-legacy.pickle", 10307, 152, 6_471_811_072),
        ("gpt-ctx128-forward.pickle", 8227, 178, 17_878_220_800),
        ("gpt-medium-ctx128-training.pickle", 19136, 0, 7_235_174_400),
        ("small-state.pickle", 97, 9, 3_781_165_056),
    ] {
        let Some(results) = replay(name, &ReplayOptions::default()) else { return };
        assert_eq!(results.len(), 1, "{name}");
        let r = &results[0];
        assert_eq!(r.events, events, "{name}");
        assert_eq!(r.recorded.segment_allocs, segment_allocs, "{name}");
        assert_eq!(r.replayed.figures.peak_reserved_bytes, peak, "{name}");
        assert!(!r.expandable_segments);
        assert_faithful(name, r);
    }
}

#[test]
fn expandable_trace_is_replayed_through_the_expandable_path() {
    let Some(results) = replay("expandable-3gpu-oom.pickle", &ReplayOptions::default()) else { return };
    // Devices 0-2 have traces (device 3's is empty and it has no segments).
    assert_eq!(results.iter().map(|r| r.device).collect::<Vec<_>>(), vec![0, 1, 2]);
    // (segment_map, segment_unmap, peak reserved) per device, as recorded and as replayed.
    let expected = [(0, 8_541_700_096u64), (1, 84_202_749_952), (2, 21_883_781_120)];
    for (r, (device, peak)) in results.iter().zip(expected) {
        assert_eq!(r.device, device);
        assert!(r.expandable_segments);
        assert_eq!(r.recorded.segment_allocs, 0, "expandable devices map pages instead");
        assert_eq!(r.replayed.figures.segment_maps, r.recorded.segment_maps);
        assert_eq!(r.replayed.figures.segment_unmaps, r.recorded.segment_unmaps);
        assert_eq!(r.replayed.figures.peak_reserved_bytes, peak);
        assert_eq!(r.replayed.memory_stats["segment.all.current"], 0, "mappings are not counted as segments");
        assert_faithful("expandable-3gpu-oom.pickle", r);
    }
    // Device 1 released 3.96 GB of pages in one cache flush before its OOM; we release the same.
    assert_eq!(results[1].recorded.segment_unmaps, 6);
    assert_eq!(results[1].replayed.figures.segment_unmaps, 6);
    assert_eq!(results.iter().map(|r| r.recorded.segment_maps).sum::<usize>(), 293);
}

#[test]
fn state_only_snapshot_restores_expandable_ranges() {
    let Some(results) = replay("tiny-settings.pickle", &ReplayOptions::default()) else { return };
    let r = &results[0];
    assert_eq!(r.events, 0);
    assert!(r.final_state_match);
    assert_eq!(r.start_reserved_bytes, 23_068_672);
    assert_eq!(r.settings, "expandable_segments:True,max_split_size_mb:128");
}

#[test]
fn a_smaller_card_runs_out_of_memory() {
    let options = ReplayOptions { capacity: Some(8 << 30), ..Default::default() };
    let Some(results) = replay("gpt-ctx128-forward.pickle", &options) else { return };
    let r = &results[0];
    assert!(r.replayed.ooms > 0, "a trace that peaks at 17.9 GB cannot fit 8 GiB");
    // The trace starts mid-run with memory in use; beyond that the replay never exceeds the card.
    assert!(r.replayed.figures.peak_reserved_bytes <= r.start_reserved_bytes.max(8 << 30));
    assert!(r.first_divergence.as_ref().unwrap().reason.contains("out of memory"));
    assert!(r.replayed.memory_stats["num_ooms"] > 0);
}

#[test]
fn a_recorded_out_of_memory_is_reproduced_at_the_card_pytorch_saw() {
    // Device 1 of this run ran out at entry 421: 5,308,694,528 bytes asked, 95,682,560 free.
    let replay_at = |capacity| {
        let options = ReplayOptions { capacity, ..Default::default() };
        let path = common::fixture("expandable-3gpu-oom.pickle")?;
        Some(replay_device(&trace::load_file(&path).unwrap(), 1, &options, &mut |_, _| {}).unwrap())
    };
    let Some(unlimited) = replay_at(None) else { return };
    let recorded = unlimited.recorded_oom.clone().expect("the oom entry is read");
    let reserved = 84_202_749_952;
    assert_eq!((recorded.event, recorded.request_bytes, recorded.device_free_bytes), (421, 5_308_694_528, Some(95_682_560)));
    assert_eq!(recorded.reserved_bytes, reserved, "the replay agrees with PyTorch up to the failure");
    assert_eq!(recorded.capacity_estimate_bytes, Some(reserved + 95_682_560));
    // An unlimited card is not asked: the replay is the recording, decision for decision.
    assert_faithful("expandable-3gpu-oom.pickle", &unlimited);

    // At the card PyTorch saw, the request fails again, at the same entry, and nothing else differs.
    let at_card = replay_at(recorded.capacity_estimate_bytes).unwrap();
    assert_eq!((at_card.replayed.ooms, at_card.first_oom_event), (1, Some(421)));
    assert_eq!(at_card.first_divergence, None);
    assert!(at_card.final_state_match);
    // 253 more 20 MiB pages than were mapped (the doctor's smallest capacity): the request fits,
    // is freed at once, and the replay says where it parted from the recording.
    let larger = replay_at(Some(reserved + 253 * (20 << 20))).unwrap();
    assert_eq!((larger.replayed.ooms, larger.first_oom_event), (0, None));
    let parted = larger.first_divergence.expect("fitting is a divergence");
    assert_eq!(parted.event, 421);
    assert!(parted.reason.contains("ran out of memory asking for 5308694528 bytes"), "{}", parted.reason);
}
#[test]
fn expandable_segments_change_the_layout_of_a_classic_trace() {
    let options = ReplayOptions { config: Some(AllocatorConfig::parse("expandable_segments:True").unwrap()), ..Default::default() };
    let Some(results) = replay("finetune-legacy.pickle", &options) else { return };
    let r = &results[0];
    assert!(r.expandable_segments);
    assert_eq!(r.replayed.ooms, 0);
    assert!(r.replayed.figures.segment_maps > 0);
    assert!(r.segment_alloc_match < 1.0, "other settings make other decisions");
    // Memory the trace's tensors need is the same; only its packing changes.
    assert!(r.replayed.figures.peak_allocated_bytes > 0);
}

#[test]
fn our_own_traces_replay_exactly_even_when_the_ring_buffer_dropped_their_start() {
    // A workload with two streams, cross-stream frees, oversize blocks and cache flushes, recorded
    // with a ring buffer too small to hold it all, so the replay must reconstruct its start.
    for conf in ["", "max_split_size_mb:40", "roundup_power2_divisions:4", "expandable_segments:True"] {
        let mut a = VirtualAllocator::virtual_with(AllocatorConfig::parse(conf).unwrap());
        a.record_memory_history(true, RecordContext::Alloc, 3000);
        let mut live: Vec<u64> = Vec::new();
        let mut seed = 12345u64;
        let mut rand = move || {
            seed ^= seed << 13;
            seed ^= seed >> 7;
            seed ^= seed << 17;
            seed
        };
        for step in 0..4000 {
            let r = rand();
            if live.len() > 40 || (r % 3 == 0 && !live.is_empty()) {
                let ptr = live.swap_remove((r as usize / 3) % live.len());
                if r % 7 == 0 {
                    a.record_stream(ptr, 99).unwrap();
                }
                a.free(ptr, None).unwrap();
            } else {
                let size = match r % 4 {
                    0 => r % 4096,
                    1 => r % (1 << 20),
                    2 => r % (12 << 20),
                    _ => r % (90 << 20),
                };
                let stream = if r % 5 == 0 { 7 } else { 0 };
                live.push(a.malloc(size + 1, stream, None).unwrap().ptr);
            }
            a.check_invariants().unwrap_or_else(|e| panic!("{conf} step {step}: {e}"));
            if step % 500 == 499 {
                a.stream_work_completed(99);
            }
            if step % 1500 == 1499 {
                a.empty_cache();
            }
        }
        let snap = a.snapshot();
        assert_eq!(snap.device_traces[0].len(), 3000);
        let r = replay_device(&snap, 0, &ReplayOptions::default(), &mut |_, _| {}).unwrap();
        assert_faithful(conf, &r);
        let stats = a.stats();
        assert_eq!(r.replayed.memory_stats["allocated_bytes.all.current"], stats.allocated_bytes.all().current, "{conf}");
        assert_eq!(r.replayed.memory_stats["reserved_bytes.all.current"], stats.reserved_bytes.all().current, "{conf}");
        let releases = |a: Action| snap.device_traces[0].iter().filter(|e| e.action == a).count();
        assert!(releases(Action::SegmentFree) + releases(Action::SegmentUnmap) > 0, "{conf}: the window holds cache flushes");
    }
}

#[test]
fn unknown_device_is_a_clear_error() {
    let Some(path) = common::fixture("small-state.pickle") else { return };
    let snap = trace::load_file(&path).unwrap();
    let err = replay_device(&snap, 5, &ReplayOptions::default(), &mut |_, _| {}).unwrap_err();
    assert_eq!(err.to_string(), "device 5 has neither segments nor a trace in this snapshot (devices present: 0)");
}

#[test]
fn a_replaced_start_lets_settings_and_capacity_shape_a_trace_recorded_after_warm_up() {
    use tensormem::replay::StartMode;
    const GIB: u64 = 1 << 30;
    let name = "gpt-medium-ctx128-training.pickle";
    // Recorded start: every segment is already reserved (6.74 GiB), so a 6.4 GiB card is out of
    // memory before the first event, and nothing else can change.
    let recorded = ReplayOptions { capacity: Some(64 * GIB / 10), ..Default::default() };
    let Some(results) = replay(name, &recorded) else { return };
    assert_eq!(results[0].start, StartMode::Recorded);
    assert!(results[0].out_of_memory_at_start.as_deref().unwrap().contains("replaced start"));

    // Replaced start: the live tensors are placed afresh; the peak then needs more than 6.4 GiB
    // (6.6 GiB is enough once the cached segments are released and the request retried).
    let replaced = ReplayOptions { capacity: Some(64 * GIB / 10), start: StartMode::Replaced, ..Default::default() };
    let r = &replay(name, &replaced).unwrap()[0];
    assert_eq!(r.start, StartMode::Replaced);
    assert!(r.out_of_memory_at_start.is_none(), "{:?}", r.out_of_memory_at_start);
    assert!(r.replayed.ooms > 0);
    let first_oom = r.first_oom_event.unwrap();
    assert!(first_oom > 0, "the start fits; an allocation later in the trace does not");
    assert!(r.first_divergence.as_ref().unwrap().reason.contains("out of memory") || r.first_divergence.as_ref().unwrap().event < first_oom);
    assert!(r.replayed.figures.peak_reserved_bytes <= 64 * GIB / 10);
    // Live bytes at the start are the recorded ones, whatever the placement.
    assert_eq!(r.start_allocated_bytes, results[0].start_allocated_bytes);

    // Expandable segments from a replaced start reserve less than the recorded run's peak.
    let expandable = ReplayOptions {
        config: Some(AllocatorConfig::parse("expandable_segments:True").unwrap()),
        start: StartMode::Replaced,
        curves: true,
        ..Default::default()
    };
    let r = &replay(name, &expandable).unwrap()[0];
    assert_eq!(r.replayed.ooms, 0);
    assert!(r.replayed.figures.peak_reserved_bytes < r.recorded.peak_reserved_bytes);
    assert_eq!(r.reserved_curve.len(), r.events + 1);
    assert_eq!(r.reserved_curve.iter().cloned().fold(0.0, f64::max) as u64, r.replayed.figures.peak_reserved_bytes);

    // A card smaller than what is live at the start: out of memory at the start, said so.
    let tiny = ReplayOptions { capacity: Some(GIB), start: StartMode::Replaced, ..Default::default() };
    let r = &replay(name, &tiny).unwrap()[0];
    assert!(r.out_of_memory_at_start.as_deref().unwrap().contains("live at the start"), "{:?}", r.out_of_memory_at_start);
}

#[test]
fn a_replayed_trace_can_be_saved_and_reloaded() {
    let Some(path) = common::fixture("small-state.pickle") else { return };
    let snap = trace::load_file(&path).unwrap();
    let options = ReplayOptions { keep_snapshot: true, ..Default::default() };
    let r = replay_device(&snap, 0, &options, &mut |_, _| {}).unwrap();
    let replayed = r.snapshot.clone().unwrap();
    let again = trace::load(&trace::to_pickle(&replayed)).unwrap();
    // Replaying the replayed trace gives the same peaks.
    let r2 = replay_device(&again, 0, &ReplayOptions::default(), &mut |_, _| {}).unwrap();
    assert_eq!(r2.replayed.figures.peak_reserved_bytes, r.replayed.figures.peak_reserved_bytes);
    assert_eq!(r2.replayed.figures.peak_allocated_bytes, r.replayed.figures.peak_allocated_bytes);
    assert_eq!(again.trace_of(0).iter().filter(|e| e.action == Action::Alloc).count(), snap.trace_of(0).iter().filter(|e| e.action == Action::Alloc).count());
}

/// Where the program took a snapshot (`torch.cuda.memory_snapshot()`), the replayed trace marks
/// it too, with the bytes active at that point of the replay; annotations are carried as written.
#[test]
fn a_replayed_trace_marks_the_programs_snapshots() {
    let Some(path) = common::fixture("eor-nn-legacy-with-snapshots.pickle") else { return };
    let snap = trace::load_file(&path).unwrap();
    let options = ReplayOptions { keep_snapshot: true, ..Default::default() };
    let r = replay_device(&snap, 0, &options, &mut |_, _| {}).unwrap();
    let marks = |t: &trace::Trace| t.iter().enumerate().filter(|(_, e)| e.action == Action::Snapshot).map(|(i, e)| (i, e.size)).collect::<Vec<_>>();
    let recorded = marks(snap.trace_of(0));
    assert_eq!(recorded.len(), 9);
    assert_eq!(marks(r.snapshot.as_ref().unwrap().trace_of(0)), recorded);
    // Under other settings the marks stay where the program took them, with the replay's bytes.
    let rounded = ReplayOptions { config: Some(AllocatorConfig::parse("roundup_power2_divisions:4").unwrap()), keep_snapshot: true, ..Default::default() };
    let r = replay_device(&snap, 0, &rounded, &mut |_, _| {}).unwrap();
    let ours = marks(r.snapshot.as_ref().unwrap().trace_of(0));
    assert_eq!(ours.len(), 9);
    assert!(ours.iter().zip(&recorded).all(|(o, r)| o.1 >= r.1), "{ours:?} {recorded:?}");
}

/// A replay that makes every decision of the recording writes its trace back: each entry's
/// action, address, size, stream and stack (the free's own stack where PyTorch kept one), the
/// program's snapshots included. Files with a recorded oom are left out: an unlimited card is
/// not refused where the program was.
#[test]
fn an_exact_replay_writes_the_recorded_trace_back() {
    let Some(dir) = common::fixtures_dir() else { return };
    let mut files: Vec<_> =
        std::fs::read_dir(&dir).unwrap().filter_map(|e| Some(e.ok()?.path())).filter(|p| p.extension().is_some_and(|x| x == "pickle")).collect();
    files.sort();
    let options = ReplayOptions { keep_snapshot: true, ..Default::default() };
    let mut compared = 0;
    for path in files {
        let snap = trace::load_file(&path).unwrap();
        for device in snap.devices() {
            let recorded = snap.trace_of(device);
            if recorded.iter().any(|e| e.action == Action::Oom) {
                continue;
            }
            let r = replay_device(&snap, device, &options, &mut |_, _| {}).unwrap();
            let replayed = r.snapshot.as_ref().unwrap();
            let key = |e: trace::Entry| (e.action, e.addr, e.size, e.stream, e.frames.clone());
            let ours: Vec<_> = replayed.trace_of(device).iter().map(key).collect();
            let theirs: Vec<_> = recorded.iter().map(key).collect();
            let first = ours.iter().zip(&theirs).position(|(a, b)| a != b);
            assert!(
                ours.len() == theirs.len() && first.is_none(),
                "{} device {device}: {} entries against {}, first differing {first:?}",
                path.display(),
                ours.len(),
                theirs.len()
            );
            compared += theirs.len();
        }
    }
    assert!(compared > 50_000, "{compared} entries compared");
}

#[test]
fn the_driver_address_model_reproduces_every_decision_of_every_recorded_trace() {
    // The caching allocator ranks equal free blocks by address, so where the driver puts each new
    // segment decides which one a request is cut from. Replayed with addresses of our own (the
    // simulated driver's), every trace PyTorch recorded must still make the same segment calls
    // in the same order and reach the same peak.
    let Some(dir) = common::fixtures_dir() else { return };
    let folders = [dir.clone(), dir.parent().unwrap().join("h100-twins"), dir.parent().unwrap().join("predict-inputs")];
    let mut files: Vec<_> = folders
        .iter()
        .filter(|f| f.is_dir())
        .flat_map(|f| std::fs::read_dir(f).unwrap().filter_map(|e| Some(e.ok()?.path())))
        .filter(|p| p.extension().is_some_and(|x| x == "pickle"))
        .collect();
    files.sort();
    assert!(files.len() >= 7, "{} traces", files.len());
    let options = ReplayOptions { own_addresses: true, ..Default::default() };
    let mut replayed = 0;
    for path in &files {
        let snap = trace::load_file(path).unwrap();
        for r in replay_snapshot(&snap, &options, &mut |_, _| {}).unwrap() {
            let name = format!("{} device {}", path.file_name().unwrap().to_string_lossy(), r.device);
            assert_eq!(r.segment_alloc_match, 1.0, "{name}: {:?}", r.first_divergence);
            assert_eq!(r.recorded.segment_allocs, r.replayed.figures.segment_allocs, "{name}");
            assert_eq!(r.recorded.segment_frees, r.replayed.figures.segment_frees, "{name}");
            assert_eq!(r.recorded.peak_reserved_bytes, r.replayed.figures.peak_reserved_bytes, "{name}");
            // Only the final addresses differ, by design.
            assert!(r.first_divergence.as_ref().is_none_or(|d| d.event == r.events), "{name}: {:?}", r.first_divergence);
            replayed += usize::from(r.events > 0);
        }
    }
    assert!(replayed >= 6, "{replayed} traces with events");
}

#[test]
fn a_replay_counts_its_segment_calls_without_keeping_its_history() {
    // Without a replayed snapshot asked for, the allocator's history is counted and dropped
    // after each event (a 1 GB trace's history was a second 0.8 GB copy); the figures are
    // those of a replay that keeps it, including under settings that change the segment calls.
    for name in common::FIXTURES {
        let Some(path) = common::fixture(name) else { return };
        let snap = trace::load_file(&path).unwrap();
        for conf in [None, Some("expandable_segments:True"), Some("max_split_size_mb:20,garbage_collection_threshold:0.5")] {
            let config = conf.map(|c| AllocatorConfig::parse(c).unwrap());
            for device in snap.devices() {
                let counted = replay_device(&snap, device, &ReplayOptions { config: config.clone(), ..Default::default() }, &mut |_, _| {}).unwrap();
                let kept =
                    replay_device(&snap, device, &ReplayOptions { config: config.clone(), keep_snapshot: true, ..Default::default() }, &mut |_, _| {}).unwrap();
                let history = kept.snapshot.as_ref().unwrap().trace_of(device).to_vec();
                let count = |a: Action| history.iter().filter(|e| e.action == a).count();
                assert_eq!(counted.replayed.figures.segment_allocs, count(Action::SegmentAlloc), "{name} {conf:?}");
                assert_eq!(counted.replayed.figures.segment_maps, count(Action::SegmentMap), "{name} {conf:?}");
                assert_eq!(counted.replayed.figures.segment_frees, count(Action::SegmentFree), "{name} {conf:?}");
                assert_eq!(counted.replayed.figures.segment_unmaps, count(Action::SegmentUnmap), "{name} {conf:?}");
                assert_eq!(counted.segment_alloc_match, kept.segment_alloc_match, "{name} {conf:?}");
                assert_eq!(counted.replayed.figures, kept.replayed.figures, "{name} {conf:?}");
            }
        }
    }
}

#[test]
fn a_known_start_serves_only_the_trace_it_was_reconstructed_from() {
    // The doctor reconstructs a trace's start once for all its replays. The replays are those
    // that reconstruct it themselves; a copy of the snapshot, edited or not, and another device
    // reconstruct their own.
    for name in common::FIXTURES {
        let Some(path) = common::fixture(name) else { return };
        let snap = trace::load_file(&path).unwrap();
        for device in snap.devices() {
            let known = KnownStart::of(&snap, device).unwrap();
            assert!(known.of_trace(&snap, device).is_some(), "{name}");
            assert!(known.of_trace(&snap.clone(), device).is_none(), "{name}: a copy is another trace");
            assert!(snap.devices().iter().filter(|&&d| d != device).all(|&d| known.of_trace(&snap, d).is_none()), "{name}");
            for start in [StartMode::Recorded, StartMode::Replaced, StartMode::Empty] {
                let fresh = ReplayOptions { start, config: Some(AllocatorConfig::parse("expandable_segments:True").unwrap()), ..Default::default() };
                let reusing = ReplayOptions { known_start: Some(known.clone()), ..fresh.clone() };
                let a = replay_device(&snap, device, &fresh, &mut |_, _| {}).unwrap();
                let b = replay_device(&snap, device, &reusing, &mut |_, _| {}).unwrap();
                assert_eq!(serde_json::to_value(&a).unwrap(), serde_json::to_value(&b).unwrap(), "{name} device {device} {start:?}");
            }
            // The recorded figures, counted once per known start, are the whole trace's whatever
            // the replay: one stopped half way gives those of one that reads it all.
            let half = ReplayOptions { until: Some(snap.trace_of(device).len() / 2), known_start: Some(known.clone()), ..Default::default() };
            let alone = replay_device(&snap, device, &ReplayOptions::default(), &mut |_, _| {}).unwrap();
            assert_eq!(replay_device(&snap, device, &half, &mut |_, _| {}).unwrap().recorded, alone.recorded, "{name} device {device}");
            // An edited copy (its last entry gone) replayed with the original's known start is
            // replayed from its own.
            let mut edited = snap.clone();
            if edited.device_traces.get_mut(device as usize).and_then(|t| t.pop()).is_some() {
                let reusing = ReplayOptions { known_start: Some(known.clone()), ..Default::default() };
                let a = replay_device(&edited, device, &ReplayOptions::default(), &mut |_, _| {}).unwrap();
                let b = replay_device(&edited, device, &reusing, &mut |_, _| {}).unwrap();
                assert_eq!(serde_json::to_value(&a).unwrap(), serde_json::to_value(&b).unwrap(), "{name} device {device}, edited");
            }
        }
    }
}

/// The doctor skips a `max_split_size_mb` what-if whose limit nothing in the replay reached
/// (`Outcome::same_under_max_split`): on every real trace the repository carries, from the
/// recorded start and from the allocations live at the start placed afresh, under the file's
/// settings and each limit the doctor tries, where the rule says "the same", the replay gives
/// the same peaks; and the rule says so for some traces and not for others.
#[test]
fn a_max_split_size_above_every_segment_changes_no_decision() {
    use tensormem::doctor::Setup;
    let dir = std::path::Path::new(env!("CARGO_MANIFEST_DIR")).join("tests/data/real");
    let mut files: Vec<_> = std::fs::read_dir(&dir).unwrap().map(|e| e.unwrap().path()).filter(|p| p.extension().is_some_and(|x| x == "pickle")).collect();
    files.sort();
    let (mut same, mut replayed) = (0, 0);
    for path in &files {
        let snap = trace::load_file(path).unwrap();
        let own = tensormem::replay::recorded_config(&snap).unwrap();
        for (device, start) in snap.devices().into_iter().flat_map(|d| [(d, StartMode::Recorded), (d, StartMode::Replaced)]) {
            let setup = |extra: &str| Setup {
                alloc_conf: [own.raw.as_str(), extra].iter().filter(|s| !s.is_empty()).copied().collect::<Vec<_>>().join(","),
                start,
                capacity: None,
                known_start: None,
            };
            let before = setup("").replay(&snap, device).unwrap();
            let own_limit = AllocatorConfig::parse(&setup("").alloc_conf).unwrap().max_split_size;
            for mb in [128u64, 256, 512] {
                let name = format!("{} device {device} from the {} start, max_split_size_mb:{mb}", path.file_name().unwrap().to_string_lossy(), start.name());
                if !before.same_under_max_split(mb << 20, own_limit) {
                    replayed += 1;
                    continue;
                }
                let after = setup(&format!("max_split_size_mb:{mb}")).replay(&snap, device).unwrap();
                assert_eq!(
                    (after.peak_reserved, after.peak_allocated, after.out_of_memory, after.largest_segment),
                    (before.peak_reserved, before.peak_allocated, before.out_of_memory, before.largest_segment),
                    "{name}"
                );
                same += 1;
            }
        }
    }
    assert!(same >= 20 && replayed >= 10, "{same} limits above every segment, {replayed} below one");
}
