//! Which matmul kernel is fastest on this adapter, per class of shapes: measured at the class's
//! first use, remembered for the process and, natively, in a file per machine, so that only the
//! first run on an adapter pays (tens of milliseconds per class, not burn's cold autotune of
//! seconds). The measurement runs on scratch buffers created outside the caching allocator: a
//! trace shows the program's memory, not the tuner's. The kernels themselves are written in
//! `kernels::matmul`; this is the device's side, as cubecl keeps autotune in its runtime.

use super::{Arg, Bindings, Device, DeviceError};
use crate::dtype::DType;
use crate::kernels::matmul::{MatmulKernel, matmul_kernel};
use crate::kernels::{Grid, MatmulMeta, MatrixLayout, loads_quads};
use rustc_hash::FxHashMap;
use serde::{Deserialize, Serialize};
use std::collections::BTreeMap;
use std::path::PathBuf;

/// How `matmul` picks its kernel on a GPU device.
#[derive(Debug, Clone, Default, PartialEq)]
pub enum MatmulChoice {
    /// Measure the candidates at the first use of each class of shapes (the default).
    #[default]
    Measure,
    /// A fixed rule by output size, without measuring (see [`MatmulKernel::heuristic`]).
    Heuristic,
    /// Always this kernel.
    Fixed(MatmulKernel),
}

/// Below this many rows or columns a matmul costs about one dispatch whatever the kernel: not
/// worth measuring.
const MEASURED_FROM: usize = 64;

/// Shapes that share a best kernel: dtype, each dimension's size class and whether the operands
/// allow 128-bit loads.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub(crate) struct MatmulClass {
    dtype: DType,
    /// Size classes of m, n, k: under 64, 256, 1,024 and 4,096, and more (the best kernel at
    /// 256 is not the best at 4,096: bigger tiles win once there are enough of them).
    dims: [u8; 3],
    vec4: [bool; 2],
    /// Whether m and n are large enough to measure.
    measured: bool,
    heuristic: MatmulKernel,
}

impl MatmulClass {
    pub fn new(dtype: DType, m: usize, n: usize, k: usize, a_vec4: bool, b_vec4: bool) -> MatmulClass {
        let class = |d: usize| match d {
            0..64 => 0,
            64..256 => 1,
            256..1024 => 2,
            1024..4096 => 3,
            _ => 4,
        };
        MatmulClass {
            dtype,
            dims: [class(m), class(n), class(k)],
            vec4: [a_vec4, b_vec4],
            measured: m >= MEASURED_FROM && n >= MEASURED_FROM,
            heuristic: MatmulKernel::heuristic(m, n),
        }
    }

    /// Contiguous operands: rows load four elements at a time when their length is a multiple
    /// of 4 (and the type allows it: `loads_quads`).
    pub fn contiguous(dtype: DType, native_f16: bool, m: usize, n: usize, k: usize) -> MatmulClass {
        let vec4 = |cols: usize| loads_quads(dtype, native_f16) && cols.is_multiple_of(4);
        MatmulClass::new(dtype, m, n, k, vec4(k), vec4(n))
    }

    /// The shape measured for the class: the class's own size (2,048 for the largest), so that
    /// kernels are ranked where they will run; at most `largest` a side (a CPU adapter measures
    /// at 256, to take milliseconds).
    fn representative(&self, largest: usize) -> [usize; 3] {
        self.dims.map(|c| [32, 128, 256, 1024, 2048][c as usize].min(largest))
    }

    /// The class in the cache file: `f32 128x256x256 a4 b4`.
    fn key(&self, largest: usize) -> String {
        let [m, n, k] = self.representative(largest);
        let vec4 = |v: bool, name: &str| if v { format!(" {name}4") } else { String::new() };
        format!("{} {m}x{n}x{k}{}{}", self.dtype, vec4(self.vec4[0], "a"), vec4(self.vec4[1], "b"))
    }
}

/// One measurement: each candidate's speed and the winner.
#[derive(Debug, Clone, Serialize, Deserialize)]
pub struct MatmulTuning {
    pub kernel: String,
    pub gflops: BTreeMap<String, f64>,
    /// How long measuring took, compiling the candidates' pipelines included.
    pub seconds: f64,
}

/// A device's choices: the rule, what is known per class (None: being measured, on the web),
/// and the file that keeps them across runs.
pub(crate) struct Tuning {
    choice: MatmulChoice,
    adapter: String,
    known: FxHashMap<MatmulClass, Option<MatmulKernel>>,
    file: Option<PathBuf>,
    /// The largest side measured (see [`MatmulClass::representative`]).
    largest: usize,
}

/// The cache file: per adapter (name, backend, driver), per class, the measurement.
#[derive(Debug, Default, Serialize, Deserialize)]
struct TuningFile {
    format: String,
    adapters: BTreeMap<String, BTreeMap<String, MatmulTuning>>,
}

const FILE_FORMAT: &str = "tensormem matmul tuning 1";

impl Tuning {
    pub fn new(choice: MatmulChoice, adapter: String, file: Option<PathBuf>, runs_on_cpu: bool) -> Tuning {
        let file = file.or_else(default_file);
        // In a browser the measurement runs beside the page, and the adapter may be a software
        // one that does not say so: it stays as cheap as on a CPU adapter.
        let largest = if runs_on_cpu || cfg!(target_arch = "wasm32") { 256 } else { 2048 };
        Tuning { choice, adapter, known: FxHashMap::default(), file, largest }
    }

    /// What the file says for this adapter and class, if it can be read and names a kernel.
    fn remembered(&self, class: &MatmulClass) -> Option<MatmulKernel> {
        let file = read_file(self.file.as_ref()?)?;
        let tuning = file.adapters.get(&self.adapter)?.get(&class.key(self.largest))?;
        MatmulKernel::from_name(&tuning.kernel)
    }

    /// Adds a measurement to the file, keeping what other processes wrote meanwhile. A file
    /// that cannot be written costs the next run a measurement, nothing else.
    fn remember(&self, class: &MatmulClass, tuning: &MatmulTuning) {
        let Some(path) = &self.file else { return };
        let mut file = read_file(path).unwrap_or_default();
        file.format = FILE_FORMAT.to_string();
        file.adapters.entry(self.adapter.clone()).or_default().insert(class.key(self.largest), tuning.clone());
        let Ok(text) = serde_json::to_string_pretty(&file) else { return };
        // Whole or not at all: devices on other threads or in other processes may write too.
        let _ = crate::files::write_atomically(path, text.as_bytes());
    }
}

/// `$TENSORMEM_CACHE_DIR`, else `$XDG_CACHE_HOME/tensormem`, else `~/.cache/tensormem`; none on
/// the web, where there are no files, nor with `TENSORMEM_CACHE=memory` (the MCP server's tools
/// write nothing).
fn default_file() -> Option<PathBuf> {
    if cfg!(target_arch = "wasm32") {
        return None;
    }
    file_named_by(|name| std::env::var_os(name))
}

/// The tuning file the environment `env` names (see [`default_file`]).
fn file_named_by(env: impl Fn(&str) -> Option<std::ffi::OsString>) -> Option<PathBuf> {
    if env("TENSORMEM_CACHE").is_some_and(|v| v == "memory") {
        return None;
    }
    let var = |name: &str| env(name).filter(|v| !v.is_empty()).map(PathBuf::from);
    let dir = var("TENSORMEM_CACHE_DIR")
        .or_else(|| var("XDG_CACHE_HOME").map(|d| d.join("tensormem")))
        .or_else(|| var("HOME").map(|d| d.join(".cache").join("tensormem")))?;
    Some(dir.join("matmul-kernels.json"))
}

/// The file's contents; None when it is missing, unreadable, of another format or larger than
/// any cache this code writes (a link to `/dev/zero` is not read on): it will be rewritten.
fn read_file(path: &PathBuf) -> Option<TuningFile> {
    use std::io::Read;
    const LIMIT: u64 = 1 << 20;
    let mut bytes = Vec::new();
    std::fs::File::open(path).ok()?.take(LIMIT + 1).read_to_end(&mut bytes).ok()?;
    if bytes.len() as u64 > LIMIT {
        return None;
    }
    let file: TuningFile = serde_json::from_slice(&bytes).ok()?;
    (file.format == FILE_FORMAT).then_some(file)
}

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

    /// Times every candidate kernel on an m x k times k x n product of `dtype` in scratch
    /// buffers (`vec4`: whether A and B are laid out for 128-bit loads). Work already queued
    /// is finished first, so that it is not counted.
    pub async fn measure_matmul(&self, dtype: DType, m: usize, n: usize, k: usize, vec4: [bool; 2]) -> Result<MatmulTuning, DeviceError> {
        let ctx = self.gpu_context().ok_or_else(|| DeviceError::Unsupported("matmul kernels are measured on GPU devices".into()))?;
        let started = super::now_s();
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
        let now = super::now_s;
        let mut gflops = BTreeMap::new();
        let mut best: Option<(MatmulKernel, f64)> = None;
        // An error the program's own commands raised stays for the program's next wait.
        let error_pending = !ctx.errors.lock().unwrap().is_empty();
        if !error_pending {
            ctx.submit();
            ctx.wait_idle().await?;
        }
        for candidate in MatmulKernel::CANDIDATES {
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
            let seconds = if best.is_some_and(|(_, b)| once > 4.0 * b) { once } else { timed(((0.005 / once).ceil() as u32).clamp(1, 8)).await? };
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

#[cfg(all(test, not(target_arch = "wasm32")))]
mod tests {
    use super::*;

    #[test]
    fn the_tuning_file_follows_the_environment_and_memory_keeps_it_off_disk() {
        let env = |pairs: &'static [(&'static str, &'static str)]| move |name: &str| pairs.iter().find(|(k, _)| *k == name).map(|(_, v)| v.into());
        assert_eq!(file_named_by(env(&[("HOME", "/h")])), Some(PathBuf::from("/h/.cache/tensormem/matmul-kernels.json")));
        assert_eq!(file_named_by(env(&[("HOME", "/h"), ("TENSORMEM_CACHE_DIR", "/c")])), Some(PathBuf::from("/c/matmul-kernels.json")));
        // What `tensormem mcp` sets for its tool calls: they write nothing.
        assert_eq!(file_named_by(env(&[("HOME", "/h"), ("TENSORMEM_CACHE_DIR", "/c"), ("TENSORMEM_CACHE", "memory")])), None);
    }

    #[test]
    fn large_classes_are_measured_at_their_own_size_except_on_a_cpu_adapter() {
        let class = |n: usize| MatmulClass::new(DType::F32, n, n, n, true, true);
        assert_eq!(class(300), class(1000));
        assert_ne!(class(1000), class(2048), "a 2048 product ranks kernels differently from a 256 one");
        assert_ne!(class(2048), class(4096));
        assert_eq!([class(300), class(2048), class(8192)].map(|c| c.representative(2048)), [[256; 3], [1024; 3], [2048; 3]]);
        assert_eq!(class(8192).representative(256), [256; 3], "a CPU adapter measures in milliseconds");
        assert_eq!(class(2048).key(2048), "float32 1024x1024x1024 a4 b4");
        assert_eq!(class(2048).key(256), class(300).key(256), "on a CPU adapter the large classes share one measurement");
    }

    #[test]
    fn a_cache_that_is_an_endless_device_is_not_read_on() {
        assert!(read_file(&PathBuf::from("/dev/zero")).is_none());
    }
}
