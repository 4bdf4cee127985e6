//! Where each allocation's band lies: its lifetime, then the rectangles ("pieces") of MemoryViz's
//! stacking. Live allocations stack in the order they were made; when one ends, everything above
//! it drops by its size, closing a piece each.
//!
//! Exact pieces cost one per band above each free: allocations freed oldest-first make that the
//! square of the allocations (a queue), or the allocations times the live ones (a sliding
//! window). So the pieces are laid exactly while they stay under a budget; past it every band is
//! sampled at a common step of positions (still linear in the allocations plus the budget), and
//! the timeline says so. The lifetimes, the
//! curves and everything the doctor reads are exact either way.

use super::Pieces;
use crate::replay::StartState;
use crate::trace::{Action, BlockState, Trace};
use rustc_hash::FxHashMap;

/// The most pieces laid exactly (8 bytes each: 128 MiB). Real traces stay far below it.
pub(super) const PIECE_BUDGET: usize = 1 << 24;

/// Where each allocation ends, and where the trace does not add up.
pub(super) struct Lifetimes {
    /// Exclusive end position; `events + 1` for allocations live at the end.
    pub end: Vec<u32>,
    /// Addresses allocated again without a recorded free (the earlier allocation ends there).
    pub reused_without_free: usize,
    /// Frees of addresses that were never allocated.
    pub unknown_frees: usize,
}

/// The lifetimes of the blocks live at `start` (in address order, at position 0), then of the
/// trace's allocations: one pass with a map from address to live allocation.
pub(super) fn lifetimes(start: &StartState, trace: &Trace, allocations: usize) -> Lifetimes {
    let last = trace.len() as u32 + 1;
    let mut l = Lifetimes { end: vec![last; allocations], reused_without_free: 0, unknown_frees: 0 };
    let mut by_addr: FxHashMap<u64, u32> = FxHashMap::default();
    let mut id = 0u32;
    let live_at_start = start.segments.iter().flat_map(|s| s.blocks.iter()).filter(|b| b.state == BlockState::ActiveAllocated);
    for blk in live_at_start {
        // Two live blocks at one address (an edited file): the first ends before it begins.
        if let Some(old) = by_addr.insert(blk.address, id) {
            l.reused_without_free += 1;
            l.end[old as usize] = 0;
        }
        id += 1;
    }
    for (i, e) in trace.iter().enumerate() {
        let x = i as u32 + 1;
        match e.action {
            Action::Alloc => {
                // A reused address means the earlier allocation's free was not recorded.
                if let Some(old) = by_addr.insert(e.addr, id) {
                    l.reused_without_free += 1;
                    l.end[old as usize] = x;
                }
                id += 1;
            }
            Action::FreeRequested => match by_addr.remove(&e.addr) {
                Some(old) => l.end[old as usize] = x,
                None => l.unknown_frees += 1,
            },
            _ => {}
        }
    }
    l
}

/// The laid-out bands: each allocation's pieces (`offsets[id] .. offsets[id + 1]`, in x order),
/// and the step they were sampled at where exact pieces would have passed the budget.
pub(super) struct Bands {
    pub offsets: Vec<u32>,
    pub pieces: Pieces,
    pub sampled_every: Option<u32>,
}

/// Lays the bands of allocations with these sizes and lifetimes over `events` positions, exactly
/// when that takes about `budget` pieces at most (the check runs after each position).
pub(super) fn lay(size: &[f64], start: &[u32], end: &[u32], events: usize, budget: usize) -> Bands {
    let walk = Walk::new(start, end, events);
    let mut count = vec![0u32; size.len()];
    if walk.run(size, None, budget, &mut |id, _, _| count[id as usize] += 1) {
        return walk.write(size, None, count);
    }
    walk.sampled(size, sampling_step(start, end, budget))
}

/// Lays the bands sampled every `step` positions (at least 2): what a first image needs, a
/// sample per pixel column, in time linear in the allocations whatever the order of their frees.
pub(super) fn lay_every(size: &[f64], start: &[u32], end: &[u32], events: usize, step: u32) -> Bands {
    Walk::new(start, end, events).sampled(size, step.max(2))
}

/// The step at which sampling every live band keeps the pieces near `budget`: the bands' total
/// length over what the budget leaves beside one piece per allocation.
fn sampling_step(start: &[u32], end: &[u32], budget: usize) -> u32 {
    let total: u64 = start.iter().zip(end).map(|(&s, &e)| (e - s) as u64).sum();
    let room = budget.saturating_sub(start.len()).max(1) as u64;
    total.div_ceil(room).clamp(2, u32::MAX as u64) as u32
}

/// `ids` in the order of `key`, ties in their order: a radix sort by 16 bits at a time, linear
/// where a comparison sort of a 1 GB trace's 3.8 M allocations by their end took a third of
/// laying it out (each comparison reads two keys far apart in memory).
fn sorted_by_key(mut ids: Vec<u32>, key: impl Fn(u32) -> u32) -> Vec<u32> {
    let max = ids.iter().map(|&id| key(id)).max().unwrap_or(0);
    let mut out = vec![0; ids.len()];
    let mut shift = 0;
    while shift < 32 && (shift == 0 || max >> shift != 0) {
        let digit = |id: u32| ((key(id) >> shift) & 0xffff) as usize;
        let mut at = vec![0usize; 1 << 16];
        for &id in &ids {
            at[digit(id)] += 1;
        }
        let mut sum = 0;
        for slot in at.iter_mut() {
            (*slot, sum) = (sum, sum + *slot);
        }
        for &id in &ids {
            let d = digit(id);
            out[at[d]] = id;
            at[d] += 1;
        }
        std::mem::swap(&mut ids, &mut out);
        shift += 16;
    }
    ids
}

/// Called for each piece closed: (allocation, x0, y). Pieces of one allocation come in x order.
type PieceSink<'a> = dyn FnMut(u32, u32, f64) + 'a;

/// The allocations' starts and ends as one walk over positions.
struct Walk<'a> {
    start: &'a [u32],
    end: &'a [u32],
    /// Allocations by end position (those live at the end left out).
    by_end: Vec<u32>,
    events: usize,
}

impl<'a> Walk<'a> {
    /// The bands sampled every `step` positions: their pieces counted, then written.
    fn sampled(&self, size: &[f64], step: u32) -> Bands {
        let mut count = vec![0u32; size.len()];
        self.run(size, Some(step), usize::MAX, &mut |id, _, _| count[id as usize] += 1);
        self.write(size, Some(step), count)
    }

    /// Writes the pieces of a walk (exact, or sampled every `step`) whose pieces per allocation
    /// were counted.
    fn write(&self, size: &[f64], step: Option<u32>, count: Vec<u32>) -> Bands {
        let mut offsets = Vec::with_capacity(count.len() + 1);
        let mut total = 0u32;
        for &c in &count {
            offsets.push(total);
            total += c;
        }
        offsets.push(total);
        drop(count);

        let mut pieces = Pieces { x0: vec![0; total as usize], y: vec![0.0; total as usize] };
        let mut next = offsets.clone();
        self.run(size, step, usize::MAX, &mut |id, x0, y| {
            let k = next[id as usize] as usize;
            next[id as usize] += 1;
            pieces.x0[k] = x0;
            pieces.y[k] = y as f32;
        });
        Bands { offsets, pieces, sampled_every: step }
    }

    fn new(start: &'a [u32], end: &'a [u32], events: usize) -> Walk<'a> {
        let last = events as u32 + 1;
        let lives = |id: u32| start[id as usize] < end[id as usize];
        let ending: Vec<u32> = (0..end.len() as u32).filter(|&id| lives(id) && end[id as usize] < last).collect();
        let by_end = sorted_by_key(ending, |id| end[id as usize]);
        Walk { start, end, by_end, events }
    }

    /// Walks the positions: at each, the allocations ending there leave the stack, then those
    /// starting there join it. Exact (`step` None) pieces stop once more than `limit` were
    /// closed: returns false then. Sampled, every band is set to its height every `step`
    /// positions.
    fn run(&self, size: &[f64], step: Option<u32>, limit: usize, piece: &mut PieceSink) -> bool {
        let mut stack = Stack::new(size.len());
        let (mut next_start, mut next_end) = (0usize, 0usize);
        for x in 0..=self.events as u32 {
            while let Some(&id) = self.by_end.get(next_end).filter(|&&id| self.end[id as usize] == x) {
                match step {
                    None => stack.remove_exact(x, id, piece),
                    Some(_) => stack.remove_lazy(x, id, piece),
                }
                next_end += 1;
            }
            while next_start < self.start.len() && self.start[next_start] == x {
                // An allocation that ends where it starts never joins the stack.
                if self.end[next_start] > x {
                    stack.push(x, next_start as u32, size);
                }
                next_start += 1;
            }
            if step.is_some_and(|s| x % s == 0) {
                stack.resample(x, piece);
            }
            if stack.closed > limit {
                return false;
            }
        }
        stack.close_all(self.events as u32 + 1, piece);
        true
    }
}

/// The live allocations, bottom first, with each one's current piece.
struct Stack {
    /// In the order they were made; sampled walks leave freed ones in place (dead) until they
    /// outnumber the living. Each band's record is here rather than in arrays by id, so that
    /// resampling reads the stack front to back (it visits every live band at every sample).
    live: Vec<Band>,
    dead_count: usize,
    /// Where each allocation is in `live`, while it is there.
    position: Vec<u32>,
    top: f64,
    closed: usize,
}

/// A band on the stack: its allocation, size, the height its current piece lies at, and where
/// that piece starts (`DEAD` once its allocation is freed, in a sampled walk).
#[derive(Clone, Copy)]
struct Band {
    id: u32,
    piece_start: u32,
    offset: f64,
    size: f64,
}

const DEAD: u32 = u32::MAX;

impl Band {
    fn dead(&self) -> bool {
        self.piece_start == DEAD
    }

    /// Closes the current piece at `x` (if it has any width): a new one starts there.
    fn close_piece(&mut self, x: u32, closed: &mut usize, piece: &mut PieceSink) {
        if x > self.piece_start {
            piece(self.id, self.piece_start, self.offset);
            *closed += 1;
        }
        self.piece_start = x;
    }
}

impl Stack {
    fn new(allocations: usize) -> Stack {
        Stack { live: Vec::new(), dead_count: 0, position: vec![0; allocations], top: 0.0, closed: 0 }
    }

    fn push(&mut self, x: u32, id: u32, size: &[f64]) {
        self.position[id as usize] = self.live.len() as u32;
        let size = size[id as usize];
        self.live.push(Band { id, piece_start: x, offset: self.top, size });
        self.top += size;
    }

    /// Ends `id` at `x`; everything above it drops by its size (a new piece each).
    fn remove_exact(&mut self, x: u32, id: u32, piece: &mut PieceSink) {
        let p = self.position[id as usize] as usize;
        let mut gone = self.live.remove(p);
        gone.close_piece(x, &mut self.closed, piece);
        for q in p..self.live.len() {
            let above = &mut self.live[q];
            above.close_piece(x, &mut self.closed, piece);
            above.offset -= gone.size;
            self.position[above.id as usize] = q as u32;
        }
        self.top -= gone.size;
    }

    /// Ends `id` at `x`, leaving the bands above where they are until the next sample.
    fn remove_lazy(&mut self, x: u32, id: u32, piece: &mut PieceSink) {
        let band = &mut self.live[self.position[id as usize] as usize];
        band.close_piece(x, &mut self.closed, piece);
        band.piece_start = DEAD;
        self.top -= band.size;
        self.dead_count += 1;
        if self.dead_count * 2 > self.live.len() {
            self.live.retain(|b| !b.dead());
            for (q, b) in self.live.iter().enumerate() {
                self.position[b.id as usize] = q as u32;
            }
            self.dead_count = 0;
        }
    }

    /// Sets every live band to its true height at `x`, closing a piece where it moved.
    fn resample(&mut self, x: u32, piece: &mut PieceSink) {
        let mut below = 0.0;
        for band in self.live.iter_mut().filter(|b| !b.dead()) {
            if band.offset != below {
                band.close_piece(x, &mut self.closed, piece);
                band.offset = below;
            }
            below += band.size;
        }
    }

    fn close_all(&mut self, x: u32, piece: &mut PieceSink) {
        for band in self.live.iter_mut().filter(|b| !b.dead()) {
            band.close_piece(x, &mut self.closed, piece);
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// The radix sort orders as a stable comparison sort does, keys of one, two and three
    /// 16-bit digits, ties in the order given.
    #[test]
    fn the_radix_sort_is_a_stable_sort_by_key() {
        let mut seed = 0x2545_f491_4f6c_dd1d_u64;
        let mut next = move || {
            seed ^= seed << 13;
            seed ^= seed >> 7;
            seed ^= seed << 17;
            seed
        };
        for range in [7u32, 1 << 16, 1 << 20, u32::MAX] {
            let keys: Vec<u32> = (0..5000).map(|_| (next() % range as u64) as u32).collect();
            let ids: Vec<u32> = (0..5000).rev().collect();
            let mut expected = ids.clone();
            expected.sort_by_key(|&id| keys[id as usize]);
            assert_eq!(sorted_by_key(ids, |id| keys[id as usize]), expected, "keys below {range}");
        }
        assert_eq!(sorted_by_key(Vec::new(), |id| id), Vec::<u32>::new());
    }

    /// `n` allocations of sizes 1, 2, 3, ... all live, then freed oldest first (a queue).
    fn queue(n: u32) -> (Vec<f64>, Vec<u32>, Vec<u32>, usize) {
        let size = (1..=n).map(f64::from).collect();
        let start = (1..=n).collect();
        let end = (n + 1..=2 * n).collect();
        (size, start, end, 2 * n as usize)
    }

    /// The (y, size) of every band live at `x`, bottom first.
    fn bands_at(b: &Bands, size: &[f64], end: &[u32], x: u32) -> Vec<(f64, f64)> {
        let mut live = Vec::new();
        for id in 0..size.len() {
            let range = b.offsets[id] as usize..b.offsets[id + 1] as usize;
            let pieces: Vec<u32> = b.pieces.x0[range.clone()].to_vec();
            if let Some(k) = pieces.partition_point(|&x0| x0 <= x).checked_sub(1)
                && x < end[id]
            {
                live.push((b.pieces.y[range.start + k] as f64, size[id]));
            }
        }
        live.sort_by(|a, b| a.0.total_cmp(&b.0));
        live
    }

    fn tiles(live: &[(f64, f64)]) -> bool {
        let mut top = 0.0;
        live.iter().all(|&(y, s)| {
            let ok = y == top;
            top += s;
            ok
        })
    }

    #[test]
    fn a_queue_is_exact_under_the_budget_and_costs_the_square() {
        let (size, start, end, events) = queue(40);
        let b = lay(&size, &start, &end, events, 10_000);
        assert_eq!(b.sampled_every, None);
        // Each band gets one piece, plus one for every band freed beneath it while it lives.
        assert_eq!(b.pieces.x0.len(), 40 + (0..40).sum::<usize>());
        for x in 0..=events as u32 {
            assert!(tiles(&bands_at(&b, &size, &end, x)), "position {x}");
        }
    }

    #[test]
    fn past_the_budget_the_bands_are_sampled_and_exact_at_each_sample() {
        let (size, start, end, events) = queue(400);
        let budget = 2_000;
        let b = lay(&size, &start, &end, events, budget);
        let step = b.sampled_every.expect("a queue of 400 needs 80,200 exact pieces");
        assert!(b.pieces.x0.len() <= budget + 2 * size.len(), "{} pieces", b.pieces.x0.len());
        for x in (0..=events as u32).step_by(step as usize) {
            let live = bands_at(&b, &size, &end, x);
            assert!(tiles(&live), "position {x}: {live:?}");
            let expected: f64 = (0..size.len()).filter(|&id| start[id] <= x && x < end[id]).map(|id| size[id]).sum();
            assert_eq!(live.iter().map(|b| b.1).sum::<f64>(), expected, "position {x}");
        }
    }

    #[test]
    fn the_sampled_cost_stays_linear_for_a_long_queue() {
        let (size, start, end, events) = queue(200_000);
        let b = lay(&size, &start, &end, events, 1 << 20);
        assert!(b.sampled_every.is_some());
        assert!(b.pieces.x0.len() <= (1 << 20) + 2 * size.len(), "{} pieces", b.pieces.x0.len());
    }
}
