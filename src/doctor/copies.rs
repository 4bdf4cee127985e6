//! `copies`: tensors copied into another layout (`clone`, `contiguous`, a `reshape` that no
//! strides express, `repeat`, `expand(...).contiguous()`), live at the peak. A view (`view`,
//! `t()`, `narrow`, `expand`, a reshape of a contiguous tensor) shares its base's storage and
//! costs nothing; a copy costs its whole size. dtype casts (`.to()`, autocast) are not counted,
//! nor are the copies backward and the optimizer make (the autograd engine's, not the program's).

use super::Material;
use super::kinds::{Kind, Role};
use super::ops::{OpKind, Ops};
use super::steps::{self, Phase, Steps};
use super::{AllocationRef, COPIES, Finding, Patient, StackBytes, size};
use serde::{Deserialize, Serialize};

#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct CopiesEvidence {
    pub device: i64,
    /// The peak (the state after this many trace entries).
    pub position: u32,
    pub peak_allocated_bytes: u64,
    /// Copies live at the peak, by op.
    pub at_peak_by_op: Vec<OpBytes>,
    /// Every copy the trace made, by op.
    pub made_by_op: Vec<OpBytes>,
    pub top_stacks: Vec<StackBytes>,
    pub allocations: Vec<AllocationRef>,
}

#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct OpBytes {
    pub op: String,
    pub bytes: u64,
    pub allocations: usize,
}

fn by_op(p: &Patient, ops: &Ops, ids: &[usize]) -> Vec<OpBytes> {
    let mut out: Vec<OpBytes> = Vec::new();
    for &id in ids {
        let op = ops.name(&p.timeline, id).unwrap_or("?");
        match out.iter_mut().find(|o| o.op == op) {
            Some(o) => {
                o.bytes += steps::bytes(p, id);
                o.allocations += 1;
            }
            None => out.push(OpBytes { op: op.to_string(), bytes: steps::bytes(p, id), allocations: 1 }),
        }
    }
    out.sort_by(|x, y| y.bytes.cmp(&x.bytes).then_with(|| x.op.cmp(&y.op)));
    out
}

/// Bytes worth reporting: this share of the peak...
/// ...and at least this many bytes.
pub(super) const KIND: Kind = Kind {
    name: COPIES,
    label: "copies",
    about: "copies in another layout at the peak, where views cost nothing",
    role: Role::Problem,
    find: |x| Ok(find(&x.patient, &x.steps, &x.ops)),
    material: Material { share: 0.10, min_bytes: 64 << 10 },
};

pub(super) fn find(p: &Patient, s: &Steps, ops: &Ops) -> Option<Finding> {
    let t = &p.timeline;
    let peak = t.summary.peak_x;
    let copies: Vec<usize> = (0..t.allocations.start.len())
        .filter(|&id| ops.kind(t, id) == Some(OpKind::Copy) && !matches!(s.phase[id], Some(Phase::Backward | Phase::Optimizer)))
        .collect();
    let at_peak: Vec<usize> = copies.iter().copied().filter(|&id| steps::live_at(p, id, peak)).collect();
    let bytes: u64 = at_peak.iter().map(|&id| steps::bytes(p, id)).sum();
    if !s.material(p, bytes, KIND.material) {
        return None;
    }
    let peak_bytes = t.summary.peak_allocated_bytes;
    let at_peak_by_op = by_op(p, ops, &at_peak);
    let op_names: Vec<String> = at_peak_by_op.iter().map(|o| format!("{}()", o.op)).collect();
    let title = format!(
        "{} of the {} peak ({:.0}%) are {} {} made by {}: a view would share the storage instead",
        size(bytes),
        size(peak_bytes),
        100.0 * bytes as f64 / peak_bytes.max(1) as f64,
        at_peak.len(),
        if at_peak.len() == 1 { "copy" } else { "copies" },
        op_names.join(", ")
    );
    let why = "view(), t(), transpose(), narrow(), expand() and the reshape of a contiguous tensor return views: new shapes and \
               strides over the same storage, +0 bytes. clone() always copies; contiguous() copies a non-contiguous tensor; \
               reshape() copies when no strides express the result (t().reshape(-1)); repeat() and expand().contiguous() \
               materialise a broadcast; some ops (a batched matmul of a permuted operand) copy their input into a layout \
               the kernel needs. Each copy costs the tensor's full size while it lives."
        .to_string();
    let fix = "Keep views where the next op accepts them: broadcast instead of expand().contiguous() or repeat() (x + y reads \
               y with stride 0), drop a clone() whose original is not modified afterwards, use view()/transpose() and let \
               the consuming op read the strides, and free the original (del x) as soon as a needed copy exists."
        .to_string();
    let evidence = CopiesEvidence {
        device: p.device,
        position: peak,
        peak_allocated_bytes: peak_bytes,
        at_peak_by_op,
        made_by_op: by_op(p, ops, &copies),
        top_stacks: steps::top_stacks(p, &at_peak, 3),
        allocations: steps::largest(p, &at_peak, 5),
    };
    Some(Finding::new(title, bytes, evidence, why, fix))
}
