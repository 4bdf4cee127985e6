//! The training scenarios against what PyTorch really allocates: `lm-train` at the recorded
//! run's config against its `_record_memory_history` trace (phase by phase, block by block,
//! parameter by parameter), GPT-2's published size, and the 7B model that does not fit.

mod common;

use tensormem::scenarios::{self, RunRequest, RunResult, compare};
use tensormem::trace::{self, Action, TraceEntry};

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
fn op_and_scope(e: &TraceEntry) -> (&str, &str) {
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
    let theirs: Vec<u64> = recorded.device_traces[0][576..=690].iter().filter(|e| e.action == Action::Alloc).map(|e| e.size).collect();
    assert_eq!((theirs.len(), theirs.iter().sum::<u64>()), (53, 117_601_284));
    let result = fixture_config();
    let trace = &result.snapshot.device_traces[0];
    // The recorded step's forward of block 5: after the warm-up step's optimizer.
    let forward: Vec<&TraceEntry> = trace
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
    let last_backward = trace.iter().rposition(|e| e.action == Action::Alloc && op_and_scope(e).0.contains("Backward")).unwrap();
    let optimizer: Vec<&TraceEntry> = trace[last_backward + 1..].iter().filter(|e| e.action == Action::Alloc).collect();
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
    let held = |r: &RunResult| at(r, "warm-up forward") - at(r, "model and batch");
    // 12 blocks' inputs of 2 x 128 x 768 floats (786,432 bytes each) instead of their activations.
    assert!(held(&checkpointed) * 4 < held(&plain), "{} vs {}", held(&checkpointed), held(&plain));
    assert_eq!(at(&checkpointed, "optimizer step"), at(&plain, "optimizer step"), "the same gradients and moments at the end");
}
