//! `hf-generate`: generation with a key/value cache (sim device), transformers' DynamicCache
//! (a `cat` per layer per token) against a static cache (preallocated, written in place). The
//! bytes the shapes make exact are pinned; the fragmentation the dynamic cache causes is
//! measured.

mod common;

use tensormem::doctor::{self, DoctorOptions};
use tensormem::scenarios::{self, RunRequest, RunResult};

fn run(set: &[(&str, &str)]) -> RunResult {
    common::run_scenario("hf-generate", set)
}

fn run_error(set: &[(&str, &str)]) -> String {
    common::scenario_error("hf-generate", set)
}

/// What the live tensors asked for at a step (allocated counts whole blocks: a large block is
/// not split when less than 1 MiB would remain, so it may hold more than its tensor).
fn requested(r: &RunResult, label: &str) -> u64 {
    r.steps.iter().find(|s| s.label == label).unwrap_or_else(|| panic!("no step {label:?}")).requested_bytes
}

/// The step whose peak is the run's.
fn peak_step(r: &RunResult) -> &str {
    &r.steps.iter().max_by_key(|s| s.max_allocated_bytes).unwrap().label
}

/// Llama-3-8B: 32 layers, 8 key/value heads of 128; bfloat16.
const LAYERS: u64 = 32;
const KV_HEADS: u64 = 8;
const HEAD_DIM: u64 = 128;
const BF16: u64 = 2;
/// cuBLAS's workspace, made by the prefill's first matmul (32 MiB on an H100).
const WORKSPACE: u64 = 32 << 20;

/// Keys and values of every layer for `positions` positions of `batch` sequences.
fn cache_bytes(batch: u64, positions: u64) -> u64 {
    2 * LAYERS * batch * KV_HEADS * positions * HEAD_DIM * BF16
}

/// int64 token ids [batch, n].
fn ids_bytes(batch: u64, n: u64) -> u64 {
    batch * n * 8
}

/// What generate holds besides the model and the cache when a step is marked (after the forward
/// that made token k + 1): input_ids and attention_mask [batch, prompt + k + 1] int64, the new
/// token and unfinished_sequences ([batch] int64 each), the logits of the last position
/// [batch, 1, 128,256] in bfloat16 beside their float32 copy and the scores
/// MinNewTokensLengthLogitsProcessor made of it (float32; `min_new_tokens` makes exactly
/// new_tokens tokens), and the special tokens on the device (the beginning- and end-of-sequence
/// ids and the padding id: one int64 each).
fn generate_bytes(batch: u64, prompt: u64, k: u64) -> u64 {
    2 * ids_bytes(batch, prompt + k + 1) + 2 * 8 * batch + batch * 128_256 * (2 + 4 + 4) + 3 * 8
}

const BIG: [(&str, &str); 3] = [("batch", "8"), ("prompt", "512"), ("new_tokens", "256")];

fn with<'a>(base: &[(&'a str, &'a str)], cache: &'a str) -> Vec<(&'a str, &'a str)> {
    let mut set = base.to_vec();
    set.push(("cache", cache));
    set
}

#[test]
fn the_static_cache_is_made_once_at_its_full_size_and_never_reallocated() {
    let r = run(&with(&BIG, "static"));
    assert_eq!(r.out_of_memory, None);
    assert_eq!(r.steps.len(), 1 + 256, "model and prompt, prefill, decode 1..255");
    // 2 x 32 layers x batch 8 x 8 kv heads x (512 + 256) positions x 128 x 2 bytes = 768 MiB.
    let full = cache_bytes(8, 512 + 256);
    assert_eq!(full, 805_306_368);
    // After the prefill: the cache and generate's tensors; each decode step writes in place:
    // only input_ids and attention_mask grow.
    let base = requested(&r, "model and prompt") - ids_bytes(8, 512) + WORKSPACE;
    for k in [0u64, 1, 100, 255] {
        let label = if k == 0 { "prefill".to_string() } else { format!("decode {k}") };
        assert_eq!(requested(&r, &label), base + full + generate_bytes(8, 512, k), "{label}");
    }
    assert_eq!(peak_step(&r), "prefill");
}

#[test]
fn the_dynamic_cache_grows_a_mebibyte_per_token_and_ends_one_position_short_of_the_static_one() {
    let r = run(&with(&BIG, "dynamic"));
    let s = run(&with(&BIG, "static"));
    assert_eq!(r.out_of_memory, None);
    // One position of every layer's keys and values at batch 8: 2 x 32 x 8 x 8 x 128 x 2 = 1 MiB.
    assert_eq!(cache_bytes(8, 1), 1 << 20);
    let base = requested(&r, "model and prompt") - ids_bytes(8, 512) + WORKSPACE;
    assert_eq!(requested(&s, "model and prompt"), requested(&r, "model and prompt"));
    for k in [0u64, 1, 100, 255] {
        let label = if k == 0 { "prefill".to_string() } else { format!("decode {k}") };
        // After the forward of decode k the cache holds prompt + k positions.
        assert_eq!(requested(&r, &label), base + cache_bytes(8, 512 + k) + generate_bytes(8, 512, k), "{label}");
    }
    // generate never feeds the last token back: the dynamic cache ends at prompt + new - 1
    // positions; the static one was made for max_length = prompt + new. Otherwise the same bytes.
    assert_eq!(requested(&s, "decode 255") - requested(&r, "decode 255"), cache_bytes(8, 1));
    // Here the prefill is the peak for both: eager attention's scores and their float32 softmax
    // over the prompt ([8, 32, 512, 512], and over all 768 static positions).
    assert_eq!(peak_step(&r), "prefill");
    // Measured: the static cache's prefill attends over every position, so it peaks and
    // reserves higher at this shape.
    assert!(s.peak_allocated_bytes > r.peak_allocated_bytes);
    assert!(s.peak_reserved_bytes > r.peak_reserved_bytes, "static {} dynamic {}", s.peak_reserved_bytes, r.peak_reserved_bytes);
    println!(
        "llama-3-8b bf16 batch 8 prompt 512 new 256: dynamic peak {} reserved {}; static peak {} reserved {}",
        r.peak_allocated_bytes, r.peak_reserved_bytes, s.peak_allocated_bytes, s.peak_reserved_bytes
    );
}

/// A short prompt and a long generation: the cats dominate. Each freed cache tensor is one
/// position too small for the next request; reserved climbs above the static cache's.
const LONG: [(&str, &str); 3] = [("batch", "8"), ("prompt", "16"), ("new_tokens", "1024")];

#[test]
fn a_long_generation_fragments_the_dynamic_cache_and_not_the_static_one() {
    let r = run(&with(&LONG, "dynamic"));
    let s = run(&with(&LONG, "static"));
    // The same live bytes at the end (one position apart), the peak at the last decode step for
    // the dynamic cache, at the prefill for the static one.
    assert_eq!(requested(&s, "decode 1023") - requested(&r, "decode 1023"), cache_bytes(8, 1));
    assert_eq!(peak_step(&r), "decode 1023");
    assert_eq!(peak_step(&s), "prefill");
    // Measured: dynamic reserves 18,891,145,216 bytes, static 17,609,785,344 (1.19 GiB less).
    let extra = r.peak_reserved_bytes - s.peak_reserved_bytes;
    assert!(extra > 1 << 30, "dynamic reserves {} more", extra);
    println!(
        "llama-3-8b bf16 batch 8 prompt 16 new 1024: dynamic peak {} reserved {}; static peak {} reserved {}",
        r.peak_allocated_bytes, r.peak_reserved_bytes, s.peak_allocated_bytes, s.peak_reserved_bytes
    );
    let kinds =
        |run: &RunResult| doctor::diagnose(&run.snapshot, &DoctorOptions::default()).unwrap().findings.iter().map(|f| f.kind.to_string()).collect::<Vec<_>>();
    assert!(kinds(&r).iter().any(|k| k == doctor::FRAGMENTATION), "dynamic: {:?}", kinds(&r));
    assert!(!kinds(&s).iter().any(|k| k == doctor::FRAGMENTATION), "static: {:?}", kinds(&s));
    // Either cache outlives the forward that made it on purpose: no retained graph.
    for (name, run) in [("dynamic", &r), ("static", &s)] {
        assert!(!kinds(run).iter().any(|k| k == doctor::RETAINED_GRAPH), "{name}: {:?}", kinds(run));
    }
}

#[test]
fn the_run_json_keeps_the_contract() {
    let r = run(&[("batch", "1"), ("prompt", "8"), ("new_tokens", "3")]);
    let json = serde_json::to_value(&r).unwrap();
    for key in ["scenario", "parameters", "model_parameters", "steps", "peak_allocated_bytes", "peak_reserved_bytes", "out_of_memory"] {
        assert!(json.get(key).is_some(), "{key}");
    }
    assert_eq!(r.model_parameters, Some(8_030_261_248));
    let labels: Vec<&str> = r.steps.iter().map(|s| s.label.as_str()).collect();
    assert_eq!(labels, ["model and prompt", "prefill", "decode 1", "decode 2"]);
    assert_eq!(json["parameters"]["cache"], "dynamic");
}

#[test]
fn bad_values_are_refused_with_clear_errors() {
    let e = run_error(&[("config", "gpt2")]);
    assert!(e.contains("Llama family") && e.contains("GPT2LMHeadModel"), "{e}");
    let e = run_error(&[("new_tokens", "0")]);
    assert!(e.contains("new_tokens must be a whole number from 1"), "{e}");
    let e = run_error(&[("prompt", "0")]);
    assert!(e.contains("prompt must be a whole number from 1"), "{e}");
    let e = run_error(&[("cache", "paged")]);
    assert!(e.contains("cache must be one of dynamic, static"), "{e}");
    let e = run_error(&[("batch", "4096"), ("prompt", "4096")]);
    assert!(e.contains("attention scores larger than tensormem can index"), "{e}");
    let e = run_error(&[("context", "8")]);
    assert!(e.contains("unknown parameter \"context\""), "{e}");
    let e = run_error(&[("config", "no-such-model")]);
    assert!(e.contains("neither a preset"), "{e}");
}

#[test]
fn a_small_card_runs_out_of_memory_with_the_steps_before_kept() {
    let r = scenarios::run(&RunRequest { capacity: Some(16_500_000_000), ..common::scenario_request("hf-generate", &[("batch", "8"), ("prompt", "512")]) })
        .unwrap();
    // Llama-3-8B's bfloat16 weights (16.06 GB) fit; the prefill at batch 8 (17.6 GB) does not.
    assert!(r.out_of_memory.as_deref().is_some_and(|e| e.contains("Out of memory. Tried to allocate")), "{:?}", r.out_of_memory);
    let labels: Vec<&str> = r.steps.iter().map(|s| s.label.as_str()).collect();
    assert_eq!(labels, ["model and prompt"]);
}
