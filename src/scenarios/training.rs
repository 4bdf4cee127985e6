//! Whole training steps of real model sizes: `lm-train` (the presets of a recorded PyTorch run,
//! comparable with its `_record_memory_history` trace), `gpt2-train` (GPT-2 as published) and
//! `oom` (a 7B Llama-style model with AdamW on an 80 GB card). Each runs `warmup` steps (one by
//! default; none records the very first step, in which the optimizer makes its state), then
//! records full steps as a training loop does: zero_grad(set_to_none) -> forward -> loss ->
//! backward -> optimizer step, under autocast to float16 (with a GradScaler) or bfloat16
//! (without one) when `amp` asks for it.

use super::{Parameter, Program, Recorder, Scenario, ScenarioInfo, Values, token_batch};
use crate::amp;
use crate::nn::optim::{Adam, AdamW8bit, GradScaler, HandwrittenAdamW, MasterWeights, Optimizer, Sgd};
use crate::nn::parallel::{self, DdpReducer, Hooks, Parallel, RankWrapper, Replica, Strategy, Unwrapped};
use crate::nn::{
    Architecture, AttentionImplementation, HfConfig, HfModel, LM_SIZE_NAMES, LM_SIZES, Lm, LmConfig, LoraConfig, Module, Quantize, Transformer,
    TransformerConfig,
};
use crate::tensor::{DType, Result, Tensor, TensorError};

/// GPT-2's published sizes: (name, d_model, layers, heads); d_ff is 4 x d_model.
const GPT2_SIZES: [(&str, usize, usize, usize); 4] = [("small", 768, 12, 12), ("medium", 1024, 24, 16), ("large", 1280, 36, 20), ("xl", 1600, 48, 25)];
const GPT2_NAMES: [&str; 4] = [GPT2_SIZES[0].0, GPT2_SIZES[1].0, GPT2_SIZES[2].0, GPT2_SIZES[3].0];

/// The Llama-style 7B of the `oom` scenario: (d_model, d_ff, layers, heads, vocabulary).
const LLAMA_7B: (usize, usize, usize, usize, usize) = (4096, 11008, 32, 32, 32_000);

const OPTIMIZERS: &[&str] = &["handwritten-adamw", "adamw", "adam", "sgd", "adamw-fused", "adamw8bit"];
const OPTIMIZER_HELP: &str = "handwritten-adamw: the recorded run's own AdamW (new moments every step); adamw, adam: torch.optim's (see foreach); \
                              sgd: with momentum 0.9; adamw-fused: torch.optim.AdamW(fused=True) (a float32 step tensor per parameter \
                              on the device besides the moments, no foreach temporaries; sim device only); adamw8bit: bitsandbytes' \
                              AdamW8bit (two uint8 states and a float32 absmax per 256-element block for each, 32-bit states for \
                              parameters under 4,096 elements; sim device only)";
const DTYPES: &[&str] = &["float32", "bfloat16", "float16"];

/// `amp`'s choices: off, autocast to float16 with a GradScaler, autocast to bfloat16 without
/// one; `true` (when `amp` was a flag) stays float16.
const AMP: &[&str] = &["false", "float16", "bfloat16"];
const AMP_ALIASES: &[(&str, &str)] = &[("true", "float16")];
const AMP_HELP: &str = "autocast for the forward and loss: float16 (with a GradScaler; true = float16), bfloat16 (no GradScaler: its \
                        range needs no loss scaling) or false (no autocast)";
const FOREACH_HELP: &str = "adamw and adam: torch.optim's multi-tensor path (true, PyTorch's default on CUDA: op by op across every parameter, \
                            a square root of every second moment at once) or the single-tensor loop (false, foreach=False: one \
                            parameter at a time, its square root and quotient beside the previous parameter's denominator); sgd \
                            (no weight decay) allocates the same either way, handwritten-adamw ignores it";
const WARMUP_HELP: &str =
    "optimizer steps run before the recorded ones; 0 records the very first step, in which the optimizer makes its state (AdamW's moments)";

/// The parameters every training scenario takes, with its own size list and defaults.
fn training_parameters(
    sizes: &'static [&'static str],
    size: &'static str,
    batch: &'static str,
    context: &'static str,
    optimizer: &'static str,
) -> Vec<Parameter> {
    let mut parameters = vec![Parameter::choice("size", size, sizes, "model size")];
    parameters.extend(step_parameters(batch, context, optimizer, "float32"));
    parameters
}

/// What a training step takes whatever builds its model: the batch, the optimizer, the types,
/// checkpointing and the steps recorded.
fn step_parameters(batch: &'static str, context: &'static str, optimizer: &'static str, dtype: &'static str) -> Vec<Parameter> {
    vec![
        Parameter::integer("batch", batch, 1, 65_536, "sequences per batch"),
        Parameter::integer("context", context, 1, 1 << 20, "tokens per sequence"),
        Parameter::choice("optimizer", optimizer, OPTIMIZERS, OPTIMIZER_HELP),
        Parameter::flag("foreach", "true", FOREACH_HELP),
        Parameter::choice("dtype", dtype, DTYPES, "the parameters' type"),
        Parameter::choice_with_aliases("amp", "false", AMP, AMP_ALIASES, AMP_HELP),
        Parameter::flag("checkpointing", "false", "checkpoint every block: keep its input, recompute it in backward"),
        Parameter::integer("warmup", "1", 0, 1000, WARMUP_HELP),
        Parameter::integer("steps", "1", 1, 1000, "steps recorded after the warm-up"),
        Parameter::integer(
            "accumulation",
            "1",
            1,
            1024,
            "gradient accumulation: micro-batches of `batch` per optimizer step, each forward, loss / accumulation and backward \
             (the previous micro-batch's logits referenced until the next forward returns, its loss until the next loss is \
             made, as a Python loop rebinds them); gradients (and under zero2/fsdp their shards) add up",
        ),
        Parameter::flag("master_weights", "false", MASTER_WEIGHTS_HELP),
        Parameter::integer("world", "1", 1, 65_536, "GPUs training together (world / tp data-parallel replicas of tp ranks each), each rank simulated"),
        Parameter::choice("strategy", "ddp", Strategy::names(), Strategy::parameter_help()),
        Parameter::choice("ddp_reducer", "buckets", DdpReducer::NAMES, DDP_REDUCER_HELP),
        Parameter::integer("tp", "1", 1, 1024, TP_HELP),
        Parameter::integer("node", "8", 1, 1024, "GPUs per node: hsdp shards within a node"),
        Parameter::choice("fsdp_version", "1", &["1", "2"], FSDP_VERSION_HELP),
        Parameter::flag(
            "reshard_after_forward",
            "true",
            "fsdp, hsdp: free a block's all-gathered parameters after its forward and gather them again for its backward (true, FULL_SHARD) or keep them until its backward (false, SHARD_GRAD_OP: one all-gather less, a whole model of gathered parameters at the end of forward)",
        ),
        Parameter::integer("rank", "0", 0, 65_535, "the rank whose trace the run records (every rank is summarised in ranks)"),
    ]
}

const DDP_REDUCER_HELP: &str = "ddp, zero1: buckets (torch's DistributedDataParallel: the reducer's buckets, a second copy of every \
                                gradient), views (gradient_as_bucket_view=True: each gradient copied into its bucket as it \
                                arrives and made a view of it, so held once) or none (no reducer: each gradient all-reduced in place after backward and the \
                                parameters broadcast in place, as a hand-written DDP does)";

const FSDP_VERSION_HELP: &str = "fsdp, hsdp: 1 (FullyShardedDataParallel: each block's parameters one flat, padded FlatParameter, \
                                 gathered into one buffer) or 2 (fully_shard: each parameter its own padded dim-0 shard; a block's \
                                 all-gather output copied out into a buffer per parameter, the previous block's output kept until the \
                                 next exists in forward; the reduce-scatter input kept until the next block's; sharded gradients views \
                                 of the reduce-scatter output)";
const TP_HELP: &str = "tensor parallelism: each layer split over tp ranks (the Llama-style models: q, k, v, gate, up and the vocabulary \
                       by their outputs, o and down by their inputs, as torchtitan's plan), world / tp replicas trained under \
                       strategy; tp divides world";
const MASTER_WEIGHTS_HELP: &str = "16-bit parameters with a float32 master copy in the optimizer, as DeepSpeed's bf16/fp16 modes and \
                                   Megatron keep: the optimizer updates a float32 copy of each parameter (its shard under zero1/2, \
                                   fsdp) from a float32 gradient it keeps, then copies the result back";

/// `hf-train`'s parameters: the config, then a training step's.
fn hf_parameters() -> Vec<Parameter> {
    let mut parameters = vec![Parameter::text(
        "config",
        "llama-3-8b",
        4096,
        "a Hugging Face config.json: its path, its JSON text, or a preset (llama-3-8b, llama-3-70b, mistral-7b, qwen2.5-7b, gpt2); \
         LlamaForCausalLM, MistralForCausalLM, Qwen2ForCausalLM and GPT2LMHeadModel are built",
    )];
    parameters.extend(step_parameters("1", "512", "adamw", "bfloat16"));
    parameters.extend([
        Parameter::integer("lora", "0", 0, 4096, "LoRA's rank r (0: a full fine-tune): the base frozen (no gradients, no optimizer state), adapters lora_A [r, in] and lora_B [out, r] on each targeted linear, float32 when the base is 16-bit (PEFT's autocast_adapter_dtype)"),
        Parameter::integer("lora_alpha", "8", 1, 1 << 20, "LoRA's alpha: the update is scaled by alpha / r"),
        Parameter::text("lora_targets", "q,v", 64, "the linears LoRA adapts, from q, k, v, o, gate, up, down (PEFT's default for Llama: q,v)"),
    ]);
    parameters.push(Parameter::choice("quantize", "none", QUANTIZE, QUANTIZE_HELP));
    parameters.push(Parameter::choice(
        "attn",
        "eager",
        ATTENTION,
        "attention as transformers' attn_implementation: eager (the scores and their float32 softmax are [batch, heads, T, T] tensors autograd keeps) \
         or sdpa (scaled_dot_product_attention as CUDA's flash kernel runs it: no T x T tensor, a float32 log-sum-exp per row; Llama family, 16-bit q/k/v, sim device only)",
    ));
    parameters
}

/// `quantize`'s choices.
const QUANTIZE: &[&str] = &["none", "4bit"];
const QUANTIZE_HELP: &str = "4bit: QLoRA's base, as bitsandbytes loads it with BitsAndBytesConfig(load_in_4bit=True, \
                             bnb_4bit_quant_type=nf4, bnb_4bit_use_double_quant=True, bnb_4bit_compute_dtype=bfloat16): every linear \
                             of the decoder layers packed two weights a byte, with a uint8 absmax per 64 weights, a float32 absmax per \
                             256 of those and the maps; each forward and backward dequantises the weight to an [out, in] temporary. \
                             The embedding, norms and lm_head stay in dtype. Needs lora > 0; sim device only";

/// `attn`'s choices.
const ATTENTION: &[&str] = &["eager", "sdpa"];

pub(super) fn scenarios() -> Vec<Scenario> {
    vec![
        Scenario {
            info: ScenarioInfo {
                name: "lm-train",
                title: "A language model's training step, predicted from its config",
                explanation: "One training step of the pre-norm Transformer LM (RMSNorm, RoPE attention written with einsum and \
                              its own softmax, SwiGLU, vocabulary 10,000) of a recorded PyTorch run, after a warm-up step (warmup=0: \
                              the very first step, where the optimizer makes its state). Look at \
                              the staircase: forward climbs by each block's saved activations, backward gives them back while the \
                              gradients pile up, and the optimizer's peak comes at the largest parameter, where its old and new \
                              moments and three temporaries are live at once. Parameters, gradients and AdamW's two moments are \
                              4 x the model's bytes before any activation: checkpointing, a smaller batch or context shrink only \
                              the activations; a lower-precision optimizer state or sharding shrinks the rest.",
                parameters: training_parameters(&LM_SIZE_NAMES, "medium", "4", "128", "handwritten-adamw"),
                variants: vec![],
            },
            check: |v| {
                let &(_, _, hidden, _, heads) = LM_SIZES.iter().find(|s| s.0 == v.choice("size")).expect("checked against the size list");
                splits(v, heads, hidden)?;
                fits(v, 10_000).map(|()| train_work(v, LM_SIZES.iter().find(|s| s.0 == v.choice("size")).expect("checked against the size list").3))
            },
            fix_settings: None,
            program: Program::Async(|rec, v| {
                Box::pin(train(rec, v, |rec, v| {
                    let config = LmConfig::preset(v.choice("size"), v.int("context"), dtype(v)).expect("checked against the size list");
                    Model::lm(rec, config, v)
                }))
            }),
        },
        Scenario {
            info: ScenarioInfo {
                name: "gpt2-train",
                title: "GPT-2's training step",
                explanation: "One training step of GPT-2 as published (learned positions, LayerNorm, GELU, biases, embeddings tied \
                              to the output, dropout 0.1, vocabulary 50,257) with torch.optim.AdamW, after a warm-up step (warmup=0: \
                              the very first step, where AdamW makes its moments). The \
                              logits (batch x context x 50,257) and the attention probabilities (batch x heads x context^2 per \
                              layer) dominate the activations; AdamW's foreach step holds a square root of every second moment \
                              at once (foreach=false: the largest parameter's square root and quotient).",
                parameters: training_parameters(&GPT2_NAMES, "small", "8", "1024", "adamw"),
                variants: vec![],
            },
            check: |v| {
                if v.u64("context") > 1024 {
                    return Err(format!("GPT-2's learned positions cover 1024 tokens: context={} is longer", v.u64("context")));
                }
                if v.int("tp") > 1 {
                    return Err(
                        "tp: tensor parallelism is built for the Llama-style models (lm-train, oom, hf-train's Llama family) so far, not GPT-2's fused c_attn"
                            .into(),
                    );
                }
                fits(v, 50_257).map(|()| train_work(v, GPT2_SIZES.iter().find(|s| s.0 == v.choice("size")).expect("checked").2))
            },
            fix_settings: None,
            program: Program::Async(|rec, v| {
                Box::pin(train(rec, v, |rec, v| {
                    let &(_, dim, layers, heads) = GPT2_SIZES.iter().find(|s| s.0 == v.choice("size")).expect("checked against the size list");
                    let config = TransformerConfig {
                        architecture: Architecture::Gpt2,
                        vocab: 50257,
                        context: 1024,
                        dim,
                        layers,
                        heads,
                        hidden: 4 * dim,
                        dropout: 0.1,
                        dtype: dtype(v),
                    };
                    Model::gpt2(rec, config, v.flag("checkpointing"))
                }))
            }),
        },
        Scenario {
            info: ScenarioInfo {
                name: "oom",
                title: "A 7B model with AdamW does not fit on an 80 GB card",
                explanation: "A Llama-style 7B model (6.74 billion parameters) trained in float32 with AdamW: the parameters \
                              (27 GB) and their gradients (27 GB) fit, but the optimizer's two moments (54 GB) do not, so the \
                              first optimizer step runs out of memory with PyTorch's error. Read the error: how much the card has, \
                              how much is allocated, how much is reserved but unallocated. Try --capacity to find the card that \
                              fits, or dtype=bfloat16 to halve everything.",
                parameters: step_parameters("1", "512", "adamw", "float32"),
                variants: vec![],
            },
            check: |v| {
                splits(v, LLAMA_7B.3, LLAMA_7B.1)?;
                fits(v, LLAMA_7B.4 as u64).map(|()| train_work(v, LLAMA_7B.2))
            },
            fix_settings: None,
            program: Program::Async(|rec, v| {
                Box::pin(train(rec, v, |rec, v| {
                    let (dim, hidden, layers, heads, vocab) = LLAMA_7B;
                    let config = LmConfig { vocab, dim, hidden, layers, heads, context: v.int("context"), dtype: dtype(v) };
                    Model::lm(rec, config, v)
                }))
            }),
        },
        Scenario {
            info: ScenarioInfo {
                name: "hf-train",
                title: "Fine-tune a Hugging Face model: size it from its config.json",
                explanation: "A full fine-tuning step of a model built from its Hugging Face config.json (LlamaForCausalLM, \
                              MistralForCausalLM, Qwen2ForCausalLM: grouped-query attention, RMSNorm in float32, SwiGLU, RoPE, \
                              Qwen2's q/k/v biases; GPT2LMHeadModel) as transformers builds it, with torch.optim.AdamW, after a \
                              warm-up step (warmup=0: the first step, where AdamW makes its moments). Parameters, gradients and \
                              AdamW's two moments in the parameters' type come first: Llama-3-8B in float32 needs 128 GB of them \
                              and runs out of memory on an 80 GB card, in bfloat16 (the default) 64 GB. Then the activations: \
                              per layer the eager attention's scores and float32 softmax ([batch, heads, T, T]; attn=sdpa keeps \
                              none), and at the end the logits and their float32 copy for the loss (batch x T x vocabulary, \
                              128,256 for Llama-3). lora=RANK freezes the base as PEFT does: only the float32 adapters get \
                              gradients and AdamW's moments. quantize=4bit stores that frozen base as QLoRA does (bitsandbytes' \
                              NF4 with double quantisation, about 0.52 bytes per weight: Llama-3-8B's base in 5.7 GB instead \
                              of 16.1), and each of its linears dequantises its weight to a temporary in forward and backward.",
                parameters: hf_parameters(),
                variants: vec![],
            },
            check: |v| {
                let config = HfConfig::load(v.text("config"))?;
                config.tensor_parallel(v.int("tp"))?;
                if !config.arch.rotary && v.u64("context") > config.max_positions as u64 {
                    return Err(format!("GPT-2's learned positions cover {} tokens: context={} is longer", config.max_positions, v.u64("context")));
                }
                LoraConfig::parse_targets(v.text("lora_targets"))?;
                if v.choice("attn") == "sdpa" && !config.arch.sdpa {
                    return Err("attn=sdpa is built for the Llama family so far; GPT2LMHeadModel takes attn=eager".into());
                }
                if v.choice("attn") == "sdpa" && v.choice("dtype") == "float32" && autocast_dtype(v).is_none() {
                    return Err("attn=sdpa is simulated as CUDA's flash kernel, which takes float16 or bfloat16: with dtype=float32 use amp=bfloat16 (or float16), or attn=eager".into());
                }
                if v.u64("lora") > 0 && !config.arch.lora {
                    return Err("lora: LoRA is built for the Llama family (q, k, v, o, gate, up, down) so far, not GPT2LMHeadModel".into());
                }
                if v.choice("quantize") == "4bit" {
                    if v.u64("lora") == 0 {
                        return Err("quantize=4bit needs lora > 0: a 4-bit base cannot be trained itself (bitsandbytes' Params4bit gets no gradient), \
                                    QLoRA trains adapters on it"
                            .into());
                    }
                    if v.u64("world") > 1 {
                        return Err("quantize=4bit is simulated on one GPU (world=1) so far".into());
                    }
                }
                fits(v, config.vocab as u64).map(|()| train_work(v, config.layers))
            },
            fix_settings: None,
            program: Program::Async(|rec, v| {
                Box::pin(train(rec, v, |rec, v| {
                    let whole = HfConfig::load(v.text("config")).map_err(TensorError::Shape)?;
                    let config = whole.tensor_parallel(v.int("tp")).map_err(TensorError::Shape)?;
                    let lora = match v.int("lora") {
                        0 => None,
                        rank => Some(LoraConfig {
                            rank,
                            alpha: v.u64("lora_alpha") as f64,
                            targets: LoraConfig::parse_targets(v.text("lora_targets")).map_err(TensorError::Shape)?,
                        }),
                    };
                    let quantize = if v.choice("quantize") == "4bit" { Quantize::Nf4 } else { Quantize::None };
                    if quantize != Quantize::None && !rec.device.is_sim() {
                        return Err(TensorError::Unsupported(
                            "quantize=4bit is simulated only: tensormem has no bitsandbytes kernels on the GPU; run it on a sim: device".into(),
                        ));
                    }
                    let mut model = HfModel::with_quantization(&rec.device, &config, dtype(v), v.int("context"), lora.as_ref(), quantize)?;
                    model.set_checkpointing(v.flag("checkpointing"));
                    model.set_attention(if v.choice("attn") == "sdpa" { AttentionImplementation::Sdpa } else { AttentionImplementation::Eager })?;
                    // The whole model's counts (adapters included, as PEFT prints them, a 4-bit
                    // weight as its unpacked elements); a rank's share under tp, or a quantized
                    // base, is counted on the whole model's shapes alone.
                    let count = |m: &HfModel| (m.parameter_count(), m.trainable_parameters().iter().map(|p| p.numel() as u64).sum());
                    let (all, trainable) = if v.int("tp") == 1 && quantize == Quantize::None {
                        count(&model)
                    } else {
                        let scratch = crate::Device::sim(crate::SimOptions::custom(u64::MAX));
                        let _shapes = scratch.defer_parameters();
                        count(&HfModel::new(&scratch, &whole, dtype(v), v.int("context"), lora.as_ref())?)
                    };
                    rec.model_parameters = Some(all);
                    rec.trainable_parameters = Some(trainable);
                    Ok(Model::Hf(model))
                }))
            }),
        },
    ]
}

/// Checks before a run: the logits (batch x context x vocabulary) must stay within what
/// tensormem indexes, and float16 autocast's GradScaler needs float32 parameters (PyTorch's
/// refuses to unscale float16 gradients and has no bfloat16 kernel). bfloat16 autocast has no
/// scaler: any parameter type goes.
fn fits(v: &Values, vocab: u64) -> std::result::Result<(), String> {
    let logits = v.u64("batch").checked_mul(v.u64("context")).and_then(|t| t.checked_mul(vocab));
    if logits.is_none_or(|n| n > u32::MAX as u64) {
        return Err(format!("batch {} x context {} x vocabulary {vocab} makes logits larger than tensormem can index", v.u64("batch"), v.u64("context")));
    }
    let parallel = parallel(v);
    parallel::check(&parallel)?;
    if v.int("rank") >= parallel.world {
        return Err(format!("rank={} is not one of the {} ranks (0 to {})", v.int("rank"), parallel.world, parallel.world - 1));
    }
    if v.flag("master_weights") && v.choice("dtype") == "float32" {
        return Err("master_weights keeps float32 copies of 16-bit parameters: with dtype=float32 there is nothing to copy (use dtype=bfloat16)".into());
    }
    if autocast_dtype(v) == Some(DType::F16) && v.choice("dtype") != "float32" {
        return Err(format!(
            "amp=float16 keeps float32 parameters and scales their gradients: dtype={} would make GradScaler refuse them (\"Attempting to unscale FP16 gradients.\"); amp=bfloat16 needs no GradScaler",
            v.choice("dtype")
        ));
    }
    Ok(())
}

/// Whether tensor parallelism splits a Llama-style layer evenly: its heads and feed-forward
/// features over `tp`.
fn splits(v: &Values, heads: usize, hidden: usize) -> std::result::Result<(), String> {
    let tp = v.int("tp");
    if !heads.is_multiple_of(tp) || !hidden.is_multiple_of(tp) {
        return Err(format!("tp={tp}: the {heads} attention heads and {hidden} feed-forward features do not split evenly over {tp} ranks"));
    }
    Ok(())
}

/// The type autocast runs the forward and loss in, None without autocast (`amp=false`).
fn autocast_dtype(v: &Values) -> Option<DType> {
    match v.choice("amp") {
        "float16" => Some(DType::F16),
        "bfloat16" => Some(DType::BF16),
        _ => None,
    }
}

fn dtype(v: &Values) -> DType {
    match v.choice("dtype") {
        "bfloat16" => DType::BF16,
        "float16" => DType::F16,
        _ => DType::F32,
    }
}

/// The two model families a training step runs.
enum Model {
    Lm(Lm),
    Gpt2(Transformer),
    Hf(HfModel),
}

impl Model {
    /// The LM, or its rank's share under `tp`; the parameter count is the whole model's.
    fn lm(rec: &mut Recorder, config: LmConfig, v: &Values) -> Result<Model> {
        rec.model_parameters = Some(config.parameter_count());
        let mut model = Lm::tensor_parallel(&rec.device, config, v.int("tp"))?;
        model.checkpointing = v.flag("checkpointing");
        Ok(Model::Lm(model))
    }

    fn gpt2(rec: &mut Recorder, config: TransformerConfig, checkpointing: bool) -> Result<Model> {
        let mut model = Transformer::new(&rec.device, config)?;
        model.checkpointing = checkpointing;
        rec.model_parameters = Some(model.parameter_count());
        Ok(Model::Gpt2(model))
    }

    fn vocab(&self) -> usize {
        match self {
            Model::Lm(m) => m.config.vocab,
            Model::Gpt2(m) => m.config.vocab,
            Model::Hf(m) => m.vocab(),
        }
    }

    fn forward(&self, ids: &Tensor) -> Result<Tensor> {
        match self {
            Model::Lm(m) => m.forward(ids),
            Model::Gpt2(m) => m.forward(ids, true),
            Model::Hf(m) => m.forward(ids),
        }
    }

    fn loss(&self, logits: &Tensor, targets: &Tensor) -> Result<Tensor> {
        match self {
            Model::Lm(m) => m.loss(logits, targets),
            Model::Gpt2(m) => {
                let _scope = logits.device().scope("loss");
                crate::nn::cross_entropy(&logits.view(&[-1, m.config.vocab as isize])?, &targets.view(&[-1])?)
            }
            Model::Hf(m) => m.loss(logits, targets),
        }
    }
}

impl Replica for Model {
    fn trainable(&self) -> Vec<Tensor> {
        match self {
            Model::Lm(m) => m.parameters(),
            Model::Gpt2(m) => m.parameters(),
            Model::Hf(m) => m.trainable_parameters(),
        }
    }

    /// Every parameter, frozen ones (LoRA's base) included.
    fn all_parameters(&self) -> Vec<Tensor> {
        match self {
            Model::Lm(m) => m.parameters(),
            Model::Gpt2(m) => m.parameters(),
            Model::Hf(m) => m.parameters(),
        }
    }

    /// Each block's name and parameters, in forward order: FSDP's units.
    fn blocks(&self) -> Vec<(String, Vec<Tensor>)> {
        match self {
            Model::Lm(m) => m.blocks.iter().map(|b| (b.name.clone(), b.parameters())).collect(),
            Model::Gpt2(m) => m.blocks.iter().enumerate().map(|(i, b)| (format!("h.{i}"), b.parameters())).collect(),
            Model::Hf(m) => m.blocks(),
        }
    }

    fn set_hooks(&mut self, hooks: Hooks) {
        match self {
            Model::Lm(m) => m.hooks = hooks,
            Model::Gpt2(m) => m.hooks = hooks,
            Model::Hf(m) => m.set_hooks(hooks),
        }
    }
}

/// The `optimizer` asked for; torch.optim's Adam and AdamW take `foreach`. With
/// `master_weights` it updates float32 copies of `params`.
fn optimizer(v: &Values, params: Vec<Tensor>) -> Result<Box<dyn Optimizer>> {
    let (name, foreach) = (v.choice("optimizer"), v.flag("foreach"));
    // Before any step runs: tensormem has no fused or 8-bit optimizer kernels on the GPU.
    if matches!(name, "adamw-fused" | "adamw8bit") && params.first().is_some_and(|p| !p.device().is_sim()) {
        return Err(TensorError::Unsupported(format!(
            "optimizer={name} is simulated only (tensormem has no kernel for it on the GPU): run on a sim: device, or use adamw"
        )));
    }
    let make = |params: Vec<Tensor>| -> Box<dyn Optimizer> {
        match name {
            "handwritten-adamw" => Box::new(HandwrittenAdamW::new(params, 3e-4, 0.1)),
            "adamw" | "adam" => {
                let mut adam = if name == "adamw" { Adam::adamw(params, 3e-4, 0.01) } else { Adam::new(params, 3e-4, 0.0) };
                adam.foreach = foreach;
                Box::new(adam)
            }
            "adamw-fused" => {
                let mut adam = Adam::adamw(params, 3e-4, 0.01);
                (adam.foreach, adam.fused) = (false, true);
                Box::new(adam)
            }
            "adamw8bit" => Box::new(AdamW8bit::new(params, 3e-4, 0.01)),
            _ => Box::new(Sgd::new(params, 1e-2, 0.9, 0.0)),
        }
    };
    Ok(if v.flag("master_weights") { Box::new(MasterWeights::new(params, make)?) } else { make(params) })
}

fn parallel(v: &Values) -> Parallel {
    Parallel {
        world: v.int("world"),
        tp: v.int("tp"),
        strategy: Strategy::parse(v.choice("strategy")).expect("checked against the names"),
        node: v.int("node"),
        reshard_after_forward: v.flag("reshard_after_forward"),
        fsdp_version: if v.choice("fsdp_version") == "2" { 2 } else { 1 },
        ddp_reducer: DdpReducer::parse(v.choice("ddp_reducer")).expect("checked against the names"),
    }
}

/// Builds a run's model on a recorder's device.
type Build = fn(&mut Recorder, &Values) -> Result<Model>;

/// Trains on one GPU, or over `world` simulated GPUs: the ranks whose allocations differ from
/// the recorded rank's are run first, each on a device of its own, summarised and dropped;
/// then the recorded rank on the run's device.
async fn train(rec: &mut Recorder, v: &Values, build: Build) -> Result<()> {
    let parallel = parallel(v);
    if parallel.world == 1 {
        let model = build(rec, v)?;
        return train_rank(rec, v, model, &parallel, 0).await;
    }
    // Ranks are simulated; a model split by tp is one rank's share.
    if !rec.device.is_sim() {
        return Err(parallel::needs_sim());
    }
    let recorded = v.int("rank");
    let model = build_deferred(rec, v, build, &parallel)?;
    let classes = parallel.strategy.rank_classes(&parallel, &model.all_parameters());
    for class in classes.iter().filter(|c| !c.contains(&recorded)) {
        let mut other = rec.sibling().ok_or_else(parallel::needs_sim)?;
        let model = build_deferred(&mut other, v, build, &parallel)?;
        let out_of_memory = crate::scenarios::out_of_memory(train_rank(&mut other, v, model, &parallel, class[0]).await)?;
        let summary = other.summarize(class[0], out_of_memory);
        rec.ranks.extend(class.iter().map(|&rank| crate::scenarios::RankResult { rank, ..summary.clone() }));
    }
    rec.recorded_ranks = classes.into_iter().find(|c| c.contains(&recorded)).expect("every rank is in a class");
    train_rank(rec, v, model, &parallel, recorded).await
}

/// Builds the model; under fsdp its parameters get no memory (the shards hold it).
fn build_deferred(rec: &mut Recorder, v: &Values, build: Build, parallel: &Parallel) -> Result<Model> {
    let _deferred = parallel.shards_parameters().then(|| rec.device.defer_parameters());
    build(rec, v)
}

/// `warmup` steps, then `steps` recorded steps, each labelled by phase (`warm-up forward` for
/// the one warm-up step, `warm-up 2 forward` where there are several; `forward`, or `step 2
/// forward` where several are recorded). The optimizer makes its state in the first step it
/// takes: with `warmup=0`, inside the first recorded one.
async fn train_rank(rec: &mut Recorder, v: &Values, mut model: Model, parallel: &Parallel, rank: usize) -> Result<()> {
    let dev = rec.device.clone();
    let (batch, context, vocab) = (v.int("batch"), v.int("context"), model.vocab());
    let trainable = model.trainable();
    // One replica (world = tp) has no data-parallel wrapper.
    let (mut wrapper, stepped): (Box<dyn RankWrapper>, _) = if parallel.dp() == 1 {
        (Box::new(Unwrapped), trainable.iter().map(Tensor::share).collect())
    } else {
        parallel.strategy.wrap(&dev, &mut model, parallel, rank)?
    };
    let mut optimizer = optimizer(v, stepped)?;
    let autocast_dtype = autocast_dtype(v);
    // PyTorch's recipes: a GradScaler with float16 (its narrow range flushes small gradients to
    // zero), none with bfloat16 (float32's range).
    let mut scaler = (autocast_dtype == Some(DType::F16)).then(GradScaler::new);
    let (ids, targets) = token_batch(&dev, batch, context, vocab)?;
    rec.step("model and batch");
    let (warmup, steps) = (v.int("warmup"), v.int("steps"));
    for step in 0..warmup + steps {
        let label = |phase: &str| match (step.checked_sub(warmup), warmup, steps) {
            (None, 1, _) => format!("warm-up {phase}"),
            (None, _, _) => format!("warm-up {} {phase}", step + 1),
            (Some(_), _, 1) => phase.to_string(),
            (Some(recorded), _, _) => format!("step {} {phase}", recorded + 1),
        };
        // zero_grad(set_to_none) over every parameter (ZeroRedundancyOptimizer's param_groups
        // hold them all, not only the rank's own).
        optimizer.zero_grad(true)?;
        for p in &trainable {
            p.set_grad(None);
        }
        let micro_batches = v.int("accumulation");
        // The script's `logits` and `loss`: each rebound by the next micro-batch, the last ones
        // referenced to the end of the step.
        let (mut logits, mut loss): (Option<Tensor>, Option<Tensor>) = (None, None);
        for micro in 0..micro_batches {
            let phase = |name: &str| if micro_batches == 1 { label(name) } else { label(&format!("micro-batch {} {name}", micro + 1)) };
            wrapper.before_forward()?;
            let autocast = autocast_dtype.map(amp::autocast).transpose()?;
            // `logits = model(x)` rebinds only once the forward returns.
            let out = logits.insert(model.forward(&ids)?);
            wrapper.after_forward();
            rec.step(phase("forward"));
            let mut new_loss = model.loss(out, &targets)?;
            if micro_batches > 1 {
                // `loss = loss_fn(...)` rebinds before `loss = loss / n` divides it.
                loss = None;
                new_loss = new_loss.div_scalar(micro_batches as f64)?;
            }
            let loss = loss.insert(new_loss);
            rec.step(phase("loss"));
            drop(autocast);
            match &mut scaler {
                Some(scaler) => scaler.scale(loss)?.backward()?,
                None => loss.backward()?,
            }
            wrapper.after_backward()?;
            rec.step(phase("backward"));
        }
        match &mut scaler {
            Some(scaler) => {
                scaler.step(optimizer.as_mut()).await?;
                scaler.update().await?;
            }
            None => optimizer.step()?,
        }
        rec.step(label("optimizer step"));
        drop((logits, loss));
    }
    Ok(())
}

/// Every step (warm-up included) runs every micro-batch through every layer: forward, backward
/// and the optimizer, four passes (per simulated rank).
fn train_work(v: &Values, layers: usize) -> super::Work {
    let steps = v.u64("warmup") + v.u64("steps");
    super::Work::product(&[("steps with warm-up", steps), ("accumulation", v.u64("accumulation")), ("layers", layers as u64), ("", 4)])
}
