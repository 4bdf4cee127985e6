//! The training loop in a trace: the phase of each allocation (forward, backward, optimizer
//! step), the passes (runs of one phase) and the iterations, for the findings that look at what
//! survives a step (`growth`, `retained-graph`, `missing-no-grad`, `grads-kept`,
//! `optimizer-state`).
//!
//! The phase comes from the frames as `compare::event_phase` reads PyTorch's (backward under
//! `torch/autograd` or on the autograd engine's thread, the optimizer under `torch/optim`, the
//! forward inside a module call); tensormem's own traces name the autograd node of a backward op
//! (`mm (MmBackward0)`), run the optimizer in `src/nn/optim`, and carry a category (parameters
//! and inputs are no pass; any other allocation with a stack is the forward's).
//!
//! An iteration starts with each forward pass that follows a backward pass or an optimizer step.
//! A trace with neither (inference, evaluation, a loop that never calls backward) is one
//! iteration, except in tensormem's traces: their stacks name the module scope, so within one
//! forward no stack repeats, and the earliest stack that does marks each iteration. (PyTorch's
//! Python stacks repeat across the layers of one forward: splitting there would find layers.)

use super::{AllocationRef, Patient, StackBytes};
use crate::scenarios::compare;
use crate::trace::{Category, Frame, TraceEntry};
use serde::Serialize;

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(super) enum Phase {
    Forward,
    Backward,
    Optimizer,
}

/// A run of allocations of one phase (allocations of no phase do not break it).
#[derive(Debug, Clone, Copy)]
pub(super) struct Pass {
    pub phase: Phase,
    /// Start position of its first allocation, and of its last.
    pub first: u32,
    pub last: u32,
}

pub(super) struct Steps {
    /// Allocation ids by start position (the trace's order).
    pub order: Vec<usize>,
    /// Per timeline allocation id.
    pub phase: Vec<Option<Phase>>,
    pub passes: Vec<Pass>,
    /// Positions where the iterations start (the first allocation of each one's forward).
    pub iterations: Vec<u32>,
    /// How the iterations were found, in words.
    pub how: &'static str,
    /// The trace is tensormem's own (its allocations carry categories).
    pub tensormem: bool,
    pub has_backward: bool,
    pub has_optimizer: bool,
}

impl Steps {
    /// The iteration an allocation starting at `start` belongs to: 0 before the first forward,
    /// k for the k-th iteration.
    pub fn iteration_of(&self, start: u32) -> usize {
        self.iterations.partition_point(|&b| b <= start)
    }

    /// The end of iteration `k` (1-based): where the next one starts, or the trace's end.
    pub fn iteration_end(&self, k: usize, events: usize) -> u32 {
        self.iterations.get(k).copied().unwrap_or(events as u32)
    }
}

/// Allocation ids by start position (the trace's order).
fn in_order(p: &Patient) -> Vec<usize> {
    let a = &p.timeline.allocations;
    let mut ids: Vec<usize> = (0..a.start.len()).collect();
    ids.sort_by_key(|&id| (a.start[id], id));
    ids
}

pub(super) fn find(p: &Patient) -> Steps {
    let trace = p.snapshot.trace_of(p.device);
    let a = &p.timeline.allocations;
    let tensormem = trace.iter().any(|e| e.category.is_some());
    let entry = |id: usize| (a.start[id] as usize).checked_sub(1).and_then(|i| trace.get(i));
    // The frames' phase is read once per distinct stack (a million entries may share one).
    let mut by_stack: Vec<Option<Option<Phase>>> = vec![None; p.timeline.stack_offsets.len()];
    let phase: Vec<Option<Phase>> = (0..a.start.len())
        .map(|id| {
            let e = entry(id)?;
            let frames = match by_stack.get_mut(a.stack[id] as usize) {
                Some(known) => *known.get_or_insert_with(|| frames_phase(e)),
                None => frames_phase(e),
            };
            frames.or_else(|| category_phase(e, tensormem))
        })
        .collect();

    let order = in_order(p);
    let mut passes: Vec<Pass> = Vec::new();
    for &id in &order {
        let Some(ph) = phase[id] else { continue };
        match passes.last_mut() {
            Some(pass) if pass.phase == ph => pass.last = a.start[id],
            _ => passes.push(Pass { phase: ph, first: a.start[id], last: a.start[id] }),
        }
    }
    let has_backward = passes.iter().any(|q| q.phase == Phase::Backward);
    let has_optimizer = passes.iter().any(|q| q.phase == Phase::Optimizer);
    let (iterations, how) = if has_backward || has_optimizer {
        let starts = passes
            .iter()
            .enumerate()
            .filter(|(i, q)| q.phase == Phase::Forward && (*i == 0 || passes[i - 1].phase != Phase::Forward))
            .map(|(_, q)| q.first)
            .collect();
        (starts, "a forward pass after each backward pass or optimizer step (from the frames)")
    } else if tensormem {
        (by_repetition(p, &order, &phase), "the repetition of the first stack that recurs in the forward")
    } else {
        (passes.iter().filter(|q| q.phase == Phase::Forward).take(1).map(|q| q.first).collect(), "one forward (no backward or optimizer step in the frames)")
    };
    Steps { order, phase, passes, iterations, how, tensormem, has_backward, has_optimizer }
}

/// The starts of the earliest forward stack that occurs more than once.
fn by_repetition(p: &Patient, order: &[usize], phase: &[Option<Phase>]) -> Vec<u32> {
    let a = &p.timeline.allocations;
    let forward: Vec<usize> = order.iter().copied().filter(|&id| phase[id] == Some(Phase::Forward) && a.stack[id] != u32::MAX).collect();
    let mut count: rustc_hash::FxHashMap<u32, usize> = Default::default();
    for &id in &forward {
        *count.entry(a.stack[id]).or_default() += 1;
    }
    match forward.iter().find(|&&id| count[&a.stack[id]] >= 2) {
        Some(&anchor) => forward.iter().filter(|&&id| a.stack[id] == a.stack[anchor]).map(|&id| a.start[id]).collect(),
        None => forward.first().map(|&id| vec![a.start[id]]).unwrap_or_default(),
    }
}

/// One allocation's phase in words (`forward`, `backward`, `optimizer step`), from its own
/// entry as the doctor reads it; `tensormem`: the trace is tensormem's own (its allocations carry categories).
pub fn entry_phase(e: &TraceEntry, tensormem: bool) -> Option<&'static str> {
    phase_of(e, tensormem).map(|p| match p {
        Phase::Forward => "forward",
        Phase::Backward => "backward",
        Phase::Optimizer => "optimizer step",
    })
}

/// One allocation's phase, from its own entry.
fn phase_of(e: &TraceEntry, tensormem: bool) -> Option<Phase> {
    frames_phase(e).or_else(|| category_phase(e, tensormem))
}

/// The phase an entry's frames name, if they name one.
fn frames_phase(e: &TraceEntry) -> Option<Phase> {
    match compare::event_phase(e) {
        Some("backward") => return Some(Phase::Backward),
        Some("optimizer step") => return Some(Phase::Optimizer),
        Some(_) => return Some(Phase::Forward),
        None => {}
    }
    let frames = || e.frames.iter().flat_map(|f| f.iter());
    if frames().any(is_backward_frame) {
        return Some(Phase::Backward);
    }
    if frames().any(|f| f.filename.contains("nn/optim/")) {
        return Some(Phase::Optimizer);
    }
    None
}

/// The phase of an entry whose frames name none: from tensormem's category.
fn category_phase(e: &TraceEntry, tensormem: bool) -> Option<Phase> {
    let frames = || e.frames.iter().flat_map(|f| f.iter());
    match e.category {
        Some(Category::Gradient) => Some(Phase::Backward),
        Some(Category::OptimizerState) => Some(Phase::Optimizer),
        Some(Category::Parameter | Category::Input) => None,
        Some(_) => Some(Phase::Forward),
        None if tensormem && frames().next().is_some() => Some(Phase::Forward),
        None => None,
    }
}

/// Whether allocation `id` is live at position `x`.
pub(super) fn live_at(p: &Patient, id: usize, x: u32) -> bool {
    let a = &p.timeline.allocations;
    a.start[id] <= x && x < a.end[id]
}

/// Bytes requested by allocation `id`.
pub(super) fn bytes(p: &Patient, id: usize) -> u64 {
    p.timeline.allocations.size[id] as u64
}

/// The trace index of allocation `id`'s alloc entry (None: it predates the trace).
pub(super) fn trace_index(p: &Patient, id: usize) -> Option<usize> {
    (p.timeline.allocations.start[id] as usize).checked_sub(1)
}

/// The largest of `ids`, by trace index and address.
pub(super) fn largest(p: &Patient, ids: &[usize], count: usize) -> Vec<AllocationRef> {
    let a = &p.timeline.allocations;
    let mut ids = ids.to_vec();
    ids.sort_by(|&x, &y| bytes(p, y).cmp(&bytes(p, x)).then(x.cmp(&y)));
    ids.into_iter()
        .take(count)
        .map(|id| AllocationRef {
            trace_index: trace_index(p, id),
            address: a.addr[id] as u64,
            bytes: bytes(p, id),
            group: p.timeline.groups[a.group[id] as usize].name.clone(),
        })
        .collect()
}

/// The stacks holding the most of `ids`' bytes.
pub(super) fn top_stacks(p: &Patient, ids: &[usize], count: usize) -> Vec<StackBytes> {
    let a = &p.timeline.allocations;
    let mut by_stack: rustc_hash::FxHashMap<u32, (u64, usize)> = Default::default();
    for &id in ids {
        let s = by_stack.entry(a.stack[id]).or_default();
        s.0 += bytes(p, id);
        s.1 += 1;
    }
    let mut stacks: Vec<(u32, u64, usize)> = by_stack.into_iter().filter(|(s, _)| *s != u32::MAX).map(|(s, (b, n))| (s, b, n)).collect();
    stacks.sort_by(|x, y| y.1.cmp(&x.1).then(x.0.cmp(&y.0)));
    stacks
        .into_iter()
        .take(count)
        .map(|(stack, bytes, allocations)| StackBytes { bytes, allocations, frames: super::live::stack_frames(&p.timeline, stack) })
        .collect()
}

/// A library's own buffer, not a tensor: cuBLAS's workspace (`at::cuda::getNewWorkspace`, one
/// per handle: the autograd thread's first matmul makes one, inside backward, that lives on).
pub(super) fn is_library_buffer(p: &Patient, id: usize) -> bool {
    let trace = p.snapshot.trace_of(p.device);
    trace_index(p, id).and_then(|i| trace.get(i)).is_some_and(|e| e.frames.iter().flat_map(|f| f.iter()).take(12).any(is_cublas_workspace))
}

/// A key/value cache's own tensor: transformers' `cache_utils.py` (DynamicCache's cat, the
/// static cache's zeros) or tensormem's scopes named after its methods. It is meant to outlive
/// the forward that made it, so it is state, not a retained graph.
pub(super) fn is_kv_cache(p: &Patient, id: usize) -> bool {
    let trace = p.snapshot.trace_of(p.device);
    let cache_frame = |f: &Frame| f.filename.ends_with("transformers/cache_utils.py") || crate::nn::KV_CACHE_SCOPES.iter().any(|s| f.name.ends_with(s));
    trace_index(p, id).and_then(|i| trace.get(i)).is_some_and(|e| e.frames.iter().flat_map(|f| f.iter()).take(12).any(cache_frame))
}

/// A frame of the call that makes cuBLAS's (or cuBLASLt's) workspace; it is near the top of the
/// stack, so callers look at the first dozen frames.
pub(super) fn is_cublas_workspace(f: &Frame) -> bool {
    f.name.contains("getNewWorkspace") || f.name.contains("BlasLtWorkspace")
}

/// A frame that runs in backward: PyTorch's `loss.backward()` or its autograd engine's C++
/// thread, or tensormem's autograd engine and its nodes (`mm (MmBackward0)`).
pub(super) fn is_backward_frame(f: &Frame) -> bool {
    f.filename.ends_with("torch/autograd/__init__.py")
        || f.name.contains("torch::autograd::Engine::")
        || f.name.contains("torch::autograd::generated::")
        || (f.name.contains("Backward") && f.name.ends_with(')'))
        || f.filename.ends_with("autograd/engine.rs")
}

/// The iterations, as every training-loop finding's evidence gives them (flattened into it).
#[derive(Serialize)]
pub(super) struct IterationsEvidence {
    pub device: i64,
    pub iterations: usize,
    /// Positions where the iterations start.
    pub iteration_starts: Vec<u32>,
    pub iterations_found_by: &'static str,
}

impl Steps {
    pub fn evidence(&self, p: &Patient) -> IterationsEvidence {
        IterationsEvidence { device: p.device, iterations: self.iterations.len(), iteration_starts: self.iterations.clone(), iterations_found_by: self.how }
    }

    /// For each iteration k from the second, the `candidates` live where it starts (position
    /// b) that `keep(k, b, id)` accepts: their bytes per iteration, and the iteration with the
    /// most (bytes, k, ids). Each candidate visits only the starts its lifetime spans.
    pub fn worst_iteration(&self, p: &Patient, candidates: &[usize], mut keep: impl FnMut(usize, u32, usize) -> bool) -> (Vec<u64>, (u64, usize, Vec<usize>)) {
        let a = &p.timeline.allocations;
        let n = self.iterations.len();
        let mut kept: Vec<Vec<usize>> = vec![Vec::new(); n + 1];
        for &id in candidates {
            let mut i = self.iterations.partition_point(|&b| b < a.start[id]).max(1);
            while i < n && self.iterations[i] < a.end[id] {
                if keep(i + 1, self.iterations[i], id) {
                    kept[i + 1].push(id);
                }
                i += 1;
            }
        }
        let mut per_iteration = Vec::new();
        let mut worst = (0, 0, Vec::new());
        for (k, ids) in kept.into_iter().enumerate().skip(2) {
            let total: u64 = ids.iter().map(|&id| bytes(p, id)).sum();
            per_iteration.push(total);
            if total > worst.0 {
                worst = (total, k, ids);
            }
        }
        (per_iteration, worst)
    }
}

/// Whether `bytes` are worth a finding: at least `share` of the peak and `min` bytes.
pub(super) fn material(p: &Patient, bytes: u64, share: f64, min: u64) -> bool {
    bytes >= min && bytes as f64 >= share * p.timeline.summary.peak_allocated_bytes as f64
}
