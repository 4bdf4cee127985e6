//! `temporaries`: memory at the peak that one expression needs for a moment. Two shapes:
//!
//! - a temporary: an op's output made before the peak, then freed after at most [`SHORT_LIFE`]
//!   further allocations, at least one of them made while it lived (it sits beside the output
//!   of the op that reads it: the product in `(a * b).sum()`, a buffer an op made for itself);
//!   tensors the program made (`randn`, `zeros`: its data) are not temporaries;
//! - a replaced input: `x = x + 1` allocates the new `x` while the old one is still referenced,
//!   and the old one is freed as the name is rebound: the first allocation freed after the peak,
//!   before anything else is allocated, the same size as the allocation that reached the peak,
//!   which outlives it.
//!
//! Only the forward (or a program without autograd) counts: backward's temporaries are the
//! autograd engine's, the optimizer's are the `optimizer-state` finding's. Copies in another
//! layout (`clone`, `contiguous`) are the `copies` finding's.

use super::Material;
use super::kinds::{Kind, Role};
use super::ops::{OpKind, Ops};
use super::steps::{self, Phase, Steps, is_library_buffer};
use super::{AllocationRef, Finding, Patient, StackBytes, TEMPORARIES, size};
use serde::{Deserialize, Serialize};

/// A temporary is freed after at most this many further allocations.
const SHORT_LIFE: usize = 3;

#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct TemporariesEvidence {
    pub device: i64,
    /// The peak (the state after this many trace entries).
    pub position: u32,
    pub peak_allocated_bytes: u64,
    /// Short-lived temporaries live at the peak.
    pub temporary_bytes: u64,
    /// Inputs of an out-of-place op, freed as its output replaced them.
    pub replaced_bytes: u64,
    pub top_stacks: Vec<StackBytes>,
    pub allocations: Vec<AllocationRef>,
}

/// Bytes worth reporting: this share of the peak...
/// ...and at least this many bytes.
pub(super) const KIND: Kind = Kind {
    name: TEMPORARIES,
    label: "temporaries",
    about: "an out-of-place op's inputs at the peak",
    role: Role::Problem,
    find: |x| Ok(find(&x.patient, &x.steps, &x.ops)),
    material: Material { share: 0.10, min_bytes: 64 << 10 },
};

pub(super) fn find(p: &Patient, s: &Steps, ops: &Ops) -> Option<Finding> {
    let t = &p.timeline;
    let a = &t.allocations;
    let peak = t.summary.peak_x;
    // Allocation ids are in start order: the first allocation made at or after a position.
    let first_from = |x: u32| a.start.partition_point(|&start| start < x);
    let made_at_peak = a.start.get(first_from(peak)).is_some_and(|&start| start == peak).then(|| first_from(peak));
    let next_after_peak = a.start.get(first_from(peak + 1)).copied().unwrap_or(u32::MAX);
    let freed_in_trace = |id: usize| (a.end[id] as usize) <= t.events;
    let eligible = |id: usize| {
        steps::live_at(p, id, peak)
            && freed_in_trace(id)
            && Some(id) != made_at_peak
            && !matches!(s.phase[id], Some(Phase::Backward | Phase::Optimizer))
            && ops.kind(t, id) != Some(OpKind::Copy)
            && !is_library_buffer(p, id)
    };
    // The first allocation freed after the peak, when nothing is allocated before its free.
    let first_freed = (0..a.start.len()).filter(|&id| steps::live_at(p, id, peak)).min_by_key(|&id| a.end[id]).filter(|&id| a.end[id] <= next_after_peak);
    let live: Vec<usize> = (0..a.start.len()).filter(|&id| eligible(id)).collect();
    let replaces = |id: usize| made_at_peak.is_some_and(|out| a.size[out] == a.size[id] && a.end[out] > a.end[id]);

    let (mut temporaries, mut replaced) = (Vec::new(), Vec::new());
    for id in live {
        let made_during_life = first_from(a.end[id]) - (id + 1);
        let output = !matches!(ops.kind(t, id), None | Some(OpKind::Factory));
        if first_freed == Some(id) && replaces(id) {
            replaced.push(id);
        } else if output && a.start[id] > 0 && (1..=SHORT_LIFE).contains(&made_during_life) {
            temporaries.push(id);
        }
    }
    let sum = |ids: &[usize]| ids.iter().map(|&id| steps::bytes(p, id)).sum::<u64>();
    let (temporary_bytes, replaced_bytes) = (sum(&temporaries), sum(&replaced));
    let bytes = temporary_bytes + replaced_bytes;
    if !s.material(p, bytes, KIND.material) {
        return None;
    }
    let all: Vec<usize> = temporaries.iter().chain(&replaced).copied().collect();
    let peak_bytes = t.summary.peak_allocated_bytes;
    let share = 100.0 * bytes as f64 / peak_bytes.max(1) as f64;
    let title = if replaced_bytes >= temporary_bytes {
        format!(
            "{} of the {} peak ({share:.0}%) is an old value kept while its out-of-place replacement was made (x = f(x)): in place needs no second copy",
            size(bytes),
            size(peak_bytes)
        )
    } else {
        format!("{} of the {} peak ({share:.0}%) are temporaries that one expression needs for a moment", size(bytes), size(peak_bytes))
    };
    let why = "An out-of-place op makes a new tensor while its inputs are still referenced: in `x = x + 1` the old x is freed \
               only when the name moves to the new one, so for a moment both exist; in `(a * b).sum()` the product lives until \
               the sum is made. When that moment is the peak, the temporary sets how much memory the run needs."
        .to_string();
    let fix = "Update in place where autograd allows it (x += 1, x.mul_(2), x.relu_(), torch.add(a, b, out=buf)), fuse the \
               expression (torch.compile, or a fused op such as torch.addcmul), or split the work into chunks so that each \
               temporary is smaller. In-place ops are refused on leaves that require grad and on tensors saved for backward."
        .to_string();
    let evidence = TemporariesEvidence {
        device: p.device,
        position: peak,
        peak_allocated_bytes: peak_bytes,
        temporary_bytes,
        replaced_bytes,
        top_stacks: steps::top_stacks(p, &all, 3),
        allocations: steps::largest(p, &all, 5),
    };
    Some(
        Finding::new(title, bytes, evidence, why, fix).estimate(Some(
            "The bytes are what these temporaries hold at the peak; removing them lowers the peak by at most that much \
             (another moment may then be the peak)."
                .into(),
        )),
    )
}
