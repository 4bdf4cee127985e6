//! `oom`: a trace that records an out-of-memory error, or one that runs out when replayed on a
//! card of `--capacity`: the request, what was live, the smallest capacity that fits (searched
//! by replay) and whether expandable segments avoid it.

use super::Material;
use super::kinds::{Kind, Role};
use super::what_if::{CAPACITY_RESOLUTION, Outcome, Setup, candidate_settings, verified};
use super::{DoctorError, Finding, OOM, Patient, Verified, live, size};
use crate::replay;
use crate::trace::{Action, Snapshot, TraceEntry};
use serde::{Deserialize, Serialize};
use std::borrow::Cow;

#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct OomEvidence {
    pub device: i64,
    /// The trace entry that failed: the `oom` entry, or the `alloc` that failed in the replay
    /// (None: the allocations live at the start alone did not fit).
    pub event: Option<usize>,
    /// `recorded` (the file has an `oom` entry) or `replayed` (at the capacity asked for).
    pub source: Cow<'static, str>,
    pub request_bytes: u64,
    /// Only for a recorded OOM: what cudaMemGetInfo reported free.
    pub device_free_bytes: Option<u64>,
    /// PyTorch's reserved bytes just before the failure: as recorded, or in the replay at the
    /// capacity.
    pub reserved_bytes: u64,
    /// The capacity checked: given, or estimated (see the finding's `estimate`).
    pub capacity_bytes: Option<u64>,
    pub capacity_estimated: bool,
    /// The replay at that capacity runs out of memory too.
    pub reproduced_by_replay: Option<bool>,
    pub smallest_capacity_bytes: u64,
    pub capacity_resolution_bytes: u64,
    pub live: live::Live,
}

pub(super) const KIND: Kind = Kind {
    name: OOM,
    label: "out of memory",
    about: "an out-of-memory error, recorded or replayed, and the capacity that fits",
    role: Role::Problem,
    find: |x| find(&x.patient, x.options.capacity),
    material: Material::ANY,
};

pub(super) fn find(p: &Patient, capacity: Option<u64>) -> Result<Option<Finding>, DoctorError> {
    match p.stopped_by_oom() {
        Some(k) => recorded(p, k, capacity).map(Some),
        None => match capacity {
            Some(capacity) => replayed(p, capacity),
            None => Ok(None),
        },
    }
}

/// The file records an OOM at entry `k`. Its request never became an `alloc` entry, so the
/// replays that look for a capacity replay the trace with it added.
fn recorded(p: &Patient, k: usize, capacity: Option<u64>) -> Result<Finding, DoctorError> {
    let entry = p.snapshot.trace_of(p.device).at(k);
    // Reserved at position k: after the entries before the OOM.
    let reserved = p.timeline.curves(p.snapshot.trace_of(p.device)).nth(k).map_or(0, |at| at.reserved);
    let device_free = entry.device_free();
    let estimated = capacity.is_none();
    let capacity = capacity.or(device_free.map(|free| reserved.saturating_add(free)));
    let with_request = with_failed_request(p.snapshot, p.device, k);
    let setup = Setup::file_settings_plus(p, "")?;
    let smallest = smallest_fitting_capacity(&with_request, p.device, &setup)?;
    let at_capacity = capacity.map(|c| setup.with_capacity(Some(c)).replay(&with_request, p.device)).transpose()?;

    let facts = Facts {
        event: Some(k),
        source: "recorded",
        request: entry.size,
        device_free,
        reserved,
        capacity,
        capacity_estimated: estimated && capacity.is_some(),
        at_capacity,
        smallest,
    };
    let mut estimate = format!(
        "The smallest capacity counts PyTorch's own memory only, and assumes the failed request of {} is freed right after it \
         is made (the trace cannot say how long it would have lived).",
        size(entry.size)
    );
    if facts.capacity_estimated {
        estimate = format!(
            "The card's capacity is not in the snapshot: {} is an estimate, PyTorch's reserved bytes at the failure ({}, from \
             the trace) plus the free bytes the oom entry records ({}); memory outside PyTorch (the CUDA context, other \
             processes) is not in it. {estimate}",
            size(capacity.unwrap_or(0)),
            size(reserved),
            size(device_free.unwrap_or(0))
        );
    }
    facts.finding(p, &with_request, false, Some(estimate))
}

/// No OOM in the file: replayed on a card of `capacity`, does the trace fit?
fn replayed(p: &Patient, capacity: u64) -> Result<Option<Finding>, DoctorError> {
    let setup = Setup::file_settings_plus(p, "")?;
    let outcome = setup.with_capacity(Some(capacity)).replay(p.snapshot, p.device)?;
    if !outcome.out_of_memory {
        return Ok(None);
    }
    let trace = p.snapshot.trace_of(p.device);
    let event = outcome.first_oom_event;
    let request = match event {
        Some(i) => trace.at(i).size,
        None => p.timeline.summary.start_allocated_bytes,
    };
    let facts = Facts {
        event,
        source: "replayed",
        request,
        device_free: None,
        reserved: setup.with_capacity(Some(capacity)).reserved_at(p.snapshot, p.device, event.unwrap_or(0))?,
        capacity: Some(capacity),
        capacity_estimated: false,
        at_capacity: Some(outcome),
        smallest: smallest_fitting_capacity(p.snapshot, p.device, &setup)?,
    };
    let estimate = (setup.start == replay::StartMode::Replaced).then(|| {
        "The replays start from the allocations live at the trace's start, placed afresh: memory PyTorch had cached before \
         the trace is not counted."
            .to_string()
    });
    facts.finding(p, p.snapshot, true, estimate).map(Some)
}

/// What both kinds of OOM report.
struct Facts {
    event: Option<usize>,
    source: &'static str,
    request: u64,
    device_free: Option<u64>,
    reserved: u64,
    capacity: Option<u64>,
    capacity_estimated: bool,
    /// The replay at `capacity` (file settings).
    at_capacity: Option<Outcome>,
    smallest: u64,
}

impl Facts {
    /// `replayed` is the trace the replays ran (the file's, or it with the failed request
    /// added); `own_trace`: it is the file's, so `tensormem replay` reproduces the figures.
    fn finding(self, p: &Patient, replayed: &Snapshot, own_trace: bool, estimate: Option<String>) -> Result<Finding, DoctorError> {
        let live = live::at(&p.timeline, self.event.unwrap_or(0));
        let recorded_config = replay::recorded_config(p.snapshot)?;
        let tried = candidate_settings(&recorded_config);
        let (verified, avoided_by) = self.verify(p, replayed, own_trace, &tried)?;
        let at = self.event.map_or("at the start of the trace".to_string(), |i| format!("at event {i}"));
        let free = self.device_free.map(|f| format!(" with {} free", size(f))).unwrap_or_default();
        // What it needs, against what it had (reserved plus what the device still had free: the
        // card less what CUDA and other processes hold), so that the figure is not read as a
        // card size it already had.
        let need = match self.capacity {
            Some(had) if self.smallest > had => format!(
                "this trace needs at least {} for PyTorch, {} more than the {} it had (found by replay)",
                size(self.smallest),
                size(self.smallest - had),
                size(had)
            ),
            _ => format!("this trace needs at least {} for PyTorch (found by replay)", size(self.smallest)),
        };
        let title = format!("Out of memory {at}: a request of {}{free} failed; {need}", size(self.request));
        let why = format!(
            "PyTorch asked for {} more while {} was reserved, and the device could not give it: the allocator had already \
             released its unused cached blocks and retried, so the memory was held by live tensors ({} of them requested {} at \
             that moment; the largest groups: {}).",
            size(self.request),
            size(self.reserved),
            live.allocations,
            size(live.bytes),
            live.largest_groups(3)
        );
        let capacity = self.capacity.map(size).unwrap_or_else(|| "the card".into());
        // A trace that ends at the failure cannot say whether the rest of the run would fit.
        let trace = p.snapshot.trace_of(p.device);
        let ends_there = self.event.is_some_and(|k| !trace.range(k..).any(|e| e.action == Action::Alloc));
        let rest = if ends_there { " (the trace ends at the failure: whether the rest of the run fits is not recorded)" } else { "" };
        let fix = match &avoided_by {
            Some(setting) => format!("Set PYTORCH_CUDA_ALLOC_CONF={setting}: replayed with it, the trace fits in {capacity}{rest}."),
            None => {
                let settings = match self.capacity {
                    Some(_) if !tried.is_empty() => format!(" (none of {} avoids it at this capacity, by replay)", tried.join(", ")),
                    _ => String::new(),
                };
                let expandable = if recorded_config.expandable_segments { " (expandable_segments is already on)" } else { "" };
                format!(
                    "Give PyTorch at least {} of device memory{expandable}{settings}{rest}{}, or lower what is live at the failure: \
                     a smaller batch, activation checkpointing, or freeing the largest group above before this point.",
                    size(self.smallest),
                    smallest_card(self.smallest)
                )
            }
        };
        let evidence = OomEvidence {
            device: p.device,
            event: self.event,
            source: self.source.into(),
            request_bytes: self.request,
            device_free_bytes: self.device_free,
            reserved_bytes: self.reserved,
            capacity_bytes: self.capacity,
            capacity_estimated: self.capacity_estimated,
            reproduced_by_replay: self.at_capacity.map(|o| o.out_of_memory),
            smallest_capacity_bytes: self.smallest,
            capacity_resolution_bytes: CAPACITY_RESOLUTION,
            live,
        };
        Ok(Finding::new(title, self.request, evidence, why, fix).verified(verified).estimate(estimate))
    }

    /// The fix measured at the capacity that failed: the setting (of those the doctor tries)
    /// that avoids the failure and reserves the least, else the smallest capacity. Returns the
    /// verified figures, the setting that avoids it (if one does) and the settings tried.
    fn verify(&self, p: &Patient, replayed: &Snapshot, own_trace: bool, tried: &[String]) -> Result<(Option<Verified>, Option<String>), DoctorError> {
        let (Some(capacity), Some(before)) = (self.capacity, self.at_capacity) else { return Ok((None, None)) };
        let added = if own_trace { "" } else { " with the failed request added" };
        let mut avoiding: Option<(Verified, String)> = None;
        for setting in tried {
            let setup = Setup::file_settings_plus(p, setting)?.with_capacity(Some(capacity));
            let after = setup.replay(replayed, p.device)?;
            if !after.out_of_memory && avoiding.as_ref().is_none_or(|(v, _)| after.peak_reserved < v.after_peak_reserved_bytes) {
                let how = format!("replay of the trace{added} at {} with {setting}, {}", size(capacity), setup.start_words());
                avoiding = Some((verified(how, &setup, p.device, before, after, own_trace), setting.clone()));
            }
        }
        if let Some((v, setting)) = avoiding {
            return Ok((Some(v), Some(setting)));
        }
        let setup = Setup::file_settings_plus(p, "")?.with_capacity(Some(self.smallest));
        let after = setup.replay(replayed, p.device)?;
        let how = format!(
            "replay of the trace{added} at {} (the smallest capacity that fits, to {}) against {}, {}",
            size(self.smallest),
            size(CAPACITY_RESOLUTION),
            size(capacity),
            setup.start_words()
        );
        Ok((Some(verified(how, &setup, p.device, before, after, own_trace)), None))
    }
}

/// Which card holds `bytes` for PyTorch beside the CUDA context, as a clause of the fix.
fn smallest_card(bytes: u64) -> String {
    let context = super::outside::CONTEXT_TYPICAL;
    match crate::cards::smallest_cuda_card(bytes, context) {
        Some((name, total)) => {
            format!("; the smallest card that holds it beside the CUDA context (~{}): {name} ({} as PyTorch reports it)", size(context), size(total))
        }
        None => format!("; no single NVIDIA card tensormem knows holds it beside the CUDA context (~{}): shard it over several", size(context)),
    }
}

/// The snapshot with the request that failed at trace entry `oom_index` made there (in the
/// entry's place), and freed right after (its lifetime is unknown), on that device: the trace
/// as it would have run had the request fitted.
pub fn with_failed_request(snapshot: &Snapshot, device: i64, oom_index: usize) -> Snapshot {
    let mut copy = snapshot.clone();
    let Some(trace) = usize::try_from(device).ok().and_then(|d| copy.device_traces.get_mut(d)) else { return copy };
    let Some(oom) = trace.get(oom_index).map(|e| e.owned()) else { return copy };
    // An address no segment or entry of the file uses, so the replay never confuses it.
    let highest = snapshot
        .segments
        .iter()
        .map(|s| s.address.saturating_add(s.total_size))
        .chain(snapshot.device_traces.iter().flatten().map(|e| e.addr.saturating_add(e.size)))
        .max()
        .unwrap_or(0);
    let addr = highest.saturating_add(1 << 21) & !((1 << 21) - 1);
    let entry =
        |action| TraceEntry { action, addr, size: oom.size, stream: oom.stream, time_us: oom.time_us, frames: oom.frames.clone(), category: None, extra: None };
    let made = [entry(Action::Alloc), entry(Action::FreeRequested), entry(Action::FreeCompleted)];
    // In place of the oom entry, which a replay at a capacity would ask for a second time.
    *trace = trace.range(..oom_index).map(|e| e.owned()).chain(made).chain(trace.range(oom_index + 1..).map(|e| e.owned())).collect();
    copy
}

/// The smallest capacity, a multiple of [`CAPACITY_RESOLUTION`], at which `snapshot`'s device
/// replays under `setup` without running out of memory: one step less does not fit (both
/// replayed). A search, from the replay's own peaks: below its peak allocated nothing fits, at
/// its peak reserved everything does.
pub fn smallest_fitting_capacity(snapshot: &Snapshot, device: i64, setup: &Setup) -> Result<u64, DoctorError> {
    let unlimited = setup.with_capacity(None).replay(snapshot, device)?;
    if unlimited.peak_allocated == 0 {
        return Ok(0);
    }
    let fits =
        |steps: u64| -> Result<bool, DoctorError> { Ok(!setup.with_capacity(Some(steps * CAPACITY_RESOLUTION)).replay(snapshot, device)?.out_of_memory) };
    // In steps of the resolution: `low` does not fit, `high` does.
    let mut low = (unlimited.peak_allocated - 1) / CAPACITY_RESOLUTION;
    let mut high = unlimited.peak_reserved.div_ceil(CAPACITY_RESOLUTION).max(low + 1);
    // A replay that never exceeded its peak fits under it; should a decision differ, widen.
    let mut widened = 0;
    while !fits(high)? {
        if widened == 8 {
            return Err(DoctorError::NoCapacityFits(size(high * CAPACITY_RESOLUTION)));
        }
        (low, high, widened) = (high, high * 2, widened + 1);
    }
    while high - low > 1 {
        let mid = low + (high - low) / 2;
        if fits(mid)? { high = mid } else { low = mid }
    }
    Ok(high * CAPACITY_RESOLUTION)
}
