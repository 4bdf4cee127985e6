//! Models from Hugging Face config.json files (`hf-train`): the published parameter counts,
//! PEFT's LoRA trainable count, the config errors, and the bytes a step keeps where the shapes
//! make them exact (sim device).

mod common;

use tensormem::nn::{Family, HF_PRESETS, HfConfig, LoraConfig};
use tensormem::scenarios::{self, RunRequest, RunResult};

fn run(set: &[(&str, &str)]) -> RunResult {
    common::run_scenario("hf-train", set)
}

fn run_error(set: &[(&str, &str)]) -> String {
    common::scenario_error("hf-train", set)
}

fn allocated(r: &RunResult, label: &str) -> u64 {
    r.steps.iter().find(|s| s.label == label).unwrap_or_else(|| panic!("no step {label:?} in {:?}", r.steps)).allocated_bytes
}

/// The published counts (`sum(p.numel() for p in model.parameters())`, as the model cards and
/// `model.num_parameters()` give them).
const PUBLISHED: [(&str, u64); 5] =
    [("llama-3-8b", 8_030_261_248), ("llama-3-70b", 70_553_706_496), ("mistral-7b", 7_241_732_096), ("qwen2.5-7b", 7_615_616_512), ("gpt2", 124_439_808)];

#[test]
fn the_presets_have_their_published_parameter_counts_from_the_shapes_and_from_the_built_model() {
    assert_eq!(HF_PRESETS.len(), PUBLISHED.len());
    for (preset, count) in PUBLISHED {
        let config = HfConfig::load(preset).unwrap();
        assert_eq!(config.parameter_count(), count, "{preset}: from the shapes");
        // 70B parameters in bfloat16 are 141 GB, more than one H100 holds: 16 under FSDP.
        let sharded: &[(&str, &str)] = if preset == "llama-3-70b" { &[("world", "16"), ("strategy", "fsdp")] } else { &[] };
        let r = run(&[&[("config", preset), ("batch", "1"), ("context", "32"), ("warmup", "0")], sharded].concat());
        assert_eq!(r.model_parameters, Some(count), "{preset}: the built model");
        assert_eq!(r.trainable_parameters, Some(count), "{preset}: a full fine-tune trains every parameter");
        assert_eq!(r.out_of_memory, None, "{preset} at context 32 in bfloat16 fits on an H100");
    }
}

#[test]
fn the_presets_carry_their_architectures_grouped_query_attention_and_qwen2_s_qkv_biases() {
    let llama = HfConfig::load("llama-3-8b").unwrap();
    assert_eq!((llama.family, llama.heads, llama.kv_heads, llama.head_dim, llama.vocab), (Family::Llama, 32, 8, 128, 128_256));
    assert!(!llama.qkv_bias && !llama.o_bias && !llama.tie_word_embeddings);
    let mistral = HfConfig::load("mistral-7b").unwrap();
    assert_eq!((mistral.family, mistral.kv_heads, mistral.vocab), (Family::Mistral, 8, 32_000));
    let qwen = HfConfig::load("qwen2.5-7b").unwrap();
    assert_eq!((qwen.family, qwen.heads, qwen.kv_heads, qwen.head_dim), (Family::Qwen2, 28, 4, 128));
    // Qwen2Attention: q, k and v with biases (3,584 + 2 x 512 per layer), o_proj without.
    assert!(qwen.qkv_bias && !qwen.o_bias);
    let unbiased = HfConfig { qkv_bias: false, ..qwen.clone() };
    assert_eq!(qwen.parameter_count() - unbiased.parameter_count(), 28 * (3584 + 512 + 512));
    let gpt2 = HfConfig::load("gpt2").unwrap();
    assert_eq!((gpt2.family, gpt2.layers, gpt2.hidden, gpt2.intermediate, gpt2.max_positions), (Family::Gpt2, 12, 768, 3072, 1024));
    assert!(gpt2.tie_word_embeddings);
}

#[test]
fn special_token_ids_come_from_the_config_or_its_class_s_default() {
    assert_eq!(HfConfig::load("llama-3-8b").unwrap().eos_token_ids, vec![128_001]);
    assert_eq!(HfConfig::load("llama-3-8b").unwrap().bos_token_id, Some(128_000));
    assert_eq!(HfConfig::load("qwen2.5-7b").unwrap().eos_token_ids, vec![151_643]);
    let with = |eos: &str| HfConfig::load(&small_llama(false).replacen('{', &format!("{{{eos}"), 1));
    // LlamaConfig(eos_token_id=2) when the file says nothing; null means none (generate then
    // adds no end-of-sequence processor); Llama-3-Instruct lists two.
    assert_eq!(with("").unwrap().eos_token_ids, vec![2]);
    assert_eq!(with(r#""eos_token_id": null, "#).unwrap().eos_token_ids, Vec::<i64>::new());
    assert_eq!(with(r#""eos_token_id": [128001, 128009], "#).unwrap().eos_token_ids, vec![128_001, 128_009]);
    let e = with(r#""eos_token_id": "</s>", "#).unwrap_err();
    assert!(e.contains("\"eos_token_id\" must be a token id or a list of them"), "{e}");
    // The beginning of a sequence: LlamaConfig's 1 by default, one id or none.
    assert_eq!(with("").unwrap().bos_token_id, Some(1));
    assert_eq!(with(r#""bos_token_id": null, "#).unwrap().bos_token_id, None);
    let e = with(r#""bos_token_id": [1, 2], "#).unwrap_err();
    assert!(e.contains("\"bos_token_id\" must be one token id"), "{e}");
}

/// A small Llama written out: hidden 64, 4 heads sharing 2 key/value heads (head_dim 16),
/// intermediate 128, 2 layers, vocabulary 1,000.
fn small_llama(tied: bool) -> String {
    format!(
        r#"{{"architectures": ["LlamaForCausalLM"], "hidden_size": 64, "intermediate_size": 128, "num_hidden_layers": 2,
            "num_attention_heads": 4, "num_key_value_heads": 2, "vocab_size": 1000, "tie_word_embeddings": {tied},
            "attention_bias": true, "max_position_embeddings": 256}}"#
    )
}

#[test]
fn a_config_json_file_builds_the_model_it_describes_tied_or_untied() {
    // Per layer: q 64x64 + 64, k and v 64x32 + 32 each, o 64x64 + 64 (attention_bias), the MLP
    // 3 x 64x128, two norms of 64: 4,160 + 2 x 2,080 + 4,160 + 24,576 + 128 = 37,184.
    let layer = 4160 + 2 * 2080 + 4160 + 24_576 + 128;
    let untied = 1000 * 64 + 2 * layer + 64 + 64 * 1000;
    let dir = std::env::temp_dir().join(format!("tensormem-hf-{}", std::process::id()));
    std::fs::create_dir_all(&dir).unwrap();
    for (tied, count) in [(false, untied), (true, untied - 64 * 1000)] {
        let path = dir.join(format!("config-{tied}.json"));
        std::fs::write(&path, small_llama(tied)).unwrap();
        let path = path.to_str().unwrap();
        assert_eq!(HfConfig::load(path).unwrap().parameter_count(), count as u64);
        let r = run(&[("config", path), ("batch", "2"), ("context", "16"), ("dtype", "float32")]);
        assert_eq!(r.model_parameters, Some(count as u64), "tie_word_embeddings={tied}");
        // The JSON text itself is a config too.
        assert_eq!(HfConfig::load(&small_llama(tied)).unwrap().parameter_count(), count as u64);
    }
    std::fs::remove_dir_all(&dir).ok();
}

#[test]
fn unsupported_or_incomplete_configs_are_refused_with_what_is_wrong() {
    let parse = |text: &str| HfConfig::parse(text).unwrap_err();
    let e = parse(r#"{"architectures": ["T5ForConditionalGeneration"], "model_type": "t5"}"#);
    assert!(e.contains("architecture \"T5ForConditionalGeneration\" is not supported") && e.contains("LlamaForCausalLM"), "{e}");
    let e = parse(r#"{"model_type": "bert"}"#);
    assert!(e.contains("model_type \"bert\" is not supported"), "{e}");
    let e = parse(r#"{"hidden_size": 64}"#);
    assert!(e.contains("names no architecture"), "{e}");
    let e = parse(r#"{"architectures": ["LlamaForCausalLM"], "hidden_size": 64, "num_attention_heads": 4, "vocab_size": 10, "num_hidden_layers": 1}"#);
    assert!(e.contains("LlamaForCausalLM: config.json lacks \"intermediate_size\""), "{e}");
    let e = parse(r#"{"model_type": "gpt2", "n_embd": 64, "n_head": 4, "vocab_size": 10, "n_positions": 32}"#);
    assert!(e.contains("GPT2LMHeadModel: config.json lacks \"n_layer\""), "{e}");
    let e = parse(&small_llama(false).replace("\"num_key_value_heads\": 2", "\"num_key_value_heads\": 3"));
    assert!(e.contains("4 attention heads do not share 3 key/value heads evenly"), "{e}");
    let e = parse(&small_llama(false).replace("\"vocab_size\": 1000", "\"vocab_size\": -5"));
    assert!(e.contains("\"vocab_size\" must be a positive whole number, got -5"), "{e}");
    assert!(parse("[1, 2]").contains("must be a JSON object"));
    assert!(parse("{").contains("config.json is not JSON"));
    // Through the scenario: checked before anything runs.
    let e = run_error(&[("config", "/nonexistent/config.json")]);
    assert!(e.contains("is neither a preset (llama-3-8b, llama-3-70b, mistral-7b, qwen2.5-7b, gpt2) nor a readable config.json"), "{e}");
    let e = run_error(&[("config", "gpt2"), ("context", "2048")]);
    assert!(e.contains("GPT-2's learned positions cover 1024 tokens: context=2048 is longer"), "{e}");
    let e = run_error(&[("lora", "8"), ("lora_targets", "q,x")]);
    assert!(e.contains("lora_targets: \"x\" is not a linear of the layer"), "{e}");
    let e = run_error(&[("config", "gpt2"), ("lora", "8")]);
    assert!(e.contains("LoRA is built for the Llama family"), "{e}");
}

#[test]
fn llama_3_8b_full_fine_tune_in_float32_adamw_runs_out_of_memory_on_an_80_gb_card() {
    let r = run(&[("dtype", "float32")]);
    assert_eq!(r.model_parameters, Some(8_030_261_248));
    let error = r.out_of_memory.as_deref().expect("32 GB of parameters, 32 of gradients and 64 of AdamW's moments do not fit in 80");
    assert!(error.starts_with("Out of memory. Tried to allocate "), "{error}");
    assert!(error.contains(" GPU 0 has a total capacity of 79.20 GiB of which "), "{error}");
    // In bfloat16 (the default) the step fits: 16 GB each for the parameters and gradients,
    // 32 GB of moments, the activations of one 512-token sequence and foreach's square roots.
    let bf16 = run(&[]);
    assert_eq!(bf16.out_of_memory, None);
    assert!(bf16.peak_allocated_bytes > 64_000_000_000 && bf16.peak_reserved_bytes < 80 << 30, "{}", bf16.peak_reserved_bytes);
}

#[test]
fn what_a_llama_3_8b_step_keeps_follows_from_the_shapes() {
    let full = run(&[("warmup", "0")]);
    let lora = run(&[("warmup", "0"), ("lora", "16"), ("lora_targets", "q,k,v,o")]);
    // Before the step: the bfloat16 parameters (every one a multiple of 512 bytes), the int64
    // ids and targets (512 x 8 bytes each) and the float32 rotary inv_freq and its clone
    // original_inv_freq (64 x 4, one 512-byte block each).
    assert_eq!(allocated(&full, "model and batch"), 2 * 8_030_261_248 + 2 * 4096 + 2 * 512);
    // LoRA adds its float32 adapters (13,631,488 parameters, each tensor a multiple of 512).
    let model_and_batch = lora.steps.iter().find(|s| s.label == "model and batch").unwrap();
    assert_eq!(model_and_batch.allocated_bytes, allocated(&full, "model and batch") + 4 * 13_631_488);
    // PEFT makes them in bfloat16, the base's type, and PeftModel casts each to float32 in
    // turn, the copy before the old one is freed: the build peaks, before the batch exists, at
    // the float32 model plus the last adapter's bfloat16 weight (o_proj's lora_B, 4096 x 16).
    assert_eq!(model_and_batch.max_allocated_bytes, model_and_batch.allocated_bytes - 2 * 4096 + 4096 * 16 * 2);
    // After the first optimizer step the full fine-tune keeps a gradient and two moments of
    // every bfloat16 parameter; LoRA the same of its float32 adapters only. The rest (the
    // logits the loop still holds, the loss) is the same in both runs.
    let kept = |r: &RunResult| allocated(r, "optimizer step") - allocated(r, "model and batch");
    assert_eq!(kept(&full) - kept(&lora), 3 * 2 * 8_030_261_248 - 3 * 4 * 13_631_488);
}

#[test]
fn lora_rank_16_on_q_k_v_o_of_llama_3_8b_trains_what_peft_trains() {
    // PEFT's lora.Linear adds lora_A [r, in] and lora_B [out, r]: r x (in + out) per target.
    // Llama-3-8B: hidden 4096; q_proj 4096 -> 32 heads x 128 = 4096; k_proj and v_proj
    // 4096 -> 8 key/value heads x 128 = 1024; o_proj 4096 -> 4096. Per layer:
    // 16 x (8192 + 5120 + 5120 + 8192) = 16 x 26,624 = 425,984; 32 layers: 13,631,488
    // (PEFT's print_trainable_parameters: "trainable params: 13,631,488 || all params:
    // 8,043,892,736 || trainable%: 0.1695").
    let config = HfConfig::load("llama-3-8b").unwrap();
    let targets = LoraConfig::parse_targets("q,k,v,o").unwrap();
    assert_eq!(LoraConfig { rank: 16, alpha: 32.0, targets }.trainable_count(&config), 13_631_488);
    let r = run(&[("lora", "16"), ("lora_alpha", "32"), ("lora_targets", "q,k,v,o"), ("context", "64")]);
    assert_eq!(r.trainable_parameters, Some(13_631_488));
    assert_eq!(r.model_parameters, Some(8_043_892_736));
    assert_eq!(r.out_of_memory, None);
    // PEFT's default targets for Llama are q_proj and v_proj.
    assert_eq!(LoraConfig::parse_targets("v_proj,q").unwrap(), vec!["q_proj", "v_proj"]);
}

#[test]
fn sdpa_keeps_no_t_by_t_tensor_where_eager_keeps_two_per_layer() {
    let forward = |attn: &str| allocated(&run(&[("warmup", "0"), ("attn", attn)]), "forward");
    // Per layer of Llama-3-8B in bfloat16, batch 1, T = 512, 32 query heads and 8 key/value
    // heads of 128. Eager keeps what sdpa does not: k and v repeated to 32 heads (repeat_kv's
    // copies, saved by the two matmuls: 2 x 2 x 32 x T x 128 bytes), the float32 softmax
    // (4 x 32 x T^2) and its bfloat16 cast (2 x 32 x T^2). SDPA keeps instead k and v as they
    // are (the rotated k and v_proj's output: 2 x 2 x 8 x T x 128), its output (2 x 32 x T x
    // 128; eager's matmul output is freed once copied by transpose(1, 2).contiguous()) and the
    // float32 log-sum-exp (4 x 32 x T), and the RNG state's seed and offset (two int64
    // scalars: a 512-byte block each). The mask eager builds once is freed at the end of the
    // forward. Per layer: 192 T^2 + 16,384 T - 12,416 T - 1,024.
    let t: u64 = 512;
    let per_layer = 192 * t * t + 16_384 * t - 12_416 * t - 1_024;
    assert_eq!(forward("eager") - forward("sdpa"), 32 * per_layer);
    // At 4,096 tokens eager's scores do not fit on the 80 GB card; sdpa's step does.
    let long = |attn: &str| run(&[("warmup", "0"), ("context", "4096"), ("attn", attn)]);
    assert!(long("eager").out_of_memory.is_some());
    assert_eq!(long("sdpa").out_of_memory, None);
    let e = run_error(&[("config", "gpt2"), ("attn", "sdpa")]);
    assert!(e.contains("GPT2LMHeadModel takes attn=eager"), "{e}");
}

#[test]
fn gpt2_from_its_config_writes_gelu_new_out_as_transformers_does() {
    let set = [("batch", "8"), ("context", "1024"), ("warmup", "0")];
    let hf = run(&[("config", "gpt2"), ("dtype", "float32"), ("batch", "8"), ("context", "1024"), ("warmup", "0")]);
    let request = RunRequest { scenario: "gpt2-train".into(), set: set.iter().map(|(k, v)| (k.to_string(), v.to_string())).collect(), ..Default::default() };
    let fused = scenarios::run(&request).unwrap();
    assert_eq!(allocated(&hf, "model and batch"), allocated(&fused, "model and batch"));
    // NewGELUActivation keeps the tanh, 0.5 * x and 1 + tanh besides x (which the fused GELU
    // keeps alone): 3 more float32 [8, 1024, 3072] tensors in each of the 12 layers.
    assert_eq!(allocated(&hf, "forward") - allocated(&fused, "forward"), 12 * 3 * 8 * 1024 * 3072 * 4);
}

#[test]
fn lora_with_checkpointing_backpropagates_through_the_frozen_embedding_s_output_as_peft_makes_it() {
    // Without enable_input_require_grads the first checkpointed layer would have no input
    // that requires grad (PyTorch's "element 0 of tensors does not require grad").
    let set = |checkpointing| [("warmup", "0"), ("lora", "16"), ("lora_targets", "q,k,v,o"), ("checkpointing", checkpointing)];
    let (plain, checkpointed) = (run(&set("false")), run(&set("true")));
    assert_eq!(checkpointed.trainable_parameters, Some(13_631_488));
    assert!(checkpointed.peak_allocated_bytes < plain.peak_allocated_bytes);
    // The forward keeps each layer's input instead of its activations.
    let kept = |r: &RunResult| allocated(r, "forward") - allocated(r, "model and batch");
    assert!(kept(&checkpointed) * 10 < kept(&plain), "{} vs {}", kept(&checkpointed), kept(&plain));
}

#[test]
fn sdpa_is_simulated_for_16_bit_q_k_v_only() {
    // CUDA's flash kernel takes float16 or bfloat16; float32 would run another kernel.
    let e = run_error(&[("attn", "sdpa"), ("dtype", "float32")]);
    assert!(e.contains("attn=sdpa is simulated as CUDA's flash kernel"), "{e}");
    // Under autocast, SDPA casts q, k and v to bfloat16 (CUDA's autocast lists it) and runs.
    let r = run(&[("attn", "sdpa"), ("dtype", "float32"), ("amp", "bfloat16"), ("lora", "8"), ("warmup", "0")]);
    assert_eq!((r.out_of_memory, r.trainable_parameters), (None, Some(3_407_872)));
}
