//! Replays that measure a fix: the trace under other settings or on a card of a given size,
//! each told as the `tensormem replay` command that gives the same figures.

use super::{DoctorError, Patient, Verified};
use crate::alloc::AllocatorConfig;
use crate::replay::{self, DeviceReplay, KnownStart, ReplayOptions, StartMode};
use crate::trace::{Action, Snapshot, Trace, TraceEntry};

/// Capacities are searched to this resolution: 2 MiB, the granularity of large segments
/// (PyTorch's kRoundLarge).
pub const CAPACITY_RESOLUTION: u64 = 2 << 20;

/// The `max_split_size_mb` values tried as fixes.
const MAX_SPLIT_SIZES_MB: [u64; 3] = [128, 256, 512];

/// The settings the doctor tries as fixes, each on top of the file's: expandable segments where
/// they are off, and a few `max_split_size_mb` values other than the file's.
pub(crate) fn candidate_settings(config: &AllocatorConfig) -> Vec<String> {
    let expandable = (!config.expandable_segments).then(|| "expandable_segments:True".to_string());
    let splits = MAX_SPLIT_SIZES_MB.into_iter().filter(|&mb| config.max_split_size != mb << 20).map(|mb| format!("max_split_size_mb:{mb}"));
    expandable.into_iter().chain(splits).collect()
}

/// One replay's setup: settings on top of the file's, a start, a capacity.
#[derive(Debug, Clone)]
pub struct Setup {
    /// PYTORCH_CUDA_ALLOC_CONF text, applied to the defaults as `--alloc-conf` is.
    pub alloc_conf: String,
    pub start: StartMode,
    pub capacity: Option<u64>,
    /// The patient's start state, for replays of its own trace (an edited one reconstructs its
    /// own); None: each replay reconstructs it.
    pub known_start: Option<KnownStart>,
}

/// One replay's outcome, as the verified figures need it.
#[derive(Debug, Clone, Copy)]
pub struct Outcome {
    pub peak_reserved: u64,
    pub peak_allocated: u64,
    pub out_of_memory: bool,
    pub first_oom_event: Option<usize>,
    /// The largest segment the replay started with or made (`DeviceReplay::largest_segment_bytes`).
    pub largest_segment: u64,
    /// The replay's allocator used expandable segments.
    pub expandable: bool,
}

impl Outcome {
    /// Whether a replay under the same setup with `max_split_size` (bytes) on top decides
    /// exactly as this one did, so that it needs no replay. PyTorch's allocator
    /// (`CUDACachingAllocator.cpp`) reads `max_split_size` only against a request or a block
    /// at least that large: whether a small request may take an oversize block, whether a
    /// large request may take a much larger one, whether a block is split, which cached
    /// blocks an out-of-memory request frees first, and the oversize statistics. Without an
    /// out-of-memory (every request was served from a block, in a segment), a replay whose
    /// segments all stayed below `max_split_size`, and below the setup's own limit
    /// (`current_max_split`), met no such request or block; the other replay, deciding the
    /// same until it meets one, meets none either. Not for expandable segments, whose one
    /// segment grows by mapping.
    pub fn same_under_max_split(&self, max_split_size: u64, current_max_split: u64) -> bool {
        !self.out_of_memory && !self.expandable && self.largest_segment < max_split_size.min(current_max_split)
    }
}

impl Setup {
    /// The file's own settings with `extra` applied after them (`extra` wins).
    pub(crate) fn file_settings_plus(patient: &Patient, extra: &str) -> Result<Setup, DoctorError> {
        let recorded = replay::recorded_config(patient.snapshot)?;
        let base = if recorded.raw.is_empty() { String::new() } else { recorded.raw.clone() };
        let alloc_conf = [base.as_str(), extra].iter().filter(|s| !s.is_empty()).copied().collect::<Vec<_>>().join(",");
        Ok(Setup { alloc_conf, start: patient.what_if_start, capacity: None, known_start: Some(patient.known_start.clone()) })
    }

    pub fn with_capacity(&self, capacity: Option<u64>) -> Setup {
        Setup { capacity, ..self.clone() }
    }

    /// Reserved bytes after `position` events of `snapshot`'s device, replayed under this setup.
    pub fn reserved_at(&self, snapshot: &Snapshot, device: i64, position: usize) -> Result<u64, DoctorError> {
        let r = self.run(snapshot, device, Some(position))?;
        Ok(r.segments.iter().map(|s| s.total_size).sum())
    }

    /// The setup as `tensormem replay` takes it.
    pub fn command(&self, device: i64) -> String {
        let mut command = format!("tensormem replay FILE --device {device}");
        if !self.alloc_conf.is_empty() {
            command.push_str(&format!(" --alloc-conf {}", self.alloc_conf));
        }
        if let Some(c) = self.capacity {
            command.push_str(&format!(" --capacity {c}"));
        }
        if self.start == StartMode::Replaced {
            command.push_str(" --start replaced");
        }
        command.push_str(" --json");
        command
    }

    /// Replays `snapshot`'s device under this setup.
    pub fn replay(&self, snapshot: &Snapshot, device: i64) -> Result<Outcome, DoctorError> {
        let r = self.run(snapshot, device, None)?;
        Ok(Outcome {
            peak_reserved: r.replayed.figures.peak_reserved_bytes,
            peak_allocated: r.replayed.figures.peak_allocated_bytes,
            out_of_memory: r.replayed.ooms > 0,
            first_oom_event: r.first_oom_event,
            largest_segment: r.largest_segment_bytes,
            expandable: r.expandable_segments,
        })
    }

    /// Replays under this setup, up to `until` entries (None: the whole trace).
    fn run(&self, snapshot: &Snapshot, device: i64, until: Option<usize>) -> Result<DeviceReplay, DoctorError> {
        let config = AllocatorConfig::parse(&self.alloc_conf)?;
        let options = ReplayOptions {
            config: Some(config),
            capacity: self.capacity,
            start: self.start,
            until,
            known_start: self.known_start.clone(),
            ..Default::default()
        };
        Ok(replay::replay_device(snapshot, device, &options, &mut |_, _| {})?)
    }

    /// The start in words, for `how`.
    pub fn start_words(&self) -> &'static str {
        match self.start {
            StartMode::Recorded => "from the recorded start",
            StartMode::Replaced => "from the allocations live at the start, placed afresh (the recorded start already reserves every segment)",
            StartMode::Empty => "from nothing (the trace is the whole program)",
        }
    }
}

/// Verified figures: `before` and `after` measured the same way, `after` under `setup`.
/// `command`: whether `setup.command` reproduces `after` (the replayed trace is the file's own).
pub(crate) fn verified(how: String, setup: &Setup, device: i64, before: Outcome, after: Outcome, command: bool) -> Verified {
    Verified {
        how,
        command: command.then(|| setup.command(device)),
        alloc_conf: setup.alloc_conf.clone(),
        start: setup.start.name().into(),
        capacity: setup.capacity,
        before_peak_reserved_bytes: before.peak_reserved,
        after_peak_reserved_bytes: after.peak_reserved,
        before_peak_allocated_bytes: before.peak_allocated,
        after_peak_allocated_bytes: after.peak_allocated,
        before_out_of_memory: before.out_of_memory,
        after_out_of_memory: after.out_of_memory,
    }
}

/// `snapshot` with some of `device`'s allocations freed sooner: each `(alloc, after)` pair moves
/// the free of the allocation made at trace index `alloc` to just after the entry at `after`,
/// the counterfactual of a program that lets go of those tensors there (under no_grad, what a
/// graph would have saved is freed once the next op has read it). An allocation already freed
/// by then, or never freed in the trace (the reconstructed start rests on the trace's frees),
/// keeps its own free. None when no free moves.
pub(crate) fn with_earlier_frees(snapshot: &Snapshot, device: i64, moves: &[(usize, usize)]) -> Option<Snapshot> {
    let trace = snapshot.trace_of(device);
    let moving: rustc_hash::FxHashMap<usize, usize> =
        moves.iter().copied().filter(|&(alloc, _)| trace.get(alloc).is_some_and(|e| e.action == Action::Alloc)).collect();
    // Each moving allocation's free_requested and free_completed, found in one pass over the trace.
    let mut frees: rustc_hash::FxHashMap<usize, (Option<usize>, Option<usize>)> = Default::default();
    let mut live: rustc_hash::FxHashMap<u64, usize> = Default::default();
    for (j, e) in trace.iter().enumerate() {
        match e.action {
            Action::Alloc if moving.contains_key(&j) => drop(live.insert(e.addr, j)),
            Action::FreeRequested => {
                if let Some(&alloc) = live.get(&e.addr) {
                    frees.entry(alloc).or_default().0.get_or_insert(j);
                }
            }
            Action::FreeCompleted => {
                if let Some(alloc) = live.remove(&e.addr) {
                    frees.entry(alloc).or_default().1 = Some(j);
                }
            }
            _ => {}
        }
    }
    let mut dropped = vec![false; trace.len()];
    let mut moved_after: rustc_hash::FxHashMap<usize, Vec<usize>> = Default::default();
    for (&alloc, &after) in &moving {
        let Some(&(Some(requested), completed)) = frees.get(&alloc) else { continue };
        if requested <= after {
            continue;
        }
        dropped[requested] = true;
        if let Some(completed) = completed {
            dropped[completed] = true;
        }
        moved_after.entry(after).or_default().push(alloc);
    }
    if moved_after.is_empty() {
        return None;
    }
    // The frees after one entry in trace order, whatever the maps' order.
    moved_after.values_mut().for_each(|allocs| allocs.sort_unstable());
    let mut edited = Trace::new();
    for (j, e) in trace.iter().enumerate() {
        if !dropped[j] {
            edited.push(e.owned());
        }
        for &alloc in moved_after.get(&j).into_iter().flatten() {
            let free = |action| TraceEntry { action, time_us: e.time_us, frames: None, category: None, extra: None, ..trace.at(alloc).owned() };
            edited.extend([free(Action::FreeRequested), free(Action::FreeCompleted)]);
        }
    }
    let mut snapshot = snapshot.clone();
    snapshot.device_traces[device as usize] = edited;
    Some(snapshot)
}

/// The outcome of `setting` on top of the file's settings, with its setup: replayed, or
/// `before` (`as_recorded`) where the setting only sets a `max_split_size` that nothing in the
/// replay reached (`Outcome::same_under_max_split`: the same decisions, without a replay).
pub(crate) fn candidate_outcome(p: &Patient, setting: &str, before: Outcome) -> Result<(Setup, Outcome), DoctorError> {
    let setup = Setup::file_settings_plus(p, setting)?;
    if setting.starts_with("max_split_size_mb:") {
        let own = AllocatorConfig::parse(&Setup::file_settings_plus(p, "")?.alloc_conf)?.max_split_size;
        if before.same_under_max_split(AllocatorConfig::parse(&setup.alloc_conf)?.max_split_size, own) {
            return Ok((setup, before));
        }
    }
    let outcome = setup.replay(p.snapshot, p.device)?;
    Ok((setup, outcome))
}

/// The file's trace replayed under its own settings from the what-if start: the before side of
/// every what-if, replayed once per diagnosis.
pub(crate) fn as_recorded(p: &Patient) -> Result<Outcome, DoctorError> {
    if let Some(&outcome) = p.as_recorded.get() {
        return Ok(outcome);
    }
    let outcome = Setup::file_settings_plus(p, "")?.replay(p.snapshot, p.device)?;
    Ok(*p.as_recorded.get_or_init(|| outcome))
}

/// The trace replayed under its own settings as recorded (`as_recorded`) and with the frees of
/// `with_earlier_frees(moves)`; `how` says where they moved. None where replay cannot tell:
/// nothing moves (an allocation held to the trace's end keeps its place: the start is rebuilt
/// from the trace's frees), or a replay fails.
pub(crate) fn freed_sooner(p: &Patient, moves: &[(usize, usize)], how: &str) -> Option<Verified> {
    let edited = with_earlier_frees(p.snapshot, p.device, moves)?;
    let setup = Setup::file_settings_plus(p, "").ok()?;
    let (before, after) = (as_recorded(p).ok()?, setup.replay(&edited, p.device).ok()?);
    Some(verified(how.to_string(), &setup, p.device, before, after, false))
}
