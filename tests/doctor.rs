//! The doctor on real PyTorch snapshots and on scenarios: what it finds, pinned to the bytes the
//! allocator's rules make exact, and every verified figure against a replay of its own.

mod common;

use common::doctor::{assert_replay_agrees, assert_well_formed, diagnose, finding, kinds, load};

use std::collections::BTreeMap;
use tensormem::doctor::{self, CAPACITY_RESOLUTION, DoctorError, DoctorOptions, Evidence, FindingConfidence, Setup, Verified};
use tensormem::replay::{self, ReplayOptions, StartMode};
use tensormem::scenarios::{self, RunRequest};
use tensormem::trace::{self, Snapshot};

#[test]
fn a_recorded_oom_gives_its_request_and_the_smallest_capacity_that_fits() {
    let Some(snapshot) = load("expandable-3gpu-oom.pickle") else { return };
    let d = diagnose(&snapshot, None);
    assert_eq!(kinds(&d), ["peak", "oom", "outside-allocator"]);
    // Device 1 is the one that failed: its trace entry 421 is PyTorch's oom entry.
    let peak = &d.findings[0];
    assert_eq!(peak.evidence.json()["device"], 1);
    assert_eq!(peak.evidence.json()["event"], 420);
    assert_eq!(peak.evidence.json()["phase"], "forward");
    assert_eq!(peak.bytes, 84_063_351_764, "the trace's own peak, as tensormem replay counts it");

    let oom = finding(&d, doctor::OOM);
    let e = &oom.evidence.json();
    assert_eq!(oom.bytes, 5_308_694_528, "the oom entry's size");
    assert_eq!((e["event"].as_u64(), e["source"].as_str()), (Some(421), Some("recorded")));
    assert_eq!(e["device_free_bytes"], 95_682_560u64);
    // Reserved just before the failure is the device's peak reserved (replay tests pin it).
    assert_eq!(e["reserved_bytes"], 84_202_749_952u64);
    // Capacity estimate: reserved plus device_free, said to be one.
    assert_eq!(e["capacity_bytes"], 84_202_749_952u64 + 95_682_560);
    assert_eq!(e["capacity_estimated"], true);
    assert!(oom.estimate.as_deref().is_some_and(|s| s.contains("estimate")));
    assert_eq!(e["reproduced_by_replay"], true, "at the estimated capacity the replay fails too");
    // The request needs 253 more 20 MiB pages of the expandable segment than were mapped.
    let smallest = e["smallest_capacity_bytes"].as_u64().unwrap();
    assert_eq!(smallest, 84_202_749_952 + 253 * 20 * 1024 * 1024);
    // The title sets what it needs against what it had, not against a card size.
    assert!(oom.title.contains("needs at least 83.36 GiB for PyTorch, 4.85 GiB more than the 78.51 GiB it had"), "{}", oom.title);
    assert_eq!(e["live"]["allocations"], 111);
    assert_eq!(e["live"]["bytes"], 84_063_351_764u64);

    // The search's answer fits, one step below does not: replayed here with the request added.
    let with_request = doctor::with_failed_request(&snapshot, 1, 421);
    let setup = Setup { alloc_conf: "expandable_segments:True".into(), start: StartMode::Recorded, capacity: Some(smallest), known_start: None };
    assert!(!setup.replay(&with_request, 1).unwrap().out_of_memory);
    let below = setup.with_capacity(Some(smallest - CAPACITY_RESOLUTION)).replay(&with_request, 1).unwrap();
    assert!(below.out_of_memory);
    assert_eq!(below.first_oom_event, Some(421), "the added request, in the oom entry's place");

    // Expandable segments are already on: the fix verified is the capacity.
    let v = oom.verified.as_ref().unwrap();
    assert_eq!((v.before_out_of_memory, v.after_out_of_memory, v.capacity), (true, false, Some(smallest)));
    assert!(v.command.is_none(), "the replayed trace has the request added: no tensormem replay command gives it");
    assert_replay_agrees(&with_request, 1, v);
    assert!(oom.fix.contains("already on"), "{}", oom.fix);
}

#[test]
fn a_trace_that_starts_mid_run_is_truncated() {
    let Some(snapshot) = load("gpt-medium-ctx128-training.pickle") else { return };
    let d = diagnose(&snapshot, None);
    assert_eq!(kinds(&d), ["peak", "optimizer-state", "truncated-trace", "outside-allocator"]);
    let r = replay::replay_device(&snapshot, 0, &ReplayOptions::default(), &mut |_, _| {}).unwrap();
    let t = finding(&d, doctor::TRUNCATED_TRACE);
    // Everything it reserves predates the trace (it maps no segment of its own).
    assert_eq!(t.bytes, r.start_reserved_bytes);
    assert_eq!(t.bytes, 7_235_174_400);
    assert_eq!(t.evidence.json()["start_allocated_bytes"], 5_095_321_600u64, "requested bytes of the 664 blocks live at the start");
    assert_eq!(t.evidence.json()["start_allocations"], 664);
    assert_eq!(t.evidence.json()["events"], 19_136);
    assert_eq!(t.evidence.json()["suggested_max_entries"], 50_000, "2 x 19,136 + 3 x 664, rounded up");
    assert!(t.fix.contains("_record_memory_history(max_entries=50000)"), "{}", t.fix);
    assert!(t.estimate.is_some());

    let peak = &d.findings[0];
    assert_eq!((peak.bytes, peak.evidence.json()["event"].as_u64()), (7_013_335_044, Some(9966)));
    assert_eq!(peak.bytes, r.recorded.peak_allocated_bytes);
    assert_eq!(peak.evidence.json()["phase"], "optimizer step");
}

#[test]
fn the_truncated_trace_fix_names_the_keyword_of_the_files_pytorch() {
    // finetune-legacy is in PyTorch 2.0/2.1's format (no times, no settings): its keyword was
    // trace_alloc_max_entries; gpt-medium's (2.5+) is max_entries.
    let Some(legacy) = load("finetune-legacy.pickle") else { return };
    let t = finding(&diagnose(&legacy, None), doctor::TRUNCATED_TRACE).clone();
    assert!(t.fix.contains("_record_memory_history(True, trace_alloc_max_entries=50000, trace_alloc_record_context=True)"), "{}", t.fix);
    let Some(recent) = load("gpt-medium-ctx128-training.pickle") else { return };
    let t = finding(&diagnose(&recent, None), doctor::TRUNCATED_TRACE).clone();
    assert!(t.fix.contains("_record_memory_history(max_entries=") && !t.fix.contains("trace_alloc"), "{}", t.fix);
}

#[test]
fn the_peak_fix_fits_the_program() {
    // Checkpointing is advice for a training step's activations, not for inference.
    let Some(inference) = load("gpt-medium-ctx128-inference.pickle") else { return };
    let fix = diagnose(&inference, None).findings[0].fix.clone();
    assert!(!fix.contains("checkpoint") && fix.contains("no backward"), "{fix}");
    let corpus = std::path::Path::new(env!("CARGO_MANIFEST_DIR")).join("tests/data/corpus");
    let training = trace::load_file(&corpus.join("grad-accumulation.pickle")).unwrap();
    let d = diagnose(&training, None);
    assert!(d.findings[0].fix.contains("checkpointing") || d.findings[0].fix.contains("optimizer"), "{}", d.findings[0].fix);
}

#[test]
fn windows_stacks_are_read_as_linux_ones() {
    // The corpus's discarded forward, its frames rewritten as a Windows machine records them
    // (C:\...\torch\nn\modules\module.py): the doctor finds the same missing no_grad.
    let corpus = std::path::Path::new(env!("CARGO_MANIFEST_DIR")).join("tests/data/corpus");
    let mut snapshot = trace::load_file(&corpus.join("discarded-forward-mistake.pickle")).unwrap();
    let windows = |f: &trace::Frame| trace::Frame { filename: format!("C:{}", f.filename.replace('/', "\\")), ..f.clone() };
    for entries in &mut snapshot.device_traces {
        entries.edit(|e| {
            if let Some(frames) = &e.frames {
                e.frames = Some(frames.iter().map(windows).collect::<Vec<_>>().into());
            }
        });
    }
    let read = trace::load(&trace::to_pickle(&snapshot)).unwrap();
    let frame = read.trace_of(0).iter().find_map(|e| e.frames.as_ref().and_then(|f| f.first().cloned())).unwrap();
    assert!(frame.filename.starts_with("C:/") && !frame.filename.contains('\\'), "{}", frame.filename);
    let d = diagnose(&read, None);
    assert_eq!(kinds(&d)[1], doctor::MISSING_NO_GRAD, "{:?}", kinds(&d));
}

#[test]
fn fragmentation_is_split_and_each_setting_verified_by_replay() {
    let Some(snapshot) = load("small-state.pickle") else { return };
    let d = diagnose(&snapshot, None);
    assert_eq!(kinds(&d), ["peak", "fragmentation", "outside-allocator"]);
    let f = finding(&d, doctor::FRAGMENTATION);
    let e = &f.evidence.json();
    // At the peak of reserved (3.52 GiB): 5 cached free blocks, and 1016 bytes of rounding.
    assert_eq!(e["reserved_bytes"], 3_781_165_056u64);
    assert_eq!(e["requested_bytes"], 3_249_143_816u64);
    assert_eq!(e["internal_bytes"], 1016);
    assert_eq!(e["external_bytes"], 3_781_165_056u64 - 3_249_144_832);
    // Its bytes are what the best setting recovers (the gap is 507.37 MiB; 492 MiB of it closes).
    assert_eq!(f.bytes, 3_781_165_056 - 3_265_265_664);
    assert_eq!(e["free_blocks"], 5);
    // The trace starts empty: replays start as recorded, so "before" is the file's own peak.
    let v = f.verified.as_ref().unwrap();
    assert_eq!((v.alloc_conf.as_str(), v.start.as_str()), ("max_split_size_mb:128", "recorded"));
    assert_eq!((v.before_peak_reserved_bytes, v.after_peak_reserved_bytes), (3_781_165_056, 3_265_265_664));
    assert!(f.title.contains("max_split_size_mb:128 would reserve 492.00 MiB less"), "{}", f.title);
    let what_ifs: Vec<Verified> = serde_json::from_value(e["what_ifs"].clone()).unwrap();
    let tried: Vec<(&str, u64)> = what_ifs.iter().map(|w| (w.alloc_conf.as_str(), w.after_peak_reserved_bytes)).collect();
    // Expandable segments reserve more here; max_split_size_mb:128 is the best of the splits.
    assert_eq!(
        tried,
        [
            ("expandable_segments:True", 3_797_942_272),
            ("max_split_size_mb:128", 3_265_265_664),
            ("max_split_size_mb:256", 3_265_265_664),
            ("max_split_size_mb:512", 3_265_265_664)
        ]
    );
    for w in &what_ifs {
        assert_replay_agrees(&snapshot, 0, w);
    }
}

#[test]
fn a_trace_that_starts_with_memory_reserved_is_verified_from_a_replaced_start() {
    let Some(snapshot) = load("eor-nn-legacy-with-snapshots.pickle") else { return };
    let d = diagnose(&snapshot, None);
    assert_eq!(kinds(&d), ["peak", "optimizer-state", "fragmentation", "truncated-trace", "outside-allocator"]);
    let f = finding(&d, doctor::FRAGMENTATION);
    // What expandable segments recover, not the whole gap (134,217,728 - 108,258,676 bytes).
    assert_eq!(f.bytes, 134_217_728 - 113_246_208);
    let v = f.verified.as_ref().unwrap();
    assert_eq!(v.start, "replaced");
    assert_eq!((v.alloc_conf.as_str(), v.before_peak_reserved_bytes, v.after_peak_reserved_bytes), ("expandable_segments:True", 134_217_728, 113_246_208));
    assert!(f.estimate.as_deref().is_some_and(|s| s.contains("placed afresh")));
    // Figures from another start than the recorded one: medium, and said why.
    assert_eq!(f.confidence, FindingConfidence::Medium);
    assert!(f.confidence_reason.as_deref().is_some_and(|r| r.contains("mid-run")));
    for w in serde_json::from_value::<Vec<Verified>>(f.evidence.json()["what_ifs"].clone()).unwrap() {
        assert_replay_agrees(&snapshot, 0, &w);
    }
}

#[test]
fn a_capacity_too_small_gives_an_oom_found_by_replay() {
    let Some(snapshot) = load("small-state.pickle") else { return };
    let d = diagnose(&snapshot, Some(3 << 30));
    let oom = finding(&d, doctor::OOM);
    assert_eq!(oom.evidence.json()["source"], "replayed");
    assert_eq!(oom.evidence.json()["capacity_bytes"], 3u64 << 30);
    // As `tensormem replay --capacity 3GiB` reports: its first out-of-memory is at event 50, with
    // 2,707,423,232 bytes reserved (its peak).
    assert_eq!(oom.evidence.json()["event"], 50);
    assert_eq!(oom.evidence.json()["reserved_bytes"], 2_707_423_232u64);
    assert_eq!(oom.bytes, snapshot.trace_of(0).at(50).size, "the request is the alloc that failed");
    assert_eq!(oom.bytes, 512 << 20);
    // With the file's settings the trace needs exactly the peak it reserved.
    let smallest = oom.evidence.json()["smallest_capacity_bytes"].as_u64().unwrap();
    assert_eq!(smallest, 3_781_165_056);
    let setup = Setup { alloc_conf: String::new(), start: StartMode::Recorded, capacity: Some(smallest), known_start: None };
    assert!(!setup.replay(&snapshot, 0).unwrap().out_of_memory);
    assert!(setup.with_capacity(Some(smallest - CAPACITY_RESOLUTION)).replay(&snapshot, 0).unwrap().out_of_memory);
    // The file's own trace: its command reproduces the verified figures.
    let v = oom.verified.as_ref().unwrap();
    assert!(v.command.is_some());
    assert!(v.before_out_of_memory && !v.after_out_of_memory);
    assert_replay_agrees(&snapshot, 0, v);
    // At the smallest capacity the file needs nothing is wrong.
    assert!(!kinds(&diagnose(&snapshot, Some(smallest))).contains(&doctor::OOM));
}

#[test]
fn every_fixture_gives_the_peak_first_then_problems_by_bytes() {
    let Some(dir) = common::fixtures_dir() else { return };
    let expected: BTreeMap<&str, &[&str]> = BTreeMap::from([
        // Adam's state for the one 7.5 MiB tensor it optimises (made at the first of 10 steps);
        // its grads are freed by zero_grad each step (the 8.12 MiB cuBLAS workspace that the
        // autograd thread's first matmul makes is not a gradient).
        ("eor-nn-legacy-with-snapshots.pickle", &["peak", "optimizer-state", "fragmentation", "truncated-trace", "outside-allocator"][..]),
        ("expandable-3gpu-oom.pickle", &["peak", "oom", "outside-allocator"]),
        ("finetune-legacy.pickle", &["peak", "fragmentation", "truncated-trace", "outside-allocator"]),
        ("gpt-ctx128-forward.pickle", &["peak", "truncated-trace", "missing-no-grad", "outside-allocator"]),
        ("gpt-medium-ctx128-inference.pickle", &["peak", "truncated-trace", "outside-allocator"]),
        ("gpt-medium-ctx256-inference.pickle", &["peak", "truncated-trace", "outside-allocator"]),
        ("gpt-medium-ctx128-training.pickle", &["peak", "optimizer-state", "truncated-trace", "outside-allocator"]),
        ("lm2.7b-ctx128-fullstep.pickle", &["peak", "optimizer-state", "fragmentation", "truncated-trace", "outside-allocator"]),
        // Fragmentation ranks by what a setting recovers (4.13 GiB), below the optimizer's state.
        ("lm2.7b-ctx256-fullstep.pickle", &["peak", "optimizer-state", "fragmentation", "truncated-trace", "outside-allocator"]),
        ("small-state.pickle", &["peak", "fragmentation", "outside-allocator"]),
        // No history: an empty trace and no stacks (issue 50, cause 4).
        ("tiny-settings.pickle", &["no-history", "peak", "outside-allocator"]),
    ]);
    let mut names: Vec<_> =
        std::fs::read_dir(&dir).unwrap().filter_map(|e| e.ok()?.file_name().into_string().ok()).filter(|n| n.ends_with(".pickle")).collect();
    names.sort();
    for name in &names {
        let snapshot = trace::load_file(&dir.join(name)).unwrap();
        let d = diagnose(&snapshot, None);
        assert_well_formed(name, &d);
        if let Some(kinds_expected) = expected.get(name.as_str()) {
            assert_eq!(kinds(&d), *kinds_expected, "{name}");
        }
        // No real snapshot here leaks: flat loops (eor-nn's 10 steps) show no growth.
        assert!(!kinds(&d).contains(&doctor::GROWTH), "{name}");
    }
    assert!(names.len() >= expected.len());
}

fn run(scenario: &str, variant: Option<&str>) -> scenarios::RunResult {
    let request = RunRequest { scenario: scenario.into(), variant: variant.map(str::to_string), ..Default::default() };
    scenarios::run(&request).unwrap()
}

#[test]
fn scenarios_are_diagnosed_from_their_trace_alone() {
    // The mistake fragments the cache, and expandable segments (its fix) are verified to help.
    let mistake = run("variable-batch", Some("mistake"));
    let d = diagnose(&mistake.snapshot, None);
    assert_well_formed("variable-batch mistake", &d);
    assert_eq!(kinds(&d), ["peak", "fragmentation", "temporaries", "outside-allocator"]);
    // The live tensors at the peak and the main thread's cuBLAS workspace (32 MiB on an H100).
    assert_eq!(d.findings[0].bytes, 394_264_576 + (32 << 20));
    // At the peak (the batch of 40), fc1's output (40 x 128 tokens x 4 x 1024 float32) waits
    // for the activation made from it: the same in both variants.
    let temporaries = finding(&d, doctor::TEMPORARIES);
    assert_eq!(temporaries.bytes, 40 * 128 * 4 * 1024 * 4);
    assert_eq!(temporaries.evidence.json()["temporary_bytes"], 40 * 128 * 4 * 1024 * 4);
    assert_eq!(d.findings[0].evidence.json()["live"]["by_group"][0]["kind"], "parameter", "tensormem's traces carry categories");
    let v = finding(&d, doctor::FRAGMENTATION).verified.as_ref().unwrap();
    assert_eq!(v.alloc_conf, "expandable_segments:True");
    assert!(v.after_peak_reserved_bytes < v.before_peak_reserved_bytes);
    assert_eq!(v.before_peak_reserved_bytes, mistake.peak_reserved_bytes, "a trace recorded from the start replays to its own peak");
    assert_replay_agrees(&mistake.snapshot, 0, v);
    let fix = run("variable-batch", Some("fix"));
    let d = diagnose(&fix.snapshot, None);
    assert_well_formed("variable-batch fix", &d);
    assert_eq!(kinds(&d), ["peak", "temporaries", "outside-allocator"]);

    // The 7B model on an 80 GB card: the run's own out-of-memory error, on the card it ran on.
    let oom_run = run("oom", None);
    let d = diagnose(&oom_run.snapshot, None);
    assert_well_formed("oom", &d);
    let oom = finding(&d, doctor::OOM);
    assert_eq!(oom.bytes, 172 << 20);
    assert!(oom_run.out_of_memory.as_deref().is_some_and(|e| e.contains("Tried to allocate 172.00 MiB")));
    assert_eq!(oom.evidence.json()["capacity_bytes"], oom_run.capacity_bytes, "reserved plus device_free is the whole card");
}

#[test]
fn a_forward_with_grad_on_and_no_backward_is_missing_no_grad() {
    let Some(snapshot) = load("gpt-ctx128-forward.pickle") else { return };
    let d = diagnose(&snapshot, None);
    let m = finding(&d, doctor::MISSING_NO_GRAD);
    let e = &m.evidence.json();
    // A torch.compile'd forward run as an autograd.Function (its training graph, which returns
    // the tensors saved for backward): everything the trace made is still live at its end; all
    // of it is held but the last allocation (the logits, 20,480,000 bytes) and cuBLAS's workspace.
    // One forward, dumped with its graph alive: a backward after the dump would have needed it,
    // so the finding is inconclusive (listed after the problems).
    assert!(e["grad_mode_evidence"].as_str().unwrap().contains("torch/autograd/function.py"));
    assert_eq!(m.confidence, FindingConfidence::Inconclusive);
    assert!(m.confidence_reason.as_deref().is_some_and(|r| r.contains("where the trace ends")), "{:?}", m.confidence_reason);
    assert_eq!(e["forwards_held_to_the_end"], 1);
    assert_eq!((e["iterations"].as_u64(), e["position"].as_u64()), (Some(1), Some(8227)));
    assert_eq!(m.bytes, 3_920_136_192);
    let mut live = std::collections::HashMap::new();
    for e in snapshot.trace_of(0) {
        match e.action {
            trace::Action::Alloc => drop(live.insert(e.addr, e.size)),
            trace::Action::FreeCompleted => drop(live.remove(&e.addr)),
            _ => {}
        }
    }
    let made_in_trace: u64 = live.values().sum();
    assert_eq!(made_in_trace - m.bytes, 20_480_000 + (32 << 20), "the logits and cuBLAS's 32 MiB workspace (trace entry 2101)");
    assert!(m.estimate.is_some());
    // Under no_grad (the inference snapshots) the same model holds nothing between forwards.
    for name in ["gpt-medium-ctx128-inference.pickle", "gpt-medium-ctx256-inference.pickle"] {
        let Some(snapshot) = load(name) else { return };
        assert!(!kinds(&diagnose(&snapshot, None)).contains(&doctor::MISSING_NO_GRAD), "{name}");
    }
}

#[test]
fn an_optimizer_that_makes_new_moments_every_step_is_seen() {
    let Some(snapshot) = load("gpt-medium-ctx128-training.pickle") else { return };
    let d = diagnose(&snapshot, None);
    let o = finding(&d, doctor::OPTIMIZER_STATE);
    let e = &o.evidence.json();
    // cs336's AdamW computes m and v out of place: the step makes 3.15 GiB of state and frees
    // 3.08 GiB made before the trace (the previous step's moments).
    assert_eq!(e["state_bytes"], 3_385_466_880u64);
    assert_eq!(e["replaced_per_step"][0], 3_303_546_880u64);
    assert_eq!(e["made_anew_each_step"], true);
    assert_eq!(e["temporaries_peak_bytes"], 122_880_000);
    assert_eq!(o.bytes, 3_385_466_880 + 122_880_000);
    assert!(o.fix.contains("in-place"), "{}", o.fix);
    // A whole first step (the 2.7B model from the start): the state is made, not replaced.
    let Some(snapshot) = load("lm2.7b-ctx128-fullstep.pickle") else { return };
    let o = finding(&diagnose(&snapshot, None), doctor::OPTIMIZER_STATE).clone();
    assert_eq!((o.evidence.json()["made_anew_each_step"].as_bool(), o.evidence.json()["state_bytes"].as_u64()), (Some(false), Some(27_254_476_800)));
}

#[test]
fn errors_are_values() {
    let Some(snapshot) = load("small-state.pickle") else { return };
    let err = doctor::diagnose(&snapshot, &DoctorOptions { device: Some(3), capacity: None, ..Default::default() }).unwrap_err();
    assert!(matches!(err, DoctorError::Replay(replay::ReplayError::NoSuchDevice(3, _))), "{err}");
    assert!(err.to_string().contains("devices present: 0"), "{err}");
    assert!(matches!(doctor::diagnose(&Snapshot::default(), &DoctorOptions::default()), Err(DoctorError::Empty)));
}

#[test]
fn what_nvidia_smi_shows_beyond_reserved_is_estimated_and_the_cublas_workspaces_listed() {
    let Some(snapshot) = load("gpt-medium-ctx128-training.pickle") else { return };
    let d = diagnose(&snapshot, None);
    assert_well_formed("gpt-medium-ctx128-training", &d);
    let f = finding(&d, doctor::OUTSIDE_ALLOCATOR);
    assert!(f.bytes > 0 && f.estimate.as_deref().is_some_and(|e| e.contains("CUDA context")), "{f:?}");
    assert!(f.title.starts_with("nvidia-smi will show about ") && f.title.contains("CUDA context"), "{}", f.title);
    let e = &f.evidence.json();
    assert_eq!(e["outside_bytes"], f.bytes);
    assert!(e["cuda_context"]["low_bytes"].as_u64() < e["cuda_context"]["high_bytes"].as_u64());
    let workspaces: Vec<(u64, u64, bool)> = e["cublas_workspaces"]
        .as_array()
        .unwrap()
        .iter()
        .map(|w| (w["trace_index"].as_u64().unwrap(), w["bytes"].as_u64().unwrap(), w["backward"].as_bool().unwrap()))
        .collect();
    // The trace starts mid-run: its cuBLAS workspaces were made before it, so no `alloc` entry
    // names `getNewWorkspace`; two stackless blocks of PyTorch's default size per handle
    // (forward's thread and autograd's) are there from the start.
    assert_eq!(workspaces, []);
    assert_eq!(e["cublas_workspace_bytes"], 0);
    let likely: Vec<u64> = e["likely_cublas_workspaces_before_trace"].as_array().unwrap().iter().map(|w| w["bytes"].as_u64().unwrap()).collect();
    assert_eq!(likely, [8_519_680, 8_519_680]);
    assert!(f.title.contains("2 blocks from before the trace (16.25 MiB) are likely cuBLAS workspaces"), "{}", f.title);
    assert!(e.get("nccl").is_none(), "one card, no NCCL");

    // A trace recorded from the start shows its workspaces' own `alloc` entries.
    let Some(snapshot) = load("eor-nn-legacy-with-snapshots.pickle") else { return };
    let d = diagnose(&snapshot, None);
    let e = &finding(&d, doctor::OUTSIDE_ALLOCATOR).evidence.json();
    let workspaces: Vec<(u64, u64, bool)> = e["cublas_workspaces"]
        .as_array()
        .unwrap()
        .iter()
        .map(|w| (w["trace_index"].as_u64().unwrap(), w["bytes"].as_u64().unwrap(), w["backward"].as_bool().unwrap()))
        .collect();
    // Backward's first matmul, on autograd's thread: a handle and a workspace of its own; the
    // forward thread's was made before recording started.
    assert_eq!(workspaces, [(209, 8_519_680, true)]);
    assert_eq!(e["cublas_workspace_bytes"], 8_519_680);
    assert_eq!(e["likely_cublas_workspaces_before_trace"][0]["bytes"], 8_519_680);
    assert_eq!(e["likely_cublas_workspaces_before_trace"].as_array().map(Vec::len), Some(1));
}

#[test]
fn a_tensormem_scenario_shows_its_cublas_workspace_as_pytorch_records_it() {
    // Inference: one workspace, the main thread's, made by the first matmul and recorded with
    // its stack, as PyTorch records `at::cuda::getNewWorkspace`.
    let d = diagnose(&run("variable-batch", Some("mistake")).snapshot, None);
    let f = finding(&d, doctor::OUTSIDE_ALLOCATOR);
    let Evidence::OutsideAllocator(e) = &f.evidence else { panic!("{:?}", f.evidence) };
    assert_eq!(e.cublas_workspaces.len(), 1);
    assert_eq!((e.cublas_workspaces[0].bytes, e.cublas_workspaces[0].backward), (32 << 20, false));
    assert_eq!(e.cublas_workspace_bytes, 32 << 20);
    assert!(e.likely_cublas_workspaces_before_trace.is_empty());
    assert!(f.bytes > 0 && f.estimate.is_some() && f.title.contains("cuBLAS"), "{}", f.title);
}

/// The hostile shapes of issue 30: allocations freed oldest first (the layout used to grow with
/// their square) and entries sharing one deep stack (read once per entry, it took minutes). The
/// doctor reads lifetimes and reads each distinct stack once: it answers, with the peak exact.
#[test]
fn the_doctor_answers_on_queues_windows_and_shared_deep_stacks() {
    for (name, snap, peak) in [
        ("queue", common::shapes::queue(40_000, true), 40_000 * 512),
        ("window", common::shapes::window(100_000, 2_000), 2_001 * 512),
        ("shared stack", common::shapes::shared_stack(20_000, 2_000), 512),
    ] {
        let d = diagnose(&snap, None);
        let first = &d.findings[0];
        assert_eq!((first.kind.as_str(), first.bytes), ("peak", peak), "{name}: {}", first.title);
    }
}

/// The page's worker hands the doctor the timeline it drew (bands laid out, no curves) instead of
/// letting it lay the trace out again: the findings are the same, byte for byte, on every real
/// snapshot and on a scenario grouped by its recorded categories. A timeline of another
/// snapshot or device is not used.
#[test]
fn the_doctor_reading_the_pages_timeline_finds_what_it_finds_alone() {
    let mut snapshots: Vec<(String, Snapshot)> = Vec::new();
    if let Some(dir) = common::fixtures_dir() {
        let mut names: Vec<_> =
            std::fs::read_dir(&dir).unwrap().filter_map(|e| e.ok()?.file_name().into_string().ok()).filter(|n| n.ends_with(".pickle")).collect();
        names.sort();
        snapshots.extend(names.into_iter().map(|n| (n.clone(), trace::load_file(&dir.join(&n)).unwrap())));
    }
    let lm = common::run_scenario("lm-train", &[("steps", "3")]);
    snapshots.push(("lm-train".into(), lm.snapshot.clone()));
    let other = common::run_scenario("zero-grad", &[]).snapshot;
    for (name, snapshot) in &snapshots {
        let Some(device) = snapshot.pick_device() else { continue };
        let known = replay::KnownStart::of(snapshot, device).unwrap();
        let options = DoctorOptions { device: Some(device), capacity: None, known_start: Some(known.clone()) };
        let alone = serde_json::to_string(&doctor::diagnose(snapshot, &options).unwrap()).unwrap();
        let drawn = tensormem::timeline::build_without_curves_from(snapshot, device, &known).unwrap();
        assert!(drawn.allocated.is_empty(), "{name}: the page's timeline has no curves");
        let reading = doctor::diagnose_laid_out(snapshot, &options, &[], Some(&drawn)).unwrap();
        assert_eq!(serde_json::to_string(&reading).unwrap(), alone, "{name}");
        // It is the timeline read: groups renamed in it are named in the findings.
        let mut renamed = drawn.clone();
        renamed.groups.iter_mut().for_each(|g| g.name.insert_str(0, "renamed "));
        let reading = serde_json::to_string(&doctor::diagnose_laid_out(snapshot, &options, &[], Some(&renamed)).unwrap()).unwrap();
        if name == "lm-train" {
            assert!(reading.contains("renamed ") && !alone.contains("renamed "), "{reading}");
        }
        // Another snapshot's timeline (a different trace) is laid aside.
        let Some(other_device) = other.pick_device() else { continue };
        let foreign = tensormem::timeline::build_without_curves(&other, other_device).unwrap();
        if foreign.events != snapshot.trace_of(device).len() {
            let reading = doctor::diagnose_laid_out(snapshot, &options, &[], Some(&foreign)).unwrap();
            assert_eq!(serde_json::to_string(&reading).unwrap(), alone, "{name}, with another trace's timeline");
        }
    }
    assert!(snapshots.len() > 1);
}
