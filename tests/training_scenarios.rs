//! The training scenarios against what PyTorch really allocates: `lm-train` at the recorded
//! run's config against its `_record_memory_history` trace (phase by phase, block by block,
//! parameter by parameter), GPT-2's published size, and the 7B model that does not fit.

mod common;

use std::collections::BTreeMap;
use tensormem::scenarios::{self, RunRequest, RunResult, Step, compare};
use tensormem::trace::{self, Action, Category, Entry};

const FIXTURE: &str = "gpt-medium-ctx128-training.pickle";

fn run(name: &str, set: &[(&str, &str)], capacity: Option<u64>) -> RunResult {
    let request = RunRequest { scenario: name.into(), set: set.iter().map(|(k, v)| (k.to_string(), v.to_string())).collect(), capacity, ..Default::default() };
    scenarios::run(&request).unwrap_or_else(|e| panic!("{name}: {e}"))
}

/// lm-train at the fixture's config: medium, batch 4, context 128, its own AdamW.
fn fixture_config() -> RunResult {
    run("lm-train", &[("size", "medium"), ("batch", "4"), ("context", "128")], None)
}

/// The op and the innermost module scope of a tensormem trace entry (frames: op, then scopes).
fn op_and_scope<'a>(e: &Entry<'a>) -> (&'a str, &'a str) {
    let frames = e.frames.as_deref().unwrap_or(&[]);
    (frames.first().map_or("", |f| f.name.as_str()), frames.get(1).map_or("", |f| f.name.as_str()))
}

#[test]
fn lm_train_predicts_the_recorded_pytorch_run_phase_by_phase() {
    let Some(path) = common::fixture(FIXTURE) else { return };
    let recorded = trace::load_file(&path).unwrap();
    let result = fixture_config();
    assert_eq!(result.model_parameters, Some(423_183_360), "the recorded run's 219 parameters hold 423,183,360 floats");
    let run_json = serde_json::to_value(&result).unwrap();
    let phases = compare::trace_phases(&recorded, 0).unwrap();
    assert_eq!(phases, compare::TracePhases { forward_end: 2774, backward_start: 2794, optimizer_start: 9938, end: 19136 });
    let comparison = compare::compare(&run_json, &recorded, 0).unwrap();
    let trace_bytes: Vec<u64> = comparison.iter().map(|p| p.trace_bytes).collect();
    assert_eq!(trace_bytes, [6_836_221_952, 6_877_188_100, 6_808_535_044, 6_808_535_044, 7_013_335_044], "the fixture's own figures");
    for p in &comparison {
        eprintln!("{:<22} trace {:>14} tensormem {:>14} {:+.2}%", p.phase, p.trace_bytes, p.run_bytes, 100.0 * p.difference());
        let tolerance = if p.phase == "peak" { 0.03 } else { 0.05 };
        assert!(p.difference().abs() <= tolerance, "{}: {:+.2}% (tolerance {tolerance})", p.phase, 100.0 * p.difference());
    }
}

/// Block 5's forward in the recorded step, as (size) of each allocation in order: the trace's
/// events 576..=690 and tensormem's allocations under `layers.5`.
#[test]
fn each_block_allocates_what_the_recorded_block_allocates_in_its_order() {
    let Some(path) = common::fixture(FIXTURE) else { return };
    let recorded = trace::load_file(&path).unwrap();
    let theirs: Vec<u64> = recorded.device_traces[0].range(576..=690).filter(|e| e.action == Action::Alloc).map(|e| e.size).collect();
    assert_eq!((theirs.len(), theirs.iter().sum::<u64>()), (53, 117_601_284));
    let result = fixture_config();
    let trace = &result.snapshot.device_traces[0];
    // The recorded step's forward of block 5: after the warm-up step's optimizer.
    let forward: Vec<Entry<'_>> = trace
        .iter()
        .filter(|e| e.action == Action::Alloc)
        .filter(|e| {
            let (op, scope) = op_and_scope(e);
            (scope == "layers.5" || scope.starts_with("layers.5.")) && !op.contains("Backward")
        })
        .collect();
    assert_eq!(forward.len(), 2 * 53, "the warm-up's forward and the recorded one");
    let ours: Vec<u64> = forward[53..].iter().map(|e| e.size).collect();
    assert_eq!(ours, theirs);
}

#[test]
fn the_handwritten_adamw_allocates_fourteen_times_each_parameter_per_step() {
    let result = fixture_config();
    let trace = &result.snapshot.device_traces[0];
    // After the recorded backward's last allocation, only the optimizer allocates.
    let last_backward = trace.iter().rposition(|e| e.action == Action::Alloc && op_and_scope(&e).0.contains("Backward")).unwrap();
    let optimizer: Vec<Entry<'_>> = trace.range(last_backward + 1..).filter(|e| e.action == Action::Alloc).collect();
    let parameter_bytes = 423_183_360u64 * 4;
    // As the recorded run (events 9938-19134): 14 x 219 allocations, 14 x the parameters' bytes.
    assert_eq!((optimizer.len(), optimizer.iter().map(|e| e.size).sum::<u64>()), (14 * 219, 14 * parameter_bytes));
    let step = |label: &str| result.steps.iter().find(|s| s.label == label).unwrap();
    assert_eq!(step("optimizer step").allocated_bytes, step("backward").allocated_bytes, "the new moments replace the old ones");
    // The step's peak: the largest parameter (the 10,000 x 1,024 embedding, 40,960,000 bytes,
    // each block rounded to 41,943,040) with its old and new moments and three temporaries.
    assert_eq!(step("optimizer step").max_allocated_bytes - step("backward").allocated_bytes, 5 * 41_943_040);
}

#[test]
fn gpt2_small_has_its_published_parameter_count_and_torch_adamw_keeps_two_moments() {
    let sgd = run("gpt2-train", &[("size", "small"), ("batch", "1"), ("context", "64"), ("optimizer", "sgd")], None);
    assert_eq!(sgd.model_parameters, Some(124_439_808));
    let adamw = run("gpt2-train", &[("size", "small"), ("batch", "1"), ("context", "64"), ("optimizer", "adamw")], None);
    // At the end of a step: SGD keeps one momentum buffer per parameter, AdamW two moments.
    let after_step = |r: &RunResult| r.steps.iter().find(|s| s.label == "optimizer step").unwrap().allocated_bytes;
    let extra = after_step(&adamw) - after_step(&sgd);
    let params = 124_439_808u64 * 4;
    assert!(extra >= params && extra < params + params / 100, "AdamW keeps one more parameter-sized tensor per parameter than SGD: {extra} vs {params}");
}

#[test]
fn a_7b_model_with_adamw_runs_out_of_memory_on_an_80_gb_card_and_fits_on_140_gib() {
    let result = run("oom", &[], None);
    assert_eq!(result.model_parameters, Some(6_738_415_616), "Llama 7B's parameter count");
    let error = result.out_of_memory.as_deref().expect("a 7B AdamW step does not fit on an H100");
    assert!(error.starts_with("Out of memory. Tried to allocate "), "{error}");
    assert!(error.contains(" GPU 0 has a total capacity of 79.20 GiB of which "), "{error}");
    assert!(error.contains(" is free. Of the allocated memory "), "{error}");
    assert!(result.steps.iter().any(|s| s.label == "warm-up backward"), "forward and backward fit; the first optimizer step does not: {:?}", result.steps);
    let fits = run("oom", &[], Some(140 << 30));
    assert_eq!(fits.out_of_memory, None);
    assert!(fits.peak_reserved_bytes <= 140 << 30 && fits.peak_reserved_bytes > 80 << 30);
}

#[test]
fn in_bfloat16_the_7b_step_fits_on_the_80_gb_card() {
    let result = run("oom", &[("dtype", "bfloat16")], None);
    assert_eq!(result.out_of_memory, None);
    let float32 = run("oom", &[], None);
    let model = |r: &RunResult| r.steps.iter().find(|s| s.label == "model and batch").unwrap().requested_bytes;
    // The parameters and the rotary tables (cos and sin, 512 positions x 64) at 2 bytes instead
    // of 4; the int64 ids and targets (2 x 512 x 8 bytes) unchanged.
    let rope = 2 * 512 * 64;
    assert_eq!(model(&result) - 8192, (6_738_415_616 + rope) * 2);
    assert_eq!(model(&float32) - 8192, (6_738_415_616 + rope) * 4);
    let request = RunRequest { scenario: "gpt2-train".into(), set: [("context".to_string(), "2048".to_string())].into(), ..Default::default() };
    let error = scenarios::run(&request).unwrap_err().to_string();
    assert!(error.contains("GPT-2's learned positions cover 1024 tokens"), "{error}");
}

#[test]
fn checkpointing_gpt2_keeps_only_each_block_s_input() {
    let set = |checkpointing| [("size", "small"), ("batch", "2"), ("context", "128"), ("checkpointing", checkpointing)];
    let (plain, checkpointed) = (run("gpt2-train", &set("false"), None), run("gpt2-train", &set("true"), None));
    let at = |r: &RunResult, label: &str| r.steps.iter().find(|s| s.label == label).unwrap().requested_bytes;
    // Beside the activations, the forward makes cuBLAS's workspace and (GPT-2's Linear layers
    // have biases: addmm through cuBLASLt) cuBLASLt's: 32 MiB and 1 MiB on an H100.
    let workspaces = (32 << 20) + (1 << 20);
    let held = |r: &RunResult| at(r, "warm-up forward") - at(r, "model and batch") - workspaces;
    // 12 blocks' inputs of 2 x 128 x 768 floats (786,432 bytes each) instead of their activations.
    assert!(held(&checkpointed) * 4 < held(&plain), "{} vs {}", held(&checkpointed), held(&plain));
    // The same gradients and moments at the end; the recomputation in backward runs the blocks'
    // fused addmm on autograd's thread, whose handle gets a cuBLASLt workspace (1 MiB) too.
    assert_eq!(at(&checkpointed, "optimizer step"), at(&plain, "optimizer step") + (1 << 20));
}

// `warmup` and `amp`: the scenarios set to match a recording of the very first step, or one
// under bfloat16 autocast without a GradScaler. Every figure below is what tensors ask for (a
// trace entry's size, `requested_bytes`): products of shapes, before the allocator rounds.

/// Float32 parameter bytes: lm-train's medium (the recorded run's 423,183,360 parameters) and
/// GPT-2 small (124,439,808, in 148 tensors: the two embeddings, 12 per block, the final norm's 2).
const LM_MEDIUM: u64 = 423_183_360 * 4;
const GPT2_SMALL: u64 = 124_439_808 * 4;
const GPT2_SMALL_TENSORS: usize = 2 + 12 * 12 + 2;
/// lm-train medium's largest parameters, the embedding and the output head (the last one the
/// optimizer steps): 10,000 x 1,024 floats each.
const LM_HEAD: u64 = 10_000 * 1_024 * 4;

fn step<'a>(r: &'a RunResult, label: &str) -> &'a Step {
    r.steps.iter().find(|s| s.label == label).unwrap_or_else(|| panic!("no step {label:?}: {:?}", labels(r)))
}

fn labels(r: &RunResult) -> Vec<&str> {
    r.steps.iter().map(|s| s.label.as_str()).collect()
}

/// The run's peak of what tensors asked for (each step's peak since the previous one).
fn peak_requested(r: &RunResult) -> u64 {
    r.steps.iter().map(|s| s.max_requested_bytes).max().unwrap()
}

fn allocations(r: &RunResult) -> impl Iterator<Item = (usize, Entry<'_>)> {
    r.snapshot.device_traces[0].iter().enumerate().filter(|(_, e)| e.action == Action::Alloc)
}

/// The trace positions of the first allocation tagged optimizer_state and of the last one
/// backward made.
fn first_state_and_last_backward(r: &RunResult) -> (usize, usize) {
    let first_state = allocations(r).find(|(_, e)| e.category == Some(Category::OptimizerState)).expect("the optimizer made state").0;
    let last_backward = allocations(r).filter(|(_, e)| op_and_scope(e).0.contains("Backward")).last().expect("backward allocated").0;
    (first_state, last_backward)
}

/// (count, bytes) of the allocations tagged optimizer_state.
fn state_allocations(r: &RunResult) -> (usize, u64) {
    allocations(r).filter(|(_, e)| e.category == Some(Category::OptimizerState)).fold((0, 0), |(n, bytes), (_, e)| (n + 1, bytes + e.size))
}

fn run_error(name: &str, set: &[(&str, &str)]) -> String {
    let request = RunRequest { scenario: name.into(), set: set.iter().map(|(k, v)| (k.to_string(), v.to_string())).collect(), ..Default::default() };
    scenarios::run(&request).err().unwrap_or_else(|| panic!("{name} {set:?} ran")).to_string()
}

#[test]
fn warmup_0_records_gpt2_s_first_step_where_adamw_makes_its_moments() {
    let first = run("gpt2-train", &[("warmup", "0")], None);
    let (default, warm) = (run("gpt2-train", &[], None), run("gpt2-train", &[("warmup", "1")], None));
    assert_eq!(labels(&first), ["model and batch", "forward", "loss", "backward", "optimizer step"], "no warm-up step");
    assert_eq!(
        (default.steps.clone(), default.peak_allocated_bytes, default.peak_reserved_bytes),
        (warm.steps.clone(), warm.peak_allocated_bytes, warm.peak_reserved_bytes)
    );
    assert_eq!(default.parameters["warmup"], 1, "one warm-up step by default, as before");
    // No optimizer state before the recorded step's optimizer phase; torch.optim.AdamW's
    // `_init_group` makes exp_avg and exp_avg_sq (zeros_like each parameter) inside it.
    let (first_state, last_backward) = first_state_and_last_backward(&first);
    assert!(first_state > last_backward, "state at {first_state}, after the backward's last allocation at {last_backward}");
    assert_eq!(state_allocations(&first), (2 * GPT2_SMALL_TENSORS, 2 * GPT2_SMALL));
    let (first_state, last_backward) = first_state_and_last_backward(&warm);
    assert!(first_state < last_backward, "with a warm-up step the moments exist before the recorded backward");
    assert_eq!(state_allocations(&warm), (2 * GPT2_SMALL_TENSORS, 2 * GPT2_SMALL), "made once, in the warm-up step");
    // The step leaves the two moments behind (its square roots are gone); after a warm-up it
    // adds nothing.
    let added = |r: &RunResult| step(r, "optimizer step").requested_bytes - step(r, "backward").requested_bytes;
    assert_eq!(added(&first), 2 * GPT2_SMALL);
    assert_eq!(added(&warm), 0);
    // Until the first backward has run, the warm run also holds autograd's cuBLAS workspace
    // (32 MiB on an H100), made by its warm-up's backward.
    for (label, autograd_workspace) in [("forward", 32 << 20), ("loss", 32 << 20), ("backward", 0)] {
        assert_eq!(
            step(&warm, label).requested_bytes - step(&first, label).requested_bytes,
            2 * GPT2_SMALL + autograd_workspace,
            "{label}: the moments held or not"
        );
    }
    // Batch 8 x context 1024: the peak is in backward (logits and attention probabilities), where
    // the moments of a warmed-up run sit on top; the first step's peak is lower by them and by
    // autograd's workspace, which its backward makes only at its first matmul, after the peak.
    assert_eq!(peak_requested(&first), step(&first, "backward").max_requested_bytes);
    assert_eq!(peak_requested(&warm), step(&warm, "backward").max_requested_bytes);
    assert_eq!(peak_requested(&warm) - peak_requested(&first), 2 * GPT2_SMALL + (32 << 20));
    let twice = run("gpt2-train", &[("warmup", "2")], None);
    assert_eq!(peak_requested(&twice), peak_requested(&warm), "steady from the first warm-up step on");
    assert_eq!(labels(&twice)[1..3], ["warm-up 1 forward", "warm-up 1 loss"]);
    assert_eq!(labels(&twice)[5], "warm-up 2 forward");
    eprintln!(
        "gpt2-train peaks (allocated, reserved): warmup=1 {} {}, warmup=0 {} {}",
        warm.peak_allocated_bytes, warm.peak_reserved_bytes, first.peak_allocated_bytes, first.peak_reserved_bytes
    );
}

#[test]
fn warmup_0_records_lm_train_s_first_step_where_the_handwritten_adamw_makes_its_moments() {
    let (first, warm) = (run("lm-train", &[("warmup", "0")], None), run("lm-train", &[], None));
    let (first_state, last_backward) = first_state_and_last_backward(&first);
    assert!(first_state > last_backward, "state at {first_state}, after the backward's last allocation at {last_backward}");
    // `state.get(key, zeros_like(p))` makes two zeros per parameter every step, then the new m
    // and v: 4 tagged allocations of each of the 219 parameters.
    assert_eq!(state_allocations(&first), (4 * 219, 4 * LM_MEDIUM));
    let added = |r: &RunResult| step(r, "optimizer step").requested_bytes - step(r, "backward").requested_bytes;
    assert_eq!(added(&first), 2 * LM_MEDIUM, "the first step leaves m and v");
    assert_eq!(added(&warm), 0, "later steps replace them");
    assert_eq!(step(&warm, "backward").requested_bytes - step(&first, "backward").requested_bytes, 2 * LM_MEDIUM);
    // The step's peak: in a warmed-up step, at the largest parameter, its old and new moments
    // and three temporaries on top of every moment (5 x S). In the first step, at the last
    // parameter (the output head, as large as the embedding): the moments of all the others,
    // 2 x (P - S), and 7 x S for its zeros, new moments and temporaries: the same bytes.
    assert_eq!(step(&warm, "optimizer step").max_requested_bytes, step(&warm, "backward").requested_bytes + 5 * LM_HEAD);
    assert_eq!(step(&first, "optimizer step").max_requested_bytes, step(&first, "backward").requested_bytes + 2 * (LM_MEDIUM - LM_HEAD) + 7 * LM_HEAD);
    assert_eq!(peak_requested(&first), step(&first, "optimizer step").max_requested_bytes);
    assert_eq!(peak_requested(&first), peak_requested(&warm), "lm-train's peak is the optimizer's either way");
    eprintln!(
        "lm-train peaks (allocated, reserved): warmup=1 {} {}, warmup=0 {} {}",
        warm.peak_allocated_bytes, warm.peak_reserved_bytes, first.peak_allocated_bytes, first.peak_reserved_bytes
    );
}

/// GPT-2 small's token embedding (tied to the output): 50,257 x 768 floats, its largest
/// parameter and the first one the optimizer steps.
const GPT2_WTE: u64 = 50_257 * 768 * 4;
/// lm-train's feed-forward weights at 2.7b (2,560 x 10,240 floats), its largest parameters,
/// stepped w1, w2, w3 in a row.
const LM_2_7B_FFN: u64 = 2_560 * 10_240 * 4;

/// What the optimizer holds at its phase's peak beyond what it leaves (requested bytes).
fn optimizer_temporaries(r: &RunResult, label: &str) -> u64 {
    step(r, label).max_requested_bytes - step(r, label).requested_bytes
}

#[test]
fn foreach_false_runs_the_single_tensor_adamw_whose_peak_is_one_parameter_s_temporaries() {
    let set = |size, foreach| [("size", size), ("batch", "1"), ("context", "64"), ("optimizer", "adamw"), ("foreach", foreach)];
    for (name, size, params, extra) in [
        // GPT-2: the token embedding comes first (no denominator before it): its square root and quotient.
        ("gpt2-train", "small", GPT2_SMALL, 2 * GPT2_WTE),
        // lm-train medium: the output head comes last, after the final norm (1,024 floats): the
        // norm's denominator beside the head's square root and quotient.
        ("lm-train", "medium", LM_MEDIUM, 2 * LM_HEAD + 1_024 * 4),
    ] {
        let (multi, single) = (run(name, &set(size, "true"), None), run(name, &set(size, "false"), None));
        let default = run(name, &set(size, "true")[..4], None);
        assert_eq!((default.steps.clone(), default.peak_allocated_bytes), (multi.steps.clone(), multi.peak_allocated_bytes), "{name}: foreach by default");
        assert_eq!((multi.parameters["foreach"].as_bool(), single.parameters["foreach"].as_bool()), (Some(true), Some(false)));
        assert_eq!(labels(&multi), labels(&single));
        for label in labels(&multi) {
            assert_eq!(step(&multi, label).requested_bytes, step(&single, label).requested_bytes, "{name} {label}: the same memory between the phases");
        }
        for label in ["warm-up optimizer step", "optimizer step"] {
            assert_eq!(optimizer_temporaries(&multi, label), params, "{name} {label}: foreach holds a square root of every parameter at once");
            assert_eq!(optimizer_temporaries(&single, label), extra, "{name} {label}: single-tensor holds one parameter's");
        }
    }
    // The recorded 2.7b run's setting (the first step), where the feed-forward weights outgrow
    // the embedding: at w2, w1's denominator and w2's square root and quotient.
    let set = |foreach| [("size", "2.7b"), ("batch", "4"), ("context", "128"), ("warmup", "0"), ("optimizer", "adamw"), ("foreach", foreach)];
    let (multi, single) = (run("lm-train", &set("true"), None), run("lm-train", &set("false"), None));
    let parameters = multi.model_parameters.expect("counted") * 4;
    assert_eq!(optimizer_temporaries(&multi, "optimizer step"), parameters);
    assert_eq!(optimizer_temporaries(&single, "optimizer step"), 3 * LM_2_7B_FFN);
    assert_eq!(peak_requested(&multi) - peak_requested(&single), parameters - 3 * LM_2_7B_FFN);
    eprintln!(
        "lm-train 2.7b first step peaks (allocated, reserved): foreach {} {}, single-tensor {} {}",
        multi.peak_allocated_bytes, multi.peak_reserved_bytes, single.peak_allocated_bytes, single.peak_reserved_bytes
    );
}

#[test]
fn amp_true_is_amp_float16() {
    for name in ["lm-train", "gpt2-train"] {
        let set = |amp| [("size", "small"), ("batch", "1"), ("context", "8"), ("amp", amp)];
        let (alias, float16) = (run(name, &set("true"), None), run(name, &set("float16"), None));
        assert_eq!(alias.parameters, float16.parameters, "{name}: amp=true is read as float16");
        assert_eq!(alias.parameters["amp"], "float16");
        assert_eq!(
            (alias.steps, alias.peak_allocated_bytes, alias.peak_reserved_bytes),
            (float16.steps, float16.peak_allocated_bytes, float16.peak_reserved_bytes)
        );
        assert_eq!(alias.snapshot.device_traces, float16.snapshot.device_traces, "{name}: the same trace");
    }
}

/// How many allocations of each (op, size) `a` makes beyond `b` (negative: fewer).
fn allocation_difference(a: &RunResult, b: &RunResult) -> BTreeMap<(String, u64), i64> {
    let mut counts = BTreeMap::new();
    for (r, sign) in [(a, 1), (b, -1)] {
        for (_, e) in allocations(r) {
            *counts.entry((op_and_scope(&e).0.to_string(), e.size)).or_insert(0) += sign;
        }
    }
    counts.retain(|_, n| *n != 0);
    counts
}

fn counted(entries: &[(&str, u64, i64)]) -> BTreeMap<(String, u64), i64> {
    entries.iter().map(|&(op, size, n)| ((op.to_string(), size), n)).collect()
}

#[test]
fn bfloat16_autocast_casts_to_two_bytes_and_has_no_grad_scaler() {
    let set = |amp| [("size", "small"), ("batch", "1"), ("context", "8"), ("amp", amp)];
    // What bfloat16 autocast does not make and float16 does (a default run: 2 steps): the
    // GradScaler's scale (float32) and growth tracker (int32), made at the first `scale`, and
    // in each step the scaled loss, the loss's gradient backward makes from it (MulBackward0:
    // 1 x scale), unscale_'s float64 `_scale.double().reciprocal()` and its float32 inverse,
    // found_inf, and the copies of both that `_unscale_grads_` hands the kernel: all 0-d.
    let scaler = [("full", 4, 2 + 2), ("mul", 4, 2), ("mul (MulBackward0)", 4, 2), ("to", 8, 2), ("reciprocal", 8, 2), ("to", 4, 3 * 2)];
    let without_scaler = |extra: &[(&str, u64, i64)]| counted(&[scaler.map(|(op, size, n)| (op, size, -n)).as_slice(), extra].concat());
    // lm-train writes its softmax out: otherwise every allocation is float16's, casts included
    // (2 bytes an element either way).
    let (bf16, f16) = (run("lm-train", &set("bfloat16"), None), run("lm-train", &set("float16"), None));
    assert_eq!(allocation_difference(&bf16, &f16), without_scaler(&[]), "lm-train");
    // GPT-2's attention calls softmax, on autocast's fp32_set_opt_dtype list: ATen reads a
    // float16 input straight into the float32 result (`half_to_float`, CUDA and Half only) but
    // copies a bfloat16 one to float32 first; backward then gives a float32 gradient and
    // ToCopyBackward0 the bfloat16 one. 12 layers x 2 steps, probabilities of 12 heads x 8 x 8.
    let probabilities = 12 * 8 * 8;
    let (bf16, f16) = (run("gpt2-train", &set("bfloat16"), None), run("gpt2-train", &set("float16"), None));
    let softmax_copies = [
        ("to", probabilities * 4, 24),
        ("softmax_backward (SoftmaxBackward0)", probabilities * 4, 24),
        ("softmax_backward (SoftmaxBackward0)", probabilities * 2, -24),
        ("to (ToCopyBackward0)", probabilities * 2, 24),
    ];
    assert_eq!(allocation_difference(&bf16, &f16), without_scaler(&softmax_copies), "gpt2-train");
    for r in [&bf16, &f16] {
        let scaler_frames = allocations(r).filter(|(_, e)| e.frames.as_deref().unwrap_or(&[]).iter().any(|f| f.filename.ends_with("scaler.rs"))).count();
        assert_eq!(scaler_frames, if std::ptr::eq(r, &bf16) { 0 } else { 2 * 6 }, "unscale_'s allocations");
    }
    // The scaler's state: 8 bytes that float16 keeps and bfloat16 does not; its scaled loss, 4
    // more while backward runs (the 0-d gradients at backward's start are gone by its peak).
    for label in ["warm-up optimizer step", "forward", "optimizer step"] {
        assert_eq!(step(&f16, label).requested_bytes - step(&bf16, label).requested_bytes, 4 + 4, "{label}");
    }
    let (lm_bf16, lm_f16) = (run("lm-train", &set("bfloat16"), None), run("lm-train", &set("float16"), None));
    assert_eq!(step(&lm_f16, "backward").max_requested_bytes - step(&lm_bf16, "backward").max_requested_bytes, 4 + 4 + 4);
    // GPT-2's weights cast to bfloat16 once per forward and shared while autocast lasts (its
    // cast cache): the output head's tied embedding (50,257 x 768) and each block's c_attn
    // weight (768 x 2,304), at 2 bytes an element; none at 4.
    let casts = |bytes: u64| allocations(&bf16).filter(|(_, e)| op_and_scope(e).0 == "to" && e.size == bytes).count();
    assert_eq!((casts(50_257 * 768 * 2), casts(50_257 * 768 * 4)), (2, 0), "the head's weight: once in each of the two forwards");
    assert_eq!((casts(768 * 2_304 * 2), casts(768 * 2_304 * 4)), (2 * 12, 0), "c_attn's weight: once per block per forward");
}

#[test]
fn bfloat16_autocast_takes_any_parameter_type_and_float16_only_float32() {
    let set = |dtype, amp| [("size", "small"), ("batch", "1"), ("context", "8"), ("dtype", dtype), ("amp", amp)];
    let bf16 = run("gpt2-train", &set("bfloat16", "bfloat16"), None);
    // bfloat16 parameters under bfloat16 autocast: nothing of the weights to cast.
    let weight_casts = allocations(&bf16).filter(|(_, e)| op_and_scope(e).0 == "to" && e.size == 768 * 2_304 * 2).count();
    assert_eq!(weight_casts, 0);
    for name in ["lm-train", "gpt2-train"] {
        let error = run_error(name, &[("dtype", "bfloat16"), ("amp", "float16")]);
        assert!(error.contains("amp=float16 keeps float32 parameters") && error.contains("amp=bfloat16 needs no GradScaler"), "{error}");
    }
}

#[test]
fn bad_amp_and_warmup_values_name_the_accepted_ones() {
    for name in ["lm-train", "gpt2-train", "oom"] {
        let error = run_error(name, &[("amp", "fp16")]);
        assert!(error.contains(r#"amp must be one of false, float16, bfloat16 (true = float16), got "fp16""#), "{error}");
        let error = run_error(name, &[("warmup", "-1")]);
        assert!(error.contains(r#"warmup must be a whole number from 0 to 1000, got "-1""#), "{error}");
    }
    let amp = scenarios::find("lm-train").unwrap().parameters.into_iter().find(|p| p.name == "amp").unwrap();
    let kind = serde_json::to_value(amp.kind).unwrap();
    assert_eq!(kind, serde_json::json!({"type": "choice", "options": ["false", "float16", "bfloat16"], "aliases": [["true", "float16"]]}));
}
