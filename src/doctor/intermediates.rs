//! `intermediates` (information, given when the doctor finds no problem): what the peak is made
//! of by the op that made each allocation: tensors the program asked for (`randn`, `zeros`,
//! `empty`: its data) and the outputs of operations (intermediates: `a + b` makes exactly one,
//! a matmul its output and nothing else) apart from cuBLAS's workspaces, which a thread's first
//! matmul makes once. The stacks must name ops (tensormem's, or PyTorch's C++ frames);
//! Python-only stacks give no finding.

use super::Material;
use super::kinds::{Kind, Role};
use super::ops::{OpKind, Ops};
use super::steps;
use super::{AllocationRef, Finding, INTERMEDIATES, Patient, size};
use serde::{Deserialize, Serialize};

/// Ops named in the title at most.
const NAMED: usize = 3;

#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct IntermediatesEvidence {
    pub device: i64,
    /// The peak (the state after this many trace entries).
    pub position: u32,
    pub peak_allocated_bytes: u64,
    /// Operations' outputs live at the peak, by op.
    pub outputs_by_op: Vec<(String, u64)>,
    /// Tensors the program made (factories, and memory from before the trace), by op.
    pub data_by_op: Vec<(String, u64)>,
    /// Live at the peak, made by no op the stacks name.
    pub unnamed_bytes: u64,
    /// cuBLAS's (and cuBLASLt's) workspaces live at the peak: made once per thread, not tensors.
    pub workspace_bytes: u64,
    pub allocations: Vec<AllocationRef>,
}

fn add(groups: &mut Vec<(String, u64)>, op: &str, bytes: u64) {
    match groups.iter_mut().find(|(name, _)| name == op) {
        Some(g) => g.1 += bytes,
        None => groups.push((op.to_string(), bytes)),
    }
}

fn named(groups: &[(String, u64)]) -> String {
    groups.iter().take(NAMED).map(|(op, bytes)| format!("{op} {}", size(*bytes))).collect::<Vec<_>>().join(", ")
}

pub(super) const KIND: Kind = Kind {
    name: INTERMEDIATES,
    label: "intermediates",
    about: "the peak by op, when nothing is wrong",
    role: Role::WhenNoProblem,
    find: |x| Ok(find(&x.patient, &x.ops)),
    material: Material::ANY,
};

pub(super) fn find(p: &Patient, ops: &Ops) -> Option<Finding> {
    let t = &p.timeline;
    let peak = t.summary.peak_x;
    let live: Vec<usize> = (0..t.allocations.start.len()).filter(|&id| steps::live_at(p, id, peak)).collect();
    let (mut outputs, mut data, mut unnamed, mut workspace_bytes) = (Vec::new(), Vec::new(), 0, 0);
    for &id in &live {
        let bytes = steps::bytes(p, id);
        if steps::is_library_buffer(p, id) {
            workspace_bytes += bytes;
            continue;
        }
        match (ops.name(t, id), ops.kind(t, id)) {
            (Some(op), Some(OpKind::Factory)) => add(&mut data, op, bytes),
            (Some(op), Some(_)) => add(&mut outputs, op, bytes),
            _ => unnamed += bytes,
        }
    }
    if outputs.is_empty() && data.is_empty() {
        return None;
    }
    outputs.sort_by(|x, y| y.1.cmp(&x.1).then_with(|| x.0.cmp(&y.0)));
    data.sort_by(|x, y| y.1.cmp(&x.1).then_with(|| x.0.cmp(&y.0)));
    let output_bytes: u64 = outputs.iter().map(|o| o.1).sum();
    let data_bytes: u64 = data.iter().map(|o| o.1).sum();
    let mut parts = Vec::new();
    if !outputs.is_empty() {
        parts.push(format!("{} are operations' outputs ({})", size(output_bytes), named(&outputs)));
    }
    if !data.is_empty() {
        parts.push(format!("{} tensors the program made ({})", size(data_bytes), named(&data)));
    }
    if workspace_bytes > 0 {
        parts.push(format!("{} cuBLAS's workspaces", size(workspace_bytes)));
    }
    let title = format!("No hidden temporary at the peak: {}", parts.join(" and "));
    let why = "Each operation allocates its output and, for most ops, nothing else: a + b makes exactly one tensor the size \
               of the result, a matmul its output (and, the first time on a thread, cuBLAS's workspace, kept to the end), an \
               in-place op (add_) none. What the peak holds \
               is therefore the tensors your names still reference: the inputs you made and the results you kept."
        .to_string();
    let fix = "Nothing is wrong here. To lower the peak, release results you no longer need (del, or let them go out of \
               scope) before the next large op, and use in-place ops where autograd allows them."
        .to_string();
    let evidence = IntermediatesEvidence {
        device: p.device,
        position: peak,
        peak_allocated_bytes: t.summary.peak_allocated_bytes,
        outputs_by_op: outputs,
        data_by_op: data,
        unnamed_bytes: unnamed,
        workspace_bytes,
        allocations: steps::largest(p, &live, 5),
    };
    Some(Finding::new(title, output_bytes, evidence, why, fix))
}
