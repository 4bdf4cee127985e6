//! Measuring matmul kernels on the adapter (see `device::tune` for the classes and the cache
//! file): scratch buffers outside the caching allocator, each candidate timed.

use super::super::tune::{MatmulChoice, MatmulClass, MatmulTuning};
use super::super::{Arg, Bindings, Device, DeviceError};
use crate::dtype::DType;
use crate::kernels::matmul::{MatmulKernel, matmul_kernel};
use crate::kernels::{Grid, MatmulMeta, MatrixLayout};
use std::collections::BTreeMap;

impl Device {
    /// The kernel `matmul` uses for `class` on this device, measuring the candidates if the
    /// class is new. Natively the first call waits for the measurement; on the web it cannot
    /// block, so the class uses the fixed rule until a measurement started in the background
    /// lands (or `tune_matmul` is awaited).
    pub(crate) fn matmul_kernel_for(&self, class: MatmulClass) -> MatmulKernel {
        if let Some(known) = self.known_matmul_kernel(class) {
            return known;
        }
        #[cfg(not(target_arch = "wasm32"))]
        {
            // Natively the device waits inside `wait_idle`: the future is ready when first polled.
            block_on(self.tune_matmul_class(class))
        }
        #[cfg(target_arch = "wasm32")]
        {
            let device = self.clone();
            wasm_bindgen_futures::spawn_local(async move {
                device.tune_matmul_class(class).await;
            });
            class.heuristic
        }
    }

    /// The kernel for `class` if no measurement is needed (the rule says so, or the class was
    /// measured in this process or an earlier one). Otherwise marks the class as being measured
    /// and returns None.
    fn known_matmul_kernel(&self, class: MatmulClass) -> Option<MatmulKernel> {
        let Some(ctx) = self.gpu_context() else { return Some(class.heuristic) };
        let mut tuning = ctx.tuning.borrow_mut();
        match tuning.choice {
            MatmulChoice::Fixed(kernel) => return Some(kernel),
            MatmulChoice::Heuristic => return Some(class.heuristic),
            MatmulChoice::Measure if !class.measured => return Some(class.heuristic),
            MatmulChoice::Measure => {}
        }
        if let Some(known) = tuning.known.get(&class) {
            // None: a measurement is under way (on the web); the rule stands in meanwhile.
            return Some(known.unwrap_or(class.heuristic));
        }
        let remembered = tuning.remembered(&class);
        tuning.known.insert(class, remembered);
        remembered
    }

    /// The kernel `matmul` uses on this device for contiguous m x k and k x n operands of
    /// `dtype`, measuring it first if its class is new (on the web: in the background).
    pub fn matmul_kernel(&self, dtype: DType, m: usize, n: usize, k: usize) -> MatmulKernel {
        self.matmul_kernel_for(MatmulClass::contiguous(dtype, self.native_f16(), m, n, k))
    }

    /// `matmul_kernel`, waiting for the measurement where it is needed: how the web measures a
    /// class before its first use.
    pub async fn tune_matmul(&self, dtype: DType, m: usize, n: usize, k: usize) -> MatmulKernel {
        let class = MatmulClass::contiguous(dtype, self.native_f16(), m, n, k);
        // A measurement under way in the background (on the web) is not waited for: this one
        // measures too, and both record the same kind of answer.
        let under_way = self.gpu_context().is_some_and(|ctx| ctx.tuning.borrow().known.get(&class) == Some(&None));
        match self.known_matmul_kernel(class) {
            Some(kernel) if !under_way => kernel,
            _ => self.tune_matmul_class(class).await,
        }
    }

    /// Measures `class` and records the winner for the process and in the cache file.
    /// (A class no candidate runs for keeps the fixed rule, whose failure `matmul` reports.)
    async fn tune_matmul_class(&self, class: MatmulClass) -> MatmulKernel {
        let largest = self.gpu_context().map_or(256, |ctx| ctx.tuning.borrow().largest);
        let [m, n, k] = class.representative(largest);
        let tuning = self.measure_matmul(class.dtype, m, n, k, class.vec4).await;
        let ctx = self.gpu_context().expect("tuning runs on GPU devices");
        let mut state = ctx.tuning.borrow_mut();
        let kernel = tuning.as_ref().ok().and_then(|t| MatmulKernel::from_name(&t.kernel)).unwrap_or(class.heuristic);
        state.known.insert(class, Some(kernel));
        if let Ok(t) = &tuning {
            state.remember(&class, t);
        }
        kernel
    }

    /// The kernels measured for products of `dtype` on this device (`vec4`: whether A's and
    /// B's rows load four elements at a time): those whose workgroup memory the adapter allows,
    /// staged ones only on a GPU (on CPU adapters they never led: lavapipe ran them at 10
    /// GFLOP/s against register8x8's 17) and for operands that both load four elements at a
    /// time (f32, native f16, rows a multiple of 4), the only ones they were measured with on
    /// an H100.
    pub fn matmul_candidates(&self, dtype: DType, vec4: [bool; 2]) -> Vec<MatmulKernel> {
        let Some(adapter) = self.adapter() else { return Vec::new() };
        let staged = !adapter.runs_on_cpu && crate::kernels::loads_quads(dtype, adapter.native_f16) && vec4 == [true, true];
        MatmulKernel::CANDIDATES
            .into_iter()
            .filter(|&c| c.workgroup_bytes() <= adapter.max_compute_workgroup_storage_size)
            .filter(|&c| staged || !matches!(c, MatmulKernel::Staged(_)))
            .collect()
    }

    /// Times every candidate kernel on an m x k times k x n product of `dtype` in scratch
    /// buffers (`vec4`: whether A and B are laid out for 128-bit loads). Work already queued
    /// is finished first, so that it is not counted.
    pub async fn measure_matmul(&self, dtype: DType, m: usize, n: usize, k: usize, vec4: [bool; 2]) -> Result<MatmulTuning, DeviceError> {
        let ctx = self.gpu_context().ok_or_else(|| DeviceError::Unsupported("matmul kernels are measured on GPU devices".into()))?;
        let started = super::super::now_s();
        let size = dtype.size() as u64;
        let scratch: Vec<Arg> = [m * n, m * k, k * n]
            .iter()
            .enumerate()
            .map(|(i, &elements)| {
                let bytes = (elements as u64 * size).next_multiple_of(16).max(16);
                let buffer = ctx.device.create_buffer(&wgpu::BufferDescriptor {
                    label: Some("tensormem matmul tuning"),
                    size: bytes,
                    usage: wgpu::BufferUsages::STORAGE,
                    mapped_at_creation: false,
                });
                // Segment numbers no allocator segment has: each buffer binds on its own.
                Arg { buffer, segment: u64::MAX - i as u64, offset: 0, size: bytes }
            })
            .collect();
        let bindings = Bindings::new(&scratch, &[size; 3])?;
        let row_major = |cols: usize| MatrixLayout { offset: 0, batch_stride: 0, row_stride: cols as u32, col_stride: 1 };
        let meta = MatmulMeta { m: m as u32, n: n as u32, k: k as u32, batches: 1, a: row_major(k), b: row_major(n), c: row_major(n) };
        let flops = 2.0 * (m * n * k) as f64;
        let now = super::super::now_s;
        let mut gflops = BTreeMap::new();
        let mut best: Option<(MatmulKernel, f64)> = None;
        // An error the program's own commands raised stays for the program's next wait.
        let error_pending = !ctx.errors.lock().unwrap().is_empty();
        if !error_pending {
            ctx.submit();
            ctx.wait_idle().await?;
        }
        for candidate in self.matmul_candidates(dtype, vec4) {
            if error_pending {
                break;
            }
            let Ok((kernel, groups)) = matmul_kernel(candidate, dtype, self.native_f16(), &bindings.plan, vec4, m, n, 1) else { continue };
            let run = |times: u32| -> Result<(), DeviceError> {
                for _ in 0..times {
                    self.launch(&kernel, &meta, &bindings, Grid::Groups(groups))?;
                }
                ctx.submit();
                Ok(())
            };
            // Untimed: compiles the pipeline. A candidate the adapter rejects is left out.
            let scope = ctx.device.push_error_scope(wgpu::ErrorFilter::Validation);
            let launched = run(1);
            if scope.pop().await.is_some() || launched.is_err() {
                continue;
            }
            ctx.wait_idle().await?;
            let timed = async |times: u32| -> Result<f64, DeviceError> {
                let start = now();
                run(times)?;
                ctx.wait_idle().await?;
                // A clock of coarse resolution may see no time pass.
                Ok(((now() - start) / times as f64).max(1e-9))
            };
            let once = timed(1).await?;
            // A candidate far behind the best is not timed again: it cannot win.
            // Else the fastest of three timings: one alone is noisy (a GPU raising its clocks, a
            // busy CPU adapter; on an H100 one timing each once ranked register4x4 above
            // register8x8 at 2,048, which is 1.5x faster there).
            let seconds = if best.is_some_and(|(_, b)| once > 4.0 * b) {
                once
            } else {
                let times = ((0.005 / once).ceil() as u32).clamp(1, 8);
                let mut fastest = timed(times).await?;
                for _ in 0..2 {
                    fastest = fastest.min(timed(times).await?);
                }
                fastest
            };
            gflops.insert(candidate.name(), flops / seconds / 1e9);
            if best.is_none_or(|(_, b)| seconds < b) {
                best = Some((candidate, seconds));
            }
        }
        for arg in &scratch {
            arg.buffer.destroy();
        }
        let (kernel, _) = best.ok_or_else(|| {
            DeviceError::Unsupported(if error_pending {
                "a GPU error is waiting to be reported; matmul kernels were not measured".to_string()
            } else {
                format!("no matmul kernel runs for {dtype} on this adapter")
            })
        })?;
        Ok(MatmulTuning { kernel: kernel.name(), gflops, seconds: now() - started })
    }
}

/// Runs a future whose waits are synchronous natively (`device.poll` blocks), so it completes
/// without a real executor.
#[cfg(not(target_arch = "wasm32"))]
fn block_on<F: std::future::Future>(future: F) -> F::Output {
    let mut future = std::pin::pin!(future);
    let mut cx = std::task::Context::from_waker(std::task::Waker::noop());
    loop {
        if let std::task::Poll::Ready(out) = future.as_mut().poll(&mut cx) {
            return out;
        }
        std::thread::yield_now();
    }
}
