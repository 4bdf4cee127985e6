//! Each scenario's memory facts, in the allocator's exact bytes (sim device): what the seed
//! articles' examples really allocate.

use tensormem::scenarios::{self, RunRequest, RunResult, Step};
use tensormem::trace::Action;

const MIB: u64 = 1 << 20;
/// cuBLAS's workspace per thread on the default card (an H100: compute capability 9.0).
const WORKSPACE: u64 = 32 * MIB;

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
    // The first matmul also makes cuBLAS's workspace (32 MiB on an H100, a segment of its own),
    // which nothing frees: not del, not empty_cache.
    let product = step(&r, "after matrix");
    assert_eq!(
        (product.allocated_bytes, product.max_allocated_bytes, product.reserved_bytes),
        (2 * gb4 + WORKSPACE, 3 * gb4 + WORKSPACE, 3 * segment + WORKSPACE)
    );
    let deleted = step(&r, "after del");
    assert_eq!((deleted.allocated_bytes, deleted.reserved_bytes), (WORKSPACE, 3 * segment + WORKSPACE), "del frees; the cache keeps the segments");
    let emptied = step(&r, "after empty_cache");
    assert_eq!((emptied.allocated_bytes, emptied.reserved_bytes), (WORKSPACE, WORKSPACE));
    assert_eq!(r.peak_allocated_bytes, 3 * gb4 + WORKSPACE);
}

#[test]
fn intermediates_allocate_only_their_outputs() {
    let r = run("intermediates", None, &[]);
    let square = rounded(4_000_000);
    assert_eq!(step(&r, "c = a + b").allocated_bytes - step(&r, "a, b = randn(1000, 1000)").allocated_bytes, square, "one output, no temporary");
    // The output, and the workspace of the program's first matmul, kept from then on.
    assert_eq!(step(&r, "c = matmul").allocated_bytes - step(&r, "a, b = randn(1000, 2000)").allocated_bytes, rounded(2_000_000) + WORKSPACE);
    let refused = step(&r, "a.add_");
    assert!(refused.label.contains("refused: a leaf Variable that requires grad is being used in an in-place operation."), "{}", refused.label);
    assert_eq!((refused.allocated_bytes, refused.max_allocated_bytes), (square + WORKSPACE, 2 * square + WORKSPACE), "only the randn operand came and went");
    let no_grad = step(&r, "with no_grad");
    assert_eq!((no_grad.allocated_bytes, no_grad.max_allocated_bytes), (square + WORKSPACE, 2 * square + WORKSPACE));
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
        let held = series(&fix, "validation batch");
        assert!(held.iter().all(|&b| b == model + 512 + WORKSPACE), "{guard}: the parameters, the batch, the 0-d loss and cuBLAS's workspace: {held:?}");
        // Both hold cuBLAS's workspace; beyond it, the fix's peak is a fraction of the mistake's.
        assert!((fix.peak_allocated_bytes - WORKSPACE) * 5 < mistake.peak_allocated_bytes - WORKSPACE, "{guard}");
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
    assert_eq!(zeroed, model + 2 * WORKSPACE, "set_to_none=True frees every gradient block (the main thread's and autograd's workspaces stay)");
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

#[test]
fn a_carried_hidden_state_grows_by_one_batch_graph_and_detaching_stays_flat() {
    let mistake = run("rnn-hidden", Some("mistake"), &[("steps", "5")]);
    let per_batch = growth(&series(&mistake, "batch"));
    assert!(per_batch[0] > MIB as i64 && per_batch.iter().all(|&g| g == per_batch[0]), "one batch's graph per batch: {per_batch:?}");
    let fix = run("rnn-hidden", Some("fix"), &[("steps", "5")]);
    assert_eq!(growth(&series(&fix, "batch")), [0; 4]);
}

#[test]
fn a_cached_checkpoint_result_holds_one_activation_between_steps() {
    let (batch, width) = (64u64, 2048u64);
    let mistake = run("cached-graph", Some("mistake"), &[]);
    let fix = run("cached-graph", Some("fix"), &[]);
    for s in ["step 1: backward and step", "step 3: backward and step"] {
        assert_eq!(step(&mistake, s).allocated_bytes - step(&fix, s).allocated_bytes, rounded(batch * width * 4), "{s}");
    }
}

/// The small `lm` model's parameter blocks: vocabulary 1,000, width 256, 4 blocks, 688 wide.
fn small_lm_parameter_bytes() -> u64 {
    let (v, d, h) = (1000u64, 256u64, 688u64);
    let block = 4 * rounded(d * d * 4) + 3 * rounded(d * h * 4) + 2 * rounded(d * 4);
    2 * rounded(v * d * 4) + 4 * block + rounded(d * 4)
}

#[test]
fn sgd_keeps_nothing_momentum_one_buffer_adam_two_moments_per_parameter() {
    let parameters = small_lm_parameter_bytes();
    for (optimizer, buffers) in [("sgd", 0), ("momentum", 1), ("adam", 2)] {
        let r = run("optimizer-state", None, &[("optimizer", optimizer)]);
        assert_eq!(r.model_parameters, Some(1000 * 256 * 2 + 4 * (4 * 256 * 256 + 3 * 256 * 688 + 2 * 256) + 256));
        let state = step(&r, "step 1: optimizer.step()").allocated_bytes - step(&r, "step 1: backward").allocated_bytes;
        assert_eq!(state, buffers * parameters, "{optimizer}: state made at the first step");
        // Nothing more at the second step.
        assert_eq!(step(&r, "step 2: optimizer.step()").allocated_bytes, step(&r, "step 1: optimizer.step()").allocated_bytes, "{optimizer}");
    }
}

#[test]
fn micro_batches_lower_the_activation_peak_and_accumulate_gradients_in_place() {
    let mistake = run("grad-accumulation", Some("mistake"), &[]);
    let fix = run("grad-accumulation", Some("fix"), &[]);
    let after = series(&fix, "step 2: micro-batch");
    assert!(after.iter().all(|&a| a == after[0]), "backward adds into the same gradient blocks: {after:?}");
    assert_eq!(step(&fix, "step 2: optimizer.step()").allocated_bytes, step(&mistake, "step 2: optimizer.step()").allocated_bytes);
    assert!(fix.peak_allocated_bytes * 2 < mistake.peak_allocated_bytes, "{} vs {}", fix.peak_allocated_bytes, mistake.peak_allocated_bytes);
}

#[test]
fn checkpointing_keeps_one_input_per_block_between_forward_and_backward() {
    let (batch, context, width) = (8u64, 256u64, 256u64);
    let held = |r: &RunResult| step(r, "forward").requested_bytes - step(r, "model and batch").requested_bytes;
    let fix4 = run("checkpointing", Some("fix"), &[("layers", "4")]);
    let fix2 = run("checkpointing", Some("fix"), &[("layers", "2")]);
    assert_eq!(held(&fix4) - held(&fix2), 2 * batch * context * width * 4, "each checkpointed block adds its output, the next one's input");
    let mistake4 = run("checkpointing", Some("mistake"), &[("layers", "4")]);
    assert!(held(&mistake4) > 5 * held(&fix4), "{} vs {}", held(&mistake4), held(&fix4));
    // The same gradients and state at the end.
    assert_eq!(step(&fix4, "optimizer step").allocated_bytes, step(&mistake4, "optimizer step").allocated_bytes);
}

#[test]
fn under_autocast_the_loss_in_float32_costs_more_than_outside_it() {
    let fix = run("mixed-precision", Some("fix"), &[]);
    let mistake = run("mixed-precision", Some("mistake"), &[]);
    let loss = |r: &RunResult| step(r, "step 1: loss").allocated_bytes - step(r, "step 1: forward").allocated_bytes;
    assert!(loss(&mistake) < loss(&fix), "outside autocast the loss runs in float16: {} vs {}", loss(&mistake), loss(&fix));
    assert_eq!(step(&fix, "step 2: optimizer step").allocated_bytes, step(&mistake, "step 2: optimizer step").allocated_bytes);
    let float32 = run("mixed-precision", Some("fix"), &[("amp", "false")]);
    assert!(step(&float32, "step 1: forward").allocated_bytes > step(&fix, "step 1: forward").allocated_bytes);
}

#[test]
fn cublas_workspaces_follow_the_card_and_cublas_workspace_config() {
    // intermediates: one matmul, forward only: its workspace is what the step adds beyond the
    // 2,000,000-byte output (2,000,384 in blocks).
    let workspace = |device: &str, config: Option<&str>| {
        let request = RunRequest {
            scenario: "intermediates".into(),
            device: Some(device.into()),
            cublas_workspace_config: config.map(String::from),
            ..Default::default()
        };
        let r = scenarios::run(&request).unwrap();
        step(&r, "c = matmul").allocated_bytes - step(&r, "a, b = randn(1000, 2000)").allocated_bytes - rounded(2_000_000)
    };
    // PyTorch 2.11: `:4096:8` on compute capability 9.x (and 10.x, 12.x), `:4096:2:16:8` before.
    assert_eq!(workspace("sim:H100-80GB", None), 32 * MIB);
    assert_eq!(workspace("sim:A100-80GB", None), 8_519_680);
    assert_eq!(workspace("sim:T4-16GB", None), 8_519_680);
    // A size is a card like the H100; Apple's M2 runs MPS, which has no cuBLAS.
    assert_eq!(workspace("sim:24GiB", None), 32 * MIB);
    assert_eq!(workspace("sim:M2-16GB-unified", None), 0);
    // ROCm on an MI300X (gfx942): hipBLAS's 128 MiB; HIPBLAS_WORKSPACE_CONFIG's pairs as CUDA's.
    assert_eq!(workspace("sim:MI300X-192GB", None), 128 * MIB);
    assert_eq!(workspace("sim:MI300X-192GB", Some(":4096:2:16:8")), 8_519_680);
    // CUBLAS_WORKSPACE_CONFIG sums its :SIZE:COUNT pairs (KiB); :0:0 allocates nothing.
    assert_eq!(workspace("sim:H100-80GB", Some(":4096:2:16:8")), 8_519_680);
    assert_eq!(workspace("sim:A100-80GB", Some(":4096:8")), 32 * MIB);
    assert_eq!(workspace("sim:H100-80GB", Some(":0:0")), 0);
    let bad = RunRequest { scenario: "intermediates".into(), cublas_workspace_config: Some("4096".into()), ..Default::default() };
    assert!(scenarios::run(&bad).unwrap_err().to_string().contains("expected :SIZE:COUNT pairs"));
}

#[test]
fn an_mi300x_linear_with_a_bias_gets_hipblaslt_s_own_76_mib() {
    use tensormem::nn::Linear;
    use tensormem::{DType, Device, SimOptions};
    let dev = Device::sim(SimOptions::preset("MI300X-192GB"));
    assert_eq!(dev.capacity(), Some(196_592 * MIB));
    let linear = Linear::new(&dev, "fc", 256, 512, true, DType::F32).unwrap();
    let x = dev.randn(&[64, 256], DType::F32).unwrap();
    let from = dev.snapshot().device_traces[0].len();
    let _y = linear.forward(&x).unwrap();
    let snapshot = dev.snapshot();
    let made: Vec<(&str, u64)> =
        snapshot.device_traces[0].range(from..).filter(|e| e.action == Action::Alloc).map(|e| (e.frames.as_ref().unwrap()[0].name.as_str(), e.size)).collect();
    // The output, then the thread's hipBLAS workspace and hipBLASLt's (never shared on ROCm).
    assert_eq!(made, [("addmm", 64 * 512 * 4), ("at::cuda::getNewWorkspace", 128 * MIB), ("at::cuda::getCUDABlasLtWorkspace", 76 * MIB)]);
}

/// Bytes reserved by segments of `pool` where the run ends.
fn pool_reserved(r: &RunResult, pool: (i64, i64)) -> u64 {
    r.snapshot.segments.iter().filter(|s| s.segment_pool_id == pool).map(|s| s.total_size).sum()
}

#[test]
fn a_captured_training_step_keeps_its_peak_in_a_pool_that_replays_reuse() {
    let graph = run("cuda-graph-step", None, &[]);
    let eager = run("cuda-graph-step", None, &[("mode", "eager")]);
    // Eager steps settle at 242 MiB reserved. torch.cuda.graph empties the cache as it begins
    // (the warm-up's cached blocks go), then the captured step's 192 MiB pool comes on top of
    // what stays live, so a later empty_cache() has nothing to return.
    assert_eq!(step(&eager, "eager step 4").reserved_bytes, 242 * MIB);
    assert_eq!(step(&graph, "captured").reserved_bytes, 314 * MIB);
    let emptied = step(&graph, "torch.cuda.empty_cache()");
    assert_eq!(emptied.reserved_bytes, 314 * MIB);
    // Replays allocate nothing: every figure stays where the capture left it.
    let replays: Vec<&Step> = graph.steps.iter().filter(|s| s.label.starts_with("replay")).collect();
    assert_eq!(replays.len(), 4);
    for s in replays {
        assert_eq!(
            (s.allocated_bytes, s.reserved_bytes, s.max_allocated_bytes),
            (emptied.allocated_bytes, emptied.reserved_bytes, emptied.allocated_bytes),
            "{}",
            s.label
        );
    }
    // The graph made its own pool, (1, 0): 192 MiB, of which the capture stream's two cuBLAS
    // workspaces (the forward's handle and backward's) are all that outlives the program.
    assert_eq!(pool_reserved(&graph, (1, 0)), 192 * MIB);
    let live: Vec<u64> = graph
        .snapshot
        .segments
        .iter()
        .filter(|s| s.segment_pool_id == (1, 0))
        .flat_map(|s| &s.blocks)
        .filter(|b| b.state.is_active())
        .map(|b| b.size)
        .collect();
    assert_eq!(live, [WORKSPACE, WORKSPACE]);
    assert!(eager.snapshot.segments.iter().all(|s| s.segment_pool_id == (0, 0)));
    // Registering the random generator with the first graph made its seed and offset: two
    // 8-byte tensors on the capture stream, in the default pool, just before the pool's first
    // segment (a 2 MiB segment of their own: nothing else was cached on that stream).
    let trace = &graph.snapshot.device_traces[0];
    let first_in_pool = trace.iter().position(|e| e.pool_id().is_some()).unwrap();
    let before: Vec<_> =
        trace.range(..first_in_pool).filter(|e| e.action == Action::Alloc).map(|e| (e.size, e.frames.as_ref().unwrap()[0].name.clone())).collect();
    let generator = "at::CUDAGeneratorState::register_graph".to_string();
    assert_eq!(before[before.len() - 2..], [(8, generator.clone()), (8, generator)]);
    assert!(trace.range(..first_in_pool).rev().take(3).any(|e| e.action == Action::SegmentAlloc && e.size == 2 * MIB));
}

#[test]
fn graphs_for_several_batch_sizes_add_up_in_pools_of_their_own_and_not_in_a_shared_one() {
    let reserved = |set: &[(&str, &str)]| run("cuda-graph-pools", None, set).steps.iter().map(|s| s.reserved_bytes / MIB).collect::<Vec<_>>();
    // The model, then a capture for each of batch 8, 4, 2 and 1.
    assert_eq!(reserved(&[]), [16, 80, 108, 112, 114]);
    // Sharing one pool, the smaller captures fit in what the first one freed.
    assert_eq!(reserved(&[("pools", "shared")]), [16, 80, 80, 80, 80]);
    // Smallest first, each larger capture needs more than the pool has free.
    assert_eq!(reserved(&[("pools", "shared"), ("batches", "1,2,4,8")]), [16, 52, 56, 80, 82]);
    let own = run("cuda-graph-pools", None, &[]);
    let mut pools: Vec<(i64, i64)> = own.snapshot.segments.iter().map(|s| s.segment_pool_id).filter(|&p| p != (0, 0)).collect();
    pools.dedup();
    pools.sort();
    pools.dedup();
    assert_eq!(pools, [(1, 0), (2, 0), (3, 0), (4, 0)], "a pool per graph, named as graphs name their own");
    let shared = run("cuda-graph-pools", None, &[("pools", "shared")]);
    assert_eq!(pool_reserved(&shared, (0, 1)), (80 - 16 - 2) * MIB, "one handle's pool: all but the model and the inputs' segment");
}
