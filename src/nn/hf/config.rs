//! A model's `config.json`: the presets shipped, the architectures read, and what the model
//! builder takes from them.

use super::*;

/// The configs shipped with tensormem: (name, config.json). Each is the model's `config.json`
/// on the Hugging Face Hub, copied value for value:
/// - `llama-3-8b`: meta-llama/Meta-Llama-3-8B/config.json (8,030,261,248 parameters)
/// - `mistral-7b`: mistralai/Mistral-7B-v0.1/config.json (7,241,732,096)
/// - `qwen2.5-7b`: Qwen/Qwen2.5-7B/config.json (7,615,616,512)
/// - `gpt2`: openai-community/gpt2/config.json (124,439,808)
pub const HF_PRESETS: [(&str, &str); 5] = [
    ("llama-3-8b", include_str!("../hf_configs/llama-3-8b.json")),
    ("llama-3-70b", include_str!("../hf_configs/llama-3-70b.json")),
    ("mistral-7b", include_str!("../hf_configs/mistral-7b.json")),
    ("qwen2.5-7b", include_str!("../hf_configs/qwen2.5-7b.json")),
    ("gpt2", include_str!("../hf_configs/gpt2.json")),
];

/// Everything that differs between the architectures tensormem builds, in one row each: the
/// config parser, the model builder and the scenarios read these instead of asking which
/// architecture it is. A new architecture of the Llama family is one row here.
#[derive(Debug, PartialEq)]
pub struct HfArchitecture {
    /// `architectures[0]` in a config.json.
    pub class: &'static str,
    /// `model_type`, for a config.json without `architectures`.
    pub model_type: &'static str,
    /// Which modeling file builds it.
    pub family: Family,
    /// Biases on q, k and v; on o_proj; on gate, up and down.
    pub qkv_bias: Bias,
    pub o_bias: Bias,
    pub mlp_bias: Bias,
    /// Rotary position embeddings (an even head size); otherwise learned positions, which cover
    /// `max_positions` tokens and no more.
    pub rotary: bool,
    /// What is built for it so far: LoRA on q, k, v, o, gate, up and down (and a 4-bit base
    /// under them), SDPA attention, tensor parallelism, generation with a KV cache.
    pub lora: bool,
    pub sdpa: bool,
    pub tensor_parallel: bool,
    pub generation: bool,
}

/// Whether a layer has a bias.
#[derive(Debug, Clone, Copy, PartialEq)]
pub enum Bias {
    Never,
    Always,
    /// As the config.json's flag says (false when absent).
    Flag(&'static str),
}

/// The Llama family as `modeling_llama.py` builds it; Mistral and Qwen2 differ in their biases.
const LLAMA: HfArchitecture = HfArchitecture {
    class: "LlamaForCausalLM",
    model_type: "llama",
    family: Family::Llama,
    qkv_bias: Bias::Flag("attention_bias"),
    o_bias: Bias::Flag("attention_bias"),
    mlp_bias: Bias::Flag("mlp_bias"),
    rotary: true,
    lora: true,
    sdpa: true,
    tensor_parallel: true,
    generation: true,
};

/// The architectures tensormem builds (`architectures[0]`, or `model_type` without it).
const ARCHITECTURES: [HfArchitecture; 4] = [
    LLAMA,
    HfArchitecture {
        class: "MistralForCausalLM",
        model_type: "mistral",
        family: Family::Mistral,
        qkv_bias: Bias::Never,
        o_bias: Bias::Never,
        mlp_bias: Bias::Never,
        ..LLAMA
    },
    // Qwen2Attention: q, k, v with bias=True, o_proj without.
    HfArchitecture {
        class: "Qwen2ForCausalLM",
        model_type: "qwen2",
        family: Family::Qwen2,
        qkv_bias: Bias::Always,
        o_bias: Bias::Never,
        mlp_bias: Bias::Never,
        ..LLAMA
    },
    // GPT-2's Conv1D layers all have biases; its positions are learned.
    HfArchitecture {
        class: "GPT2LMHeadModel",
        model_type: "gpt2",
        family: Family::Gpt2,
        qkv_bias: Bias::Always,
        o_bias: Bias::Always,
        mlp_bias: Bias::Always,
        rotary: false,
        lora: false,
        sdpa: false,
        tensor_parallel: false,
        generation: false,
    },
];

/// Which modeling file builds the model.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Family {
    Llama,
    Mistral,
    Qwen2,
    Gpt2,
}

/// How attention is computed (`attn_implementation`).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum AttentionImplementation {
    /// `eager_attention_forward`: the scores and the softmax are real [batch, heads, T, T]
    /// tensors that autograd keeps.
    Eager,
    /// `sdpa_attention_forward`: `F.scaled_dot_product_attention(..., is_causal=True,
    /// enable_gqa=True)` as CUDA's flash kernel runs it (no causal mask, k and v not repeated,
    /// only the output and a float32 log-sum-exp per row kept). Simulated only.
    Sdpa,
}

/// A parsed `config.json`: what the model's shapes need.
#[derive(Debug, Clone, PartialEq)]
pub struct HfConfig {
    /// `architectures[0]` as the file names it (or the class its `model_type` maps to).
    pub architecture: String,
    pub family: Family,
    /// What differs between architectures (see [`HfArchitecture`]).
    pub arch: &'static HfArchitecture,
    pub vocab: usize,
    pub hidden: usize,
    pub intermediate: usize,
    pub layers: usize,
    pub heads: usize,
    pub kv_heads: usize,
    pub head_dim: usize,
    pub max_positions: usize,
    pub norm_eps: f64,
    pub rope_theta: f64,
    pub tie_word_embeddings: bool,
    /// Biases on q, k and v (Llama's `attention_bias`; always on in Qwen2).
    pub qkv_bias: bool,
    /// A bias on o_proj (Llama's `attention_bias`; never in Qwen2 or Mistral).
    pub o_bias: bool,
    /// Biases on gate, up and down (Llama's `mlp_bias`).
    pub mlp_bias: bool,
    /// Dropout on the attention probabilities in training (`attention_dropout`, GPT-2's
    /// `attn_pdrop`).
    pub attention_dropout: f64,
    /// GPT-2's `resid_pdrop` (also used for `embd_pdrop`).
    pub residual_dropout: f64,
    pub initializer_range: f64,
    /// `eos_token_id` (one id or a list; the config class's default when absent: 2 for
    /// LlamaConfig and MistralConfig, 50256 for GPT2Config, none for Qwen2Config; none when
    /// null): generate's end-of-sequence ids.
    pub eos_token_ids: Vec<i64>,
    /// `bos_token_id` (the config class's default when absent: 1 for LlamaConfig and
    /// MistralConfig, 50256 for GPT2Config, none for Qwen2Config): generate puts it on the
    /// device with the other special tokens.
    pub bos_token_id: Option<i64>,
}

/// The largest config.json read (Hugging Face's are a few kilobytes; a label map can make one
/// larger, never megabytes).
const CONFIG_LIMIT: u64 = 4 << 20;

/// The deepest model built: eight times the deepest released (Llama-3.1-405B has 126 layers).
pub const MAX_LAYERS: usize = 1024;

impl HfConfig {
    /// A preset's name, a `config.json` path, or the JSON text itself (starting with `{`).
    pub fn load(spec: &str) -> std::result::Result<HfConfig, String> {
        let spec = spec.trim();
        if let Some((_, text)) = HF_PRESETS.iter().find(|(name, _)| *name == spec) {
            return HfConfig::parse(text);
        }
        if spec.starts_with('{') {
            return HfConfig::parse(spec);
        }
        let presets: Vec<&str> = HF_PRESETS.iter().map(|(n, _)| *n).collect();
        if let Err(e) = std::fs::metadata(spec) {
            return Err(format!("config {spec:?} is neither a preset ({}) nor a readable config.json: {e}", presets.join(", ")));
        }
        let text = crate::files::read_small(std::path::Path::new(spec), CONFIG_LIMIT, "a config.json")?;
        HfConfig::parse(&text).map_err(|e| format!("{spec}: {e}"))
    }

    /// A `config.json`'s text.
    pub fn parse(text: &str) -> std::result::Result<HfConfig, String> {
        let json: Value = serde_json::from_str(text).map_err(|e| format!("config.json is not JSON: {e}"))?;
        let Value::Object(map) = &json else { return Err("config.json must be a JSON object".into()) };
        let model_type = map.get("model_type").and_then(Value::as_str);
        let named = map.get("architectures").and_then(Value::as_array).and_then(|a| a.first()).and_then(Value::as_str);
        let supported = || ARCHITECTURES.iter().map(|a| a.class).collect::<Vec<_>>().join(", ");
        let arch = match (named, model_type) {
            (Some(name), _) => ARCHITECTURES
                .iter()
                .find(|a| a.class == name)
                .ok_or_else(|| format!("architecture {name:?} is not supported; tensormem builds {}", supported()))?,
            (None, Some(kind)) => ARCHITECTURES
                .iter()
                .find(|a| a.model_type == kind)
                .ok_or_else(|| format!("model_type {kind:?} is not supported; tensormem builds {}", supported()))?,
            (None, None) => return Err(format!("config.json names no architecture (\"architectures\" or \"model_type\"); tensormem builds {}", supported())),
        };
        let (architecture, family) = (arch.class, arch.family);
        let field = |name: &str| map.get(name).filter(|v| !v.is_null());
        let count = |name: &str| -> std::result::Result<usize, String> {
            let value = field(name).ok_or_else(|| format!("{architecture}: config.json lacks {name:?}"))?;
            value
                .as_u64()
                .filter(|&n| n > 0)
                .and_then(|n| usize::try_from(n).ok())
                .ok_or_else(|| format!("{architecture}: {name:?} must be a positive whole number, got {value}"))
        };
        let optional_count = |name: &str, default: usize| if field(name).is_some() { count(name) } else { Ok(default) };
        let number = |name: &str, default: f64| -> std::result::Result<f64, String> {
            match field(name) {
                None => Ok(default),
                Some(v) => v.as_f64().ok_or_else(|| format!("{architecture}: {name:?} must be a number, got {v}")),
            }
        };
        let flag = |name: &str, default: bool| -> std::result::Result<bool, String> {
            match field(name) {
                None => Ok(default),
                Some(v) => v.as_bool().ok_or_else(|| format!("{architecture}: {name:?} must be true or false, got {v}")),
            }
        };
        let bias = |rule: Bias| -> std::result::Result<bool, String> {
            match rule {
                Bias::Never => Ok(false),
                Bias::Always => Ok(true),
                Bias::Flag(name) => flag(name, false),
            }
        };
        let (qkv_bias, o_bias, mlp_bias) = (bias(arch.qkv_bias)?, bias(arch.o_bias)?, bias(arch.mlp_bias)?);
        // Special token ids: one id or a list, the config class's default when absent, none
        // when null.
        let token_ids = |key: &str, default: &[i64]| -> std::result::Result<Vec<i64>, String> {
            let Some(v) = map.get(key) else { return Ok(default.to_vec()) };
            if v.is_null() {
                return Ok(vec![]);
            }
            let ids = v.as_array().map_or_else(|| vec![v.clone()], Clone::clone);
            ids.iter()
                .map(|id| id.as_i64().filter(|&id| id >= 0))
                .collect::<Option<Vec<i64>>>()
                .ok_or_else(|| format!("{architecture}: \"{key}\" must be a token id or a list of them, got {v}"))
        };
        let (bos_default, eos_default): (&[i64], &[i64]) = match arch.model_type {
            "llama" | "mistral" => (&[1], &[2]),
            "gpt2" => (&[50256], &[50256]),
            _ => (&[], &[]),
        };
        let eos_token_ids = token_ids("eos_token_id", eos_default)?;
        let bos_token_id = match token_ids("bos_token_id", bos_default)?[..] {
            [] => None,
            [id] => Some(id),
            _ => return Err(format!("{architecture}: \"bos_token_id\" must be one token id")),
        };
        let config = if family == Family::Gpt2 {
            // GPT2Config: n_embd, n_layer, n_head, n_positions; n_inner null = 4 x n_embd;
            // embeddings tied to the output.
            let hidden = count("n_embd")?;
            let heads = count("n_head")?;
            HfConfig {
                architecture: architecture.into(),
                family,
                arch,
                vocab: count("vocab_size")?,
                hidden,
                intermediate: optional_count("n_inner", 4 * hidden)?,
                layers: count("n_layer")?,
                heads,
                kv_heads: heads,
                head_dim: hidden / heads,
                max_positions: count("n_positions")?,
                norm_eps: number("layer_norm_epsilon", 1e-5)?,
                rope_theta: 0.0,
                tie_word_embeddings: flag("tie_word_embeddings", true)?,
                qkv_bias,
                o_bias,
                mlp_bias,
                attention_dropout: number("attn_pdrop", 0.1)?,
                residual_dropout: number("resid_pdrop", 0.1)?,
                initializer_range: number("initializer_range", 0.02)?,
                eos_token_ids,
                bos_token_id,
            }
        } else {
            let hidden = count("hidden_size")?;
            let heads = count("num_attention_heads")?;
            // As LlamaConfig: num_key_value_heads defaults to num_attention_heads, head_dim to
            // hidden_size / num_attention_heads.
            let kv_heads = optional_count("num_key_value_heads", heads)?;
            HfConfig {
                architecture: architecture.into(),
                family,
                arch,
                vocab: count("vocab_size")?,
                hidden,
                intermediate: count("intermediate_size")?,
                layers: count("num_hidden_layers")?,
                heads,
                kv_heads,
                head_dim: optional_count("head_dim", hidden / heads)?,
                max_positions: optional_count("max_position_embeddings", 2048)?,
                norm_eps: number("rms_norm_eps", 1e-6)?,
                rope_theta: number("rope_theta", 10_000.0)?,
                tie_word_embeddings: flag("tie_word_embeddings", false)?,
                qkv_bias,
                o_bias,
                mlp_bias,
                attention_dropout: number("attention_dropout", 0.0)?,
                residual_dropout: 0.0,
                initializer_range: number("initializer_range", 0.02)?,
                eos_token_ids,
                bos_token_id,
            }
        };
        config.validate()?;
        Ok(config)
    }

    fn validate(&self) -> std::result::Result<(), String> {
        let a = &self.architecture;
        if self.layers > MAX_LAYERS {
            return Err(format!(
                "{a}: {} layers is more than {MAX_LAYERS}: no model is that deep (released ones have at most about 130), so tensormem refuses it rather than build it",
                self.layers
            ));
        }
        if !self.heads.is_multiple_of(self.kv_heads) {
            return Err(format!("{a}: {} attention heads do not share {} key/value heads evenly", self.heads, self.kv_heads));
        }
        if !self.arch.rotary && !self.hidden.is_multiple_of(self.heads) {
            return Err(format!("{a}: n_embd {} does not split into {} heads", self.hidden, self.heads));
        }
        if self.arch.rotary && (self.head_dim == 0 || !self.head_dim.is_multiple_of(2)) {
            return Err(format!("{a}: rotary embeddings need an even head size, got {}", self.head_dim));
        }
        for (name, p) in [("attention dropout", self.attention_dropout), ("dropout", self.residual_dropout)] {
            if !(0.0..=1.0).contains(&p) {
                return Err(format!("{a}: {name} must be between 0 and 1, got {p}"));
            }
        }
        Ok(())
    }

    /// One rank's share under tensor parallelism of degree `tp`, as torchtitan's plan for
    /// Llama splits it: q, k, v, gate and up column-wise (their outputs: `tp` times fewer heads
    /// and intermediate features), o and down row-wise (their inputs), the embedding and the
    /// output over the vocabulary (the logits and the loss on 1/tp of it, `loss_parallel`); norms
    /// and biases of row-wise layers whole. Without sequence parallelism each rank keeps the
    /// whole [batch, T, hidden] activations between them.
    pub fn tensor_parallel(&self, tp: usize) -> std::result::Result<HfConfig, String> {
        if tp == 1 {
            return Ok(self.clone());
        }
        if !self.arch.tensor_parallel {
            return Err("tp: tensor parallelism is built for the Llama family (q, k, v, o, gate, up, down) so far, not GPT2LMHeadModel".into());
        }
        for (what, n) in [("attention heads", self.heads), ("key/value heads", self.kv_heads), ("intermediate features", self.intermediate)] {
            if !n.is_multiple_of(tp) {
                return Err(format!("tp={tp}: the {n} {what} do not split evenly over {tp} ranks"));
            }
        }
        Ok(HfConfig {
            heads: self.heads / tp,
            kv_heads: self.kv_heads / tp,
            intermediate: self.intermediate / tp,
            vocab: self.vocab.div_ceil(tp),
            ..self.clone()
        })
    }

    /// The parameter count, from the shapes alone (what `sum(p.numel() for p in
    /// model.parameters())` prints; a tied head counts once).
    pub fn parameter_count(&self) -> u64 {
        let (h, i, v) = (self.hidden as u64, self.intermediate as u64, self.vocab as u64);
        let bias = |on: bool, n: u64| if on { n } else { 0 };
        let head = if self.tie_word_embeddings { 0 } else { v * h };
        if self.family == Family::Gpt2 {
            let layer = (h * 3 * h + 3 * h) + (h * h + h) + (h * i + i) + (i * h + h) + 4 * h;
            return v * h + self.max_positions as u64 * h + self.layers as u64 * layer + 2 * h + head;
        }
        let (q, kv) = ((self.heads * self.head_dim) as u64, (self.kv_heads * self.head_dim) as u64);
        let attention = h * q + bias(self.qkv_bias, q) + 2 * (h * kv + bias(self.qkv_bias, kv)) + q * h + bias(self.o_bias, h);
        let mlp = 3 * h * i + bias(self.mlp_bias, 2 * i + h);
        v * h + self.layers as u64 * (attention + mlp + 2 * h) + h + head
    }
}
