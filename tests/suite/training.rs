//! Autograd against finite differences, a training step on the GPU as on the sim device,
//! autocast and the grad scaler, CUDA graphs and memory pools.

use super::*;

/// Every differentiable op's gradients against central finite differences, on random inputs
/// (kept away from relu's kink) of small shapes, broadcasting and views included.
pub async fn gradients_match_finite_differences(dev: &Device) {
    type Program = fn(&Tensor, &Tensor) -> Tensor;
    let cases: [(&str, &[usize], &[usize], Program); 33] = [
        ("one gradient reaching a tensor by two views", &[3, 4], &[4], |a, b| {
            let y = a.mul(b).unwrap();
            y.view(&[-1]).unwrap().add(&y.t().unwrap().reshape(&[-1]).unwrap().exp().unwrap()).unwrap()
        }),
        ("add, broadcast", &[3, 4], &[4], |a, b| a.add(b).unwrap()),
        ("sub, broadcast over a size-1 dim", &[3, 4], &[3, 1], |a, b| a.sub(b).unwrap()),
        ("mul, broadcast over a leading dim", &[2, 3, 4], &[3, 4], |a, b| a.mul(b).unwrap()),
        ("div", &[3, 4], &[3, 4], |a, b| a.div(&b.exp().unwrap()).unwrap()),
        ("exp, neg and scalar arithmetic", &[3, 4], &[1], |a, b| {
            a.exp().unwrap().neg().unwrap().mul_scalar(0.5).unwrap().add_scalar(1.0).unwrap().sub_scalar(0.25).unwrap().div_scalar(2.0).unwrap().mul(b).unwrap()
        }),
        ("relu", &[3, 4], &[4], |a, b| a.relu().unwrap().mul(b).unwrap()),
        ("matmul", &[3, 4], &[4, 5], |a, b| a.matmul(b).unwrap()),
        ("matmul, broadcast batches (copied operands)", &[2, 1, 3, 4], &[3, 4, 2], |a, b| a.matmul(b).unwrap()),
        ("matmul, a stack of matrices times a matrix (folded)", &[2, 3, 4], &[4, 2], |a, b| a.matmul(b).unwrap()),
        ("matmul, vector times a batch", &[4], &[3, 4, 2], |a, b| a.matmul(b).unwrap()),
        ("views", &[3, 4], &[4, 3], |a, b| {
            let v = a.t().unwrap().mul(b).unwrap().reshape(&[2, 6]).unwrap().unsqueeze(0).unwrap().expand(&[2, 2, 6]).unwrap();
            // contiguous(), not clone(): a clone keeps the permuted layout, which no view flattens
            // (PyTorch refuses that view too).
            v.permute(&[2, 0, 1]).unwrap().contiguous().unwrap().view(&[6, 4]).unwrap().transpose(0, 1).unwrap().squeeze(None).unwrap()
        }),
        ("sum and mean over dims", &[2, 3, 4], &[3], |a, b| {
            a.mean(&[0], false).unwrap().sum(&[1], true).unwrap().squeeze(Some(1)).unwrap().mul(b).unwrap().sum(&[], false).unwrap()
        }),
        ("tanh, sigmoid", &[3, 4], &[4], |a, b| a.tanh().unwrap().add(&b.sigmoid().unwrap()).unwrap()),
        ("gelu, silu", &[3, 4], &[4], |a, b| a.gelu().unwrap().mul(&b.silu().unwrap()).unwrap()),
        ("log, sqrt, rsqrt, abs (positive inputs)", &[3, 4], &[4], |a, b| {
            let pos = a.abs().unwrap().add_scalar(0.5).unwrap();
            pos.log().unwrap().add(&pos.sqrt().unwrap()).unwrap().mul(&b.abs().unwrap().add_scalar(0.5).unwrap().rsqrt().unwrap()).unwrap()
        }),
        ("pow with a scalar", &[3, 4], &[4], |a, b| a.pow_scalar(3.0).unwrap().add(&b.pow_scalar(2.0).unwrap()).unwrap()),
        ("clamp", &[3, 4], &[4], |a, b| a.clamp_min(-0.5).unwrap().clamp_max(0.5).unwrap().mul(b).unwrap()),
        ("softmax over the last dim", &[3, 5], &[5], |a, b| a.add(b).unwrap().softmax(-1).unwrap()),
        ("softmax over a middle dim, transposed input", &[4, 3], &[3, 1], |a, b| a.t().unwrap().mul(b).unwrap().unsqueeze(0).unwrap().softmax(1).unwrap()),
        ("log_softmax", &[2, 3, 4], &[4], |a, b| a.mul(b).unwrap().log_softmax(-1).unwrap()),
        ("layer_norm: input and weight", &[2, 3, 4], &[4], |a, b| {
            let bias = b.mul_scalar(0.5).unwrap();
            a.layer_norm(b, &bias, 1e-5).unwrap()
        }),
        ("add with alpha, broadcast", &[3, 4], &[4], |a, b| a.add_alpha(b, -2.5).unwrap()),
        ("cat, narrow, select", &[3, 4], &[2, 4], |a, b| {
            let c = Tensor::cat(&[a, &b.exp().unwrap(), a], 0).unwrap();
            c.narrow(0, 1, 5).unwrap().mul(&c.select(0, 2).unwrap()).unwrap()
        }),
        ("index_select with repeated indices", &[4, 3], &[3], |a, b| {
            let idx = a.device().from_slice(&[2i64, 0, 2, 3, 2], &[5]).unwrap();
            a.index_select(0, &idx).unwrap().mul(b).unwrap()
        }),
        ("embedding", &[5, 3], &[3], |a, b| {
            let ids = a.device().from_slice(&[1i64, 4, 1, 0, 1, 3], &[2, 3]).unwrap();
            a.embedding(&ids).unwrap().mul(b).unwrap()
        }),
        ("max over a dim, values and indices", &[3, 4], &[3], |a, b| {
            let (values, indices) = a.max_dim(-1, false).unwrap();
            assert_eq!(indices.dtype(), DType::I64);
            values.mul(b).unwrap()
        }),
        ("max over a dim, keepdim", &[3, 4], &[4], |a, b| a.sub(&a.max_dim(0, true).unwrap().0).unwrap().mul(b).unwrap()),
        ("in-place add_, sub_, mul_scalar_, exp_ and relu_ on intermediates", &[3, 4], &[4], |a, b| {
            let y = a.mul(b).unwrap();
            // (exp_ and relu_ save their result: nothing may write y after them, as in PyTorch.)
            y.add_(b).unwrap().mul_scalar_(2.0).unwrap().sub_(a).unwrap().sub_scalar_(0.5).unwrap().exp_().unwrap();
            // Where relu_ keeps everything (its kink is checked out of place above).
            let z = y.mul(a).unwrap().mul(a).unwrap().mul(&y).unwrap().add_scalar(0.1).unwrap();
            z.relu_().unwrap();
            z
        }),
        ("checkpoint: recomputed in backward", &[3, 4], &[4], |a, b| tensormem::autograd::checkpoint(|t| t[0].mul(&t[1])?.tanh()?.exp(), &[a, b]).unwrap()),
        ("where", &[3, 4], &[4], |a, b| a.gt(&b.mul_scalar(0.0).unwrap()).unwrap().where_(&a.exp().unwrap(), b).unwrap()),
        ("gather along the last dim, a class picked twice", &[3, 4], &[4], |a, b| {
            let idx = a.device().from_slice(&[3i64, 3, 1, 0, 2, 2], &[3, 2]).unwrap();
            a.mul(b).unwrap().gather(-1, &idx).unwrap()
        }),
        ("cross_entropy (log_softmax, nll_loss) with an ignored row", &[3, 4], &[4], |a, b| {
            let targets = a.device().from_slice(&[3i64, -100, 0], &[3]).unwrap();
            tensormem::nn::cross_entropy(&a.mul(b).unwrap(), &targets).unwrap()
        }),
    ];
    let mut rng = Rng(17);
    // Away from zero: relu has a kink there.
    let mut values = |n: usize| rng.f32s(n).into_iter().map(|v| if v.abs() < 0.1 { v + 0.2 } else { v }).collect::<Vec<f32>>();
    for (what, a_shape, b_shape, program) in cases {
        let (a_data, b_data) = (values(a_shape.iter().product()), values(b_shape.iter().product()));
        let a = dev.from_slice(&a_data, a_shape).unwrap();
        let b = dev.from_slice(&b_data, b_shape).unwrap();
        a.requires_grad_(true).unwrap();
        b.requires_grad_(true).unwrap();
        // A random weighting makes every output element count differently.
        let out_shape = {
            let _no_grad = tensormem::autograd::no_grad();
            program(&a, &b).shape().to_vec()
        };
        let weights = values(out_shape.iter().product());
        let w = dev.from_slice(&weights, &out_shape).unwrap();
        let loss = |a: &Tensor, b: &Tensor| program(a, b).mul(&w).unwrap().sum(&[], false).unwrap();
        loss(&a, &b).backward().unwrap();
        let (ga, gb) = (read::<f32>(&a.grad().unwrap()).await, read::<f32>(&b.grad().unwrap()).await);
        let _no_grad = tensormem::autograd::no_grad();
        let eps = 1e-2f32;
        for (which, data, shape, analytic) in [("a", &a_data, a_shape, &ga), ("b", &b_data, b_shape, &gb)] {
            for i in 0..data.len() {
                let at = |delta: f32| {
                    let mut moved = data.clone();
                    moved[i] += delta;
                    let t = dev.from_slice(&moved, shape).unwrap();
                    if which == "a" { loss(&t, &b) } else { loss(&a, &t) }
                };
                let (up, down) = (read::<f32>(&at(eps)).await[0], read::<f32>(&at(-eps)).await[0]);
                let numeric = (up - down) / (2.0 * eps);
                let tol = 2e-2 * (1.0 + numeric.abs());
                assert!((analytic[i] - numeric).abs() <= tol, "{what}: d loss / d {which}[{i}]: autograd {} vs finite differences {numeric}", analytic[i]);
            }
        }
    }
    // A checkpointed dropout replays the forward's mask in backward: d sum(dropout(x)) / dx is
    // mask * scale, so grad * x equals the output everywhere.
    let data: Vec<f32> = (1..=64).map(|i| i as f32 / 8.0).collect();
    let x = dev.from_slice(&data, &[64]).unwrap();
    x.requires_grad_(true).unwrap();
    let out = tensormem::autograd::checkpoint(|t| t[0].dropout(0.5, true), &[&x]).unwrap();
    out.sum(&[], false).unwrap().backward().unwrap();
    let (out, grad) = (read::<f32>(&out).await, read::<f32>(&x.grad().unwrap()).await);
    assert!(out.contains(&0.0) && out.iter().any(|&v| v != 0.0), "dropout dropped some: {out:?}");
    for i in 0..64 {
        assert!((grad[i] * data[i] - out[i]).abs() < 1e-5, "element {i}: gradient {} against the forward's output {}", grad[i], out[i]);
    }
}

/// A small transformer's training steps (zero_grad, forward, loss, backward, AdamW) allocate
/// and free the same sizes in the same order, with the same op, module scope and category, on
/// the GPU and on the sim device; and the GPU's loss is finite and falls.
pub async fn a_training_step_allocates_on_the_gpu_as_on_the_sim_device(dev: &Device) {
    use tensormem::amp;
    use tensormem::nn::{Architecture, Module, Transformer, TransformerConfig};
    use tensormem::optim::{Adam, GradScaler, Optimizer};
    use tensormem::trace::Action;
    let sim = Device::sim(SimOptions::preset("H100-80GB"));
    // (architecture, mixed precision: autocast to f16 with a gradient scaler)
    let runs = [(Architecture::Llama, false), (Architecture::Gpt2, false), (Architecture::Llama, true), (Architecture::Gpt2, true)];
    let mut recorded = Vec::new();
    for d in [dev, &sim] {
        for (architecture, mixed) in runs {
            let config = TransformerConfig { architecture, vocab: 40, context: 12, dim: 16, layers: 2, heads: 2, hidden: 32, dropout: 0.1, dtype: DType::F32 };
            let model = Transformer::new(d, config).unwrap();
            let mut optimizer = Adam::adamw(model.parameters(), 1e-2, 0.01);
            // A modest scale: an overflow would skip the GPU's step but not the sim device's.
            let mut scaler = GradScaler::with_init_scale(1024.0);
            let ids: Vec<i64> = (0..2 * 12).map(|i| (i * 5 % 40) as i64).collect();
            let targets: Vec<i64> = (0..2 * 12).map(|i| ((i * 5 + 1) % 40) as i64).collect();
            let (ids, targets) = (d.from_slice(&ids, &[2, 12]).unwrap(), d.from_slice(&targets, &[2, 12]).unwrap());
            let start = d.snapshot().device_traces[0].len();
            let mut losses = Vec::new();
            for _ in 0..3 {
                optimizer.zero_grad(true).unwrap();
                let loss = if mixed {
                    let _autocast = amp::autocast(DType::F16).unwrap();
                    model.loss(&ids, &targets, true).unwrap()
                } else {
                    model.loss(&ids, &targets, true).unwrap()
                };
                if mixed {
                    scaler.scale(&loss).unwrap().backward().unwrap();
                    assert!(scaler.step(&mut optimizer).await.unwrap(), "{architecture:?}: no overflow at scale 1024");
                    scaler.update().await.unwrap();
                } else {
                    loss.backward().unwrap();
                    optimizer.step().unwrap();
                }
                if !d.is_sim() {
                    losses.push(loss.item::<f32>().await.unwrap());
                }
            }
            let what = format!("{architecture:?}{}", if mixed { " with autocast" } else { "" });
            if !d.is_sim() {
                assert!(losses.iter().all(|l| l.is_finite()) && losses[2] < losses[0], "{what}: the loss falls: {losses:?}");
            }
            let snapshot = d.snapshot();
            let events: Vec<_> = snapshot.device_traces[0]
                .range(start..)
                .filter(|e| matches!(e.action, Action::Alloc | Action::FreeRequested))
                .map(|e| {
                    let frames = e.frames.as_ref().map(|f| f.iter().map(|f| f.name.clone()).collect::<Vec<_>>());
                    (e.action, e.size, frames, e.category)
                })
                .collect();
            recorded.push((what, events));
        }
    }
    let (gpu, sim) = recorded.split_at(runs.len());
    for ((what, g), (_, s)) in gpu.iter().zip(sim) {
        assert!(g.len() > 300, "{what}: {} events", g.len());
        for (i, (a, b)) in g.iter().zip(s).enumerate() {
            assert_eq!(a, b, "{what}: event {i} differs between the GPU and the sim device");
        }
        assert_eq!(g.len(), s.len(), "{what}");
    }
}

/// Mixed-type arithmetic promotes as PyTorch's does, autocast's f16 matmul and f32 softmax
/// compute the right values, and the gradient scaler unscales in place, steps, and skips a
/// step (halving the scale) when a gradient holds an inf.
pub async fn autocast_mixed_types_and_the_grad_scaler(dev: &Device) {
    use tensormem::amp;
    use tensormem::optim::{GradScaler, Sgd};
    let mut rng = Rng(0xa3c5);
    let (a, b) = (rng.f32s(12), rng.f32s(12));
    let h = dev.from_slice(&a, &[3, 4]).unwrap().to(DType::F16).unwrap();
    let f = dev.from_slice(&b, &[3, 4]).unwrap();
    let a16: Vec<f32> = a.iter().map(|&x| half::f16::from_f32(x).to_f32()).collect();
    let sum = h.add(&f).unwrap();
    assert_eq!(sum.dtype(), DType::F32);
    close(&read::<f32>(&sum).await, &a16.iter().zip(&b).map(|(x, y)| x + y).collect::<Vec<_>>(), 1e-6, "f16 + f32");
    // f16 stores of infinities and overflow, packed or native: what a causal mask and a scaled
    // loss rely on.
    let mask = h.gt(&dev.zeros(&[], DType::F16).unwrap()).unwrap();
    let masked = read::<f32>(&h.masked_fill(&mask, f64::NEG_INFINITY).unwrap().to(DType::F32).unwrap()).await;
    let expected: Vec<f32> = a16.iter().map(|&x| if x > 0.0 { f32::NEG_INFINITY } else { x }).collect();
    assert_eq!(masked, expected, "masked_fill(-inf) in f16");
    let big = dev.from_slice(&[1000.0f32, -1000.0, 0.5], &[3]).unwrap().to(DType::F16).unwrap().mul_scalar(100.0).unwrap();
    assert_eq!(read::<f32>(&big.to(DType::F32).unwrap()).await, [f32::INFINITY, f32::NEG_INFINITY, 50.0], "f16 overflow is inf");
    let into_half = h.to(DType::F16).unwrap().clone().unwrap();
    into_half.add_(&f).unwrap();
    close(&read::<f32>(&into_half.to(DType::F32).unwrap()).await, &a16.iter().zip(&b).map(|(x, y)| x + y).collect::<Vec<_>>(), 1e-3, "f16 += f32");
    {
        let _autocast = amp::autocast(DType::F16).unwrap();
        let x = dev.from_slice(&a, &[3, 4]).unwrap();
        let w = dev.from_slice(&b, &[4, 3]).unwrap();
        let y = x.matmul(&w).unwrap();
        assert_eq!(y.dtype(), DType::F16);
        let reference: Vec<f32> = (0..9).map(|i| (0..4).map(|k| a[i / 3 * 4 + k] * b[k * 3 + i % 3]).sum()).collect();
        close(&read::<f32>(&y.to(DType::F32).unwrap()).await, &reference, 1e-2, "autocast matmul");
        let p = y.softmax(-1).unwrap();
        assert_eq!(p.dtype(), DType::F32);
        let rows: Vec<f32> = read::<f32>(&p).await.chunks(3).map(|r| r.iter().sum()).collect();
        close(&rows, &[1.0; 3], 1e-5, "autocast softmax rows sum to 1");
    }
    let p = dev.from_slice(&[1.0f32, 2.0, 3.0, 4.0], &[4]).unwrap();
    p.requires_grad_(true).unwrap();
    let mut sgd = Sgd::new(vec![p.share()], 0.1, 0.0, 0.0);
    let mut scaler = GradScaler::with_init_scale(8.0);
    scaler.scale(&p.mul(&p).unwrap().sum(&[], false).unwrap()).unwrap().backward().unwrap();
    close(&read::<f32>(&p.grad().unwrap()).await, &[16.0, 32.0, 48.0, 64.0], 0.0, "the scaled gradient");
    assert!(scaler.step(&mut sgd).await.unwrap());
    close(&read::<f32>(&p.grad().unwrap()).await, &[2.0, 4.0, 6.0, 8.0], 0.0, "unscaled in place");
    close(&read::<f32>(&p).await, &[0.8, 1.6, 2.4, 3.2], 1e-6, "stepped");
    scaler.update().await.unwrap();
    assert_eq!(scaler.get_scale(), 8.0);
    p.set_grad(Some(dev.from_slice(&[f32::INFINITY, 1.0, 1.0, 1.0], &[4]).unwrap()));
    assert!(!scaler.step(&mut sgd).await.unwrap(), "an inf gradient skips the step");
    close(&read::<f32>(&p).await, &[0.8, 1.6, 2.4, 3.2], 1e-6, "the parameters are untouched");
    scaler.update().await.unwrap();
    assert_eq!(scaler.get_scale(), 4.0, "the scale backs off");
    let scale = scaler.scale(&dev.ones(&[], DType::F32).unwrap()).unwrap();
    assert_eq!(read::<f32>(&scale).await, [4.0], "the device's scale follows");
}

/// A CUDA graph's capture and a MemPool's scope on this device: the kernels run as ever, their
/// outputs come from the pool (a segment of its own, as PyTorch's `segment_pool_id` shows), and
/// the pool's memory goes back once nothing uses it and the cache is emptied.
pub async fn graphs_and_mem_pools_allocate_from_pools_of_their_own(dev: &Device) {
    let pools = |dev: &Device| {
        let mut ids: Vec<(i64, i64)> = dev.snapshot().segments.iter().map(|s| s.segment_pool_id).collect();
        ids.sort();
        ids
    };
    let data: Vec<f32> = (0..256 * 256).map(|i| (i % 97) as f32).collect();
    let x = dev.from_slice(&data, &[256, 256]).unwrap();
    drop(x.add(&x).unwrap());
    let reserved = dev.memory_reserved();
    assert_eq!(pools(dev), [(0, 0)]);
    let capture = dev.capture_graph(None).unwrap();
    let doubled = x.add(&x).unwrap();
    let graph = capture.end().unwrap();
    assert_eq!(graph.pool(), (1, 0));
    assert_eq!(dev.memory_reserved(), reserved + (2 << 20), "a small segment of the graph's own, not the default pool's cached block");
    assert_eq!(pools(dev), [(0, 0), (1, 0)]);
    assert_eq!(read::<f32>(&doubled).await, data.iter().map(|v| v * 2.0).collect::<Vec<_>>());
    assert_eq!(dev.private_pools(), [((1, 0), 1)]);
    drop(doubled);
    dev.empty_cache();
    assert_eq!(dev.memory_reserved(), reserved + (2 << 20), "the graph still uses its pool");
    drop(graph);
    dev.empty_cache();
    assert_eq!(dev.memory_reserved(), reserved);
    assert!(dev.private_pools().is_empty());

    let pool = dev.mem_pool().unwrap();
    let squared = {
        let _scope = dev.use_mem_pool(&pool).unwrap();
        x.mul(&x).unwrap()
    };
    assert_eq!(pool.id(), (0, 1));
    assert_eq!(pools(dev), [(0, 0), (0, 1)]);
    assert_eq!(read::<f32>(&squared).await, data.iter().map(|v| v * v).collect::<Vec<_>>());
    drop(squared);
    drop(pool);
    assert_eq!(dev.memory_reserved(), reserved, "dropping a MemPool empties its cache");
    assert_eq!(pools(dev), [(0, 0)]);
}
