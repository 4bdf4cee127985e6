//! `hf-generate`: `model.generate` of a Hugging Face model under inference_mode, greedy, with a
//! key/value cache: the prefill of `prompt` tokens, then a forward per new token, with
//! transformers' DynamicCache (grown by a `cat` per layer per token) or a static cache
//! (preallocated, written in place).

use super::{Parameter, Program, Recorder, Scenario, ScenarioInfo, Values};
use crate::autograd;
use crate::nn::{HfConfig, HfModel, KvCache, Module};
use crate::tensor::{DType, Result, Tensor, TensorError};
use crate::trace::Category;

const CACHES: &[&str] = &["dynamic", "static"];
const DTYPES: &[&str] = &["bfloat16", "float16", "float32"];
const ATTENTION: &[&str] = &["eager"];

fn parameters() -> Vec<Parameter> {
    vec![
        Parameter::text(
            "config",
            "llama-3-8b",
            4096,
            "a Hugging Face config.json: its path, its JSON text, or a preset (llama-3-8b, llama-3-70b, mistral-7b, qwen2.5-7b); \
             LlamaForCausalLM, MistralForCausalLM and Qwen2ForCausalLM generate",
        ),
        Parameter::integer("batch", "1", 1, 4096, "sequences generated at once"),
        Parameter::integer("prompt", "512", 1, 1 << 20, "tokens of the prompt (the prefill)"),
        Parameter::integer(
            "new_tokens",
            "256",
            1,
            32_768,
            "tokens generated (max_new_tokens): the prefill's forward, then one forward per further token (at most 32,768, and layers x new_tokens at most 524,288: a few minutes of simulation; the cache's growth is plain long before)",
        ),
        Parameter::choice("dtype", "bfloat16", DTYPES, "the parameters' type (torch_dtype)"),
        Parameter::choice(
            "cache",
            "dynamic",
            CACHES,
            "dynamic: transformers' DynamicCache, each layer's keys and values grown by torch.cat per token (a new tensor, the old freed); \
             static: [batch, kv_heads, prompt + new_tokens, head_dim] per layer made at the layer's first update and written in place (index_copy_)",
        ),
        Parameter::choice(
            "attn",
            "eager",
            ATTENTION,
            "attention as transformers' attn_implementation: eager (the scores and their float32 softmax are real tensors)",
        ),
    ]
}

fn dtype(v: &Values) -> DType {
    match v.choice("dtype") {
        "float16" => DType::F16,
        "float32" => DType::F32,
        _ => DType::BF16,
    }
}

fn check(v: &Values) -> std::result::Result<super::Work, String> {
    let config = HfConfig::load(v.text("config"))?;
    if !config.arch.generation {
        return Err("hf-generate builds the Llama family (LlamaForCausalLM, MistralForCausalLM, Qwen2ForCausalLM) so far, not GPT2LMHeadModel".into());
    }
    let (batch, prompt, new) = (v.u64("batch"), v.u64("prompt"), v.u64("new_tokens"));
    // The largest tensor: the prefill's scores [batch, heads, prompt, prompt + new_tokens] (a
    // static cache's keys span every position).
    let scores = batch.checked_mul(config.heads as u64).and_then(|n| n.checked_mul(prompt)).and_then(|n| n.checked_mul(prompt + new));
    if scores.is_none_or(|n| n > u32::MAX as u64) {
        return Err(format!(
            "batch {batch} x {} heads x prompt {prompt} x (prompt + new_tokens) {} makes attention scores larger than tensormem can index",
            config.heads,
            prompt + new
        ));
    }
    Ok(work(&config, v))
}

pub(super) fn scenario() -> Scenario {
    Scenario {
        info: ScenarioInfo {
            name: "hf-generate",
            title: "Generate with a Hugging Face model: the KV cache, dynamic or static",
            explanation: "model.generate (greedy) of a model built from its Hugging Face config.json, under inference_mode: \
                          the prefill runs the prompt through every layer and keeps its keys and values, then one forward per \
                          new token (logits of the last position only, copied to float32; exactly new_tokens tokens, as \
                          generate(min_new_tokens=new_tokens) makes them, so the end-of-sequence id is masked in a float32 \
                          copy of the scores before the token is picked). With \
                          cache=dynamic (transformers' DynamicCache) every layer's keys and values grow by torch.cat at every \
                          token: a new tensor one position longer, the old one freed into the cache of free blocks, where \
                          the next, larger request cannot reuse it: reserved memory climbs above allocated (fragmentation). \
                          cache=static makes [batch, kv_heads, prompt + new_tokens, head_dim] keys and values per layer at \
                          once and writes each token in place: the same bytes from the start, no reallocation. Read the steps: \
                          `prefill`, then `decode k` (the forward that makes token k + 1).",
            parameters: parameters(),
            variants: vec![],
        },
        check,
        fix_settings: None,
        program: Program::Sync(generate),
    }
}

fn generate(rec: &mut Recorder, v: &Values) -> Result<()> {
    let config = HfConfig::load(v.text("config")).map_err(TensorError::Shape)?;
    let (batch, prompt, new_tokens) = (v.int("batch"), v.int("prompt"), v.int("new_tokens"));
    let model = HfModel::new(&rec.device, &config, dtype(v), prompt + new_tokens, None)?;
    rec.model_parameters = Some(model.parameter_count());
    let HfModel::Llama(model) = model else {
        return Err(TensorError::Unsupported("hf-generate builds the Llama family so far".into()));
    };
    let dev = rec.device.clone();
    let _inference = autograd::inference_mode();
    let ids = {
        let _inputs = dev.category(Category::Input);
        let ids: Vec<i64> = (0..batch * prompt).map(|i| (i * 7919 % config.vocab) as i64).collect();
        dev.from_slice(&ids, &[batch, prompt])?
    };
    rec.step("model and prompt");
    let static_len = (v.choice("cache") == "static").then_some(prompt + new_tokens);
    let mut cache = KvCache::new(config.layers, static_len);
    // generate(ids, attention_mask=ones_like(ids), pad_token_id=0, min_new_tokens=new_tokens):
    // every position attends, and exactly new_tokens tokens are made (else an end-of-sequence
    // token may stop it early), for which transformers adds MinNewTokensLengthLogitsProcessor
    // where the config has an end-of-sequence id.
    let mut attention_mask = dev.ones(&[batch, prompt], DType::I64)?;
    // `_prepare_special_tokens`: the beginning- and end-of-sequence ids and the padding id on
    // the device, int64.
    let _bos = config.bos_token_id.map(|id| dev.from_slice(&[id], &[])).transpose()?;
    let eos = if config.eos_token_ids.is_empty() { None } else { Some(dev.from_slice(&config.eos_token_ids, &[config.eos_token_ids.len()])?) };
    let _pad = dev.from_slice(&[0i64], &[])?;
    // _sample's unfinished_sequences = ones(batch).
    let _unfinished_sequences = dev.ones(&[batch], DType::I64)?;
    let mut input_ids = ids.share();
    let mut next = ids;
    // next_token_logits and next_token_scores live until the next step rebinds them, through
    // its forward.
    let (mut next_logits, mut next_scores): (Option<Tensor>, Option<Tensor>) = (None, None);
    for k in 0..new_tokens {
        // outputs = self(**model_inputs): the logits of the last position.
        let logits = model.forward_cached(&next, &mut cache)?;
        // _update_model_kwargs_for_generation: attention_mask grows by a column of ones.
        attention_mask = Tensor::cat(&[&attention_mask, &dev.ones(&[batch, 1], DType::I64)?], -1)?;
        // next_token_logits = outputs.logits[:, -1, :].to(copy=True, dtype=torch.float32)
        let last = logits.select(1, 0)?;
        let copied = if last.dtype() == DType::F32 { last.clone()? } else { last.to(DType::F32)? };
        drop(last);
        // Rebinding next_token_logits frees the previous step's once the new one exists (as
        // assigning an Option drops the old value after the new one is made).
        next_logits = Some(copied);
        let current = next_logits.as_ref().expect("just set");
        // next_token_scores = logits_processor(input_ids, next_token_logits): the logits
        // themselves without processors.
        let scores = match &eos {
            Some(eos) => min_new_tokens_scores(current, eos)?,
            None => current.share(),
        };
        next_scores = Some(scores);
        let tokens = next_scores.as_ref().expect("just set").argmax(-1, false)?;
        // input_ids = torch.cat([input_ids, next_tokens[:, None]], dim=-1)
        let column = tokens.unsqueeze(1)?;
        input_ids = Tensor::cat(&[&input_ids, &column], -1)?;
        next = column;
        // The step is marked where the stopping criteria run: the outputs and the float32
        // logits are still referenced (`del outputs` ends the iteration).
        rec.step(if k == 0 { "prefill".to_string() } else { format!("decode {k}") });
        drop(logits);
    }
    drop((next_logits, next_scores));
    drop((next, input_ids, attention_mask, eos));
    drop(cache);
    Ok(())
}

/// MinNewTokensLengthLogitsProcessor while fewer than min_new_tokens tokens are new (every
/// step here): `scores.clone()`, `arange(vocab)`, `isin(vocab, eos)`, then
/// `torch.where(eos_mask, -inf, scores)` rebinding the clone; the range and the mask go when it
/// returns. (isin's own temporaries are not modelled: they come and go below the step's peak.)
fn min_new_tokens_scores(scores: &Tensor, eos: &Tensor) -> Result<Tensor> {
    let dev = scores.device();
    let vocab = *scores.shape().last().expect("[batch, vocab]");
    let cloned = scores.clone()?;
    let ids = dev.arange(vocab, DType::I64)?;
    // isin(ids, eos): one bool mask (the ids are distinct, so each further id's matches join by
    // inequality: an exclusive or of disjoint sets).
    let mut eos_mask = ids.eq(&eos.narrow(0, 0, 1)?)?;
    for i in 1..eos.numel() {
        eos_mask = eos_mask.ne(&ids.eq(&eos.narrow(0, i, 1)?)?)?;
    }
    let processed = scores.masked_fill(&eos_mask, f64::NEG_INFINITY)?;
    drop(cloned);
    drop((ids, eos_mask));
    Ok(processed)
}

/// The prefill, then a forward per further token, through every layer.
fn work(config: &HfConfig, v: &Values) -> super::Work {
    super::Work::product(&[("layers", config.layers as u64), ("tokens generated", v.u64("new_tokens"))])
}
