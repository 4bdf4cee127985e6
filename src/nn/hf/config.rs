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

/// The architectures tensormem builds (`architectures[0]`, or `model_type` without it).
const ARCHITECTURES: [(&str, &str, Family); 4] = [
    ("LlamaForCausalLM", "llama", Family::Llama),
    ("MistralForCausalLM", "mistral", Family::Mistral),
    ("Qwen2ForCausalLM", "qwen2", Family::Qwen2),
    ("GPT2LMHeadModel", "gpt2", Family::Gpt2),
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
        let supported = || ARCHITECTURES.iter().map(|a| a.0).collect::<Vec<_>>().join(", ");
        let &(architecture, _, family) = match (named, model_type) {
            (Some(name), _) => {
                ARCHITECTURES.iter().find(|a| a.0 == name).ok_or_else(|| format!("architecture {name:?} is not supported; tensormem builds {}", supported()))?
            }
            (None, Some(kind)) => {
                ARCHITECTURES.iter().find(|a| a.1 == kind).ok_or_else(|| format!("model_type {kind:?} is not supported; tensormem builds {}", supported()))?
            }
            (None, None) => return Err(format!("config.json names no architecture (\"architectures\" or \"model_type\"); tensormem builds {}", supported())),
        };
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
        let config = if family == Family::Gpt2 {
            // GPT2Config: n_embd, n_layer, n_head, n_positions; n_inner null = 4 x n_embd;
            // embeddings tied to the output.
            let hidden = count("n_embd")?;
            let heads = count("n_head")?;
            HfConfig {
                architecture: architecture.into(),
                family,
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
                qkv_bias: true,
                o_bias: true,
                mlp_bias: true,
                attention_dropout: number("attn_pdrop", 0.1)?,
                residual_dropout: number("resid_pdrop", 0.1)?,
                initializer_range: number("initializer_range", 0.02)?,
            }
        } else {
            let hidden = count("hidden_size")?;
            let heads = count("num_attention_heads")?;
            // As LlamaConfig: num_key_value_heads defaults to num_attention_heads, head_dim to
            // hidden_size / num_attention_heads.
            let kv_heads = optional_count("num_key_value_heads", heads)?;
            let attention_bias = family == Family::Llama && flag("attention_bias", false)?;
            HfConfig {
                architecture: architecture.into(),
                family,
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
                // Qwen2Attention: q, k, v with bias=True, o_proj without.
                qkv_bias: family == Family::Qwen2 || attention_bias,
                o_bias: attention_bias,
                mlp_bias: family == Family::Llama && flag("mlp_bias", false)?,
                attention_dropout: number("attention_dropout", 0.0)?,
                residual_dropout: 0.0,
                initializer_range: number("initializer_range", 0.02)?,
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
        if self.family == Family::Gpt2 && !self.hidden.is_multiple_of(self.heads) {
            return Err(format!("{a}: n_embd {} does not split into {} heads", self.hidden, self.heads));
        }
        if self.family != Family::Gpt2 && (self.head_dim == 0 || !self.head_dim.is_multiple_of(2)) {
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
        if self.family == Family::Gpt2 {
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
