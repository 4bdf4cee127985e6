//! Host <-> GPU transfers through staging buffers that are reused, with their bytes accounted
//! (their own pool, like PyTorch's pinned host memory). An upload is written into a mapped
//! chunk and copied into the tensor by a command recorded in order with the kernels, as
//! wgpu's `StagingBelt` does, so it does not force the recorded work out first (a
//! `queue.write_buffer` would run before it). A readback borrows a mapped-read buffer from a
//! free list instead of creating one.

use std::cell::{Cell, RefCell};
use std::sync::{Arc, Mutex};

/// Uploads share chunks of this size; a larger upload gets a chunk of its own.
const CHUNK: u64 = 1 << 20;
/// Idle staging kept for reuse, per direction; beyond it buffers are destroyed.
const KEEP_IDLE: u64 = 32 << 20;
/// Copies move whole 4-byte words (`COPY_BUFFER_ALIGNMENT`); mapped views start on 8 bytes
/// (`MAP_ALIGNMENT`).
const ALIGN: u64 = 8;

pub(crate) struct StagingPool {
    device: wgpu::Device,
    /// Upload chunks mapped for writing and being filled: (chunk, bytes used).
    filling: RefCell<Vec<(wgpu::Buffer, u64)>>,
    /// Chunks named by recorded copies: unmapped until their commands are submitted.
    closed: RefCell<Vec<wgpu::Buffer>>,
    /// Chunks whose re-mapping completed, and whether it succeeded (map callbacks may run on
    /// another thread); drained into `mapped` here.
    returned: Arc<Mutex<Vec<(wgpu::Buffer, bool)>>>,
    /// Chunks mapped for writing and idle, ready to fill.
    mapped: RefCell<Vec<wgpu::Buffer>>,
    /// Bytes of chunks being mapped again (on the web that waits for the browser's event loop).
    remapping: Cell<u64>,
    /// Readback buffers not in use.
    readback: RefCell<Vec<wgpu::Buffer>>,
    current: Cell<u64>,
    peak: Cell<u64>,
}

impl StagingPool {
    pub fn new(device: wgpu::Device) -> StagingPool {
        StagingPool {
            device,
            filling: RefCell::default(),
            closed: RefCell::default(),
            returned: Arc::default(),
            mapped: RefCell::default(),
            remapping: Cell::new(0),
            readback: RefCell::default(),
            current: Cell::new(0),
            peak: Cell::new(0),
        }
    }

    /// Staging bytes that exist now, and at most so far.
    pub fn memory(&self) -> (u64, u64) {
        (self.current.get(), self.peak.get())
    }

    fn create(&self, size: u64, usage: wgpu::BufferUsages, mapped: bool) -> wgpu::Buffer {
        self.current.set(self.current.get() + size);
        self.peak.set(self.peak.get().max(self.current.get()));
        self.device.create_buffer(&wgpu::BufferDescriptor { label: Some("tensormem staging"), size, usage, mapped_at_creation: mapped })
    }

    fn destroy(&self, buffer: wgpu::Buffer) {
        self.current.set(self.current.get() - buffer.size());
        buffer.destroy();
    }

    /// Records a copy of `bytes` into `target` at `offset` (a multiple of 4; the bytes are padded
    /// to whole words, which the target must have room for).
    pub fn upload(&self, encoder: &mut wgpu::CommandEncoder, target: &wgpu::Buffer, offset: u64, bytes: &[u8]) {
        let size = (bytes.len() as u64).next_multiple_of(4);
        let mut filling = self.filling.borrow_mut();
        let slot = match filling.iter().position(|(chunk, used)| chunk.size() - used >= size) {
            Some(i) => i,
            None => {
                filling.push((self.mapped_chunk(size), 0));
                filling.len() - 1
            }
        };
        let (chunk, used) = &mut filling[slot];
        {
            let mut view = chunk.get_mapped_range_mut(*used..*used + size).expect("a filling chunk is mapped for writing");
            let mut view = view.slice(..);
            view.slice(..bytes.len()).copy_from_slice(bytes);
            view.slice(bytes.len()..).fill(0);
        }
        encoder.copy_buffer_to_buffer(chunk, *used, target, offset, size);
        *used = (*used + size).next_multiple_of(ALIGN);
    }

    /// Takes in the chunks whose mapping completed; one that failed to map is destroyed.
    fn collect_returned(&self) {
        let returned: Vec<(wgpu::Buffer, bool)> = self.returned.lock().unwrap().drain(..).collect();
        for (chunk, ok) in returned {
            self.remapping.set(self.remapping.get() - chunk.size());
            if ok { self.mapped.borrow_mut().push(chunk) } else { self.destroy(chunk) }
        }
    }

    /// A chunk mapped for writing with room for `size` bytes: a returned one, or a new one.
    fn mapped_chunk(&self, size: u64) -> wgpu::Buffer {
        self.collect_returned();
        let mut mapped = self.mapped.borrow_mut();
        if let Some(i) = mapped.iter().position(|c| c.size() >= size) {
            return mapped.swap_remove(i);
        }
        drop(mapped);
        let usage = wgpu::BufferUsages::MAP_WRITE | wgpu::BufferUsages::COPY_SRC;
        self.create(size.next_multiple_of(ALIGN).max(CHUNK), usage, true)
    }

    /// Before a submit: the filled chunks are unmapped (their bytes become visible to the copies).
    pub fn close(&self) {
        let mut closed = self.closed.borrow_mut();
        for (chunk, _) in self.filling.borrow_mut().drain(..) {
            chunk.unmap();
            closed.push(chunk);
        }
    }

    /// After a submit: the closed chunks are mapped again, which completes once their copies
    /// have run. Chunks beyond `KEEP_IDLE` (idle or on their way back) are destroyed.
    pub fn recall(&self) {
        self.collect_returned();
        let mut idle: u64 = self.remapping.get() + self.mapped.borrow().iter().map(wgpu::Buffer::size).sum::<u64>();
        for chunk in self.closed.borrow_mut().drain(..) {
            if idle + chunk.size() > KEEP_IDLE {
                self.destroy(chunk);
                continue;
            }
            idle += chunk.size();
            self.remapping.set(self.remapping.get() + chunk.size());
            let (back, returned) = (chunk.clone(), self.returned.clone());
            chunk.map_async(wgpu::MapMode::Write, .., move |result| returned.lock().unwrap().push((back, result.is_ok())));
        }
    }

    /// A buffer to read `size` bytes back through: a free one large enough, or a new one, of
    /// the next power of two if it would be kept (so that reads of similar sizes share buffers).
    pub fn take_readback(&self, size: u64) -> wgpu::Buffer {
        let mut free = self.readback.borrow_mut();
        let best = free.iter().enumerate().filter(|(_, b)| b.size() >= size).min_by_key(|(_, b)| b.size()).map(|(i, _)| i);
        match best {
            Some(i) => free.swap_remove(i),
            None => {
                let rounded = size.next_power_of_two().max(256);
                let size = if rounded <= KEEP_IDLE { rounded } else { size };
                self.create(size, wgpu::BufferUsages::MAP_READ | wgpu::BufferUsages::COPY_DST, false)
            }
        }
    }

    /// A readback buffer back to the free list (or destroyed if the list is full, or if the
    /// read failed: it may still be mapped).
    pub fn give_back(&self, buffer: wgpu::Buffer, read_ok: bool) {
        if !read_ok {
            self.destroy(buffer);
            return;
        }
        let mut free = self.readback.borrow_mut();
        let idle: u64 = free.iter().map(wgpu::Buffer::size).sum();
        if idle + buffer.size() > KEEP_IDLE {
            drop(free);
            self.destroy(buffer);
        } else {
            free.push(buffer);
        }
    }
}
