//! `tensormem bench`: kernel and allocator speed, each against a baseline measured in the same
//! run (the naive matmul kernel, raw wgpu buffer creation), so ratios hold across machines.

use serde::Serialize;
use std::time::Instant;
use tensormem::tensor::MatmulKernel;
use tensormem::{DType, Device, Tensor};

#[derive(Serialize)]
pub struct MatmulFigure {
    pub m: usize,
    pub n: usize,
    pub k: usize,
    /// The better of the two optimised kernels.
    pub gflops: f64,
    pub tiled_gflops: f64,
    pub blocked_gflops: f64,
    pub naive_gflops: f64,
}

#[derive(Serialize)]
pub struct BenchReport {
    pub adapter: String,
    pub matmul: Vec<MatmulFigure>,
    pub elementwise_gbps: f64,
    pub alloc_free_per_s: f64,
    pub create_buffer_per_s: f64,
}

fn wait(dev: &Device) -> Result<(), String> {
    pollster::block_on(dev.wait()).map_err(|e| e.to_string())
}

/// Seconds per call of `f`, repeated until about `budget` seconds have passed (at least twice).
fn time_per_call(dev: &Device, budget: f64, mut f: impl FnMut() -> Result<(), String>) -> Result<f64, String> {
    f()?;
    wait(dev)?;
    let start = Instant::now();
    let mut calls = 0u32;
    while calls < 2 || start.elapsed().as_secs_f64() < budget {
        f()?;
        calls += 1;
        if calls.is_multiple_of(4) {
            wait(dev)?;
        }
    }
    wait(dev)?;
    Ok(start.elapsed().as_secs_f64() / calls as f64)
}

fn random(dev: &Device, shape: &[usize]) -> Result<Tensor, String> {
    let n: usize = shape.iter().product();
    let data: Vec<f32> = (0..n).map(|i| ((i * 7919) % 1000) as f32 / 1000.0).collect();
    dev.from_slice(&data, shape).map_err(|e| e.to_string())
}

pub fn run(dev: &Device, sizes: &[usize], progress: &mut dyn FnMut(&str)) -> Result<BenchReport, String> {
    let adapter = dev.adapter().map(|a| format!("{} ({}, {})", a.name, a.backend, a.device_type)).unwrap_or_else(|| dev.name().into());
    let mut matmul = Vec::new();
    for &s in sizes {
        progress(&format!("matmul {s}x{s}x{s}"));
        let (a, b) = (random(dev, &[s, s])?, random(dev, &[s, s])?);
        let flops = 2.0 * (s as f64).powi(3);
        let run_kernel = |kind| time_per_call(dev, 1.0, || a.matmul_with(&b, kind).map(drop).map_err(|e| e.to_string()));
        let tiled = run_kernel(MatmulKernel::Tiled)?;
        let blocked = run_kernel(MatmulKernel::Blocked)?;
        let naive = run_kernel(MatmulKernel::Naive)?;
        matmul.push(MatmulFigure {
            m: s,
            n: s,
            k: s,
            gflops: flops / blocked.min(tiled) / 1e9,
            tiled_gflops: flops / tiled / 1e9,
            blocked_gflops: flops / blocked / 1e9,
            naive_gflops: flops / naive / 1e9,
        });
    }
    progress("elementwise add");
    let n = 4 << 20;
    let (x, y) = (random(dev, &[n])?, random(dev, &[n])?);
    let out = dev.zeros(&[n], DType::F32).map_err(|e| e.to_string())?;
    // out = x + y in place of a fresh output: 3 x 4 bytes move per element.
    let add = time_per_call(dev, 1.0, || out.copy_(&x).and_then(|o| o.add_(&y)).map(drop).map_err(|e| e.to_string()))?;
    let elementwise_gbps = (n as f64 * 4.0 * 5.0) / add / 1e9;

    progress("allocator vs buffer creation");
    let bytes = 1 << 20;
    let count = 20_000u32;
    let start = Instant::now();
    for _ in 0..count {
        drop(dev.empty(&[bytes / 4], DType::F32).map_err(|e| e.to_string())?);
    }
    let alloc_free_per_s = count as f64 / start.elapsed().as_secs_f64();
    let create = dev.time_buffer_creation(bytes as u64, 2000).ok_or("buffer creation needs a GPU device")?;
    Ok(BenchReport { adapter, matmul, elementwise_gbps, alloc_free_per_s, create_buffer_per_s: 1.0 / create })
}
