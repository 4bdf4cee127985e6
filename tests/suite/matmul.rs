//! Matmul: what ATen allocates around it (cuBLAS workspaces), the kernel chosen per class of
//! shapes, every variant against the reference, and the half-precision types.

use super::*;

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
    let trace = dev.snapshot().device_traces[0].range(events_before..).map(|e| e.owned()).collect::<Vec<_>>();
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
