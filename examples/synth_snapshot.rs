//! Writes a synthetic training-loop snapshot with about N trace entries, for the page's browser
//! benchmark (MemoryViz struggles at 1 M entries; the page must not).
//!
//! `cargo run --release --example synth_snapshot -- ENTRIES OUT.pickle`
//! (`benches/doctor.rs` includes this file for [`synthesize`]).
//!
//! The program is what a transformer training loop does to the allocator, step after step:
//! parameters and optimizer state live throughout; each step allocates per-layer activations in
//! forward (some temporaries freed at once), frees them in reverse in backward while gradients
//! appear, then the optimizer's temporaries. Stacks are a few dozen Python frames deep, shared as
//! real snapshots share them. Entries carry a modelled `time_us`, as real traces carry a time.

use std::sync::Arc;
use tensormem::alloc::{AllocatorConfig, RecordContext, TimeSource, VirtualAllocator};
use tensormem::trace::{self, Frame, Frames};

/// A stack `depth` frames deep under `function` (innermost first), inside `file`: the project's
/// own file, or PyTorch's when it names one (`torch/...`, as backward and the optimizer run).
fn stack(file: &str, function: &str, line: u64, depth: usize) -> Frames {
    let place =
        |file: &str| if file.starts_with("torch/") { format!("/usr/lib/python3.12/site-packages/{file}") } else { format!("/home/user/project/{file}") };
    let mut frames = vec![Frame { filename: place(file), line, name: function.into() }];
    let (caller, name) = if file.starts_with("torch/") { (file, function) } else { ("torch/nn/modules/module.py", "_call_impl") };
    for d in 0..depth {
        frames.push(Frame { filename: place(caller), line: 1700 + d as u64, name: name.into() });
    }
    frames.push(Frame { filename: "/home/user/project/train.py".into(), line: 88, name: "main".into() });
    Arc::from(frames)
}

#[allow(dead_code)]
fn main() {
    let args: Vec<String> = std::env::args().collect();
    let (Some(entries), Some(out)) = (args.get(1).and_then(|n| n.parse::<usize>().ok()), args.get(2)) else {
        eprintln!("usage: synth_snapshot ENTRIES OUT.pickle|OUT.json");
        std::process::exit(2);
    };
    let (snapshot, steps) = synthesize(entries);
    trace::save_file(&snapshot, std::path::Path::new(out)).unwrap_or_else(|e| {
        eprintln!("error: {e}");
        std::process::exit(1);
    });
    let n = snapshot.device_traces.iter().map(|t| t.len()).sum::<usize>();
    println!("wrote {out}: {n} trace entries, {steps} training steps");
}

/// The snapshot of about `entries` trace entries, and the training steps it holds.
pub fn synthesize(entries: usize) -> (trace::Snapshot, u64) {
    const LAYERS: usize = 24;
    const HIDDEN: u64 = 1024;
    let mut a = VirtualAllocator::virtual_with(AllocatorConfig::default());
    a.record_memory_history(true, RecordContext::All, entries);
    a.history_mut().set_time_source(TimeSource::modelled());
    let forward: Vec<Frames> = (0..LAYERS).map(|l| stack("model.py", &format!("forward_layer_{l}"), 100 + l as u64, 6)).collect();
    let temp = stack("model.py", "attention_scores", 140, 8);
    let grads: Vec<Frames> = (0..LAYERS).map(|l| stack("torch/autograd/__init__.py", "backward", 300 + l as u64, 3)).collect();
    let optim = stack("torch/optim/adamw.py", "step", 74, 2);

    let _params: Vec<_> = (0..LAYERS).map(|_| a.malloc(12 * HIDDEN * HIDDEN * 2, 0, Some(stack("model.py", "__init__", 20, 2))).unwrap()).collect();
    let mut state = Vec::new();
    let mut step = 0u64;
    while a.history().len() < entries {
        // Batches wobble a little so the cache is exercised.
        let batch = 8 + (step * 7 % 5);
        let act = batch * 512 * HIDDEN * 2;
        let mut saved = Vec::new();
        for layer in &forward {
            a.history_mut().advance_time_us(180.0);
            let scores = a.malloc(act * 2, 0, Some(temp.clone())).unwrap();
            for k in 0..4 {
                saved.push(a.malloc(act / (k + 1), 0, Some(layer.clone())).unwrap());
            }
            a.free(scores.ptr, None).unwrap();
        }
        let mut grad_list = Vec::new();
        for l in (0..LAYERS).rev() {
            a.history_mut().advance_time_us(360.0);
            let g = a.malloc(12 * HIDDEN * HIDDEN * 2, 0, Some(grads[l].clone())).unwrap();
            grad_list.push(g);
            for _ in 0..4 {
                let s = saved.pop().unwrap();
                a.free(s.ptr, None).unwrap();
            }
        }
        if state.is_empty() {
            for _ in 0..2 * LAYERS {
                state.push(a.malloc(12 * HIDDEN * HIDDEN * 4, 0, Some(optim.clone())).unwrap());
            }
        }
        for _ in 0..LAYERS {
            a.history_mut().advance_time_us(40.0);
            let t = a.malloc(12 * HIDDEN * HIDDEN * 4, 0, Some(optim.clone())).unwrap();
            a.free(t.ptr, None).unwrap();
        }
        for g in grad_list {
            a.free(g.ptr, None).unwrap();
        }
        step += 1;
    }
    (a.snapshot(), step)
}
