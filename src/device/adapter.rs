//! What a GPU device is opened with and what its adapter reports: plain data, in every build
//! (the `gpu` feature adds the device itself).

/// How to open a GPU device.
#[derive(Debug, Clone)]
pub struct GpuOptions {
    /// Bytes the device may reserve (the card's memory, or a browser budget). None: the adapter's
    /// `max_buffer_size` times 4, a guess, since no API reports free GPU memory.
    pub capacity: Option<u64>,
    /// Store f16 packed in u32 words even when the adapter has `shader-f16` (the path browsers
    /// without it take; tests use this to check both).
    pub disable_native_f16: bool,
    /// Give every tensor a buffer of its own, created when it is allocated and destroyed when
    /// it is freed, bypassing the caching allocator (nothing is recorded), as PyTorch does under
    /// `PYTORCH_NO_CUDA_MEMORY_CACHING=1`: what an engine without a cache pays, for comparison.
    pub uncached: bool,
    /// How `matmul` picks its kernel: measured per class of shapes at first use (the default,
    /// unless `TENSORMEM_MATMUL` says otherwise: see [`MatmulChoice::parse`](super::MatmulChoice::parse)).
    pub matmul: super::MatmulChoice,
    /// Where measured choices are kept across runs. None: `$TENSORMEM_CACHE_DIR`, else the user's
    /// cache directory (`$XDG_CACHE_HOME/tensormem` or `~/.cache/tensormem`); never on the web.
    pub tuning_file: Option<std::path::PathBuf>,
    /// The CUDA card whose allocations the trace models (WebGPU reports neither multiprocessors
    /// nor a compute capability): a long reduction is split as PyTorch splits it there,
    /// allocating what it allocates, and the split kernel works in that memory; each thread's
    /// first matmul allocates cuBLAS's workspace. Default: the H100's. None: never split, no
    /// workspaces.
    pub cuda: Option<super::CudaCard>,
    /// `CUBLAS_WORKSPACE_CONFIG`'s size per handle in bytes; None: PyTorch's default for `cuda`.
    pub cublas_workspace: Option<u64>,
    /// Shape kernels, and submit work, as for a GPU even on a software adapter (tests run a
    /// GPU's kernel shapes on lavapipe with this; matmul tuning still measures at the software
    /// adapter's sizes).
    pub gpu_kernel_shapes: bool,
    /// Natively, how long one wait for the GPU may take before it is an error
    /// ([`DeviceError::TimedOut`](super::DeviceError::TimedOut)) instead of a hang. None (the
    /// default, unless `TENSORMEM_GPU_WAIT_LIMIT` gives seconds): no limit, a note on stderr
    /// each minute of waiting.
    pub wait_limit: Option<std::time::Duration>,
}

/// `TENSORMEM_GPU_WAIT_LIMIT`: seconds, positive and finite; anything else is no limit.
fn wait_limit_from_env() -> Option<std::time::Duration> {
    let seconds: f64 = std::env::var("TENSORMEM_GPU_WAIT_LIMIT").ok()?.trim().parse().ok()?;
    (seconds.is_finite() && seconds > 0.0).then(|| std::time::Duration::from_secs_f64(seconds))
}

impl Default for GpuOptions {
    fn default() -> GpuOptions {
        GpuOptions {
            capacity: None,
            disable_native_f16: false,
            uncached: false,
            // An unreadable value is reported by `Device::gpu`.
            matmul: super::MatmulChoice::from_env().ok().flatten().unwrap_or_default(),
            tuning_file: None,
            cuda: Some(super::sim::H100_CARD),
            cublas_workspace: None,
            gpu_kernel_shapes: false,
            wait_limit: wait_limit_from_env(),
        }
    }
}

/// What the adapter is and what it allows.
#[derive(Debug, Clone)]
pub struct AdapterSummary {
    pub name: String,
    pub backend: String,
    pub device_type: String,
    /// A software adapter (lavapipe, SwiftShader, WARP): kernels that tune their shape for
    /// caches and workgroup cost ask this.
    pub runs_on_cpu: bool,
    /// Whether kernels take the shapes that suit a CPU adapter (a thread per row where a GPU
    /// wants neighbours reading neighbours): `runs_on_cpu` unless `gpu_kernel_shapes` is set.
    pub cpu_kernel_shapes: bool,
    pub driver: String,
    pub native_f16: bool,
    pub max_buffer_size: u64,
    pub max_storage_buffer_binding_size: u64,
    pub min_storage_buffer_offset_alignment: u32,
    pub max_compute_workgroup_size_x: u32,
    pub max_compute_invocations_per_workgroup: u32,
    pub max_compute_workgroups_per_dimension: u32,
    pub max_storage_buffers_per_shader_stage: u32,
    /// Workgroup memory a kernel may declare: the tuner leaves out matmul kernels that need
    /// more (WebGPU guarantees 16 KiB, what every variant keeps within; NVIDIA's Vulkan driver
    /// offers 48).
    pub max_compute_workgroup_storage_size: u32,
}
