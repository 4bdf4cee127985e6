//! Which private pool each recorded allocation went to, where the trace does not say.
//!
//! PyTorch releases up to 2.11 write each segment's pool (`segment_pool_id`) but not each trace
//! entry's (`pool_id` came after). The file still proves part of it: a segment alive at the end
//! belongs to its pool from the moment it was made, and a block belongs to its segment's pool
//! (no pool lends to another). So an allocation made inside such a segment of a private pool was
//! routed to that pool (by a graph's capture or a `use_mem_pool` scope), and its replay is too.
//! Segments made and freed within the trace leave no pool behind: their allocations replay in
//! the default pool.

use crate::alloc::{DEFAULT_POOL, PoolId};
use crate::trace::{Action, Segment, Trace};
use rustc_hash::FxHashMap;
use std::collections::BTreeMap;

/// Index of each `alloc` entry made inside a segment of a private pool -> that pool, walking the
/// trace back from the final segments (a segment did not exist before the entry that made it).
pub(super) fn allocs_in_private_pools(trace: &Trace, final_segments: &[&Segment]) -> FxHashMap<usize, PoolId> {
    // Start address -> (end, pool) of the private segments alive at the point reached.
    let mut live: BTreeMap<u64, (u64, PoolId)> = final_segments
        .iter()
        .filter(|s| s.segment_pool_id != DEFAULT_POOL)
        .map(|s| (s.address, (s.address.saturating_add(s.total_size), s.segment_pool_id)))
        .collect();
    let mut routed = FxHashMap::default();
    for i in (0..trace.len()).rev() {
        if live.is_empty() {
            break;
        }
        let e = trace.at(i);
        match e.action {
            Action::SegmentAlloc => {
                live.remove(&e.addr);
            }
            Action::Alloc => {
                if let Some((_, &(end, pool))) = live.range(..=e.addr).next_back()
                    && e.addr < end
                {
                    routed.insert(i, pool);
                }
            }
            _ => {}
        }
    }
    routed
}
