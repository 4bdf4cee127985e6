//! `predict` against the simulator's own truth: recordings of a training scenario at two small
//! contexts (or batches), a prediction at 4x the larger, and the scenario run at that size
//! directly must agree in peak allocated and peak reserved. Then the real pairs (whose third size
//! is held back), and the errors a user meets.

mod common;

use tensormem::predict::{self, Basis, PredictOptions, Prediction, Recording, Values};
use tensormem::scenarios::{self, RunRequest, RunResult};
use tensormem::trace::{self, Snapshot};

fn run(name: &str, set: &[(&str, String)]) -> RunResult {
    let request = RunRequest { scenario: name.into(), set: set.iter().map(|(k, v)| (k.to_string(), v.clone())).collect(), ..Default::default() };
    scenarios::run(&request).unwrap_or_else(|e| panic!("{name}: {e}"))
}

fn values(pairs: &[(&str, u64)]) -> Values {
    pairs.iter().map(|(k, v)| (k.to_string(), *v)).collect()
}

fn recording<'a>(label: &str, snapshot: &'a Snapshot, pairs: &[(&str, u64)]) -> Recording<'a> {
    Recording { label: label.into(), snapshot, values: values(pairs) }
}

/// Records `scenario` at `small` and `large` values of `variable` (the others fixed), predicts
/// 4 x `large`, runs it there, and returns (prediction, direct run).
fn predict_against_a_direct_run(scenario: &str, fixed: &[(&str, &str)], variable: &str, small: u64, large: u64) -> (Prediction, RunResult) {
    let set = |v: u64| {
        let mut set: Vec<(&str, String)> = fixed.iter().map(|(k, v)| (*k, v.to_string())).collect();
        set.push((variable, v.to_string()));
        set
    };
    let a = run(scenario, &set(small));
    let b = run(scenario, &set(large));
    let target = 4 * large;
    let direct = run(scenario, &set(target));
    let recordings = [recording("a", &a.snapshot, &[(variable, small)]), recording("b", &b.snapshot, &[(variable, large)])];
    let options = PredictOptions { keep_snapshot: true, ..Default::default() };
    let p = predict::predict(&recordings, &values(&[(variable, target)]), &options).unwrap();
    eprintln!(
        "{scenario} {variable} {small},{large} -> {target}: predicted {} / {}, direct {} / {} (allocated / reserved); aligned {:.4}",
        p.peak_allocated_bytes, p.peak_reserved_bytes, direct.peak_allocated_bytes, direct.peak_reserved_bytes, p.aligned_fraction
    );
    (p, direct)
}

fn assert_exact(p: &Prediction, direct: &RunResult) {
    assert_eq!(p.aligned_fraction, 1.0, "every allocation aligned: {:?}", p.notes);
    assert_eq!(p.unaligned_bytes, 0);
    assert!(p.laws.iter().all(|l| l.basis == Basis::Fitted), "every law reproduces both recordings exactly");
    assert_eq!((p.peak_allocated_bytes, p.peak_reserved_bytes), (direct.peak_allocated_bytes, direct.peak_reserved_bytes));
    assert!(p.out_of_memory.is_none());
    // Not only the peaks: every allocation of the direct run, in order, with its size.
    if let Some(predicted) = &p.snapshot {
        let allocs = |s: &Snapshot| s.device_traces[0].iter().filter(|e| e.action == trace::Action::Alloc).map(|e| e.size).collect::<Vec<u64>>();
        assert!(allocs(predicted) == allocs(&direct.snapshot), "the predicted trace allocates what the direct run does");
    }
}

#[test]
fn lm_train_at_four_times_the_context_equals_a_direct_run() {
    let (p, direct) = predict_against_a_direct_run("lm-train", &[("size", "small"), ("batch", "2")], "context", 16, 32);
    assert_exact(&p, &direct);
    // The attention scores grow with the square of the context.
    assert!(p.laws.iter().any(|l| l.law.contains("context^2")), "{:?}", p.laws.iter().map(|l| &l.law).collect::<Vec<_>>());
    assert!(p.peak_phase.is_some());
}

#[test]
fn gpt2_train_at_four_times_the_context_equals_a_direct_run() {
    let (p, direct) = predict_against_a_direct_run("gpt2-train", &[("batch", "2")], "context", 16, 32);
    assert_exact(&p, &direct);
}

#[test]
fn lm_train_and_gpt2_train_at_four_times_the_batch_equal_a_direct_run() {
    let (p, direct) = predict_against_a_direct_run("lm-train", &[("size", "small"), ("context", "16")], "batch", 2, 4);
    assert_exact(&p, &direct);
    let (p, direct) = predict_against_a_direct_run("gpt2-train", &[("context", "16")], "batch", 2, 4);
    assert_exact(&p, &direct);
}

/// At batch 1 a transposed [1, ...] tensor is already contiguous, so attention's `.contiguous()`
/// copies are no-ops that batch 2 makes: the recordings differ by those allocations, which
/// predict reports as unaligned (and says to record at 2 or more).
#[test]
fn a_recording_at_batch_one_lacks_copies_and_predict_says_so() {
    let set = |b: &str| vec![("size", "small".to_string()), ("context", "16".to_string()), ("batch", b.to_string())];
    let (a, b) = (run("lm-train", &set("1")), run("lm-train", &set("2")));
    let recordings = [recording("b1", &a.snapshot, &[("batch", 1)]), recording("b2", &b.snapshot, &[("batch", 2)])];
    let p = predict::predict(&recordings, &values(&[("batch", 8)]), &PredictOptions::default()).unwrap();
    assert!(p.aligned_fraction < 1.0 && p.unaligned_bytes > 0);
    assert!(p.notes.iter().any(|n| n.contains("at 1")), "{:?}", p.notes);
}

#[test]
fn two_variables_fit_products() {
    let set = |b: u64, c: u64| vec![("size", "small".to_string()), ("batch", b.to_string()), ("context", c.to_string())];
    let runs = [run("lm-train", &set(2, 16)), run("lm-train", &set(2, 32)), run("lm-train", &set(4, 16))];
    let direct = run("lm-train", &set(4, 64));
    let recordings: Vec<Recording> =
        runs.iter().zip([(2, 16), (2, 32), (4, 16)]).map(|(r, (b, c))| recording(&format!("b{b}c{c}"), &r.snapshot, &[("batch", b), ("context", c)])).collect();
    let p = predict::predict(&recordings, &values(&[("batch", 4), ("context", 64)]), &PredictOptions::default()).unwrap();
    assert_exact(&p, &direct);
    assert!(p.laws.iter().any(|l| l.law.contains("batch*context^2")), "{:?}", p.laws.iter().map(|l| &l.law).collect::<Vec<_>>());
}

#[test]
fn a_capacity_below_the_prediction_is_an_out_of_memory_error_in_pytorchs_words() {
    let set = |c: u64| vec![("size", "small".to_string()), ("batch", "2".to_string()), ("context", c.to_string())];
    let (a, b) = (run("lm-train", &set(16)), run("lm-train", &set(32)));
    let recordings = [recording("a", &a.snapshot, &[("context", 16)]), recording("b", &b.snapshot, &[("context", 32)])];
    let target = values(&[("context", 128)]);
    let free = predict::predict(&recordings, &target, &PredictOptions::default()).unwrap();
    let options = PredictOptions { capacity: Some(free.peak_allocated_bytes / 2), keep_snapshot: true, ..Default::default() };
    let p = predict::predict(&recordings, &target, &options).unwrap();
    let message = p.out_of_memory.as_deref().expect("does not fit half its peak");
    assert!(message.starts_with("Out of memory. Tried to allocate"), "{message}");
    // The predicted trace is a snapshot that loads again.
    let dir = std::env::temp_dir().join(format!("tensormem-predict-{}", std::process::id()));
    std::fs::create_dir_all(&dir).unwrap();
    let out = dir.join("predicted.pickle");
    trace::save_file(p.snapshot.as_ref().unwrap(), &out).unwrap();
    let back = trace::load_file(&out).unwrap();
    assert!(!back.device_traces[0].is_empty());
    std::fs::remove_dir_all(&dir).ok();
}

#[test]
fn one_recording_gives_a_weak_prediction_from_factors() {
    let a = run("lm-train", &[("size", "small".into()), ("batch", "2".into()), ("context", "16".into())]);
    let recordings = [recording("a", &a.snapshot, &[("context", 16)])];
    let p = predict::predict(&recordings, &values(&[("context", 64)]), &PredictOptions::default()).unwrap();
    assert!(p.weak);
    assert!(p.laws.iter().all(|l| l.basis == Basis::Factors));
    assert!(p.laws.iter().any(|l| l.law.contains("context")));
    assert!(p.peak_allocated_bytes > 0);
    // Nothing checks a guess: every byte at the peak is extrapolated, and the prediction says so.
    let h = &p.how_sure;
    assert_eq!((h.checked_bytes, h.recorded_size_bytes, h.checked_share), (0, 0, 0.0));
    assert!(h.extrapolated_bytes >= p.peak_allocated_bytes / 2, "{h:?}");
    assert_eq!(h.beyond_recorded, 4.0);
    assert!(h.warning.as_deref().is_some_and(|w| w.contains("no recording checks")), "{h:?}");
}

#[test]
fn bad_input_gets_a_clear_error() {
    let lm = run("lm-train", &[("size", "small".into()), ("batch", "2".into()), ("context", "16".into())]);
    let gpt = run("gpt2-train", &[("batch", "2".into()), ("context", "32".into())]);
    let error = |recordings: &[Recording], to: &[(&str, u64)]| predict::predict(recordings, &values(to), &PredictOptions::default()).unwrap_err().to_string();

    let mismatched = [recording("lm.pickle", &lm.snapshot, &[("context", 16)]), recording("gpt.pickle", &gpt.snapshot, &[("context", 32)])];
    let e = error(&mismatched, &[("context", 128)]);
    assert!(e.contains("do not look like one program"), "{e}");
    // The refusal names where they part: each one's trace entry, action and stack there.
    assert!(e.contains("they first differ at their event ") && e.contains("gpt.pickle has trace entry ") && e.contains("lm.pickle has "), "{e}");

    let pair = [recording("a.pickle", &lm.snapshot, &[("context", 16)]), recording("b.pickle", &lm.snapshot, &[("context", 32)])];
    let e = error(&pair, &[("seq", 128)]);
    assert!(e.contains("--to names seq, which no recording gives (they give: context)"), "{e}");
    let e = error(&pair, &[]);
    assert!(e.contains("--to needs"), "{e}");

    let fixed = [recording("a.pickle", &lm.snapshot, &[("batch", 2), ("context", 16)]), recording("b.pickle", &lm.snapshot, &[("batch", 2), ("context", 32)])];
    let e = error(&fixed, &[("batch", 8), ("context", 64)]);
    assert!(e.contains("batch is 2 in every recording"), "{e}");

    let uneven = [recording("a.pickle", &lm.snapshot, &[("batch", 2)]), recording("b.pickle", &lm.snapshot, &[("context", 32)])];
    let e = error(&uneven, &[("context", 64)]);
    assert!(e.contains("every recording must give the same variables"), "{e}");

    assert!(predict::parse_recording("a.pickle").unwrap_err().contains("FILE@name=value"));
    assert!(predict::parse_recording("a.pickle@context").unwrap_err().contains("FILE@name=value"));
    assert!(predict::parse_recording("a.pickle@context=0").unwrap_err().contains("positive whole number"));
    assert_eq!(predict::parse_recording("dir@x/a.pickle@batch=2,context=128").unwrap(), ("dir@x/a.pickle".into(), values(&[("batch", 2), ("context", 128)])));
}

/// The real pairs: the held-back third size is checked elsewhere; here the prediction must
/// reproduce each recording's own peak allocated (the replay's) at its own size, and the figures
/// at 512 and 1024 are printed.
#[test]
fn real_pairs_reproduce_their_own_sizes_and_predict_larger_ones() {
    for stem in ["gpt-medium-ctx{}-inference", "lm2.7b-ctx{}-fullstep"] {
        let Some(small) = common::fixture(&format!("{}.pickle", stem.replace("{}", "128"))) else { return };
        let large = common::fixture(&format!("{}.pickle", stem.replace("{}", "256"))).unwrap();
        let snapshots = [trace::load_file(&small).unwrap(), trace::load_file(&large).unwrap()];
        let recordings = [recording("128", &snapshots[0], &[("context", 128)]), recording("256", &snapshots[1], &[("context", 256)])];
        let mut previous = 0;
        for target in [128, 256, 512, 1024] {
            let p = predict::predict(&recordings, &values(&[("context", target)]), &PredictOptions::default()).unwrap();
            eprintln!(
                "{stem} at context {target}: peak allocated {} reserved {} phase {:?}; aligned {:.4}, unaligned {} bytes",
                p.peak_allocated_bytes, p.peak_reserved_bytes, p.peak_phase, p.aligned_fraction, p.unaligned_bytes
            );
            assert!(p.aligned_fraction > 0.99, "{:?}", p.notes);
            if target <= 256 {
                let own = &snapshots[if target == 128 { 0 } else { 1 }];
                let replayed = tensormem::replay::replay_device(own, 0, &Default::default(), &mut |_, _| {}).unwrap();
                let recorded = replayed.replayed.figures.peak_allocated_bytes as f64;
                let off = (p.peak_allocated_bytes as f64 - recorded).abs() / recorded;
                assert!(off < 1e-4, "{stem} at {target}: {} vs the recording's {recorded}", p.peak_allocated_bytes);
            }
            // (The recordings' own peaks need not grow: the 2.7b's optimizer step peaks higher at 128.)
            if target > 256 {
                assert!(p.peak_allocated_bytes >= previous);
            }
            previous = p.peak_allocated_bytes;
        }
    }
}

/// `fit` (the largest context whose prediction fits a card) against the simulator: the scenario
/// run directly at that context fits the card, one token more does not.
#[test]
fn fit_finds_the_largest_context_that_a_direct_run_fits() {
    let set = |c: u64| vec![("size", "small".to_string()), ("batch", "2".to_string()), ("context", c.to_string())];
    let (a, b) = (run("lm-train", &set(16)), run("lm-train", &set(32)));
    let recordings = [recording("a", &a.snapshot, &[("context", 16)]), recording("b", &b.snapshot, &[("context", 32)])];
    let capacity = predict::predict(&recordings, &values(&[("context", 200)]), &PredictOptions::default()).unwrap().peak_reserved_bytes;
    let found = predict::fit(&recordings, &Values::new(), "context", capacity, &PredictOptions::default()).unwrap();
    let largest = found.largest.expect("something fits");
    eprintln!("fit: {found:?}");
    // Fitting need not be monotonic: at this card's size the cache fragments so that some
    // contexts below 200 run out where 200 fits (as they do run directly). fit's answer is a
    // boundary, checked below against direct runs.
    assert!(largest >= 128, "{found:?}");
    // Found far beyond the recordings (at 16 and 32 tokens): said so.
    let farthest = largest.max(found.largest_expandable.unwrap_or(0));
    assert!(found.warning.as_deref().is_some_and(|w| w.starts_with(&format!("context={farthest} lies "))), "{found:?}");
    assert!(found.largest_expandable.is_some_and(|e| e >= 190), "{found:?}");
    let direct = |c: u64| {
        let request = RunRequest {
            scenario: "lm-train".into(),
            set: set(c).into_iter().map(|(k, v)| (k.to_string(), v)).collect(),
            capacity: Some(capacity),
            ..Default::default()
        };
        scenarios::run(&request).unwrap()
    };
    assert!(direct(largest).out_of_memory.is_none(), "the direct run fits at {largest}");
    assert!(direct(largest + 1).out_of_memory.is_some(), "the direct run does not fit at {}", largest + 1);

    let e = predict::fit(&recordings, &Values::new(), "batch", capacity, &PredictOptions::default()).unwrap_err().to_string();
    assert!(e.contains("no recording gives batch"), "{e}");
}

#[test]
fn predict_or_fit_and_the_sweep_agree_with_single_predictions() {
    let set = |c: u64| vec![("size", "small".to_string()), ("batch", "2".to_string()), ("context", c.to_string())];
    let (a, b) = (run("lm-train", &set(16)), run("lm-train", &set(32)));
    let recordings = [recording("a", &a.snapshot, &[("context", 16)]), recording("b", &b.snapshot, &[("context", 32)])];
    let at = |c: u64| predict::predict(&recordings, &values(&[("context", c)]), &PredictOptions::default()).unwrap();
    // The sweep: one alignment, a replay per value, the same peaks as predictions one by one.
    let sweep_values = predict::sweep_values(16, 128, 8, &[100]);
    assert_eq!(sweep_values, [16, 32, 48, 64, 80, 96, 100, 112, 128]);
    let mut calls = 0;
    let peaks = predict::sweep(&recordings, &Values::new(), "context", &sweep_values, &PredictOptions::default(), &mut |done, of| {
        calls += 1;
        assert_eq!((done, of), (calls, 9));
    })
    .unwrap();
    assert_eq!(calls, 9);
    for peak in &peaks {
        let p = at(peak.value);
        assert_eq!((peak.peak_allocated_bytes, peak.peak_reserved_bytes), (p.peak_allocated_bytes, p.peak_reserved_bytes), "context={}", peak.value);
    }

    // predict_or_fit: with a fit, the prediction is at the largest value that fits unless a target is given.
    let capacity = at(100).peak_reserved_bytes;
    let options = PredictOptions { capacity: Some(capacity), ..Default::default() };
    let fitted = predict::predict_or_fit(&recordings, &Values::new(), Some("context"), &options).unwrap();
    let fit = fitted.fit.as_ref().unwrap();
    assert_eq!(fitted.target, values(&[("context", fit.largest.unwrap())]));
    assert!(fitted.out_of_memory.is_none());
    let targeted = predict::predict_or_fit(&recordings, &values(&[("context", 128)]), Some("context"), &options).unwrap();
    assert_eq!(targeted.fit, fitted.fit);
    assert_eq!(targeted.target, values(&[("context", 128)]));
    let direct = predict::predict(&recordings, &values(&[("context", 128)]), &options).unwrap();
    assert_eq!((targeted.peak_reserved_bytes, &targeted.out_of_memory), (direct.peak_reserved_bytes, &direct.out_of_memory));
    let e = predict::predict_or_fit(&recordings, &Values::new(), Some("context"), &PredictOptions::default()).unwrap_err().to_string();
    assert!(e.contains("needs --capacity"), "{e}");
    // Card presets as capacities.
    assert_eq!(tensormem::device::parse_capacity("h100-80gb"), Ok(85_045_379_072));
    assert_eq!(tensormem::device::parse_capacity("sim:T4-16GB"), Ok(15_828_320_256));
    assert_eq!(tensormem::device::parse_capacity("24GiB"), Ok(24 << 30));
    assert!(tensormem::device::parse_capacity("H100").unwrap_err().contains("or a card: H100-80GB"));
}

/// The H100 recordings (`stacks="python"`): the autograd engine's thread has no Python, so
/// every backward allocation has an empty stack. Keyed by their sizes (which the context
/// changes) they could not align: the Llama-3-8B LoRA pair, identical event for event, was
/// refused with 3,222 of 11,561 allocations aligned, and GPT-2 lost a quarter of its own.
#[test]
fn recordings_with_python_stacks_align_their_backward() {
    let Some(dir) = common::fixtures_dir() else { return };
    let inputs = dir.parent().unwrap().join("predict-inputs");
    let load = |name: &str| trace::load_file(&inputs.join(name)).unwrap();
    let predict_at =
        |recordings: &[Recording], context: u64| predict::predict(recordings, &values(&[("context", context)]), &PredictOptions::default()).unwrap();

    let lora = [load("llama8b-lora16-sdpa-b2-ctx256.pickle"), load("llama8b-lora16-sdpa-b2-ctx512.pickle")];
    let recordings = [recording("256", &lora[0], &[("context", 256)]), recording("512", &lora[1], &[("context", 512)])];
    let mut previous = 0;
    for (context, own) in [(256, Some(&lora[0])), (512, Some(&lora[1])), (1024, None), (2048, None)] {
        let p = predict_at(&recordings, context);
        eprintln!("llama8b-lora16 at context {context}: peak allocated {} reserved {}", p.peak_allocated_bytes, p.peak_reserved_bytes);
        assert_eq!((p.aligned_fraction, p.unaligned_bytes), (1.0, 0), "{:?}", p.notes);
        if let Some(own) = own {
            let replayed = tensormem::replay::replay_device(own, 0, &Default::default(), &mut |_, _| {}).unwrap().replayed.figures;
            assert_eq!(p.peak_allocated_bytes, replayed.peak_allocated_bytes, "at {context}, its own recording");
        }
        assert!(p.peak_allocated_bytes > previous);
        previous = p.peak_allocated_bytes;
        // Every size at the peak follows a constant or a one-term law that both contexts check,
        // and 2048 is 4x past 512: near enough to say nothing more.
        assert_eq!((p.how_sure.checked_share, p.how_sure.warning.as_deref()), (1.0, None), "at {context}");
    }
    let far = predict_at(&recordings, 8192);
    assert_eq!(far.how_sure.beyond_recorded, 16.0);
    assert!(far.how_sure.warning.as_deref().is_some_and(|w| w.starts_with("context=8192 lies 16.0x beyond")), "{:?}", far.how_sure);

    // GPT-2 at context 1024 against PyTorch's own run of it (h100-twins/gpt2-train.pickle).
    let gpt2 = [load("gpt2-train-ctx256.pickle"), load("gpt2-train-ctx512.pickle")];
    let recordings = [recording("256", &gpt2[0], &[("context", 256)]), recording("512", &gpt2[1], &[("context", 512)])];
    let p = predict_at(&recordings, 1024);
    assert!(p.aligned_fraction > 0.99, "{}", p.aligned_fraction);
    let truth = trace::load_file(&dir.parent().unwrap().join("h100-twins/gpt2-train.pickle")).unwrap();
    let truth = tensormem::replay::replay_device(&truth, 0, &Default::default(), &mut |_, _| {}).unwrap().replayed.figures;
    let off = |predicted: u64, measured: u64| (predicted as f64 - measured as f64) / measured as f64;
    let (allocated, reserved) = (off(p.peak_allocated_bytes, truth.peak_allocated_bytes), off(p.peak_reserved_bytes, truth.peak_reserved_bytes));
    eprintln!("gpt2-train at context 1024: allocated {:+.3}%, reserved {:+.3}% against PyTorch's run", 100.0 * allocated, 100.0 * reserved);
    assert!(allocated.abs() < 0.03 && reserved.abs() < 0.05, "allocated {allocated:+.4}, reserved {reserved:+.4}");
}

/// Recordings that ran a different number of steps: the reference's extra step has no
/// counterpart, so each of its allocations follows the law of an aligned one of the same stack
/// and size (the step before it), and the prediction equals the direct run; without that law it
/// would keep the recorded sizes.
#[test]
fn a_step_more_in_one_recording_follows_its_neighbours_laws() {
    let set = |context: u64, steps: u64| {
        vec![("size", "small".to_string()), ("batch", "2".to_string()), ("context", context.to_string()), ("steps", steps.to_string())]
    };
    let (a, b, direct) = (run("lm-train", &set(16, 1)), run("lm-train", &set(32, 2)), run("lm-train", &set(128, 2)));
    let recordings = [recording("a", &a.snapshot, &[("context", 16)]), recording("b", &b.snapshot, &[("context", 32)])];
    let p = predict::predict(&recordings, &values(&[("context", 128)]), &PredictOptions::default()).unwrap();
    assert!(p.aligned_fraction < 1.0 && p.unaligned_bytes > 0, "one step of b has no counterpart: {}", p.aligned_fraction);
    assert!(p.laws.iter().any(|l| l.basis == Basis::Neighbour && !l.constant), "{:?}", p.laws.iter().map(|l| (&l.law, l.basis)).collect::<Vec<_>>());
    assert!(p.notes.iter().any(|n| n.contains("follow their aligned neighbours' laws")), "{:?}", p.notes);
    assert_eq!((p.peak_allocated_bytes, p.peak_reserved_bytes), (direct.peak_allocated_bytes, direct.peak_reserved_bytes));
}

/// torch.compile writes each size's kernels to a file named by their hash: two recordings of
/// one compiled program at two sizes share no generated file name. Those files count as one
/// name when aligning. (The compiled forward recorded at context 128, and the same trace with
/// every generated file renamed as a recompilation would; sizes unchanged, so every law is a
/// constant and the prediction is the recording's own.)
#[test]
fn kernels_compiled_for_each_size_still_align() {
    let Some(path) = common::fixture("gpt-ctx128-forward.pickle") else { return };
    let compiled = trace::load_file(&path).unwrap();
    let mut recompiled = compiled.clone();
    let mut renamed: std::collections::HashMap<*const trace::Frame, trace::Frames> = Default::default();
    for t in &mut recompiled.device_traces {
        t.edit(|e| {
            if let Some(frames) = &e.frames {
                let frames = renamed.entry(frames.as_ptr()).or_insert_with(|| {
                    frames
                        .iter()
                        .map(|f| trace::Frame {
                            filename: f.filename.replace("/torchinductor_c-kaitwang/z3/cz3v", "/torchinductor_c-kaitwang/q7/cq7x"),
                            ..f.clone()
                        })
                        .collect()
                });
                e.frames = Some(frames.clone());
            }
        });
    }
    assert_ne!(compiled, recompiled, "the fixture's forward runs generated code");
    let recordings = [recording("128", &compiled, &[("context", 128)]), recording("256", &recompiled, &[("context", 256)])];
    let p = predict::predict(&recordings, &values(&[("context", 512)]), &PredictOptions::default()).unwrap();
    assert_eq!(p.aligned_fraction, 1.0, "{:?}", p.notes);
    assert!(p.notes.iter().any(|n| n.contains("torch.compile's generated files as one")), "{:?}", p.notes);
}

/// A program as PyTorch records it with Python stacks: per step, three activations of
/// 4096*context bytes from one attention call, and (with `workspace`) a kernel's 2048*context
/// workspace from the same call, as a backend chosen at some sizes only makes. Four steps.
fn attention_program(context: u64, workspace: bool) -> Snapshot {
    use tensormem::alloc::{AllocatorConfig, RecordContext, VirtualAllocator};
    let stack = |line: u64| -> trace::Frames {
        vec![
            trace::Frame { filename: "/home/user/model.py".into(), line, name: "forward".into() },
            trace::Frame { filename: "/home/user/train.py".into(), line: 9, name: "<module>".into() },
        ]
        .into()
    };
    let mut a = VirtualAllocator::virtual_with(AllocatorConfig::default());
    a.record_memory_history(true, RecordContext::All, 1 << 16);
    for _ in 0..4 {
        let mut live: Vec<u64> = (0..3).map(|_| a.malloc(4096 * context, 0, Some(stack(12))).unwrap().ptr).collect();
        if workspace {
            live.push(a.malloc(2048 * context, 0, Some(stack(12))).unwrap().ptr);
        }
        for ptr in live {
            a.free(ptr, None).unwrap();
        }
    }
    a.snapshot()
}

/// An allocation only the nearest recording makes, of a size none of its stack's aligned ones
/// has, grows as they do (scaled to its own size) instead of keeping its recorded size.
#[test]
fn an_allocation_only_one_size_makes_grows_as_its_stack_does() {
    let (small, large) = (attention_program(128, false), attention_program(256, true));
    let recordings = [recording("128", &small, &[("context", 128)]), recording("256", &large, &[("context", 256)])];
    let p = predict::predict(&recordings, &values(&[("context", 1024)]), &PredictOptions::default()).unwrap();
    let workspace = p.laws.iter().find(|l| l.basis == Basis::Neighbour).expect("the workspace follows its neighbours");
    assert_eq!((workspace.law.as_str(), workspace.allocations, workspace.target_bytes), ("2048*context", 4, 4 * 2048 * 1024));
    let direct = attention_program(1024, true);
    let replayed = tensormem::replay::replay_device(&direct, 0, &Default::default(), &mut |_, _| {}).unwrap().replayed.figures;
    assert_eq!((p.peak_allocated_bytes, p.peak_reserved_bytes), (replayed.peak_allocated_bytes, replayed.peak_reserved_bytes));
}
