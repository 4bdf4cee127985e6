//! What is live at one position of a trace: the bytes by group (the trace's own category where it
//! has one, else the user's line at the top of the stack), the stacks holding the most, and the
//! largest allocations by trace index and address. The peak and out-of-memory findings show it.

use crate::pytorch::{is_plumbing, short_path};
use crate::timeline::Timeline;
use crate::trace::Frame;
use serde::{Deserialize, Serialize};

/// Groups, stacks and allocations listed at most.
const TOP: usize = 5;
/// Frames shown per stack.
const FRAMES_SHOWN: usize = 6;

#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct Live {
    /// The state after this many trace entries (0: the start of the trace).
    pub position: usize,
    /// Requested bytes of the live allocations (the trace's figure, as MemoryViz counts).
    pub bytes: u64,
    pub allocations: usize,
    /// Bytes by group, most first: every group, so that they add up to `bytes`.
    pub by_group: Vec<GroupBytes>,
    /// The stacks holding the most bytes.
    pub top_stacks: Vec<StackBytes>,
    /// The largest live allocations.
    pub largest: Vec<AllocationRef>,
}

#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct GroupBytes {
    pub name: String,
    /// `frame`, `before_trace`, `no_stack`, or a category (`activation`, `optimizer_state`...).
    pub kind: String,
    pub bytes: u64,
    pub allocations: usize,
}

#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct StackBytes {
    pub bytes: u64,
    pub allocations: usize,
    /// The stack's Python frames (or, without any, its first frames past the allocator's own),
    /// innermost first, as
    /// `name (file:line)`.
    pub frames: Vec<String>,
}

#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct AllocationRef {
    /// Index of its `alloc` entry in the device's trace; None when it predates the trace.
    pub trace_index: Option<usize>,
    pub address: u64,
    pub bytes: u64,
    pub group: String,
}

/// What is live at `position` (`0..=events`).
pub fn at(t: &Timeline, position: usize) -> Live {
    let a = &t.allocations;
    let x = position as u32;
    let live: Vec<usize> = (0..a.size.len()).filter(|&id| a.start[id] <= x && x < a.end[id]).collect();
    let bytes_of = |id: usize| a.size[id] as u64;

    let mut by_group: Vec<GroupBytes> = Vec::new();
    let mut group_slot = vec![usize::MAX; t.groups.len()];
    let mut by_stack: rustc_hash::FxHashMap<u32, (u64, usize)> = Default::default();
    for &id in &live {
        let g = a.group[id] as usize;
        if group_slot[g] == usize::MAX {
            group_slot[g] = by_group.len();
            let group = &t.groups[g];
            by_group.push(GroupBytes { name: group.name.clone(), kind: group.kind.key().to_string(), bytes: 0, allocations: 0 });
        }
        let slot = &mut by_group[group_slot[g]];
        slot.bytes += bytes_of(id);
        slot.allocations += 1;
        let stack = by_stack.entry(a.stack[id]).or_default();
        stack.0 += bytes_of(id);
        stack.1 += 1;
    }
    by_group.sort_by(|p, q| q.bytes.cmp(&p.bytes).then_with(|| p.name.cmp(&q.name)));
    let mut by_stack: Vec<(u32, u64, usize)> = by_stack.into_iter().map(|(stack, (bytes, count))| (stack, bytes, count)).collect();
    by_stack.sort_by(|p, q| q.1.cmp(&p.1).then(p.0.cmp(&q.0)));
    let top_stacks = by_stack
        .iter()
        .filter(|(stack, _, _)| *stack != u32::MAX)
        .take(TOP)
        .map(|&(stack, bytes, allocations)| StackBytes { bytes, allocations, frames: stack_frames(t, stack) })
        .collect();

    let mut largest = live.clone();
    largest.sort_by(|&p, &q| bytes_of(q).cmp(&bytes_of(p)).then(p.cmp(&q)));
    let largest = largest
        .into_iter()
        .take(TOP)
        .map(|id| AllocationRef {
            trace_index: (a.start[id] as usize).checked_sub(1),
            address: a.addr[id] as u64,
            bytes: bytes_of(id),
            group: t.groups[a.group[id] as usize].name.clone(),
        })
        .collect();
    Live { position, bytes: live.iter().map(|&id| bytes_of(id)).sum(), allocations: live.len(), by_group, top_stacks, largest }
}

/// A stack as a reader scans it: its Python frames, else its first frames that name the work.
pub(super) fn stack_frames(t: &Timeline, stack: u32) -> Vec<String> {
    let s = stack as usize;
    let ids = &t.stack_frames[t.stack_offsets[s] as usize..t.stack_offsets[s + 1] as usize];
    frames_shown(ids.iter().map(|&f| &t.frames[f as usize]))
}

/// A stack's frames as a reader scans them: its Python frames, else its first frames that name
/// the work; at most six, innermost first.
pub fn frames_shown<'a>(frames: impl Iterator<Item = &'a Frame>) -> Vec<String> {
    let frames: Vec<&Frame> = frames.collect();
    let python: Vec<&Frame> = frames.iter().copied().filter(|f| f.filename.ends_with(".py")).collect();
    let shown = if python.is_empty() { frames.into_iter().filter(|f| names_the_work(f)).collect() } else { python };
    shown
        .into_iter()
        .take(FRAMES_SHOWN)
        .map(|f| if f.filename.is_empty() { f.name.clone() } else { format!("{} ({}:{})", f.name, short_path(&f.filename), f.line) })
        .collect()
}

/// A C++ frame that says what ran (an ATen op's entry, an autograd node, the caller), not how
/// memory was obtained (the allocator, the recording, ATen's empty-tensor helpers).
fn names_the_work(f: &Frame) -> bool {
    let aten_internals = (f.name.starts_with("at::") && !f.name.starts_with("at::_ops::")) || f.name.contains(" at::detail::");
    !f.name.is_empty() && !is_plumbing(f) && !aten_internals
}

impl Live {
    /// "activation 1.20 GiB, input 30.00 MiB": the largest groups, for a title.
    pub fn largest_groups(&self, count: usize) -> String {
        self.by_group.iter().take(count).map(|g| format!("{} {}", g.name, super::size(g.bytes))).collect::<Vec<_>>().join(", ")
    }
}
