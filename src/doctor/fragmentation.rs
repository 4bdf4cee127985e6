//! `fragmentation`: reserved memory above what the tensors asked for, at the peak of reserved;
//! how much is rounding inside live blocks and how much is cached free blocks; and what
//! `expandable_segments:True` or a `max_split_size_mb` would reserve instead, each by replay
//! (the best one is the finding's `verified`, all of them are in its evidence). Its bytes are
//! what the best setting recovers: a gap no setting closes is cache the program reuses, not a
//! problem a change would fix, and is not reported.

use super::Material;
use super::kinds::{Kind, Role};
use super::what_if::{Outcome, as_recorded, candidate_outcome, candidate_settings, verified};
use super::{DoctorError, FRAGMENTATION, Finding, FindingConfidence, Patient, Verified, size};
use crate::replay::{self, ReplayOptions};
use crate::trace::BlockState;
use serde::{Deserialize, Serialize};

#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct FragmentationEvidence {
    pub device: i64,
    /// The position examined: among those at the peak of reserved, the one with the most
    /// allocated (the gap no moment at that peak closes).
    pub position: usize,
    pub reserved_bytes: u64,
    /// Whole blocks of live allocations (`memory_allocated()`).
    pub allocated_bytes: u64,
    /// What the live tensors asked for.
    pub requested_bytes: u64,
    /// Rounding inside live blocks: block size minus requested size.
    pub internal_bytes: u64,
    /// Free blocks cached in reserved segments.
    pub external_bytes: u64,
    pub free_blocks: usize,
    pub largest_free_block_bytes: u64,
    /// Every setting tried, by replay.
    pub what_ifs: Vec<Verified>,
}

/// The allocator's state at one position, from a replay stopped there.
struct State {
    reserved: u64,
    allocated: u64,
    requested: u64,
    free_blocks: usize,
    largest_free_block: u64,
}

/// What a setting recovers, worth reporting: at least this share of the peak reserved, and at
/// least one large segment's worth (PyTorch's kLargeBuffer).
pub(super) const KIND: Kind = Kind {
    name: FRAGMENTATION,
    label: "fragmentation",
    about: "reserved above allocated that an allocator setting recovers, by replay",
    role: Role::Problem,
    find: |x| find(&x.patient),
    material: Material { share: 0.05, min_bytes: 20 << 20 },
};

pub(super) fn find(p: &Patient) -> Result<Option<Finding>, DoctorError> {
    let Some(position) = position_at_peak_reserved(p) else { return Ok(None) };
    let state = state_at(p, position)?;
    let waste = state.reserved.saturating_sub(state.requested);
    // What a setting recovers is part of the gap: a gap below the threshold needs no replay.
    if !KIND.material.holds(waste, state.reserved) {
        return Ok(None);
    }
    let (internal, external) = (state.allocated.saturating_sub(state.requested), state.reserved.saturating_sub(state.allocated));

    // The file's own settings (the before side, replayed once for every finder), then each
    // candidate: independent replays.
    let before = as_recorded(p)?;
    let settings = candidate_settings(&replay::recorded_config(p.snapshot)?);
    // Natively on a thread each (a 1 M-entry trace takes a quarter of a second a replay).
    let outcomes = crate::threads::each(&settings, |setting| candidate_outcome(p, setting, before));
    let what_ifs = settings
        .iter()
        .zip(outcomes)
        .map(|(setting, outcome)| {
            let (setup, after) = outcome?;
            Ok(verified(format!("replay with {setting}, {}", setup.start_words()), &setup, p.device, before, after, true))
        })
        .collect::<Result<Vec<_>, DoctorError>>()?;
    let Some(best) = what_ifs.iter().filter(|v| !v.after_out_of_memory).min_by_key(|v| v.after_peak_reserved_bytes).cloned() else { return Ok(None) };
    let recovered = best.before_peak_reserved_bytes.saturating_sub(best.after_peak_reserved_bytes);
    if !KIND.material.holds(recovered, best.before_peak_reserved_bytes) {
        return Ok(None);
    }
    Ok(Some(finding(p, position, &state, internal, external, before, what_ifs, best)))
}

#[allow(clippy::too_many_arguments)]
fn finding(p: &Patient, position: usize, state: &State, internal: u64, external: u64, before: Outcome, what_ifs: Vec<Verified>, best: Verified) -> Finding {
    let recovered = best.before_peak_reserved_bytes.saturating_sub(best.after_peak_reserved_bytes);
    let gap = format!("Reserved is {} above allocated at its peak ({} cached free, {} rounding)", size(internal + external), size(external), size(internal));
    let title = format!("{gap}: {} would reserve {} less", best.alloc_conf, size(recovered));
    let fix = format!(
        "Set PYTORCH_CUDA_ALLOC_CONF={} before the first CUDA allocation (or torch.cuda.memory._set_allocator_settings): \
         replayed with it, peak reserved is {} instead of {}.",
        best.alloc_conf,
        size(best.after_peak_reserved_bytes),
        size(best.before_peak_reserved_bytes)
    );
    let why = format!(
        "PyTorch's caching allocator keeps freed blocks reserved to reuse them, and splits cached segments to serve smaller \
         requests; when later requests do not fit the free pieces, it reserves new segments while {} sits free in {} cached \
         blocks (the largest {}). Rounding every request up to the allocator's block sizes adds {} more.",
        size(external),
        state.free_blocks,
        size(state.largest_free_block),
        size(internal)
    );
    let evidence = FragmentationEvidence {
        device: p.device,
        position,
        reserved_bytes: state.reserved,
        allocated_bytes: state.allocated,
        requested_bytes: state.requested,
        internal_bytes: internal,
        external_bytes: external,
        free_blocks: state.free_blocks,
        largest_free_block_bytes: state.largest_free_block,
        what_ifs,
    };
    let estimate = (p.what_if_start == replay::StartMode::Replaced).then(|| {
        format!(
            "The what-ifs replay from the allocations live at the trace's start, placed afresh (the recorded start already \
             reserves every segment, so settings would change nothing): their before figure, {} reserved at the peak, is that \
             replay's, not the file's.",
            size(before.peak_reserved)
        )
    });
    let finding = Finding::new(title, recovered, evidence, why, fix).verified(Some(best));
    match estimate {
        // The replays cannot start from the recorded state: their figures are another start's.
        Some(e) => finding
            .confidence(FindingConfidence::Medium, "the trace starts mid-run; the replays place what was live at its start afresh".into())
            .estimate(Some(e)),
        None => finding,
    }
}

/// Among the positions where reserved is at its peak, the one with the most allocated.
/// The first such position where several hold as much.
fn position_at_peak_reserved(p: &Patient) -> Option<usize> {
    let trace = p.snapshot.trace_of(p.device);
    let mut best: Option<(usize, u64, u64)> = None;
    for (x, at) in p.timeline.curves(trace).enumerate() {
        if best.is_none_or(|(_, reserved, allocated)| (at.reserved, at.allocated) > (reserved, allocated)) {
            best = Some((x, at.reserved, at.allocated));
        }
    }
    best.filter(|&(_, reserved, _)| reserved > 0).map(|(x, _, _)| x)
}

/// The recorded allocator state after `position` events (a replay with the file's settings from
/// the recorded start, stopped there).
fn state_at(p: &Patient, position: usize) -> Result<State, DoctorError> {
    let options = ReplayOptions { until: Some(position), known_start: Some(p.known_start.clone()), ..Default::default() };
    let r = replay::replay_device(p.snapshot, p.device, &options, &mut |_, _| {})?;
    let blocks = || r.segments.iter().flat_map(|s| &s.blocks);
    let active = || blocks().filter(|b| b.state.is_active());
    let free = || blocks().filter(|b| b.state == BlockState::Inactive);
    Ok(State {
        reserved: r.segments.iter().map(|s| s.total_size).sum(),
        allocated: active().map(|b| b.size).sum(),
        requested: active().map(|b| b.requested_size).sum(),
        free_blocks: free().count(),
        largest_free_block: free().map(|b| b.size).max().unwrap_or(0),
    })
}
