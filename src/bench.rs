//! Engine speed, each figure beside a baseline measured in the same run on the same adapter, so
//! that ratios hold across machines: matmul against the naive one-thread-per-output kernel,
//! elementwise against the device's own `copy_buffer_to_buffer`, a loop of small ops whose
//! outputs come from the caching allocator against the same loop on a device that creates and
//! destroys a buffer per tensor. Runs natively (`tensormem bench`) and in the browser.

use crate::device::{Device, GpuOptions, now_s};
use crate::tensor::MatmulKernel;
use crate::{DType, Tensor};
use serde::Serialize;
use std::collections::BTreeMap;

#[derive(Debug, Clone, Serialize)]
pub struct MatmulFigure {
    pub m: usize,
    pub n: usize,
    pub k: usize,
    /// The kernel `matmul` picks for this shape, and its speed.
    pub kernel: String,
    pub gflops: f64,
    /// The baseline: one invocation per output element.
    pub naive_gflops: f64,
    /// Every optimised variant's speed, by name.
    pub variants: BTreeMap<String, f64>,
    /// What measuring the candidates costs the first use of this class of shapes on an adapter
    /// (pipelines compiled, each timed once or more); later runs read the choice from a file.
    pub tuning_ms: f64,
}

/// Bandwidths count the bytes read plus the bytes written (a copy of n bytes moves 2n, an add
/// of n floats 12n), as CUDA's bandwidthTest and STREAM count them.
#[derive(Debug, Clone, Serialize)]
pub struct BenchReport {
    pub adapter: String,
    pub matmul: Vec<MatmulFigure>,
    /// The device's own buffer-to-buffer copy: the practical ceiling for elementwise kernels.
    pub copy_gbps: f64,
    /// `x + y` on contiguous f32 tensors of `elementwise_elements` elements.
    pub elementwise_gbps: f64,
    /// `y.copy_(x)` by tensormem's elementwise kernel: the ceiling a compute shader reaches here.
    pub elementwise_copy_gbps: f64,
    /// Sums of the same elements, bytes read per second: over rows of 1024 (one output per row),
    /// and over the whole tensor (one output).
    pub reduction_gbps: [f64; 2],
    pub elementwise_elements: usize,
    /// Small ops (an add of 64 Ki f32) per second, outputs from the caching allocator ...
    pub cached_op_loop_per_s: f64,
    /// ... and the same loop with a fresh buffer created (and destroyed) per output.
    pub fresh_buffer_op_loop_per_s: f64,
    /// Microseconds per tiny op (an in-place add of 4 elements): recording and running one
    /// dispatch, the floor under every op of a training step.
    pub dispatch_us: f64,
    /// Microseconds the host spends recording one such op (binding its operands, writing its
    /// metadata, recording the dispatch) and submitting it, in batches of 200 after a wait (on a
    /// GPU: submitted after 1, 3, 7 ... 127 of them), the GPU not waited for: the part of
    /// `dispatch_us` the engine controls.
    pub record_us: f64,
    /// Allocation and free of a 1 MiB tensor through the caching allocator, per second.
    pub alloc_free_per_s: f64,
}

#[derive(Debug, Clone)]
pub struct BenchOptions {
    /// Square matmul sizes.
    pub sizes: Vec<usize>,
    pub elementwise_elements: usize,
    /// Seconds to spend on each figure (at least two calls are timed).
    pub budget_s: f64,
}

impl Default for BenchOptions {
    fn default() -> BenchOptions {
        BenchOptions { sizes: vec![256, 512, 1024], elementwise_elements: 16 << 20, budget_s: 1.0 }
    }
}

fn text(e: impl std::fmt::Display) -> String {
    e.to_string()
}

/// Seconds per call of `f`, after one untimed call (compiling pipelines), calling until `budget`
/// seconds have passed and at least `min_calls` times; the GPU is waited for every `batch` calls
/// and at the end, so queued work is paid for. For loops of small ops, where that round trip is
/// part of what a program pays.
async fn time_per_call(dev: &Device, budget: f64, min_calls: u32, batch: u32, mut f: impl FnMut() -> Result<(), String>) -> Result<f64, String> {
    f()?;
    dev.wait().await.map_err(text)?;
    let start = now_s();
    let mut calls = 0;
    while calls < min_calls || now_s() - start < budget {
        f()?;
        calls += 1;
        if calls % batch == 0 {
            dev.wait().await.map_err(text)?;
        }
    }
    dev.wait().await.map_err(text)?;
    Ok((now_s() - start) / calls as f64)
}

/// Seconds per call of `f` run back to back, as CUDA events around a batch of calls time
/// PyTorch's kernels (tools/bench/torch_bench.py): after one untimed call, batches of about
/// 20 ms, the GPU waited for once per batch, until `budget` seconds have passed (at least three
/// batches, two when a call alone takes a quarter of the budget); the median batch's time per
/// call. Waiting every few calls would add the queue's round trip, tens of microseconds on
/// Vulkan, to kernels that themselves take tens.
async fn back_to_back(dev: &Device, budget: f64, mut f: impl FnMut() -> Result<(), String>) -> Result<f64, String> {
    f()?;
    dev.wait().await.map_err(text)?;
    let start = now_s();
    f()?;
    dev.wait().await.map_err(text)?;
    let one = (now_s() - start).max(1e-7);
    let batch = ((0.02 / one).ceil() as u32).clamp(1, 256);
    let least = if one > budget / 4.0 { 2 } else { 3 };
    let mut per_call = Vec::new();
    let begin = now_s();
    while per_call.len() < least || now_s() - begin < budget {
        let t = now_s();
        for _ in 0..batch {
            f()?;
        }
        dev.wait().await.map_err(text)?;
        per_call.push((now_s() - t) / batch as f64);
    }
    per_call.sort_by(f64::total_cmp);
    Ok(per_call[per_call.len() / 2])
}

fn filled(dev: &Device, shape: &[usize]) -> Result<Tensor, String> {
    let n: usize = shape.iter().product();
    let data: Vec<f32> = (0..n).map(|i| ((i * 7919) % 1000) as f32 / 1000.0).collect();
    dev.from_slice(&data, shape).map_err(text)
}

/// Runs every measurement on `dev` (a GPU device), reporting each step to `progress`.
pub async fn run(dev: &Device, options: &BenchOptions, progress: &mut dyn FnMut(&str)) -> Result<BenchReport, String> {
    if dev.is_sim() {
        return Err("the benchmark needs a GPU device".into());
    }
    let adapter = dev.adapter().map(|a| format!("{} ({}, {})", a.name, a.backend, a.device_type)).unwrap_or_default();
    let budget = options.budget_s;
    let mut matmul = Vec::new();
    for &s in &options.sizes {
        let (a, b) = (filled(dev, &[s, s])?, filled(dev, &[s, s])?);
        let gflops = |seconds: f64| 2.0 * (s as f64).powi(3) / seconds / 1e9;
        // Before the variants run, so that the first size pays the pipelines' compilation as a
        // first use on a new adapter does.
        progress(&format!("matmul {s}x{s}x{s}: measuring the candidates as a first use does"));
        let tuning = dev.measure_matmul(DType::F32, s.min(256), s.min(256), s.min(256), [true, true]).await.map_err(text)?;
        let mut variants = BTreeMap::new();
        for kind in MatmulKernel::ALL {
            progress(&format!("matmul {s}x{s}x{s}: {}", kind.name()));
            let seconds = back_to_back(dev, budget, || a.matmul_with(&b, kind).map(drop).map_err(text)).await?;
            variants.insert(kind.name(), gflops(seconds));
        }
        let picked = dev.tune_matmul(DType::F32, s, s, s).await.name();
        let naive_gflops = variants.remove("naive").unwrap_or_default();
        matmul.push(MatmulFigure { m: s, n: s, k: s, gflops: variants[&picked], kernel: picked, naive_gflops, variants, tuning_ms: tuning.seconds * 1e3 });
    }

    let n = options.elementwise_elements;
    progress(&format!("copy_buffer_to_buffer of {} MiB", (n * 4) >> 20));
    let bytes = (n * 4) as u64;
    let probe = dev.copy_probe(bytes).ok_or("the benchmark needs a GPU device")?;
    let copy = back_to_back(dev, budget, || {
        probe.copy();
        Ok(())
    })
    .await?;
    drop(probe);
    let copy_gbps = 2.0 * bytes as f64 / copy / 1e9;

    progress(&format!("elementwise add of {n} f32"));
    let (x, y) = (filled(dev, &[n])?, filled(dev, &[n])?);
    let add = back_to_back(dev, budget, || x.add(&y).map(drop).map_err(text)).await?;
    let elementwise_gbps = 12.0 * n as f64 / add / 1e9;
    // A kernel's own copy (read n, write n): what a compute shader reaches on this adapter.
    let copy_kernel = back_to_back(dev, budget, || y.copy_(&x).map(drop).map_err(text)).await?;
    let elementwise_copy_gbps = 8.0 * n as f64 / copy_kernel / 1e9;

    progress(&format!("sums of {n} f32: rows of 1024, and the whole tensor"));
    let rows = x.view(&[(n / 1024) as isize, 1024]).map_err(text)?;
    let row_sum = back_to_back(dev, budget, || rows.sum(&[-1], false).map(drop).map_err(text)).await?;
    let total_sum = back_to_back(dev, budget, || x.sum(&[], false).map(drop).map_err(text)).await?;
    let reduction_gbps = [4.0 * n as f64 / row_sum / 1e9, 4.0 * n as f64 / total_sum / 1e9];
    drop((x, y, rows));

    progress("small-op loop, cached and fresh buffers");
    let small_op_loop = async |dev: &Device| -> Result<f64, String> {
        let x = filled(dev, &[64 << 10])?;
        let seconds = time_per_call(dev, budget, 100, 64, || x.add(&x).map(drop).map_err(text)).await?;
        Ok(1.0 / seconds)
    };
    let cached_op_loop_per_s = small_op_loop(dev).await?;
    // What one op costs beyond its data: an in-place add of 4 elements, dispatches queued in
    // batches as a training step queues them.
    progress("dispatch: in-place adds of 4 elements");
    let (a, b) = (filled(dev, &[4])?, filled(dev, &[4])?);
    let dispatch_us = 1e6 * time_per_call(dev, budget, 100, 256, || a.add_(&b).map(drop).map_err(text)).await?;
    // Batches of 200 after a wait, as a program's ops come after a `.item()`: recorded, and on a
    // GPU submitted in the batches that double from one (`GpuContext::submit_at`).
    let mut record_s = Vec::new();
    for _ in 0..20 {
        dev.wait().await.map_err(text)?;
        let start = now_s();
        for _ in 0..200 {
            a.add_(&b).map_err(text)?;
        }
        record_s.push((now_s() - start) / 200.0);
    }
    dev.wait().await.map_err(text)?;
    record_s.sort_by(f64::total_cmp);
    let record_us = 1e6 * record_s[record_s.len() / 2];
    drop((a, b));
    let fresh = Device::gpu(GpuOptions { uncached: true, ..Default::default() }).await.map_err(text)?;
    let fresh_buffer_op_loop_per_s = small_op_loop(&fresh).await?;

    progress("allocator: alloc + free of 1 MiB");
    let count = 20_000;
    let start = now_s();
    for _ in 0..count {
        drop(dev.empty(&[1 << 18], DType::F32).map_err(text)?);
    }
    let alloc_free_per_s = count as f64 / (now_s() - start);
    Ok(BenchReport {
        adapter,
        matmul,
        copy_gbps,
        elementwise_gbps,
        elementwise_copy_gbps,
        reduction_gbps,
        elementwise_elements: n,
        cached_op_loop_per_s,
        fresh_buffer_op_loop_per_s,
        dispatch_us,
        record_us,
        alloc_free_per_s,
    })
}
