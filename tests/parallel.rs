//! Training over several simulated GPUs (`world`, `strategy`): the bytes each rank holds where
//! the rules make them exact (DDP's buckets, ZeroRedundancyOptimizer's partition, FSDP's flat
//! shards), DeepSpeed's closed forms beside them, and the errors.

use tensormem::DType;
use tensormem::Device;
use tensormem::SimOptions;
use tensormem::nn::parallel::{bucket_assignment, partition_parameters, shard_numel};
use tensormem::nn::{Lm, LmConfig, Module};
use tensormem::scenarios::{self, RunRequest, RunResult};

const MIB: u64 = 1 << 20;

mod common;

use common::{requested_at as requested, run_scenario as run, scenario_request as request};

/// lm-train's small model: each block's parameter count, and the rest (embedding, final norm,
/// output), the units FSDP shards.
fn small_units() -> (Vec<usize>, usize) {
    let lm = Lm::new(&Device::sim(SimOptions::preset("H100-80GB")), LmConfig::preset("small", 64, DType::F32).unwrap()).unwrap();
    let blocks: Vec<usize> = lm.blocks.iter().map(|b| b.parameters().iter().map(|p| p.numel()).sum()).collect();
    let root = lm.parameter_count() as usize - blocks.iter().sum::<usize>();
    (blocks, root)
}

/// Every parameter's element count, in registration order.
fn small_numels() -> Vec<usize> {
    let lm = Lm::new(&Device::sim(SimOptions::preset("H100-80GB")), LmConfig::preset("small", 64, DType::F32).unwrap()).unwrap();
    lm.parameters().iter().map(|p| p.numel()).collect()
}

#[test]
fn ddp_buckets_close_at_their_limit_in_order_per_type_and_sort_by_first_tensor() {
    let f32 = |n: u64| ((n * MIB / 4) as usize, DType::F32);
    let f16 = |n: u64| ((n * MIB / 2) as usize, DType::F16);
    // 1 MiB first (closes on reaching it), then 25 MiB; each type on its own.
    let tensors = [f32(1), f16(30), f32(10), f32(10), f32(10), f32(3), f16(1)];
    let buckets = bucket_assignment(&tensors, &[MIB, 25 * MIB]);
    assert_eq!(buckets, vec![vec![0], vec![1], vec![2, 3, 4], vec![5], vec![6]]);
}

#[test]
fn zero_redundancy_partitions_largest_first_to_the_emptiest_rank() {
    // Sorted: 40 (#1) -> rank 0; 30 (#2) -> 1; 20 (#3) -> 1 (30 < 40); 10 (#0) -> 0 (40 < 50);
    // 5 (#4) -> 0 (50 = 50: the lower rank).
    assert_eq!(partition_parameters(&[10, 40, 30, 20, 5], 2), vec![vec![1, 0, 4], vec![2, 3]]);
    assert_eq!(partition_parameters(&[7], 3), vec![vec![0], vec![], vec![]]);
}

#[test]
fn ddp_holds_one_bucket_of_every_gradient_beside_the_model() {
    let set = [("size", "small"), ("batch", "2"), ("context", "64"), ("optimizer", "sgd"), ("warmup", "0")];
    let single = run("lm-train", &set);
    let ddp = run("lm-train", &[&set[..], &[("world", "2"), ("strategy", "ddp")]].concat());
    let parameter_bytes = single.model_parameters.unwrap() * 4;
    assert_eq!(ddp.ranks.len(), 2);
    // Rank 1 recorded on its own allocates as rank 0 does.
    let rank1 = run("lm-train", &[&set[..], &[("world", "2"), ("strategy", "ddp"), ("rank", "1")]].concat());
    assert_eq!(rank1.steps, ddp.steps, "DDP's ranks allocate alike");
    assert_eq!(rank1.ranks, ddp.ranks);
    // After construction: the module broadcast in 250 MiB buckets (freed) and the reducer's
    // first bucket, every float32 gradient in one.
    assert_eq!(requested(&ddp.steps, "model and batch") - requested(&single.steps, "model and batch"), parameter_bytes);
    for label in ["forward", "backward", "optimizer step"] {
        assert_eq!(requested(&ddp.steps, label) - requested(&single.steps, label), parameter_bytes, "{label}");
    }
}

#[test]
fn a_hand_written_ddp_without_reducer_holds_what_one_gpu_holds() {
    // ddp_reducer=none: parameters broadcast and gradients all-reduced in place, so each rank's
    // every step is the single GPU's; zero1 then keeps the state of its own parameters only.
    let set = [("size", "small"), ("batch", "2"), ("context", "64"), ("optimizer", "adamw"), ("warmup", "0")];
    let single = run("lm-train", &set);
    let ddp = run("lm-train", &[&set[..], &[("world", "2"), ("strategy", "ddp"), ("ddp_reducer", "none")]].concat());
    assert_eq!(ddp.ranks.len(), 2);
    for rank in &ddp.ranks {
        assert_eq!(rank.steps, single.steps, "rank {}", rank.rank);
    }
    let buckets = run("lm-train", &[&set[..], &[("world", "2"), ("strategy", "ddp")]].concat());
    let parameter_bytes = single.model_parameters.unwrap() * 4;
    assert_eq!(requested(&buckets.steps, "optimizer step") - requested(&ddp.steps, "optimizer step"), parameter_bytes, "the reducer's bucket");

    let zero1 = run("lm-train", &[&set[..], &[("world", "4"), ("strategy", "zero1"), ("ddp_reducer", "none")]].concat());
    let numels = small_numels();
    let total: u64 = numels.iter().map(|&n| n as u64).sum();
    for (rank, owned) in partition_parameters(&numels, 4).iter().enumerate() {
        let owned: u64 = owned.iter().map(|&i| numels[i] as u64).sum();
        let less = requested(&single.steps, "optimizer step") - requested(&zero1.ranks[rank].steps, "optimizer step");
        assert_eq!(less, 2 * 4 * (total - owned), "rank {rank}: AdamW's two moments of the others' parameters");
    }
}

#[test]
fn ddp_with_gradients_as_bucket_views_holds_its_gradients_once() {
    // gradient_as_bucket_view=True: each gradient is copied into its bucket as it arrives and
    // becomes a view of it, so where torch's default reducer holds the gradients twice (theirs
    // and the bucket), the views hold them once; before backward the two hold the same.
    let set = [("size", "small"), ("batch", "2"), ("context", "64"), ("optimizer", "adamw"), ("warmup", "1"), ("steps", "2")];
    let world = [("world", "2"), ("strategy", "ddp")];
    let buckets = run("lm-train", &[&set[..], &world].concat());
    let views = run("lm-train", &[&set[..], &world, &[("ddp_reducer", "views")]].concat());
    let gradient_bytes = run("lm-train", &set).model_parameters.unwrap() * 4;
    for label in ["model and batch", "warm-up forward", "step 1 forward", "step 2 loss"] {
        assert_eq!(requested(&views.steps, label), requested(&buckets.steps, label), "{label}");
    }
    for label in ["warm-up backward", "warm-up optimizer step", "step 1 backward", "step 2 optimizer step"] {
        assert_eq!(requested(&buckets.steps, label) - requested(&views.steps, label), gradient_bytes, "{label}");
    }
    // The buckets are rebuilt at the second forward in the order the gradients arrived, as
    // with torch's default reducer.
    let reducer = |r: &RunResult| -> Vec<u64> {
        r.snapshot.device_traces[0]
            .iter()
            .filter(|e| e.action == tensormem::trace::Action::Alloc && e.frames.iter().flat_map(|f| f.iter()).any(|f| f.name.contains("reducer")))
            .map(|e| e.size)
            .collect()
    };
    assert_eq!(reducer(&views), reducer(&buckets));
}

#[test]
fn zero1_ranks_keep_the_optimizer_state_of_the_parameters_they_own() {
    let set = [("size", "small"), ("batch", "2"), ("context", "64"), ("optimizer", "adamw"), ("warmup", "0")];
    let single = run("lm-train", &set);
    let zero1 = run("lm-train", &[&set[..], &[("world", "4"), ("strategy", "zero1")]].concat());
    let numels = small_numels();
    let total: usize = numels.iter().sum();
    let partition = partition_parameters(&numels, 4);
    assert_eq!(zero1.ranks.len(), 4);
    for (rank, owned) in partition.iter().enumerate() {
        let owned: u64 = owned.iter().map(|&i| numels[i] as u64).sum();
        let steps = &zero1.ranks[rank].steps;
        // The bucket (every gradient again) and AdamW's two moments of its own parameters
        // instead of all of them.
        let expected = (total as u64 * 4) as i64 - 2 * 4 * (total as u64 - owned) as i64;
        assert_eq!(requested(steps, "optimizer step") as i64 - requested(&single.steps, "optimizer step") as i64, expected, "rank {rank}");
    }
    assert_eq!(zero1.steps, zero1.ranks[0].steps, "the run records rank 0");
}

#[test]
fn fsdp_ranks_hold_flat_shards_and_their_optimizer_state() {
    let (blocks, root) = small_units();
    for world in [2usize, 4, 3] {
        let w = world.to_string();
        let r = run(
            "lm-train",
            &[("size", "small"), ("batch", "2"), ("context", "64"), ("optimizer", "adamw"), ("warmup", "0"), ("world", &w), ("strategy", "fsdp")],
        );
        let shards: u64 = blocks.iter().chain([&root]).map(|&u| shard_numel(u, world) as u64 * 4).sum();
        // ids and targets [2, 64] int64; RoPE's cos and sin [64, 32] float32 (buffers: whole).
        let (inputs, rope) = (2 * 2 * 64 * 8, 2 * 64 * 32 * 4);
        assert_eq!(requested(&r.steps, "model and batch"), shards + inputs + rope, "world {world}: the shards, the batch, the rotary tables");
        // AdamW makes two moments per shard in the first step.
        assert_eq!(requested(&r.steps, "optimizer step") - requested(&r.steps, "backward"), 2 * shards, "world {world}");
        assert_eq!(r.ranks.len(), world);
        // reshard_after_forward=false (SHARD_GRAD_OP): every block's gathered parameters are
        // still there when the forward ends; by default only the root's are.
        let kept = run(
            "lm-train",
            &[
                ("size", "small"),
                ("batch", "2"),
                ("context", "64"),
                ("optimizer", "adamw"),
                ("warmup", "0"),
                ("world", &w),
                ("strategy", "fsdp"),
                ("reshard_after_forward", "false"),
            ],
        );
        let gathered: u64 = blocks.iter().map(|&u| (shard_numel(u, world) * world) as u64 * 4).sum();
        assert_eq!(requested(&kept.steps, "forward") - requested(&r.steps, "forward"), gathered, "world {world}");
        assert_eq!(requested(&kept.steps, "optimizer step"), requested(&r.steps, "optimizer step"), "resharded after backward either way");
    }
}

#[test]
fn zero2_and_fsdp_model_states_against_deepspeeds_closed_forms() {
    // DeepSpeed's estimators (deepspeed/runtime/zero/stage_1_and_2.py and stage3.py), without
    // offload, assume 16-bit parameters and gradients with float32 master weights, gradients and
    // Adam moments in the optimizer: master_weights=true with bfloat16 parameters.
    //   estimate_zero2_model_states_mem_needs: gpu = 4 P + 16 P / N
    //   estimate_zero3_model_states_mem_needs: gpu = 4 L + 18 P / N   (L: the largest layer)
    let (blocks, root) = small_units();
    let p: u64 = blocks.iter().sum::<usize>() as u64 + root as u64;
    let n = 4usize;
    let set =
        [("size", "small"), ("batch", "2"), ("context", "64"), ("optimizer", "adamw"), ("warmup", "0"), ("dtype", "bfloat16"), ("master_weights", "true")];
    let after_step = |extra: &[(&str, &str)]| requested(&run("lm-train", &[&set[..], extra].concat()).steps, "optimizer step");
    // One GPU: 2 P of parameters, then 4 P master copy, 4 P float32 gradient, 8 P moments (the
    // bfloat16 gradients are freed once upcast). The rest (logits, loss, batch, rotary tables)
    // is the same on every rank.
    let rest = after_step(&[]) - 18 * p;
    let shards: u64 = blocks.iter().chain([&root]).map(|&u| shard_numel(u, n) as u64).sum();
    assert_eq!(shards * n as u64, p, "small's units divide by 4: no padding");
    let zero2 = after_step(&[("world", "4"), ("strategy", "zero2")]) - rest;
    let fsdp = after_step(&[("world", "4"), ("strategy", "fsdp")]) - rest;
    let deepspeed_zero2 = 4 * p + 16 * p / n as u64;
    let largest_layer = 10_000 * 768; // the embedding (or the output), as model_to_params finds it
    let deepspeed_zero3 = 4 * largest_layer + 18 * p / n as u64;
    eprintln!("P = {p}, N = {n}");
    eprintln!("zero2: tensormem {zero2} B, DeepSpeed {deepspeed_zero2} B");
    eprintln!("zero3/fsdp: tensormem {fsdp} B, DeepSpeed {deepspeed_zero3} B");
    // The sharded terms agree exactly: 16 bytes per parameter over the ranks under ZeRO-2,
    // 18 (the 16-bit shard too) under ZeRO-3. DeepSpeed's zero2 form also counts 2 P of 16-bit
    // gradients, which a step reduce-scatters block by block and does not keep; its zero3 form
    // adds the gathered largest layer, which a step holds only while the layer runs.
    assert_eq!(zero2, 2 * p + 16 * shards);
    assert_eq!(zero2, deepspeed_zero2 - 2 * p);
    assert_eq!(fsdp, 18 * shards);
    assert_eq!(fsdp, deepspeed_zero3 - 4 * largest_layer);
}

#[test]
fn a_70b_model_under_fsdp_on_64_gpus_is_one_rank_simulated() {
    let r = run(
        "hf-train",
        &[
            ("config", "llama-3-70b"),
            ("batch", "1"),
            ("context", "4096"),
            ("attn", "sdpa"),
            ("amp", "bfloat16"),
            ("checkpointing", "true"),
            ("world", "64"),
            ("strategy", "fsdp"),
        ],
    );
    assert_eq!(r.model_parameters, Some(70_553_706_496));
    assert_eq!(r.out_of_memory, None, "Llama-3-70B fits 64 H100s under FSDP");
    assert_eq!(r.ranks.len(), 64);
    assert!(r.ranks.iter().all(|rank| rank.peak_allocated_bytes == r.peak_allocated_bytes), "FSDP's ranks are alike");
    // 70.55 G bfloat16 parameters over 64 ranks: about 2.2 GB of shards each.
    let shards = requested(&r.steps, "model and batch") - 2 * 4096 * 8;
    assert!(shards.abs_diff(70_553_706_496 * 2 / 64) < 64 * 1024, "{shards}");
    let sum: u64 = r.ranks[0].by_category.values().sum();
    assert!(sum <= r.peak_allocated_bytes && sum * 100 > r.peak_allocated_bytes * 99, "by_category {sum} of {}", r.peak_allocated_bytes);
}

#[test]
fn strategies_say_what_is_wrong_with_their_settings() {
    let error = |set: &[(&str, &str)]| scenarios::run(&request("lm-train", set)).map(|_| ()).unwrap_err().to_string();
    assert!(error(&[("strategy", "fsdp")]).contains("set world"), "{}", error(&[("strategy", "fsdp")]));
    assert!(error(&[("world", "2"), ("rank", "2")]).contains("rank=2 is not one of the 2 ranks"));
    assert!(error(&[("world", "12"), ("strategy", "hsdp")]).contains("not a whole number of nodes"));
    assert!(error(&[("master_weights", "true")]).contains("dtype=float32"));
}

#[test]
fn fit_finds_the_largest_batch_that_runs_on_every_rank() {
    use tensormem::scenarios::fit::{fit_table, largest_that_fits};
    let set = [("size", "small"), ("context", "256"), ("optimizer", "adamw"), ("world", "4")];
    let base = |strategy: &str| RunRequest { device: Some("sim:4GiB".into()), ..request("lm-train", &[&set[..], &[("strategy", strategy)]].concat()) };
    let fits = |strategy: &str, batch: u64| {
        let mut r = base(strategy);
        r.set.insert("batch".into(), batch.to_string());
        let result = scenarios::run(&r).unwrap();
        result.out_of_memory.is_none() && result.ranks.iter().all(|k| k.out_of_memory.is_none())
    };
    let mut largest = Vec::new();
    for strategy in ["ddp", "fsdp"] {
        let cell = largest_that_fits(&base(strategy), "batch").unwrap();
        let b = cell.largest.unwrap_or_else(|| panic!("{strategy}: batch 1 fits 4 GiB"));
        assert!(fits(strategy, b) && !fits(strategy, b + 1), "{strategy}: {b} fits, {} does not", b + 1);
        assert_eq!(cell.limited_by, None);
        assert!(cell.peak_allocated_bytes.unwrap() <= 4 << 30);
        largest.push(b);
    }
    assert!(largest[1] > largest[0], "sharding leaves room for more batch: {largest:?}");
    let table = fit_table(&request("lm-train", &set), "batch", &["ddp".into(), "fsdp".into()], &["4GiB".into(), "A100-40GB".into()], &mut |_, _| {}).unwrap();
    assert_eq!(table.cells.len(), 4);
    assert_eq!(table.cells[0].largest, Some(largest[0]), "ddp on 4 GiB, in the table");
    assert_eq!(table.cells[2].largest, Some(largest[1]), "fsdp on 4 GiB, in the table");
    assert!(table.cells[1].largest > table.cells[0].largest, "a bigger card fits more");
    // A scenario's own limit stops the search and says so: GPT-2's 1024 positions.
    let gpt2 = largest_that_fits(&request("gpt2-train", &[("batch", "1")]), "context").unwrap();
    assert_eq!(gpt2.largest, Some(1024));
    assert!(gpt2.limited_by.as_deref().unwrap_or("").contains("1024"), "{gpt2:?}");
}

#[test]
fn tensor_parallelism_splits_each_layer_and_keeps_the_whole_models_counts() {
    // lm-train small (d 768, d_ff 3072, 12 heads, vocabulary 10,000) on tp=2: per block wq, wk,
    // wv [384, 768], wo [768, 384], w1, w3 [1536, 768], w2 [768, 1536], two norms [768]; the
    // embedding and the output [5000, 768]; the final norm.
    let (d, f, v, layers) = (768u64, 3072u64, 10_000u64, 12u64);
    let local = 2 * (v / 2) * d + layers * (4 * d * d / 2 + 3 * d * f / 2 + 2 * d) + d;
    let r = run("lm-train", &[("size", "small"), ("batch", "2"), ("context", "64"), ("world", "2"), ("tp", "2"), ("warmup", "0")]);
    assert_eq!(r.model_parameters, Some(128_625_408), "the whole model's count");
    let (inputs, rope) = (2 * 2 * 64 * 8, 2 * 64 * 32 * 4);
    // One replica: no data-parallel wrapper, no bucket.
    assert_eq!(requested(&r.steps, "model and batch"), local * 4 + inputs + rope);
    assert_eq!(r.ranks.len(), 2);
    // Llama-3-8B's LoRA adapters split with their layers; the counts stay the whole model's.
    let hf = run(
        "hf-train",
        &[("config", "llama-3-8b"), ("context", "256"), ("lora", "16"), ("lora_targets", "q,k,v,o"), ("world", "8"), ("tp", "8"), ("warmup", "0")],
    );
    assert_eq!(hf.model_parameters, Some(8_043_892_736), "with the adapters, as PEFT counts all params");
    assert_eq!(hf.trainable_parameters, Some(13_631_488));
    let error = |scenario: &str, set: &[(&str, &str)]| scenarios::run(&request(scenario, set)).map(|_| ()).unwrap_err().to_string();
    assert!(error("lm-train", &[("size", "small"), ("world", "4"), ("tp", "3")]).contains("tp=3 must divide world=4"));
    assert!(error("lm-train", &[("size", "small"), ("world", "5"), ("tp", "5")]).contains("do not split evenly over 5 ranks"));
    assert!(error("gpt2-train", &[("world", "2"), ("tp", "2")]).contains("not GPT-2's fused c_attn"));
    assert!(error("lm-train", &[("world", "2"), ("tp", "2"), ("strategy", "fsdp")]).contains("one replica"));
    let hsdp = error("lm-train", &[("size", "small"), ("world", "16"), ("tp", "4"), ("node", "2"), ("strategy", "hsdp")]);
    assert!(hsdp.contains("node=2 must be a multiple of tp=4"), "{hsdp}");
}

#[test]
fn gradient_accumulation_adds_into_the_gradients_and_their_shards() {
    let set = [("size", "small"), ("batch", "2"), ("context", "64"), ("optimizer", "adamw"), ("accumulation", "2")];
    let p = 128_625_408u64;
    let one = run("lm-train", &set);
    // The second micro-batch's forward runs beside the first one's gradients (its logits go
    // when the new ones are made, its loss, a float32 scalar, when the new loss is); its
    // backward adds into them in place.
    assert_eq!(requested(&one.steps, "micro-batch 2 forward") - requested(&one.steps, "micro-batch 1 forward"), p * 4 + 4);
    assert_eq!(requested(&one.steps, "micro-batch 2 backward"), requested(&one.steps, "micro-batch 1 backward"));
    // Under fsdp each micro-batch's gradients are reduce-scattered and added to the shards.
    let fsdp = run("lm-train", &[&set[..], &[("world", "2"), ("strategy", "fsdp")]].concat());
    assert_eq!(requested(&fsdp.steps, "micro-batch 2 backward"), requested(&fsdp.steps, "micro-batch 1 backward"));
    let (blocks, root) = small_units();
    let shards: u64 = blocks.iter().chain([&root]).map(|&u| shard_numel(u, 2) as u64 * 4).sum();
    assert_eq!(requested(&fsdp.steps, "micro-batch 2 forward") - requested(&fsdp.steps, "micro-batch 1 forward"), shards + 4);
}

#[test]
fn ddp_rebuilds_its_buckets_at_the_second_forward_in_gradient_order() {
    // With a warm-up step, the recorded step's forward rebuilds the reducer's buckets: the one
    // bucket of every gradient is released, then buckets of 1 MiB and 25 MiB (closing at or
    // past their limit) over the parameters in the order their gradients arrived.
    let r = run("lm-train", &[("size", "small"), ("batch", "2"), ("context", "64"), ("optimizer", "sgd"), ("world", "2")]);
    let p = r.model_parameters.unwrap() * 4;
    let trace = &r.snapshot.device_traces[0];
    let is_reducer = |e: &tensormem::trace::Entry<'_>| e.frames.as_ref().is_some_and(|f| f.iter().any(|f| f.name.ends_with("DistributedDataParallel.reducer")));
    let allocs: Vec<(usize, u64)> =
        trace.iter().enumerate().filter(|(_, e)| e.action == tensormem::trace::Action::Alloc && is_reducer(e)).map(|(i, e)| (i, e.size)).collect();
    let reducer: Vec<u64> = allocs.iter().map(|a| a.1).collect();
    assert_eq!(reducer[0], p, "the first bucket holds every gradient");
    let rebuilt = &reducer[1..];
    assert_eq!(rebuilt.iter().sum::<u64>(), p, "the rebuilt buckets hold every gradient once: {rebuilt:?}");
    // The first gradient ready is the output layer's (10,000 x 768 float32): past 1 MiB alone.
    assert_eq!(rebuilt[0], 10_000 * 768 * 4, "the first bucket closes at 1 MiB, with the output layer alone");
    assert!(rebuilt[1..rebuilt.len() - 1].iter().all(|&b| b >= 25 * MIB), "then 25 MiB ones: {rebuilt:?}");
    // The first bucket is released before the rebuilt ones are made.
    let first = trace.at(allocs[0].0).addr;
    let freed = allocs[0].0
        + trace.range(allocs[0].0..).position(|e| e.action == tensormem::trace::Action::FreeCompleted && e.addr == first).expect("the first bucket freed");
    assert!(freed < allocs[1].0);
}

#[test]
fn master_weights_leave_float32_parameters_to_the_optimizer() {
    // LoRA's float32 adapters over a bfloat16 base: they have no 16-bit copy to keep, so the
    // optimizer steps them as without master weights (AdamW's two moments, 8 bytes each).
    let set = [("config", "llama-3-8b"), ("context", "64"), ("lora", "16"), ("lora_targets", "q,k,v,o"), ("warmup", "0"), ("dtype", "bfloat16")];
    let state = |r: &RunResult| requested(&r.steps, "optimizer step") - requested(&r.steps, "backward");
    let plain = run("hf-train", &set);
    let master = run("hf-train", &[&set[..], &[("master_weights", "true")]].concat());
    assert_eq!(state(&plain), 8 * 13_631_488);
    assert_eq!(state(&master), state(&plain));
}

#[test]
fn fit_reports_a_setting_the_scenario_refuses_as_an_error() {
    use tensormem::scenarios::fit::fit_table;
    let e = fit_table(&request("lm-train", &[("world", "2"), ("rank", "5")]), "batch", &["ddp".into(), "fsdp".into()], &["H100-80GB".into()], &mut |_, _| {})
        .unwrap_err()
        .to_string();
    assert!(e.contains("rank=5 is not one of the 2 ranks"), "{e}");
}

#[test]
fn fsdp2_keeps_a_padded_shard_per_parameter_and_its_last_ranks_step_fewer_rows() {
    use tensormem::nn::parallel::shard_sizes;
    let lm = Lm::new(&Device::sim(SimOptions::preset("H100-80GB")), LmConfig::preset("small", 64, DType::F32).unwrap()).unwrap();
    let shapes: Vec<Vec<usize>> = lm.parameters().iter().map(|p| p.shape().to_vec()).collect();
    let set = [("size", "small"), ("batch", "2"), ("context", "64"), ("optimizer", "adamw"), ("warmup", "0"), ("strategy", "fsdp"), ("fsdp_version", "2")];
    let (inputs, rope) = (2 * 2 * 64 * 8, 2 * 64 * 32 * 4);
    for world in [3usize, 4] {
        let w = world.to_string();
        let r = run("lm-train", &[&set[..], &[("world", &w)]].concat());
        // fully_shard: each parameter's dim 0 padded to ceil(dim0 / ranks) rows, one buffer each
        // (10,000 vocabulary rows over 3 ranks: 3,334 each, the last rank's 2 of them padding).
        let padded: u64 = shapes.iter().map(|s| shard_sizes(s, world, 0).0 as u64 * 4).sum();
        assert_eq!(requested(&r.steps, "model and batch"), padded + inputs + rope, "world {world}");
        for rank in &r.ranks {
            let local: u64 = shapes.iter().map(|s| shard_sizes(s, world, rank.rank).1 as u64 * 4).sum();
            assert_eq!(
                requested(&rank.steps, "optimizer step") - requested(&rank.steps, "backward"),
                2 * local,
                "world {world} rank {}: AdamW's moments of its rows",
                rank.rank
            );
        }
        let distinct: std::collections::BTreeSet<u64> = r.ranks.iter().map(|k| requested(&k.steps, "optimizer step")).collect();
        assert_eq!(distinct.len(), if world == 3 { 2 } else { 1 }, "world {world}: the last rank steps fewer rows only where 10,000 does not divide");
    }
}
