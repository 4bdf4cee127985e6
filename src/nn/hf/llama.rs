//! The Llama family (`modeling_llama.py`, and Mistral and Qwen2 through it): RMSNorm, the
//! decoder layer, the causal LM and its KV cache.

use super::*;

/// `LlamaRMSNorm`: `weight * (x.float() * rsqrt(x.float().pow(2).mean(-1) + eps)).to(dtype)`.
pub struct HfRmsNorm {
    pub name: String,
    pub weight: Tensor,
    pub eps: f64,
}

impl HfRmsNorm {
    #[track_caller]
    fn new(device: &Device, name: &str, dim: usize, eps: f64, dtype: DType) -> Result<HfRmsNorm> {
        Ok(HfRmsNorm { name: name.to_string(), weight: super::super::parameter(device, &[dim], dtype, Init::Ones)?, eps })
    }

    #[track_caller]
    pub fn forward(&self, x: &Tensor) -> Result<Tensor> {
        let _scope = x.device().module_scope(&self.name);
        let input_dtype = x.dtype();
        let h = x.to(DType::F32)?;
        let variance = h.pow_scalar(2.0)?.mean(&[-1], true)?;
        // `hidden_states = hidden_states * torch.rsqrt(variance + eps)`: what autograd does not
        // keep goes as Python frees it (the sum when rsqrt returns, rsqrt's output once the
        // product exists, the f32 copy as the name is rebound; the cast once weighted; at
        // return hidden_states, then variance). Without grad (a frozen first layer) it shows.
        let shifted = variance.add_scalar(self.eps)?;
        let scale = shifted.rsqrt()?;
        drop(shifted);
        let normalized = h.mul(&scale)?;
        drop((scale, h));
        let cast = normalized.to(input_dtype)?;
        let out = self.weight.mul(&cast)?;
        drop(cast);
        drop((normalized, variance));
        Ok(out)
    }
}

parameters!(HfRmsNorm in name { weight });

/// One `LlamaDecoderLayer`.
pub struct LlamaDecoderLayer {
    pub name: String,
    q_proj: Projection,
    k_proj: Projection,
    v_proj: Projection,
    o_proj: Projection,
    gate_proj: Projection,
    up_proj: Projection,
    down_proj: Projection,
    input_layernorm: HfRmsNorm,
    post_attention_layernorm: HfRmsNorm,
    heads: usize,
    kv_heads: usize,
    head_dim: usize,
    attention_dropout: f64,
}

/// `LlamaForCausalLM` (and Mistral's and Qwen2's, which build the same graph).
pub struct LlamaForCausalLM {
    pub config: HfConfig,
    pub embed_tokens: Embedding,
    /// Shared so that a checkpointed layer can be run again in backward.
    pub layers: Vec<Rc<LlamaDecoderLayer>>,
    pub norm: HfRmsNorm,
    /// `model.rotary_emb.inv_freq`: a float32 buffer of head_dim / 2.
    pub inv_freq: Tensor,
    /// `model.rotary_emb.original_inv_freq`: transformers 5 keeps a clone of it beside it (for
    /// dynamic RoPE to return to); unused by the default RoPE, but on the device.
    pub original_inv_freq: Tensor,
    /// None when tied to `embed_tokens` (`tie_word_embeddings`).
    pub lm_head: Option<Linear>,
    pub attention: AttentionImplementation,
    /// Gradient checkpointing of every decoder layer.
    pub checkpointing: bool,
    /// A data-parallel strategy's hooks around each decoder layer.
    pub hooks: Hooks,
    /// What bitsandbytes keeps on the device for the whole process with a 4-bit base (its
    /// dynamic map).
    pub quant_maps: Vec<Tensor>,
}

impl LlamaForCausalLM {
    /// Parameters in registration order, initialised as `_init_weights` does (normal with
    /// `initializer_range` for linears and the embedding, zero biases, norms at one).
    #[track_caller]
    pub fn new(device: &Device, config: HfConfig, dtype: DType, lora: Option<&LoraConfig>) -> Result<LlamaForCausalLM> {
        LlamaForCausalLM::with_quantization(device, config, dtype, lora, Quantize::None)
    }

    /// As `new`, with `quantize=4bit` every linear of the decoder layers stored as
    /// bitsandbytes' `Linear4bit` (transformers' `replace_with_bnb_linear` replaces every
    /// nn.Linear but those in `modules_to_not_convert`, which holds the output embedding,
    /// `lm_head`): the embedding, the norms and lm_head stay in `dtype`. Each weight is made in
    /// `dtype` and quantised at once, as loading does weight by weight.
    #[track_caller]
    pub fn with_quantization(device: &Device, config: HfConfig, dtype: DType, lora: Option<&LoraConfig>, quantize: Quantize) -> Result<LlamaForCausalLM> {
        let c = &config;
        let init = Init::Normal(c.initializer_range);
        let embed_tokens = Embedding::new(device, "model.embed_tokens", c.vocab, c.hidden, dtype, init)?;
        // bitsandbytes' name2qmap["dynamic"], made on the device by the first quantize_blockwise.
        let quant_maps = if quantize == Quantize::Nf4 { vec![super::super::bnb::dynamic_map(device)?] } else { Vec::new() };
        let (q, kv) = (c.heads * c.head_dim, c.kv_heads * c.head_dim);
        let mut layers = (0..c.layers)
            .map(|i| {
                let name = format!("model.layers.{i}");
                let linear = |path: &str, inputs: usize, outputs: usize, bias: bool| -> Result<Projection> {
                    let mut projection =
                        Projection { base: Linear::with_init(device, &child(&name, path), inputs, outputs, bias, dtype, init)?, lora: None, quant: None };
                    if quantize == Quantize::Nf4 {
                        projection.quantize()?;
                    }
                    Ok(projection)
                };
                let norm = |path: &str| HfRmsNorm::new(device, &child(&name, path), c.hidden, c.norm_eps, dtype);
                Ok(LlamaDecoderLayer {
                    q_proj: linear("self_attn.q_proj", c.hidden, q, c.qkv_bias)?,
                    k_proj: linear("self_attn.k_proj", c.hidden, kv, c.qkv_bias)?,
                    v_proj: linear("self_attn.v_proj", c.hidden, kv, c.qkv_bias)?,
                    o_proj: linear("self_attn.o_proj", q, c.hidden, c.o_bias)?,
                    gate_proj: linear("mlp.gate_proj", c.hidden, c.intermediate, c.mlp_bias)?,
                    up_proj: linear("mlp.up_proj", c.hidden, c.intermediate, c.mlp_bias)?,
                    down_proj: linear("mlp.down_proj", c.intermediate, c.hidden, c.mlp_bias)?,
                    input_layernorm: norm("input_layernorm")?,
                    post_attention_layernorm: norm("post_attention_layernorm")?,
                    heads: c.heads,
                    kv_heads: c.kv_heads,
                    head_dim: c.head_dim,
                    attention_dropout: c.attention_dropout,
                    name,
                })
            })
            .collect::<Result<Vec<_>>>()?;
        let norm = HfRmsNorm::new(device, "model.norm", c.hidden, c.norm_eps, dtype)?;
        // LlamaRotaryEmbedding's buffer: inv_freq [head_dim / 2], made in float32 explicitly (it
        // stays so under from_pretrained(torch_dtype=...), which casts no buffer).
        let inv_freq = {
            let _no_grad = autograd::no_grad();
            let _scope = device.scope("model.rotary_emb");
            let inverse: Vec<f32> = (0..c.head_dim / 2).map(|i| c.rope_theta.powf(-2.0 * i as f64 / c.head_dim as f64) as f32).collect();
            device.from_slice(&inverse, &[c.head_dim / 2])?
        };
        let original_inv_freq = {
            let _no_grad = autograd::no_grad();
            let _scope = device.scope("model.rotary_emb");
            inv_freq.clone()?
        };
        let lm_head = if c.tie_word_embeddings { None } else { Some(Linear::with_init(device, "lm_head", c.hidden, c.vocab, false, dtype, init)?) };
        let mut model = LlamaForCausalLM {
            config,
            embed_tokens,
            layers: Vec::new(),
            norm,
            inv_freq,
            original_inv_freq,
            lm_head,
            attention: AttentionImplementation::Eager,
            checkpointing: false,
            hooks: None,
            quant_maps,
        };
        if let Some(lora) = lora {
            // get_peft_model: every base parameter frozen, then the adapters injected layer by
            // layer, target by target.
            let base: Vec<Tensor> = model.parameters().into_iter().chain(layers.iter().flat_map(|l| l.parameters())).collect();
            for p in &base {
                p.requires_grad_(false)?;
            }
            for layer in &mut layers {
                for target in &lora.targets {
                    layer.projection_mut(target).add_lora(device, lora.rank, lora.alpha)?;
                }
            }
            // PeftModel's constructor then casts 16-bit adapters to float32, module by module.
            let _scope = device.scope("cast_adapter_dtype");
            for layer in &mut layers {
                for target in &lora.targets {
                    layer.projection_mut(target).cast_adapter_to_float32()?;
                }
            }
        }
        model.layers = layers.into_iter().map(Rc::new).collect();
        Ok(model)
    }

    /// ids [batch, T] (int64) -> logits [batch, T, vocab], in training mode.
    #[track_caller]
    pub fn forward(&self, ids: &Tensor) -> Result<Tensor> {
        let device = ids.device().clone();
        let [b, t] = *ids.shape() else {
            return Err(TensorError::Shape(format!("token ids must be [batch, T], got {:?}", ids.shape())));
        };
        let x = self.embed_tokens.forward(ids)?;
        if self.checkpointing && !self.embed_tokens.weight.requires_grad() {
            // PEFT with gradient checkpointing calls `enable_input_require_grads()`: a hook makes
            // the frozen embedding's output require grad, so that the reentrant checkpoint of
            // the first layer has an input to backpropagate to.
            x.requires_grad_(true)?;
        }
        let dtype = x.dtype();
        // The eager mask [batch, 1, T, T], then cos and sin. SDPA: no mask (without padding the
        // mask is skipped and attention runs with is_causal).
        let mask = if self.attention == AttentionImplementation::Sdpa { None } else { Some(eager_mask(&device, None, t, b, dtype)?) };
        let (cos, sin) = self.rotary_embedding(&device, None, t, dtype)?;
        let rope = Rc::new((cos, sin, mask));
        // `inputs_embeds` keeps the embedding until LlamaModel returns; `hidden_states`, rebound
        // to each layer's output, frees the one before (the embedding is not its to free).
        let inputs_embeds = x;
        let mut x = inputs_embeds.share();
        for (i, layer) in self.layers.iter().enumerate() {
            x = run_block(&self.hooks, i, &x, |x| {
                if self.checkpointing && autograd::is_grad_enabled() {
                    let (layer, rope) = (Rc::clone(layer), Rc::clone(&rope));
                    checkpoint(move |h| layer.forward(&h[0], &rope.0, &rope.1, rope.2.as_ref()), &[x])
                } else {
                    layer.forward(x, &rope.0, &rope.1, rope.2.as_ref())
                }
            })?;
        }
        let normed = self.norm.forward(&x)?;
        drop(x);
        // LlamaModel returns: its locals go (the embedding, then the mask, cos and sin) before
        // the head makes the logits.
        drop(inputs_embeds);
        drop(rope);
        self.head(&normed)
    }

    /// LlamaRotaryEmbedding: cos and sin [1, q, head_dim] for the positions `cache_position`
    /// (None: arange(t), made here), in float32 with autocast off, then cast to `dtype`.
    #[track_caller]
    fn rotary_embedding(&self, device: &Device, cache_position: Option<&Tensor>, t: usize, dtype: DType) -> Result<(Tensor, Tensor)> {
        let _scope = device.scope("model.rotary_emb");
        let _autocast_off = crate::amp::autocast_disabled();
        let half = self.config.head_dim / 2;
        // cache_position = arange(T) in a forward without a cache; position_ids its unsqueeze(0).
        let made;
        let cache_position = match cache_position {
            Some(p) => p,
            None => {
                made = device.arange(t, DType::I64)?;
                &made
            }
        };
        let inv_freq = self.inv_freq.view(&[1, half as isize, 1])?;
        let positions = cache_position.unsqueeze(0)?.unsqueeze(1)?.to(DType::F32)?;
        let freqs = inv_freq.matmul(&positions)?.transpose(1, 2)?;
        let emb = Tensor::cat(&[&freqs, &freqs], -1)?;
        // `emb.cos() * self.attention_scaling` (1.0 without rope scaling): a new tensor.
        let cos = emb.cos()?.mul_scalar(1.0)?.to(dtype)?;
        let sin = emb.sin()?.mul_scalar(1.0)?.to(dtype)?;
        Ok((cos, sin))
    }

    /// `lm_head`, or the embedding's weight where the two are tied.
    #[track_caller]
    fn head(&self, x: &Tensor) -> Result<Tensor> {
        match &self.lm_head {
            Some(head) => head.forward(x),
            None => {
                let _scope = x.device().module_scope("lm_head");
                x.linear(&self.embed_tokens.weight, None)
            }
        }
    }
}

/// The key/value cache `generate` keeps: transformers' `DynamicCache` (each layer's keys and
/// values grow by `torch.cat([past, new], dim=-2)`: a new tensor of the grown size, the old one
/// freed) or `StaticCache` (each layer's [batch, kv_heads, max_len, head_dim] keys and values
/// made with `torch.zeros` at the layer's first update, then written in place with
/// `index_copy_`).
pub struct KvCache {
    /// `Some(max_len)`: a static cache of that many positions.
    pub static_len: Option<usize>,
    /// Per layer: (keys, values), once the layer has seen a token.
    pub layers: Vec<Option<(Tensor, Tensor)>>,
    /// The positions seen so far (`get_seq_length()`).
    pub seen: usize,
}

impl KvCache {
    pub fn new(layers: usize, static_len: Option<usize>) -> KvCache {
        KvCache { static_len, layers: (0..layers).map(|_| None).collect(), seen: 0 }
    }

    /// The bytes the cache holds now.
    pub fn bytes(&self) -> u64 {
        self.layers.iter().flatten().map(|(k, v)| (k.numel() * k.dtype().size() + v.numel() * v.dtype().size()) as u64).sum()
    }

    /// `DynamicLayer.update` / `StaticLayer.update`: the layer's keys and values after adding
    /// `k`, `v` [batch, kv_heads, q, head_dim] at position `past`.
    #[track_caller]
    fn update(&mut self, layer: usize, k: &Tensor, v: &Tensor, past: usize) -> Result<(Tensor, Tensor)> {
        let slot = &mut self.layers[layer];
        let device = k.device().clone();
        match self.static_len {
            None => {
                // Named as transformers' frame is: the doctor knows a cache from a leak by it.
                let _scope = device.scope(crate::pytorch::KV_CACHE_SCOPES[0]);
                // `self.keys = torch.cat([self.keys, key_states], dim=-2)`: the first update cats
                // onto an empty tensor (a copy of k), every later one makes the grown tensor and
                // frees the old keys before the values are grown.
                let (keys, values) = match slot.take() {
                    None => {
                        let keys = Tensor::cat(&[k], -2)?;
                        (keys, Tensor::cat(&[v], -2)?)
                    }
                    Some((old_k, old_v)) => {
                        let keys = Tensor::cat(&[&old_k, k], -2)?;
                        drop(old_k);
                        let values = Tensor::cat(&[&old_v, v], -2)?;
                        (keys, values)
                    }
                };
                *slot = Some((keys.share(), values.share()));
                Ok((keys, values))
            }
            Some(max_len) => {
                let &[b, kv, q, d] = k.shape() else { unreachable!("4-D heads") };
                if past + q > max_len {
                    return Err(TensorError::Shape(format!("static cache of {max_len} positions is full: position {} does not fit", past + q)));
                }
                if slot.is_none() {
                    // StaticLayer.lazy_initialization: torch.zeros for the keys, then the values.
                    let _scope = device.scope(crate::pytorch::KV_CACHE_SCOPES[1]);
                    let keys = k.device().zeros(&[b, kv, max_len, d], k.dtype())?;
                    let values = k.device().zeros(&[b, kv, max_len, d], v.dtype())?;
                    *slot = Some((keys, values));
                }
                let (keys, values) = slot.as_ref().expect("made above");
                // index_copy_(2, cache_position, key_states): in place, nothing allocated.
                keys.narrow(2, past, q)?.copy_(k)?;
                values.narrow(2, past, q)?.copy_(v)?;
                Ok((keys.share(), values.share()))
            }
        }
    }
}

impl LlamaForCausalLM {
    /// A forward of `generate` under inference_mode: ids [batch, q] (the prompt, then one token)
    /// with the cache holding the positions before them; returns the logits of the last position
    /// only, [batch, 1, vocab] (`logits_to_keep=1`, which generate passes since transformers
    /// 4.45, prefill included): the final norm runs over every position, the head over the last.
    #[track_caller]
    pub fn forward_cached(&self, ids: &Tensor, cache: &mut KvCache) -> Result<Tensor> {
        let device = ids.device().clone();
        let [b, q] = *ids.shape() else {
            return Err(TensorError::Shape(format!("token ids must be [batch, T], got {:?}", ids.shape())));
        };
        let past = cache.seen;
        let kv_len = cache.static_len.unwrap_or(past + q);
        let inputs_embeds = self.embed_tokens.forward(ids)?;
        let dtype = inputs_embeds.dtype();
        // cache_position = arange(past, past + q); position_ids its unsqueeze(0).
        let positions: Vec<i64> = (past..past + q).map(|p| p as i64).collect();
        let cache_position = device.from_slice(&positions, &[q])?;
        let mask = eager_mask(&device, Some(&cache_position), kv_len, b, dtype)?;
        let (cos, sin) = self.rotary_embedding(&device, Some(&cache_position), q, dtype)?;
        // As in `forward`: the embedding kept until LlamaModel returns, each layer's input
        // freed as the next output rebinds the name.
        let mut x = inputs_embeds.share();
        for (i, layer) in self.layers.iter().enumerate() {
            x = layer.forward_with_cache(&x, &cos, &sin, Some(&mask), Some((&mut *cache, i, past)))?;
        }
        cache.seen = past + q;
        let normed = self.norm.forward(&x)?;
        drop(x);
        drop((inputs_embeds, mask, cos, sin));
        // hidden_states[:, slice(-1, None), :]: a view of the last position.
        let last = normed.narrow(1, q - 1, 1)?;
        self.head(&last)
    }
}

/// The most negative finite value of a type (`torch.finfo(dtype).min`).
/// The eager causal mask (`create_causal_mask`, made before the rotary embedding): keys at
/// positions 0..kv_len, queries at `cache_position` (None: the keys themselves, a forward over
/// kv_len positions); 0 where a key is seen (its position at most the query's, so a static
/// cache's unwritten positions are not) and the type's minimum where it is not: [q, kv_len] in
/// the model's type, made once per forward and expanded (a view) to [batch, 1, q, kv_len].
#[track_caller]
fn eager_mask(device: &Device, cache_position: Option<&Tensor>, kv_len: usize, batch: usize, dtype: DType) -> Result<Tensor> {
    let _scope = device.scope("model.causal_mask");
    let keys = device.arange(kv_len, DType::I64)?;
    let queries = cache_position.unwrap_or(&keys);
    let q = queries.numel();
    let seen = queries.view(&[q as isize, 1])?.ge(&keys.view(&[1, kv_len as isize])?)?;
    let zero = device.full(&[], 0.0, dtype)?;
    let min = device.full(&[], dtype_min(dtype), dtype)?;
    seen.where_(&zero, &min)?.view(&[1, 1, q as isize, kv_len as isize])?.expand(&[batch, 1, q, kv_len])
}

fn dtype_min(dtype: DType) -> f64 {
    match dtype {
        DType::F16 => -65504.0,
        DType::BF16 => -3.3895313892515355e38,
        _ => f32::MIN as f64,
    }
}

impl LlamaDecoderLayer {
    fn projection_mut(&mut self, name: &str) -> &mut Projection {
        match name {
            "q_proj" => &mut self.q_proj,
            "k_proj" => &mut self.k_proj,
            "v_proj" => &mut self.v_proj,
            "o_proj" => &mut self.o_proj,
            "gate_proj" => &mut self.gate_proj,
            "up_proj" => &mut self.up_proj,
            _ => &mut self.down_proj,
        }
    }

    #[track_caller]
    pub fn forward(&self, x: &Tensor, cos: &Tensor, sin: &Tensor, mask: Option<&Tensor>) -> Result<Tensor> {
        self.forward_with_cache(x, cos, sin, mask, None)
    }

    /// The layer, its attention reading the keys and values `cache` (the cache, this layer's
    /// index, the positions before x) returns after adding x's (generate, in eval mode).
    #[track_caller]
    fn forward_with_cache(&self, x: &Tensor, cos: &Tensor, sin: &Tensor, mask: Option<&Tensor>, cache: Option<(&mut KvCache, usize, usize)>) -> Result<Tensor> {
        let _scope = x.device().module_scope(&self.name);
        // Python's lifetimes: `hidden_states` rebound frees what it held (the normed input
        // when attention returns, attention's output once the residual sum exists, the MLP's
        // after the second); `_` keeps attention's weights, and `residual` the first sum, until
        // the layer returns (residual first: locals go in the order they were bound).
        let (attended, weights) = self.attention(&self.input_layernorm.forward(x)?, cos, sin, mask, cache)?;
        let residual = x.add(&attended)?;
        drop(attended);
        let h = self.mlp(&self.post_attention_layernorm.forward(&residual)?)?;
        let out = residual.add(&h)?;
        drop(h);
        drop((residual, weights));
        Ok(out)
    }

    /// `LlamaMLP`: `down_proj(act_fn(gate_proj(x)) * up_proj(x))` with SiLU: the product's
    /// operands freed when it exists (the left first), the product when down_proj returns.
    #[track_caller]
    fn mlp(&self, x: &Tensor) -> Result<Tensor> {
        let _scope = x.device().module_scope(&child(&self.name, "mlp"));
        let gate = self.gate_proj.forward(x)?.silu()?;
        let up = self.up_proj.forward(x)?;
        let product = gate.mul(&up)?;
        drop((gate, up));
        self.down_proj.forward(&product)
    }

    /// `LlamaAttention` with `eager_attention_forward` (or SDPA without a mask): the output
    /// and, eager, the attention weights it returns beside it (the layer keeps them until it
    /// returns). Tensors go when Python frees them: the projections when the rotated ones
    /// rebind their names (q first), a rebound weight at once, eager_attention_forward's
    /// repeated keys and values when it returns, q, k and v when this returns.
    #[track_caller]
    fn attention(
        &self,
        x: &Tensor,
        cos: &Tensor,
        sin: &Tensor,
        mask: Option<&Tensor>,
        cache: Option<(&mut KvCache, usize, usize)>,
    ) -> Result<(Tensor, Option<Tensor>)> {
        let _scope = x.device().module_scope(&child(&self.name, "self_attn"));
        let [b, t, _] = *x.shape() else {
            return Err(TensorError::Shape(format!("{}: input must be [batch, T, features], got {:?}", self.name, x.shape())));
        };
        let (bi, ti, d) = (b as isize, t as isize, self.head_dim as isize);
        // view(batch, T, -1, head_dim).transpose(1, 2): views.
        let heads = |p: Tensor| p.view(&[bi, ti, -1, d])?.transpose(1, 2);
        let q = heads(self.q_proj.forward(x)?)?;
        let k = heads(self.k_proj.forward(x)?)?;
        let v = heads(self.v_proj.forward(x)?)?;
        // apply_rotary_pos_emb: cos, sin unsqueezed to [1, 1, T, head_dim].
        let (cos, sin) = (cos.unsqueeze(1)?, sin.unsqueeze(1)?);
        let (q_embed, k_embed) = (rotate_half_embed(&q, &cos, &sin)?, rotate_half_embed(&k, &cos, &sin)?);
        drop((q, k));
        let (q, k) = (q_embed, k_embed);
        // generate: past_key_values.update(k, v, layer_idx), rebinding k and v; dropout off
        // (eval mode).
        let training = cache.is_none();
        let (k, v) = match cache {
            Some((cache, index, past)) => {
                let (keys, values) = cache.update(index, &k, &v, past)?;
                drop((k, v));
                (keys, values)
            }
            None => (k, v),
        };
        let (y, weights) = match mask {
            // sdpa_attention_forward: k and v as they are (enable_gqa), then
            // `attn_output.transpose(1, 2).contiguous()`.
            None => (q.scaled_dot_product_attention(&k, &v)?.transpose(1, 2)?.contiguous()?, None),
            Some(mask) => {
                let n_rep = self.heads / self.kv_heads;
                let (k_rep, v_rep) = (repeat_kv(&k, n_rep)?, repeat_kv(&v, n_rep)?);
                let scores = q.matmul(&k_rep.transpose(2, 3)?)?.mul_scalar(1.0 / (self.head_dim as f64).sqrt())?;
                let masked = scores.add(mask)?;
                drop(scores);
                let probs = masked.softmax_to_dtype(-1, DType::F32)?.to(q.dtype())?;
                drop(masked);
                let dropped = probs.dropout(self.attention_dropout, training)?;
                drop(probs);
                let product = dropped.matmul(&v_rep)?;
                let y = product.transpose(1, 2)?.contiguous()?;
                drop(product);
                drop((k_rep, v_rep));
                (y, Some(dropped))
            }
        };
        let out = self.o_proj.forward(&y.reshape(&[bi, ti, -1])?)?;
        drop(y);
        drop((q, k, v));
        Ok((out, weights))
    }
}

/// transformers' `(q * cos) + (rotate_half(q) * sin)` (`apply_rotary_pos_emb`), where
/// rotate_half(x) = cat(-x2, x1) over the halves, in Python's order: left to right, each
/// temporary freed as soon as the op it was passed to returns (-x2 when rotate_half returns,
/// the rotated copy after its product, the two products after their sum, the left one first).
/// The same sum as `attention::rotate`, which follows the twins' own Python (the rotated copy
/// bound first and kept to the end): the two programs free in different orders.
#[track_caller]
fn rotate_half_embed(x: &Tensor, cos: &Tensor, sin: &Tensor) -> Result<Tensor> {
    let d = *x.shape().last().expect("4-D");
    let x_cos = x.mul(cos)?;
    let rotated = {
        let (x1, x2) = (x.narrow(-1, 0, d / 2)?, x.narrow(-1, d / 2, d / 2)?);
        Tensor::cat(&[&x2.neg()?, &x1], -1)?
    };
    let rotated_sin = rotated.mul(sin)?;
    drop(rotated);
    let out = x_cos.add(&rotated_sin)?;
    drop((x_cos, rotated_sin));
    Ok(out)
}

/// `repeat_kv`: each key/value head repeated for the `n_rep` query heads sharing it, as
/// `x[:, :, None].expand(b, kv, n_rep, T, d).reshape(b, kv * n_rep, T, d)` (a copy when
/// `n_rep > 1`, the tensor itself otherwise).
#[track_caller]
fn repeat_kv(x: &Tensor, n_rep: usize) -> Result<Tensor> {
    if n_rep == 1 {
        return Ok(x.share());
    }
    let &[b, kv, t, d] = x.shape() else { unreachable!("4-D heads") };
    x.unsqueeze(2)?.expand(&[b, kv, n_rep, t, d])?.reshape(&[b as isize, (kv * n_rep) as isize, t as isize, d as isize])
}

parameters!(LlamaDecoderLayer { q_proj, k_proj, v_proj, o_proj, gate_proj, up_proj, down_proj, input_layernorm, post_attention_layernorm });

parameters!(LlamaForCausalLM { embed_tokens, layers, norm, lm_head });
