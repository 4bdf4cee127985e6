//! `grads-kept`: gradients alive through the forward. A gradient is what a backward pass makes
//! and leaves allocated when it ends; it is kept when it is still live as a later iteration's
//! forward starts, after an optimizer step has used it (`zero_grad(set_to_none=False)`, or no
//! `zero_grad` at all). Gradients accumulated over micro-batches before one step are not kept:
//! no step comes between. Where the trace shows no optimizer step (tensormem's plain SGD
//! allocates nothing), any later forward counts, and the finding says so.

use super::kinds::{Kind, Material, Role};
use super::steps::{self, Phase, Steps};
use super::{AllocationRef, Finding, FindingConfidence, GRADS_KEPT, Patient, StackBytes, size};
use serde::Serialize;

#[derive(Serialize)]
struct Evidence {
    #[serde(flatten)]
    iterations: steps::IterationsEvidence,
    /// Whether an optimizer step shows in the trace (else any later forward counts).
    optimizer_steps_seen: bool,
    /// At each iteration's start (from the second): gradient bytes kept from earlier backwards.
    kept_per_iteration: Vec<u64>,
    worst_iteration: usize,
    position: u32,
    top_stacks: Vec<StackBytes>,
    allocations: Vec<AllocationRef>,
}

/// Kept bytes worth reporting: this share of the peak...
/// ...and at least this many bytes.
pub(super) const KIND: Kind = Kind {
    name: GRADS_KEPT,
    label: "gradients kept",
    about: "gradients alive through the next forward",
    role: Role::Problem,
    find: |x| Ok(find(&x.patient, &x.steps)),
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
    let evidence = Evidence {
        iterations: s.evidence(p),
        optimizer_steps_seen: s.has_optimizer,
        kept_per_iteration: per_iteration,
        worst_iteration: k,
        position: s.iterations[k - 1],
        top_stacks: steps::top_stacks(p, &kept, 3),
        allocations: steps::largest(p, &kept, 5),
    };
    let finding = Finding::new(GRADS_KEPT, title, bytes, evidence, why, fix).estimate(estimate);
    Some(match s.has_optimizer {
        true => finding,
        false => finding.confidence(FindingConfidence::Medium, "no optimizer step shows in the trace: the gradients may be accumulating on purpose".into()),
    })
}

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
