//! Where segments come from. The allocator knows nothing of GPUs: a GPU device backs each segment
//! with one buffer, the simulation device and replay with a range of virtual addresses.

/// The allocator's view of device memory (PyTorch's cudaMalloc / cuMem* calls).
///
/// Capacity is enforced by the allocator itself (it knows the device's size); a source refuses
/// only when its own resource fails (a real buffer creation error).
pub trait SegmentSource {
    /// A new segment of `size` bytes; its base address, or None when the device refuses.
    fn allocate(&mut self, size: u64) -> Option<u64>;
    /// Returns a whole segment.
    fn free(&mut self, base: u64, size: u64);
    /// Reserves address space for an expandable segment. None: refused, or not supported.
    fn reserve(&mut self, _size: u64) -> Option<u64> {
        None
    }
    /// Releases an expandable segment's address space (all its pages are unmapped by then).
    fn release_reservation(&mut self, _base: u64, _size: u64) {}
    /// Backs `[addr, addr + size)` of a reservation with memory; false when refused.
    fn map(&mut self, _addr: u64, _size: u64) -> bool {
        true
    }
    fn unmap(&mut self, _addr: u64, _size: u64) {}
    /// Whether `reserve`/`map` work (expandable segments need them).
    fn supports_expandable(&self) -> bool {
        false
    }
}

/// Plain address ranges: the simulation device, tests and replay. Addresses are handed out upward
/// from `next`, aligned to 2 MiB like CUDA's, and never reused, so a trace never sees one address
/// stand for two segments at once.
#[derive(Debug, Clone)]
pub struct VirtualSegments {
    next: u64,
    /// Addresses the next segments should take when their sizes agree (replay's recorded layout).
    hints: std::collections::VecDeque<(u64, u64)>,
    /// Address the next expandable reservation should take.
    reservation_hint: Option<u64>,
}

/// Where virtual addresses start: high like real device pointers, easy to read in hex.
pub const VIRTUAL_BASE: u64 = 0x7f00_0000_0000;
const ALIGN: u64 = 2 << 20;

impl Default for VirtualSegments {
    fn default() -> Self {
        VirtualSegments::starting_at(VIRTUAL_BASE)
    }
}

impl VirtualSegments {
    pub fn starting_at(base: u64) -> VirtualSegments {
        VirtualSegments { next: base.checked_next_multiple_of(ALIGN).unwrap_or(base), hints: Default::default(), reservation_hint: None }
    }

    /// The next segment (or reservation) of exactly `size` bytes takes `address`.
    pub fn hint(&mut self, address: u64, size: u64) {
        self.hints.push_back((address, size));
    }

    /// The next expandable-segment reservation starts at `address`.
    pub fn hint_reservation(&mut self, address: u64) {
        self.reservation_hint = Some(address);
    }

    pub fn clear_hints(&mut self) {
        self.hints.clear();
        self.reservation_hint = None;
    }

    /// None when the address space is exhausted.
    fn take(&mut self, size: u64) -> Option<u64> {
        if let Some(&(addr, hinted)) = self.hints.front() {
            if hinted == size && addr.checked_add(size).is_some() {
                self.hints.pop_front();
                return Some(addr);
            }
        }
        let base = self.next;
        self.next = self.next.checked_add(size)?.checked_next_multiple_of(ALIGN)?;
        Some(base)
    }
}

impl SegmentSource for VirtualSegments {
    fn allocate(&mut self, size: u64) -> Option<u64> {
        self.take(size)
    }

    fn free(&mut self, _base: u64, _size: u64) {}

    fn reserve(&mut self, size: u64) -> Option<u64> {
        match self.reservation_hint.take() {
            Some(addr) if addr.checked_add(size).is_some() => Some(addr),
            _ => self.take(size),
        }
    }

    fn supports_expandable(&self) -> bool {
        true
    }
}
