//! Element-wise ops, broadcasting over strided views, in-place ops and reductions (including
//! the long ones PyTorch splits across blocks) against the reference.

use super::*;

pub async fn upload_and_readback_round_trip(dev: &Device) {
    let data: Vec<f32> = (0..1000).map(|i| i as f32 * 0.5).collect();
    let t = dev.from_slice(&data, &[10, 100]).unwrap();
    assert_eq!(read::<f32>(&t).await, data);
    let ints: Vec<i32> = (-5..6).collect();
    assert_eq!(read::<i32>(&dev.from_slice(&ints, &[11]).unwrap()).await, ints);
    // A non-contiguous view reads back in logical order (through a temporary copy).
    let tt = t.t().unwrap();
    assert_eq!(read::<f32>(&tt).await, gather(&data, tt.layout()));
    let (kept, peak) = dev.staging_memory();
    assert!(peak >= 4000 && kept > 0, "staging is accounted and kept for reuse: {:?}", dev.staging_memory());
    // More uploads and readbacks of these sizes reuse the staging buffers.
    for _ in 0..20 {
        let again = dev.from_slice(&data, &[10, 100]).unwrap();
        assert_eq!(read::<f32>(&again).await, data);
    }
    assert_eq!(dev.staging_memory().0, kept, "no staging buffer was added");
    // A view starting mid-word (f16 at an odd element) is read from the word's start.
    let halves: Vec<half::f16> = (0..7).map(|i| half::f16::from_f32(i as f32 - 3.0)).collect();
    let h = dev.from_slice(&halves, &[7]).unwrap().narrow(0, 1, 5).unwrap();
    assert_eq!(read::<half::f16>(&h).await, halves[1..6]);
}

pub async fn binary_ops_broadcast_over_strided_views(dev: &Device) {
    let mut rng = Rng(0x5eed);
    for case in 0..40 {
        let ndim = 1 + rng.below(4);
        let out_shape = rng.shape(ndim);
        // b broadcasts: some dims become 1, and it may have fewer dims.
        let mut b_shape: Vec<usize> = out_shape.iter().map(|&n| if rng.below(3) == 0 { 1 } else { n }).collect();
        if rng.below(2) == 0 && b_shape.len() > 1 {
            b_shape.remove(0);
        }
        let (a, a_base) = random_view(dev, &mut rng, &out_shape);
        let (b, b_base) = random_view(dev, &mut rng, &b_shape);
        let xa = gather(&a_base, a.layout());
        let xb = gather(&b_base, &b.layout().expand(&out_shape).unwrap());
        type BinaryCase = (&'static str, fn(&Tensor, &Tensor) -> tensormem::tensor::Result<Tensor>, fn(f32, f32) -> f32);
        let ops: [BinaryCase; 8] = [
            ("add", Tensor::add, |x, y| x + y),
            ("add alpha", |a, b| a.add_alpha(b, -0.75), |x, y| x - 0.75 * y),
            ("add_relu", Tensor::add_relu, |x, y| (x + y).max(0.0)),
            ("sub", Tensor::sub, |x, y| x - y),
            ("mul", Tensor::mul, |x, y| x * y),
            ("div", Tensor::div, |x, y| x / y),
            ("maximum", Tensor::maximum, f32::max),
            ("minimum", Tensor::minimum, f32::min),
        ];
        for (name, op, reference) in ops {
            let out = op(&a, &b).unwrap();
            assert_eq!(out.shape(), &out_shape[..]);
            let expected: Vec<f32> = xa.iter().zip(&xb).map(|(&x, &y)| reference(x, y)).collect();
            close(&read::<f32>(&out).await, &expected, 1e-6, &format!("case {case} {name} {out_shape:?} with {b_shape:?}"));
        }
    }
    // As TensorIterator: the result of a transposed matrix and a broadcast row keeps the matrix's
    // layout (column-major here), and its values are the same; a view of it as one row is refused,
    // as PyTorch refuses it, and reshape copies.
    let data: Vec<f32> = (0..15).map(|i| i as f32).collect();
    let xt = dev.from_slice(&data, &[5, 3]).unwrap().t().unwrap();
    let row = dev.from_slice(&[10.0f32, 20.0, 30.0, 40.0, 50.0], &[5]).unwrap();
    let sum = xt.add(&row).unwrap();
    assert_eq!((sum.shape(), sum.strides()), (&[3usize, 5][..], &[1usize, 3][..]));
    let expected: Vec<f32> = (0..3).flat_map(|i| (0..5).map(move |j| (j * 3 + i) as f32 + 10.0 * (j + 1) as f32)).collect();
    assert_eq!(read::<f32>(&sum).await, expected);
    assert!(sum.view(&[15]).is_err());
    assert_eq!(read::<f32>(&sum.reshape(&[15]).unwrap()).await, expected);
    assert!(sum.neg().unwrap().strides() == [1, 3], "a unary op keeps the layout too");
    // clone() preserves the layout, contiguous() does not.
    let copy = xt.clone().unwrap();
    assert_eq!((copy.strides(), xt.contiguous().unwrap().strides()), (&[1usize, 3][..], &[5usize, 1][..]));
    assert_eq!(read::<f32>(&copy).await, read::<f32>(&xt).await);

    // Mixed types compute in the promoted type, alpha too; integers refuse a fractional alpha.
    let ints = dev.from_slice(&[1i32, -2, 3], &[3]).unwrap();
    let floats = dev.from_slice(&[0.5f32, 1.5, -2.0], &[3]).unwrap();
    assert_eq!(read::<f32>(&ints.add_alpha(&floats, 0.5).unwrap()).await, vec![1.25, -1.25, 2.0]);
    assert_eq!(read::<i32>(&ints.add_alpha(&ints, -2.0).unwrap()).await, vec![-1, 2, -3]);
    let error = ints.add_alpha(&ints, 0.5).unwrap_err().to_string();
    assert!(error.contains("alpha must not be a floating point number"), "{error}");
}

pub async fn unary_and_scalar_ops_match_the_reference(dev: &Device) {
    let mut rng = Rng(42);
    let shape = [3, 7, 5];
    let (x, base) = random_view(dev, &mut rng, &shape);
    let v = gather(&base, x.layout());
    let erf = |x: f64| {
        // Reference erf by series (exact enough for |x| < 3).
        let mut sum = 0.0;
        let mut term = x;
        for n in 0..60 {
            sum += term / (2 * n + 1) as f64;
            term *= -x * x / (n + 1) as f64;
        }
        sum * 2.0 / std::f64::consts::PI.sqrt()
    };
    type UnaryCase = (&'static str, Tensor, Box<dyn Fn(f32) -> f32>);
    let cases: Vec<UnaryCase> = vec![
        ("neg", x.neg().unwrap(), Box::new(|x| -x)),
        ("abs", x.abs().unwrap(), Box::new(f32::abs)),
        ("exp", x.exp().unwrap(), Box::new(f32::exp)),
        ("relu", x.relu().unwrap(), Box::new(|x| x.max(0.0))),
        ("tanh", x.tanh().unwrap(), Box::new(f32::tanh)),
        ("sigmoid", x.sigmoid().unwrap(), Box::new(|x| 1.0 / (1.0 + (-x).exp()))),
        ("silu", x.silu().unwrap(), Box::new(|x| x / (1.0 + (-x).exp()))),
        ("gelu", x.gelu().unwrap(), Box::new(move |x| (0.5 * x as f64 * (1.0 + erf(x as f64 / 2f64.sqrt()))) as f32)),
        ("abs.sqrt", x.abs().unwrap().sqrt().unwrap(), Box::new(|x| x.abs().sqrt())),
        ("add 2.5", x.add_scalar(2.5).unwrap(), Box::new(|x| x + 2.5)),
        ("mul -3", x.mul_scalar(-3.0).unwrap(), Box::new(|x| x * -3.0)),
        ("pow 3", x.pow_scalar(3.0).unwrap(), Box::new(|x| x.powi(3))),
        ("pow 2", x.pow_scalar(2.0).unwrap(), Box::new(|x| x * x)),
        ("clamp_min", x.clamp_min(0.25).unwrap(), Box::new(|x| x.max(0.25))),
    ];
    for (name, out, reference) in cases {
        let expected: Vec<f32> = v.iter().map(|&x| reference(x)).collect();
        close(&read::<f32>(&out).await, &expected, 2e-5, name);
    }
    let log = x.abs().unwrap().add_scalar(0.1).unwrap().log().unwrap();
    close(&read::<f32>(&log).await, &v.iter().map(|x| (x.abs() + 0.1).ln()).collect::<Vec<_>>(), 2e-5, "log");
}

pub async fn in_place_ops_write_through_views_and_allocate_nothing(dev: &Device) {
    let data: Vec<f32> = (0..12).map(|i| i as f32).collect();
    let x = dev.from_slice(&data, &[3, 4]).unwrap();
    let ones = dev.ones(&[4], DType::F32).unwrap();
    let before = dev.memory_allocated();
    x.t().unwrap().mul_(&dev.full(&[4, 1], 2.0, DType::F32).unwrap()).unwrap();
    assert_eq!(dev.memory_allocated(), before, "the temporary full() is freed; mul_ allocated nothing");
    x.add_(&ones).unwrap();
    x.narrow(1, 0, 1).unwrap().relu_().unwrap();
    let expected: Vec<f32> = data.iter().map(|&v| v * 2.0 + 1.0).collect();
    assert_eq!(read::<f32>(&x).await, expected);
    x.narrow(0, 1, 1).unwrap().fill_(-1.0).unwrap();
    let got = read::<f32>(&x).await;
    assert_eq!(&got[4..8], &[-1.0; 4]);
    assert_eq!(dev.memory_allocated(), before);
    let err = x.add_(&dev.ones(&[2, 3, 4], DType::F32).unwrap()).unwrap_err();
    assert!(err.to_string().contains("cannot change the shape"), "{err}");
}

pub async fn reductions_over_dims(dev: &Device) {
    let mut rng = Rng(7);
    for case in 0..12 {
        let ndim = 1 + rng.below(3);
        let shape = rng.shape(ndim);
        let (x, base) = random_view(dev, &mut rng, &shape);
        let v = gather(&base, x.layout());
        let dim = rng.below(shape.len() as u64);
        let outer: usize = shape[..dim].iter().product();
        let n = shape[dim];
        let inner: usize = shape[dim + 1..].iter().product();
        let fold = |f: &dyn Fn(&[f32]) -> f32| -> Vec<f32> {
            let mut out = Vec::new();
            for o in 0..outer {
                for i in 0..inner {
                    let column: Vec<f32> = (0..n).map(|k| v[(o * n + k) * inner + i]).collect();
                    out.push(f(&column));
                }
            }
            out
        };
        let d = dim as isize;
        close(&read::<f32>(&x.sum(&[d], false).unwrap()).await, &fold(&|c| c.iter().sum()), 1e-5, &format!("case {case} sum {shape:?} dim {dim}"));
        close(&read::<f32>(&x.mean(&[d], true).unwrap()).await, &fold(&|c| c.iter().sum::<f32>() / c.len() as f32), 1e-5, "mean");
        close(&read::<f32>(&x.max(&[d], false).unwrap()).await, &fold(&|c| c.iter().cloned().fold(f32::MIN, f32::max)), 0.0, "max");
        close(&read::<f32>(&x.min(&[d], false).unwrap()).await, &fold(&|c| c.iter().cloned().fold(f32::MAX, f32::min)), 0.0, "min");
        let kept = x.sum(&[d], true).unwrap();
        assert_eq!(kept.shape()[dim], 1);
    }
    // Long rows (a workgroup per output), whole and narrowed: consecutive elements from an offset.
    let data: Vec<f32> = (0..3 * 5000).map(|i| (i % 7) as f32 - 3.0).collect();
    let x = dev.from_slice(&data, &[3, 5000]).unwrap();
    for (start, len) in [(0, 5000), (3, 4990)] {
        let want: Vec<f32> = (0..3).map(|r| data[r * 5000 + start..r * 5000 + start + len].iter().sum()).collect();
        close(&read::<f32>(&x.narrow(1, start, len).unwrap().sum(&[-1], false).unwrap()).await, &want, 1e-5, "long rows");
    }
    let x = dev.from_slice(&[1.0f32, 2.0, 3.0, 4.0, 5.0, 6.0], &[2, 3]).unwrap();
    assert_eq!(read::<f32>(&x.sum(&[], false).unwrap()).await, vec![21.0]);
    assert_eq!(read::<f32>(&x.mean(&[0, 1], false).unwrap()).await, vec![3.5]);
    // Several dimensions at once, on strided views: one output allocation, as in ATen.
    for case in 0..10 {
        let ndim = 2 + rng.below(3);
        let shape = rng.shape(ndim);
        let (x, base) = random_view(dev, &mut rng, &shape);
        let v = gather(&base, x.layout());
        let dims: Vec<usize> = (0..ndim).filter(|_| rng.below(2) == 1).collect();
        let dims = if dims.is_empty() { vec![ndim - 1] } else { dims };
        // The reference: every element added into the output element with the reduced coordinates zeroed.
        let out_shape: Vec<usize> = (0..ndim).map(|d| if dims.contains(&d) { 1 } else { shape[d] }).collect();
        let (mut sums, mut maxes) = (vec![0.0f32; out_shape.iter().product()], vec![f32::MIN; out_shape.iter().product()]);
        for (flat, &value) in v.iter().enumerate() {
            let (mut rem, mut out_index, mut out_stride) = (flat, 0, 1);
            for d in (0..ndim).rev() {
                let coord = rem % shape[d];
                rem /= shape[d];
                if !dims.contains(&d) {
                    out_index += coord * out_stride;
                }
                out_stride *= out_shape[d];
            }
            sums[out_index] += value;
            maxes[out_index] = maxes[out_index].max(value);
        }
        let count: usize = dims.iter().map(|&d| shape[d]).product();
        let signed: Vec<isize> = dims.iter().map(|&d| d as isize - if case % 2 == 0 { ndim as isize } else { 0 }).collect();
        let allocs_before = allocations(dev);
        let sum = x.sum(&signed, false).unwrap();
        assert_eq!(allocations(dev) - allocs_before, 1, "case {case}: a sum over {dims:?} of {shape:?} allocates its output only");
        close(&read::<f32>(&sum).await, &sums, 1e-4, &format!("case {case} sum over {dims:?} of {shape:?}"));
        let means: Vec<f32> = sums.iter().map(|s| s / count as f32).collect();
        close(&read::<f32>(&x.mean(&signed, true).unwrap()).await, &means, 1e-4, "mean");
        close(&read::<f32>(&x.max(&signed, false).unwrap()).await, &maxes, 0.0, "max");
        assert_eq!(x.mean(&signed, true).unwrap().shape(), &out_shape[..]);
    }
    // Long reductions (a workgroup per output), over a transposed view: [3, 70000] read as rows
    // of a [70000, 3] tensor, and the whole of it.
    let data = rng.f32s(3 * 70_000);
    let x = dev.from_slice(&data, &[70_000, 3]).unwrap().t().unwrap();
    let rows: Vec<f32> = (0..3).map(|r| (0..70_000).map(|c| data[c * 3 + r] as f64).sum::<f64>() as f32).collect();
    close(&read::<f32>(&x.sum(&[1], false).unwrap()).await, &rows, 1e-3, "long rows");
    let maxes: Vec<f32> = (0..3).map(|r| (0..70_000).map(|c| data[c * 3 + r]).fold(f32::MIN, f32::max)).collect();
    close(&read::<f32>(&x.max(&[-1], false).unwrap()).await, &maxes, 0.0, "long maxes");
    let total: f64 = data.iter().map(|&v| v as f64).sum();
    close(&read::<f32>(&x.mean(&[], false).unwrap()).await, &[(total / data.len() as f64) as f32], 1e-4, "mean of everything");
    let mins: Vec<f32> = (0..3).map(|r| (0..70_000).map(|c| data[c * 3 + r]).fold(f32::MAX, f32::min)).collect();
    close(&read::<f32>(&x.min(&[-1], false).unwrap()).await, &mins, 0.0, "long mins");
    // The L2 norm combines partial sums of squares, not their squares.
    let norm = data.iter().map(|&v| v as f64 * v as f64).sum::<f64>().sqrt() as f32;
    close(&read::<f32>(&x.norm().unwrap()).await, &[norm], 1e-4, "norm of everything");
}

/// Reductions PyTorch splits over several blocks per output (on the H100 a device models by
/// default): the buffer and semaphores it allocates, freed right after, and the split kernel's
/// results against the reference. Whole tensors just past the split threshold (130,561
/// elements), odd lengths, a transposed view, column sums, f16 (whose max keeps 2-byte
/// partials, so fewer parts fit its buffer).
/// Rows long enough that a GPU shares each among several invocations (4 to 256 lanes, several
/// rows per workgroup, the last workgroup partly out of range): every reduction against the
/// reference, on whole rows, on rows narrowed from an offset, over two trailing dimensions at
/// once, and in f16. (On a CPU adapter these take a thread per row unless the device was made
/// with `gpu_kernel_shapes`.)
pub async fn contiguous_rows_reduce_with_neighbours_reading_neighbours(dev: &Device) {
    let mut rng = Rng(41);
    for (rows, n) in [(3, 128), (7, 129), (65, 200), (5, 1000), (9, 1024), (2, 2047)] {
        let data = rng.f32s(rows * (n + 3));
        let base = dev.from_slice(&data, &[rows, n + 3]).unwrap();
        for start in [0, 3] {
            let x = base.narrow(1, start, n).unwrap();
            let row = |r: usize| &data[r * (n + 3) + start..r * (n + 3) + start + n];
            let fold = |f: &dyn Fn(&[f32]) -> f32| (0..rows).map(|r| f(row(r))).collect::<Vec<f32>>();
            let what = format!("{rows} rows of {n} from {start}");
            // Sums in f64: each order of f32 additions is off the exact sum by its own rounding.
            let exact = |c: &[f32]| c.iter().map(|&v| v as f64).sum::<f64>();
            close(&read::<f32>(&x.sum(&[-1], false).unwrap()).await, &fold(&|c| exact(c) as f32), 1e-4, &format!("sum, {what}"));
            close(&read::<f32>(&x.mean(&[1], true).unwrap()).await, &fold(&|c| (exact(c) / n as f64) as f32), 1e-5, &format!("mean, {what}"));
            close(&read::<f32>(&x.max(&[1], false).unwrap()).await, &fold(&|c| c.iter().cloned().fold(f32::MIN, f32::max)), 0.0, &format!("max, {what}"));
            close(&read::<f32>(&x.min(&[1], false).unwrap()).await, &fold(&|c| c.iter().cloned().fold(f32::MAX, f32::min)), 0.0, &format!("min, {what}"));
        }
        // Two trailing dimensions of a contiguous tensor: one run of n * 3 elements per output.
        let cube =
            dev.from_slice(&data, &[rows, n + 3]).unwrap().narrow(1, 0, n).unwrap().contiguous().unwrap().reshape(&[rows as isize, 1, n as isize]).unwrap();
        let both = cube.expand(&[rows, 3, n]).unwrap().contiguous().unwrap();
        let want: Vec<f32> = (0..rows).map(|r| 3.0 * data[r * (n + 3)..r * (n + 3) + n].iter().map(|&v| v as f64).sum::<f64>()).map(|v| v as f32).collect();
        close(&read::<f32>(&both.sum(&[1, 2], false).unwrap()).await, &want, 1e-4, &format!("sum over two dimensions, {rows} x 3 x {n}"));
        // f16 rows accumulate in f32 and round once.
        let halves: Vec<half::f16> = data[..rows * n].iter().map(|&v| half::f16::from_f32(v)).collect();
        let h = dev.from_slice(&halves, &[rows, n]).unwrap();
        let want: Vec<f32> = halves.chunks(n).map(|c| half::f16::from_f64(c.iter().map(|v| v.to_f64()).sum::<f64>()).to_f32()).collect();
        let got: Vec<f32> = read::<half::f16>(&h.sum(&[1], false).unwrap()).await.iter().map(|v| v.to_f32()).collect();
        close(&got, &want, 2e-3, &format!("f16 sum, {rows} rows of {n}"));
    }
}

pub async fn long_reductions_split_as_pytorch_splits_them(dev: &Device) {
    use tensormem::trace::Action;
    let events = |f: &dyn Fn() -> Tensor| {
        let before = dev.snapshot().device_traces[0].len();
        let out = f();
        let trace = dev.snapshot().device_traces[0]
            .range(before..)
            .filter(|e| matches!(e.action, Action::Alloc | Action::FreeRequested))
            .map(|e| (e.action, e.size))
            .collect::<Vec<_>>();
        (out, trace)
    };
    // The output, then PyTorch's buffer and semaphores, freed semaphores first.
    let split = |out: u64, buffer: u64, semaphores: u64| {
        vec![(Action::Alloc, out), (Action::Alloc, buffer), (Action::Alloc, semaphores), (Action::FreeRequested, semaphores), (Action::FreeRequested, buffer)]
    };
    let mut rng = Rng(11);
    // Whole tensors: 130,561 elements use 16 blocks (64 B), 300,007 use 37 (148 B).
    for (n, buffer) in [(130_561usize, 64u64), (300_007, 148)] {
        let data = rng.f32s(n);
        let x = dev.from_slice(&data, &[n]).unwrap();
        let total: f64 = data.iter().map(|&v| v as f64).sum();
        let (sum, trace) = events(&|| x.sum(&[], false).unwrap());
        assert_eq!(trace, split(4, buffer, 4), "sum of {n}");
        close(&read::<f32>(&sum).await, &[total as f32], 1e-4, &format!("sum of {n}"));
        close(&read::<f32>(&x.mean(&[0], false).unwrap()).await, &[(total / n as f64) as f32], 1e-4, "mean");
        let max = data.iter().cloned().fold(f32::MIN, f32::max);
        let min = data.iter().cloned().fold(f32::MAX, f32::min);
        assert_eq!(read::<f32>(&x.max(&[], false).unwrap()).await, [max], "max of {n}");
        assert_eq!(read::<f32>(&x.min(&[], false).unwrap()).await, [min], "min of {n}");
        let norm = data.iter().map(|&v| v as f64 * v as f64).sum::<f64>().sqrt();
        close(&read::<f32>(&x.norm().unwrap()).await, &[norm as f32], 1e-4, "norm");
        // Just below the threshold: one workgroup, nothing more allocated.
        let (_, trace) = events(&|| x.narrow(0, 0, 130_560).unwrap().sum(&[], false).unwrap());
        assert_eq!(trace, [(Action::Alloc, 4)], "130,560 elements are not split");
    }
    // A transposed view, reduced whole: strided reads in the split kernel.
    let data = rng.f32s(700 * 401);
    let xt = dev.from_slice(&data, &[700, 401]).unwrap().t().unwrap();
    let total: f64 = data.iter().map(|&v| v as f64).sum();
    close(&read::<f32>(&xt.sum(&[0, 1], true).unwrap()).await, &[total as f32], 1e-4, "transposed");
    // Column sums of [20000, 8]: lanes over the 8 outputs, 20 blocks each; the buffer counts
    // every output once per lane and vector slot (4 x 8 x 20 x 2 x 4 bytes).
    let data = rng.f32s(20_000 * 8);
    let x = dev.from_slice(&data, &[20_000, 8]).unwrap();
    let (columns, trace) = events(&|| x.sum(&[0], false).unwrap());
    assert_eq!(trace, split(32, 5120, 4), "column sums");
    let want: Vec<f32> = (0..8).map(|c| (0..20_000).map(|r| data[r * 8 + c] as f64).sum::<f64>() as f32).collect();
    close(&read::<f32>(&columns).await, &want, 1e-4, "column sums");
    // f16: sums accumulate in float (a 4-byte accumulator: 148 B), max keeps halves (74 B).
    let data = rng.f32s(300_007);
    let x16 = dev.from_slice(&data, &[300_007]).unwrap().to(DType::F16).unwrap();
    let halves: Vec<f32> = data.iter().map(|&v| half::f16::from_f32(v).to_f32()).collect();
    let (sum, trace) = events(&|| x16.sum_to_dtype(&[], false, DType::F32).unwrap());
    assert_eq!(trace, split(4, 148, 4), "f16 sum");
    close(&read::<f32>(&sum).await, &[halves.iter().map(|&v| v as f64).sum::<f64>() as f32], 1e-4, "f16 sum");
    let (max, trace) = events(&|| x16.max(&[], false).unwrap());
    assert_eq!(trace, split(2, 74, 4), "f16 max");
    assert_eq!(read::<f32>(&max.to(DType::F32).unwrap()).await, [halves.iter().cloned().fold(f32::MIN, f32::max)], "f16 max");
}
