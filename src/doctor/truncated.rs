//! `truncated-trace`: the trace starts with memory already reserved, so part of what the device
//! holds has no recorded origin.

use super::Material;
use super::kinds::{Kind, Role};
use super::{Finding, Patient, TRUNCATED_TRACE, size};
use crate::timeline::GroupKind;
use serde::{Deserialize, Serialize};

#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct TruncatedTraceEvidence {
    pub device: i64,
    pub events: usize,
    pub start_reserved_bytes: u64,
    pub start_allocated_bytes: u64,
    /// Allocations live at the start (their `alloc` entries are not in the trace).
    pub start_allocations: usize,
    /// Of those, the ones whose blocks carry no stack (nothing says where they came from).
    pub start_allocations_without_stack: usize,
    pub suggested_max_entries: u64,
}

pub(super) const KIND: Kind = Kind {
    name: TRUNCATED_TRACE,
    label: "truncated trace",
    about: "memory that predates the trace",
    role: Role::Problem,
    find: |x| Ok(find(&x.patient)),
    material: Material::ANY,
};

pub(super) fn find(p: &Patient) -> Option<Finding> {
    let s = &p.timeline.summary;
    if s.start_reserved_bytes == 0 || s.events == 0 {
        return None;
    }
    let a = &p.timeline.allocations;
    let at_start: Vec<usize> = (0..a.start.len()).filter(|&id| a.start[id] == 0).collect();
    let without_stack = at_start.iter().filter(|&&id| p.timeline.groups[a.group[id] as usize].kind == GroupKind::BeforeTrace).count();
    let suggested = suggested_max_entries(s.events, at_start.len());
    let title = format!(
        "The trace starts mid-run: {} reserved and {} allocated before its first event have no recorded origin",
        size(s.start_reserved_bytes),
        size(s.start_allocated_bytes)
    );
    let why = "PyTorch keeps only the last max_entries events of _record_memory_history, and records nothing before the call: \
               this trace begins with memory already in use, so where that memory came from (the model, the optimizer state, \
               an earlier step) is not in it. Figures about the start are rebuilt from the final state by undoing the trace."
        .to_string();
    // PyTorch 2.0 and 2.1 wrote files without times or settings, and took the size under an
    // older keyword (later versions read it too).
    let old = p.snapshot.allocator_settings.is_none() && p.snapshot.trace_of(p.device).times().all(|t| t.is_none());
    let call = if old {
        format!(
            "torch.cuda.memory._record_memory_history(True, trace_alloc_max_entries={suggested}, trace_alloc_record_context=True) \
             (this file is in PyTorch 2.0/2.1's format, whose keywords these are; from 2.2 on: max_entries={suggested})"
        )
    } else {
        format!("torch.cuda.memory._record_memory_history(max_entries={suggested})")
    };
    let fix = format!("Start recording before the model is built, with room for the whole run: {call} (this trace has {} entries)", s.events);
    Some(
        Finding::new(
            title,
            s.start_reserved_bytes,
            TruncatedTraceEvidence {
                device: p.device,
                events: s.events,
                start_reserved_bytes: s.start_reserved_bytes,
                start_allocated_bytes: s.start_allocated_bytes,
                start_allocations: at_start.len(),
                start_allocations_without_stack: without_stack,
                suggested_max_entries: suggested,
            },
            why,
            fix,
        )
        .estimate(Some(format!(
            "max_entries={suggested} is an estimate: twice this trace's {} entries plus three entries (alloc, free_requested, \
             free_completed) for each of the {} allocations live at its start, rounded up; a longer run before the trace needs more",
            s.events,
            at_start.len()
        ))),
    )
}

/// Twice the trace plus three entries per allocation that predates it, rounded up to 1, 2 or 5
/// times a power of ten.
fn suggested_max_entries(events: usize, live_at_start: usize) -> u64 {
    let needed = 2 * events as u64 + 3 * live_at_start as u64;
    let mut power = 1u64;
    loop {
        for step in [1, 2, 5] {
            let candidate = power.saturating_mul(step);
            if candidate >= needed {
                return candidate;
            }
        }
        power = power.saturating_mul(10);
    }
}
