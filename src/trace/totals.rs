//! What a trace alone says is live, position by position: requested bytes of live allocations
//! and bytes reserved in segments. `tensormem replay`'s recorded figures and the page's curves
//! both count them here, so the two always agree.

use super::{Action, BlockState, Segment, Trace};

/// Bytes live at one position of a trace.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct Totals {
    /// Requested bytes of live allocations (as MemoryViz's timeline draws them; the allocator's
    /// own allocated bytes count whole blocks).
    pub allocated: u64,
    /// Bytes held in segments.
    pub reserved: u64,
}

impl Totals {
    /// The totals of a state: every segment's size, and the requested bytes of its allocated
    /// blocks (a block whose free is pending had its `free_requested` already).
    pub fn of_segments<'a>(segments: impl IntoIterator<Item = &'a Segment>) -> Totals {
        let mut totals = Totals::default();
        for s in segments {
            totals.reserved = totals.reserved.saturating_add(s.total_size);
            for b in s.blocks.iter().filter(|b| b.state == BlockState::ActiveAllocated) {
                totals.allocated = totals.allocated.saturating_add(b.requested_size);
            }
        }
        totals
    }

    /// The totals after `e`: `alloc` and `free_requested` move allocated bytes, segment events
    /// reserved ones. The sums saturate: an edited or truncated trace may free what it never
    /// showed allocated.
    pub fn apply(&mut self, action: Action, size: u64) {
        match action {
            Action::Alloc => self.allocated = self.allocated.saturating_add(size),
            Action::FreeRequested => self.allocated = self.allocated.saturating_sub(size),
            Action::SegmentAlloc | Action::SegmentMap => self.reserved = self.reserved.saturating_add(size),
            Action::SegmentFree | Action::SegmentUnmap => self.reserved = self.reserved.saturating_sub(size),
            Action::FreeCompleted | Action::Snapshot | Action::Oom | Action::Annotate => {}
        }
    }
}

/// The totals at every position of `trace`: `start` (position 0), then after each entry
/// (position i + 1 after entry i), `trace.len() + 1` in all.
pub fn running_totals(trace: &Trace, start: Totals) -> impl Iterator<Item = Totals> + '_ {
    // Two columns are all the totals read.
    std::iter::once(start).chain(trace.actions().iter().zip(trace.sizes()).scan(start, |at, (&action, &size)| {
        at.apply(action, size);
        Some(*at)
    }))
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::trace::TraceEntry;

    fn entry(action: Action, size: u64) -> TraceEntry {
        TraceEntry { action, addr: 0, size, stream: 0, time_us: None, frames: None, category: None, extra: None }
    }

    #[test]
    fn allocations_count_requested_bytes_and_segments_reserved_ones() {
        use Action::*;
        let trace = [
            entry(SegmentAlloc, 2 << 20),
            entry(Alloc, 1000),
            entry(Alloc, 24),
            entry(FreeRequested, 1000),
            // The completion of a free moves nothing: its request did.
            entry(FreeCompleted, 1000),
            entry(SegmentMap, 20 << 20),
            entry(Snapshot, 0),
            entry(SegmentUnmap, 20 << 20),
            entry(FreeRequested, 24),
            entry(SegmentFree, 2 << 20),
        ];
        let start = Totals { allocated: 512, reserved: 4096 };
        let got: Vec<(u64, u64)> = running_totals(&Trace::from(trace), start).map(|t| (t.allocated, t.reserved)).collect();
        let r = 4096 + (2 << 20);
        let expected =
            [(512, 4096), (512, r), (1512, r), (1536, r), (536, r), (536, r), (536, r + (20 << 20)), (536, r + (20 << 20)), (536, r), (512, r), (512, 4096)];
        assert_eq!(got, expected);
    }

    #[test]
    fn frees_of_more_than_the_trace_shows_stop_at_zero() {
        let trace = [entry(Action::FreeRequested, 100), entry(Action::SegmentFree, 100), entry(Action::Alloc, 7)];
        let got: Vec<Totals> = running_totals(&Trace::from(trace), Totals { allocated: 40, reserved: 60 }).collect();
        assert_eq!(got.last(), Some(&Totals { allocated: 7, reserved: 0 }));
    }
}
