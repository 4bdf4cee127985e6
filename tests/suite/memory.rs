//! Memory facts exact to the byte, buffers reused under pending work, bad input refused, the sim
//! device agreeing with the GPU, and the remaining ops (comparisons, softmax, cat, embedding...).

use super::*;

pub async fn exact_memory_facts(dev: &Device) {
    let x = dev.zeros(&[1000, 1000], DType::F32).unwrap();
    assert_eq!(dev.memory_allocated(), 4_000_256, "4,000,000 bytes rounded to 512");
    assert_eq!(dev.memory_reserved(), 20 << 20, "from one 20 MiB segment");
    let before = dev.memory_allocated();
    let v = x.t().unwrap().narrow(0, 10, 100).unwrap().unsqueeze(0).unwrap();
    assert_eq!(dev.memory_allocated(), before, "views allocate nothing");
    assert_eq!(v.storage_id(), x.storage_id());
    assert_eq!(v.data_ptr(), x.data_ptr() + 10 * 4);
    let y = dev.ones(&[1000, 1000], DType::F32).unwrap();
    let allocated = dev.memory_allocated();
    let z = x.add(&y).unwrap();
    assert_eq!(dev.memory_allocated(), allocated + 4_000_256, "x + y allocates exactly one output");
    z.add_(&y).unwrap();
    assert_eq!(dev.memory_allocated(), allocated + 4_000_256, "add_ allocates nothing");
    let c = x.t().unwrap().contiguous().unwrap();
    assert_eq!(dev.memory_allocated(), allocated + 2 * 4_000_256, "contiguous() of a transpose copies");
    assert_ne!(c.storage_id(), x.storage_id());
    let same = x.contiguous().unwrap();
    assert_eq!(same.storage_id(), x.storage_id(), "contiguous() of a contiguous tensor is itself");
    drop((z, c));
    assert_eq!(dev.memory_allocated(), allocated);
    assert_eq!(read::<f32>(&y.sum(&[], false).unwrap()).await, vec![1_000_000.0]);
}

pub async fn a_freed_block_reused_for_an_upload_does_not_corrupt_pending_work(dev: &Device) {
    // x's block is read by a recorded (unsubmitted) op; x is then freed and a new upload of the
    // same size takes its block. WebGPU runs write_buffer before commands submitted after it, so
    // without a submit first the pending op would read the new data.
    let x = dev.from_slice(&[1.0f32; 256], &[256]).unwrap();
    let x_ptr = x.data_ptr();
    let y = x.mul_scalar(2.0).unwrap();
    drop(x);
    let z = dev.from_slice(&[7.0f32; 256], &[256]).unwrap();
    assert_eq!(z.data_ptr(), x_ptr, "the upload reuses the freed block (the hazard's precondition)");
    assert_eq!(read::<f32>(&y).await, vec![2.0; 256]);
    assert_eq!(read::<f32>(&z).await, vec![7.0; 256]);
}

pub async fn operands_in_one_segment_bind_without_validation_errors(dev: &Device) {
    // Three small tensors share one 2 MiB segment, i.e. one wgpu buffer, in a single dispatch.
    let a = dev.from_slice(&[1.0f32, 2.0, 3.0], &[3]).unwrap();
    let b = dev.from_slice(&[10.0f32, 20.0, 30.0], &[3]).unwrap();
    let reserved = dev.memory_reserved();
    let c = a.add(&b).unwrap();
    assert_eq!(dev.memory_reserved(), reserved, "same segment");
    assert_eq!(read::<f32>(&c).await, vec![11.0, 22.0, 33.0]);
    // In-place on a view of the same storage as the other operand.
    a.add_(&a).unwrap();
    assert_eq!(read::<f32>(&a).await, vec![2.0, 4.0, 6.0]);
    // The same tensor twice in one dispatch: bound once (Dawn rejects overlapping writable bindings).
    let m = dev.from_slice(&[1.0f32, 2.0, 3.0, 4.0, 5.0, 6.0], &[2, 3]).unwrap();
    assert_eq!(read::<f32>(&m.matmul(&m.t().unwrap()).unwrap()).await, vec![14.0, 32.0, 32.0, 77.0]);
}

pub async fn the_sim_device_records_the_same_trace_as_the_gpu(gpu_dev: &Device) {
    type Program = fn(&Device);
    // An MLP step with temporaries, an attention block, token bookkeeping with int64 ids, and
    // reductions long enough for PyTorch to split them (a buffer and semaphores each).
    let programs: [(&str, Program); 4] = [
        ("long reductions", |dev| {
            let x = dev.ones(&[512, 1024], DType::F32).unwrap();
            let _total = x.sum(&[], false).unwrap();
            let _columns = x.view(&[16_384, 32]).unwrap().mean(&[0], false).unwrap();
            let _peak = x.to(DType::F16).unwrap().max(&[], false).unwrap();
        }),
        ("mlp", |dev| {
            let x = dev.ones(&[300, 500], DType::F32).unwrap();
            let w = dev.ones(&[500, 200], DType::F32).unwrap();
            let h = x.matmul(&w).unwrap().relu().unwrap();
            let loss = h.mul(&h).unwrap().mean(&[0, 1], false).unwrap();
            let t = x.t().unwrap().contiguous().unwrap();
            drop((h, t));
            drop((x, w, loss));
        }),
        ("attention", |dev| {
            let x = dev.randn(&[2, 16, 64], DType::F32).unwrap();
            let (wg, bg) = (dev.ones(&[64], DType::F32).unwrap(), dev.zeros(&[64], DType::F32).unwrap());
            let h = x.layer_norm(&wg, &bg, 1e-5).unwrap();
            let q = h.narrow(2, 0, 32).unwrap();
            let k = h.narrow(2, 32, 32).unwrap();
            let scores = q.matmul(&k.transpose(1, 2).unwrap()).unwrap().mul_scalar(0.17).unwrap();
            let probs = scores.softmax(-1).unwrap();
            let out = probs.matmul(&k).unwrap();
            drop((scores, probs));
            let _ = out.add(&q).unwrap();
        }),
        ("tokens", |dev| {
            let table = dev.rand(&[100, 24], DType::F32).unwrap();
            let ids = dev.arange(12, DType::I64).unwrap().view(&[3, 4]).unwrap();
            let e = table.embedding(&ids).unwrap();
            let both = Tensor::cat(&[&e, &e], 1).unwrap();
            let mask = both.gt(&dev.full(&[24], 0.5, DType::F32).unwrap()).unwrap();
            let kept = mask.where_(&both, &dev.zeros(&[1], DType::F32).unwrap()).unwrap();
            let _best = kept.argmax(-1, false).unwrap();
            let _v = kept.var(1, 1.0, true).unwrap().to(DType::F16).unwrap();
        }),
    ];
    // Both devices with their cuBLAS workspaces made, whatever ran on the GPU device before.
    make_cublas_workspaces(gpu_dev);
    for (name, program) in programs {
        let sim_dev = Device::sim(SimOptions::preset("H100-80GB"));
        make_cublas_workspaces(&sim_dev);
        let before = gpu_dev.snapshot().device_traces[0].len();
        program(gpu_dev);
        let on_gpu: Vec<_> = gpu_dev.snapshot().device_traces[0].range(before..).map(|e| (e.action, e.size)).collect();
        let before = sim_dev.snapshot().device_traces[0].len();
        program(&sim_dev);
        let on_sim: Vec<_> = sim_dev.snapshot().device_traces[0].range(before..).map(|e| (e.action, e.size)).collect();
        // The sim device starts empty, so it may allocate segments the GPU device had cached:
        // compare the tensor allocations and frees, which are the program's own.
        let tensors = |t: &[(tensormem::trace::Action, u64)]| {
            t.iter().filter(|(a, _)| matches!(a, tensormem::trace::Action::Alloc | tensormem::trace::Action::FreeRequested)).cloned().collect::<Vec<_>>()
        };
        assert_eq!(tensors(&on_gpu), tensors(&on_sim), "{name}");
        assert!(tensors(&on_sim).len() > 10, "{name}");
    }
    let sim_dev = Device::sim(SimOptions::preset("H100-80GB"));
    assert!(sim_dev.ones(&[2], DType::F32).unwrap().to_vec::<f32>().await.unwrap_err().to_string().contains("simulation device"));
}

pub async fn clear_errors_for_bad_input(dev: &Device) {
    let x = dev.ones(&[2, 3], DType::F32).unwrap();
    let i = dev.from_slice(&[1i32, 2, 3], &[3]).unwrap();
    // Mixed types promote as in PyTorch (float32 + int32 is float32); matmul refuses them.
    assert_eq!(read::<f32>(&x.add(&i.view(&[1, 3]).unwrap()).unwrap()).await, [2.0, 3.0, 4.0, 2.0, 3.0, 4.0]);
    assert!(x.matmul(&x.t().unwrap().to(DType::F16).unwrap()).unwrap_err().to_string().contains("matmul of float32 and float16"));
    assert!(x.add(&dev.ones(&[4], DType::F32).unwrap()).unwrap_err().to_string().contains("cannot broadcast"));
    assert!(x.view(&[4, -1]).unwrap_err().to_string().contains("invalid for 6 elements"));
    assert!(dev.from_slice(&[1.0f32; 5], &[2, 3]).unwrap_err().to_string().contains("cannot fill"));
    let before = dev.memory_allocated();
    assert!(dev.zeros(&[2], DType::F64).unwrap_err().to_string().contains("memory accounting only"));
    assert_eq!(dev.memory_allocated(), before, "the failed op's output was freed");
    assert!(x.to_vec::<i32>().await.unwrap_err().to_string().contains("to_vec::<int32> of a float32 tensor"));
    let limit = dev.adapter().unwrap().max_storage_buffer_binding_size;
    let too_big = dev.zeros(&[(limit / 4 + 1) as usize], DType::F32).unwrap_err().to_string();
    assert!(too_big.contains("max_storage_buffer_binding_size"), "{too_big}");
}

pub async fn comparisons_where_casts_and_addcmul(dev: &Device) {
    let mut rng = Rng(2024);
    // 5x7: bool outputs pack four to a word, so rows straddle words.
    let (x, xb) = random_view(dev, &mut rng, &[5, 7]);
    let (y, yb) = random_view(dev, &mut rng, &[7]);
    let xv = gather(&xb, x.layout());
    let yv = gather(&yb, &y.layout().expand(&[5, 7]).unwrap());
    let mask = x.gt(&y).unwrap();
    assert_eq!(mask.dtype(), DType::Bool);
    assert_eq!(mask.storage_bytes(), 35, "one byte per element, as in PyTorch");
    let picked = mask.where_(&x, &y).unwrap();
    let expected: Vec<f32> = xv.iter().zip(&yv).map(|(&a, &b)| if a > b { a } else { b }).collect();
    assert_eq!(read::<f32>(&picked).await, expected);
    assert_eq!(read::<f32>(&x.maximum(&y).unwrap()).await, expected);
    // A bool mask read back through a cast, and an int round trip that truncates toward zero.
    let as_int = mask.to(DType::I32).unwrap();
    assert_eq!(read::<i32>(&as_int).await, xv.iter().zip(&yv).map(|(a, b)| (a > b) as i32).collect::<Vec<_>>());
    let scaled = x.mul_scalar(10.0).unwrap().to(DType::I32).unwrap();
    assert_eq!(read::<i32>(&scaled).await, xv.iter().map(|v| (v * 10.0) as i32).collect::<Vec<_>>());
    assert_eq!(read::<f32>(&scaled.to(DType::F32).unwrap()).await, xv.iter().map(|v| (v * 10.0).trunc()).collect::<Vec<_>>());
    // Equality of a tensor with itself, transposed view against its copy.
    let xt = x.t().unwrap();
    let same = xt.eq(&xt.contiguous().unwrap()).unwrap().to(DType::U32).unwrap();
    assert_eq!(read::<u32>(&same).await, vec![1; 35]);
    // int8 keeps its sign through the packed path.
    let small = dev.from_slice(&[-3i32, 5, -128, 127, 0], &[5]).unwrap().to(DType::I8).unwrap();
    assert_eq!(small.storage_bytes(), 5);
    assert_eq!(read::<i32>(&small.to(DType::I32).unwrap()).await, vec![-3, 5, -128, 127, 0]);
    // addcmul_ in place: p += 0.5 * g * g.
    let p = dev.ones(&[5, 7], DType::F32).unwrap();
    let before = dev.memory_allocated();
    p.addcmul_(&x, &x, 0.5).unwrap();
    assert_eq!(dev.memory_allocated(), before);
    close(&read::<f32>(&p).await, &xv.iter().map(|v| 1.0 + 0.5 * v * v).collect::<Vec<_>>(), 1e-6, "addcmul_");
    assert!(x.where_(&x, &y).unwrap_err().to_string().contains("bool condition"));
}

pub async fn softmax_layer_norm_var_argmax(dev: &Device) {
    let mut rng = Rng(77);
    let (x, base) = random_view(dev, &mut rng, &[4, 6]);
    let v = gather(&base, x.layout());
    let rows: Vec<&[f32]> = v.chunks(6).collect();
    let softmax: Vec<f32> = rows
        .iter()
        .flat_map(|r| {
            let m = r.iter().cloned().fold(f32::MIN, f32::max);
            let s: f32 = r.iter().map(|x| (x - m).exp()).sum();
            r.iter().map(move |x| (x - m).exp() / s)
        })
        .collect();
    close(&read::<f32>(&x.softmax(-1).unwrap()).await, &softmax, 1e-6, "softmax");
    close(&read::<f32>(&x.log_softmax(1).unwrap()).await, &softmax.iter().map(|p| p.ln()).collect::<Vec<_>>(), 1e-5, "log_softmax");
    // nll_loss on the (strided) rows, with an ignored row (-100): the mean over counted rows.
    let targets = dev.from_slice(&[5i64, -100, 0, 2], &[4]).unwrap();
    let nll = -(v[5] + v[12] + v[3 * 6 + 2]) / 3.0;
    close(&read::<f32>(&x.nll_loss(&targets).unwrap()).await, &[nll], 1e-6, "nll_loss");
    let log_probs = softmax.iter().map(|p| p.ln()).collect::<Vec<_>>();
    let ce = -(log_probs[5] + log_probs[12] + log_probs[3 * 6 + 2]) / 3.0;
    close(&read::<f32>(&tensormem::nn::cross_entropy(&x, &targets).unwrap()).await, &[ce], 1e-5, "cross_entropy");
    let half = tensormem::nn::cross_entropy(&x.to(DType::F16).unwrap(), &targets).unwrap();
    assert_eq!(half.dtype(), DType::F16);
    close(&[read::<half::f16>(&half).await[0].to_f32()], &[ce], 1e-2, "cross_entropy in f16");
    assert!(x.nll_loss(&targets.narrow(0, 0, 3).unwrap()).unwrap_err().to_string().contains("Expected input batch_size (4) to match target batch_size (3)."));
    // Over dim 0 (a strided walk).
    let col_sums = read::<f32>(&x.softmax(0).unwrap().sum(&[0], false).unwrap()).await;
    close(&col_sums, &[1.0; 6], 1e-6, "softmax over dim 0 sums to 1");
    let w = dev.from_slice(&[1.0f32, 2.0, 0.5, 1.0, -1.0, 3.0], &[6]).unwrap();
    let b = dev.from_slice(&[0.0f32, 0.1, 0.2, 0.3, 0.4, 0.5], &[6]).unwrap();
    let before = dev.memory_allocated();
    let y = x.layer_norm(&w, &b, 1e-5).unwrap();
    assert_eq!(dev.memory_allocated(), before + 512, "one output; the saved mean and rstd are freed");
    let (wv, bv) = (read::<f32>(&w).await, read::<f32>(&b).await);
    let expected: Vec<f32> = rows
        .iter()
        .flat_map(|r| {
            let mean = r.iter().sum::<f32>() / 6.0;
            let var = r.iter().map(|x| (x - mean).powi(2)).sum::<f32>() / 6.0;
            let rstd = 1.0 / (var + 1e-5).sqrt();
            r.iter().enumerate().map(|(k, x)| (x - mean) * rstd * wv[k] + bv[k]).collect::<Vec<_>>()
        })
        .collect();
    close(&read::<f32>(&y).await, &expected, 1e-5, "layer_norm");
    let var: Vec<f32> = rows
        .iter()
        .map(|r| {
            let mean = r.iter().sum::<f32>() / 6.0;
            r.iter().map(|x| (x - mean).powi(2)).sum::<f32>() / 5.0
        })
        .collect();
    close(&read::<f32>(&x.var(1, 1.0, false).unwrap()).await, &var, 1e-5, "var");
    let argmax = x.argmax(1, false).unwrap();
    assert_eq!(argmax.dtype(), DType::I64);
    assert_eq!(argmax.storage_bytes(), 32, "int64: 8 bytes per index");
    let expected: Vec<i64> =
        rows.iter().map(|r| r.iter().enumerate().fold((0, f32::MIN), |(bi, bv), (i, &x)| if x > bv { (i, x) } else { (bi, bv) }).0 as i64).collect();
    assert_eq!(read::<i64>(&argmax).await, expected);
}

pub async fn cat_stack_index_select_embedding_and_random(dev: &Device) {
    let a = dev.from_slice(&[1.0f32, 2.0, 3.0, 4.0], &[2, 2]).unwrap();
    let b = dev.from_slice(&[5.0f32, 6.0], &[1, 2]).unwrap();
    let before = dev.memory_allocated();
    let c = Tensor::cat(&[&a, &b.share(), &a.t().unwrap()], 0).unwrap();
    assert_eq!(dev.memory_allocated(), before + 512, "cat allocates its output only");
    assert_eq!(c.shape(), &[5, 2]);
    assert_eq!(read::<f32>(&c).await, vec![1.0, 2.0, 3.0, 4.0, 5.0, 6.0, 1.0, 3.0, 2.0, 4.0]);
    let s = Tensor::stack(&[&a, &a], 1).unwrap();
    assert_eq!(s.shape(), &[2, 2, 2]);
    assert_eq!(read::<f32>(&s).await, vec![1.0, 2.0, 1.0, 2.0, 3.0, 4.0, 3.0, 4.0]);
    assert!(Tensor::cat(&[&a, &dev.ones(&[2, 3], DType::F32).unwrap()], 0).unwrap_err().to_string().contains("does not match"));
    // Embedding: int64 ids of shape [2, 3] pick rows of a [5, 4] table; the table read transposed.
    let table: Vec<f32> = (0..20).map(|v| v as f32).collect();
    let w = dev.from_slice(&table, &[4, 5]).unwrap().t().unwrap();
    let ids = dev.from_slice(&[4i64, 0, 2, 2, 1, 3], &[2, 3]).unwrap();
    let e = w.embedding(&ids).unwrap();
    assert_eq!(e.shape(), &[2, 3, 4]);
    let wv = gather(&table, w.layout());
    let expected: Vec<f32> = [4, 0, 2, 2, 1, 3].iter().flat_map(|&r| wv[r * 4..r * 4 + 4].to_vec()).collect();
    assert_eq!(read::<f32>(&e).await, expected);
    let cols = w.index_select(1, &dev.from_slice(&[3i32, 1], &[2]).unwrap()).unwrap();
    assert_eq!(read::<f32>(&cols).await, (0..5).flat_map(|r| [wv[r * 4 + 3], wv[r * 4 + 1]]).collect::<Vec<_>>());
    // torch.gather along dim 1 of the transposed table, with a transposed index: out[r][j] =
    // w[r][idx[r][j]].
    let idx = dev.from_slice(&[3i64, 0, 1, 2, 0, 1, 1, 3, 2, 0], &[2, 5]).unwrap().t().unwrap();
    let picked = w.gather(1, &idx).unwrap();
    assert_eq!(picked.shape(), &[5, 2]);
    let iv = [3usize, 0, 1, 2, 0, 1, 1, 3, 2, 0];
    assert_eq!(read::<f32>(&picked).await, (0..5).flat_map(|r| [wv[r * 4 + iv[r]], wv[r * 4 + iv[5 + r]]]).collect::<Vec<_>>());
    assert!(w.gather(1, &dev.zeros(&[4, 2], DType::I64).unwrap()).unwrap_err().to_string().contains("shaped as [5, 4]"));
    // Random numbers: reproducible by seed, and with the right moments.
    dev.manual_seed(7);
    let u = read::<f32>(&dev.rand(&[100_000], DType::F32).unwrap()).await;
    let n = read::<f32>(&dev.randn(&[100_000], DType::F32).unwrap()).await;
    dev.manual_seed(7);
    assert_eq!(read::<f32>(&dev.rand(&[100_000], DType::F32).unwrap()).await, u, "same seed, same numbers");
    assert!(u.iter().all(|&x| (0.0..1.0).contains(&x)));
    let mean = |v: &[f32]| v.iter().map(|&x| x as f64).sum::<f64>() / v.len() as f64;
    let var = |v: &[f32]| {
        let m = mean(v);
        v.iter().map(|&x| (x as f64 - m).powi(2)).sum::<f64>() / v.len() as f64
    };
    assert!((mean(&u) - 0.5).abs() < 0.01 && (var(&u) - 1.0 / 12.0).abs() < 0.005, "uniform {} {}", mean(&u), var(&u));
    assert!(mean(&n).abs() < 0.02 && (var(&n) - 1.0).abs() < 0.03, "normal {} {}", mean(&n), var(&n));
}

/// What the GPU refuses the sim device refuses, and what it accepts (an upload) the sim device
/// accepts, with the same allocations.
pub async fn the_sim_device_answers_as_the_gpu(dev: &Device) {
    let sim = Device::sim(SimOptions::preset("H100-80GB"));
    for d in [dev, &sim] {
        let before = d.snapshot().device_traces[0].len();
        let t = d.from_slice(&[1.0f32, 2.0, 3.0], &[3]).unwrap();
        let entries: Vec<_> = d.snapshot().device_traces[0]
            .range(before..)
            .map(|e| (e.action, e.size))
            .filter(|(a, _)| *a == tensormem::trace::Action::Alloc || *a == tensormem::trace::Action::FreeRequested)
            .collect();
        assert_eq!(entries, vec![(tensormem::trace::Action::Alloc, 12)], "{}: an upload is one allocation, kept", d.name());
        drop(t);
        let empty = d.zeros(&[3, 0], DType::F32).unwrap();
        let err = empty.argmax(1, false).unwrap_err().to_string();
        assert!(err.contains("Expected reduction dim 1 to have non-zero size"), "{}: {err}", d.name());
        let err = empty.max_dim(1, false).unwrap_err().to_string();
        assert!(err.contains("max(): Expected reduction dim 1 to have non-zero size"), "{}: {err}", d.name());
        let v = empty.var(1, 1.0, false).unwrap();
        assert_eq!(v.shape(), &[3]);
        if !d.is_sim() {
            assert!(read::<f32>(&v).await.iter().all(|x| x.is_nan()), "the variance of nothing is NaN");
        }
        // Over an empty dimension of an empty result there is nothing to refuse.
        assert_eq!(d.zeros(&[0, 0], DType::F32).unwrap().argmax(1, false).unwrap().shape(), &[0]);
    }
}

pub async fn zero_size_and_size_one_dimensions(dev: &Device) {
    let before = dev.memory_allocated();
    let empty = dev.zeros(&[0, 3], DType::F32).unwrap();
    assert_eq!(dev.memory_allocated(), before, "zero bytes allocate nothing, as in PyTorch");
    assert_eq!(empty.data_ptr(), 0);
    let ones = dev.ones(&[1, 3], DType::F32).unwrap();
    let sum = empty.add(&ones).unwrap();
    assert_eq!(sum.shape(), &[0, 3]);
    assert!(read::<f32>(&sum).await.is_empty());
    assert_eq!(read::<f32>(&empty.sum(&[0], false).unwrap()).await, vec![0.0; 3], "an empty sum is 0");
    let m = dev.zeros(&[2, 0], DType::F32).unwrap().matmul(&dev.zeros(&[0, 4], DType::F32).unwrap()).unwrap();
    assert_eq!(m.shape(), &[2, 4]);
    assert!(Tensor::cat(&[&empty, &ones], 0).is_ok());
    // Size-1 dims broadcast both ways, and bmm checks its shapes.
    let col = dev.from_slice(&[1.0f32, 2.0], &[2, 1]).unwrap();
    let row = dev.from_slice(&[10.0f32, 20.0, 30.0], &[1, 3]).unwrap();
    assert_eq!(read::<f32>(&col.mul(&row).unwrap()).await, vec![10.0, 20.0, 30.0, 20.0, 40.0, 60.0]);
    let a = dev.ones(&[3, 2, 4], DType::F32).unwrap();
    assert_eq!(a.bmm(&dev.ones(&[3, 4, 5], DType::F32).unwrap()).unwrap().shape(), &[3, 2, 5]);
    assert!(a.bmm(&dev.ones(&[2, 4, 5], DType::F32).unwrap()).is_err());
}

/// The allocator may release a cached segment inside `malloc` (its free-and-retry path) while
/// recorded, unsubmitted commands still read that segment's buffer: the buffer must outlive them.
pub async fn a_segment_released_under_pending_work_stays_valid_for_it(_dev: &Device) {
    let dev = Device::gpu(tensormem::GpuOptions { capacity: Some(64 << 20), ..Default::default() }).await.unwrap();
    let x = dev.full(&[6 << 20], 1.0, DType::F32).unwrap(); // 24 MiB: its own segment
    let y = x.mul_scalar(2.0).unwrap(); // recorded, not submitted; reads x's buffer
    drop(x); // x's segment is now cached and free
    assert_eq!(dev.memory_reserved(), 48 << 20);
    // 30 MiB does not fit beside 48 MiB on a 64 MiB card: the cache (x's segment) is released.
    let z = dev.empty(&[30 << 18], DType::F32).unwrap();
    assert_eq!(dev.memory_reserved(), 54 << 20);
    let got = read::<f32>(&y).await;
    assert!(got.iter().all(|&v| v == 2.0), "the pending op read a destroyed buffer");
    drop(z);
}

/// More dispatches than one batch holds: metadata of every batch reaches its own commands.
pub async fn long_programs_span_several_batches(dev: &Device) {
    let x = dev.zeros(&[1000], DType::F32).unwrap();
    let one = dev.ones(&[1], DType::F32).unwrap();
    for _ in 0..700 {
        x.add_(&one).unwrap();
    }
    let twice = x.mul_scalar(2.0).unwrap();
    assert_eq!(read::<f32>(&twice).await, vec![1400.0; 1000]);
}
