//! The doctor on real PyTorch snapshots and on scenarios: what it finds, pinned to the bytes the
//! allocator's rules make exact, and every verified figure against a replay of its own.

mod common;

use serde_json::Value;
use std::collections::BTreeMap;
use tensormem::alloc::AllocatorConfig;
use tensormem::doctor::{self, CAPACITY_RESOLUTION, Diagnosis, DoctorError, DoctorOptions, Finding, FindingConfidence, Setup, Verified};
use tensormem::replay::{self, ReplayOptions, StartMode};
use tensormem::scenarios::{self, RunRequest};
use tensormem::trace::{self, Snapshot};

fn load(name: &str) -> Option<Snapshot> {
    Some(trace::load_file(&common::fixture(name)?).unwrap())
}

fn diagnose(snapshot: &Snapshot, capacity: Option<u64>) -> Diagnosis {
    doctor::diagnose(snapshot, &DoctorOptions { device: None, capacity, ..Default::default() }).unwrap()
}

fn kinds(d: &Diagnosis) -> Vec<&str> {
    d.findings.iter().map(|f| f.kind.as_str()).collect()
}

fn finding<'a>(d: &'a Diagnosis, kind: &str) -> &'a Finding {
    d.findings.iter().find(|f| f.kind == kind).unwrap_or_else(|| panic!("no {kind} finding in {:?}", kinds(d)))
}

fn start(text: &str) -> StartMode {
    StartMode::parse(text).unwrap()
}

/// A verified figure is a replay's: the same settings, start and capacity give the same peaks.
fn assert_replay_agrees(snapshot: &Snapshot, device: i64, v: &Verified) {
    let options =
        ReplayOptions { config: Some(AllocatorConfig::parse(&v.alloc_conf).unwrap()), capacity: v.capacity, start: start(&v.start), ..Default::default() };
    let r = replay::replay_device(snapshot, device, &options, &mut |_, _| {}).unwrap();
    assert_eq!(r.replayed.figures.peak_reserved_bytes, v.after_peak_reserved_bytes, "{}", v.how);
    assert_eq!(r.replayed.figures.peak_allocated_bytes, v.after_peak_allocated_bytes, "{}", v.how);
    assert_eq!(r.replayed.ooms > 0, v.after_out_of_memory, "{}", v.how);
}

/// The `peak` finding first (after `no-history` for a file without one), exactly once, then the
/// problems by bytes at stake, then `outside-allocator` (information, always last); JSON
/// round-trips.
fn assert_well_formed(name: &str, d: &Diagnosis) {
    let d = &Diagnosis { findings: d.findings.iter().filter(|f| f.kind != doctor::NO_HISTORY).cloned().collect(), notes: d.notes.clone() };
    assert_eq!(d.findings.first().map(|f| f.kind.as_str()), Some(doctor::PEAK), "{name}");
    assert_eq!(kinds(d).iter().filter(|&&k| k == doctor::PEAK).count(), 1, "{name}");
    assert_eq!(d.findings.last().map(|f| f.kind.as_str()), Some(doctor::OUTSIDE_ALLOCATOR), "{name}");
    assert_eq!(kinds(d).iter().filter(|&&k| k == doctor::OUTSIDE_ALLOCATOR).count(), 1, "{name}");
    // Problems by bytes, then the inconclusive findings (never ranked among them).
    let middle = &d.findings[1..d.findings.len() - 1];
    let problems: Vec<&Finding> = middle.iter().filter(|f| !f.is_inconclusive()).collect();
    let oom = problems.iter().position(|f| f.kind == doctor::OOM);
    assert!(oom.is_none_or(|i| i == 0), "{name}: an out-of-memory error comes first");
    // Memory from before the trace is about the recording: it comes after the program's problems.
    let truncated = problems.iter().position(|f| f.kind == doctor::TRUNCATED_TRACE);
    assert!(truncated.is_none_or(|i| i == problems.len() - 1), "{name}: truncated-trace after the program's problems");
    let bytes: Vec<u64> = problems.iter().filter(|f| f.kind != doctor::OOM && f.kind != doctor::TRUNCATED_TRACE).map(|f| f.bytes).collect();
    assert!(bytes.windows(2).all(|w| w[0] >= w[1]), "{name}: problems not ranked by bytes: {bytes:?}");
    assert!(middle.windows(2).all(|w| !w[0].is_inconclusive() || w[1].is_inconclusive()), "{name}: an inconclusive finding ranked among the problems");
    for f in &d.findings {
        assert_eq!(f.confidence_reason.is_some(), f.confidence != FindingConfidence::High, "{name}: {} says why it is not high exactly when it is not", f.kind);
    }
    for f in &d.findings {
        assert!(doctor::KINDS.contains(&f.kind.as_str()), "{name}: {}", f.kind);
        assert!(!f.title.contains('\n') && !f.why.is_empty() && !f.fix.is_empty(), "{name}: {f:?}");
    }
    let json = serde_json::to_string(d).unwrap();
    let back: Diagnosis = serde_json::from_str(&json).unwrap();
    assert_eq!(&back, d, "{name}");
    let value: Value = serde_json::from_str(&json).unwrap();
    assert!(value["findings"].is_array(), "{name}");
}

#[test]
fn a_recorded_oom_gives_its_request_and_the_smallest_capacity_that_fits() {
    let Some(snapshot) = load("expandable-3gpu-oom.pickle") else { return };
    let d = diagnose(&snapshot, None);
    assert_eq!(kinds(&d), ["peak", "oom", "outside-allocator"]);
    // Device 1 is the one that failed: its trace entry 421 is PyTorch's oom entry.
    let peak = &d.findings[0];
    assert_eq!(peak.evidence["device"], 1);
    assert_eq!(peak.evidence["event"], 420);
    assert_eq!(peak.evidence["phase"], "forward");
    assert_eq!(peak.bytes, 84_063_351_764, "the trace's own peak, as tensormem replay counts it");

    let oom = finding(&d, doctor::OOM);
    let e = &oom.evidence;
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
    assert_eq!(t.evidence["start_allocated_bytes"], 5_095_321_600u64, "requested bytes of the 664 blocks live at the start");
    assert_eq!(t.evidence["start_allocations"], 664);
    assert_eq!(t.evidence["events"], 19_136);
    assert_eq!(t.evidence["suggested_max_entries"], 50_000, "2 x 19,136 + 3 x 664, rounded up");
    assert!(t.fix.contains("_record_memory_history(max_entries=50000)"), "{}", t.fix);
    assert!(t.estimate.is_some());

    let peak = &d.findings[0];
    assert_eq!((peak.bytes, peak.evidence["event"].as_u64()), (7_013_335_044, Some(9966)));
    assert_eq!(peak.bytes, r.recorded.peak_allocated_bytes);
    assert_eq!(peak.evidence["phase"], "optimizer step");
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
        for e in entries.iter_mut() {
            if let Some(frames) = &e.frames {
                e.frames = Some(frames.iter().map(windows).collect::<Vec<_>>().into());
            }
        }
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
    let e = &f.evidence;
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
    for w in serde_json::from_value::<Vec<Verified>>(f.evidence["what_ifs"].clone()).unwrap() {
        assert_replay_agrees(&snapshot, 0, &w);
    }
}

#[test]
fn a_capacity_too_small_gives_an_oom_found_by_replay() {
    let Some(snapshot) = load("small-state.pickle") else { return };
    let d = diagnose(&snapshot, Some(3 << 30));
    let oom = finding(&d, doctor::OOM);
    assert_eq!(oom.evidence["source"], "replayed");
    assert_eq!(oom.evidence["capacity_bytes"], 3u64 << 30);
    // As `tensormem replay --capacity 3GiB` reports: its first out-of-memory is at event 50, with
    // 2,707,423,232 bytes reserved (its peak).
    assert_eq!(oom.evidence["event"], 50);
    assert_eq!(oom.evidence["reserved_bytes"], 2_707_423_232u64);
    assert_eq!(oom.bytes, snapshot.trace_of(0)[50].size, "the request is the alloc that failed");
    assert_eq!(oom.bytes, 512 << 20);
    // With the file's settings the trace needs exactly the peak it reserved.
    let smallest = oom.evidence["smallest_capacity_bytes"].as_u64().unwrap();
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
    assert_eq!(temporaries.evidence["temporary_bytes"], 40 * 128 * 4 * 1024 * 4);
    assert_eq!(d.findings[0].evidence["live"]["by_group"][0]["kind"], "parameter", "tensormem's traces carry categories");
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
    assert_eq!(oom.evidence["capacity_bytes"], oom_run.capacity_bytes, "reserved plus device_free is the whole card");
}

#[test]
fn a_forward_with_grad_on_and_no_backward_is_missing_no_grad() {
    let Some(snapshot) = load("gpt-ctx128-forward.pickle") else { return };
    let d = diagnose(&snapshot, None);
    let m = finding(&d, doctor::MISSING_NO_GRAD);
    let e = &m.evidence;
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
    let e = &o.evidence;
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
    assert_eq!((o.evidence["made_anew_each_step"].as_bool(), o.evidence["state_bytes"].as_u64()), (Some(false), Some(27_254_476_800)));
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
    let e = &f.evidence;
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
    let e = &finding(&d, doctor::OUTSIDE_ALLOCATOR).evidence;
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
    let workspaces = f.evidence["cublas_workspaces"].as_array().unwrap();
    assert_eq!(workspaces.len(), 1);
    assert_eq!((workspaces[0]["bytes"].as_u64(), workspaces[0]["backward"].as_bool()), (Some(32 << 20), Some(false)));
    assert_eq!(f.evidence["cublas_workspace_bytes"], 32 << 20);
    assert_eq!(f.evidence["likely_cublas_workspaces_before_trace"].as_array().map(Vec::len), Some(0));
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

/// A Python-stacked trace built with the allocator: stacks are (file, function) frames,
/// innermost first, under PyTorch's files where they name `torch/`.
fn python_stack(frames: &[(&str, &str)]) -> trace::Frames {
    let frame = |(file, name): &(&str, &str)| trace::Frame {
        filename: if file.starts_with("torch/") { format!("/usr/lib/python3.12/site-packages/{file}") } else { format!("/home/user/{file}") },
        line: 1,
        name: name.to_string(),
    };
    frames.iter().map(frame).collect::<Vec<_>>().into()
}

/// Four training steps of a model of four 4 MiB parameters, recorded as PyTorch records a loop
/// with Python stacks; `step(allocator, parameters, first)` runs inside the step's range (a
/// torch.optim.Optimizer subclass of the user's own, `my_sgd.py`).
fn hand_written_training(mut step: impl FnMut(&mut tensormem::alloc::VirtualAllocator, &mut Vec<u64>, &trace::Frames, bool)) -> Snapshot {
    use tensormem::alloc::{RecordContext, TimeSource, VirtualAllocator};
    const MIB: u64 = 1 << 20;
    let init = python_stack(&[("torch/nn/modules/linear.py", "__init__"), ("train.py", "<module>")]);
    let forward = python_stack(&[("torch/nn/modules/linear.py", "forward"), ("torch/nn/modules/module.py", "_call_impl"), ("train.py", "<module>")]);
    let backward = python_stack(&[("torch/autograd/__init__.py", "backward"), ("train.py", "<module>")]);
    let in_step = python_stack(&[("my_sgd.py", "step"), ("torch/optim/optimizer.py", "wrapper"), ("train.py", "<module>")]);
    let mut a = VirtualAllocator::virtual_with(AllocatorConfig::default());
    a.record_memory_history(true, RecordContext::All, 1 << 16);
    a.history_mut().set_time_source(TimeSource::modelled());
    let mut params: Vec<u64> = (0..4).map(|_| a.malloc(4 * MIB, 0, Some(init.clone())).unwrap().ptr).collect();
    for k in 0..4 {
        let activations: Vec<u64> = (0..4).map(|_| a.malloc(8 * MIB, 0, Some(forward.clone())).unwrap().ptr).collect();
        let grads: Vec<u64> = (0..4).map(|_| a.malloc(4 * MIB, 0, Some(backward.clone())).unwrap().ptr).collect();
        for ptr in activations {
            a.free(ptr, None).unwrap();
        }
        a.history_mut().annotate("Optimizer.step#MySGD.step", true, 0);
        step(&mut a, &mut params, &in_step, k == 0);
        a.history_mut().annotate("Optimizer.step#MySGD.step", false, 0);
        for ptr in grads {
            a.free(ptr, None).unwrap();
        }
    }
    a.snapshot()
}

#[test]
fn parameters_a_hand_written_step_makes_anew_are_not_state() {
    const MIB: u64 = 1 << 20;
    // `p.data = p.data - lr * p.grad`: each step makes the four parameters anew (16 MiB) and
    // frees the old ones; that is not state.
    let remade = hand_written_training(|a, params, stack, _| {
        for p in params.iter_mut() {
            let update = a.malloc(4 * MIB, 0, Some(stack.clone())).unwrap().ptr;
            let new = a.malloc(4 * MIB, 0, Some(stack.clone())).unwrap().ptr;
            a.free(update, None).unwrap();
            a.free(*p, None).unwrap();
            *p = new;
        }
    });
    let d = diagnose(&remade, None);
    assert_well_formed("hand-written step", &d);
    assert!(!kinds(&d).contains(&doctor::OPTIMIZER_STATE), "{:?}", d.findings.iter().map(|f| &f.title).collect::<Vec<_>>());
    // The same step keeping momentum buffers (made at the first step, kept) has state.
    let mut buffers = Vec::new();
    let momentum = hand_written_training(|a, _, stack, first| {
        if first {
            buffers = (0..4).map(|_| a.malloc(4 * MIB, 0, Some(stack.clone())).unwrap().ptr).collect();
        }
        let update = a.malloc(4 * MIB, 0, Some(stack.clone())).unwrap().ptr;
        a.free(update, None).unwrap();
    });
    let d = diagnose(&momentum, None);
    let o = finding(&d, doctor::OPTIMIZER_STATE);
    assert_eq!(o.evidence["state_bytes"], 16 * MIB);
    assert_eq!(o.evidence["parameters_remade"], 0);
    // Its step is its own code: no torch.optim option to name.
    assert!(o.fix.contains("its own expressions") && !o.fix.contains("foreach=False"), "{}", o.fix);
}

/// Python a hook runs on the autograd thread during backward (DDP's reducer, a tensor hook) has a
/// stack that does not start at the script: it belongs to the backward, and so do the frameless
/// allocations of the engine's thread after it. Here gradients made after such a hook, never
/// freed (no zero_grad), live through every later forward.
#[test]
fn a_hook_on_the_autograd_thread_keeps_the_backward_going() {
    use tensormem::alloc::{RecordContext, TimeSource, VirtualAllocator};
    const MIB: u64 = 1 << 20;
    let init = python_stack(&[("torch/nn/modules/linear.py", "__init__"), ("train.py", "<module>")]);
    let forward = python_stack(&[("torch/nn/modules/linear.py", "forward"), ("torch/nn/modules/module.py", "_call_impl"), ("train.py", "<module>")]);
    let backward = python_stack(&[("torch/autograd/__init__.py", "backward"), ("train.py", "<module>")]);
    let hook = python_stack(&[("torch/nn/parallel/distributed.py", "_hook")]);
    let mut a = VirtualAllocator::virtual_with(AllocatorConfig::default());
    a.record_memory_history(true, RecordContext::All, 1 << 16);
    a.history_mut().set_time_source(TimeSource::modelled());
    let _params: Vec<u64> = (0..4).map(|_| a.malloc(4 * MIB, 0, Some(init.clone())).unwrap().ptr).collect();
    let mut grads = Vec::new();
    for k in 0..4 {
        let activations: Vec<u64> = (0..4).map(|_| a.malloc(8 * MIB, 0, Some(forward.clone())).unwrap().ptr).collect();
        let seed = a.malloc(512, 0, Some(backward.clone())).unwrap().ptr;
        let bucket = a.malloc(MIB, 0, Some(hook.clone())).unwrap().ptr;
        a.free(bucket, None).unwrap();
        if k == 0 {
            grads = (0..4).map(|_| a.malloc(4 * MIB, 0, None).unwrap().ptr).collect();
        }
        a.free(seed, None).unwrap();
        for ptr in activations {
            a.free(ptr, None).unwrap();
        }
        a.history_mut().annotate("Optimizer.step#SGD.step", true, 0);
        a.history_mut().annotate("Optimizer.step#SGD.step", false, 0);
    }
    assert_eq!(grads.len(), 4);
    let d = diagnose(&a.snapshot(), None);
    let g = finding(&d, doctor::GRADS_KEPT);
    assert_eq!(g.bytes, 16 * MIB, "{}", g.title);
}

#[test]
fn a_forward_stopped_by_an_out_of_memory_is_not_a_missing_no_grad() {
    // tensormem.watch() on an H100: a training script's first forward ran out of memory, and the
    // snapshot was taken in the out-of-memory observer (tests/data/corpus/watch-oom-forward).
    let path = std::path::Path::new(env!("CARGO_MANIFEST_DIR")).join("tests/data/corpus/watch-oom-forward.pickle");
    let d = diagnose(&trace::load_file(&path).unwrap(), None);
    // Its backward never had its chance: no finding, not even an inconclusive one, blames grad mode.
    assert_eq!(kinds(&d), ["peak", "oom", "temporaries", "outside-allocator"]);
    let oom = finding(&d, "oom");
    assert_eq!((oom.evidence["event"].as_u64(), oom.evidence["request_bytes"].as_u64()), (Some(79), Some(8 << 30)));
    assert_eq!(oom.evidence["reproduced_by_replay"], true);
    let peak = finding(&d, "peak");
    assert!(peak.fix.contains("ran out of memory before any backward"), "{}", peak.fix);
    assert!(!peak.fix.contains("with no backward in the trace"), "{}", peak.fix);
}

/// A snapshot whose segments hold `blocks` blocks of `size` made before the trace, without
/// stacks (as PyTorch writes blocks that predate `_record_memory_history`), and a trace of one
/// small allocation.
fn blocks_before_the_trace(blocks: u64, size: u64) -> Snapshot {
    let base = 0x7f00_0000_0000u64;
    let segments: Vec<Value> = (0..blocks)
        .map(|i| {
            serde_json::json!({ "device": 0, "address": base + i * size, "total_size": size, "allocated_size": size, "active_size": size,
                "requested_size": size, "stream": 0, "segment_type": "large", "segment_pool_id": [0, 0], "is_expandable": false, "frames": [],
                "blocks": [{ "address": base + i * size, "size": size, "requested_size": size, "state": "active_allocated", "frames": [] }] })
        })
        .collect();
    let small = base + blocks * size;
    let frames = serde_json::json!([{ "filename": "/home/user/serve.py", "line": 3, "name": "step" }]);
    let entry = |action: &str, addr: u64, size: u64, t: u64| serde_json::json!({ "action": action, "addr": addr, "size": size, "stream": 0, "time_us": t, "frames": frames });
    let trace = vec![
        entry("segment_alloc", small, 2 << 20, 1),
        entry("alloc", small, 512, 2),
        entry("free_requested", small, 512, 3),
        entry("free_completed", small, 512, 3),
    ];
    let mut last = segments;
    last.push(serde_json::json!({ "device": 0, "address": small, "total_size": 2 << 20, "allocated_size": 0, "active_size": 0,
        "requested_size": 0, "stream": 0, "segment_type": "large", "segment_pool_id": [0, 0], "is_expandable": false, "frames": [],
        "blocks": [{ "address": small, "size": 2 << 20, "requested_size": 0, "state": "inactive", "frames": [] }] }));
    let text = serde_json::json!({ "segments": last, "device_traces": [trace] }).to_string();
    trace::load(text.as_bytes()).unwrap()
}

/// Issue 50, cause 3: a program has one cuBLAS workspace per handle (a thread's and autograd's
/// on a stream); 128 blocks of 32 MiB made before the trace are a KV cache, not workspaces.
#[test]
fn blocks_of_a_workspaces_size_are_named_workspaces_only_as_many_as_a_stream_has_handles() {
    let likely = |d: &Diagnosis| finding(d, doctor::OUTSIDE_ALLOCATOR).evidence["likely_cublas_workspaces_before_trace"].as_array().unwrap().len();
    let cache = diagnose(&blocks_before_the_trace(128, 32 << 20), None);
    let f = finding(&cache, doctor::OUTSIDE_ALLOCATOR);
    assert_eq!(likely(&cache), 0, "{}", f.title);
    assert!(!f.title.contains("cuBLAS"), "{}", f.title);
    assert!(f.estimate.as_deref().unwrap().contains("128 blocks from before the trace have a workspace's size"), "{:?}", f.estimate);
    for (blocks, named) in [(1, 1), (2, 2), (3, 0), (14, 0)] {
        let d = diagnose(&blocks_before_the_trace(blocks, 32 << 20), None);
        assert_eq!(likely(&d), named, "{blocks} blocks of 32 MiB");
    }
    let two = diagnose(&blocks_before_the_trace(2, 32 << 20), None);
    assert!(finding(&two, doctor::OUTSIDE_ALLOCATOR).estimate.as_deref().unwrap().contains("by their size alone"), "said to be a guess");
}

/// Issue 50, cause 4: `_dump_snapshot()` without `_record_memory_history()`: an empty trace and
/// blocks without stacks. The doctor says no history was recorded, what the file still shows,
/// and the lines that record one; it claims no peak or category it cannot know.
#[test]
fn a_snapshot_without_history_says_so_and_how_to_record_one() {
    let mut snapshot = blocks_before_the_trace(3, 20 << 20);
    snapshot.device_traces = vec![Vec::new()];
    let d = diagnose(&snapshot, None);
    assert_eq!(kinds(&d), ["no-history", "peak", "outside-allocator"]);
    let f = finding(&d, doctor::NO_HISTORY);
    assert!(f.title.starts_with("No memory history is in this file"), "{}", f.title);
    assert!(f.title.contains("4 segments, 62.00 MiB reserved, 60.00 MiB allocated"), "{}", f.title);
    assert_eq!(f.evidence["cached_free_bytes"], 2 << 20);
    assert_eq!(f.evidence["largest_free_block_bytes"], 2 << 20);
    assert!(f.fix.contains("torch.cuda.memory._record_memory_history(max_entries=100000)"), "{}", f.fix);
    assert!(f.fix.contains("torch.cuda.memory._dump_snapshot("), "{}", f.fix);
    let peak = finding(&d, doctor::PEAK);
    assert!(peak.title.contains("when the snapshot was taken (no history"), "{}", peak.title);
    assert!(!peak.title.contains("inferred"), "no category without a lifetime: {}", peak.title);
    // A file with history is not one.
    assert!(!kinds(&diagnose(&blocks_before_the_trace(3, 20 << 20), None)).contains(&"no-history"));
}

#[test]
fn an_end_state_file_takes_its_categories_from_the_blocks_frames_and_names_kept_forward_blocks() {
    // Issue 50, cause 5. A real snapshot dumped right after a forward with grad (its graph
    // alive), turned into an end-state file as PyTorch 2.0/2.1's `_record_memory_history(True)`
    // or a dump without a history writes one: the same blocks, their frames, no event. Before,
    // every block was a `parameter` ("made before the first step, alive to the end"); now the
    // frames decide: made inside a module's forward is an activation, and those blocks are named.
    let path = std::path::Path::new(env!("CARGO_MANIFEST_DIR")).join("tests/data/real/nothanmin-forward.pickle");
    let mut snapshot = trace::load_file(&path).unwrap();
    for t in &mut snapshot.device_traces {
        t.clear();
    }
    let inferred = doctor::infer_categories(&snapshot, 0).unwrap();
    let bytes_of = |c: &str| inferred.iter().filter(|i| i.inferred.name() == c).map(|i| i.bytes).sum::<u64>();
    let activation = bytes_of("activation");
    assert!(activation > 10 << 30, "{activation}");
    assert!(bytes_of("parameter") < activation, "{} {activation}", bytes_of("parameter"));
    let d = diagnose(&snapshot, None);
    let kept = finding(&d, doctor::KEPT_ACTIVATIONS);
    assert_eq!(kept.bytes, activation);
    // A correct program dumped between a forward and its backward leaves the same file: named,
    // not claimed.
    assert_eq!(kept.confidence, FindingConfidence::Inconclusive);
    assert!(kept.evidence["top_stacks"][0]["frames"].as_array().is_some_and(|f| !f.is_empty()));
    // The same file with its history says nothing of the kind: the trace shows the forward.
    assert!(!kinds(&diagnose(&trace::load_file(&path).unwrap(), None)).contains(&doctor::KEPT_ACTIVATIONS));
}

#[test]
fn a_finder_that_fails_is_named_and_the_others_stand_and_a_caller_can_skip_it() {
    // Natively a finder's panic is caught; where it cannot be (the page's wasm), the caller asks
    // which finder was running and diagnoses again without it (www/worker.js).
    let Some(snapshot) = load("gpt-medium-ctx128-training.pickle") else { return };
    let whole = kinds(&diagnose(&snapshot, None)).into_iter().map(str::to_string).collect::<Vec<_>>();
    doctor::make_finder_fail_for_tests(Some(doctor::OPTIMIZER_STATE));
    let d = diagnose(&snapshot, None);
    doctor::make_finder_fail_for_tests(None);
    assert_eq!(doctor::finder_running(), None, "a diagnosis that returned leaves no finder running");
    assert_eq!(kinds(&d), whole.iter().filter(|k| *k != doctor::OPTIMIZER_STATE).map(String::as_str).collect::<Vec<_>>());
    assert!(d.notes.iter().any(|n| n.contains("the optimizer-state finder failed")), "{:?}", d.notes);
    let skipped = doctor::diagnose_skipping(&snapshot, &DoctorOptions::default(), &[doctor::OPTIMIZER_STATE.to_string()]).unwrap();
    assert_eq!(skipped, d);
}

fn real(name: &str) -> Snapshot {
    trace::load_file(&std::path::Path::new(env!("CARGO_MANIFEST_DIR")).join("tests/data/real").join(name)).unwrap()
}

fn recorded_peaks(snapshot: &Snapshot) -> (u64, u64) {
    let r = replay::replay_device(snapshot, 0, &ReplayOptions::default(), &mut |_, _| {}).unwrap();
    (r.recorded.peak_reserved_bytes, r.recorded.peak_allocated_bytes)
}

/// missing-no-grad's figures come from the trace replayed with what the graph saved freed where
/// no_grad frees it; the same program recorded under no_grad is what they must match. One
/// `Linear` three times (shreyansh26/MLSys-Experiments, profile_grad.py and profile_no_grad.py):
/// each saved input (200,000,000 B) freed when the next one is made. The H100 twin of the seeds'
/// evaluation loop, where its fix is recorded beside it.
#[test]
fn missing_no_grad_figures_are_what_the_program_under_no_grad_recorded() {
    let mut pairs = vec![(real("linear-grad.pickle"), real("linear-no-grad.pickle"), 0.001)];
    if let (Some(mistake), Some(fix)) = (load("../h100-twins/eval-no-grad-mistake.pickle"), load("../h100-twins/eval-no-grad-fix.pickle")) {
        pairs.push((mistake, fix, 0.05));
    }
    for (with_grad, no_grad, tolerance) in &pairs {
        let d = diagnose(with_grad, None);
        let m = finding(&d, doctor::MISSING_NO_GRAD);
        let v = m.verified.as_ref().expect("a claim that replay can measure shows both figures");
        assert!(v.command.is_none(), "an edited trace has no replay command");
        let (reserved, allocated) = recorded_peaks(no_grad);
        assert_eq!(v.after_peak_reserved_bytes, reserved, "{}", m.title);
        assert!(
            (v.after_peak_allocated_bytes as f64 - allocated as f64).abs() <= tolerance * allocated as f64,
            "{} vs {allocated}",
            v.after_peak_allocated_bytes
        );
        assert!(v.before_peak_allocated_bytes - v.after_peak_allocated_bytes >= m.bytes / 2, "{}", m.title);
    }
    let v = finding(&diagnose(&pairs[0].0, None), doctor::MISSING_NO_GRAD).verified.clone().unwrap();
    assert_eq!(v.before_peak_allocated_bytes - v.after_peak_allocated_bytes, 200_000_000);
}

/// A forward dumped with its graph alive may await a backward; an earlier forward's graph, made
/// before the trace and freed in it unused, shows it does not (sidsoc12's "infer" run: a warm-up
/// `logits = model(inputs)` with grad, then the recorded one; rebinding `logits` frees the
/// warm-up's 5.23 GiB in 773 blocks at once). Without that teardown the same forward is only
/// inconclusive.
#[test]
fn an_earlier_graph_freed_unused_makes_a_held_forward_a_claim() {
    let snapshot = real("sid-ctx128_fp32_infer.pickle");
    let d = diagnose(&snapshot, None);
    let m = finding(&d, doctor::MISSING_NO_GRAD);
    assert_eq!(m.confidence, FindingConfidence::Medium);
    let g = &m.evidence["earlier_graph"];
    assert_eq!(g["allocations"], 773);
    assert!((5.2e9..5.7e9).contains(&g["bytes"].as_f64().unwrap()), "{g}");
    let mut cut = snapshot.clone();
    let freed_at = g["freed_at"].as_u64().unwrap() as usize;
    cut.device_traces[0].truncate(freed_at - 1);
    let d = diagnose(&cut, None);
    let m = finding(&d, doctor::MISSING_NO_GRAD);
    assert_eq!(m.confidence, FindingConfidence::Inconclusive);
    assert!(m.evidence["earlier_graph"].is_null());
}

/// Issue 50, cause 6: PyTorch's trace of an SGD loop that never calls zero_grad(). Plain SGD's
/// step allocates nothing, and the last one begins after the trace's last entry (the dump comes
/// after it): the optimizer finder took the frees between that step and the trace's end as a
/// range running backwards, and panicked. Each finder must read such a trace.
#[test]
fn a_last_optimizer_step_after_the_traces_last_entry_takes_no_finder_down() {
    use tensormem::alloc::{RecordContext, TimeSource, VirtualAllocator};
    const MIB: u64 = 1 << 20;
    let init = python_stack(&[("torch/nn/modules/linear.py", "__init__"), ("train.py", "<module>")]);
    let forward = python_stack(&[("torch/nn/modules/linear.py", "forward"), ("torch/nn/modules/module.py", "_call_impl"), ("train.py", "<module>")]);
    let backward = python_stack(&[("torch/autograd/__init__.py", "backward"), ("train.py", "<module>")]);
    let mut a = VirtualAllocator::virtual_with(AllocatorConfig::default());
    a.record_memory_history(true, RecordContext::All, 1 << 16);
    a.history_mut().set_time_source(TimeSource::modelled());
    let _parameters: Vec<u64> = (0..4).map(|_| a.malloc(4 * MIB, 0, Some(init.clone())).unwrap().ptr).collect();
    for k in 0..3 {
        let activations: Vec<u64> = (0..4).map(|_| a.malloc(8 * MIB, 0, Some(forward.clone())).unwrap().ptr).collect();
        // The first backward's gradients become .grad; later ones are added into them and freed.
        let gradients: Vec<u64> = (0..4).map(|_| a.malloc(4 * MIB, 0, Some(backward.clone())).unwrap().ptr).collect();
        for ptr in activations.into_iter().chain(gradients.into_iter().filter(|_| k > 0)) {
            a.free(ptr, None).unwrap();
        }
        a.history_mut().annotate("Optimizer.step#SGD.step", true, 0);
        a.history_mut().annotate("Optimizer.step#SGD.step", false, 0);
    }
    let mut snapshot = a.snapshot();
    // The last step's range, after the last entry (the modelled clock stamps it with the last free's time).
    let last = snapshot.trace_of(0).last().and_then(|e| e.time_us).unwrap();
    let notes = snapshot.external_annotations.as_mut().unwrap();
    let n = notes.len();
    for (k, note) in notes[n - 2..].iter_mut().enumerate() {
        note.time_us = Some(last + 1 + k as i64);
    }
    let d = diagnose(&snapshot, None);
    assert!(d.notes.iter().all(|n| !n.contains("failed")), "{:?}", d.notes);
    assert_well_formed("sgd without zero_grad", &d);
}

/// retained-graph's figures free each retained tensor where its graph would have died (its own
/// iteration's backward): on the H100 twin of an RNN whose hidden state is never detached, that
/// comes within 3% of the peak its fix (`hidden.detach()`) recorded.
#[test]
fn retained_graph_figures_come_near_what_the_fix_recorded() {
    let (Some(mistake), Some(fix)) = (load("../h100-twins/rnn-hidden-mistake.pickle"), load("../h100-twins/rnn-hidden-fix.pickle")) else { return };
    let d = diagnose(&mistake, None);
    let r = finding(&d, doctor::RETAINED_GRAPH);
    let v = r.verified.as_ref().expect("retained tensors freed within the trace can be replayed sooner");
    assert!(v.how.contains("backward ends") && v.command.is_none(), "{}", v.how);
    assert!(v.before_peak_allocated_bytes - v.after_peak_allocated_bytes >= r.bytes / 2, "{v:?}");
    let (_, allocated) = recorded_peaks(&fix);
    assert!((v.after_peak_allocated_bytes as f64 - allocated as f64).abs() <= 0.03 * allocated as f64, "{} vs {allocated}", v.after_peak_allocated_bytes);
}

#[test]
fn a_start_given_to_the_doctor_is_used_only_if_it_is_this_traces() {
    // The page's worker hands the doctor the start it reconstructed for the layout: the same
    // findings; another device's start (or another trace's) is not used.
    let Some(snapshot) = load("expandable-3gpu-oom.pickle") else { return };
    let json = |d: &Diagnosis| serde_json::to_value(d).unwrap();
    let devices = snapshot.devices();
    for &device in &devices {
        let plain = doctor::diagnose(&snapshot, &DoctorOptions { device: Some(device), ..Default::default() }).unwrap();
        for &from in &devices {
            let known = replay::KnownStart::of(&snapshot, from).unwrap();
            let given = doctor::diagnose(&snapshot, &DoctorOptions { device: Some(device), known_start: Some(known), ..Default::default() }).unwrap();
            assert_eq!(json(&given), json(&plain), "device {device}, start of device {from}");
        }
    }
}
