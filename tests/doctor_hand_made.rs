//! The doctor on traces made by hand with the allocator, as PyTorch records them (Python stacks,
//! hooks on the autograd thread, blocks from before the trace, files without a history): the
//! shapes real programs take that the fixtures do not hold.

mod common;

use common::doctor::{assert_well_formed, diagnose, finding, kinds, load};
use serde_json::Value;
use tensormem::alloc::AllocatorConfig;
use tensormem::doctor::{self, Diagnosis, DoctorOptions, FindingConfidence};
use tensormem::replay::{self, ReplayOptions};
use tensormem::trace::{self, Snapshot};

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
    assert_eq!(o.evidence.json()["state_bytes"], 16 * MIB);
    assert_eq!(o.evidence.json()["parameters_remade"], 0);
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
    assert_eq!((oom.evidence.json()["event"].as_u64(), oom.evidence.json()["request_bytes"].as_u64()), (Some(79), Some(8 << 30)));
    assert_eq!(oom.evidence.json()["reproduced_by_replay"], true);
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
    let likely = |d: &Diagnosis| finding(d, doctor::OUTSIDE_ALLOCATOR).evidence.json()["likely_cublas_workspaces_before_trace"].as_array().unwrap().len();
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
    snapshot.device_traces = vec![Default::default()];
    let d = diagnose(&snapshot, None);
    assert_eq!(kinds(&d), ["no-history", "peak", "outside-allocator"]);
    let f = finding(&d, doctor::NO_HISTORY);
    assert!(f.title.starts_with("No memory history is in this file"), "{}", f.title);
    assert!(f.title.contains("4 segments, 62.00 MiB reserved, 60.00 MiB allocated"), "{}", f.title);
    assert_eq!(f.evidence.json()["cached_free_bytes"], 2 << 20);
    assert_eq!(f.evidence.json()["largest_free_block_bytes"], 2 << 20);
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
    assert!(kept.evidence.json()["top_stacks"][0]["frames"].as_array().is_some_and(|f| !f.is_empty()));
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
    let g = &m.evidence.json()["earlier_graph"];
    assert_eq!(g["allocations"], 773);
    assert!((5.2e9..5.7e9).contains(&g["bytes"].as_f64().unwrap()), "{g}");
    let mut cut = snapshot.clone();
    let freed_at = g["freed_at"].as_u64().unwrap() as usize;
    cut.device_traces[0].truncate(freed_at - 1);
    let d = diagnose(&cut, None);
    let m = finding(&d, doctor::MISSING_NO_GRAD);
    assert_eq!(m.confidence, FindingConfidence::Inconclusive);
    assert!(m.evidence.json()["earlier_graph"].is_null());
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
