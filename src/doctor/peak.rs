//! `peak`: when allocated memory peaks, in which phase, and what is live then.

use super::Material;
use super::kinds::{Kind, Role};
use super::steps::Steps;
use super::{Finding, PEAK, Patient, categories, live, size};
use serde::{Deserialize, Serialize};
use std::borrow::Cow;

#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct PeakEvidence {
    pub device: i64,
    pub devices: Vec<i64>,
    /// The trace entry that reached the peak (None: the peak is the start state).
    pub event: Option<usize>,
    /// forward, loss, backward, optimizer step; None when neither frames nor annotations say.
    pub phase: Option<Cow<'static, str>>,
    pub peak_allocated_bytes: u64,
    pub peak_reserved_bytes: u64,
    pub live: live::Live,
    /// Where the trace records no categories (PyTorch's own): what is live by inferred category,
    /// with how sure.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub inferred_categories: Option<Vec<categories::CategoryBytes>>,
}

pub(super) const KIND: Kind = Kind {
    name: PEAK,
    label: "peak",
    about: "what the peak is made of",
    role: Role::Summary,
    find: |x| Ok(Some(find(&x.patient, &x.steps))),
    material: Material::ANY,
};

pub(super) fn find(p: &Patient, steps: &Steps) -> Finding {
    let summary = &p.timeline.summary;
    let position = summary.peak_x as usize;
    let live = live::at(&p.timeline, position);
    let phase = crate::pytorch::phase_at(p.snapshot, p.device, position);
    let event = position.checked_sub(1);
    let when = match (event, phase) {
        (Some(i), Some(phase)) => format!("at event {i}, in the {phase}"),
        (Some(i), None) => format!("at event {i}"),
        (None, _) if super::no_history::without_history(p) => "when the snapshot was taken (no history: any peak before is unknown)".into(),
        (None, _) => "before the trace's first event".into(),
    };
    let recorded = p.timeline.groups.iter().any(|g| g.category);
    let inferred = (!recorded).then(|| categories::live_by_category(&p.timeline, &categories::infer(&p.timeline), position));
    let by_category = match &inferred {
        // Nothing to say where no category could be told.
        Some(by) if by.iter().any(|c| c.category != categories::UNKNOWN) => {
            let largest: Vec<String> = by.iter().take(3).map(|c| format!("{} {}", c.category.replace('_', " "), size(c.bytes))).collect();
            format!(" (inferred: {})", largest.join(", "))
        }
        _ => String::new(),
    };
    let title = format!(
        "Allocated memory peaks at {} {when}: {}{by_category}",
        size(summary.peak_allocated_bytes),
        if live.by_group.is_empty() { "nothing is live".into() } else { live.largest_groups(3) }
    );
    let grouped_by = if recorded {
        "the trace's own categories"
    } else {
        "the line of your code at the top of each allocation's stack, and by category as inferred from each allocation's stack, phase \
         and lifetime (with how sure)"
    };
    let why = format!(
        "The peak is the moment that decides whether a run fits on a card: everything listed here was live at once. \
         Bytes are what the tensors requested (the trace's figure); they are grouped by {grouped_by}, and the stacks \
         that hold the most are in the evidence."
    );
    let fix = match phase {
        Some("forward" | "loss" | "backward") if steps.has_backward => {
            "Shrink what is live at the peak: activations saved for backward dominate a training step's peak; a smaller batch, \
             activation checkpointing (torch.utils.checkpoint) or mixed precision lowers them."
        }
        Some("forward" | "loss") if p.stopped_by_oom().is_some() => {
            "Shrink what is live at the peak: the program ran out of memory before any backward, so what its forward keeps \
             for one (every layer's activations, while grad mode is on) is most of it; a smaller batch or sequence, \
             activation checkpointing (torch.utils.checkpoint), mixed precision, or in-place ops where autograd allows them \
             lower it. If this forward needs no backward (evaluation, inference), run it under torch.no_grad()."
        }
        Some("forward" | "loss" | "backward") => {
            "Shrink what is live at the peak: with no backward in the trace, nothing needs to be saved for one; under \
             torch.no_grad() (or inference_mode) each activation is freed once the next op has read it, so what remains is the \
             weights, the largest ops' outputs and any cache (generation's key/value cache). A smaller batch or sequence, \
             lower-precision weights (bfloat16, 8-bit or 4-bit), or computing the largest op in chunks lowers it."
        }
        Some(_) => {
            "Shrink what is live at the peak: during the optimizer step, its state and foreach temporaries add up; \
             `foreach=False` or a leaner optimizer lowers them."
        }
        None => "Shrink what is live at the peak: start with the largest group and stack above.",
    };
    Finding::new(
        title,
        summary.peak_allocated_bytes,
        PeakEvidence {
            device: p.device,
            devices: p.snapshot.devices(),
            event,
            phase: phase.map(Cow::from),
            peak_allocated_bytes: summary.peak_allocated_bytes,
            peak_reserved_bytes: summary.peak_reserved_bytes,
            live,
            inferred_categories: inferred,
        },
        why,
        fix.into(),
    )
}
