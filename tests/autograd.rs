//! Autograd's memory on the sim device: what each op saves for backward stays allocated until
//! backward frees it (or the graph is dropped), nothing is saved under no_grad, gradients
//! accumulate as PyTorch's engine accumulates them, and PyTorch's errors.

use tensormem::autograd;
use tensormem::{DType, Device, SimOptions, Tensor};

const MIB: u64 = 1 << 20;

fn device() -> Device {
    Device::sim(SimOptions::preset("A100-40GB"))
}

/// A device where a matmul already ran forward and backward, so that cuBLAS's workspaces (one
/// for the main thread, one for autograd's, kept to the end) are made, and each case's bytes
/// are its own.
fn device_after_a_matmul() -> Device {
    let dev = device();
    let w = dev.randn(&[2, 2], DType::F32).unwrap();
    w.requires_grad_(true).unwrap();
    w.matmul(&w).unwrap().sum(&[], false).unwrap().backward().unwrap();
    assert_eq!(dev.memory_allocated(), 2 * 8_519_680 + 2 * 512, "w, its gradient and two A100 workspaces");
    dev
}

/// A 1 MiB f32 leaf that requires grad.
fn leaf(dev: &Device) -> Tensor {
    let x = dev.randn(&[512, 512], DType::F32).unwrap();
    x.requires_grad_(true).unwrap();
    x
}

#[test]
fn each_op_holds_what_pytorch_saves_until_backward() {
    // (what it is, the program from a 1 MiB leaf x to a scalar, the MiB held between forward
    // and backward beyond x itself and the 512-byte scalar)
    type Program = fn(&Tensor) -> Tensor;
    let cases: [(&str, Program, u64); 8] = [
        ("exp saves its result", |x| x.exp().unwrap().sum(&[], false).unwrap(), 1),
        ("relu saves its result", |x| x.relu().unwrap().sum(&[], false).unwrap(), 1),
        ("mul by a Python number saves nothing", |x| x.mul_scalar(2.0).unwrap().sum(&[], false).unwrap(), 0),
        ("mul saves the other operand (an intermediate here)", |x| x.mul_scalar(2.0).unwrap().mul(x).unwrap().sum(&[], false).unwrap(), 1),
        ("add saves nothing", |x| x.mul_scalar(2.0).unwrap().add(x).unwrap().sum(&[], false).unwrap(), 0),
        ("views, sum and mean save nothing", |x| x.t().unwrap().reshape(&[-1]).unwrap().mean(&[], false).unwrap(), 0),
        ("matmul saves both operands (one an intermediate)", |x| x.matmul(&x.relu().unwrap()).unwrap().sum(&[], false).unwrap(), 1),
        (
            "div saves the divisor, and the dividend for its own gradient",
            |x| x.exp().unwrap().div(&x.mul_scalar(3.0).unwrap()).unwrap().sum(&[], false).unwrap(),
            2,
        ),
    ];
    for (what, program, held) in cases {
        let dev = device_after_a_matmul();
        let x = leaf(&dev);
        let base = dev.memory_allocated() + 512;
        let loss = program(&x);
        assert_eq!(dev.memory_allocated(), base + held * MIB, "{what}: held between forward and backward");
        loss.backward().unwrap();
        // Backward freed what was saved; x.grad (1 MiB) and the 512-byte seed gradient remain.
        drop(loss);
        assert_eq!(dev.memory_allocated(), base - 512 + MIB, "{what}: after backward, x and x.grad");
        assert_eq!(x.grad().unwrap().shape(), x.shape(), "{what}");
        // Under no_grad nothing is saved.
        let _no_grad = autograd::no_grad();
        x.set_grad(None);
        let before = dev.memory_allocated();
        let out = program(&x);
        assert_eq!(dev.memory_allocated(), before + 512, "{what}: under no_grad only the result is held");
        assert!(!out.requires_grad() && out.grad_fn().is_none());
    }
}

#[test]
fn the_other_ops_hold_what_pytorch_saves_until_backward() {
    // (what it is, the program from a 1 MiB [512, 512] f32 leaf x to a scalar, the bytes held
    // between forward and backward beyond x, the scalar and the program's own inputs). x * 2
    // makes an intermediate where saving the leaf x itself would cost nothing.
    type Program = fn(&Tensor) -> Tensor;
    const ROWS: u64 = 512;
    let cases: [(&str, Program, u64); 16] = [
        ("tanh saves its result", |x| x.tanh().unwrap().sum(&[], false).unwrap(), MIB),
        ("sigmoid saves its result", |x| x.sigmoid().unwrap().sum(&[], false).unwrap(), MIB),
        ("gelu saves its input", |x| x.mul_scalar(2.0).unwrap().gelu().unwrap().sum(&[], false).unwrap(), MIB),
        ("silu saves its input (the leaf: nothing more)", |x| x.silu().unwrap().sum(&[], false).unwrap(), 0),
        ("pow saves its input", |x| x.mul_scalar(2.0).unwrap().pow_scalar(2.0).unwrap().sum(&[], false).unwrap(), MIB),
        ("softmax saves its result", |x| x.softmax(-1).unwrap().sum(&[], false).unwrap(), MIB),
        ("log_softmax saves its result", |x| x.log_softmax(0).unwrap().sum(&[], false).unwrap(), MIB),
        (
            "layer_norm saves its input, and a float32 mean and rstd per row",
            |x| {
                let (w, b) = (x.device().ones(&[512], DType::F32).unwrap(), x.device().zeros(&[512], DType::F32).unwrap());
                x.mul_scalar(2.0).unwrap().layer_norm(&w, &b, 1e-5).unwrap().sum(&[], false).unwrap()
            },
            // The weight and bias stay with the graph too (2 KiB each).
            MIB + 2 * ROWS * 4 + 2 * 2048,
        ),
        ("dropout saves its bool mask (a byte per element)", |x| x.dropout(0.1, true).unwrap().sum(&[], false).unwrap(), MIB / 4),
        ("max(dim) saves its int64 indices", |x| x.max_dim(1, false).unwrap().0.sum(&[], false).unwrap(), ROWS * 8),
        ("where saves its bool condition", |x| x.gt(&x.exp().unwrap().detach()).unwrap().where_(x, x).unwrap().sum(&[], false).unwrap(), MIB / 4),
        (
            "cat, narrow and select save nothing",
            |x| Tensor::cat(&[x, x], 0).unwrap().narrow(0, 1, 600).unwrap().select(1, 3).unwrap().sum(&[], false).unwrap(),
            0,
        ),
        (
            "embedding saves its ids",
            |x| x.embedding(&x.device().zeros(&[4, 64], DType::I64).unwrap()).unwrap().sum(&[], false).unwrap(),
            // The 256 ids (2 KiB), the only reference left to them.
            2048,
        ),
        ("to(dtype) saves nothing", |x| x.to(DType::F16).unwrap().sum(&[], false).unwrap(), 0),
        (
            "gather saves its whole input and its index",
            |x| x.mul_scalar(2.0).unwrap().gather(1, &x.device().zeros(&[512, 1], DType::I64).unwrap()).unwrap().sum(&[], false).unwrap(),
            MIB + 4096,
        ),
        (
            "cross_entropy: log_softmax saves its result; nll_loss that result, the targets and total_weight",
            |x| tensormem::nn::cross_entropy(x, &x.device().zeros(&[512], DType::I64).unwrap()).unwrap(),
            // The log-probabilities, the 512 int64 targets (the graph's reference) and the 0-d
            // total_weight.
            MIB + 4096 + 512,
        ),
    ];
    for (what, program, held) in cases {
        let dev = device();
        let x = leaf(&dev);
        let base = dev.memory_allocated() + 512;
        let loss = program(&x);
        assert_eq!(dev.memory_allocated(), base + held, "{what}: held between forward and backward");
        loss.backward().unwrap();
        drop(loss);
        assert_eq!(dev.memory_allocated(), base - 512 + MIB, "{what}: after backward, x and x.grad");
        assert_eq!((x.grad().unwrap().shape(), x.grad().unwrap().dtype()), (x.shape(), DType::F32), "{what}");
        x.set_grad(None);
        let _no_grad = autograd::no_grad();
        let before = dev.memory_allocated();
        drop(program(&x));
        assert_eq!(dev.memory_allocated(), before, "{what}: under no_grad nothing is held");
    }
}

#[test]
fn checkpointing_holds_only_the_inputs_between_forward_and_backward() {
    let program = |t: &[Tensor]| t[0].exp()?.tanh()?.sigmoid()?.sum(&[], false);
    for checkpointed in [false, true] {
        let dev = device();
        let x = leaf(&dev);
        let y = x.mul_scalar(2.0).unwrap();
        let base = dev.memory_allocated();
        let loss = if checkpointed { autograd::checkpoint(program, &[&y]).unwrap() } else { program(&[y.share()]).unwrap() };
        let held = dev.memory_allocated() - base;
        // Plain: exp, tanh and sigmoid each save their 1 MiB result. Checkpointed: only the
        // input y (already held) and the 512-byte loss.
        assert_eq!(held, if checkpointed { 512 } else { 3 * MIB + 512 }, "checkpointed: {checkpointed}");
        assert_eq!(loss.grad_fn().unwrap().name(), if checkpointed { "CheckpointFunctionBackward" } else { "SumBackward0" });
        drop(y);
        loss.backward().unwrap();
        assert_eq!(x.grad().unwrap().shape(), x.shape());
        drop(loss);
        assert_eq!(dev.memory_allocated(), base - MIB + MIB, "x and x.grad remain (y went with the graph)");
    }
}

#[test]
fn a_dropped_graph_frees_what_it_saved() {
    let dev = device();
    let x = leaf(&dev);
    let base = dev.memory_allocated();
    let loss = x.exp().unwrap().sum(&[], false).unwrap();
    assert_eq!(dev.memory_allocated(), base + MIB + 512);
    assert_eq!(loss.grad_fn().unwrap().name(), "SumBackward0");
    drop(loss);
    assert_eq!(dev.memory_allocated(), base, "the graph went with the loss");
}

#[test]
fn gradients_accumulate_and_a_freed_graph_cannot_run_again() {
    let dev = device();
    let x = leaf(&dev);
    let loss = x.exp().unwrap().sum(&[], false).unwrap();
    loss.backward_with(None, true).unwrap();
    let after_first = dev.memory_allocated();
    loss.backward().unwrap();
    assert_eq!(dev.memory_allocated(), after_first - MIB, "the second gradient was added into x.grad in place; then the saved result was freed");
    let err = loss.backward().unwrap_err().to_string();
    assert!(err.starts_with("Trying to backward through the graph a second time"), "{err}");
    // Setting .grad to None frees it, as zero_grad(set_to_none=True) does.
    let held = dev.memory_allocated();
    x.set_grad(None);
    assert_eq!(dev.memory_allocated(), held - MIB);
}

#[test]
fn pytorch_refuses_what_it_refuses() {
    let dev = device();
    let x = leaf(&dev);
    let err = x.add_scalar(1.0).unwrap().sum(&[], false).unwrap();
    drop(err);
    assert_eq!(
        x.add_(&dev.ones(&[512, 512], DType::F32).unwrap()).unwrap_err().to_string(),
        "a leaf Variable that requires grad is being used in an in-place operation."
    );
    // An in-place change to a saved tensor (through a detached alias, which shares its version).
    let y = x.exp().unwrap();
    let loss = y.sum(&[], false).unwrap();
    y.detach().exp_().unwrap();
    assert_eq!(
        loss.backward().unwrap_err().to_string(),
        "one of the variables needed for gradient computation has been modified by an inplace operation: [torch.cuda.FloatTensor [512, 512]], which is output 0 of ExpBackward0, is at version 1; expected version 0 instead. Hint: enable anomaly detection to find the operation that failed to compute its gradient, with torch.autograd.set_detect_anomaly(True)."
    );
    assert!(x.sum(&[0], false).unwrap().backward().unwrap_err().to_string().contains("only for scalar outputs"));
    assert!(dev.ones(&[2], DType::F32).unwrap().sum(&[], false).unwrap().backward().unwrap_err().to_string().contains("does not require grad"));
    assert!(dev.ones(&[2], DType::I32).unwrap().requires_grad_(true).unwrap_err().to_string().contains("floating point"));
    assert!(x.exp().unwrap().requires_grad_(false).unwrap_err().to_string().contains("leaf variables"));
    // In place on an intermediate: recorded where the derivative allows, refused otherwise.
    let y = x.mul_scalar(2.0).unwrap();
    y.add_scalar_(1.0).unwrap().exp_().unwrap();
    assert_eq!(y.grad_fn().unwrap().name(), "ExpBackward0");
    assert!(y.gelu_().unwrap_err().to_string().contains("not differentiated on tensors the graph tracks"));
    assert!(y.view(&[-1]).unwrap().add_scalar_(1.0).unwrap_err().to_string().contains("through a view"));
    // An op autograd cannot differentiate yet says so instead of dropping the gradient.
    assert!(x.var(-1, 1.0, false).unwrap_err().to_string().contains("does not differentiate this op yet"));
}

#[test]
fn backward_allocations_carry_the_forward_ops_call_site_and_scope() {
    use tensormem::trace::Action;
    let dev = device();
    let x = leaf(&dev);
    let (loss, line) = {
        let _block = dev.scope("block");
        (x.exp().unwrap().mul_scalar(3.0).unwrap().sum(&[], false).unwrap(), line!())
    };
    let before = dev.snapshot().device_traces[0].len();
    loss.backward().unwrap();
    let trace = dev.snapshot().device_traces[0].clone();
    let stacks: Vec<Vec<(String, u64, String)>> = trace
        .range(before..)
        .filter(|e| e.action == Action::Alloc)
        .map(|e| e.frames.as_ref().unwrap().iter().map(|f| (f.filename.clone(), f.line, f.name.clone())).collect())
        .collect();
    // exp's gradient (grad * result) and mul's (grad * 3): allocated as their backward, at the
    // line that called them, in the scope they ran in.
    for node in ["mul (ExpBackward0)", "mul (MulBackward1)"] {
        let stack = stacks.iter().find(|s| s[0].2 == node).unwrap_or_else(|| panic!("no allocation for {node}: {stacks:?}"));
        assert!(stack[0].0.ends_with("autograd.rs") && stack[0].1 == line as u64, "{node}: {stack:?}");
        assert_eq!(stack[1].2, "block", "{node}: the forward's scope");
    }
}

#[test]
fn dropout_allocates_what_aten_allocates() {
    let dev = device();
    let x = leaf(&dev);
    let base = dev.memory_allocated();
    // Evaluation, or p = 0: the input itself.
    assert!(x.dropout(0.5, false).unwrap().same(&x) && x.dropout(0.0, true).unwrap().same(&x));
    assert_eq!(dev.memory_allocated(), base);
    // p = 1: a product with a 0-d zeros tensor (512 bytes, freed), one output; mul saves it.
    let all = x.dropout(1.0, true).unwrap();
    assert_eq!(dev.memory_allocated(), base + MIB + 512);
    drop(all);
    // Training: the output and a bool mask (a byte per element), which backward keeps.
    let out = x.dropout(0.1, true).unwrap();
    assert_eq!(dev.memory_allocated(), base + MIB + MIB / 4);
    assert!(x.dropout(1.5, true).unwrap_err().to_string().contains("between 0 and 1"));
    drop(out);
}

/// The fused add forms: `add(y, alpha)` is one output, and its backward makes the scaled
/// gradient a tensor of its own (ATen's `maybe_multiply`), which becomes y.grad as it is, where
/// with alpha 1 the expanded seed is cloned into it; `_add_relu` peaks one output below add then
/// relu, and PyTorch does not differentiate it.
#[test]
fn fused_add_forms_allocate_one_output() {
    for alpha in [3.0, 1.0] {
        let dev = device();
        let (x, y) = (leaf(&dev), leaf(&dev));
        let before = dev.memory_allocated();
        let loss = x.add_alpha(&y, alpha).unwrap().sum(&[], false).unwrap();
        assert_eq!(dev.memory_allocated(), before + 512, "the output was freed; add saves nothing");
        dev.reset_peak_memory_stats();
        loss.backward().unwrap();
        // The loss, the seed and two gradients: x's the expanded seed cloned; y's the seed
        // times alpha (kept as it is), or with alpha 1 a clone too.
        assert_eq!(dev.max_memory_allocated() - before, 512 + 512 + 2 * MIB, "alpha {alpha}");
        let ops: Vec<String> = dev.snapshot().device_traces[0]
            .iter()
            .filter(|e| e.action == tensormem::trace::Action::Alloc && e.size == MIB)
            .map(|e| e.frames.as_ref().unwrap()[0].name.clone())
            .collect();
        assert_eq!(ops.iter().any(|name| name.starts_with("mul")), alpha != 1.0, "alpha {alpha}: {ops:?}");
    }
    let dev = device();
    let (x, y) = {
        let _no_grad = autograd::no_grad();
        (dev.randn(&[512, 512], DType::F32).unwrap(), dev.randn(&[512, 512], DType::F32).unwrap())
    };
    let peak_of = |f: &dyn Fn() -> Tensor| {
        dev.reset_peak_memory_stats();
        let base = dev.memory_allocated();
        drop(f());
        dev.max_memory_allocated() - base
    };
    assert_eq!(peak_of(&|| x.add(&y).unwrap().relu().unwrap()), 2 * MIB);
    assert_eq!(peak_of(&|| x.add_relu(&y).unwrap()), MIB);
    let before = dev.memory_allocated();
    x.add_relu_(&y).unwrap();
    assert_eq!(dev.memory_allocated(), before, "in place");
    let error = leaf(&dev).add_relu(&y).unwrap_err().to_string();
    assert!(error.contains("_add_relu") && error.contains("does not differentiate"), "{error}");
}

/// A graph as deep as a user's model makes it is taken apart without recursion: 100,000 chained
/// ops (each saving its input) drop on a thread with a 256 KiB stack, freeing every block.
#[test]
fn a_graph_of_any_depth_drops_without_overflowing_the_stack() {
    let freed = std::thread::Builder::new()
        .stack_size(256 << 10)
        .spawn(|| {
            let dev = device();
            let x = dev.randn(&[16], DType::F32).unwrap();
            x.requires_grad_(true).unwrap();
            let before = dev.memory_allocated();
            let mut y = x.mul(&x).unwrap();
            for _ in 0..100_000 {
                y = y.mul(&y).unwrap();
            }
            assert!(dev.memory_allocated() > before + 100_000 * 512, "each op keeps its input alive for backward");
            drop(y);
            (dev.memory_allocated(), before)
        })
        .unwrap()
        .join()
        .expect("no stack overflow");
    assert_eq!(freed.0, freed.1, "the whole graph was freed");
}

#[test]
fn a_post_accumulate_grad_hook_sees_each_gradient_accumulated_until_its_handle_drops() {
    let dev = device();
    let x = leaf(&dev);
    let seen = std::rc::Rc::new(std::cell::RefCell::new(Vec::new()));
    let log = std::rc::Rc::clone(&seen);
    let handle = autograd::register_post_accumulate_grad_hook(&x, move |leaf| {
        log.borrow_mut().push(leaf.grad().expect("accumulated before the hook runs").shape().to_vec());
        Ok(())
    });
    x.mul_scalar(2.0).unwrap().sum(&[], false).unwrap().backward().unwrap();
    x.mul_scalar(3.0).unwrap().sum(&[], false).unwrap().backward().unwrap();
    assert_eq!(*seen.borrow(), vec![vec![512, 512]; 2], "once per backward, with the gradient in place");
    drop(handle);
    x.mul_scalar(4.0).unwrap().sum(&[], false).unwrap().backward().unwrap();
    assert_eq!(seen.borrow().len(), 2, "no hook after its handle drops");
}
