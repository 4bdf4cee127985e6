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
    /// Takes over a range that already exists (a restored state); false if the source cannot.
    fn adopt(&mut self, _base: u64, _size: u64) -> bool {
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
    /// Memory in use: segments and mapped pages. A hint never lands on it, and mapping never
    /// overlaps it. (Reservations are address space only: fresh addresses skip past them.)
    used: RangeSet,
}

/// Disjoint address ranges.
#[derive(Debug, Clone, Default)]
struct RangeSet(std::collections::BTreeMap<u64, u64>);

impl RangeSet {
    fn is_free(&self, addr: u64, size: u64) -> bool {
        let Some(end) = addr.checked_add(size) else { return false };
        self.0.range(..end).next_back().is_none_or(|(&b, &s)| b + s <= addr)
    }

    fn insert(&mut self, addr: u64, size: u64) {
        self.0.insert(addr, size);
    }

    /// Removes `[addr, addr + size)`, splitting ranges that stick out of it.
    fn remove(&mut self, addr: u64, size: u64) {
        let end = addr.saturating_add(size);
        let hit: Vec<(u64, u64)> = self.0.range(..end).rev().map(|(&b, &s)| (b, s)).take_while(|&(b, s)| b + s > addr).collect();
        for (b, s) in hit {
            self.0.remove(&b);
            if b < addr {
                self.0.insert(b, addr - b);
            }
            if b + s > end {
                self.0.insert(end, b + s - end);
            }
        }
    }
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
        VirtualSegments {
            next: base.checked_next_multiple_of(ALIGN).unwrap_or(base),
            hints: Default::default(),
            reservation_hint: None,
            used: RangeSet::default(),
        }
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

    /// An address for `size` bytes: the hinted one if nothing there is in use, else fresh
    /// address space. None when the address space is exhausted.
    fn take(&mut self, size: u64, hint: Option<u64>) -> Option<u64> {
        match hint.filter(|&a| self.used.is_free(a, size)) {
            Some(addr) => Some(addr),
            None => {
                let base = self.next;
                self.next = self.next.checked_add(size)?.checked_next_multiple_of(ALIGN)?;
                Some(base)
            }
        }
    }
}

impl SegmentSource for VirtualSegments {
    fn allocate(&mut self, size: u64) -> Option<u64> {
        let hint = match self.hints.front() {
            Some(&(addr, hinted)) if hinted == size => {
                self.hints.pop_front();
                Some(addr)
            }
            _ => None,
        };
        let base = self.take(size, hint)?;
        self.used.insert(base, size);
        Some(base)
    }

    fn free(&mut self, base: u64, size: u64) {
        self.used.remove(base, size);
    }

    fn reserve(&mut self, size: u64) -> Option<u64> {
        let hint = self.reservation_hint.take();
        self.take(size, hint)
    }

    fn map(&mut self, addr: u64, size: u64) -> bool {
        if !self.used.is_free(addr, size) {
            return false;
        }
        self.used.insert(addr, size);
        true
    }

    fn unmap(&mut self, addr: u64, size: u64) {
        self.used.remove(addr, size);
    }

    fn adopt(&mut self, base: u64, size: u64) -> bool {
        if !self.used.is_free(base, size) {
            return false;
        }
        self.used.insert(base, size);
        true
    }

    fn supports_expandable(&self) -> bool {
        true
    }
}
