//! `grads-kept`: gradients alive through the forward. A gradient is what a backward pass makes
//! and leaves allocated when it ends; it is kept when it is still live as a later iteration's
//! forward starts, after an optimizer step has used it (`zero_grad(set_to_none=False)`, or no
//! `zero_grad` at all). Gradients accumulated over micro-batches before one step are not kept:
//! no step comes between. Where the trace shows no optimizer step (tensormem's plain SGD
//! allocates nothing), any later forward counts, and the finding says so.
//!
//! A trace of one step shows kept gradients another way: its backward adds into them. When
//! `.grad` is None (after `zero_grad()`), autograd's AccumulateGrad keeps the gradient the
//! backward made as `.grad`, which outlives the backward; when `.grad` exists it adds the new one
//! in place and frees it. So a first backward whose every parameter-sized output is freed
//! within it proves that the gradients were alive through the forward before it: the
//! counterfactual (zero_grad before the forward) would have left them allocated after the
//! backward. It is `medium`: a recording that begins between two micro-batches of a deliberate
//! accumulation looks the same.

use super::Material;
use super::kinds::{Kind, Role};
use super::steps::{self, Phase, Steps};
use super::{AllocationRef, Finding, FindingConfidence, GRADS_KEPT, Patient, StackBytes, size};
use serde::{Deserialize, Serialize};

#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct GradsKeptEvidence {
    #[serde(flatten)]
    pub iterations: steps::IterationsEvidence,
    /// Whether an optimizer step shows in the trace (else any later forward counts).
    pub optimizer_steps_seen: bool,
    /// At each iteration's start (from the second): gradient bytes kept from earlier backwards.
    pub kept_per_iteration: Vec<u64>,
    pub worst_iteration: usize,
    pub position: u32,
    pub top_stacks: Vec<StackBytes>,
    pub allocations: Vec<AllocationRef>,
}

/// Kept bytes worth reporting: this share of the peak...
/// ...and at least this many bytes.
pub(super) const KIND: Kind = Kind {
    name: GRADS_KEPT,
    label: "gradients kept",
    about: "gradients alive through the next forward",
    role: Role::Problem,
    find: |x| Ok(find(&x.patient, &x.steps).or_else(|| added_into(&x.patient, &x.steps))),
    material: Material { share: 0.01, min_bytes: 64 << 10 },
};

pub(super) fn find(p: &Patient, s: &Steps) -> Option<Finding> {
    if !s.has_backward || s.iterations.len() < 2 || !(s.has_optimizer || s.tensormem) {
        return None;
    }
    let a = &p.timeline.allocations;
    // Each backward allocation still live where its pass ends (the next pass starts).
    let gradients: Vec<usize> = s
        .order
        .iter()
        .copied()
        .filter(|&id| s.phase[id] == Some(Phase::Backward) && !steps::is_library_buffer(p, id))
        .filter(|&id| {
            let next = s.passes.partition_point(|q| q.first <= a.start[id]);
            s.passes.get(next).is_some_and(|next| steps::live_at(p, id, next.first))
        })
        .collect();
    // In PyTorch's traces a gradient has its parameter's size: a backward buffer of no
    // parameter's size (the autograd thread's cuBLAS workspace, with Python-only stacks) is not one.
    let gradients = if s.tensormem { gradients } else { of_parameter_sizes(p, s, gradients) };
    // The first optimizer step after each position.
    let optimizer_steps: Vec<u32> = s.passes.iter().filter(|q| q.phase == Phase::Optimizer).map(|q| q.first).collect();
    let optimizer_between = |from: u32, to: u32| optimizer_steps.get(optimizer_steps.partition_point(|&x| x <= from)).is_some_and(|&x| x < to);
    let (per_iteration, (bytes, k, kept)) =
        s.worst_iteration(p, &gradients, |_, b, id| a.start[id] < b && (!s.has_optimizer || optimizer_between(a.start[id], b)));
    if !s.material(p, bytes, KIND.material) {
        return None;
    }
    let title = format!("{} of gradients stay allocated through the forward of iteration {k}: they are never freed between steps", size(bytes));
    let why = format!(
        "Backward writes each parameter's gradient into .grad; the optimizer step reads it. Until zero_grad() frees them \
         (set_to_none=True, PyTorch's default), the gradients stay allocated through the next forward, whose activations \
         then pile on top of them: {} here, at the start of iteration {k}. Without any zero_grad() they also sum every \
         step's gradient, silently.",
        size(bytes)
    );
    let fix = "Call optimizer.zero_grad() (set_to_none=True, the default since PyTorch 2.0) after optimizer.step() or before \
               the forward: the gradients' memory is free during the forward and backward makes them again."
        .to_string();
    let estimate = (!s.has_optimizer).then(|| {
        "No optimizer step shows in the trace (an SGD step without momentum allocates nothing): every gradient still live \
         at a later forward counts. If the loop accumulates gradients over micro-batches on purpose, that is expected."
            .to_string()
    });
    let evidence = GradsKeptEvidence {
        iterations: s.evidence(p),
        optimizer_steps_seen: s.has_optimizer,
        kept_per_iteration: per_iteration,
        worst_iteration: k,
        position: s.iterations[k - 1],
        top_stacks: steps::top_stacks(p, &kept, 3),
        allocations: steps::largest(p, &kept, 5),
    };
    let finding = Finding::new(title, bytes, evidence, why, fix).estimate(estimate);
    Some(match s.has_optimizer {
        true => finding,
        false => finding.confidence(FindingConfidence::Medium, "no optimizer step shows in the trace: the gradients may be accumulating on purpose".into()),
    })
}

/// Gradients that the trace's first backward adds into (see the module's doc): each
/// parameter-sized allocation it makes is freed before it ends, at least a few of them.
fn added_into(p: &Patient, s: &Steps) -> Option<Finding> {
    if s.tensormem {
        return None;
    }
    let a = &p.timeline.allocations;
    let i = s.passes.iter().position(|q| q.phase == Phase::Backward)?;
    if i == 0 || s.passes[i - 1].phase != Phase::Forward {
        return None;
    }
    let (from, to) = (s.passes[i].first, s.passes.get(i + 1).map_or(p.timeline.events as u32, |q| q.first));
    let made: Vec<usize> = s
        .order
        .iter()
        .copied()
        .filter(|&id| s.phase[id] == Some(Phase::Backward) && (from..to).contains(&a.start[id]) && !steps::is_library_buffer(p, id))
        .collect();
    let sizes = steps::parameter_sizes(p, &s.iterations);
    let gradients: Vec<usize> = made.iter().copied().filter(|&id| sizes.contains_key(&steps::bytes(p, id))).collect();
    // Each freed as the backward goes on: what outlives the backward's last allocation is at
    // most the last gradient added (and a few small buffers). Gradients that became .grad
    // outlive it all (until zero_grad() or the program frees them).
    let last = s.passes[i].last;
    let largest = gradients.iter().map(|&id| steps::bytes(p, id)).max().unwrap_or(0);
    let outliving: u64 = made.iter().filter(|&&id| a.end[id] > last).map(|&id| steps::bytes(p, id)).sum();
    if gradients.len() < MIN_ADDED || outliving > largest + largest / 16 || gradients.iter().any(|&id| a.end[id] > to) {
        return None;
    }
    let bytes: u64 = gradients.iter().map(|&id| steps::bytes(p, id)).sum();
    if !s.material(p, bytes, KIND.material) {
        return None;
    }
    let n = gradients.len();
    let title = format!(
        "{} of gradients were allocated through the forward: the backward adds into them ({n} parameter-sized gradients, each freed within it), so nothing freed them since the last step",
        size(bytes)
    );
    let why = format!(
        "When a parameter's .grad is None, the backward's gradient becomes .grad and stays allocated after it; when .grad \
         already exists, the backward adds into it and frees its own. Here every one of the {n} parameter-sized gradients \
         the backward makes is freed before it ends: the {} of gradients existed before it, through the forward, \
         whose activations piled on top of them. Without zero_grad() they also sum every step's gradient.",
        size(bytes)
    );
    let fix = "Call optimizer.zero_grad() (set_to_none=True, the default since PyTorch 2.0), or model.zero_grad() where \
               there is no optimizer, before the forward: the gradients' memory is free during the forward."
        .to_string();
    let evidence = GradsKeptEvidence {
        iterations: s.evidence(p),
        optimizer_steps_seen: s.has_optimizer,
        kept_per_iteration: vec![bytes],
        worst_iteration: 1,
        position: from,
        top_stacks: steps::top_stacks(p, &gradients, 3),
        allocations: steps::largest(p, &gradients, 5),
    };
    Some(
        Finding::new(title, bytes, evidence, why, fix).confidence(
            FindingConfidence::Medium,
            "one backward adds into existing gradients: a recording that begins between two micro-batches of a deliberate \
         accumulation would look the same"
                .into(),
        ),
    )
}

/// Fewer parameter-sized gradients than this, all freed, prove nothing.
const MIN_ADDED: usize = 4;

/// The `candidates` that have the size of a parameter, each parameter matched once, the
/// earliest candidates first.
fn of_parameter_sizes(p: &Patient, s: &Steps, candidates: Vec<usize>) -> Vec<usize> {
    let mut sizes = steps::parameter_sizes(p, &s.iterations);
    candidates
        .into_iter()
        .filter(|&id| match sizes.get_mut(&steps::bytes(p, id)) {
            Some(left) if *left > 0 => {
                *left -= 1;
                true
            }
            _ => false,
        })
        .collect()
}
