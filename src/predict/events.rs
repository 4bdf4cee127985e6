//! One recording as a program: the allocations live at its start (placed afresh, in address
//! order, as `replay --start replaced` places them), then its allocs and frees, and the cache
//! releases the program asked for (`empty_cache`). The allocator's own decisions (segment
//! calls, the flush before retrying a failed cudaMalloc) are left out: the replay of the
//! predicted trace makes its own. Each event gets a key, the action and the stack of its
//! allocation, that is the same in every recording of the same program.

use crate::alloc::AllocatorConfig;
use crate::replay;
use crate::trace::{Action, BlockState, Entry, Frame, Frames, Snapshot, TraceEntry};
use rustc_hash::FxHashMap;
use std::sync::Arc;

/// One recording's events, with what their keys are made of.
pub struct Program {
    pub entries: Vec<TraceEntry>,
    /// Per entry: the stack id of its allocation (0: no frames).
    pub stacks: Vec<u32>,
    /// Per entry: the index of its allocation's entry (its own for an alloc; [`NO_ALLOC`] for a
    /// free of memory the trace never allocated, and for a cache release).
    pub alloc_of: Vec<usize>,
    /// How many entries (from the first) are the allocations live at the start.
    pub at_start: usize,
    /// Per entry (allocations only): the allocation is never freed in the trace.
    pub kept: Vec<bool>,
    /// Per entry: the index of the trace entry it comes from (None: live at the start).
    pub trace_index: Vec<Option<usize>>,
}

pub const NO_ALLOC: usize = usize::MAX;

/// Stack ids shared by every recording: equal frames, equal id.
#[derive(Default)]
pub struct Stacks {
    by_frames: FxHashMap<Frames, u32>,
    /// The same lists by address: real snapshots share one list among many entries (the
    /// snapshots outlive the ids, so an address stays its list's).
    by_pointer: FxHashMap<usize, u32>,
    pub frames: Vec<Frames>,
    /// Per stack id, the id of its frames without line numbers (filled on demand).
    loose: Vec<u32>,
}

impl Stacks {
    pub fn new() -> Stacks {
        Stacks { frames: vec![crate::trace::no_frames()], ..Default::default() }
    }

    fn id(&mut self, frames: Option<&Frames>) -> u32 {
        let Some(frames) = frames.filter(|f| !f.is_empty()) else { return 0 };
        let pointer = Arc::as_ptr(frames) as *const Frame as usize;
        if let Some(&id) = self.by_pointer.get(&pointer) {
            return id;
        }
        let next = self.frames.len() as u32;
        let id = *self.by_frames.entry(frames.clone()).or_insert(next);
        if id == next {
            self.frames.push(frames.clone());
        }
        self.by_pointer.insert(pointer, id);
        id
    }

    /// Per stack id, an id that ignores line numbers and the names of generated code: a script
    /// edited between two recordings moves the lines of its outer frames, and torch.compile
    /// writes each size's kernels to a file named by their hash
    /// (`/tmp/torchinductor_user/z3/cz3vcpg….py`), not what the program does.
    pub fn loose_ids(&mut self) -> &[u32] {
        if self.loose.len() < self.frames.len() {
            let mut by_names: FxHashMap<Vec<(&str, &str)>, u32> = FxHashMap::default();
            self.loose = self
                .frames
                .iter()
                .enumerate()
                .map(|(id, f)| {
                    let names: Vec<(&str, &str)> = f.iter().map(|f| (f.name.as_str(), generated_as_one(&f.filename))).collect();
                    if id == 0 { 0 } else { *by_names.entry(names).or_insert(id as u32) }
                })
                .collect();
        }
        &self.loose
    }
}

/// A file torch.compile generated (under `torchinductor_<user>/`, named by its code's hash) as
/// one name; any other file as it is.
fn generated_as_one(filename: &str) -> &str {
    if filename.contains("/torchinductor_") { "(torch.compile's generated code)" } else { filename }
}

/// How [`Program::keys`] knows an allocation without frames.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Frameless {
    BySize,
    AsOne,
}

/// The key's action part.
fn code(action: Action) -> u64 {
    match action {
        Action::Alloc => 1,
        Action::FreeRequested => 2,
        Action::FreeCompleted => 3,
        _ => 4,
    }
}

impl Program {
    fn push(&mut self, e: TraceEntry, stack: u32, alloc: usize, trace_index: Option<usize>) {
        self.trace_index.push(trace_index);
        self.alloc_of.push(alloc);
        self.kept.push(e.action == Action::Alloc);
        self.entries.push(e);
        self.stacks.push(stack);
    }
    /// Each entry's key: its action and its allocation's stack as `stack_id` maps it. An
    /// allocation without frames is known by its size (`Frameless::BySize`), or, in a trace that
    /// has frames elsewhere, by that alone (`Frameless::AsOne`): it was made by a thread without
    /// Python (the autograd engine's, with `stacks="python"`), and the variables change most
    /// of those sizes.
    pub fn keys(&self, stack_id: &[u32], frameless: Frameless) -> Vec<u64> {
        let as_one = frameless == Frameless::AsOne && self.stacks.iter().any(|&s| s != 0);
        (0..self.entries.len())
            .map(|i| {
                let identity = match self.alloc_of[i] {
                    NO_ALLOC => 0,
                    a if self.stacks[a] == 0 && as_one => 1 << 56,
                    a if self.stacks[a] == 0 => (1 << 56) | (self.entries[a].size & ((1 << 56) - 1)),
                    a => stack_id[self.stacks[a] as usize] as u64,
                };
                (code(self.entries[i].action) << 58) | identity
            })
            .collect()
    }
}

/// `device`'s events of `snapshot`, keyed through `stacks`.
pub fn program(snapshot: &Snapshot, device: i64, config: &AllocatorConfig, stacks: &mut Stacks) -> Program {
    let trace = snapshot.trace_of(device);
    let final_segments: Vec<_> = snapshot.segments_of(device).collect();
    let start = replay::start_state(&final_segments, trace, config);
    let mut p =
        Program { entries: Vec::with_capacity(trace.len()), stacks: Vec::new(), alloc_of: Vec::new(), at_start: 0, kept: Vec::new(), trace_index: Vec::new() };
    // Address -> index of the live allocation's entry.
    let mut live: FxHashMap<u64, usize> = FxHashMap::default();

    // The same order in every recording (their layouts differ): by stack, then largest first.
    let mut blocks: Vec<_> = start
        .segments
        .iter()
        .flat_map(|s| s.blocks.iter().filter(|b| b.state.is_active()).map(move |b| (b, s.stream)))
        .map(|(b, stream)| (stacks.id(Some(&b.frames)), b, stream))
        .collect();
    blocks.sort_by_key(|(stack, b, _)| (*stack, std::cmp::Reverse(b.requested_size), b.address));
    for (stack, b, stream) in blocks {
        let mut e = TraceEntry::new(Action::Alloc, b.address, b.requested_size, stream);
        e.frames = (!b.frames.is_empty()).then(|| b.frames.clone());
        let at = p.entries.len();
        live.insert(b.address, at);
        p.push(e.clone(), stack, at, None);
        if b.state == BlockState::ActivePendingFree {
            p.push(TraceEntry { action: Action::FreeRequested, ..e }, stack, at, None);
        }
    }
    p.at_start = p.entries.len();

    let mut i = 0;
    while i < trace.len() {
        let e = trace.at(i);
        match e.action {
            Action::Alloc => {
                let stack = stacks.id(e.frames.as_ref());
                let at = p.entries.len();
                live.insert(e.addr, at);
                p.push(e.owned(), stack, at, Some(i));
            }
            Action::FreeRequested | Action::FreeCompleted => {
                let alloc = live.get(&e.addr).copied();
                let stack = alloc.map_or(0, |a| p.stacks[a]);
                if let Some(a) = alloc {
                    p.kept[a] = false;
                }
                if e.action == Action::FreeCompleted {
                    live.remove(&e.addr);
                }
                p.push(e.owned(), stack, alloc.unwrap_or(NO_ALLOC), Some(i));
            }
            Action::SegmentFree | Action::SegmentUnmap => {
                let end = trace.range(i..).position(|e| !matches!(e.action, Action::SegmentFree | Action::SegmentUnmap)).map_or(trace.len(), |n| i + n);
                if asked_for(e, trace.get(end)) {
                    // One entry stands for the burst: the replay empties the cache once.
                    p.push(TraceEntry { addr: 0, size: 0, ..e.owned() }, 0, NO_ALLOC, Some(i));
                }
                i = end;
                continue;
            }
            _ => {}
        }
        i += 1;
    }
    p
}

/// A burst of segment releases the program asked for (`torch.cuda.empty_cache()`), rather than
/// the allocator's flush before retrying a cudaMalloc that failed, which a segment_alloc follows.
fn asked_for(first: Entry<'_>, after: Option<Entry<'_>>) -> bool {
    let named = first.frames.iter().flat_map(|f| f.iter()).any(|f| f.name.contains("emptyCache") || f.name.contains("empty_cache"));
    named || !after.is_some_and(|e| matches!(e.action, Action::SegmentAlloc | Action::SegmentMap))
}
