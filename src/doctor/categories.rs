//! Categories for traces that carry none (PyTorch's own snapshots), in torch.profiler's names,
//! inferred for every allocation from its stack, its phase and its lifetime, with how sure.
//!
//! The phase comes from the frames alone, never from a recorded category: backward (the autograd
//! engine, `loss.backward()`, tensormem's `op (NodeBackward0)`), the optimizer step
//! (`torch/optim`, tensormem's `src/nn/optim`) or the forward (a module call; any other stack of
//! tensormem's). The passes are the runs of one phase, in the trace's order; an allocation lives
//! to the end when it is never freed or freed in the program's teardown (after its last
//! allocation, from the first free of something made before the last pass). Then, in order:
//!
//! - optimizer step: alive past its step → `optimizer_state`, else `temporary`;
//! - backward: alive past its backward pass → `gradient`; freed before anything else was
//!   allocated → `temporary`; else `autograd_detail` (gradients of intermediates, recomputation);
//! - made by a data loader, a host-to-device copy outside a module, tensormem's `from_slice`
//!   outside a module or in an `input` scope → `input`;
//! - made by module construction (`Module._apply`, `torch/nn/init`, `reset_parameters`,
//!   tensormem's parameter initialisers) → `parameter`; made before the first pass and before
//!   anything was freed, alive to the end → `parameter`;
//! - otherwise: freed during the next backward pass → `activation`; freed before it (or no
//!   backward follows) → `temporary`;
//! - allocated before the trace without a stack and alive to the end, where the trace makes the
//!   gradients and the optimizer state (or has no step at all, but some event) → `parameter`, low;
//! - anything else (alive past its backward, allocated before the trace without a stack, cuBLAS's
//!   workspace) → `unknown`.

use crate::timeline::kept::InferredCategories;
use crate::timeline::{Group, GroupKind, Grouping, Timeline};
use crate::trace::{Category, Frame, Snapshot};
use serde::{Deserialize, Serialize, Serializer};
use std::borrow::Cow;

/// How sure an inferred category is.
#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord, Hash, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum Confidence {
    Low,
    Medium,
    High,
}

impl Confidence {
    pub fn name(self) -> &'static str {
        match self {
            Confidence::Low => "low",
            Confidence::Medium => "medium",
            Confidence::High => "high",
        }
    }
}

/// One allocation's inferred category (None: `unknown`), how sure, and the rule that gave it.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize)]
pub struct Inferred {
    #[serde(serialize_with = "category_name")]
    pub category: Option<Category>,
    pub confidence: Confidence,
    pub reason: &'static str,
}

fn category_name<S: Serializer>(c: &Option<Category>, s: S) -> Result<S::Ok, S::Error> {
    s.serialize_str(c.map_or(UNKNOWN, Category::name))
}

/// torch.profiler's name for memory of no known category.
pub const UNKNOWN: &str = "unknown";

impl Inferred {
    /// The snapshot key (`optimizer_state`), or `unknown`.
    pub fn name(&self) -> &'static str {
        self.category.map_or(UNKNOWN, Category::name)
    }
}

impl Inferred {
    /// Where its category stands in [`CATEGORIES`].
    pub fn index(&self) -> usize {
        self.category.map_or(Category::ALL.len(), |c| c as usize)
    }
}

/// Every category an allocation can be inferred to be: torch.profiler's, then `unknown`.
pub const CATEGORIES: [&str; Category::ALL.len() + 1] = {
    let mut names = [UNKNOWN; Category::ALL.len() + 1];
    let mut k = 0;
    while k < Category::ALL.len() {
        names[k] = Category::ALL[k].name();
        k += 1;
    }
    names
};

/// A timeline's bands grouped by inferred category, for [`Timeline::set_grouping`]: `categories`
/// holds each allocation's (by id) as its index in [`CATEGORIES`] ([`Inferred::index`]); a group
/// per category found, in that order.
pub fn grouping(categories: &[u8]) -> Grouping {
    let mut used = [false; CATEGORIES.len()];
    for &k in categories {
        used[k as usize] = true;
    }
    let mut slot = [u32::MAX; CATEGORIES.len()];
    let mut groups = Vec::new();
    for k in (0..CATEGORIES.len()).filter(|&k| used[k]) {
        slot[k] = groups.len() as u32;
        groups.push(match Category::ALL.get(k) {
            Some(&c) => Group::new(&c.label(), GroupKind::Category(c)),
            None => Group::new(UNKNOWN, GroupKind::Unknown),
        });
    }
    Grouping { groups, group: categories.iter().map(|&k| slot[k as usize]).collect() }
}

/// One allocation of a device's timeline, with its inferred category.
#[derive(Debug, Clone, PartialEq, Serialize)]
pub struct InferredAllocation {
    /// Index of its `alloc` entry in the device's trace; None when it predates the trace.
    pub trace_index: Option<usize>,
    pub address: u64,
    pub bytes: u64,
    #[serde(flatten)]
    pub inferred: Inferred,
}

/// Every allocation of one device (those live when the trace starts, then the trace's allocs in
/// order), with its inferred category. The trace's own categories are not read.
pub fn infer_categories(snapshot: &Snapshot, device: i64) -> Result<Vec<InferredAllocation>, crate::replay::ReplayError> {
    let t = crate::timeline::build_without_bands(snapshot, device)?;
    let a = &t.allocations;
    Ok(infer(&t)
        .into_iter()
        .enumerate()
        .map(|(id, inferred)| InferredAllocation {
            trace_index: (a.start[id] as usize).checked_sub(1),
            address: a.addr[id] as u64,
            bytes: a.size[id] as u64,
            inferred,
        })
        .collect())
}

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Phase {
    Forward,
    Backward,
    Optimizer,
}

/// What a stack says, read once per stack.
#[derive(Debug, Clone, Copy, Default)]
struct StackInfo {
    phase: Option<Phase>,
    /// Module construction or a parameter initialiser.
    parameter: bool,
    /// A data loader, a host-to-device copy outside a module, tensormem's inputs.
    input: bool,
    /// A factory outside any module (tensormem's).
    factory: bool,
    /// A library's own buffer (cuBLAS's workspace).
    workspace: bool,
    /// PyTorch's `AccumulateGrad`.
    accumulate: bool,
    /// Inside a constructor (`__init__`): a module built, its parameters made.
    constructor: bool,
    /// A key/value cache's own tensor (transformers' cache, vLLM's cache engine).
    kv_cache: bool,
}

fn read_stack(frames: &[&Frame]) -> StackInfo {
    let py = |f: &&&Frame| f.filename.ends_with(".py");
    let py_under = |file: &str| frames.iter().filter(py).any(|f| f.filename.contains(file));
    let named = |part: &str| frames.iter().any(|f| f.name.contains(part));
    // tensormem's stacks: the op at its Rust call site, then the module scope.
    let rust = frames.first().is_some_and(|f| f.filename.ends_with(".rs"));
    let workspace = frames.iter().take(12).any(|f| crate::pytorch::is_cublas_workspace(f));
    let accumulate = named("AccumulateGrad");
    let backward = frames.iter().any(|f| crate::pytorch::is_backward_frame(f));
    let optimizer = py_under("torch/optim/") || frames.iter().any(|f| f.filename.contains("nn/optim/"));
    let module_call = frames.iter().filter(py).any(|f| crate::pytorch::in_module_file(f) && f.name.contains("call_impl"));
    let parameter = frames.iter().filter(py).any(|f| {
        (crate::pytorch::in_module_file(f) && f.name == "_apply")
            || f.filename.ends_with("torch/nn/init.py")
            || f.name == "reset_parameters"
            || f.name == "load_state_dict"
            || f.name == "from_pretrained"
    }) || (rust
        && frames.first().is_some_and(|f| f.filename.contains("src/nn/") && matches!(f.name.as_str(), "randn" | "rand" | "ones" | "zeros")));
    let phase = if backward {
        Some(Phase::Backward)
    } else if optimizer {
        Some(Phase::Optimizer)
    } else if module_call || rust {
        Some(Phase::Forward)
    } else {
        None
    };
    let host_copy = named("_to_copy") || named("copy_") || named("pin_memory") || named("THPVariable_to");
    let input = phase.is_none() && !parameter && (py_under("torch/utils/data/") || host_copy)
        || (rust && ((frames.len() == 1 && frames[0].name == "from_slice") || frames.get(1).is_some_and(|f| f.filename.is_empty() && f.name == "input")));
    // tensormem's factories outside any module scope (no scope frame): a parameter if it lives
    // from the start to the end, else an input.
    let factory =
        rust && frames.len() == 1 && frames.first().is_some_and(|f| matches!(f.name.as_str(), "randn" | "rand" | "full" | "zeros" | "ones" | "arange"));
    let constructor = frames.iter().filter(py).any(|f| f.name == "__init__");
    let kv_cache = frames.iter().any(|f| crate::pytorch::is_kv_cache_frame(f));
    StackInfo { phase, parameter, input, factory, workspace, accumulate, constructor, kv_cache }
}

/// The reason given to a block of an end-state file made inside a module's forward: the
/// `kept-activations` finding counts these.
pub(super) const END_STATE_ACTIVATION: &str = "made inside a module's forward before the trace, alive at the end (a kept activation or forward output)";

/// A run of allocations of one phase.
#[derive(Debug, Clone, Copy)]
struct Pass {
    phase: Phase,
    first: u32,
}

/// Where the first backward pass after a position is, among the backward passes: found by moving
/// forward, since allocations are looked at in the order they start (ids follow their starts; a
/// binary search per allocation was most of inferring 3.8 M of them), else by a search.
struct Cursor(usize);

impl Cursor {
    fn after(&mut self, start: u32, backward_passes: &[usize], passes: &[Pass]) -> usize {
        let first = |i: usize| passes[backward_passes[i]].first;
        if self.0 > 0 && first(self.0 - 1) > start {
            return backward_passes.partition_point(|&k| passes[k].first <= start);
        }
        while self.0 < backward_passes.len() && first(self.0) <= start {
            self.0 += 1;
        }
        self.0
    }
}

/// [`infer`] as the page colours by it (and keeps it: `timeline::kept`): a byte per
/// allocation each for the category, the confidence and the rule (an index in `reasons`).
pub fn infer_codes(t: &Timeline) -> InferredCategories {
    let inferred = infer(t);
    let mut codes = InferredCategories {
        category: Vec::with_capacity(inferred.len()),
        confidence: Vec::with_capacity(inferred.len()),
        reason: Vec::with_capacity(inferred.len()),
        reasons: Vec::new(),
    };
    for i in inferred {
        let reason = codes.reasons.iter().position(|r| r == i.reason).unwrap_or_else(|| {
            codes.reasons.push(i.reason.to_string());
            codes.reasons.len() - 1
        });
        codes.category.push(i.index() as u8);
        codes.confidence.push(i.confidence as u8);
        codes.reason.push(reason as u8);
    }
    codes
}

/// The inferred category of each allocation of `t`, by allocation id.
pub fn infer(t: &Timeline) -> Vec<Inferred> {
    let a = &t.allocations;
    let n = a.start.len();
    let events = t.events as u32;
    let stacks: Vec<StackInfo> = (0..t.stack_offsets.len().saturating_sub(1))
        .map(|s| {
            let ids = &t.stack_frames[t.stack_offsets[s] as usize..t.stack_offsets[s + 1] as usize];
            read_stack(&ids.iter().map(|&f| &t.frames[f as usize]).collect::<Vec<_>>())
        })
        .collect();
    let info = |id: usize| if a.stack[id] == u32::MAX { StackInfo::default() } else { stacks[a.stack[id] as usize] };

    let mut order: Vec<usize> = (0..n).collect();
    order.sort_by_key(|&id| (a.start[id], id));
    // The passes, and each allocation's.
    let mut passes: Vec<Pass> = Vec::new();
    let mut pass_of = vec![usize::MAX; n];
    for &id in &order {
        let Some(phase) = info(id).phase else { continue };
        if passes.last().is_none_or(|p| p.phase != phase) {
            passes.push(Pass { phase, first: a.start[id] });
        }
        pass_of[id] = passes.len() - 1;
    }
    // Allocations started before each position (`started[x]`: those with start < x).
    let mut started = vec![0u32; t.events + 2];
    for &id in &order {
        started[a.start[id] as usize + 1] += 1;
    }
    for x in 1..started.len() {
        started[x] += started[x - 1];
    }
    let last_start = order.last().map_or(0, |&id| a.start[id]);
    // Where the first allocation the program frees while it still allocates (not in a teardown)
    // was made: before it, nothing has run that makes temporaries.
    let first_transient = order.iter().copied().filter(|&id| a.start[id] > 0 && a.end[id] <= last_start).map(|id| a.start[id]).next().unwrap_or(u32::MAX);
    // Where the program lets go of what it made before anything ran (a model, its optimizer):
    // the first free, after the last allocation, of one made before the last pass (or before
    // anything was freed); what is freed from there on lived to the end. A trace cut while the
    // program runs has none.
    let last_pass = passes.last().map_or(0, |p| p.first).max(first_transient.min(events + 1));
    let teardown =
        (0..n).filter(|&id| a.start[id] < last_pass && a.end[id] > last_start && a.end[id] <= events).map(|id| a.end[id]).min().unwrap_or(events + 1);
    // Whether an allocation of pass k outlives it: freed after the next pass started, or in the
    // teardown after the last.
    let outlives = |k: usize, end: u32| passes.get(k + 1).map_or(end >= teardown, |p| end > p.first);
    let backward_passes: Vec<usize> = (0..passes.len()).filter(|&k| passes[k].phase == Phase::Backward).collect();
    let first_step = passes.iter().find(|p| p.phase != Phase::Forward).map_or(u32::MAX, |p| p.first);
    let quick = |id: usize| {
        let (s, e) = (a.start[id] as usize, (a.end[id] as usize).min(t.events + 1));
        s > 0 && started[e] - started[s + 1] == 0
    };

    // Whether the trace makes gradients and optimizer state (then what predates it, alive to the
    // end, is the parameters) or has neither pass (a forward: the same).
    let makes = |phase: Phase| (0..n).any(|id| info(id).phase == Some(phase) && outlives(pass_of[id], a.end[id]));
    let training = passes.iter().any(|p| p.phase != Phase::Forward);
    let predates_parameters = if training { makes(Phase::Backward) && makes(Phase::Optimizer) } else { true };

    let verdict = |category: Option<Category>, confidence: Confidence, reason: &'static str| Inferred { category, confidence, reason };
    // A file whose trace allocates nothing: what it holds predates the trace.
    let end_state = (0..n).all(|id| a.start[id] == 0);
    let mut next_backward = Cursor(0);
    (0..n)
        .map(|id| {
            let s = info(id);
            let (start, end) = (a.start[id], a.end[id]);
            let lives_to_end = end >= teardown;
            if s.workspace {
                return verdict(None, Confidence::High, "a library's workspace (cuBLAS), not a tensor");
            }
            match s.phase {
                Some(Phase::Optimizer) => {
                    return if outlives(pass_of[id], end) {
                        verdict(Some(Category::OptimizerState), Confidence::High, "made in the optimizer step, alive past it")
                    } else {
                        verdict(Some(Category::Temporary), Confidence::High, "made and freed within the optimizer step")
                    };
                }
                Some(Phase::Backward) => {
                    return if outlives(pass_of[id], end) {
                        let sure = s.accumulate || passes.get(pass_of[id] + 1).is_some_and(|p| p.phase == Phase::Optimizer);
                        verdict(
                            Some(Category::Gradient),
                            if sure { Confidence::High } else { Confidence::Medium },
                            "made in backward, alive past its backward pass",
                        )
                    } else if quick(id) {
                        verdict(Some(Category::Temporary), Confidence::Medium, "made in backward, freed before anything else was allocated")
                    } else {
                        verdict(Some(Category::AutogradDetail), Confidence::Medium, "made and freed within backward (a gradient of an intermediate)")
                    };
                }
                _ => {}
            }
            if start == 0 && s.kv_cache {
                // torch.profiler has no category for it: neither a parameter nor an activation.
                return verdict(None, Confidence::Medium, "a key/value cache (its frames name the cache), made before the trace");
            }
            if s.input {
                return verdict(Some(Category::Input), Confidence::Medium, "made by a data loader or a host-to-device copy outside a module");
            }
            if s.parameter {
                return verdict(Some(Category::Parameter), Confidence::High, "made by module construction or a parameter initialiser");
            }
            // Made before the trace with a stack (an end-state file: PyTorch 2.0/2.1's
            // `_record_memory_history(True)`, or blocks dumped with their frames): the frames
            // say what it is, not its lifetime, which the file does not hold.
            if start == 0 && a.stack[id] != u32::MAX && end_state {
                return match s.phase {
                    Some(Phase::Forward) => verdict(Some(Category::Activation), Confidence::Medium, END_STATE_ACTIVATION),
                    _ if s.constructor => verdict(Some(Category::Parameter), Confidence::Medium, "made by a constructor (`__init__`) before the trace"),
                    _ => verdict(None, Confidence::Low, "made before the trace; its frames name neither a module's construction nor a forward"),
                };
            }
            if start == 0 && a.stack[id] == u32::MAX {
                // With no event at all (a file dumped without a history) nothing says what it is.
                return if lives_to_end && predates_parameters && events > 0 {
                    verdict(
                        Some(Category::Parameter),
                        Confidence::Low,
                        "allocated before the trace without a stack, alive to the end, in a trace that makes its own gradients and optimizer state (or has no step)",
                    )
                } else {
                    verdict(None, Confidence::Low, "allocated before the trace, no stack")
                };
            }
            if lives_to_end && start < first_step && (start < first_transient || s.factory) {
                return verdict(Some(Category::Parameter), Confidence::Medium, "made before the first step, alive to the end");
            }
            if s.factory {
                return verdict(Some(Category::Input), Confidence::Medium, "made by a factory outside any module");
            }
            // The backward pass after it: what it was saved for, if it is freed there.
            let next = next_backward.after(start, &backward_passes, &passes);
            if let Some(&k) = backward_passes.get(next)
                && end > passes[k].first
            {
                return if !outlives(k, end) {
                    verdict(Some(Category::Activation), Confidence::High, "made in forward, freed during the next backward (saved for it)")
                } else {
                    verdict(None, Confidence::Low, "made in forward, alive past the next backward")
                };
            }
            if !lives_to_end {
                return match (quick(id), backward_passes.is_empty()) {
                    (true, _) => verdict(Some(Category::Temporary), Confidence::High, "made in forward, freed before anything else was allocated"),
                    (false, false) => verdict(Some(Category::Temporary), Confidence::Medium, "made in forward, freed before any backward used it"),
                    (false, true) => verdict(
                        Some(Category::Temporary),
                        Confidence::Low,
                        "made in forward and freed; no backward in the trace to tell whether it would have been saved for one",
                    ),
                };
            }
            verdict(None, Confidence::Low, "made after the start, alive to the end, in no step")
        })
        .collect()
}

/// The bytes of one inferred category live at a position.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct CategoryBytes {
    /// `parameter`, ..., `unknown`.
    pub category: Cow<'static, str>,
    pub bytes: u64,
    pub allocations: usize,
    /// The confidence that holds most of the bytes.
    pub confidence: Confidence,
    pub high_bytes: u64,
    pub medium_bytes: u64,
    pub low_bytes: u64,
    /// The rule that gave the most bytes.
    pub reason: Cow<'static, str>,
}

/// What is live at `position`, by inferred category, most bytes first.
pub(super) fn live_by_category(t: &Timeline, inferred: &[Inferred], position: usize) -> Vec<CategoryBytes> {
    let a = &t.allocations;
    let x = position as u32;
    let mut by: Vec<(CategoryBytes, Vec<(&'static str, u64)>)> = Vec::new();
    for id in (0..a.start.len()).filter(|&id| a.start[id] <= x && x < a.end[id]) {
        let i = inferred[id];
        let bytes = a.size[id] as u64;
        let slot = match by.iter().position(|(c, _)| c.category == i.name()) {
            Some(s) => s,
            None => {
                let empty = CategoryBytes {
                    category: i.name().into(),
                    bytes: 0,
                    allocations: 0,
                    confidence: Confidence::Low,
                    high_bytes: 0,
                    medium_bytes: 0,
                    low_bytes: 0,
                    reason: "".into(),
                };
                by.push((empty, Vec::new()));
                by.len() - 1
            }
        };
        let (c, reasons) = &mut by[slot];
        c.bytes += bytes;
        c.allocations += 1;
        *match i.confidence {
            Confidence::High => &mut c.high_bytes,
            Confidence::Medium => &mut c.medium_bytes,
            Confidence::Low => &mut c.low_bytes,
        } += bytes;
        match reasons.iter_mut().find(|(r, _)| *r == i.reason) {
            Some(r) => r.1 += bytes,
            None => reasons.push((i.reason, bytes)),
        }
    }
    let mut out: Vec<CategoryBytes> = by
        .into_iter()
        .map(|(mut c, reasons)| {
            c.confidence = [(c.high_bytes, Confidence::High), (c.medium_bytes, Confidence::Medium), (c.low_bytes, Confidence::Low)]
                .into_iter()
                .max_by_key(|&(b, conf)| (b, conf))
                .map_or(Confidence::Low, |(_, conf)| conf);
            c.reason = reasons.into_iter().max_by_key(|&(r, b)| (b, std::cmp::Reverse(r))).map_or("", |(r, _)| r).into();
            c
        })
        .collect();
    out.sort_by(|p, q| q.bytes.cmp(&p.bytes).then(p.category.cmp(&q.category)));
    out
}
