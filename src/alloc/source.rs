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

/// Plain address ranges: the simulation device, tests and replay. Fresh addresses are placed as
/// the CUDA driver places them (`DriverAddressSpace`), so that equal free blocks in different
/// segments rank as they do on a real card; addresses are never reused while in use.
#[derive(Debug, Clone)]
pub struct VirtualSegments {
    space: DriverAddressSpace,
    /// Addresses the next segments should take when their sizes agree (replay's recorded layout).
    hints: std::collections::VecDeque<(u64, u64)>,
    /// Address the next expandable reservation should take.
    reservation_hint: Option<u64>,
    /// Memory in use: segments and mapped pages. A hint never lands on it, and mapping never
    /// overlaps it. (Reservations are address space only: fresh addresses skip past them.)
    used: RangeSet,
}

/// Where the CUDA driver puts a new allocation in virtual address space, as the traces PyTorch
/// recorded on an H100 (driver 580) show it. The caching allocator breaks ties between equal free
/// blocks by address, so this order decides which segment a request is cut from.
///
/// - The driver maps address space in areas. The first is the context's (512 MiB here); each
///   later one is carved directly below the lowest, sized to the allocation rounded up to 32 MiB
///   and aligned to 32 MiB: area by area, addresses go down.
/// - An allocation takes the lowest free range, 2 MiB aligned, that fits in any area (the rest
///   of a 20 MiB segment's area takes a later 2 or 12 MiB one); only when none fits is a new area
///   carved.
///
/// Replaying every recorded trace with these addresses instead of the recorded ones reproduces
/// every segment decision (`tests/replay.rs`); handing addresses out upward does not.
#[derive(Debug, Clone)]
struct DriverAddressSpace {
    /// Mapped areas: start -> (length, bytes free in it).
    areas: std::collections::BTreeMap<u64, (u64, u64)>,
    /// Everything from `floor` up to `ceiling` has been carved (areas and reservations).
    floor: u64,
    ceiling: u64,
}

/// The context's first area and the granularity of the areas carved after it.
const FIRST_AREA: u64 = 512 << 20;
const AREA_GRANULARITY: u64 = 32 << 20;
/// How far above its base an address space starts carving down.
const ADDRESS_SPAN: u64 = 1 << 39;

impl DriverAddressSpace {
    fn below(top: u64) -> DriverAddressSpace {
        let top = top / AREA_GRANULARITY * AREA_GRANULARITY;
        let mut areas = std::collections::BTreeMap::new();
        areas.insert(top - FIRST_AREA, (FIRST_AREA, FIRST_AREA));
        DriverAddressSpace { areas, floor: top - FIRST_AREA, ceiling: top }
    }

    /// The lowest free range of `size` bytes in an area, else a new area carved below the rest.
    fn place(&mut self, size: u64, used: &RangeSet) -> Option<u64> {
        let fits = self
            .areas
            .iter()
            .filter(|(_, (_, free))| *free >= size)
            .find_map(|(&start, &(len, _))| used.lowest_gap(start, start.checked_add(len)?, size, ALIGN));
        if fits.is_some() {
            return fits;
        }
        let len = size.checked_next_multiple_of(AREA_GRANULARITY)?;
        let start = self.carve(len, used)?;
        self.areas.insert(start, (len, len));
        Some(start)
    }

    /// The area wholly holding `[addr, addr + size)`, if any: its free bytes.
    fn free_bytes_around(&mut self, addr: u64, size: u64) -> Option<&mut u64> {
        let (&start, (len, free)) = self.areas.range_mut(..=addr).next_back()?;
        (addr.checked_add(size)? <= start + *len).then_some(free)
    }

    /// `[addr, addr + size)` came into use (or, `in_use` false, went out of use).
    fn account(&mut self, addr: u64, size: u64, in_use: bool) {
        if let Some(free) = self.free_bytes_around(addr, size) {
            *free = if in_use { free.saturating_sub(size) } else { *free + size };
        }
    }

    /// `len` bytes of address space directly below everything carved so far, clear of
    /// anything in use (a replay's recorded addresses). A span larger than what lies below (an
    /// expandable reservation for an absurd card) goes above everything instead.
    fn carve(&mut self, len: u64, used: &RangeSet) -> Option<u64> {
        let below = |mut end: u64| loop {
            let start = end.checked_sub(len)? / AREA_GRANULARITY * AREA_GRANULARITY;
            match used.first_in(start, len) {
                None => return Some(start),
                Some(taken) => end = taken,
            }
        };
        if let Some(start) = below(self.floor) {
            self.floor = start;
            return Some(start);
        }
        let start = self.ceiling;
        self.ceiling = start.checked_add(len)?.checked_next_multiple_of(AREA_GRANULARITY)?;
        Some(start)
    }
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

    /// The start of the lowest range in use that overlaps `[addr, addr + size)`.
    fn first_in(&self, addr: u64, size: u64) -> Option<u64> {
        let end = addr.saturating_add(size);
        let before = self.0.range(..addr).next_back().filter(|&(&b, &s)| b + s > addr).map(|(&b, _)| b);
        before.or_else(|| self.0.range(addr..end).next().map(|(&b, _)| b))
    }

    /// The lowest `align`ed address in `[start, end)` where `size` free bytes begin.
    fn lowest_gap(&self, start: u64, end: u64, size: u64, align: u64) -> Option<u64> {
        let mut at = start.checked_next_multiple_of(align)?;
        loop {
            let stop = at.checked_add(size)?;
            if stop > end {
                return None;
            }
            match self.first_in(at, size) {
                None => return Some(at),
                Some(b) => at = (b + self.0[&b]).checked_next_multiple_of(align)?,
            }
        }
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
    /// Fresh addresses lie in `[base, base + 512 GiB)`.
    pub fn starting_at(base: u64) -> VirtualSegments {
        VirtualSegments {
            space: DriverAddressSpace::below(base.saturating_add(ADDRESS_SPAN)),
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

    /// The hinted address, if nothing there is in use.
    fn hinted(&self, size: u64, hint: Option<u64>) -> Option<u64> {
        hint.filter(|&a| self.used.is_free(a, size))
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
        let base = match self.hinted(size, hint) {
            Some(addr) => addr,
            None => self.space.place(size, &self.used)?,
        };
        self.used.insert(base, size);
        self.space.account(base, size, true);
        Some(base)
    }

    fn free(&mut self, base: u64, size: u64) {
        self.used.remove(base, size);
        self.space.account(base, size, false);
    }

    fn reserve(&mut self, size: u64) -> Option<u64> {
        let hint = self.reservation_hint.take();
        match self.hinted(size, hint) {
            Some(addr) => Some(addr),
            None => self.space.carve(size.checked_next_multiple_of(AREA_GRANULARITY)?, &self.used),
        }
    }

    fn map(&mut self, addr: u64, size: u64) -> bool {
        if !self.used.is_free(addr, size) {
            return false;
        }
        self.used.insert(addr, size);
        self.space.account(addr, size, true);
        true
    }

    fn unmap(&mut self, addr: u64, size: u64) {
        self.used.remove(addr, size);
        self.space.account(addr, size, false);
    }

    fn adopt(&mut self, base: u64, size: u64) -> bool {
        if !self.used.is_free(base, size) {
            return false;
        }
        self.used.insert(base, size);
        self.space.account(base, size, true);
        true
    }

    fn supports_expandable(&self) -> bool {
        true
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    const MIB: u64 = 1 << 20;

    /// The layout lm-train's trace shows on the H100, past the context's first area: two 16 MiB
    /// segments share a 32 MiB area bottom-up, a 20 MiB one starts the next area down, and a later
    /// 2 MiB segment fills the lowest area with room before any new area is carved.
    #[test]
    fn addresses_go_down_area_by_area_and_up_within_an_area() {
        let mut s = VirtualSegments::default();
        let first = s.allocate(FIRST_AREA).unwrap();
        let a = s.allocate(16 * MIB).unwrap();
        let b = s.allocate(16 * MIB).unwrap();
        let c = s.allocate(20 * MIB).unwrap();
        let d = s.allocate(16 * MIB).unwrap();
        assert_eq!(a, first - 32 * MIB, "below the first area");
        assert_eq!(b, a + 16 * MIB, "the rest of the same area");
        assert_eq!(c, a - 32 * MIB, "a new area below");
        assert_eq!(d, c - 32 * MIB, "12 MiB left beside the 20 MiB segment is too small");
        let e = s.allocate(2 * MIB).unwrap();
        assert_eq!(e, d + 16 * MIB, "the lowest area with room");
        // A freed range is taken again, once no lower one has room.
        s.free(c, 20 * MIB);
        assert_eq!(s.allocate(12 * MIB).unwrap(), e + 2 * MIB, "the 14 MiB left in the lowest area");
        assert_eq!(s.allocate(20 * MIB).unwrap(), c);
        // Larger segments take areas rounded up to 32 MiB.
        let big = s.allocate(148 * MIB).unwrap();
        assert_eq!(big, d - 160 * MIB);
        assert_eq!(big % (32 * MIB), 0);
    }

    #[test]
    fn carving_steps_over_addresses_in_use_and_a_huge_reservation_goes_above() {
        let mut s = VirtualSegments::starting_at(VIRTUAL_BASE);
        let top = VIRTUAL_BASE + ADDRESS_SPAN;
        // A replay's recorded segment right below the first area.
        let recorded = top - FIRST_AREA - 64 * MIB;
        assert!(s.adopt(recorded, 64 * MIB));
        let a = s.allocate(600 * MIB).unwrap();
        assert!(a + 608 * MIB <= recorded, "the new area lies below what is in use");
        let huge = s.reserve(1 << 60).unwrap();
        assert!(huge >= top, "above everything rather than overflowing");
    }
}
