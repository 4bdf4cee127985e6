//! `missing-no-grad`: forward passes whose saved tensors are never used, because no backward
//! follows: what each forward still holds when the next one starts (or the trace ends), less its
//! last allocation (its result, which no_grad keeps too). The trace must show that autograd was
//! on: in PyTorch's traces an autograd kernel or `autograd.Function` on the forward's stacks
//! (`torch::autograd::VariableType::`, `torch/autograd/function.py`, which `torch.compile`'s
//! training graphs run under); in tensormem's, a model (parameters) whose forward keeps memory.

use super::steps::{self, Phase, Steps};
use super::{AllocationRef, Finding, MISSING_NO_GRAD, Patient, StackBytes, size};
use crate::trace::{Category, Frame};
use serde::Serialize;

/// Held bytes worth reporting: this share of the peak...
const MATERIAL_SHARE: f64 = 0.05;
/// ...and at least this many bytes.
const MATERIAL_BYTES: u64 = 1 << 20;

#[derive(Serialize)]
struct Evidence {
    #[serde(flatten)]
    iterations: steps::IterationsEvidence,
    /// What tells that autograd was on.
    grad_mode_evidence: String,
    /// Per forward: bytes it still holds when the next one starts (or the trace ends).
    held_per_iteration: Vec<u64>,
    /// The forward holding the most, and the position it is measured at.
    worst_iteration: usize,
    position: u32,
    top_stacks: Vec<StackBytes>,
    allocations: Vec<AllocationRef>,
}

pub(super) fn find(p: &Patient, s: &Steps) -> Option<Finding> {
    if s.has_backward || s.iterations.is_empty() {
        return None;
    }
    let grad_mode_evidence = grad_mode(p, s)?;
    let a = &p.timeline.allocations;
    let events = p.timeline.events;
    let mut by_iteration: Vec<Vec<usize>> = vec![Vec::new(); s.iterations.len() + 1];
    for &id in &s.order {
        if s.phase[id] == Some(Phase::Forward) && a.start[id] > 0 && !steps::is_library_buffer(p, id) {
            by_iteration[s.iteration_of(a.start[id])].push(id);
        }
    }
    let mut held_per_iteration = Vec::new();
    let mut worst: (u64, usize, u32, Vec<usize>) = (0, 0, 0, Vec::new());
    for (k, made) in by_iteration.iter().enumerate().skip(1) {
        let at = s.iteration_end(k, events);
        let Some(&result) = made.last() else {
            held_per_iteration.push(0);
            continue;
        };
        let held: Vec<usize> = made.iter().copied().filter(|&id| id != result && steps::live_at(p, id, at)).collect();
        let bytes: u64 = held.iter().map(|&id| steps::bytes(p, id)).sum();
        held_per_iteration.push(bytes);
        if bytes > worst.0 {
            worst = (bytes, k, at, held);
        }
    }
    let (bytes, k, position, held) = worst;
    if !steps::material(p, bytes, MATERIAL_SHARE, MATERIAL_BYTES) {
        return None;
    }
    let top_stacks = steps::top_stacks(p, &held, 3);
    let n = s.iterations.len();
    let title =
        format!("{} forward pass{} with autograd on and no backward: {} saved for a backward that never comes", n, if n > 1 { "es" } else { "" }, size(bytes));
    let when = if (position as usize) < events { format!("when the next forward starts (position {position})") } else { "when the trace ends".to_string() };
    let why = format!(
        "With grad mode on, every op records a node and keeps what its backward would need (the activations of every \
         layer) for as long as its result lives. The trace has no backward: forward {k} still holds {} of its own tensors \
         {when}, besides its result. Under torch.no_grad() each of them is freed as soon as the next op has used it.",
        size(bytes)
    );
    let fix = "Run evaluation and inference under `with torch.no_grad():` (or `torch.inference_mode()`, or decorate the \
               function with @torch.no_grad()); model.eval() alone does not turn autograd off."
        .to_string();
    let evidence = Evidence {
        iterations: s.evidence(p),
        grad_mode_evidence,
        held_per_iteration,
        worst_iteration: k,
        position,
        allocations: steps::largest(p, &held, 5),
        top_stacks,
    };
    Some(Finding {
        kind: MISSING_NO_GRAD.into(),
        title,
        bytes,
        evidence: serde_json::to_value(evidence).unwrap_or_default(),
        why,
        fix,
        verified: None,
        estimate: Some(format!(
            "What no_grad would not hold rests on the forward's last allocation being its result (kept either way) and \
             everything else it still holds being saved for backward.{}",
            if position as usize >= events {
                " It is measured where the trace ends: if the recording stopped before a backward that did run, the graph \
                 was needed."
            } else {
                ""
            }
        )),
    })
}

/// What shows that autograd was on during the forward; None when nothing does.
fn grad_mode(p: &Patient, s: &Steps) -> Option<String> {
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
