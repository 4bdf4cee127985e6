//! Which private pool each recorded allocation went to, where the trace does not say.
//!
//! PyTorch releases up to 2.11 write each segment's pool (`segment_pool_id`) but not each trace
//! entry's (`pool_id` came after). The file still proves part of it: a segment alive at the end
//! belongs to its pool from the moment its memory was mapped, and a block is cut from its
//! segment, so an allocation made inside such a segment of a private pool went to that pool (by
//! a graph's capture or a `use_mem_pool` scope; rarely, a default request that a `use_on_oom`
//! pool lent a block to, which the replay then makes in the pool). Memory mapped and released
//! within the trace leaves no pool behind: its allocations replay in the default pool.

use crate::alloc::{DEFAULT_POOL, PoolId};
use crate::trace::{Action, Segment, Trace};
use std::collections::BTreeMap;

/// Address ranges of private pools, each from the trace entry that mapped it: as many as the
/// final segments of private pools and the maps that made them, not as the allocations in them.
#[derive(Debug, Default)]
pub(super) struct PrivateRanges {
    /// Disjoint, by start address.
    pieces: Vec<Piece>,
}

#[derive(Debug)]
struct Piece {
    start: u64,
    end: u64,
    pool: PoolId,
    /// Index of the entry that mapped it (`segment_alloc` or `segment_map`); None: before the trace.
    since: Option<usize>,
}

impl PrivateRanges {
    /// Walks the trace back from the final segments: before the entry that mapped a range, the
    /// range was not that pool's.
    pub(super) fn of(trace: &Trace, final_segments: &[&Segment]) -> PrivateRanges {
        // Start address -> (end, pool) of the private ranges mapped at the point reached.
        let mut live: BTreeMap<u64, (u64, PoolId)> = final_segments
            .iter()
            .filter(|s| s.segment_pool_id != DEFAULT_POOL)
            .map(|s| (s.address, (s.address.saturating_add(s.total_size), s.segment_pool_id)))
            .collect();
        let mut pieces = Vec::new();
        for i in (0..trace.len()).rev() {
            if live.is_empty() {
                break;
            }
            let e = trace.at(i);
            if !matches!(e.action, Action::SegmentAlloc | Action::SegmentMap) {
                continue;
            }
            // Cut [addr, addr + size) out of the live ranges: from `i` on it was theirs.
            let (from, to) = (e.addr, e.addr.saturating_add(e.size));
            let overlapping: Vec<(u64, u64, PoolId)> =
                live.range(..to).rev().take_while(|(_, (end, _))| *end > from).map(|(&start, &(end, pool))| (start, end, pool)).collect();
            for (start, end, pool) in overlapping {
                live.remove(&start);
                pieces.push(Piece { start: start.max(from), end: end.min(to), pool, since: Some(i) });
                if start < from {
                    live.insert(start, (from, pool));
                }
                if end > to {
                    live.insert(to, (end, pool));
                }
            }
        }
        pieces.extend(live.into_iter().map(|(start, (end, pool))| Piece { start, end, pool, since: None }));
        pieces.sort_unstable_by_key(|p| p.start);
        PrivateRanges { pieces }
    }

    /// The private pool of the allocation that entry `i` made at `addr`, if it lies in one.
    pub(super) fn pool_of(&self, i: usize, addr: u64) -> Option<PoolId> {
        let at = self.pieces.partition_point(|p| p.start <= addr).checked_sub(1)?;
        let piece = &self.pieces[at];
        (addr < piece.end && piece.since.is_none_or(|since| since < i)).then_some(piece.pool)
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::trace::{PoolKind, TraceEntry, no_frames};

    const MIB: u64 = 1 << 20;
    const X: u64 = 0x7f00_0000_0000;

    fn segment(address: u64, total_size: u64, pool: PoolId, is_expandable: bool) -> Segment {
        Segment {
            device: 0,
            address,
            total_size,
            allocated_size: 0,
            active_size: 0,
            requested_size: 0,
            stream: 0,
            segment_type: PoolKind::Large,
            segment_pool_id: pool,
            is_expandable,
            frames: no_frames(),
            blocks: Vec::new(),
        }
    }

    fn trace(entries: &[(Action, u64, u64)]) -> Trace {
        entries.iter().map(|&(action, addr, size)| TraceEntry::new(action, addr, size, 0)).collect()
    }

    /// The default pool's expandable segment maps the addresses a private pool's maps again
    /// after the cache was emptied: only what the pool mapped is the pool's.
    #[test]
    fn expandable_addresses_are_the_pools_only_from_its_map() {
        use Action::*;
        let t = trace(&[
            (SegmentMap, X, 20 * MIB),
            (Alloc, X, MIB),
            (SegmentMap, X + 20 * MIB, 20 * MIB),
            (Alloc, X + 20 * MIB, MIB),
            (FreeRequested, X, MIB),
            (FreeCompleted, X, MIB),
            (FreeRequested, X + 20 * MIB, MIB),
            (FreeCompleted, X + 20 * MIB, MIB),
            (SegmentUnmap, X, 40 * MIB),
            (SegmentMap, X, 20 * MIB),
            (Alloc, X, MIB),
        ]);
        let pool = (1, 0);
        let ranges = PrivateRanges::of(&t, &[&segment(X, 20 * MIB, pool, true)]);
        assert_eq!([1, 3, 10].map(|i| ranges.pool_of(i, t.at(i).addr)), [None, None, Some(pool)]);
    }

    /// A segment made before the trace is its pool's throughout; one made in it, from its
    /// segment_alloc on; a default segment's allocations are in no private pool.
    #[test]
    fn segments_are_their_pools_from_the_entry_that_made_them() {
        use Action::*;
        let (a, b, c) = (X, X + 64 * MIB, X + 128 * MIB);
        let t = trace(&[(Alloc, a + MIB, MIB), (SegmentFree, b, 2 * MIB), (SegmentAlloc, b, 2 * MIB), (Alloc, b, MIB), (Alloc, c, MIB)]);
        let finals = [segment(a, 20 * MIB, (0, 1), false), segment(b, 2 * MIB, (2, 0), false), segment(c, 2 * MIB, DEFAULT_POOL, false)];
        let ranges = PrivateRanges::of(&t, &finals.iter().collect::<Vec<_>>());
        assert_eq!(ranges.pool_of(0, a + MIB), Some((0, 1)));
        assert_eq!(ranges.pool_of(3, b), Some((2, 0)));
        assert_eq!(ranges.pool_of(1, b), None, "before the segment_alloc at b, b was another segment's");
        assert_eq!(ranges.pool_of(4, c), None);
        assert_eq!(ranges.pool_of(4, a + 20 * MIB), None, "past the end of a");
    }
}
