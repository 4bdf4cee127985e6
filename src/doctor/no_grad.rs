//! `missing-no-grad`: forward passes whose saved tensors are never used, because no backward
//! follows.
//!
//! The counterfactual: the same forward under no_grad frees each intermediate as soon as the
//! next op has read it, so when it makes its last allocation nothing of its earlier layers is
//! left but what the program keeps on purpose (a hook's list, hidden states, a cache: a tensor
//! or two a layer), and its result, which lives either way. With grad on, what every layer
//! saves for backward is still allocated there. So a forward is claimed only when, at its end,
//! at least a quarter of what it made before its last quarter is still allocated
//! (`steps::graph_kept_at`); a kept result (the previous batch's logits alive through the
//! next forward) is not a graph and is never counted. A forward too small to show layers (one
//! `Linear`) shows grad another way: its input, which the program lets go of, stays allocated
//! through the next forward and is freed with the result it was saved for (`kept_inputs`); under
//! no_grad it is freed when the program rebinds it.
//!
//! How sure: `high` from two forwards whose graphs are freed together (one free after another,
//! nothing allocated between: the result died and took its graph along), `medium` from one, or
//! from kept inputs only (a program holding input and result together would look the same), or
//! from a graph made before the trace and freed together in it, with no backward, whose sizes are
//! those of the graph a forward in the trace holds (an earlier forward's, torn down when
//! `logits = model(x)` rebinds its result: `earlier_graph_torn_down`);
//! `inconclusive` when what the forward holds is still allocated where the trace ends (a dump
//! between a forward and its backward): a backward the recording missed may have needed it,
//! and a longer recording, or one that includes the backward, decides. PyTorch's autograd frames
//! (`torch::autograd::VariableType::`) are named in the evidence but prove nothing alone: they
//! appear under no_grad too.
//!
//! The figures: the trace is replayed as recorded and with each saved tensor freed once the next
//! op has read it, each kept input once the program makes the next allocation outside a forward
//! (`what_if::freed_sooner`). On shreyansh26's `Linear` run, that gives the peaks its no_grad
//! twin recorded (tests/doctor.rs).

use super::Material;
use super::kinds::{Kind, Role};
use super::steps::{self, Phase, Steps};
use super::{AllocationRef, Finding, FindingConfidence, MISSING_NO_GRAD, Patient, StackBytes, size, what_if};
use crate::timeline::GroupKind;
use crate::trace::{Category, Frame};
use serde::{Deserialize, Serialize};

#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct MissingNoGradEvidence {
    #[serde(flatten)]
    pub iterations: steps::IterationsEvidence,
    /// What tells that autograd was on, in words.
    pub grad_mode_evidence: String,
    /// Forwards whose held tensors were freed together later (a graph torn down when its
    /// result died), and forwards whose held tensors are still live where the trace ends.
    pub forwards_torn_down: usize,
    pub forwards_held_to_the_end: usize,
    /// A graph made before the trace and freed in it with no backward (None: none seen).
    pub earlier_graph: Option<EarlierGraph>,
    /// Per forward: bytes it still holds when the next one starts (or the trace ends).
    pub held_per_iteration: Vec<u64>,
    /// The forward holding the most, and the position it is measured at.
    pub worst_iteration: usize,
    pub position: u32,
    pub top_stacks: Vec<StackBytes>,
    pub allocations: Vec<AllocationRef>,
}

/// Allocations made before the trace, freed together in it, sized as a forward's graph.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct EarlierGraph {
    pub bytes: u64,
    pub allocations: usize,
    /// The position of the first of their frees.
    pub freed_at: u32,
}

/// What became of what one forward held past its end.
#[derive(Clone, Copy, PartialEq, Eq)]
enum Fate {
    /// Freed together, with nothing allocated between: a graph torn down.
    TornDown,
    /// Freed one at a time among other allocations: not how a graph dies.
    FreedApart,
    /// Still live where the trace ends.
    HeldToTheEnd,
}

/// Held bytes worth reporting: this share of the peak...
/// ...and at least this many bytes.
pub(super) const KIND: Kind = Kind {
    name: MISSING_NO_GRAD,
    label: "missing no_grad",
    about: "forwards that keep a graph no backward uses",
    role: Role::Problem,
    find: |x| Ok(find(&x.patient, &x.steps)),
    // The proof carries the claim, not the size: 1% of the peak, as for the other kinds that
    // name a program's mistake (a one-`Linear` forward's saved input is 4.6% of its peak).
    material: Material { share: 0.01, min_bytes: 1 << 20 },
};

pub(super) fn find(p: &Patient, s: &Steps) -> Option<Finding> {
    if s.has_backward || s.iterations.is_empty() {
        return None;
    }
    let a = &p.timeline.allocations;
    let events = p.timeline.events;
    let mut by_iteration: Vec<Vec<usize>> = vec![Vec::new(); s.iterations.len() + 1];
    for &id in &s.order {
        // A key/value cache is kept on purpose (generation), not for a backward.
        if s.phase[id] == Some(Phase::Forward) && a.start[id] > 0 && !s.made_once[id] && !steps::is_kv_cache(p, id) {
            by_iteration[s.iteration_of(a.start[id])].push(id);
        }
    }
    let mut held_per_iteration = Vec::new();
    let mut fates = Vec::new();
    // Forwards whose evidence is an input kept with the result, not their own layers.
    let mut by_inputs = 0;
    let mut worst: (u64, usize, u32, Vec<usize>, bool) = (0, 0, 0, Vec::new(), false);
    // Where no_grad would have freed what the material forwards hold: (alloc, after) trace indices.
    let mut sooner: Vec<(usize, usize)> = Vec::new();
    // The forward an out-of-memory stopped never reached its backward: it says nothing of grad mode.
    let stopped = p.stopped_by_oom();
    for (k, made) in by_iteration.iter().enumerate().skip(1) {
        let Some(&last) = made.last() else {
            held_per_iteration.push(0);
            continue;
        };
        let forward_end = a.start[last];
        let result = result_of(p, s, k, made);
        if stopped.is_some_and(|oom| oom < s.iteration_end(k, events) as usize) {
            held_per_iteration.push(0);
            continue;
        }
        // What the forward holds at its end besides its result, where its layers show a graph;
        // else the inputs its result kept alive, where they show one.
        let at = s.iteration_end(k, events);
        let (held, inputs, position) = match steps::graph_kept_at(p, made, forward_end) {
            true => (made.iter().copied().filter(|&id| id != result && steps::live_at(p, id, forward_end)).collect(), false, forward_end),
            false => match kept_inputs(p, s, k, result, &by_iteration) {
                inputs if !inputs.is_empty() => (inputs, true, forward_end),
                // No layers to read (a compiled forward returns what it saves): what it still
                // holds where the trace ends can only be inconclusive.
                _ => {
                    let held: Vec<usize> = made.iter().copied().filter(|&id| id != result && steps::live_at(p, id, at)).collect();
                    let to_the_end = !held.is_empty() && held.iter().all(|&id| a.end[id] as usize > events);
                    (if to_the_end { held } else { Vec::new() }, false, at)
                }
            },
        };
        let bytes: u64 = held.iter().map(|&id| steps::bytes(p, id)).sum();
        held_per_iteration.push(bytes);
        if s.material(p, bytes, KIND.material) {
            fates.push(fate(p, s, &held));
            by_inputs += usize::from(inputs);
            // A saved tensor once the next op has read it (after the next allocation); an input
            // once the program makes the next one (after the next allocation outside a forward).
            let next_input = steps::allocation_after(p, s, forward_end, |id| s.phase[id].is_none());
            sooner.extend(held.iter().filter_map(|&id| {
                let after = if inputs { next_input } else { steps::allocation_after(p, s, a.start[id], |_| true) };
                Some((steps::trace_index(p, id)?, after?))
            }));
        }
        if bytes > worst.0 {
            worst = (bytes, k, position, held, inputs);
        }
    }
    let (bytes, k, position, held, held_inputs) = worst;
    if !s.material(p, bytes, KIND.material) {
        return None;
    }
    let mut torn_down = fates.iter().filter(|&&f| f == Fate::TornDown).count();
    // Forwards that still hold their graphs where the trace ends may await a backward; an
    // earlier forward's graph, made before the trace and freed in it unused, shows they do not.
    let earlier = if torn_down == 0 && !held_inputs { earlier_graph_torn_down(p, s, &held) } else { Vec::new() };
    let earlier_graph = (!earlier.is_empty()).then(|| EarlierGraph {
        bytes: earlier.iter().map(|&id| steps::bytes(p, id)).sum(),
        allocations: earlier.len(),
        freed_at: earlier.iter().map(|&id| a.end[id]).min().unwrap_or(0),
    });
    torn_down += usize::from(earlier_graph.is_some());
    let to_the_end = fates.iter().filter(|&&f| f == Fate::HeldToTheEnd).count();
    let frames = grad_mode_frames(p, s);
    let (confidence, reason) = match (torn_down, &frames) {
        (2.., _) if by_inputs == 0 => (FindingConfidence::High, String::new()),
        (2.., _) => (
            FindingConfidence::Medium,
            "the forwards' own tensors die with them; what shows the graph is each input freed with the result it was saved for, \
             after the next forward (a program holding input and result together until then would look the same)"
                .to_string(),
        ),
        (1, _) if let Some(g) = &earlier_graph => (
            FindingConfidence::Medium,
            format!(
                "{} in {} allocations made before the trace, sized as forward {k}'s graph, were freed together at position {} \
                 with no backward: an earlier forward's graph, torn down when its result died. More forwards in the trace \
                 would confirm it",
                size(g.bytes),
                g.allocations,
                g.freed_at
            ),
        ),
        (1, _) => (FindingConfidence::Medium, "one forward shows its graph torn down; more forwards would confirm it".to_string()),
        (0, _) if to_the_end > 0 => (
            FindingConfidence::Inconclusive,
            "what the forward holds is still allocated where the trace ends: if the recording stopped before a backward (a \
             snapshot dumped between forward and backward, or a device of a run that died elsewhere), the graph was needed"
                .to_string(),
        ),
        // tensormem's own traces know their model; PyTorch's autograd frames (VariableType,
        // autograd.Function) appear under no_grad too, so they alone prove nothing.
        (0, Some(_)) if s.tensormem => (FindingConfidence::Medium, "the trace shows a model; no forward's tensors were seen freed together".to_string()),
        // Held past the forward but freed one at a time: a cache or a list, not a graph.
        (0, _) => return None,
    };
    let grad_mode_evidence = match (&frames, torn_down) {
        (Some(f), 0) => f.clone(),
        (Some(f), n) => format!("{f}; {n} forward{} freed together when {} result died", plural(n), if n == 1 { "its" } else { "their" }),
        (None, 0) => "none: the trace ends with the forward's tensors live".to_string(),
        (None, n) => format!("{n} forward{}' tensors freed together when {} result died, as a graph is", plural(n), if n == 1 { "its" } else { "their" }),
    };
    let how = "replay the trace with each tensor the forwards saved for backward freed once the next op has read it, and each \
               input they kept freed when the next allocation is made, as under torch.no_grad()";
    let verified = (confidence != FindingConfidence::Inconclusive).then(|| what_if::freed_sooner(p, &sooner, how)).flatten();
    let top_stacks = steps::top_stacks(p, &held, 3);
    let n = s.iterations.len();
    let title = format!(
        "{n} forward pass{} with autograd on and no backward: {} saved for a backward that never comes{}",
        if n > 1 { "es" } else { "" },
        size(bytes),
        if confidence == FindingConfidence::Inconclusive { " (unless one followed after the trace ends)" } else { "" }
    );
    let when = if (position as usize) < events { format!("when it ends (position {position})") } else { "where the trace ends".to_string() };
    let why = if held_inputs {
        format!(
            "With grad mode on, an op keeps what its backward would need for as long as its result lives: a linear layer \
             keeps its input for the weight's gradient. The trace has no backward: forward {k}'s input ({}) stays \
             allocated through the next forward and is freed with forward {k}'s result, when the program rebinds it. Under \
             torch.no_grad() nothing is saved: the input is freed when the program lets go of it, and the result costs the \
             same either way.",
            size(bytes)
        )
    } else {
        format!(
            "With grad mode on, every op records a node and keeps what its backward would need (the activations of every \
             layer) for as long as its result lives. The trace has no backward: forward {k} still holds {} of its own tensors, \
             made across its layers, {when}, besides its result. Under torch.no_grad() each of them is freed as soon as the \
             next op has used it.",
            size(bytes)
        )
    };
    let why = match &earlier_graph {
        Some(g) => format!(
            "{why} Before it, a graph made before the trace ({} in {} allocations, the sizes forward {k} holds) stayed \
             allocated through forward {k} and was freed together at position {}, with no backward: an earlier forward's, \
             torn down when its result was rebound, so two graphs were allocated at once.",
            size(g.bytes),
            g.allocations,
            g.freed_at
        ),
        None => why,
    };
    let fix = "Run evaluation and inference under `with torch.no_grad():` (or `torch.inference_mode()`, or decorate the \
               function with @torch.no_grad()); model.eval() alone does not turn autograd off."
        .to_string();
    let evidence = MissingNoGradEvidence {
        iterations: s.evidence(p),
        grad_mode_evidence,
        forwards_torn_down: torn_down,
        forwards_held_to_the_end: to_the_end,
        earlier_graph,
        held_per_iteration,
        worst_iteration: k,
        position,
        allocations: steps::largest(p, &held, 5),
        top_stacks,
    };
    Some(
        Finding::new(title, bytes, evidence, why, fix)
            .verified(verified)
            .estimate(Some(
                "What no_grad would not hold rests on the forward's last allocation being its result (kept either way) and \
                 everything else it still holds being saved for backward."
                    .to_string(),
            ))
            .confidence(confidence, reason),
    )
}

fn plural(n: usize) -> &'static str {
    if n == 1 { "" } else { "s" }
}

/// The inputs forward `k` kept alive the way only its graph does: made outside any module
/// after the previous forward, still allocated when the next forward ends, and freed with `k`'s
/// result (one free after the other, nothing allocated between) when the program rebinds it.
/// Under no_grad the program's own reference frees an input when it is rebound (`inputs =
/// torch.randn(...)`), before the next forward; with grad the result's graph holds it (a linear
/// layer saves its input for the weight's gradient) until the result dies.
fn kept_inputs(p: &Patient, s: &Steps, k: usize, result: usize, by_iteration: &[Vec<usize>]) -> Vec<usize> {
    let a = &p.timeline.allocations;
    let events = p.timeline.events as u32;
    let (Some(&first), Some(&next_end)) = (by_iteration[k].first(), by_iteration.get(k + 1).and_then(|next| next.last())) else {
        return Vec::new();
    };
    let (next_end, result_end) = (a.start[next_end], a.end[result]);
    if result_end <= next_end || result_end > events {
        return Vec::new();
    }
    let since = by_iteration[..k].iter().rev().find_map(|made| made.last()).map_or(0, |&id| a.start[id]);
    let freed_with_result = |id: usize| a.end[id] <= events && steps::nothing_allocated_between(p, s, a.end[id], result_end);
    // What the trace itself calls a parameter is the model, not an input a graph saved (a
    // program that ends by dropping its model and its results frees them together).
    let parameter = |id: usize| p.timeline.groups[a.group[id] as usize].kind == GroupKind::Category(Category::Parameter);
    let from = s.order.partition_point(|&id| a.start[id] <= since);
    s.order[from..]
        .iter()
        .copied()
        .take_while(|&id| a.start[id] < a.start[first])
        .filter(|&id| s.phase[id].is_none() && a.start[id] > 0 && a.end[id] > next_end && !parameter(id) && freed_with_result(id))
        .collect()
}

/// Forward `k`'s result: its last allocation still live when the next forward starts (or the
/// trace ends). A temporary its last op frees at once (cuBLAS's scratch after a matmul) is not
/// it; where nothing outlives the forward (its result dropped at once), its last allocation.
fn result_of(p: &Patient, s: &Steps, k: usize, made: &[usize]) -> usize {
    let a = &p.timeline.allocations;
    let after = s.iteration_end(k, p.timeline.events);
    made.iter().rev().copied().find(|&id| a.end[id] > after).unwrap_or(made[made.len() - 1])
}

/// An earlier forward's graph, made before the trace began and torn down in it: allocations
/// that predate the trace, freed together (one after another, nothing allocated between) in a
/// trace with no backward, at least half of whose bytes have the sizes of what a forward in the
/// trace holds (`held`: its graph). Under no_grad the earlier forward would have left only its
/// result; with grad its graph lives until the result is rebound (`logits = model(x)` again).
fn earlier_graph_torn_down(p: &Patient, s: &Steps, held: &[usize]) -> Vec<usize> {
    let a = &p.timeline.allocations;
    let events = p.timeline.events as u32;
    let held_bytes: u64 = held.iter().map(|&id| steps::bytes(p, id)).sum();
    let mut sizes: rustc_hash::FxHashMap<u64, usize> = Default::default();
    for &id in held {
        *sizes.entry(steps::bytes(p, id)).or_default() += 1;
    }
    let mut freed: Vec<usize> = (0..a.start.len()).filter(|&id| a.start[id] == 0 && a.end[id] <= events).collect();
    freed.sort_unstable_by_key(|&id| a.end[id]);
    let mut best: (u64, &[usize]) = (0, &[]);
    for run in freed.chunk_by(|&x, &y| steps::nothing_allocated_between(p, s, a.end[x], a.end[y])) {
        let mut left = sizes.clone();
        let matched: u64 = run
            .iter()
            .map(|&id| steps::bytes(p, id))
            // Each of `held`'s sizes matched once.
            .filter(|b| left.get_mut(b).and_then(|n| n.checked_sub(1).map(|rest| *n = rest)).is_some())
            .sum();
        if run.len() >= steps::GRAPH_MIN_SURVIVORS && matched * 2 >= held_bytes && matched > best.0 {
            best = (matched, run);
        }
    }
    best.1.to_vec()
}

/// How the `held` allocations of one forward ended: together (nothing allocated between their
/// first and last free), one at a time, or not within the trace.
fn fate(p: &Patient, s: &Steps, held: &[usize]) -> Fate {
    let a = &p.timeline.allocations;
    if held.iter().any(|&id| a.end[id] as usize > p.timeline.events) {
        return Fate::HeldToTheEnd;
    }
    let first = held.iter().map(|&id| a.end[id]).min().unwrap_or(0);
    let last = held.iter().map(|&id| a.end[id]).max().unwrap_or(0);
    if steps::nothing_allocated_between(p, s, first, last) { Fate::TornDown } else { Fate::FreedApart }
}

/// What the frames show of autograd being on during the forward; None when they show nothing.
fn grad_mode_frames(p: &Patient, s: &Steps) -> Option<String> {
    let trace = p.snapshot.trace_of(p.device);
    if s.tensormem {
        let parameters = trace.iter().filter(|e| e.category == Some(Category::Parameter)).count();
        return (parameters > 0).then(|| format!("a model: {parameters} parameter allocations (tensormem's categories)"));
    }
    let marks = ["torch::autograd::VariableType::", "torch/autograd/function.py"];
    // Entries share their stacks: each is read once.
    let mut read: rustc_hash::FxHashSet<*const Frame> = Default::default();
    trace
        .iter()
        .filter_map(|e| e.frames.as_deref().filter(|f| read.insert(f.as_ptr())))
        .flat_map(|f| f.iter())
        .find_map(|f| marks.iter().find(|m| f.name.contains(*m) || f.filename.ends_with(*m)).map(|m| format!("autograd on the forward's stacks: `{m}`")))
}
