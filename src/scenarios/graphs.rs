//! CUDA graphs and their private pools: why a captured training step (`torch.cuda.graph`,
//! `torch.compile(mode="reduce-overhead")`) reserves more than the same step eager, and why
//! graphs captured for several batch sizes should share one pool.

use super::pitfalls::{model, model_parameters, small_llama};
use super::{Parameter, Program, Recorder, Scenario, ScenarioInfo, Values, repeated_steps, token_batch};
use crate::alloc::Stream;
use crate::autograd;
use crate::nn::Module;
use crate::nn::optim::{Adam, Optimizer};
use crate::tensor::Result;

/// The side stream PyTorch's docs warm up on before a capture (`s = torch.cuda.Stream()`).
const WARMUP_STREAM: Stream = 0x7100;
/// The stream `torch.cuda.graph` captures on when given none (its `default_capture_stream`).
const CAPTURE_STREAM: Stream = 0x7200;

pub(super) fn scenarios() -> Vec<Scenario> {
    vec![
        Scenario {
            info: ScenarioInfo {
                name: "cuda-graph-step",
                title: "A training step captured into a CUDA graph reserves more than the same step eager",
                explanation: "torch.cuda.graph (and torch.compile's reduce-overhead mode) records every allocation of the captured \
                              step into a private memory pool. Blocks freed during the capture are reused within it, so the pool \
                              ends holding the step's peak, and it stays reserved while the graph lives: replays write into that \
                              same memory and allocate nothing. The pool's free blocks serve no other allocation, and \
                              torch.cuda.empty_cache() cannot return them while the graph exists. The warm-up steps PyTorch \
                              asks for before a capture run eagerly on a side stream and leave their own cached blocks behind; \
                              torch.cuda.graph empties the cache as it begins, which returns those (so a later empty_cache() \
                              has nothing left to return). Compare reserved after the capture with the eager steps.",
                parameters: model_parameters()
                    .into_iter()
                    .chain([Parameter::choice("mode", "graph", &["graph", "eager"], "capture the step into a graph, or run it eagerly")])
                    .collect(),
                variants: vec![],
            },
            check: repeated_steps,
            fix_settings: None,
            program: Program::Sync(graph_step),
        },
        Scenario {
            info: ScenarioInfo {
                name: "cuda-graph-pools",
                title: "Graphs captured for several batch sizes: a pool each, or one shared",
                explanation: "Inference servers capture one CUDA graph per batch size they serve. Each capture given no pool \
                              gets its own, which keeps that capture's peak reserved: the pools add up. Passed one pool \
                              (torch.cuda.graph(g, pool=handle), with handle = torch.cuda.graph_pool_handle() or the first \
                              graph's g.pool()), a later capture reuses the blocks an earlier one freed, on the same stream, \
                              so only the graphs' outputs add up. Capturing the largest batch first lets the smaller ones \
                              fit in what it freed (vLLM does this).",
                parameters: vec![
                    Parameter::integer("context", "128", 1, 8192, "tokens per sequence"),
                    Parameter {
                        name: "batches",
                        default: "8,4,2,1",
                        help: "the batch sizes captured, in capture order",
                        kind: super::Kind::Integers { min: 1, max: 4096, max_len: 64 },
                    },
                    Parameter::choice("pools", "own", &["own", "shared"], "a pool per graph, or one for all"),
                ],
                variants: vec![],
            },
            check: repeated_steps,
            fix_settings: None,
            program: Program::Sync(graph_pools),
        },
    ]
}

fn graph_step(rec: &mut Recorder, v: &Values) -> Result<()> {
    let dev = rec.device.clone();
    let (model, ids, targets) = model(rec, v)?;
    let mut optimizer = Adam::new(model.parameters(), 1e-3, 0.0);
    let step = |optimizer: &mut Adam, zero_grad: bool| -> Result<()> {
        if zero_grad {
            optimizer.zero_grad(true)?;
        }
        model.loss(&ids, &targets, true)?.backward()?;
        optimizer.step()
    };
    if v.choice("mode") == "eager" {
        for s in 1..=v.int("steps") {
            step(&mut optimizer, true)?;
            rec.step(format!("eager step {s}"));
        }
        return Ok(());
    }
    {
        let _side = dev.stream(WARMUP_STREAM);
        for _ in 0..3 {
            step(&mut optimizer, true)?;
        }
    }
    rec.step("3 warm-up steps on a side stream");
    // As PyTorch's whole-network example: gradients set to None before the capture, so backward
    // makes them inside it, in the pool, where every replay writes them.
    optimizer.zero_grad(true)?;
    let graph = {
        let _capture_stream = dev.stream(CAPTURE_STREAM);
        let capture = dev.capture_graph(None)?;
        step(&mut optimizer, false)?;
        capture.end()?
    };
    rec.step("captured: forward, backward and optimizer step");
    dev.empty_cache();
    rec.step("torch.cuda.empty_cache()");
    for s in 1..=v.int("steps") {
        graph.replay();
        rec.step(format!("replay {s}"));
    }
    Ok(())
}

fn graph_pools(rec: &mut Recorder, v: &Values) -> Result<()> {
    let dev = rec.device.clone();
    let context = v.int("context");
    let model = small_llama(&dev, context)?;
    rec.model_parameters = Some(model.parameter_count());
    rec.step("model");
    let _no_grad = autograd::no_grad();
    let shared = (v.choice("pools") == "shared").then(|| dev.graph_pool_handle());
    let _capture_stream = dev.stream(CAPTURE_STREAM);
    // Each graph keeps its static input and its output (what replays read and write).
    let mut graphs = Vec::new();
    for batch in v.ints("batches") {
        let (ids, _) = token_batch(&dev, batch as usize, context, 1000)?;
        let capture = dev.capture_graph(shared)?;
        let logits = model.forward(&ids, false)?;
        graphs.push((capture.end()?, ids, logits));
        rec.step(format!("captured batch {batch}"));
    }
    Ok(())
}
