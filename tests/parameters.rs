//! Every Hugging Face model names its parameters as transformers' (and PEFT's)
//! `named_parameters()` does, in the same order (the optimizer's order, so the order its state is allocated in): one visitor,
//! written by `parameters!` from each struct's fields.

use tensormem::device::SimOptions;
use tensormem::nn::*;
use tensormem::{DType, Device};

fn names(m: &dyn Module, under: &str) -> Vec<String> {
    m.named_parameters().into_iter().map(|(n, _)| n).filter(|n| n.starts_with(under)).collect()
}

fn device() -> Device {
    Device::sim(SimOptions::preset("H100-80GB"))
}

fn hf(preset: &str, lora: Option<&LoraConfig>) -> HfModel {
    let mut config = HfConfig::load(preset).unwrap();
    config.layers = 2;
    HfModel::new(&device(), &config, DType::BF16, 64, lora).unwrap()
}

#[test]
fn gpt2_names_as_transformers_does() {
    let m = hf("gpt2", None);
    let all = names(&m, "");
    assert_eq!(&all[..2], ["transformer.wte.weight", "transformer.wpe.weight"]);
    let layer: Vec<String> = ["ln_1", "attn.c_attn", "attn.c_proj", "ln_2", "mlp.c_fc", "mlp.c_proj"]
        .iter()
        .flat_map(|m| ["weight", "bias"].map(|p| format!("transformer.h.1.{m}.{p}")))
        .collect();
    assert_eq!(names(&m, "transformer.h.1."), layer);
    // The head is tied to the embedding: not a parameter of its own.
    assert_eq!(&all[all.len() - 2..], ["transformer.ln_f.weight", "transformer.ln_f.bias"]);
    assert_eq!(all.len(), 2 + 2 * 12 + 2);
}

#[test]
fn llama_names_as_transformers_and_peft_do() {
    let m = hf("llama-3-8b", None);
    let all = names(&m, "");
    let projections = ["self_attn.q_proj", "self_attn.k_proj", "self_attn.v_proj", "self_attn.o_proj", "mlp.gate_proj", "mlp.up_proj", "mlp.down_proj"];
    let mut layer: Vec<String> = projections.iter().map(|p| format!("model.layers.0.{p}.weight")).collect();
    layer.extend(["input_layernorm", "post_attention_layernorm"].map(|n| format!("model.layers.0.{n}.weight")));
    assert_eq!(names(&m, "model.layers.0."), layer);
    assert_eq!((all[0].as_str(), &all[all.len() - 2..]), ("model.embed_tokens.weight", &["model.norm.weight".to_string(), "lm_head.weight".to_string()][..]));
    assert_eq!(m.parameter_count(), 128_256 * 4096 * 2 + 4096 + 2 * (2 * 4096 * 4096 + 2 * 1024 * 4096 + 3 * 4096 * 14_336 + 2 * 4096));

    // PEFT wraps each targeted linear: its weight under `base_layer`, then A and B.
    let lora = LoraConfig { rank: 8, alpha: 16.0, targets: vec!["q_proj", "v_proj"] };
    let m = hf("llama-3-8b", Some(&lora));
    let q = ["base_layer", "lora_A.default", "lora_B.default"].map(|p| format!("model.layers.1.self_attn.q_proj.{p}.weight"));
    assert_eq!(names(&m, "model.layers.1.self_attn.q_proj."), q);
    assert_eq!(names(&m, "model.layers.1.self_attn.k_proj."), ["model.layers.1.self_attn.k_proj.weight"]);
    let shapes: Vec<Vec<usize>> = m.named_parameters().into_iter().filter(|(n, _)| n.contains("v_proj.lora")).map(|(_, p)| p.shape().to_vec()).collect();
    assert_eq!(shapes, [vec![8, 4096], vec![1024, 8], vec![8, 4096], vec![1024, 8]]);
}

#[test]
fn qwen_biases_follow_their_weights() {
    let m = hf("qwen2.5-7b", None);
    let attention: Vec<String> = ["q", "k", "v"].iter().flat_map(|p| ["weight", "bias"].map(|w| format!("model.layers.0.self_attn.{p}_proj.{w}"))).collect();
    assert_eq!(&names(&m, "model.layers.0.self_attn.")[..6], attention);
    assert_eq!(names(&m, "model.layers.0.self_attn.o_proj."), ["model.layers.0.self_attn.o_proj.weight"]);
}

#[test]
fn the_repository_models_and_an_lstm_cell() {
    let dev = device();
    let (_, dim, hidden, _, heads) = LM_SIZES[0];
    let lm = Lm::new(&dev, LmConfig { vocab: 100, dim, hidden, layers: 2, heads, context: 64, dtype: DType::F32 }).unwrap();
    let block: Vec<String> =
        ["attention.wq", "attention.wk", "attention.wv", "attention.wo", "feed_forward.w1", "feed_forward.w2", "feed_forward.w3", "attention_norm", "ffn_norm"]
            .iter()
            .map(|p| format!("layers.1.{p}.weight"))
            .collect();
    assert_eq!(names(&lm, "layers.1."), block);
    let all = names(&lm, "");
    assert_eq!((all.len(), all[0].as_str(), all[all.len() - 1].as_str()), (1 + 2 * 9 + 2, "tok_embeddings.weight", "output.weight"));

    let mut config = TransformerConfig::gpt2_small();
    config.layers = 1;
    assert_eq!(Transformer::new(&dev, config).unwrap().parameter_count(), 124_439_808 - 11 * 7_087_872, "GPT-2 small less 11 of its 12 blocks");

    // The repository's own cell, two linears: PyTorch's nn.LSTMCell names and orders its four
    // tensors weight_ih, weight_hh, bias_ih, bias_hh (a difference left as it is).
    let cell = LstmCell::new(&dev, "lstm", 8, 16, DType::F32).unwrap();
    assert_eq!(names(&cell, ""), ["lstm.ih.weight", "lstm.ih.bias", "lstm.hh.weight", "lstm.hh.bias"]);
    let counts: Vec<usize> = cell.parameters().iter().map(|p| p.numel()).collect();
    assert_eq!(counts, [64 * 8, 64, 64 * 16, 64]);
}
