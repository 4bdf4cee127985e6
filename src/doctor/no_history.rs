//! `no-history`: a snapshot taken without `_record_memory_history()`: an empty trace and blocks
//! without stacks. The file holds what the caching allocator held when it was taken (segments,
//! blocks, what is cached and free), and nothing about how it got there: no event, no stack, no
//! peak. The pattern no recorded program makes: a recording has at least its own events, or
//! (PyTorch 2.0/2.1's `_record_memory_history(True)`) stacks on its blocks.

use super::Material;
use super::kinds::{Kind, Role};
use super::{Finding, NO_HISTORY, Patient, size};
use crate::trace::BlockState;
use serde::{Deserialize, Serialize};

#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct NoHistoryEvidence {
    pub device: i64,
    pub segments: usize,
    pub reserved_bytes: u64,
    pub allocated_bytes: u64,
    /// Reserved but not allocated: cached free blocks at the moment the file was taken.
    pub cached_free_bytes: u64,
    pub largest_free_block_bytes: u64,
}

pub(super) const KIND: Kind = Kind {
    name: NO_HISTORY,
    label: "no history",
    about: "a snapshot taken without recording the memory history",
    role: Role::Summary,
    find: |x| Ok(find(&x.patient)),
    material: Material::ANY,
};

/// Whether `p`'s device has no history: no trace entry, and no block with a stack.
pub(super) fn without_history(p: &Patient) -> bool {
    p.snapshot.trace_of(p.device).is_empty() && p.snapshot.segments_of(p.device).all(|s| s.blocks.iter().all(|b| b.frames.is_empty()))
}

fn find(p: &Patient) -> Option<Finding> {
    if !without_history(p) {
        return None;
    }
    let segments: Vec<_> = p.snapshot.segments_of(p.device).collect();
    let reserved: u64 = segments.iter().map(|s| s.total_size).sum();
    let blocks = || segments.iter().flat_map(|s| s.blocks.iter());
    let allocated: u64 = blocks().filter(|b| b.state != BlockState::Inactive).map(|b| b.size).sum();
    let largest_free = blocks().filter(|b| b.state == BlockState::Inactive).map(|b| b.size).max().unwrap_or(0);
    let title = format!(
        "No memory history is in this file: it is the allocator's state when it was taken ({} segment{}, {} reserved, {} allocated), \
         not how it got there",
        segments.len(),
        if segments.len() == 1 { "" } else { "s" },
        size(reserved),
        size(allocated)
    );
    let why = "torch.cuda.memory._dump_snapshot() writes the segments and blocks the caching allocator holds at that moment, and \
               a trace of the events since torch.cuda.memory._record_memory_history() was called. This file has no event and no \
               block with a stack: the program never called it, or allocated and freed nothing after calling it. The file shows what was reserved and allocated at the end and how the free space is split (its fragmentation then), \
               but no event, no stack and no peak: what was live at the peak, and which code made it, is not in it. Taking a \
               snapshot frees no memory either."
        .to_string();
    let fix = "Record the history from the start, then dump it where the memory matters: \
               torch.cuda.memory._record_memory_history(max_entries=100000) before the model is built, and \
               torch.cuda.memory._dump_snapshot(\"snapshot.pickle\") after the step to look at (or where \
               torch.cuda.OutOfMemoryError is caught). `with tensormem.watch():` around the script does both."
        .to_string();
    let evidence = NoHistoryEvidence {
        device: p.device,
        segments: segments.len(),
        reserved_bytes: reserved,
        allocated_bytes: allocated,
        cached_free_bytes: reserved.saturating_sub(allocated),
        largest_free_block_bytes: largest_free,
    };
    Some(Finding::new(title, reserved, evidence, why, fix))
}
