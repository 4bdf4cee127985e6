//! `cargo bench --bench training`: one GPT-2 small (124M parameters) training step on the sim
//! device (zero_grad, forward, loss, backward, AdamW), batch 8 x 1024 tokens, in float32 and
//! under autocast with a gradient scaler. Target (issue "Autograd ... nn and optimizers"):
//! under a second per step, so a browser tab can size models. Baseline in the same run: the
//! same step's allocation trace replayed through the allocator alone, i.e. what the step costs
//! beyond the allocator's own bookkeeping. Then `hf-train` on Llama-3-8B (8.03B parameters,
//! bfloat16, batch 1 x 512, a warm-up step and a recorded one) as `tensormem run` runs it.

use std::time::Instant;
use tensormem::amp;
use tensormem::nn::{Module, Transformer, TransformerConfig};
use tensormem::optim::{Adam, GradScaler, Optimizer};
use tensormem::replay::{ReplayOptions, replay_device};
use tensormem::{DType, Device, SimOptions};

/// Four steps; returns the device and each step's seconds.
fn train(mixed: bool) -> (Device, Vec<f64>) {
    let dev = Device::sim(SimOptions::preset("H100-80GB"));
    let model = Transformer::new(&dev, TransformerConfig::gpt2_small()).unwrap();
    let mut optimizer = Adam::adamw(model.parameters(), 6e-4, 0.1);
    let mut scaler = GradScaler::new();
    let ids = dev.zeros(&[8, 1024], DType::I64).unwrap();
    let mut times = Vec::new();
    for _ in 0..4 {
        let start = Instant::now();
        optimizer.zero_grad(true).unwrap();
        if mixed {
            let loss = {
                let _autocast = amp::autocast(DType::F16).unwrap();
                model.loss(&ids, &ids, true).unwrap()
            };
            scaler.scale(&loss).unwrap().backward().unwrap();
            pollster::block_on(scaler.step(&mut optimizer)).unwrap();
            pollster::block_on(scaler.update()).unwrap();
        } else {
            model.loss(&ids, &ids, true).unwrap().backward().unwrap();
            optimizer.step().unwrap();
        }
        times.push(start.elapsed().as_secs_f64());
    }
    (dev, times)
}

fn main() {
    let gib = |b: u64| b as f64 / (1u64 << 30) as f64;
    for mixed in [false, true] {
        let (dev, times) = train(mixed);
        let step = times[1..].iter().copied().fold(f64::INFINITY, f64::min);
        let snapshot = dev.snapshot();
        let events = snapshot.device_traces[0].len();
        let start = Instant::now();
        replay_device(&snapshot, 0, &ReplayOptions::default(), &mut |_, _| {}).unwrap();
        let replay = start.elapsed().as_secs_f64() / 4.0;
        let what = if mixed { "autocast f16 + GradScaler" } else { "float32" };
        println!("gpt2-small sim step (batch 8 x 1024, AdamW, {what}): {:.3} s (first {:.3} s; target < 1 s)", step, times[0]);
        println!("  peak allocated {:.2} GiB, {} trace events over 4 steps", gib(dev.max_memory_allocated()), events);
        println!("  baseline: replaying one step's allocations alone {:.4} s -> the step is {:.1}x its allocator work", replay, step / replay);
    }
    for set in [&[][..], &[("attn", "sdpa"), ("context", "4096")][..], &[("lora", "16"), ("lora_targets", "q,k,v,o")][..]] {
        let request = tensormem::scenarios::RunRequest {
            scenario: "hf-train".into(),
            set: set.iter().map(|(k, v)| (k.to_string(), v.to_string())).collect(),
            ..Default::default()
        };
        let start = Instant::now();
        let r = tensormem::scenarios::run(&request).unwrap();
        println!(
            "hf-train llama-3-8b {set:?}: {:.3} s for 2 steps, peak allocated {:.2} GiB, {} trace events",
            start.elapsed().as_secs_f64(),
            gib(r.peak_allocated_bytes),
            r.snapshot.device_traces[0].len()
        );
    }
}
