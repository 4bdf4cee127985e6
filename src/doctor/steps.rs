//! The training loop in a trace: the phase of each allocation (forward, backward, optimizer
//! step), the passes (runs of one phase) and the iterations, for the findings that look at what
//! survives a step (`growth`, `retained-graph`, `missing-no-grad`, `grads-kept`,
//! `optimizer-state`).
//!
//! The phase comes from the frames as `pytorch::event_phase` reads PyTorch's (backward under
//! `torch/autograd` or on the autograd engine's thread, the optimizer under `torch/optim`, the
//! forward inside a module call); tensormem's own traces name the autograd node of a backward op
//! (`mm (MmBackward0)`), run the optimizer in `src/nn/optim`, and carry a category (parameters
//! and inputs are no pass; any other allocation inside a module's scope is the forward's, as
//! inside a module call in PyTorch).
//!
//! An iteration starts with each forward pass that follows a backward pass or an optimizer step.
//! A trace with neither (inference, evaluation, a loop that never calls backward) is one
//! iteration, except in tensormem's traces: their stacks name the module scope, so the earliest
//! stack that recurs only after a whole forward marks each iteration. (PyTorch's
//! Python stacks repeat across the layers of one forward: splitting there would find layers.)

use super::{AllocationRef, Material, Patient, StackBytes};
use crate::trace::{Category, Entry, Frame};
use serde::{Deserialize, Serialize};
use std::borrow::Cow;

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
    /// Per allocation: made once by a forward and kept to the end (see [`made_once`]).
    pub made_once: Vec<bool>,
    /// Their bytes live at the peak of allocated memory.
    pub made_once_bytes: u64,
}

impl Steps {
    /// The iteration an allocation starting at `start` belongs to: 0 before the first forward,
    /// k for the k-th iteration.
    pub fn iteration_of(&self, start: u32) -> usize {
        self.iterations.partition_point(|&b| b <= start)
    }

    /// Whether allocation `id` is the forward's: made in a module call, or (in a training loop)
    /// by the code between a forward's first module call and its backward (`torch.tanh(layer(x))`,
    /// the loss), which a Python stack shows outside any module. What runs after backward (the
    /// next batch, a hand-written update) is not.
    pub fn forward_made(&self, p: &Patient, id: usize) -> bool {
        match self.phase[id] {
            Some(Phase::Forward) => true,
            Some(_) => false,
            None => {
                let start = p.timeline.allocations.start[id];
                // tensormem's traces name every forward allocation's phase (no phase: a
                // parameter or an input).
                !self.tensormem
                    && self.has_backward
                    && self.iteration_of(start) >= 1
                    && p.timeline.allocations.stack[id] != u32::MAX
                    && self.passes[..self.passes.partition_point(|q| q.first <= start)].last().is_some_and(|q| q.phase == Phase::Forward)
            }
        }
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
    // A PyTorch trace with stacks: an allocation without frames there was made by a thread
    // without Python (the autograd engine's, with `stacks="python"`).
    let framed = !tensormem && trace.iter().any(has_frames);
    let entry = |id: usize| (a.start[id] as usize).checked_sub(1).and_then(|i| trace.get(i));
    let order = in_order(p);
    let optimizer_steps = optimizer_annotations(p);
    // The ranges are in trace order and do not overlap: the last one starting at or before x.
    let in_optimizer_step = |x: u32| optimizer_steps[..optimizer_steps.partition_point(|&(from, _)| from <= x)].last().is_some_and(|&(_, to)| x <= to);
    // The frames' phase is read once per distinct stack (a million entries may share one).
    let mut by_stack: Vec<Option<Option<Phase>>> = vec![None; p.timeline.stack_offsets.len()];
    let mut phase: Vec<Option<Phase>> = vec![None; a.start.len()];
    let mut last_framed = None;
    for &id in &order {
        let Some(e) = entry(id) else { continue };
        let ph = if framed && !has_frames(e) {
            // The main thread waits in backward() while the engine's thread allocates.
            last_framed.filter(|&ph| ph == Phase::Backward)
        } else {
            let frames = match by_stack.get_mut(a.stack[id] as usize) {
                Some(known) => *known.get_or_insert_with(|| frames_phase(e)),
                None => frames_phase(e),
            };
            let ph = match frames.or_else(|| category_phase(e, tensormem)) {
                // Python a hook runs on the autograd thread during backward (DDP's reducer, a
                // tensor hook) is the backward's, as the engine's frameless allocations are.
                None if framed && last_framed == Some(Phase::Backward) && crate::pytorch::off_the_main_thread(e.frames.as_deref().unwrap_or_default()) => {
                    Some(Phase::Backward)
                }
                ph => ph,
            };
            last_framed = ph;
            ph
        };
        phase[id] = if in_optimizer_step(a.start[id]) { Some(Phase::Optimizer) } else { ph };
    }

    // Passes: runs of one phase, with each annotated optimizer step (which may allocate nothing).
    let marks: Vec<(u32, Phase)> = order.iter().filter_map(|&id| Some((a.start[id], phase[id]?))).collect();
    // A step's mark goes before an allocation at the same position (the step began before it).
    let mut marks: Vec<(u32, bool, Phase)> = marks.into_iter().map(|(x, ph)| (x, true, ph)).collect();
    marks.extend(optimizer_steps.iter().map(|&(from, _)| (from, false, Phase::Optimizer)));
    marks.sort_by_key(|&(x, allocation, _)| (x, allocation));
    let mut passes: Vec<Pass> = Vec::new();
    for (x, _, ph) in marks {
        match passes.last_mut() {
            Some(pass) if pass.phase == ph => pass.last = x,
            _ => passes.push(Pass { phase: ph, first: x, last: x }),
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
        (by_calls(p, &order, &phase), "each call of the first module the program calls (from the frames)")
    };
    let made_once = made_once(p, &phase, &iterations);
    // What of them the peak holds (one made after the peak is no part of it).
    let peak_x = p.timeline.summary.peak_x;
    let made_once_bytes = (0..made_once.len()).filter(|&id| made_once[id] && live_at(p, id, peak_x)).map(|id| bytes(p, id)).sum();
    Steps { order, phase, passes, iterations, how, tensormem, has_backward, has_optimizer, made_once, made_once_bytes }
}

fn has_frames(e: Entry<'_>) -> bool {
    e.frames.as_ref().is_some_and(|f| !f.is_empty())
}

/// The optimizer steps PyTorch annotated (`Optimizer.step#AdamW.step`, a record_function range
/// every torch.optim optimizer opens), as position ranges: from the first entry at or after the
/// start to the last one at or before the end. A step of plain SGD allocates nothing: this is
/// where the trace shows it.
fn optimizer_annotations(p: &Patient) -> Vec<(u32, u32)> {
    let trace = p.snapshot.trace_of(p.device);
    if trace.iter().any(|e| e.time_us.is_none()) {
        return Vec::new();
    }
    let position = |t: i64, inclusive: bool| trace.partition_point(|e| e.time_us.is_some_and(|x| if inclusive { x <= t } else { x < t })) as u32;
    let mut ranges = Vec::new();
    // Nested steps (an optimizer wrapping another) count as the outermost; one left open (an
    // out-of-memory inside the step) runs to the trace's end.
    let (mut open, mut depth) = (None, 0usize);
    for note in p.snapshot.external_annotations.iter().flatten().filter(|n| n.device == p.device && n.name.starts_with("Optimizer.step")) {
        match (note.stage.as_str(), note.time_us) {
            ("START", Some(t)) => {
                if depth == 0 {
                    open = Some(position(t, false) + 1);
                }
                depth += 1;
            }
            ("END", Some(t)) if depth > 0 => {
                depth -= 1;
                if depth == 0
                    && let Some(from) = open.take()
                {
                    // A step that allocates nothing is an empty range (to < from) at `from`.
                    ranges.push((from, position(t, true)));
                }
            }
            _ => {}
        }
    }
    if let Some(from) = open {
        ranges.push((from, trace.len() as u32));
    }
    ranges.sort_unstable();
    ranges
}

/// Allocations a forward or a backward makes once and keeps to the end of the trace, whose like
/// (same stack, same size) nothing else keeps though the same stack allocates again in a later
/// iteration: a library's workspace (cuBLAS makes one at each
/// thread's first matmul, the autograd thread's in the first backward) or a buffer built lazily,
/// not a graph. A backward's must also have no parameter's size (a gradient has its
/// parameter's): with Python-only stacks every allocation of the engine's thread shares one
/// empty stack.
fn made_once(p: &Patient, phase: &[Option<Phase>], iterations: &[u32]) -> Vec<bool> {
    let a = &p.timeline.allocations;
    let kept = |id: usize| matches!(phase[id], Some(Phase::Forward | Phase::Backward)) && a.end[id] as usize > p.timeline.events;
    let mut alike: rustc_hash::FxHashMap<(u32, u64), usize> = Default::default();
    for id in (0..a.start.len()).filter(|&id| kept(id)) {
        *alike.entry((a.stack[id], bytes(p, id))).or_default() += 1;
    }
    // The last iteration each stack allocates in: a buffer is made once when its op runs again
    // later without keeping another.
    let iteration = |id: usize| iterations.partition_point(|&b| b <= a.start[id]);
    let mut last_use: rustc_hash::FxHashMap<u32, usize> = Default::default();
    for id in 0..a.start.len() {
        let k = last_use.entry(a.stack[id]).or_default();
        *k = (*k).max(iteration(id));
    }
    let parameters = parameter_sizes(p, iterations);
    (0..a.start.len())
        .map(|id| {
            let unique = || {
                alike[&(a.stack[id], bytes(p, id))] == 1
                    && last_use[&a.stack[id]] > iteration(id)
                    && (phase[id] == Some(Phase::Forward) || !parameters.contains_key(&bytes(p, id)))
            };
            kept(id) && (is_library_buffer(p, id) || unique())
        })
        .collect()
}

/// How many parameters of each size the trace shows: allocations made before the first
/// iteration and still live when the last one starts.
pub(super) fn parameter_sizes(p: &Patient, iterations: &[u32]) -> rustc_hash::FxHashMap<u64, usize> {
    let a = &p.timeline.allocations;
    let (first, last) = (iterations.first().copied().unwrap_or(0), iterations.last().copied().unwrap_or(0));
    let mut sizes: rustc_hash::FxHashMap<u64, usize> = Default::default();
    for id in (0..a.start.len()).filter(|&id| a.start[id] < first && a.end[id] > last) {
        *sizes.entry(bytes(p, id)).or_default() += 1;
    }
    sizes
}

/// The starts of the earliest forward stack that recurs only after a whole forward: between two
/// of its allocations at least half of the forward's distinct stacks occur. (A stack may recur
/// within one forward, as two multiplications in one norm do; the first op of a forward recurs
/// only in the next one.) One iteration when no stack does.
fn by_repetition(p: &Patient, order: &[usize], phase: &[Option<Phase>]) -> Vec<u32> {
    let a = &p.timeline.allocations;
    let forward: Vec<usize> = order.iter().copied().filter(|&id| phase[id] == Some(Phase::Forward) && a.stack[id] != u32::MAX).collect();
    let mut at: rustc_hash::FxHashMap<u32, Vec<usize>> = Default::default();
    for (i, &id) in forward.iter().enumerate() {
        at.entry(a.stack[id]).or_default().push(i);
    }
    let distinct = at.len();
    let whole_forward_between = |positions: &[usize]| {
        positions.windows(2).all(|w| {
            let between: rustc_hash::FxHashSet<u32> = forward[w[0]..w[1]].iter().map(|&id| a.stack[id]).collect();
            2 * between.len() >= distinct
        })
    };
    // The candidates in the order they first occur; a few suffice (the first op of the forward
    // is among the first), and each is checked in one pass over the forward.
    let mut seen: rustc_hash::FxHashSet<u32> = Default::default();
    let anchor = forward
        .iter()
        .map(|&id| a.stack[id])
        .filter(|&stack| seen.insert(stack) && at[&stack].len() >= 2)
        .take(16)
        .find(|stack| whole_forward_between(&at[stack]));
    match anchor {
        Some(stack) => at[&stack].iter().map(|&i| a.start[forward[i]]).collect(),
        None => forward.first().map(|&id| vec![a.start[id]]).unwrap_or_default(),
    }
}

/// Where a module call is made from, read off a Python stack: the code that calls the outermost
/// module (`out = model(x)` in the loop), that module's `forward`, and the line it is at.
#[derive(Clone, PartialEq, Eq)]
struct CallSite {
    caller: u64,
    forward: u64,
    line: i64,
}

fn call_site(frames: &[Frame]) -> Option<CallSite> {
    use std::hash::{Hash, Hasher};
    let python: Vec<&Frame> = frames.iter().filter(|f| f.filename.ends_with(".py")).collect();
    let outermost = python.iter().rposition(|f| crate::pytorch::in_module_file(f) && f.name.ends_with("call_impl"))?;
    let forward = python[..outermost].iter().rposition(|f| !crate::pytorch::in_module_file(f))?;
    let mut caller = rustc_hash::FxHasher::default();
    for f in &python[outermost + 1..] {
        (&f.filename, &f.name, f.line).hash(&mut caller);
    }
    let mut module = rustc_hash::FxHasher::default();
    (&python[forward].filename, &python[forward].name).hash(&mut module);
    Some(CallSite { caller: caller.finish(), forward: module.finish(), line: python[forward].line as i64 })
}

/// The iterations of a PyTorch trace without backward (evaluation, inference): each call of the
/// module the program calls first, from the same place. A call starts where a forward
/// allocation follows anything else, or moves to another module or caller, or goes back to an
/// earlier line of the outermost forward; the calls from elsewhere (a loss module) belong to the
/// iteration before them. Allocations before the first call are setup.
fn by_calls(p: &Patient, order: &[usize], phase: &[Option<Phase>]) -> Vec<u32> {
    let a = &p.timeline.allocations;
    let trace = p.snapshot.trace_of(p.device);
    let mut sites: rustc_hash::FxHashMap<u32, Option<CallSite>> = Default::default();
    let mut anchor: Option<(u64, u64)> = None;
    let mut previous: Option<CallSite> = None;
    let mut starts = Vec::new();
    for &id in order {
        if phase[id] != Some(Phase::Forward) {
            previous = None;
            continue;
        }
        let Some(e) = trace_index(p, id).and_then(|i| trace.get(i)) else { continue };
        let site = sites.entry(a.stack[id]).or_insert_with(|| call_site(e.frames.as_deref().unwrap_or_default())).clone();
        let Some(site) = site else { continue };
        let new_call = previous.as_ref().is_none_or(|q| q.caller != site.caller || q.forward != site.forward || site.line < q.line);
        if new_call && *anchor.get_or_insert((site.caller, site.forward)) == (site.caller, site.forward) {
            starts.push(a.start[id]);
        }
        previous = Some(site);
    }
    starts
}

/// One allocation's phase in words (`forward`, `backward`, `optimizer step`), from its own
/// entry as the doctor reads it; `tensormem`: the trace is tensormem's own (its allocations carry categories).
pub fn entry_phase(e: Entry<'_>, tensormem: bool) -> Option<&'static str> {
    phase_of(e, tensormem).map(|p| match p {
        Phase::Forward => "forward",
        Phase::Backward => "backward",
        Phase::Optimizer => "optimizer step",
    })
}

/// One allocation's phase, from its own entry.
fn phase_of(e: Entry<'_>, tensormem: bool) -> Option<Phase> {
    frames_phase(e).or_else(|| category_phase(e, tensormem))
}

/// The phase an entry's frames name, if they name one.
fn frames_phase(e: Entry<'_>) -> Option<Phase> {
    match crate::pytorch::event_phase(e) {
        Some("backward") => return Some(Phase::Backward),
        Some("optimizer step") => return Some(Phase::Optimizer),
        Some(_) => return Some(Phase::Forward),
        None => {}
    }
    let frames = || e.frames.iter().flat_map(|f| f.iter());
    if frames().any(crate::pytorch::is_backward_frame) {
        return Some(Phase::Backward);
    }
    if frames().any(|f| f.filename.contains("nn/optim/")) {
        return Some(Phase::Optimizer);
    }
    None
}

/// The phase of an entry whose frames name none: from tensormem's category.
fn category_phase(e: Entry<'_>, tensormem: bool) -> Option<Phase> {
    let frames = || e.frames.iter().flat_map(|f| f.iter());
    match e.category {
        Some(Category::Gradient) => Some(Phase::Backward),
        Some(Category::OptimizerState) => Some(Phase::Optimizer),
        Some(Category::Parameter | Category::Input) => None,
        Some(_) => Some(Phase::Forward),
        // Inside a module's scope (a frame with a name and no file): the forward, as PyTorch's
        // allocations inside a module call are. What the program does outside any module (its
        // inputs, a scratch buffer, a hand-written update) is no pass.
        None if tensormem => frames().any(|f| f.filename.is_empty() && !f.name.is_empty()).then_some(Phase::Forward),
        None => None,
    }
}

/// Whether what one forward (`made`, in trace order) still holds at position `x` is a graph: at
/// least a quarter of what it made before its last quarter (and a few tensors). Across the
/// layers that is what autograd saves for backward. Under no_grad each intermediate dies once
/// the next op has read it, so at the forward's end nothing of its earlier layers is left but
/// what the program keeps on purpose (a hook's list, hidden states, a cache: a tensor or two a
/// layer); after its backward a graph's saved tensors are freed too. What is left then is a
/// result the program holds (the last logits until `logits` is rebound), made at the end.
pub(super) fn graph_kept_at(p: &Patient, made: &[usize], x: u32) -> bool {
    let early = &made[..made.len() * 3 / 4];
    let survivors = early.iter().filter(|&&id| live_at(p, id, x)).count();
    survivors >= GRAPH_MIN_SURVIVORS && survivors * 4 >= early.len()
}

/// Whether nothing was allocated between two frees at positions `x` and `y` (either order): a
/// graph torn down frees its tensors one after another.
pub(super) fn nothing_allocated_between(p: &Patient, s: &Steps, x: u32, y: u32) -> bool {
    let a = &p.timeline.allocations;
    let (lo, hi) = (x.min(y), x.max(y));
    let next = s.order.partition_point(|&id| a.start[id] <= lo);
    s.order.get(next).is_none_or(|&id| a.start[id] > hi)
}

/// Fewer earlier-layer tensors alive at a forward's end than this prove no graph.
pub(super) const GRAPH_MIN_SURVIVORS: usize = 3;

/// The trace index of the first allocation after position `x` that `keep` accepts.
pub(super) fn allocation_after(p: &Patient, s: &Steps, x: u32, keep: impl Fn(usize) -> bool) -> Option<usize> {
    let a = &p.timeline.allocations;
    let from = s.order.partition_point(|&id| a.start[id] <= x);
    s.order[from..].iter().copied().find(|&id| keep(id)).and_then(|id| trace_index(p, id))
}

/// The trace index of the last allocation before position `x`.
pub(super) fn allocation_before(p: &Patient, s: &Steps, x: u32) -> Option<usize> {
    let a = &p.timeline.allocations;
    s.order[..s.order.partition_point(|&id| a.start[id] < x)].last().and_then(|&id| trace_index(p, id))
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
    trace_index(p, id).and_then(|i| trace.get(i)).is_some_and(|e| e.frames.iter().flat_map(|f| f.iter()).take(12).any(crate::pytorch::is_cublas_workspace))
}

/// A key/value cache's own tensor: transformers' `cache_utils.py` (DynamicCache's cat, the
/// static cache's zeros) or tensormem's scopes named after its methods. It is meant to outlive
/// the forward that made it, so it is state, not a retained graph.
pub(super) fn is_kv_cache(p: &Patient, id: usize) -> bool {
    let trace = p.snapshot.trace_of(p.device);
    trace_index(p, id).and_then(|i| trace.get(i)).is_some_and(|e| e.frames.iter().flat_map(|f| f.iter()).take(12).any(crate::pytorch::is_kv_cache_frame))
}

/// The iterations, as every training-loop finding's evidence gives them (flattened into it).
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct IterationsEvidence {
    pub device: i64,
    pub iterations: usize,
    /// Positions where the iterations start.
    pub iteration_starts: Vec<u32>,
    pub iterations_found_by: Cow<'static, str>,
}

impl Steps {
    pub fn evidence(&self, p: &Patient) -> IterationsEvidence {
        IterationsEvidence {
            device: p.device,
            iterations: self.iterations.len(),
            iteration_starts: self.iterations.clone(),
            iterations_found_by: self.how.into(),
        }
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

impl Steps {
    /// Whether `bytes` pass a kind's threshold against the peak the program's own memory
    /// reaches (the peak less the buffers made once, a library's workspaces: 65 MiB of cuBLAS's
    /// on an H100 are not the program's to save).
    pub fn material(&self, p: &Patient, bytes: u64, threshold: Material) -> bool {
        threshold.holds(bytes, p.timeline.summary.peak_allocated_bytes.saturating_sub(self.made_once_bytes))
    }
}
