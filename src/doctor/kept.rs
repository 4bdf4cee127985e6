//! `kept-activations`: a file that holds no allocation event (an end-state file: PyTorch
//! 2.0/2.1's `_record_memory_history(True)`, or a dump whose blocks carry their frames) whose
//! blocks were made inside a module's forward and are alive at the end: forward results a
//! program kept (a forward hook appending outputs to a list, outputs stored across batches), or
//! a graph a backward was still to use.
//!
//! The counterfactual: when a program is done with its forwards, what a forward made is gone
//! (under no_grad at once, with grad when its backward ran or its result died); a correct
//! program's end holds parameters, their gradients, optimizer state, its inputs and the last
//! result. Blocks made in a forward below a module call, a material share of what is
//! allocated, are what the program still holds of its forwards. Without history the file cannot
//! tell whether a backward was still to come (a snapshot dumped between forward and backward
//! holds the same blocks): a correct program can leave this file, so the finding is
//! `inconclusive`, names the blocks with their stacks and says which recording decides. The
//! categories come from the blocks' frames (`categories::infer`), never from their lifetime,
//! which the file does not hold.

use super::Material;
use super::kinds::{Kind, Role};
use super::{AllocationRef, Finding, FindingConfidence, KEPT_ACTIVATIONS, Patient, StackBytes, categories, size, steps};
use crate::trace::Category;
use serde::{Deserialize, Serialize};

#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct KeptActivationsEvidence {
    pub device: i64,
    /// Blocks made inside a module's forward, alive at the end, and their bytes.
    pub blocks: usize,
    /// Everything allocated at the end, for scale.
    pub allocated_bytes: u64,
    /// The position it is measured at: the trace's end.
    pub position: u32,
    pub top_stacks: Vec<StackBytes>,
    pub allocations: Vec<AllocationRef>,
}

pub(super) const KIND: Kind = Kind {
    name: KEPT_ACTIVATIONS,
    label: "kept activations",
    about: "forward tensors alive at the end of a file without history",
    role: Role::Problem,
    find: |x| Ok(find(&x.patient)),
    material: Material { share: 0.05, min_bytes: 16 << 20 },
};

fn find(p: &Patient) -> Option<Finding> {
    let t = &p.timeline;
    let a = &t.allocations;
    let n = a.start.len();
    if n == 0 || (0..n).any(|id| a.start[id] > 0) {
        return None;
    }
    let inferred = categories::infer(t);
    let end = t.events as u32;
    let kept: Vec<usize> = (0..n)
        .filter(|&id| a.end[id] > end && inferred[id].category == Some(Category::Activation) && inferred[id].reason == categories::END_STATE_ACTIVATION)
        .filter(|&id| !steps::is_kv_cache(p, id))
        .collect();
    let bytes: u64 = kept.iter().map(|&id| steps::bytes(p, id)).sum();
    let allocated: u64 = (0..n).filter(|&id| a.end[id] > end).map(|id| steps::bytes(p, id)).sum();
    if !KIND.material.holds(bytes, allocated) {
        return None;
    }
    let top_stacks = steps::top_stacks(p, &kept, 3);
    let keeper = top_stacks.first().and_then(|s| s.frames.first().cloned()).unwrap_or_default();
    let title = format!(
        "{} in {} blocks made inside module forwards are still allocated where this file ends ({keeper}): forward results kept, or a graph whose backward had not run",
        size(bytes),
        kept.len()
    );
    let why = format!(
        "This file holds no history, only the blocks alive when it was taken, each with the stack that made it. {} of them \
         ({} of the {} allocated) were made inside a module's forward. Once a program is done with a forward, what it \
         made is freed (at once under no_grad; when its backward runs or its result dies with grad on); what stays is \
         kept by something: a forward hook that appends outputs to a list, outputs or losses stored across batches, a \
         cache on a module, or a graph whose backward has not run yet (a snapshot taken between forward and backward \
         holds these blocks too, and this file cannot tell).",
        kept.len(),
        size(bytes),
        size(allocated)
    );
    let fix = "Find what holds them from the stacks: clear lists that hooks fill (or remove the hook with handle.remove()), \
               store outputs with .detach().cpu() or .item(), and run evaluation under torch.no_grad(). To see when they pile \
               up, record a history: torch.cuda.memory._record_memory_history(max_entries=100000) before the loop."
        .to_string();
    let evidence = KeptActivationsEvidence {
        device: p.device,
        blocks: kept.len(),
        allocated_bytes: allocated,
        position: end,
        allocations: steps::largest(p, &kept, 5),
        top_stacks,
    };
    Some(
        Finding::new(title, bytes, evidence, why, fix).confidence(
            FindingConfidence::Inconclusive,
            "a file without history: a snapshot taken between a forward and its backward holds the same blocks; a recorded \
                 history (_record_memory_history before the loop) shows whether they pile up across forwards"
                .into(),
        ),
    )
}
