//! Training memory on the sim device: parameters, gradients, optimizer state and zero_grad
//! in the allocator's exact bytes, module scopes in every allocation's frames, and GPT-2's
//! published size.

use tensormem::nn::{Architecture, Module, Transformer, TransformerConfig};
use tensormem::optim::{Adam, Optimizer, Sgd, clip_grad_norm_};
use tensormem::trace::{Action, Category};
use tensormem::{DType, Device, SimOptions, Tensor};

/// What the allocator holds for `bytes`: PyTorch's round_size (512-byte multiples, 512 at least).
fn rounded(bytes: u64) -> u64 {
    bytes.div_ceil(512).max(1) * 512
}

fn held(tensors: &[Tensor]) -> u64 {
    tensors.iter().map(|t| rounded(t.storage_bytes())).sum()
}

fn tiny(architecture: Architecture) -> TransformerConfig {
    TransformerConfig { architecture, vocab: 96, context: 16, dim: 32, layers: 2, heads: 4, hidden: 64, dropout: 0.1, dtype: DType::F32 }
}

/// Token ids and next-token targets [batch, T].
fn batch(dev: &Device, batch: usize, t: usize, vocab: usize) -> (Tensor, Tensor) {
    let ids: Vec<i64> = (0..batch * t).map(|i| (i * 7 % vocab) as i64).collect();
    let targets: Vec<i64> = (0..batch * t).map(|i| ((i * 7 + 3) % vocab) as i64).collect();
    (dev.from_slice(&ids, &[batch, t]).unwrap(), dev.from_slice(&targets, &[batch, t]).unwrap())
}

fn sim() -> Device {
    Device::sim(SimOptions::preset("H100-80GB"))
}

#[test]
fn gpt2_small_has_the_published_parameter_count_and_holds_its_bytes() {
    let dev = sim();
    let model = Transformer::new(&dev, TransformerConfig::gpt2_small()).unwrap();
    assert_eq!(model.parameter_count(), 124_439_808);
    // Beyond each parameter's rounded size, the allocator hands out whole blocks where the
    // rest of a large one is too small to split off (1 MiB or less, as PyTorch's).
    let extra = dev.memory_allocated() - held(&model.parameters());
    assert!(extra < model.parameters().len() as u64 * (1 << 20), "{extra}");
    let snapshot = dev.snapshot();
    let tagged = snapshot.device_traces[0].iter().filter(|e| e.action == Action::Alloc && e.category == Some(Category::Parameter)).count();
    assert_eq!(tagged, model.parameters().len(), "each parameter is one allocation tagged parameter (the causal masks are buffers)");
}

#[test]
fn optimizer_state_is_allocated_at_the_first_step_in_the_allocators_bytes() {
    // (optimizer, state tensors per parameter)
    type Make = fn(Vec<Tensor>) -> Box<dyn Optimizer>;
    let optimizers: [(&str, Make, u64); 5] = [
        ("SGD", |p| Box::new(Sgd::new(p, 0.1, 0.0, 0.0)), 0),
        ("SGD with momentum", |p| Box::new(Sgd::new(p, 0.1, 0.9, 0.0)), 1),
        ("Adam", |p| Box::new(Adam::new(p, 1e-3, 0.0)), 2),
        ("AdamW", |p| Box::new(Adam::adamw(p, 1e-3, 0.01)), 2),
        (
            "AdamW, single-tensor",
            |p| {
                let mut adam = Adam::adamw(p, 1e-3, 0.01);
                adam.foreach = false;
                Box::new(adam)
            },
            2,
        ),
    ];
    for (what, make, per_parameter) in optimizers {
        let dev = sim();
        let model = Transformer::new(&dev, tiny(Architecture::Llama)).unwrap();
        let params = model.parameters();
        let mut optimizer = make(model.parameters());
        let (ids, targets) = batch(&dev, 2, 8, 96);
        let mut after_step = Vec::new();
        for step in 0..3 {
            optimizer.zero_grad(true).unwrap();
            let before = dev.memory_allocated();
            model.loss(&ids, &targets, true).unwrap().backward().unwrap();
            // The first step also makes cuBLAS's two workspaces (the main thread's in forward,
            // autograd's in backward; 32 MiB each on an H100), kept from then on.
            let workspaces = if step == 0 { 2 * (32 << 20) } else { 0 };
            assert_eq!(
                dev.memory_allocated(),
                before + held(&params.iter().map(|p| p.grad().unwrap()).collect::<Vec<_>>()) + workspaces,
                "{what}: backward leaves the gradients"
            );
            let before_step = dev.memory_allocated();
            optimizer.step().unwrap();
            let state = dev.memory_allocated() - before_step;
            if step == 0 {
                assert_eq!(state, per_parameter * held(&params), "{what}: state made at the first step");
            } else {
                assert_eq!(state, 0, "{what}: nothing new after the first step");
            }
            after_step.push(dev.memory_allocated());
        }
        assert_eq!(after_step[1], after_step[2], "{what}: steady from the second step");
        let snapshot = dev.snapshot();
        let state_allocs =
            snapshot.device_traces[0].iter().filter(|e| e.action == Action::Alloc && e.category == Some(Category::OptimizerState)).count() as u64;
        assert_eq!(state_allocs, per_parameter * params.len() as u64, "{what}: state tensors tagged optimizer_state");
    }
}

#[test]
fn single_tensor_adam_holds_one_parameter_s_temporaries_beside_the_previous_denominator() {
    // `_single_tensor_adam` at parameter i of S_i bytes: its square root and the quotient by
    // bias_correction2_sqrt (the new denominator), with coupled weight decay first its new
    // gradient `grad.add(param, alpha=weight_decay)`, while the previous parameter's
    // denominator waits for the rebinding. The multi-tensor path holds every square root at once.
    let cases: [(&str, bool, f64, u64, &[&str]); 3] = [
        ("AdamW", true, 0.01, 2, &["sqrt", "div"]),
        ("Adam", false, 0.0, 2, &["sqrt", "div"]),
        ("Adam, coupled weight decay", false, 0.01, 3, &["add", "sqrt", "div"]),
    ];
    for (what, decoupled, weight_decay, temporaries, ops) in cases {
        for foreach in [false, true] {
            let dev = sim();
            let model = Transformer::new(&dev, tiny(Architecture::Llama)).unwrap();
            let requested: Vec<u64> = model.parameters().iter().map(Tensor::storage_bytes).collect();
            let sizes: Vec<u64> = requested.iter().map(|&s| rounded(s)).collect();
            let mut adam = if decoupled { Adam::adamw(model.parameters(), 1e-3, weight_decay) } else { Adam::new(model.parameters(), 1e-3, weight_decay) };
            adam.foreach = foreach;
            let (ids, targets) = batch(&dev, 2, 8, 96);
            for step in 0..2 {
                adam.zero_grad(true).unwrap();
                model.loss(&ids, &targets, true).unwrap().backward().unwrap();
                let (before, start) = (dev.memory_allocated(), dev.snapshot().device_traces[0].len());
                dev.reset_peak_memory_stats();
                adam.step().unwrap();
                if step == 0 {
                    continue; // the moments are made here
                }
                assert_eq!(dev.memory_allocated(), before, "{what}, foreach={foreach}: nothing stays after the first step");
                let above = dev.max_memory_allocated() - before;
                let snapshot = dev.snapshot();
                let made: Vec<(&str, u64)> = snapshot.device_traces[0]
                    .range(start..)
                    .filter(|e| e.action == Action::Alloc)
                    .map(|e| (e.frames.as_ref().unwrap()[0].name.as_str(), e.size))
                    .collect();
                if foreach {
                    // (The decayed gradients are deleted before the roots: `del device_grads`.)
                    assert_eq!(above, sizes.iter().sum::<u64>(), "{what}, foreach: every square root at once");
                    continue;
                }
                let expected = (0..sizes.len()).map(|i| if i == 0 { 0 } else { sizes[i - 1] } + temporaries * sizes[i]).max().unwrap();
                assert_eq!(above, expected, "{what}, single-tensor: the worst parameter's temporaries and its predecessor's denominator");
                let per_parameter: Vec<(&str, u64)> = requested.iter().flat_map(|&s| ops.iter().map(move |&op| (op, s))).collect();
                assert_eq!(made, per_parameter, "{what}, single-tensor: one parameter after the other");
            }
        }
    }
}

#[test]
fn zero_grad_frees_every_gradient_or_keeps_the_blocks() {
    let dev = sim();
    let model = Transformer::new(&dev, tiny(Architecture::Gpt2)).unwrap();
    let params = model.parameters();
    let optimizer = Sgd::new(model.parameters(), 0.1, 0.0, 0.0);
    let (ids, targets) = batch(&dev, 2, 8, 96);
    model.loss(&ids, &targets, true).unwrap().backward().unwrap();
    let grads: Vec<Tensor> = params.iter().map(|p| p.grad().unwrap()).collect();
    let grad_bytes = held(&grads);
    let with_grads = dev.memory_allocated();
    let addresses: Vec<u64> = grads.iter().map(Tensor::data_ptr).collect();
    drop(grads);
    optimizer.zero_grad(false).unwrap();
    assert_eq!(dev.memory_allocated(), with_grads, "set_to_none=False keeps every block");
    assert_eq!(params.iter().map(|p| p.grad().unwrap().data_ptr()).collect::<Vec<_>>(), addresses, "in place");
    // A second backward accumulates into the same blocks: nothing new stays.
    model.loss(&ids, &targets, true).unwrap().backward().unwrap();
    assert_eq!(dev.memory_allocated(), with_grads);
    optimizer.zero_grad(true).unwrap();
    assert_eq!(dev.memory_allocated(), with_grads - grad_bytes, "set_to_none=True frees every gradient block");
    assert!(params.iter().all(|p| p.grad().is_none()));
}

#[test]
fn gradient_accumulation_and_clipping_add_no_lasting_memory() {
    let dev = sim();
    let model = Transformer::new(&dev, tiny(Architecture::Llama)).unwrap();
    let params = model.parameters();
    let (ids, targets) = batch(&dev, 2, 8, 96);
    model.loss(&ids, &targets, true).unwrap().mul_scalar(0.5).unwrap().backward().unwrap();
    let once = dev.memory_allocated();
    model.loss(&ids, &targets, true).unwrap().mul_scalar(0.5).unwrap().backward().unwrap();
    assert_eq!(dev.memory_allocated(), once, "a second micro-batch adds into the same gradients");
    let total = clip_grad_norm_(&params, 1.0).unwrap();
    assert_eq!(total.shape(), &[] as &[usize]);
    assert_eq!(dev.memory_allocated(), once + 512, "clipping keeps only the returned norm");
}

#[test]
fn every_allocation_of_a_step_names_the_module_that_caused_it() {
    let dev = sim();
    let model = Transformer::new(&dev, tiny(Architecture::Llama)).unwrap();
    let (ids, targets) = batch(&dev, 2, 8, 96);
    let start = dev.snapshot().device_traces[0].len();
    let loss = model.loss(&ids, &targets, true).unwrap();
    let forward_end = dev.snapshot().device_traces[0].len();
    loss.backward().unwrap();
    let snapshot = dev.snapshot();
    let trace = &snapshot.device_traces[0];
    let scopes = |i: usize| trace.at(i).frames.as_ref().unwrap().iter().skip(1).map(|f| f.name.clone()).collect::<Vec<_>>();
    let allocs: Vec<usize> = (start..trace.len()).filter(|&i| trace.at(i).action == Action::Alloc).collect();
    let top = |i: usize| trace.at(i).frames.as_ref().unwrap()[0].name.clone();
    // The seed gradient is made by backward() itself, outside every module (PyTorch's _make_grads).
    for &i in allocs.iter().filter(|&&i| top(i) != "ones_like") {
        let s = scopes(i);
        assert!(
            s.iter().any(|n| n.starts_with("layers.") || ["tok_embeddings", "norm", "output", "loss"].contains(&n.as_str())),
            "allocation {i} ({}) has no module scope: {s:?}",
            trace.at(i).frames.as_ref().unwrap()[0].name
        );
    }
    let named = |i: &usize| scopes(*i).contains(&"layers.1.attention.q_proj".to_string());
    assert!(allocs.iter().filter(|&&i| i < forward_end).any(named), "forward inside q_proj");
    assert!(allocs.iter().filter(|&&i| i >= forward_end).any(named), "backward of q_proj carries its scope");
    assert!(allocs.iter().any(|&i| top(i) == "native_dropout"), "dropout's mask and output");
    assert!(allocs.iter().any(|&i| top(i).contains("SoftmaxBackward0")), "softmax's backward is labelled with its node");
}
