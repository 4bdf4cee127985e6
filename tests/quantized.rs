//! QLoRA's 4-bit base (`quantize=4bit`) and the optimizers `adamw-fused` and `adamw8bit` of
//! `hf-train`: the bytes each keeps, pinned from the shapes and what bitsandbytes 0.49.2 and
//! PyTorch allocate (sim device; `requested_bytes` is what the tensors asked for, before the
//! allocator rounds each block up to 512 bytes).

mod common;

use tensormem::device::{Device, SimOptions};
use tensormem::nn::bnb::{self, Quant4bit};
use tensormem::nn::optim::AdamW8bit;
use tensormem::nn::{HfConfig, LoraConfig};
use tensormem::scenarios::{self, RunResult};
use tensormem::tensor::DType;
use tensormem::trace::Action;

/// A small Llama without biases: hidden 64, 4 heads sharing 2 key/value heads (head_dim 16),
/// intermediate 128, 2 layers, vocabulary 1,000, untied. Its linears per layer: q and o
/// 64 x 64 (4,096 weights each), k and v 32 x 64 (2,048), gate and up 128 x 64 and down
/// 64 x 128 (8,192).
const SMALL: &str = r#"{"architectures": ["LlamaForCausalLM"], "hidden_size": 64, "intermediate_size": 128, "num_hidden_layers": 2,
    "num_attention_heads": 4, "num_key_value_heads": 2, "vocab_size": 1000, "max_position_embeddings": 256}"#;

fn run(set: &[(&str, &str)]) -> RunResult {
    common::run_scenario("hf-train", set)
}

fn run_error(set: &[(&str, &str)]) -> String {
    common::scenario_error("hf-train", set)
}

fn step<'a>(r: &'a RunResult, label: &str) -> &'a scenarios::Step {
    r.steps.iter().find(|s| s.label == label).unwrap_or_else(|| panic!("no step {label:?} in {:?}", r.steps))
}

fn requested(r: &RunResult, label: &str) -> u64 {
    step(r, label).requested_bytes
}

/// The small Llama, one sequence of 16 tokens, the first step recorded.
fn small(extra: &[(&str, &str)]) -> RunResult {
    run(&[&[("config", SMALL), ("batch", "1"), ("context", "16"), ("warmup", "0")], extra].concat())
}

/// What one weight of `n` elements keeps in 4 bits, tensor by tensor (bitsandbytes'
/// `quantize_4bit(blocksize=64, compress_statistics=True, quant_type="nf4")`).
fn nf4_bytes(n: u64) -> u64 {
    let packed = n / 2; // uint8 [(n + 1) // 2, 1]
    let absmax = n / 64; // quantize_blockwise's uint8 out: one per 64-weight block
    let absmax2 = 4 * (n / 64).div_ceil(256); // state2.absmax: float32 per 256 absmax values
    let code2 = 4 * 256; // state2.code: code.to(device, copy=True) of the dynamic map
    let offset = 4; // _absmax.mean(): a float32 scalar
    let code = 4 * 16; // get_4bit_type("nf4")
    packed + absmax + absmax2 + code2 + offset + code
}

#[test]
fn a_4bit_base_keeps_packed_weights_and_double_quantised_absmax_in_place_of_bfloat16() {
    // q and o: 2,048 packed bytes, 64 absmax bytes, one float32 second-level absmax, 1,092 of
    // maps and code: 3,208; k and v: 1,024 + 32 + 4 + 1,092 = 2,152; gate, up, down:
    // 4,096 + 128 + 4 + 1,092 = 5,320.
    assert_eq!([nf4_bytes(4096), nf4_bytes(2048), nf4_bytes(8192)], [3208, 2152, 5320]);
    assert_eq!(bnb::quant4bit_bytes(8192), 5320);
    let per_layer = 2 * 3208 + 2 * 2152 + 3 * 5320;
    assert_eq!(per_layer, 26_680);
    // The same linears in bfloat16: 2 bytes x (2 x 4,096 + 2 x 2,048 + 3 x 8,192) = 73,728.
    let bf16_per_layer = 2 * (2 * 4096 + 2 * 2048 + 3 * 8192);
    let lora = [("lora", "8")];
    let (plain, quantized) = (small(&lora), small(&[lora[0], ("quantize", "4bit")]));
    // Two layers, plus bitsandbytes' dynamic map (name2qmap["dynamic"], 256 float32) made once
    // on the device. The embedding, the norms and lm_head stay bfloat16 in both.
    assert_eq!(requested(&plain, "model and batch") - requested(&quantized, "model and batch"), 2 * (bf16_per_layer - per_layer) - 1024);
    assert_eq!(2 * (bf16_per_layer - per_layer) - 1024, 93_072);
    // The same through the library: one 128 x 64 weight quantised on a sim device keeps 5,320
    // bytes once its bfloat16 original is dropped.
    let dev = Device::sim(SimOptions::preset("H100-80GB"));
    let weight = dev.randn(&[128, 64], DType::BF16).unwrap();
    let quant = Quant4bit::quantize(&weight).unwrap();
    drop(weight);
    assert_eq!((quant.bytes(), dev.memory_requested()), (5320, 5320));
    assert_eq!((quant.packed.shape(), quant.packed.dtype(), quant.absmax.dtype()), (&[4096, 1][..], DType::U8, DType::U8));
    // The adapters train; the base is frozen (uint8 Params4bit, no gradient).
    assert_eq!(quantized.trainable_parameters, plain.trainable_parameters);
    assert_eq!(quantized.out_of_memory, None);
}

#[test]
fn each_forward_and_backward_of_a_4bit_linear_dequantises_its_weight_to_a_temporary() {
    // One Linear4bit, [out 128, in 64], from bfloat16: bnb.matmul_4bit's forward makes the
    // float32 absmax [128 blocks] (512 bytes) and the bfloat16 weight [128, 64] (16,384 bytes),
    // frees the absmax, then F.linear's output [1, 16, 128] (4,096 bytes); the weight goes
    // once the linear returns. Its backward does the same again for grad_output @ W, whose
    // result is x's gradient [1, 16, 64] (2,048 bytes). The first matmul on each thread (here
    // and in backward) also makes cuBLAS's workspace: 32 MiB, requested and kept.
    let dev = Device::sim(SimOptions::preset("H100-80GB"));
    const WORKSPACE: u64 = 32 << 20;
    let quant = Quant4bit::quantize(&dev.randn(&[128, 64], DType::BF16).unwrap()).unwrap();
    let x = dev.randn(&[1, 16, 64], DType::BF16).unwrap();
    x.requires_grad_(true).unwrap();
    let before = dev.memory_requested();
    dev.reset_peak_memory_stats();
    let y = quant.linear(&x, None, DType::BF16).unwrap();
    assert_eq!(dev.max_memory_requested() - before, 16_384 + 4096 + WORKSPACE, "the dequantised weight beside the output");
    assert_eq!(dev.memory_requested() - before, 4096 + WORKSPACE, "only the output stays: MatMul4Bit saves the packed weight, not x");
    let g = dev.randn(&[1, 16, 128], DType::BF16).unwrap();
    let before = dev.memory_requested();
    dev.reset_peak_memory_stats();
    y.backward_with(Some(&g), false).unwrap();
    assert_eq!(dev.max_memory_requested() - before, 16_384 + 2048 + WORKSPACE, "dequantised again in backward, beside x's gradient");
    assert_eq!(x.grad().map(|g| g.shape().to_vec()), Some(vec![1, 16, 64]));
}

#[test]
fn a_qlora_step_dequantises_every_base_linear_in_forward_and_those_with_a_gradient_in_backward() {
    let r = small(&[("lora", "8"), ("quantize", "4bit")]);
    let trace = &r.snapshot.device_traces[0];
    let dequantised = |op: &str| -> Vec<u64> {
        trace.iter().filter(|e| e.action == Action::Alloc && e.frames.as_ref().is_some_and(|f| f[0].name == op)).map(|e| e.size).collect()
    };
    let (forward, backward) = (dequantised("bitsandbytes::dequantize_4bit"), dequantised("bitsandbytes::dequantize_4bit (MatMul4BitBackward)"));
    // Forward: the 7 linears of both layers. Backward: those whose input needs a gradient.
    // LoRA on q and v (PEFT's default): in layer 0 q, k and v read the frozen embedding's
    // normed output (no gradient, so MatMul4Bit records nothing for them); from o_proj on
    // everything depends on an adapter: o, gate, up, down of layer 0 and all 7 of layer 1.
    assert_eq!((forward.len(), backward.len()), (14, 11), "{forward:?} {backward:?}");
    // Block-rounded: q, o 8,192 bytes; k, v 4,096; gate, up, down 16,384.
    let layer = [8192, 4096, 4096, 8192, 16_384, 16_384, 16_384];
    assert_eq!(forward[..7], layer);
    assert_eq!(forward[7..], layer);
    // Backward runs the layers in reverse: layer 1's down, up, gate, o, v, k, q ... then
    // layer 0's down, up, gate, o.
    assert_eq!(backward, [16_384, 16_384, 16_384, 8192, 4096, 4096, 8192, 16_384, 16_384, 16_384, 8192]);
}

#[test]
fn adamw8bit_keeps_uint8_states_with_a_float32_absmax_per_256_and_32_bit_states_under_4096_elements() {
    // AdamW8bit's state per parameter of n elements: 2n + 2 x 4 x ceil(n / 256) from 4,096
    // elements on, 2 x 4 x n below (float32, whatever the parameter's type).
    assert_eq!(AdamW8bit::state_bytes(64_000), 128_000 + 8 * 250);
    assert_eq!(AdamW8bit::state_bytes(4096), 8192 + 8 * 16);
    assert_eq!(AdamW8bit::state_bytes(4095), 8 * 4095);
    // A full fine-tune of the small Llama in bfloat16. Its parameters: the embedding and
    // lm_head (64,000 each: 8-bit), per layer q and o (4,096: 8-bit, min_8bit_size is
    // inclusive), k and v (2,048: 32-bit), gate, up, down (8,192: 8-bit), two norms (64:
    // 32-bit), the final norm (64: 32-bit).
    let layer = 2 * AdamW8bit::state_bytes(4096) + 3 * AdamW8bit::state_bytes(8192) + 2 * 8 * 2048 + 2 * 8 * 64;
    assert_eq!(layer, 2 * 8320 + 3 * 16_640 + 32_768 + 1024);
    // The dynamic and unsigned dynamic maps (256 float32 each) moved to the device once.
    let eight_bit = 2 * 130_000 + 2 * layer + 8 * 64 + 2 * 1024;
    assert_eq!(eight_bit, 463_264);
    // torch.optim.AdamW: two bfloat16 moments of every parameter, 4 bytes per parameter.
    let parameters: u64 = 2 * 64_000 + 2 * (2 * 4096 + 2 * 2048 + 3 * 8192 + 2 * 64) + 64;
    assert_eq!(parameters, 202_048);
    let state = |r: &RunResult| requested(r, "optimizer step") - requested(r, "backward");
    let (adamw, adamw8bit) = (small(&[("optimizer", "adamw")]), small(&[("optimizer", "adamw8bit")]));
    assert_eq!(state(&adamw), 4 * parameters);
    assert_eq!(state(&adamw8bit), eight_bit);
    // Its step updates in place: the step's peak is its end (AdamW's foreach step holds the
    // square roots of every second moment on top).
    let optimizer_step = step(&adamw8bit, "optimizer step");
    assert_eq!(optimizer_step.max_requested_bytes, optimizer_step.requested_bytes);
    assert!(step(&adamw, "optimizer step").max_requested_bytes > requested(&adamw, "optimizer step"));
}

#[test]
fn adamw_fused_keeps_the_moments_and_a_step_tensor_per_parameter_with_no_foreach_temporaries() {
    // 21 parameters (the embedding, 9 per layer, the final norm, lm_head): each gets
    // `state["step"] = torch.zeros((), dtype=float32, device=p.device)` (fused or capturable)
    // before its two moments: 4 bytes asked, a 512-byte block each.
    // The small Llama's 202,048 parameters: two bfloat16 moments are 4 bytes per parameter.
    let parameters = 202_048;
    let (foreach, fused) = (small(&[("optimizer", "adamw")]), small(&[("optimizer", "adamw-fused")]));
    let state = |r: &RunResult| requested(r, "optimizer step") - requested(r, "backward");
    assert_eq!(state(&fused), 4 * parameters + 21 * 4);
    assert_eq!(state(&fused) - state(&foreach), 21 * 4);
    let blocks = |r: &RunResult| step(r, "optimizer step").allocated_bytes - step(r, "backward").allocated_bytes;
    assert_eq!(blocks(&fused) - blocks(&foreach), 21 * 512);
    // _fused_adamw: `_foreach_add_(state_steps, 1)` and `_fused_adamw_` work in place; the
    // foreach path's `_foreach_sqrt` of every second moment is not there: the step's peak is
    // what it keeps.
    let fused_step = step(&fused, "optimizer step");
    assert_eq!(fused_step.max_requested_bytes, fused_step.requested_bytes);
    let foreach_step = step(&foreach, "optimizer step");
    assert_eq!(foreach_step.max_requested_bytes - foreach_step.requested_bytes, 2 * parameters, "a square root of every bfloat16 second moment");
    // After the first step the moments exist: a second step allocates nothing at all.
    let again = small(&[("optimizer", "adamw-fused"), ("warmup", "1")]);
    let second = step(&again, "optimizer step");
    assert_eq!(second.max_requested_bytes, second.requested_bytes);
}

#[test]
fn quantize_4bit_is_refused_without_lora_and_with_several_gpus() {
    let e = run_error(&[("config", SMALL), ("quantize", "4bit")]);
    assert!(e.contains("quantize=4bit needs lora > 0: a 4-bit base cannot be trained itself"), "{e}");
    let e = run_error(&[("config", SMALL), ("quantize", "4bit"), ("lora", "8"), ("world", "2")]);
    assert!(e.contains("quantize=4bit is simulated on one GPU"), "{e}");
    let e = run_error(&[("config", SMALL), ("quantize", "8bit")]);
    assert!(e.contains("quantize"), "{e}");
    // GPT-2 takes no LoRA, hence no 4-bit base.
    let e = run_error(&[("config", "gpt2"), ("quantize", "4bit"), ("lora", "8")]);
    assert!(e.contains("LoRA is built for the Llama family"), "{e}");
}

#[test]
fn llama_3_8b_qlora_r16_on_q_k_v_o_keeps_its_base_in_5_7_gb_instead_of_16_gb() {
    // Llama-3-8B per layer: q_proj and o_proj 4096 x 4096 (16,777,216 weights), k_proj and
    // v_proj 1024 x 4096 (4,194,304), gate_proj and up_proj 14336 x 4096 and down_proj
    // 4096 x 14336 (58,720,256); 32 layers: 6,979,321,856 weights in 4 bits.
    let layer = 2 * nf4_bytes(16_777_216) + 2 * nf4_bytes(4_194_304) + 3 * nf4_bytes(58_720_256);
    assert_eq!(nf4_bytes(16_777_216), 8_388_608 + 262_144 + 4096 + 1092);
    assert_eq!(layer, 112_520_668);
    // The rest stays bfloat16: the embedding and lm_head (128,256 x 4096 each) and 65 norms
    // of 4096: 1,050,939,392 parameters.
    let rest = 8_030_261_248 - 32 * (2 * 16_777_216 + 2 * 4_194_304 + 3 * 58_720_256);
    assert_eq!(rest, 1_050_939_392);
    let base_4bit = 32 * layer + 1024 + 2 * rest;
    assert_eq!(base_4bit, 5_702_541_184);
    let base_bf16 = 2 * 8_030_261_248u64;
    assert_eq!(base_bf16, 16_060_522_496);
    // 0.516 bytes per quantised weight: 4.13 bits.
    assert_eq!(32 * layer * 1000 / 6_979_321_856, 515);
    // The run: the base, PEFT's float32 adapters (13,631,488 parameters), the int64 ids and
    // targets (64 x 8 bytes each) and the rotary inv_freq and original_inv_freq (64 float32
    // each).
    let config = HfConfig::load("llama-3-8b").unwrap();
    let adapters = LoraConfig { rank: 16, alpha: 32.0, targets: LoraConfig::parse_targets("q,k,v,o").unwrap() }.trainable_count(&config);
    assert_eq!(adapters, 13_631_488);
    let set = |quantize| [("lora", "16"), ("lora_alpha", "32"), ("lora_targets", "q,k,v,o"), ("context", "64"), ("warmup", "0"), ("quantize", quantize)];
    let (qlora, lora) = (run(&set("4bit")), run(&set("none")));
    let batch = 2 * 64 * 8 + 2 * 64 * 4;
    assert_eq!(requested(&qlora, "model and batch"), base_4bit + 4 * adapters + batch);
    assert_eq!(requested(&lora, "model and batch"), base_bf16 + 4 * adapters + batch);
    assert_eq!(qlora.trainable_parameters, Some(adapters));
    // PEFT counts a 4-bit weight by its elements, not its packed bytes: the same 8,043,892,736.
    assert_eq!(qlora.model_parameters, lora.model_parameters);
    assert_eq!(qlora.model_parameters, Some(8_043_892_736));
    assert_eq!(qlora.out_of_memory, None);
    // The optimizer's state over the float32 adapters (each lora_A [16, 4096], lora_B
    // [4096, 16] or [1024, 16]: all of at least 4,096 elements). AdamW: 8 bytes per parameter;
    // AdamW8bit: 2 bytes and 8 per 256, plus its two maps; adamw-fused: AdamW's and a 4-byte
    // step per tensor (256 of them: 32 layers x 4 targets x A and B).
    let state = |r: &RunResult| requested(r, "optimizer step") - requested(r, "backward");
    assert_eq!(state(&qlora), 8 * adapters);
    let eight_bit = run(&[&set("4bit")[..], &[("optimizer", "adamw8bit")]].concat());
    assert_eq!(state(&eight_bit), 2 * adapters + 8 * adapters / 256 + 2048);
    assert_eq!(state(&eight_bit), 27_691_008);
    let fused = run(&[&set("4bit")[..], &[("optimizer", "adamw-fused")]].concat());
    assert_eq!(state(&fused), 8 * adapters + 256 * 4);
}

#[test]
fn on_a_gpu_the_4bit_base_and_the_fused_and_8_bit_optimizers_are_refused_before_anything_runs() {
    // tensormem has no bitsandbytes or fused-Adam kernels on wgpu: each says so at once.
    let on_gpu = |extra: &[(&str, &str)]| {
        let mut request = common::scenario_request("hf-train", &[&[("config", SMALL), ("batch", "1"), ("context", "8"), ("lora", "4")], extra].concat());
        request.device = Some("gpu".into());
        pollster::block_on(scenarios::run_anywhere(&request)).map(|_| ()).unwrap_err().to_string()
    };
    if let Err(e) = pollster::block_on(Device::gpu(Default::default())) {
        assert_ne!(std::env::var("CI").as_deref(), Ok("true"), "no GPU adapter under CI: {e}");
        common::skip(format!("no GPU adapter ({e})"));
        return;
    }
    let e = on_gpu(&[("quantize", "4bit")]);
    assert!(e.contains("quantize=4bit is simulated only"), "{e}");
    for optimizer in ["adamw-fused", "adamw8bit"] {
        let e = on_gpu(&[("optimizer", optimizer)]);
        assert!(e.contains(&format!("optimizer={optimizer} is simulated only")), "{e}");
    }
}
