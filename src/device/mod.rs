//! A device: GPU (wgpu: Vulkan, Metal, DX12, or WebGPU in the browser) or Sim (shapes only). Both
//! hand every tensor a block from the same caching allocator, so both produce the same trace.

mod adapter;
mod bindings;
mod context;
pub mod cublas;
#[cfg(feature = "gpu")]
mod gpu;
#[cfg(not(feature = "gpu"))]
#[path = "no_gpu.rs"]
mod gpu;
mod graphs;
mod sim;
mod tune;

pub use crate::kernels::matmul::MatmulKernel;
pub use adapter::{AdapterSummary, GpuOptions};
pub(crate) use bindings::{Arg, Bindings};
pub(crate) use context::Origin;
pub use context::{CategoryGuard, DeferGuard, RecordFunctionGuard, Restore, ScopeGuard, StreamGuard};
pub use cublas::{BlasWorkspaces, CudaCard};
pub use graphs::{CudaGraph, GraphCapture, MemPool, MemPoolScope};
pub use sim::{H100_CARD, H100_MULTIPROCESSORS, Multiprocessors, PRESETS, SimOptions, Speed, parse_capacity};
pub(crate) use tune::MatmulClass;
pub use tune::{MatmulChoice, MatmulTuning};

use crate::alloc::{AllocError, Allocation, AllocatorConfig, CachingAllocator, ConfigError, RecordContext, SegmentSource, TimeSource, VirtualSegments};
use crate::report;
use crate::trace::{Category, Snapshot};
use context::Recording;
use gpu::{GpuContext, GpuSegments};
use std::cell::{Cell, RefCell};
use std::rc::Rc;

pub(crate) use crate::clock::now_s;

#[derive(Debug, thiserror::Error)]
pub enum DeviceError {
    #[error("no GPU adapter: {0}")]
    NoAdapter(String),
    #[error(transparent)]
    Alloc(#[from] AllocError),
    #[error(transparent)]
    Config(#[from] ConfigError),
    #[error("{0}")]
    Unsupported(String),
    #[error("the GPU device was lost: {0}")]
    Lost(String),
    /// The GPU had not finished the work waited for within `GpuOptions::wait_limit`.
    #[error("{0}")]
    TimedOut(String),
    #[error(transparent)]
    Kernel(#[from] crate::kernels::KernelError),
}

/// Where a device's segments come from.
pub enum Segments {
    Virtual(VirtualSegments),
    Gpu(GpuSegments),
}

impl SegmentSource for Segments {
    fn allocate(&mut self, size: u64) -> Option<u64> {
        match self {
            Segments::Virtual(v) => v.allocate(size),
            Segments::Gpu(g) => g.allocate(size),
        }
    }
    fn free(&mut self, base: u64, size: u64) {
        match self {
            Segments::Virtual(v) => v.free(base, size),
            Segments::Gpu(g) => g.free(base, size),
        }
    }
    fn reserve(&mut self, size: u64) -> Option<u64> {
        match self {
            Segments::Virtual(v) => v.reserve(size),
            Segments::Gpu(_) => None,
        }
    }
    fn release_reservation(&mut self, base: u64, size: u64) {
        if let Segments::Virtual(v) = self {
            v.release_reservation(base, size)
        }
    }
    fn map(&mut self, addr: u64, size: u64) -> bool {
        match self {
            Segments::Virtual(v) => v.map(addr, size),
            Segments::Gpu(_) => false,
        }
    }
    fn unmap(&mut self, addr: u64, size: u64) {
        if let Segments::Virtual(v) = self {
            v.unmap(addr, size)
        }
    }
    fn supports_expandable(&self) -> bool {
        matches!(self, Segments::Virtual(_))
    }
}

// One per device, behind an Rc: boxing the GPU context would save nothing. Private to the
// device: the layers above ask the device (upload, read, launch), never the wgpu context.
#[allow(clippy::large_enum_variant)]
enum Backend {
    Gpu(GpuContext),
    /// Runs no kernels; its modelled clock charges each op by the card's speed.
    Sim(Speed),
}

struct DeviceInner {
    backend: Backend,
    alloc: RefCell<CachingAllocator<Segments>>,
    name: String,
    next_storage: Cell<u64>,
    next_tensor: Cell<u64>,
    /// The random generator's state: a seed and how many calls drew from it.
    rng: Cell<(u64, u64)>,
    /// What names and labels each allocation as it is made (`context.rs`).
    recording: Recording,
    /// Tensors bypass the cache (`GpuOptions::uncached`).
    uncached: Cell<bool>,
    /// The stream new blocks are allocated on (`torch.cuda.stream(s)`; 0 = the default stream).
    stream: Cell<crate::alloc::Stream>,
    /// Parameters made now get no memory (`torch.device("meta")`, deferred initialisation):
    /// a sharding strategy gives them their memory itself.
    deferred_parameters: Cell<bool>,
    /// The CUDA (or ROCm) card whose reduction launches this device models (None: no split
    /// reductions).
    cuda: Option<CudaCard>,
    /// CUDA graphs alive, and the random generator's seed and offset tensors they share, made
    /// when the first is captured (`graphs.rs`).
    graphs: Cell<usize>,
    graph_rng_state: RefCell<Vec<Allocation>>,
}

/// A device handle; cheap to clone (tensors keep one).
#[derive(Clone)]
pub struct Device(Rc<DeviceInner>);

impl std::fmt::Debug for Device {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(f, "Device({})", self.0.name)
    }
}

impl PartialEq for Device {
    fn eq(&self, other: &Device) -> bool {
        Rc::ptr_eq(&self.0, &other.0)
    }
}

impl Device {
    /// A GPU device on whatever adapter wgpu finds (lavapipe counts). Allocator settings come
    /// from `PYTORCH_CUDA_ALLOC_CONF` natively; expandable segments need virtual memory mapping,
    /// which WebGPU lacks, so they are refused here. A `TENSORMEM_MATMUL` that names no choice
    /// is an error too (see [`MatmulChoice::parse`]).
    pub async fn gpu(options: GpuOptions) -> Result<Device, DeviceError> {
        let config = if cfg!(target_arch = "wasm32") { AllocatorConfig::default() } else { AllocatorConfig::from_env()? };
        MatmulChoice::from_env().map_err(DeviceError::Unsupported)?;
        Device::gpu_with(options, config).await
    }

    pub async fn gpu_with(options: GpuOptions, config: AllocatorConfig) -> Result<Device, DeviceError> {
        if config.expandable_segments {
            return Err(DeviceError::Unsupported(
                "expandable_segments needs virtual memory mapping, which WebGPU does not offer; use the sim device to study it".into(),
            ));
        }
        let (ctx, segments) = GpuContext::open(&options).await?;
        let capacity = options.capacity.unwrap_or(ctx.summary().max_buffer_size.saturating_mul(4));
        let name = format!("gpu ({}, {})", ctx.summary().name, ctx.summary().backend);
        let alloc = CachingAllocator::new(config, Segments::Gpu(segments)).with_capacity(capacity);
        let device = Device::from_parts(Backend::Gpu(ctx), alloc, name, options.cuda, options.cublas_workspace);
        device.0.uncached.set(options.uncached);
        Ok(device)
    }

    /// The simulation device: same allocator, same ops and trace, no memory behind the blocks.
    pub fn sim(options: SimOptions) -> Device {
        Device::sim_with(options, AllocatorConfig::default())
    }

    pub fn sim_with(options: SimOptions, config: AllocatorConfig) -> Device {
        let alloc = CachingAllocator::new(config, Segments::Virtual(VirtualSegments::default())).with_capacity(options.capacity);
        Device::from_parts(Backend::Sim(options.speed), alloc, options.device_name(), options.cuda, options.cublas_workspace)
    }

    fn from_parts(backend: Backend, mut alloc: CachingAllocator<Segments>, name: String, cuda: Option<CudaCard>, cublas_workspace: Option<u64>) -> Device {
        alloc.record_memory_history(true, RecordContext::All, 100_000);
        // A GPU's entries happen at real times; the sim device's at modelled ones.
        let time = match backend {
            Backend::Gpu(_) => TimeSource::Wall,
            Backend::Sim(_) => TimeSource::modelled(),
        };
        alloc.history_mut().set_time_source(time);
        Device(Rc::new(DeviceInner {
            backend,
            alloc: RefCell::new(alloc),
            name,
            next_storage: Cell::new(1),
            next_tensor: Cell::new(1),
            rng: Cell::new((0, 0)),
            recording: Recording::new(cuda.map(|card| card.workspaces(cublas_workspace))),
            uncached: Cell::new(false),
            stream: Cell::new(0),
            deferred_parameters: Cell::new(false),
            cuda,
            graphs: Cell::new(0),
            graph_rng_state: RefCell::new(Vec::new()),
        }))
    }

    pub fn name(&self) -> &str {
        &self.0.name
    }

    pub fn is_sim(&self) -> bool {
        matches!(self.0.backend, Backend::Sim(_))
    }

    /// The adapter, for a GPU device.
    pub fn adapter(&self) -> Option<&AdapterSummary> {
        match &self.0.backend {
            Backend::Gpu(g) => Some(g.summary()),
            Backend::Sim(_) => None,
        }
    }

    fn gpu_context(&self) -> Option<&GpuContext> {
        match &self.0.backend {
            Backend::Gpu(g) => Some(g),
            Backend::Sim(_) => None,
        }
    }

    /// The CUDA (or ROCm) card whose kernel launches this device models (None: no split
    /// reductions, no sorting kernels' scratch).
    pub(crate) fn cuda_card(&self) -> Option<CudaCard> {
        self.0.cuda
    }

    /// `torch.manual_seed`: the same seed gives the same random tensors.
    pub fn manual_seed(&self, seed: u64) {
        self.0.rng.set((seed, 0));
    }

    /// A seed for the next random op (each call draws a fresh stream).
    pub(crate) fn next_seed(&self) -> u32 {
        let (seed, calls) = self.0.rng.get();
        self.0.rng.set((seed, calls + 1));
        let mixed = seed.wrapping_mul(0x9e37_79b9_7f4a_7c15) ^ calls.wrapping_mul(0xbf58_476d_1ce4_e5b9);
        (mixed ^ (mixed >> 32)) as u32
    }

    /// The random generator's state (`torch.cuda.get_rng_state`), to replay random ops exactly.
    pub(crate) fn rng_state(&self) -> (u64, u64) {
        self.0.rng.get()
    }

    pub(crate) fn set_rng_state(&self, state: (u64, u64)) {
        self.0.rng.set(state);
    }

    pub(crate) fn next_storage_id(&self) -> u64 {
        let id = self.0.next_storage.get();
        self.0.next_storage.set(id + 1);
        id
    }

    pub(crate) fn next_tensor_id(&self) -> u64 {
        let id = self.0.next_tensor.get();
        self.0.next_tensor.set(id + 1);
        id
    }

    /// Allocates a block for `bytes` bytes, recording the op and scope as its stack.
    #[track_caller]
    pub(crate) fn allocate(&self, bytes: u64, op: &'static str) -> Result<Allocation, DeviceError> {
        if let Backend::Gpu(g) = &self.0.backend {
            let limit = g.summary().max_storage_buffer_binding_size;
            if bytes > limit {
                return Err(DeviceError::Unsupported(format!(
                    "a tensor of {bytes} bytes exceeds this adapter's max_storage_buffer_binding_size of {limit} bytes"
                )));
            }
        }
        if self.0.uncached.get() {
            let size = bytes.max(1).next_multiple_of(512);
            let segment = self.0.alloc.borrow_mut().source_mut().allocate(size);
            return segment
                .map(|s| Allocation::uncached(s, size))
                .ok_or_else(|| DeviceError::Unsupported(format!("the adapter refused a buffer of {size} bytes")));
        }
        let frames = self.frames(op, std::panic::Location::caller());
        Ok(self.0.alloc.borrow_mut().malloc(bytes, self.0.stream.get(), Some(frames))?)
    }

    pub(crate) fn release(&self, block: &Allocation) {
        if block.is_uncached() {
            self.0.alloc.borrow_mut().source_mut().free(block.segment, block.size);
            return;
        }
        // A failure here means the block was freed twice: a bug, but not worth a panic in Drop.
        let _ = self.0.alloc.borrow_mut().free_allocation(block, None);
    }

    /// Classifies a block made a moment ago (see [`History::categorize_recent`]).
    pub(crate) fn categorize_recent(&self, addr: u64, category: Category) {
        self.0.alloc.borrow_mut().history_mut().categorize_recent(addr, category, 256);
    }

    /// Entries in the allocation history so far.
    pub(crate) fn history_len(&self) -> usize {
        self.0.alloc.borrow().history().len()
    }

    pub(crate) fn parameters_deferred(&self) -> bool {
        self.0.deferred_parameters.get()
    }

    // ------------------------------------------------------------------ torch.cuda names

    pub fn memory_allocated(&self) -> u64 {
        self.0.alloc.borrow().stats().allocated_bytes.all().current as u64
    }

    /// Bytes the live tensors asked for (`memory_stats()["requested_bytes.all.current"]`):
    /// memory_allocated() counts whole blocks, which rounding and unsplit remainders enlarge.
    pub fn memory_requested(&self) -> u64 {
        self.0.alloc.borrow().stats().requested_bytes.all().current as u64
    }

    pub fn max_memory_requested(&self) -> u64 {
        self.0.alloc.borrow().stats().requested_bytes.all().peak as u64
    }

    pub fn max_memory_allocated(&self) -> u64 {
        self.0.alloc.borrow().stats().allocated_bytes.all().peak as u64
    }

    pub fn memory_reserved(&self) -> u64 {
        self.0.alloc.borrow().stats().reserved_bytes.all().current as u64
    }

    pub fn max_memory_reserved(&self) -> u64 {
        self.0.alloc.borrow().stats().reserved_bytes.all().peak as u64
    }

    pub fn reset_peak_memory_stats(&self) {
        self.0.alloc.borrow_mut().reset_peak_stats();
    }

    pub fn empty_cache(&self) {
        self.0.alloc.borrow_mut().empty_cache();
        if let Some(g) = self.gpu_context() {
            // Submits recorded work, then destroys the released segments' buffers.
            g.submit();
        }
    }

    pub fn memory_stats(&self) -> std::collections::BTreeMap<String, i64> {
        report::memory_stats(self.0.alloc.borrow().stats())
    }

    pub fn memory_summary(&self) -> String {
        report::memory_summary(self.0.alloc.borrow().stats(), 0, false)
    }

    /// `_record_memory_history(enabled, context, max_entries)`.
    pub fn record_memory_history(&self, enabled: bool, context: RecordContext, max_entries: usize) {
        self.0.alloc.borrow_mut().record_memory_history(enabled, context, max_entries);
    }

    /// `torch.cuda.memory._snapshot()`, plus the `tensormem` key naming this device and its clock.
    pub fn snapshot(&self) -> Snapshot {
        self.0.alloc.borrow_mut().snapshot_on(&self.0.name)
    }

    /// The clock of the trace's `time_us`: wall on a GPU, modelled on the sim device.
    pub fn time_source(&self) -> TimeSource {
        self.0.alloc.borrow().history().time_source()
    }

    /// Moves the sim device's modelled clock forward by `us` microseconds, for work the ops do
    /// not show (a GPU device's wall clock ignores it).
    pub fn advance_time_us(&self, us: f64) {
        self.0.alloc.borrow_mut().advance_time_us(us);
    }

    /// What the sim device does instead of launching a kernel: advances its modelled clock by
    /// the op's cost on the card (see [`Speed::op_time_us`]).
    pub(crate) fn model_op(&self, bytes: u64, flops: u64, half: bool) {
        if let Backend::Sim(speed) = &self.0.backend {
            self.advance_time_us(speed.op_time_us(bytes, flops, half));
        }
    }

    pub fn capacity(&self) -> Option<u64> {
        self.0.alloc.borrow().capacity()
    }

    /// Upload and readback staging bytes (current, peak): their own pool, like PyTorch's pinned
    /// host memory, kept for reuse up to 32 MiB idle each way.
    pub fn staging_memory(&self) -> (u64, u64) {
        match &self.0.backend {
            Backend::Gpu(g) => g.staging_memory(),
            Backend::Sim(_) => (0, 0),
        }
    }

    // ------------------------------------------------------------------ data in and out

    /// Where a block's bytes are: its segment's buffer and the offset in it (`bytes` long).
    /// Errors on the simulation device, which has no memory behind its blocks.
    pub(crate) fn block_arg(&self, block: &Allocation, bytes: u64) -> Result<Arg, DeviceError> {
        let alloc = self.0.alloc.borrow();
        let Segments::Gpu(segments) = alloc.source() else {
            return Err(DeviceError::Unsupported("the simulation device has no memory behind its tensors".into()));
        };
        let buffer = segments.buffer(block.segment).expect("every block lives in a segment buffer").clone();
        Ok(Arg { buffer, segment: block.segment, offset: block.ptr - block.segment, size: bytes })
    }

    /// Writes `bytes` at the start of `arg` (see `GpuContext::upload`), in order with the
    /// recorded kernels; nothing on the simulation device.
    pub(crate) fn upload(&self, arg: &Arg, bytes: &[u8]) {
        if let Some(ctx) = self.gpu_context() {
            ctx.upload(&arg.buffer, arg.offset, bytes);
        }
    }

    /// Copies `len` bytes from `start` bytes into `arg` to the host, after the recorded work.
    pub(crate) async fn read(&self, arg: &Arg, start: u64, len: u64) -> Result<Vec<u8>, DeviceError> {
        let ctx = self.gpu_context().ok_or_else(|| DeviceError::Unsupported("readback on the simulation device: it has shapes but no data".into()))?;
        ctx.read(&arg.buffer, arg.offset + start, len).await
    }

    /// Two scratch buffers of `bytes` outside the caching allocator, and a copy between them
    /// recorded per call of the returned function: what a plain buffer copy reaches on this
    /// adapter (the benchmark's baseline). None on the simulation device.
    pub(crate) fn copy_probe(&self, bytes: u64) -> Option<CopyProbe> {
        let ctx = self.gpu_context()?;
        Some(CopyProbe { device: self.clone(), from: ctx.copy_buffer(bytes), to: ctx.copy_buffer(bytes), bytes })
    }

    /// Submits recorded GPU work (no-op on sim).
    pub fn synchronize(&self) {
        if let Some(g) = self.gpu_context() {
            g.submit();
        }
    }

    /// Submits recorded work and waits until the GPU has finished it (`torch.cuda.synchronize`);
    /// like it, reports an error the GPU raised meanwhile (a rejected command).
    pub async fn wait(&self) -> Result<(), DeviceError> {
        if let Some(g) = self.gpu_context() {
            g.submit();
            g.wait_idle().await?;
            g.take_error()?;
        }
        Ok(())
    }
}

/// Scratch buffers a benchmark copies between (see [`Device::copy_probe`]); destroyed on drop.
pub(crate) struct CopyProbe {
    device: Device,
    from: gpu::Buffer,
    to: gpu::Buffer,
    bytes: u64,
}

impl CopyProbe {
    /// Records one copy of the whole buffer.
    pub(crate) fn copy(&self) {
        if let Some(ctx) = self.device.gpu_context() {
            ctx.record_copy(&self.from, &self.to, self.bytes);
        }
    }
}

impl Drop for CopyProbe {
    fn drop(&mut self) {
        self.from.destroy();
        self.to.destroy();
    }
}
