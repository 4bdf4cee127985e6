//! The op suite: every kernel against a plain-Rust reference on random shapes, strided views,
//! broadcasting, size-1 and zero-size dimensions. Each check is an async function of a device, run
//! natively on the first adapter (`tests/gpu_ops.rs`, lavapipe here) and in headless Chromium's
//! WebGPU (`tests/web.rs`), whose limits and features differ (no shader-f16, 256-byte offsets).
#![allow(dead_code)]

use tensormem::tensor::{Element, Layout};
use tensormem::{DType, Device, SimOptions, Tensor};

/// Calls `$run!` with the name of every check in this suite: each runner (native, browser)
/// turns them into tests, and a new check is listed once, here.
macro_rules! every_check {
    ($run:ident) => {
        $run!(
            long_programs_span_several_batches,
            a_segment_released_under_pending_work_stays_valid_for_it,
            upload_and_readback_round_trip,
            binary_ops_broadcast_over_strided_views,
            contiguous_float32_goes_four_elements_at_a_time,
            unary_and_scalar_ops_match_the_reference,
            in_place_ops_write_through_views_and_allocate_nothing,
            reductions_over_dims,
            long_reductions_split_as_pytorch_splits_them,
            contiguous_rows_reduce_with_neighbours_reading_neighbours,
            matmul_variants_match_the_reference,
            matmul_kernels_are_chosen_per_class_of_shapes,
            float16,
            bfloat16,
            exact_memory_facts,
            a_freed_block_reused_for_an_upload_does_not_corrupt_pending_work,
            operands_in_one_segment_bind_without_validation_errors,
            clear_errors_for_bad_input,
            comparisons_where_casts_and_addcmul,
            softmax_layer_norm_var_argmax,
            cat_stack_index_select_embedding_and_random,
            zero_size_and_size_one_dimensions,
            the_sim_device_records_the_same_trace_as_the_gpu,
            the_sim_device_answers_as_the_gpu,
            matmul_allocates_what_aten_allocates,
            gradients_match_finite_differences,
            a_training_step_allocates_on_the_gpu_as_on_the_sim_device,
            autocast_mixed_types_and_the_grad_scaler,
            graphs_and_mem_pools_allocate_from_pools_of_their_own
        );
    };
}
pub(crate) use every_check;

pub async fn read<T: Element>(t: &Tensor) -> Vec<T> {
    t.to_vec::<T>().await.unwrap()
}

/// Deterministic pseudo-random numbers (xorshift), so failures reproduce.
struct Rng(u64);

impl Rng {
    fn next(&mut self) -> u64 {
        self.0 ^= self.0 << 13;
        self.0 ^= self.0 >> 7;
        self.0 ^= self.0 << 17;
        self.0
    }
    fn below(&mut self, n: u64) -> usize {
        (self.next() % n) as usize
    }
    fn f32s(&mut self, n: usize) -> Vec<f32> {
        (0..n).map(|_| (self.next() % 20_000) as f32 / 10_000.0 - 1.0).collect()
    }
    fn shape(&mut self, ndim: usize) -> Vec<usize> {
        (0..ndim).map(|_| 1 + self.below(5)).collect()
    }
}

/// The logical elements of a layout over `base`, row-major: what a correct kernel reads.
fn gather<T: Copy>(base: &[T], layout: &Layout) -> Vec<T> {
    let n = layout.numel();
    let mut out = Vec::with_capacity(n);
    for i in 0..n {
        let mut rem = i;
        let mut off = layout.offset;
        for d in (0..layout.ndim()).rev() {
            off += (rem % layout.shape[d]) * layout.strides[d];
            rem /= layout.shape[d];
        }
        out.push(base[off]);
    }
    out
}

fn close(a: &[f32], b: &[f32], tol: f32, what: &str) {
    assert_eq!(a.len(), b.len(), "{what}: lengths");
    for (i, (x, y)) in a.iter().zip(b).enumerate() {
        let ok = (x.is_nan() && y.is_nan()) || (x - y).abs() <= tol * (1.0 + y.abs());
        assert!(ok, "{what}: element {i}: got {x}, expected {y}");
    }
}

/// A random view of a fresh tensor: transposed, narrowed or plain. Returns it with its base data.
fn random_view(dev: &Device, rng: &mut Rng, shape: &[usize]) -> (Tensor, Vec<f32>) {
    match rng.below(3) {
        0 if shape.len() >= 2 => {
            // Build the transposed shape, then transpose back: same logical shape, swapped strides.
            let mut s = shape.to_vec();
            let n = s.len();
            s.swap(n - 1, n - 2);
            let data = rng.f32s(s.iter().product());
            let t = dev.from_slice(&data, &s).unwrap().transpose(-1, -2).unwrap();
            (t, data)
        }
        1 => {
            // A narrowed slice of a larger tensor along dim 0.
            let mut s = shape.to_vec();
            s[0] += 2;
            let data = rng.f32s(s.iter().product());
            let t = dev.from_slice(&data, &s).unwrap().narrow(0, 1, shape[0]).unwrap();
            (t, data)
        }
        _ => {
            let data = rng.f32s(shape.iter().product());
            (dev.from_slice(&data, shape).unwrap(), data)
        }
    }
}

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
        let trace = dev.snapshot().device_traces[0][before..]
            .iter()
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

/// Allocations made on `dev` so far (`memory_stats()["allocation.all.allocated"]`).
fn allocations(dev: &Device) -> i64 {
    dev.memory_stats()["allocation.all.allocated"]
}

fn reference_matmul(a: &[f32], b: &[f32], m: usize, k: usize, n: usize) -> Vec<f32> {
    let mut c = vec![0.0; m * n];
    for i in 0..m {
        for j in 0..n {
            c[i * n + j] = (0..k).map(|p| a[i * k + p] * b[p * n + j]).sum();
        }
    }
    c
}

/// Requested bytes of each allocation `dev` makes while `f` runs.
/// Runs a matmul forward and backward, so that cuBLAS's workspaces (the main thread's and
/// autograd's: made by the first matmul on each, and kept) exist before a test counts what an
/// op allocates.
fn make_cublas_workspaces(dev: &Device) {
    let w = dev.ones(&[2, 2], DType::F32).unwrap();
    w.requires_grad_(true).unwrap();
    w.matmul(&w).unwrap().sum(&[], false).unwrap().backward().unwrap();
}

fn allocations_during<T>(dev: &Device, f: impl FnOnce() -> T) -> (T, Vec<u64>) {
    let before = dev.snapshot().device_traces[0].len();
    let out = f();
    let sizes = dev.snapshot().device_traces[0][before..].iter().filter(|e| e.action == tensormem::trace::Action::Alloc).map(|e| e.size).collect();
    (out, sizes)
}

/// matmul allocates what ATen's `_matmul_impl` allocates: a stack of matrices times a matrix
/// folds into one product (no copy), and broadcast batches are expanded and flattened, which
/// copies an operand whose expanded batches cannot be flattened as a view.
pub async fn matmul_allocates_what_aten_allocates(dev: &Device) {
    make_cublas_workspaces(dev);
    let mut rng = Rng(5);
    // (a's shape, b's shape, the output's shape, the bytes allocated, in order)
    type Case<'a> = (&'a [usize], &'a [usize], &'a [usize], &'a [u64]);
    let cases: [Case; 7] = [
        // Batches [4, 1] and [1, 6] broadcast to [4, 6]: neither expansion flattens in place.
        (&[4, 1, 3, 5], &[1, 6, 5, 2], &[4, 6, 3, 2], &[24 * 3 * 5 * 4, 24 * 5 * 2 * 4, 24 * 3 * 2 * 4]),
        // Folded into one [24, 5] @ [5, 6].
        (&[2, 3, 4, 5], &[5, 6], &[2, 3, 4, 6], &[24 * 6 * 4]),
        (&[2, 3, 4, 5], &[2, 3, 5, 6], &[2, 3, 4, 6], &[6 * 4 * 6 * 4]),
        // A batch of one expands to a stride-0 batch: a view.
        (&[1, 4, 5], &[7, 5, 6], &[7, 4, 6], &[7 * 4 * 6 * 4]),
        (&[4, 5], &[3, 5, 6], &[3, 4, 6], &[3 * 4 * 6 * 4]),
        (&[5], &[3, 5, 6], &[3, 6], &[3 * 6 * 4]),
        (&[3, 4, 5], &[5], &[3, 4], &[3 * 4 * 4]),
    ];
    for (a_shape, b_shape, out_shape, bytes) in cases {
        let (a_data, b_data) = (rng.f32s(a_shape.iter().product()), rng.f32s(b_shape.iter().product()));
        let a = dev.from_slice(&a_data, a_shape).unwrap();
        let b = dev.from_slice(&b_data, b_shape).unwrap();
        let (c, sizes) = allocations_during(dev, || a.matmul(&b).unwrap());
        assert_eq!(c.shape(), out_shape, "{a_shape:?} @ {b_shape:?}");
        assert_eq!(sizes, bytes, "{a_shape:?} @ {b_shape:?}: the allocations");
        assert_eq!(c.storage_bytes(), *bytes.last().unwrap(), "the output is the last allocation; the copies are gone");
        // The values: each output matrix from its broadcast operands.
        let (k, n) = (*a_shape.last().unwrap(), if b_shape.len() == 1 { 1 } else { *b_shape.last().unwrap() });
        let m = if a_shape.len() == 1 { 1 } else { a_shape[a_shape.len() - 2] };
        let batch: Vec<usize> = out_shape[..out_shape.len() - (a_shape.len() > 1) as usize - (b_shape.len() > 1) as usize].to_vec();
        let matrix_of = |shape: &[usize], data: &[f32], rows: usize, cols: usize, index: &[usize]| -> Vec<f32> {
            let own = &shape[..shape.len().saturating_sub(2)];
            let skip = batch.len() - own.len().min(batch.len());
            let mut at = 0;
            for (d, &size) in own.iter().enumerate() {
                at = at * size + if size == 1 { 0 } else { index[skip + d] };
            }
            data[at * rows * cols..(at + 1) * rows * cols].to_vec()
        };
        let got = read::<f32>(&c).await;
        let batches: usize = batch.iter().product();
        for flat in 0..batches {
            let mut index = vec![0; batch.len()];
            let mut rem = flat;
            for d in (0..batch.len()).rev() {
                index[d] = rem % batch[d];
                rem /= batch[d];
            }
            let expected = reference_matmul(&matrix_of(a_shape, &a_data, m, k, &index), &matrix_of(b_shape, &b_data, k, n, &index), m, k, n);
            close(&got[flat * m * n..(flat + 1) * m * n], &expected, 1e-5, &format!("{a_shape:?} @ {b_shape:?} batch {index:?}"));
        }
    }
}

/// Contiguous f32 operands take the `quads` kernels (128-bit loads, 4096 elements a workgroup):
/// every length mod 4 (the partial last quad), one or more whole workgroups and a partial one,
/// starts off a 16-byte boundary (element kernels instead), in place.
pub async fn contiguous_float32_goes_four_elements_at_a_time(dev: &Device) {
    let mut rng = Rng(7);
    for n in [1, 2, 3, 4, 5, 7, 8, 9, 1027, 4096, 4099, 8192 + 1024 + 6] {
        for start in [0, 1, 4] {
            let (xd, yd, zd) = (rng.f32s(n + start), rng.f32s(n + start), rng.f32s(n + start));
            let view = |d: &[f32]| dev.from_slice(d, &[n + start]).unwrap().narrow(0, start, n).unwrap();
            let (x, y, z) = (view(&xd), view(&yd), view(&zd));
            let at = |d: &[f32], i: usize| d[start + i];
            let what = format!("n {n} from {start}");
            let sum: Vec<f32> = (0..n).map(|i| at(&xd, i) + at(&yd, i)).collect();
            close(&read::<f32>(&x.add(&y).unwrap()).await, &sum, 1e-6, &format!("add, {what}"));
            let scaled: Vec<f32> = (0..n).map(|i| at(&xd, i) * 3.0).collect();
            close(&read::<f32>(&x.mul_scalar(3.0).unwrap()).await, &scaled, 1e-6, &format!("mul_scalar, {what}"));
            x.addcmul_(&y, &z, 0.5).unwrap();
            let expected: Vec<f32> = (0..n).map(|i| at(&xd, i) + 0.5 * at(&yd, i) * at(&zd, i)).collect();
            close(&read::<f32>(&x).await, &expected, 1e-6, &format!("addcmul_, {what}"));
            y.fill_(2.5).unwrap();
            assert_eq!(read::<f32>(&y).await, vec![2.5; n], "fill_, {what}");
        }
    }
}

/// Every matmul kernel variant against the CPU reference: odd shapes (edges of every tile),
/// random views (transposed, narrowed), aligned contiguous operands (the 128-bit loads), a batch
/// with a broadcast operand, and f16 on this device's path.
/// matmul's kernel is measured once per class of shapes (awaited here, as the web must) and
/// used for every shape of the class; products too small to measure keep the fixed rule.
pub async fn matmul_kernels_are_chosen_per_class_of_shapes(dev: &Device) {
    use tensormem::tensor::MatmulKernel;
    let kernel = dev.tune_matmul(DType::F32, 300, 300, 300).await;
    assert!(MatmulKernel::CANDIDATES.contains(&kernel), "{kernel:?}");
    assert_eq!(dev.matmul_kernel(DType::F32, 511, 400, 260), kernel, "the same class (each side 256 to 511)");
    assert_eq!(dev.matmul_kernel(DType::F32, 10, 300, 300), MatmulKernel::heuristic(10, 300));
}

pub async fn matmul_variants_match_the_reference(dev: &Device) {
    use tensormem::tensor::MatmulKernel;
    let mut rng = Rng(99);
    for kind in MatmulKernel::ALL {
        for case in 0..6 {
            // The last case spans several blocks of the largest tiles (128) and steps of k.
            let (m, k, n) = if case == 5 {
                (129 + rng.below(90), 33 + rng.below(40), 129 + rng.below(90))
            } else {
                (1 + rng.below(90), 1 + rng.below(40), 1 + rng.below(90))
            };
            let (a, a_base) = random_view(dev, &mut rng, &[m, k]);
            let (b, b_base) = random_view(dev, &mut rng, &[k, n]);
            let expected = reference_matmul(&gather(&a_base, a.layout()), &gather(&b_base, b.layout()), m, k, n);
            let c = a.matmul_with(&b, kind).unwrap();
            assert_eq!(c.shape(), &[m, n]);
            close(&read::<f32>(&c).await, &expected, 1e-5, &format!("case {case} {kind:?} {m}x{k}x{n}"));
        }
        // Contiguous, k and n multiples of 4 (128-bit loads), m and n off every tile edge.
        let (batches, m, k, n) = (3, 37, 44, 52);
        let a_data = rng.f32s(batches * m * k);
        let b_data = rng.f32s(k * n);
        let a = dev.from_slice(&a_data, &[batches, m, k]).unwrap();
        let b = dev.from_slice(&b_data, &[k, n]).unwrap();
        // [3, m, k] @ [k, n] folds into one product; expanding b makes it a real batch.
        let c = a.matmul_with(&b, kind).unwrap();
        let b3 = b.unsqueeze(0).unwrap().expand(&[batches, k, n]).unwrap();
        let c3 = a.matmul_with(&b3, kind).unwrap();
        let expected: Vec<f32> = (0..batches).flat_map(|i| reference_matmul(&a_data[i * m * k..(i + 1) * m * k], &b_data, m, k, n)).collect();
        close(&read::<f32>(&c).await, &expected, 1e-5, &format!("{kind:?} aligned {batches}x{m}x{k}x{n}"));
        close(&read::<f32>(&c3).await, &expected, 1e-5, &format!("{kind:?} batched {batches}x{m}x{k}x{n}"));
        // f16 (odd sizes: elements straddle words on the packed path), accumulated in f32.
        let (m, k, n) = (13, 23, 19);
        let to_f16 = |v: Vec<f32>| v.into_iter().map(half::f16::from_f32).collect::<Vec<_>>();
        let (a16, b16) = (to_f16(rng.f32s(m * k)), to_f16(rng.f32s(k * n)));
        let widen = |v: &[half::f16]| v.iter().map(|x| x.to_f32()).collect::<Vec<_>>();
        let expected = reference_matmul(&widen(&a16), &widen(&b16), m, k, n);
        let a = dev.from_slice(&a16, &[m, k]).unwrap();
        let b = dev.from_slice(&b16, &[k, n]).unwrap();
        let c = read::<half::f16>(&a.matmul_with(&b, kind).unwrap()).await;
        close(&widen(&c), &expected, 2e-3, &format!("{kind:?} f16 {m}x{k}x{n}"));
    }
    // Aligned rows take 128-bit loads; a slice starting one column in cannot, and must agree.
    let (m, k, n) = (70, 36, 68);
    let a_data = rng.f32s(m * k);
    let wide = rng.f32s(k * (n + 4));
    let a = dev.from_slice(&a_data, &[m, k]).unwrap();
    let w = dev.from_slice(&wide, &[k, n + 4]).unwrap();
    for start in [0, 1] {
        let b = w.narrow(1, start, n).unwrap();
        let expected = reference_matmul(&a_data, &gather(&wide, b.layout()), m, k, n);
        close(&read::<f32>(&a.matmul(&b).unwrap()).await, &expected, 1e-5, &format!("aligned matmul from column {start}"));
    }
    // Batched with broadcasting: [2, 1, 3, 4] @ [5, 4, 2] -> [2, 5, 3, 2].
    let a_data = rng.f32s(2 * 3 * 4);
    let b_data = rng.f32s(5 * 4 * 2);
    let a = dev.from_slice(&a_data, &[2, 1, 3, 4]).unwrap();
    let b = dev.from_slice(&b_data, &[5, 4, 2]).unwrap();
    let c = a.matmul(&b).unwrap();
    assert_eq!(c.shape(), &[2, 5, 3, 2]);
    let got = read::<f32>(&c).await;
    for i in 0..2 {
        for j in 0..5 {
            let expected = reference_matmul(&a_data[i * 12..(i + 1) * 12], &b_data[j * 8..(j + 1) * 8], 3, 4, 2);
            close(&got[(i * 5 + j) * 6..(i * 5 + j + 1) * 6], &expected, 1e-5, "batched");
        }
    }
    // A transposed input is read in place; a broadcast (stride-0) one is copied first, as PyTorch
    // does before calling BLAS, and the copy shows in the memory history.
    let x = dev.ones(&[64, 32], DType::F32).unwrap();
    let w = dev.ones(&[16, 32], DType::F32).unwrap();
    let allocated = dev.memory_allocated();
    let y = x.matmul(&w.t().unwrap()).unwrap();
    assert_eq!(dev.memory_allocated(), allocated + 4096, "x @ w.t(): only the [64, 16] output");
    drop(y);
    let row = dev.ones(&[32], DType::F32).unwrap();
    let broadcast = row.unsqueeze(0).unwrap().expand(&[16, 32]).unwrap().t().unwrap();
    let events_before = dev.snapshot().device_traces[0].len();
    let y = x.matmul(&broadcast).unwrap();
    let trace = dev.snapshot().device_traces[0][events_before..].to_vec();
    let allocs: Vec<(u64, String)> =
        trace.iter().filter(|e| e.action == tensormem::trace::Action::Alloc).map(|e| (e.size, e.frames.as_ref().unwrap()[0].name.clone())).collect();
    assert_eq!(allocs, vec![(2048, "clone".to_string()), (4096, "matmul".to_string())], "the copy, then the output");
    assert_eq!(read::<f32>(&y).await, vec![32.0; 64 * 16]);
    // Vector cases lose the added dimension.
    let v = dev.from_slice(&[1.0f32, 2.0, 3.0, 4.0], &[4]).unwrap();
    assert_eq!(v.matmul(&v).unwrap().shape(), &[] as &[usize]);
    assert_eq!(read::<f32>(&v.matmul(&v).unwrap()).await, vec![30.0]);
    assert!(a.matmul(&a).unwrap_err().to_string().contains("inner dimensions 4 and 3 differ"));
}

/// The f16 program both ways: natively (shader-f16) and packed two to a u32 word, the path of
/// adapters without shader-f16 such as the browser's software one.
pub async fn f16_program(dev: &Device) {
    use half::f16;
    let data: Vec<f16> = (0..63).map(|i| f16::from_f32(i as f32 * 0.25 - 4.0)).collect();
    // 7x9: odd sizes, so elements straddle u32 words and rows start at odd element offsets.
    let x = dev.from_slice(&data, &[7, 9]).unwrap();
    assert_eq!(x.storage_bytes(), 126);
    assert_eq!(read::<f16>(&x).await, data);
    let y = x.narrow(1, 1, 7).unwrap().t().unwrap().add(&x.narrow(1, 2, 7).unwrap().t().unwrap()).unwrap().relu().unwrap();
    let got = read::<f16>(&y).await;
    for r in 0..7 {
        for c in 0..7 {
            let expected = (data[c * 9 + r + 1].to_f32() + data[c * 9 + r + 2].to_f32()).max(0.0);
            assert_eq!(got[r * 7 + c].to_f32(), expected, "({r}, {c})");
        }
    }
    // In place on a strided column: neighbouring halves of each word must survive.
    x.narrow(1, 3, 1).unwrap().fill_(1.5).unwrap();
    let after = read::<f16>(&x).await;
    for (i, v) in after.iter().enumerate() {
        let expected = if i % 9 == 3 { 1.5 } else { data[i].to_f32() };
        assert_eq!(v.to_f32(), expected, "element {i}");
    }
    let s = x.sum(&[1], false).unwrap();
    let expected: Vec<f32> = (0..7).map(|r| (0..9).map(|c| after[r * 9 + c].to_f32()).sum()).collect();
    close(&read::<f16>(&s).await.iter().map(|v| v.to_f32()).collect::<Vec<_>>(), &expected, 1e-3, "f16 sum");
    let m = x.matmul(&x.t().unwrap()).unwrap();
    assert_eq!((m.dtype(), m.shape()), (DType::F16, &[7usize, 7][..]));
    let mm = read::<f16>(&m).await;
    let reference: f32 = (0..9).map(|c| after[c].to_f32() * after[9 + c].to_f32()).sum();
    assert!((mm[1].to_f32() - reference).abs() <= 0.02 * reference.abs().max(1.0), "{} vs {reference}", mm[1]);

    // Contiguous and aligned (natively: four halves a load): whole workgroups and a partial one,
    // a partial last quad, and a view starting at an odd element (element at a time).
    let mut rng = Rng(31);
    let halves = |n: usize, rng: &mut Rng| rng.f32s(n).iter().map(|&v| f16::from_f32(v * 4.0)).collect::<Vec<_>>();
    let n = 8192 + 1024 + 6;
    let (xd, yd) = (halves(n + 1, &mut rng), halves(n + 1, &mut rng));
    for start in [0, 1] {
        let view = |d: &[f16]| dev.from_slice(d, &[n + 1]).unwrap().narrow(0, start, n).unwrap();
        let (x, y) = (view(&xd), view(&yd));
        let sum: Vec<f16> = (0..n).map(|i| f16::from_f32(xd[start + i].to_f32() + yd[start + i].to_f32())).collect();
        assert_eq!(read::<f16>(&x.add(&y).unwrap()).await, sum, "f16 add of {n} from {start}: one rounding, as f32 then rounded");
        x.mul_(&y).unwrap();
        let product: Vec<f16> = (0..n).map(|i| f16::from_f32(xd[start + i].to_f32() * yd[start + i].to_f32())).collect();
        assert_eq!(read::<f16>(&x).await, product, "f16 mul_ of {n} from {start}");
    }
    // Rows of k = 16 and n = 20 halves (multiples of 4) times a batch of 3.
    let (a, b) = (halves(3 * 12 * 16, &mut rng), halves(16 * 20, &mut rng));
    let c = dev.from_slice(&a, &[3, 12, 16]).unwrap().matmul(&dev.from_slice(&b, &[16, 20]).unwrap()).unwrap();
    let got = read::<f16>(&c).await;
    for (i, g) in got.iter().enumerate() {
        let (row, col) = (i / 20, i % 20);
        let exact: f32 = (0..16).map(|k| a[row * 16 + k].to_f32() * b[k * 20 + col].to_f32()).sum();
        assert!((g.to_f32() - exact).abs() <= 2e-3 * (1.0 + exact.abs()), "aligned f16 matmul [{row}, {col}]: {g} vs {exact}");
    }
}

/// f16 on this device's path (native where shader-f16 exists, else packed).
pub async fn float16(dev: &Device) {
    f16_program(dev).await;
}

/// bfloat16 (which WGSL lacks) packed two to a word: values round to nearest even as PyTorch's
/// conversion, arithmetic and matmul compute in f32 and store rounded, odd lengths and views
/// included.
pub async fn bfloat16(dev: &Device) {
    use half::bf16;
    let mut rng = Rng(29);
    let to_bf16 = |v: &[f32]| v.iter().map(|&x| bf16::from_f32(x)).collect::<Vec<_>>();
    let (a, b) = (rng.f32s(7 * 5), rng.f32s(5 * 3));
    let (ha, hb) = (to_bf16(&a), to_bf16(&b));
    let x = dev.from_slice(&ha, &[7, 5]).unwrap();
    let y = dev.from_slice(&hb, &[5, 3]).unwrap();
    assert_eq!(read::<bf16>(&x).await, ha, "upload and readback");
    // From f32, round to nearest even (1 + 2^-8 is a tie: it rounds to 1), NaN and inf kept.
    let special = [1.0f32 + 1.0 / 256.0, 1.0 + 3.0 / 256.0, -3.3e38, f32::INFINITY, f32::NAN, 1e-40];
    let converted = read::<bf16>(&dev.from_slice(&special, &[6]).unwrap().to(DType::BF16).unwrap()).await;
    let expected = to_bf16(&special);
    for (got, want) in converted.iter().zip(&expected) {
        assert!(got.to_bits() == want.to_bits() || (got.is_nan() && want.is_nan()), "{got} vs {want}");
    }
    // x^T's rows times y: a transposed view, f32 accumulation, one bf16 rounding at the end.
    let xt = x.t().unwrap();
    let product = read::<bf16>(&xt.narrow(0, 1, 3).unwrap().matmul(&dev.from_slice(&to_bf16(&rng.f32s(7 * 2)), &[7, 2]).unwrap()).unwrap()).await;
    assert_eq!(product.len(), 6);
    let z = read::<bf16>(&x.matmul(&y).unwrap()).await;
    for i in 0..7 {
        for j in 0..3 {
            let exact: f32 = (0..5).map(|k| ha[i * 5 + k].to_f32() * hb[k * 3 + j].to_f32()).sum();
            assert!((z[i * 3 + j].to_f32() - exact).abs() <= 1e-2 * (1.0 + exact.abs()), "matmul [{i}, {j}]: {} vs {exact}", z[i * 3 + j]);
        }
    }
    let sum = read::<bf16>(&x.add(&x).unwrap()).await;
    assert_eq!(sum, ha.iter().map(|v| bf16::from_f32(v.to_f32() * 2.0)).collect::<Vec<_>>(), "x + x doubles exactly");
    let odd = dev.from_slice(&ha[..35], &[35]).unwrap().mul_scalar(0.5).unwrap();
    assert_eq!(read::<bf16>(&odd).await, ha.iter().map(|v| bf16::from_f32(v.to_f32() * 0.5)).collect::<Vec<_>>());
    assert_eq!(read::<f32>(&x.to(DType::F32).unwrap()).await, ha.iter().map(|v| v.to_f32()).collect::<Vec<_>>());
}

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
        let on_gpu: Vec<_> = gpu_dev.snapshot().device_traces[0][before..].iter().map(|e| (e.action, e.size)).collect();
        let before = sim_dev.snapshot().device_traces[0].len();
        program(&sim_dev);
        let on_sim: Vec<_> = sim_dev.snapshot().device_traces[0][before..].iter().map(|e| (e.action, e.size)).collect();
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
        let entries: Vec<_> = d.snapshot().device_traces[0][before..]
            .iter()
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
            let events: Vec<_> = snapshot.device_traces[0][start..]
                .iter()
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
