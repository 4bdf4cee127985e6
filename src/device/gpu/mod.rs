//! The wgpu side of a GPU device: adapter, limits, one buffer per allocator segment, the pending
//! command encoder, uploads and readback; kernel launches (`launch`), measuring matmul kernels
//! (`measure`) and staging buffers (`staging`). The only module that names wgpu, built with the
//! `gpu` feature (`no_gpu.rs` stands in without it).

mod launch;
mod measure;
mod staging;
mod tuning;

use crate::alloc::{SegmentSource, VirtualSegments};
use rustc_hash::FxHashMap;
use std::cell::{Cell, RefCell};

use super::{AdapterSummary, DeviceError, GpuOptions};

/// A segment's memory.
pub(crate) type Buffer = wgpu::Buffer;

/// Buffers of released segments, destroyed at the next submit: the allocator may release a
/// segment (inside `malloc`'s free-and-retry path) while recorded commands still use it.
type Retired = std::rc::Rc<RefCell<Vec<wgpu::Buffer>>>;

/// One wgpu buffer per segment, addressed by the segment's virtual base address.
pub struct GpuSegments {
    device: wgpu::Device,
    addresses: VirtualSegments,
    buffers: FxHashMap<u64, wgpu::Buffer>,
    max_buffer_size: u64,
    retired: Retired,
}

impl GpuSegments {
    pub(crate) fn buffer(&self, segment: u64) -> Option<&wgpu::Buffer> {
        self.buffers.get(&segment)
    }
}

impl SegmentSource for GpuSegments {
    fn allocate(&mut self, size: u64) -> Option<u64> {
        if size > self.max_buffer_size {
            return None;
        }
        let base = self.addresses.allocate(size)?;
        let buffer = self.device.create_buffer(&wgpu::BufferDescriptor {
            label: Some("tensormem segment"),
            size,
            usage: wgpu::BufferUsages::STORAGE | wgpu::BufferUsages::COPY_SRC | wgpu::BufferUsages::COPY_DST,
            mapped_at_creation: false,
        });
        self.buffers.insert(base, buffer);
        Some(base)
    }

    fn free(&mut self, base: u64, size: u64) {
        if let Some(b) = self.buffers.remove(&base) {
            self.retired.borrow_mut().push(b);
        }
        self.addresses.free(base, size);
    }
}

pub(crate) struct GpuContext {
    pub(super) device: wgpu::Device,
    pub(super) queue: wgpu::Queue,
    pub(super) summary: AdapterSummary,
    pub(super) limits: wgpu::Limits,
    /// The compute pass the dispatches since the last copy or submit go into: one pass for a
    /// run of dispatches, instead of one each (ended before any other command is recorded).
    /// Declared before the encoder, so that it ends first when the device is dropped.
    pass: RefCell<Option<wgpu::ComputePass<'static>>>,
    /// Commands recorded but not yet submitted.
    pub(super) encoder: RefCell<Option<wgpu::CommandEncoder>>,
    pub(super) pending_dispatches: Cell<u32>,
    /// How many pending commands make the next submit: 1 once the GPU is known to be idle (at
    /// the start, after a wait), doubling with each submit up to `MAX_PENDING_DISPATCHES`.
    /// Nothing runs until it is submitted: a whole batch recorded after a wait would keep the
    /// GPU idle while the host records it (on an H200, ~5 us of every op of a large add), and a
    /// submit per op costs more than it saves (measured: tools/device/SPEED.md). See
    /// `idle_submit_at`.
    submit_at: Cell<u32>,
    /// Compiled pipelines by kernel (see `Kernel`: a structural key, binding count included).
    pub(super) pipelines: RefCell<FxHashMap<crate::kernels::Kernel, std::rc::Rc<launch::Pipeline>>>,
    /// Upload and readback buffers (their own pool, like PyTorch's pinned host allocator).
    pub(super) staging: staging::StagingPool,
    retired: Retired,
    /// Kernel metadata of the dispatches recorded since the last submit: one buffer, made once
    /// and refilled by write_buffer right before each batch is submitted (the queue runs that
    /// write after the batches already submitted), bound at a dynamic offset per dispatch.
    metadata: RefCell<Option<(wgpu::Buffer, Vec<u8>)>>,
    /// Bind groups by pipeline and operand buffers: a loop of ops on the cache's reused blocks
    /// binds the same buffers again and again.
    pub(super) bind_groups: RefCell<FxHashMap<launch::BindKey, wgpu::BindGroup>>,
    /// Bytes between two dispatches' metadata (the storage offset alignment, at least 256).
    metadata_stride: u64,
    /// Validation errors wgpu reported outside an error scope (in the browser they arrive late):
    /// turned into `DeviceError`s instead of wgpu's default panic.
    pub(super) errors: std::sync::Arc<std::sync::Mutex<Vec<String>>>,
    /// Which matmul kernel each class of shapes uses on this adapter.
    pub(super) tuning: RefCell<tuning::Tuning>,
    /// See `GpuOptions::wait_limit` (natively: a browser cannot block).
    #[cfg(not(target_arch = "wasm32"))]
    wait_limit: Option<std::time::Duration>,
    /// A wait ran past `wait_limit` (see `Drop`).
    #[cfg(not(target_arch = "wasm32"))]
    stuck: Cell<bool>,
}

impl Drop for GpuContext {
    /// wgpu waits, without a limit, for the queue to be idle when it is dropped: after a wait
    /// that ran past the limit, a device whose work still does not finish within it keeps its
    /// queue (and its memory) for the rest of the process, so that the program goes on with
    /// the error instead of hanging where the device is dropped.
    fn drop(&mut self) {
        #[cfg(not(target_arch = "wasm32"))]
        if self.stuck.get() && self.block_until_done("the work submitted, before closing the device").is_err() {
            std::mem::forget(self.queue.clone());
        }
    }
}

/// Submit once this many dispatches are pending (bounds encoder memory on long programs).
const MAX_PENDING_DISPATCHES: u32 = 256;

impl GpuContext {
    pub(super) async fn open(options: &GpuOptions) -> Result<(GpuContext, GpuSegments), DeviceError> {
        let instance = wgpu::Instance::new(wgpu::InstanceDescriptor::new_without_display_handle_from_env());
        let adapter = instance
            .request_adapter(&wgpu::RequestAdapterOptions { power_preference: wgpu::PowerPreference::HighPerformance, ..Default::default() })
            .await
            .map_err(|e| DeviceError::NoAdapter(e.to_string()))?;
        let info = adapter.get_info();
        let native_f16 = adapter.features().contains(wgpu::Features::SHADER_F16) && !options.disable_native_f16;
        let features = if native_f16 { wgpu::Features::SHADER_F16 } else { wgpu::Features::empty() };
        // Ask for everything the adapter offers: tensors want the largest buffers it allows.
        let limits = adapter.limits();
        let (device, queue) = adapter
            .request_device(&wgpu::DeviceDescriptor {
                label: Some("tensormem"),
                required_features: features,
                required_limits: limits.clone(),
                ..Default::default()
            })
            .await
            .map_err(|e| DeviceError::NoAdapter(format!("request_device failed: {e}")))?;
        let align = limits.min_storage_buffer_offset_alignment;
        // Blocks are 512-byte aligned inside a segment; every known adapter needs at most 256.
        if 512 % align != 0 {
            return Err(DeviceError::Unsupported(format!(
                "adapter needs storage offsets aligned to {align} bytes; tensormem's 512-byte blocks cannot bind there"
            )));
        }
        let summary = AdapterSummary {
            // Browsers hide the adapter's name (fingerprinting); say what is known instead.
            name: if info.name.is_empty() { "browser WebGPU adapter".to_string() } else { info.name.clone() },
            backend: match info.backend {
                wgpu::Backend::BrowserWebGpu => "WebGPU".to_string(),
                other => format!("{other:?}"),
            },
            device_type: format!("{:?}", info.device_type),
            runs_on_cpu: info.device_type == wgpu::DeviceType::Cpu,
            cpu_kernel_shapes: info.device_type == wgpu::DeviceType::Cpu && !options.gpu_kernel_shapes,
            driver: format!("{} {}", info.driver, info.driver_info).trim().to_string(),
            native_f16,
            max_buffer_size: limits.max_buffer_size,
            max_storage_buffer_binding_size: limits.max_storage_buffer_binding_size as u64,
            min_storage_buffer_offset_alignment: align,
            max_compute_workgroup_size_x: limits.max_compute_workgroup_size_x,
            max_compute_invocations_per_workgroup: limits.max_compute_invocations_per_workgroup,
            max_compute_workgroups_per_dimension: limits.max_compute_workgroups_per_dimension,
            max_storage_buffers_per_shader_stage: limits.max_storage_buffers_per_shader_stage,
            max_compute_workgroup_storage_size: limits.max_compute_workgroup_storage_size,
        };
        let retired = Retired::default();
        let segments = GpuSegments {
            device: device.clone(),
            addresses: VirtualSegments::default(),
            buffers: FxHashMap::default(),
            max_buffer_size: limits.max_buffer_size,
            retired: retired.clone(),
        };
        let errors = std::sync::Arc::new(std::sync::Mutex::new(Vec::new()));
        let sink = errors.clone();
        device.on_uncaptured_error(std::sync::Arc::new(move |e: wgpu::Error| sink.lock().unwrap().push(e.to_string())));
        let adapter_key = format!("{} | {} | {} | native f16: {}", summary.name, summary.backend, summary.driver, summary.native_f16);
        let ctx = GpuContext {
            staging: staging::StagingPool::new(device.clone()),
            tuning: RefCell::new(tuning::Tuning::new(options.matmul.clone(), adapter_key, options.tuning_file.clone(), summary.runs_on_cpu)),
            errors,
            device,
            queue,
            summary,
            limits,
            encoder: RefCell::new(None),
            pass: RefCell::new(None),
            pending_dispatches: Cell::new(0),
            submit_at: Cell::new(MAX_PENDING_DISPATCHES),
            pipelines: RefCell::new(FxHashMap::default()),
            retired,
            metadata: RefCell::new(None),
            bind_groups: RefCell::new(FxHashMap::default()),
            metadata_stride: (align as u64).max(256),
            #[cfg(not(target_arch = "wasm32"))]
            wait_limit: options.wait_limit,
            #[cfg(not(target_arch = "wasm32"))]
            stuck: Cell::new(false),
        };
        ctx.submit_at.set(ctx.idle_submit_at());
        Ok((ctx, segments))
    }

    /// Runs `f` on the pending encoder (created on demand), after ending the open compute pass;
    /// submits when many commands are pending.
    pub(super) fn summary(&self) -> &AdapterSummary {
        &self.summary
    }

    /// Upload and readback staging bytes (current, peak).
    pub(super) fn staging_memory(&self) -> (u64, u64) {
        self.staging.memory()
    }

    /// A buffer of `bytes` outside the caching allocator that copies may read and write.
    pub(super) fn copy_buffer(&self, bytes: u64) -> Buffer {
        self.device.create_buffer(&wgpu::BufferDescriptor {
            label: Some("tensormem bench copy"),
            size: bytes,
            usage: wgpu::BufferUsages::COPY_SRC | wgpu::BufferUsages::COPY_DST,
            mapped_at_creation: false,
        })
    }

    /// Records a copy of `bytes` from the start of one buffer to the start of another.
    pub(super) fn record_copy(&self, from: &Buffer, to: &Buffer, bytes: u64) {
        self.record(|e| e.copy_buffer_to_buffer(from, 0, to, 0, bytes));
    }

    pub(super) fn record(&self, f: impl FnOnce(&mut wgpu::CommandEncoder)) {
        self.pass.borrow_mut().take();
        {
            let mut slot = self.encoder.borrow_mut();
            let encoder = slot.get_or_insert_with(|| self.device.create_command_encoder(&wgpu::CommandEncoderDescriptor { label: Some("tensormem ops") }));
            f(encoder);
        }
        self.count_pending();
    }

    /// Runs `f` on the open compute pass (begun on demand); submits when many are pending.
    pub(super) fn record_dispatch(&self, f: impl FnOnce(&mut wgpu::ComputePass<'static>)) {
        {
            let mut pass = self.pass.borrow_mut();
            let pass = pass.get_or_insert_with(|| {
                let mut slot = self.encoder.borrow_mut();
                let encoder = slot.get_or_insert_with(|| self.device.create_command_encoder(&wgpu::CommandEncoderDescriptor { label: Some("tensormem ops") }));
                encoder.begin_compute_pass(&wgpu::ComputePassDescriptor { label: Some("tensormem ops"), timestamp_writes: None }).forget_lifetime()
            });
            f(pass);
        }
        self.count_pending();
    }

    /// `submit_at` once the GPU is idle: 1, except on a software adapter (unless asked to
    /// behave as a GPU: `GpuOptions::gpu_kernel_shapes`), whose "GPU" is the host's own cores:
    /// there work submitted early runs beside the recording and slows it.
    fn idle_submit_at(&self) -> u32 {
        if self.summary.cpu_kernel_shapes { MAX_PENDING_DISPATCHES } else { 1 }
    }

    fn count_pending(&self) {
        self.pending_dispatches.set(self.pending_dispatches.get() + 1);
        if self.pending_dispatches.get() >= self.submit_at.get() {
            self.submit();
            self.submit_at.set((self.submit_at.get() * 2).min(MAX_PENDING_DISPATCHES));
        }
    }

    /// Submits recorded work. Needed before `queue.write_buffer` into memory that recorded work
    /// may still read: WebGPU runs a write_buffer before any command buffer submitted after it.
    /// A place for one dispatch's metadata in the current batch's buffer: (buffer, offset, size).
    pub(super) fn metadata_slot(&self, bytes: &[u8]) -> Result<(wgpu::Buffer, u64, u64), DeviceError> {
        let stride = self.metadata_stride;
        if bytes.len() as u64 > stride {
            return Err(DeviceError::Unsupported(format!("kernel metadata of {} bytes exceeds {stride}", bytes.len())));
        }
        let full = self.metadata.borrow().as_ref().is_some_and(|(b, d)| d.len() as u64 + stride > b.size());
        if full {
            self.submit();
        }
        let mut slot = self.metadata.borrow_mut();
        let (buffer, data) = slot.get_or_insert_with(|| {
            let buffer = self.device.create_buffer(&wgpu::BufferDescriptor {
                label: Some("tensormem kernel metadata"),
                size: stride * MAX_PENDING_DISPATCHES as u64,
                usage: wgpu::BufferUsages::STORAGE | wgpu::BufferUsages::COPY_DST,
                mapped_at_creation: false,
            });
            (buffer, Vec::new())
        });
        let offset = data.len() as u64;
        data.extend_from_slice(bytes);
        data.resize((offset + stride) as usize, 0);
        Ok((buffer.clone(), offset, (bytes.len() as u64).next_multiple_of(4)))
    }

    pub(super) fn submit(&self) {
        if let Some((buffer, data)) = self.metadata.borrow_mut().as_mut()
            && !data.is_empty()
        {
            self.queue.write_buffer(buffer, 0, data);
            data.clear();
        }
        // The pass must end before its encoder finishes.
        self.pass.borrow_mut().take();
        if let Some(encoder) = self.encoder.borrow_mut().take() {
            self.staging.close();
            self.queue.submit([encoder.finish()]);
            self.staging.recall();
            // Natively, map callbacks (staging chunks coming back) run inside poll; on the web
            // the browser runs them.
            #[cfg(not(target_arch = "wasm32"))]
            let _ = self.device.poll(wgpu::PollType::Poll);
        }
        self.pending_dispatches.set(0);
        // Submitted work keeps what it uses alive; nothing recorded can name these any more.
        for buffer in self.retired.borrow_mut().drain(..) {
            buffer.destroy();
        }
    }

    /// The first validation error wgpu reported since the last check, as an error.
    pub(super) fn take_error(&self) -> Result<(), DeviceError> {
        let mut errors = self.errors.lock().unwrap();
        match errors.drain(..).next() {
            Some(e) => Err(DeviceError::Unsupported(format!("the GPU rejected a command: {e}"))),
            None => Ok(()),
        }
    }

    /// Blocks until the GPU has finished everything submitted so far, in slices, so that a
    /// wait that never ends (a hung kernel, a driver that stopped) is seen: a note on stderr
    /// each minute, and past `wait_limit` an error naming what was waited for. The notes go to
    /// the process's stderr itself, which a test harness capturing `eprintln!` does not hold
    /// back while the wait goes on.
    #[cfg(not(target_arch = "wasm32"))]
    fn block_until_done(&self, what: &str) -> Result<(), DeviceError> {
        use std::time::{Duration, Instant};
        const NOTE_EVERY: Duration = Duration::from_secs(60);
        let started = Instant::now();
        let mut next_note = NOTE_EVERY;
        loop {
            let waited = started.elapsed();
            let slice = self.wait_limit.map_or(NOTE_EVERY, |limit| limit.saturating_sub(waited).min(NOTE_EVERY));
            match self.device.poll(wgpu::PollType::Wait { submission_index: None, timeout: Some(slice) }) {
                Ok(_) => return Ok(()),
                Err(wgpu::PollError::Timeout) => {
                    let waited = started.elapsed();
                    if let Some(limit) = self.wait_limit.filter(|&limit| waited >= limit) {
                        self.stuck.set(true);
                        return Err(DeviceError::TimedOut(format!(
                            "the GPU ({}) had not finished {what} after {:.3} s, past the limit set ({} s, TENSORMEM_GPU_WAIT_LIMIT): a \
                             kernel that does not end, or a driver that stopped",
                            self.summary.name,
                            waited.as_secs_f64(),
                            limit.as_secs_f64()
                        )));
                    }
                    if waited >= next_note {
                        use std::io::Write;
                        let note = format!("tensormem: still waiting for the GPU ({}) to finish {what}: {} s\n", self.summary.name, waited.as_secs());
                        let _ = std::io::stderr().write_all(note.as_bytes());
                        next_note += NOTE_EVERY;
                    }
                }
                Err(e) => return Err(DeviceError::Lost(format!("waiting for the GPU failed: {e}"))),
            }
        }
    }

    /// Waits for everything submitted so far.
    pub(super) async fn wait_idle(&self) -> Result<(), DeviceError> {
        let (sender, receiver) = oneshot();
        self.queue.on_submitted_work_done(move || sender.send(()));
        #[cfg(not(target_arch = "wasm32"))]
        self.block_until_done("the work submitted")?;
        receiver.await;
        self.submit_at.set(self.idle_submit_at());
        Ok(())
    }

    /// Writes `bytes` at `offset` of `buffer` (4-byte aligned; the block has room for the
    /// padding to whole words), in order with the recorded kernels: the block may have belonged
    /// to a tensor that pending commands still read.
    pub(super) fn upload(&self, buffer: &wgpu::Buffer, offset: u64, bytes: &[u8]) {
        self.record(|encoder| self.staging.upload(encoder, buffer, offset, bytes));
    }

    /// Copies `[offset, offset + len)` of `buffer` to the host. Copies start on 4-byte words,
    /// so an f16 view starting mid-word is read from the word's start.
    pub(super) async fn read(&self, buffer: &wgpu::Buffer, offset: u64, len: u64) -> Result<Vec<u8>, DeviceError> {
        let start = offset - offset % 4;
        let skip = offset - start;
        let padded = (skip + len).next_multiple_of(4).max(4);
        let staging = self.staging.take_readback(padded);
        self.record(|e| e.copy_buffer_to_buffer(buffer, start, &staging, 0, padded));
        self.submit();
        let result = self.map_and_copy(&staging, skip, len).await;
        // Mapped: everything submitted before the copy has run.
        if result.is_ok() {
            self.submit_at.set(self.idle_submit_at());
        }
        self.staging.give_back(staging, result.is_ok());
        self.take_error()?;
        result
    }

    async fn map_and_copy(&self, staging: &wgpu::Buffer, skip: u64, len: u64) -> Result<Vec<u8>, DeviceError> {
        let (sender, receiver) = oneshot();
        let range = 0..(skip + len).next_multiple_of(4).max(4);
        staging.map_async(wgpu::MapMode::Read, range.clone(), move |r| sender.send(r));
        #[cfg(not(target_arch = "wasm32"))]
        self.block_until_done("a read back to the host")?;
        receiver.await.map_err(|e| DeviceError::Lost(format!("readback failed: {e}")))?;
        let view = staging.get_mapped_range(range).map_err(|e| DeviceError::Lost(format!("readback mapping failed: {e}")))?;
        let bytes = view[skip as usize..(skip + len) as usize].to_vec();
        drop(view);
        staging.unmap();
        Ok(bytes)
    }
}

/// A one-value channel whose receiving end is a future: map_async's callback fires from
/// `device.poll` natively and from the browser's event loop on the web.
fn oneshot<T: Send + 'static>() -> (Sender<T>, Receiver<T>) {
    let shared = std::sync::Arc::new(std::sync::Mutex::new(Slot { value: None, waker: None }));
    (Sender(shared.clone()), Receiver(shared))
}

struct Slot<T> {
    value: Option<T>,
    waker: Option<std::task::Waker>,
}

struct Sender<T>(std::sync::Arc<std::sync::Mutex<Slot<T>>>);
struct Receiver<T>(std::sync::Arc<std::sync::Mutex<Slot<T>>>);

impl<T> Sender<T> {
    fn send(self, value: T) {
        let mut slot = self.0.lock().unwrap();
        slot.value = Some(value);
        if let Some(w) = slot.waker.take() {
            w.wake();
        }
    }
}

impl<T> std::future::Future for Receiver<T> {
    type Output = T;
    fn poll(self: std::pin::Pin<&mut Self>, cx: &mut std::task::Context<'_>) -> std::task::Poll<T> {
        let mut slot = self.0.lock().unwrap();
        match slot.value.take() {
            Some(v) => std::task::Poll::Ready(v),
            None => {
                slot.waker = Some(cx.waker().clone());
                std::task::Poll::Pending
            }
        }
    }
}
