//! Mixed precision on the sim device: autocast's per-op casts and types, its cache of f16
//! weight copies held for the scope, what ops save under it, and the gradient scaler's memory.

use tensormem::amp;
use tensormem::nn::{Architecture, Linear, Module, Transformer, TransformerConfig};
use tensormem::optim::{Adam, GradScaler, Optimizer};
use tensormem::trace::Action;
use tensormem::{DType, Device, SimOptions, Tensor};

fn rounded(bytes: u64) -> u64 {
    bytes.div_ceil(512).max(1) * 512
}

fn sim() -> Device {
    Device::sim(SimOptions::preset("A100-40GB"))
}

/// What cuBLAS's first call on a thread allocates on an A100 (compute capability 8.0: the
/// default `:4096:2:16:8`), and cuBLASLt's first fused addmm after it.
const CUBLAS_WORKSPACE: u64 = 8_519_680;
const CUBLASLT_WORKSPACE: u64 = 1 << 20;

/// The (op, size) of every allocation from trace entry `from` on.
fn allocations(dev: &Device, from: usize) -> Vec<(String, u64)> {
    let snapshot = dev.snapshot();
    snapshot.device_traces[0].range(from..).filter(|e| e.action == Action::Alloc).map(|e| (e.frames.as_ref().unwrap()[0].name.clone(), e.size)).collect()
}

fn trace_len(dev: &Device) -> usize {
    dev.snapshot().device_traces[0].len()
}

/// A float32 Linear 256 -> 512 with a bias, and a float32 input of 64 rows.
fn layer_and_input(dev: &Device) -> (Linear, Tensor) {
    (Linear::new(dev, "fc", 256, 512, true, DType::F32).unwrap(), dev.randn(&[64, 256], DType::F32).unwrap())
}

#[test]
fn autocast_holds_f16_copies_of_the_weights_it_cast_for_the_scope() {
    let dev = sim();
    let (linear, x) = layer_and_input(&dev);
    let before = dev.memory_allocated();
    let weight_copies = rounded(512 * 256 * 2) + rounded(512 * 2);
    let workspaces = CUBLAS_WORKSPACE + CUBLASLT_WORKSPACE;
    {
        let _autocast = amp::autocast(DType::F16).unwrap();
        let from = trace_len(&dev);
        let y = linear.forward(&x).unwrap();
        assert_eq!(y.dtype(), DType::F16, "linear runs in float16");
        // The bias, weight and input each cast once (last argument first, as GCC-built PyTorch
        // evaluates autocast's argument pack), then one f16 output, then (the thread's first
        // matmul, fused with its bias) cuBLAS's and cuBLASLt's workspaces.
        let first = allocations(&dev, from);
        assert_eq!(
            first,
            [
                ("to", 1024),
                ("to", 512 * 256 * 2),
                ("to", 64 * 256 * 2),
                ("addmm", 64 * 512 * 2),
                ("at::cuda::getNewWorkspace", CUBLAS_WORKSPACE),
                ("at::cuda::getCUDABlasLtWorkspace", CUBLASLT_WORKSPACE)
            ]
            .map(|(op, n)| (op.to_string(), rounded(n))),
            "casts, then the product"
        );
        assert_eq!(amp::cached_bytes(), 512 * 256 * 2 + 512 * 2, "the weight and bias copies are cached");
        // A second use of the layer in the scope casts only the input.
        let from = trace_len(&dev);
        let y2 = linear.forward(&x).unwrap();
        assert_eq!(allocations(&dev, from).len(), 2, "the cached weight copies are reused: {:?}", allocations(&dev, from));
        drop((y, y2));
        assert_eq!(dev.memory_allocated(), before + weight_copies + workspaces, "the cache holds the copies while the scope lasts");
        {
            let _nested = amp::autocast(DType::F16).unwrap();
        }
        assert_eq!(dev.memory_allocated(), before + weight_copies + workspaces, "leaving a nested scope keeps the cache");
        {
            let _off = amp::autocast_disabled();
            assert_eq!(linear.forward(&x).unwrap().dtype(), DType::F32, "autocast(enabled=False) runs ops in their inputs' types");
        }
    }
    assert_eq!(dev.memory_allocated(), before + workspaces, "leaving the outermost scope frees the cached copies (cuBLAS keeps its workspaces)");
    assert_eq!(amp::cached_bytes(), 0);
    assert!(!amp::is_autocast_enabled());
}

#[test]
fn bfloat16_autocast_casts_weights_to_two_bytes_once_and_copies_before_softmax() {
    let dev = sim();
    let (linear, x) = layer_and_input(&dev);
    let before = dev.memory_allocated();
    {
        let _autocast = amp::autocast(DType::BF16).unwrap();
        let from = trace_len(&dev);
        let y = linear.forward(&x).unwrap();
        assert_eq!(y.dtype(), DType::BF16, "linear runs in bfloat16");
        // The same casts as float16's: 2 bytes an element, the bias first.
        let made = allocations(&dev, from);
        assert_eq!(
            made,
            [
                ("to", 512 * 2),
                ("to", 512 * 256 * 2),
                ("to", 64 * 256 * 2),
                ("addmm", 64 * 512 * 2),
                ("at::cuda::getNewWorkspace", CUBLAS_WORKSPACE),
                ("at::cuda::getCUDABlasLtWorkspace", CUBLASLT_WORKSPACE)
            ]
            .map(|(op, n)| (op.to_string(), n))
        );
        assert_eq!(amp::cached_bytes(), 512 * 256 * 2 + 512 * 2, "the weight and bias copies are cached");
        let from = trace_len(&dev);
        let again = linear.forward(&x).unwrap();
        assert_eq!(allocations(&dev, from), [("to", 64 * 256 * 2), ("addmm", 64 * 512 * 2)].map(|(op, n)| (op.to_string(), n)), "cached weights");
        // softmax is on the fp32_set_opt_dtype list: ATen's `softmax(input, dim, float32)` reads
        // only a CUDA Half input straight into a float32 result; a bfloat16 one is copied first.
        let from = trace_len(&dev);
        let p = y.softmax(-1).unwrap();
        assert_eq!(p.dtype(), DType::F32);
        assert_eq!(allocations(&dev, from), [("to", 64 * 512 * 4), ("softmax", 64 * 512 * 4)].map(|(op, n)| (op.to_string(), n)));
        drop((y, again, p));
    }
    assert_eq!(dev.memory_allocated(), before + CUBLAS_WORKSPACE + CUBLASLT_WORKSPACE, "leaving the scope frees the cached copies");
    assert_eq!(amp::cached_bytes(), 0);
}

#[test]
fn each_op_runs_in_the_type_autocast_gives_it() {
    let dev = sim();
    let a = dev.randn(&[8, 16], DType::F32).unwrap();
    let h = dev.randn(&[8, 16], DType::F16).unwrap();
    let _autocast = amp::autocast(DType::F16).unwrap();
    let case = |what: &str, program: &dyn Fn() -> Tensor, dtype: DType, allocations_made: &[&str]| {
        let from = trace_len(&dev);
        let out = program();
        assert_eq!(out.dtype(), dtype, "{what}");
        let ops: Vec<String> = allocations(&dev, from).into_iter().map(|(op, _)| op).collect();
        assert_eq!(ops, allocations_made, "{what}: allocations");
    };
    let first_matmul = ["to", "to", "matmul", "at::cuda::getNewWorkspace"];
    case("matmul casts both inputs to f16 (the first also gets cuBLAS's workspace)", &|| a.matmul(&a.t().unwrap()).unwrap(), DType::F16, &first_matmul);
    case("an f16 matmul casts nothing", &|| h.matmul(&h.t().unwrap()).unwrap(), DType::F16, &["matmul"]);
    case("exp is on the float32 list: its f16 input is copied", &|| h.exp().unwrap(), DType::F32, &["to", "exp"]);
    case("softmax reads f16 into a float32 result, without a copy", &|| h.softmax(-1).unwrap(), DType::F32, &["softmax"]);
    case("log_softmax as softmax", &|| h.log_softmax(-1).unwrap(), DType::F32, &["log_softmax"]);
    case("sum gives float32", &|| h.sum(&[1], false).unwrap(), DType::F32, &["sum"]);
    case("mean is on no list and stays f16", &|| h.mean(&[1], false).unwrap(), DType::F16, &["mean"]);
    case("gelu is on no list", &|| h.gelu().unwrap(), DType::F16, &["gelu"]);
    case("f16 + f32 promotes to f32 in one kernel", &|| h.add(&a).unwrap(), DType::F32, &["add"]);
    let scale = dev.full(&[], 2.0, DType::F32).unwrap();
    case("an f32 0-d tensor does not promote an f16 tensor", &|| h.mul(&scale).unwrap(), DType::F16, &["mul"]);
    let (w, b) = (dev.ones(&[16], DType::F32).unwrap(), dev.zeros(&[16], DType::F32).unwrap());
    case("layer_norm casts its f16 input to f32", &|| h.layer_norm(&w, &b, 1e-5).unwrap(), DType::F32, &["to", "layer_norm", "layer_norm", "layer_norm"]);
    case("mse_loss computes in f32", &|| tensormem::nn::mse_loss(&h, &h).unwrap(), DType::F32, &["to", "to", "sub", "pow", "mean"]);
}

#[test]
fn under_autocast_a_linear_layer_saves_its_f16_inputs_and_gives_f32_gradients() {
    let dev = sim();
    let linear = Linear::new(&dev, "fc", 1024, 1024, false, DType::F32).unwrap();
    let x = dev.randn(&[256, 1024], DType::F32).unwrap();
    x.requires_grad_(true).unwrap();
    let before = dev.memory_allocated();
    let loss = {
        let _autocast = amp::autocast(DType::F16).unwrap();
        linear.forward(&x).unwrap().sum(&[], false).unwrap()
    };
    // mm saves its f16 operands: the input's copy (512 KiB) and the weight's (2 MiB), which the
    // graph keeps after the scope dropped its cache.
    assert_eq!(loss.dtype(), DType::F32);
    assert_eq!(dev.memory_allocated(), before + (512 << 10) + (2 << 20) + 512 + CUBLAS_WORKSPACE);
    loss.backward().unwrap();
    let (gw, gx) = (linear.weight.grad().unwrap(), x.grad().unwrap());
    assert_eq!((gw.dtype(), gx.dtype()), (DType::F32, DType::F32), "ToCopyBackward0 returns each gradient in its leaf's type");
    drop(loss);
    assert_eq!(
        dev.memory_allocated(),
        before + (4 << 20) + (1 << 20) + 2 * CUBLAS_WORKSPACE,
        "the f16 copies are gone; the f32 gradients remain (and the workspaces of the main thread and autograd's)"
    );
}

#[test]
fn under_autocast_cross_entropy_keeps_f16_log_probabilities_and_an_f32_copy() {
    let dev = sim();
    let logits = dev.randn(&[512, 512], DType::F16).unwrap();
    logits.requires_grad_(true).unwrap();
    let targets = dev.zeros(&[512], DType::I64).unwrap();
    let before = dev.memory_allocated();
    let from = trace_len(&dev);
    let loss = {
        let _autocast = amp::autocast(DType::F16).unwrap();
        tensormem::nn::cross_entropy(&logits, &targets).unwrap()
    };
    // log_softmax is given the logits' dtype (f16) explicitly, so autocast leaves it; nll_loss
    // is on the float32 list and copies the log-probabilities, then writes the loss and
    // total_weight.
    let made = allocations(&dev, from);
    assert_eq!(made, [("log_softmax", 512 << 10), ("to", 1 << 20), ("nll_loss", 4), ("nll_loss", 4)].map(|(op, n)| (op.to_string(), n)));
    assert_eq!(loss.dtype(), DType::F32);
    assert_eq!(
        dev.memory_allocated(),
        before + (512 << 10) + (1 << 20) + 512 + 512,
        "6 bytes per logit: LogSoftmaxBackward0 keeps the f16 result, NllLossBackward0 the f32 copy and total_weight"
    );
    loss.backward().unwrap();
    drop(loss);
    assert_eq!(logits.grad().unwrap().dtype(), DType::F16);
    assert_eq!(dev.memory_allocated(), before + (512 << 10), "only the f16 gradient remains");
}

#[test]
fn an_f16_input_gets_its_gradient_in_f16() {
    let dev = sim();
    let h = dev.randn(&[512, 512], DType::F16).unwrap();
    h.requires_grad_(true).unwrap();
    let a = dev.randn(&[512, 512], DType::F32).unwrap();
    // f16 + f32 is f32; the engine converts the f32 gradient for h (as PyTorch's validate_outputs).
    h.add(&a).unwrap().sum(&[], false).unwrap().backward().unwrap();
    assert_eq!(h.grad().unwrap().dtype(), DType::F16);
}

#[test]
fn the_grad_scaler_keeps_two_scalars_and_frees_its_step_temporaries() {
    let dev = sim();
    let model = Transformer::new(
        &dev,
        TransformerConfig {
            architecture: Architecture::Llama,
            vocab: 96,
            context: 16,
            dim: 32,
            layers: 2,
            heads: 4,
            hidden: 64,
            dropout: 0.0,
            dtype: DType::F32,
        },
    )
    .unwrap();
    let ids = dev.from_slice(&(0..32).map(|i| i % 96).collect::<Vec<i64>>(), &[2, 16]).unwrap();
    let targets = dev.from_slice(&(0..32).map(|i| (i + 1) % 96).collect::<Vec<i64>>(), &[2, 16]).unwrap();
    let mut optimizer = Adam::adamw(model.parameters(), 1e-3, 0.01);
    let mut scaler = GradScaler::new();
    for step in 0..2 {
        optimizer.zero_grad(true).unwrap();
        let loss = {
            let _autocast = amp::autocast(DType::F16).unwrap();
            model.loss(&ids, &targets, true).unwrap()
        };
        let from = trace_len(&dev);
        let scaled = scaler.scale(&loss).unwrap();
        let made = allocations(&dev, from);
        let expected: &[&str] = if step == 0 { &["full", "full", "mul"] } else { &["mul"] };
        assert_eq!(made.iter().map(|(op, _)| op.as_str()).collect::<Vec<_>>(), expected, "step {step}: the scale and tracker are made once");
        scaled.backward().unwrap();
        drop((scaled, loss));
        let params = model.parameters();
        assert!(params.iter().all(|p| p.grad().unwrap().dtype() == DType::F32), "gradients arrive in the master weights' type");
        let before_step = dev.memory_allocated();
        let from = trace_len(&dev);
        assert!(pollster::block_on(scaler.step(&mut optimizer)).unwrap(), "the sim device has no infs: the optimizer steps");
        pollster::block_on(scaler.update()).unwrap();
        let ops: Vec<String> = allocations(&dev, from).into_iter().map(|(op, _)| op).collect();
        // `_scale.double().reciprocal().float()`, found_inf, and the per-device copies of found_inf
        // and inv_scale the unscale kernel gets; then the optimizer's.
        assert_eq!(ops[..6], ["to", "reciprocal", "to", "full", "to", "to"], "step {step}");
        let state = if step == 0 { params.iter().map(|p| 2 * rounded(p.storage_bytes())).sum::<u64>() } else { 0 };
        assert_eq!(dev.memory_allocated(), before_step + state, "step {step}: unscaling frees what it made; only Adam's state stays");
    }
    assert_eq!(scaler.get_scale(), 65536.0);
    assert!(pollster::block_on(scaler.update()).is_err(), "update without a step since the last one");
    // An optimizer whose parameters have no gradients: nothing to check, and PyTorch's assert.
    let idle = dev.zeros(&[4], DType::F32).unwrap();
    idle.requires_grad_(true).unwrap();
    let mut idle = tensormem::optim::Sgd::new(vec![idle], 0.1, 0.0, 0.0);
    let e = pollster::block_on(scaler.step(&mut idle)).unwrap_err().to_string();
    assert!(e.contains("No inf checks were recorded for this optimizer."), "{e}");
}
