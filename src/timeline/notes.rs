//! What the page tells its user about a trace: the warnings above the timeline and the text of
//! its out-of-memory markers. Kept apart from the layout so the prose reads as a whole.

use super::stacking::Lifetimes;
use crate::alloc::format_size;
use crate::trace::{Entry, Totals, Trace};

/// An out-of-memory entry (event `i`): its marker's text, and the warning that points at it.
pub(super) fn out_of_memory(i: usize, e: Entry<'_>) -> (String, String) {
    let free = e.device_free().map(|f| format!(" with {} free on the device", format_size(f))).unwrap_or_default();
    let text = format!("out of memory: {} requested{free}", format_size(e.size));
    let warning = format!("This trace records an out-of-memory error at event {i}: {text}. The marker on the timeline shows where.");
    (text, warning)
}

/// Adds the warnings about the trace as a whole to those found while laying it out (the start
/// state's and the out-of-memory errors): first whether it starts mid-run, then whether it adds
/// up, then what it lacks.
pub(super) fn trace_warnings(warnings: &mut Vec<String>, start: Totals, trace: &Trace, stacked: &Lifetimes, any_frames: bool) {
    if start.reserved > 0 && !trace.is_empty() {
        warnings.insert(
            0,
            format!(
                "The trace does not start at the beginning: {} were already reserved and {} allocated when it starts (the ring buffer of _record_memory_history dropped older events, or recording began mid-run). Record with a larger max_entries, e.g. torch.cuda.memory._record_memory_history(max_entries=1_000_000), to see where that memory came from.",
                format_size(start.reserved),
                format_size(start.allocated)
            ),
        );
    }
    if stacked.reused_without_free + stacked.unknown_frees > 0 {
        warnings.push(format!(
            "The trace does not add up ({} address(es) allocated again without a recorded free, {} free(s) of addresses never allocated): it was edited or truncated, so the bands and the allocated curve can disagree.",
            stacked.reused_without_free, stacked.unknown_frees
        ));
    }
    if trace.is_empty() {
        warnings.push("This snapshot has no trace for this device (recorded without _record_memory_history): only its final state is shown.".into());
    } else if !any_frames {
        warnings.push(
            "No trace entry has stack frames: the snapshot was recorded with context=None (or stacks='python' without frames); record with _record_memory_history(context='all') to see where memory came from.".into(),
        );
    }
}

/// The warning for bands sampled every `step` positions (exact pieces would have passed the
/// budget: many allocations freed beneath live ones).
pub(super) fn sampled_bands(step: u32) -> String {
    format!(
        "Many allocations are freed beneath live ones (oldest first), so drawing every band exactly would take more than {} million rectangles: the bands are drawn at their true heights every {step} events and held in between. The curves, sizes and lifetimes are exact.",
        super::stacking::PIECE_BUDGET / 1_000_000
    )
}
