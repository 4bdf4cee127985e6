//! Each scenario's memory facts, in the allocator's exact bytes (sim device): what the seed
//! articles' examples really allocate.

use tensormem::scenarios::{self, RunRequest, RunResult, Step};
use tensormem::trace::Action;

const MIB: u64 = 1 << 20;

fn rounded(bytes: u64) -> u64 {
    bytes.div_ceil(512).max(1) * 512
}

fn run(name: &str, variant: Option<&str>, set: &[(&str, &str)]) -> RunResult {
    let request = RunRequest {
        scenario: name.into(),
        variant: variant.map(String::from),
        set: set.iter().map(|(k, v)| (k.to_string(), v.to_string())).collect(),
        ..Default::default()
    };
    scenarios::run(&request).unwrap_or_else(|e| panic!("{name}: {e}"))
}

/// The step whose label starts with `label`.
fn step<'a>(r: &'a RunResult, label: &str) -> &'a Step {
    r.steps.iter().find(|s| s.label.starts_with(label)).unwrap_or_else(|| panic!("{}: no step {label:?} in {:?}", r.scenario, r.steps))
}

fn allocations(r: &RunResult) -> usize {
    r.snapshot.device_traces[0].iter().filter(|e| e.action == Action::Alloc).count()
}

fn segment_allocations(r: &RunResult) -> usize {
    r.snapshot.device_traces[0].iter().filter(|e| e.action == Action::SegmentAlloc).count()
}

#[test]
fn every_listed_scenario_runs_with_its_defaults_and_each_variant() {
    for info in scenarios::list() {
        let variants: Vec<Option<&str>> = if info.variants.is_empty() { vec![None] } else { info.variants.iter().map(|v| Some(*v)).collect() };
        for variant in variants {
            let r = run(info.name, variant, &[]);
            assert!(!r.steps.is_empty(), "{}: steps", info.name);
            assert_eq!(r.parameters.len(), info.parameters.len(), "{}: every parameter's value is reported", info.name);
            assert!(r.out_of_memory.is_none() || info.name == "oom", "{}: {:?}", info.name, r.out_of_memory);
        }
    }
}

#[test]
fn bad_requests_are_refused_before_anything_runs() {
    let refuse = |name: &str, variant: Option<&str>, set: &[(&str, &str)], says: &str| {
        let request = RunRequest {
            scenario: name.into(),
            variant: variant.map(String::from),
            set: set.iter().map(|(k, v)| (k.to_string(), v.to_string())).collect(),
            ..Default::default()
        };
        let e = scenarios::run(&request).unwrap_err().to_string();
        assert!(e.contains(says), "{name}: {e}");
    };
    refuse("no-such", None, &[], "unknown scenario");
    refuse("seed-basics", None, &[("n", "abc")], "n must be a whole number from 1 to 1600");
    refuse("seed-basics", None, &[("size", "3")], "unknown parameter \"size\"");
    refuse("intermediates", None, &[("n", "3")], "takes no parameters");
    refuse("seed-basics", Some("fix"), &[], "has no variants");
    refuse("inplace-chain", Some("better"), &[], "unknown variant");
    refuse("variable-batch", None, &[("batches", "4,x")], "batches must be a whole number");
}

#[test]
fn seed_basics_reserves_whole_pages_and_keeps_them_until_empty_cache() {
    let r = run("seed-basics", None, &[]);
    let gb4 = 4_000_000_000;
    // 4e9 bytes is a 512-byte multiple; its segment rounds up to 2 MiB pages: 1908 of them.
    let segment = 1908 * 2 * MIB;
    assert_eq!(step(&r, "initial").allocated_bytes, 0);
    let created = step(&r, "after creating");
    assert_eq!((created.allocated_bytes, created.reserved_bytes), (gb4, segment));
    // x.T's batches are neither row- nor column-major: ATen copies it for cuBLAS (freed after).
    let product = step(&r, "after matrix");
    assert_eq!((product.allocated_bytes, product.max_allocated_bytes, product.reserved_bytes), (2 * gb4, 3 * gb4, 3 * segment));
    let deleted = step(&r, "after del");
    assert_eq!((deleted.allocated_bytes, deleted.reserved_bytes), (0, 3 * segment), "del frees; the cache keeps the segments");
    let emptied = step(&r, "after empty_cache");
    assert_eq!((emptied.allocated_bytes, emptied.reserved_bytes), (0, 0));
    assert_eq!(r.peak_allocated_bytes, 3 * gb4);
}

#[test]
fn intermediates_allocate_only_their_outputs() {
    let r = run("intermediates", None, &[]);
    let square = rounded(4_000_000);
    assert_eq!(step(&r, "c = a + b").allocated_bytes - step(&r, "a, b = randn(1000, 1000)").allocated_bytes, square, "one output, no temporary");
    assert_eq!(step(&r, "c = matmul").allocated_bytes - step(&r, "a, b = randn(1000, 2000)").allocated_bytes, rounded(2_000_000));
    let refused = step(&r, "a.add_");
    assert!(refused.label.contains("refused: a leaf Variable that requires grad is being used in an in-place operation."), "{}", refused.label);
    assert_eq!((refused.allocated_bytes, refused.max_allocated_bytes), (square, 2 * square), "only the randn operand came and went");
    let no_grad = step(&r, "with no_grad");
    assert_eq!((no_grad.allocated_bytes, no_grad.max_allocated_bytes), (square, 2 * square));
}

#[test]
fn views_add_nothing_and_keep_their_base_alive() {
    let r = run("views-vs-copies", None, &[]);
    let x = 16 * MIB;
    let bytes: Vec<u64> = r.steps.iter().map(|s| s.allocated_bytes).collect();
    // x; views; clone; t().reshape(-1); t().contiguous(); contiguous(); del copies; del x; del views.
    assert_eq!(bytes, [x, x, 2 * x, 3 * x, 4 * x, 4 * x, x, x, 0]);
}

#[test]
fn an_out_of_place_chain_doubles_the_peak_and_in_place_allocates_nothing() {
    let x = rounded(4_000_000);
    let mistake = run("inplace-chain", Some("mistake"), &[]);
    let fix = run("inplace-chain", Some("fix"), &[]);
    assert_eq!(mistake.peak_allocated_bytes, 2 * x);
    assert_eq!(fix.peak_allocated_bytes, x);
    assert_eq!((allocations(&mistake), allocations(&fix)), (4, 1));
    assert!(mistake.steps.iter().chain(&fix.steps).all(|s| s.allocated_bytes == x));
}

#[test]
fn broadcasting_reads_with_stride_zero_and_expanding_copies() {
    // 400 MB takes a whole 191 x 2 MiB segment: the 543 KiB left over is too small to split off
    // (below 1 MiB), so the block, and allocated, count all of it.
    let x = 191 * 2 * MIB;
    let y = rounded(400);
    let fix = run("broadcast-temporaries", Some("fix"), &[]);
    let mistake = run("broadcast-temporaries", Some("mistake"), &[]);
    assert_eq!(fix.peak_allocated_bytes, 2 * x + y, "x, y and the result");
    assert_eq!(mistake.peak_allocated_bytes, 3 * x + y, "plus the materialised broadcast");
}

#[test]
fn contiguous_costs_one_copy_and_the_loop_the_same_either_way() {
    let x = 16 * MIB;
    let mistake = run("contiguous", Some("mistake"), &[]);
    let fix = run("contiguous", Some("fix"), &[]);
    assert_eq!(allocations(&fix), allocations(&mistake) + 1);
    for r in [&mistake, &fix] {
        assert_eq!(r.peak_allocated_bytes, 2 * x);
        assert!(r.steps.iter().all(|s| s.allocated_bytes == x), "{:?}", r.steps);
    }
}

#[test]
fn allocating_in_a_loop_hits_the_cache_every_time() {
    let steps = 10;
    let mistake = run("alloc-in-loop", Some("mistake"), &[]);
    let fix = run("alloc-in-loop", Some("fix"), &[]);
    assert_eq!((allocations(&mistake), allocations(&fix)), (1 + steps, 2));
    assert_eq!(segment_allocations(&mistake), segment_allocations(&fix), "the cache serves every repeat: no new segment");
    assert!(mistake.steps.iter().all(|s| s.reserved_bytes == mistake.steps[0].reserved_bytes));
}

/// allocated after each step whose label starts with `label`.
fn series(r: &RunResult, label: &str) -> Vec<u64> {
    r.steps.iter().filter(|s| s.label.starts_with(label)).map(|s| s.allocated_bytes).collect()
}

/// The differences between consecutive values.
fn growth(values: &[u64]) -> Vec<i64> {
    values.windows(2).map(|w| w[1] as i64 - w[0] as i64).collect()
}

#[test]
fn evaluation_without_no_grad_holds_a_graph_and_with_it_only_the_loss() {
    let mistake = run("eval-no-grad", Some("mistake"), &[]);
    let model = step(&mistake, "model and batch").allocated_bytes;
    assert_eq!(mistake.model_parameters, Some(3_676_416), "embedding and head 2 x 256,000, 4 layers of 791,040, a norm");
    let held = series(&mistake, "validation batch");
    assert!(held.iter().all(|&b| b > model + 90 * MIB), "every layer's saved activations stay until the next batch: {held:?}");
    for guard in ["no_grad", "inference_mode"] {
        let fix = run("eval-no-grad", Some("fix"), &[("guard", guard)]);
        assert!(series(&fix, "validation batch").iter().all(|&b| b == model + 512), "{guard}: the parameters, the batch and the 0-d loss");
        assert!(fix.peak_allocated_bytes < mistake.peak_allocated_bytes / 5, "{guard}");
    }
}

#[test]
fn a_kept_loss_grows_by_one_block_per_step_and_item_stays_flat() {
    let mistake = run("loss-history", Some("mistake"), &[("steps", "5")]);
    assert_eq!(growth(&series(&mistake, "step")), [512; 4], "after backward a kept loss holds its own 512-byte block");
    let fix = run("loss-history", Some("fix"), &[("steps", "5")]);
    assert_eq!(growth(&series(&fix, "step")), [0; 4]);
    // Without backward the kept loss holds its whole graph: a forward's activations per step.
    let forward_only = run("loss-history", Some("mistake"), &[("steps", "4"), ("backward", "false")]);
    let per_step = growth(&series(&forward_only, "step"));
    assert!(per_step.iter().all(|&g| g > 90 * MIB as i64 && (g - per_step[0]).abs() < MIB as i64), "{per_step:?}");
    assert_eq!(growth(&series(&run("loss-history", Some("fix"), &[("backward", "false")]), "step")), [0; 3]);
}

#[test]
fn zero_grad_frees_the_gradients_or_keeps_their_blocks_and_forgetting_it_adds_no_memory() {
    let freed = run("zero-grad", Some("fix"), &[("set_to_none", "true")]);
    let after_step = series(&freed, "step 1: optimizer.step()")[0];
    let zeroed = series(&freed, "step 2: zero_grad")[0];
    let model = step(&freed, "model and batch").allocated_bytes;
    assert_eq!(zeroed, model, "set_to_none=True frees every gradient block");
    assert!(after_step - zeroed > 14 * MIB, "the gradients: 14 MiB of float32 for 3.7 M parameters");
    let kept = run("zero-grad", Some("fix"), &[("set_to_none", "false")]);
    assert_eq!(series(&kept, "step 2: zero_grad")[0], series(&kept, "step 1: optimizer.step()")[0], "set_to_none=False keeps the blocks");
    let forgotten = run("zero-grad", Some("mistake"), &[]);
    let backward = series(&forgotten, "step");
    assert!(backward.iter().skip(1).all(|&b| b == backward[1]), "backward accumulates in place: no growth {backward:?}");
}

#[test]
fn keeping_grad_fn_keeps_each_graphs_saved_tensors() {
    let mistake = run("grad-fn-history", Some("mistake"), &[]);
    let per_step = growth(&series(&mistake, "step"));
    assert!(per_step.iter().all(|&g| g > 90 * MIB as i64), "{per_step:?}");
    let fix = run("grad-fn-history", Some("fix"), &[]);
    assert_eq!(growth(&series(&fix, "step")), [0; 3]);
}
