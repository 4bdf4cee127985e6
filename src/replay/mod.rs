//! Replay: rebuild a trace's starting state, feed its events through our allocator, and compare
//! our decisions with the ones PyTorch recorded.
//!
//! Per device: the start state comes from undoing the trace from the final segments
//! (`reconstruct`). Then every alloc / free_requested / free_completed goes through the allocator,
//! on its stream. Two facts of real traces shape the loop: CUDA hands out segment addresses in no
//! fixed order (best fit breaks ties by address), so a new segment takes the recorded address when
//! the sizes agree; and a burst of segment_free (or segment_unmap) is a full cache release (a
//! user's empty_cache and the flush after a failed cudaMalloc look alike), replayed as one.

mod pools;
mod reconstruct;
mod run;
use run::Run;

pub use reconstruct::{StartState, start_state};

use crate::alloc::{AllocatorConfig, ConfigError};
use crate::report;
use crate::trace::{self, Action, Snapshot, Totals, Trace};
use serde::Serialize;
use std::collections::BTreeMap;

/// How to replay: the file's own settings unless overridden, on a device of unlimited size
/// unless a capacity is given.
#[derive(Debug, Clone, Default)]
pub struct ReplayOptions {
    /// Settings to use instead of the file's `allocator_settings`.
    pub config: Option<AllocatorConfig>,
    /// Device memory in bytes; None: as much as the trace needs.
    pub capacity: Option<u64>,
    pub start: StartMode,
    /// Also record reserved bytes at every position (for drawing).
    pub curves: bool,
    /// Keep the replayed trace (with the recorded stacks) to write it as a snapshot.
    pub keep_snapshot: bool,
    /// Stop after this many trace entries (the state at a cursor); None: the whole trace.
    pub until: Option<usize>,
    /// New segments go where the simulated driver puts them, not at the recorded addresses: the
    /// segment decisions still agreeing is what shows the address model right.
    pub own_addresses: bool,
    /// The start state already reconstructed for this trace; ignored if made for another device
    /// or another snapshot in memory (see [`KnownStart`]).
    pub known_start: Option<KnownStart>,
}

/// A start state reconstructed once, for the replays of one trace to share: the doctor replays a
/// trace under many settings, and reconstructing its start costs about a third of each replay.
/// It knows its trace by device and by where the snapshot's trace and segments lie in memory: a
/// copy of the snapshot (edited or not) is another trace and reconstructs its own. The contract
/// is the holder's: keep it only while that snapshot lives unchanged (the doctor holds it for
/// one diagnosis of a borrowed snapshot; the page's `LoadedTrace` never changes its snapshot).
#[derive(Debug, Clone)]
pub struct KnownStart {
    device: i64,
    /// Where the trace's entries and the snapshot's segments were, and how many.
    trace: (usize, usize),
    segments: (usize, usize),
    state: std::sync::Arc<StartState>,
    /// The trace's recorded figures from this start, once a replay has counted them: the same
    /// for every replay of the trace (a diagnosis replays it several times).
    recorded: std::sync::Arc<std::sync::OnceLock<Figures>>,
}

/// Which reconstruction made a start kept beside a decode ([`trace::cache::KeptStart`]): a hash
/// of the sources its rules come from as compiled (the undoing, the recorded settings, the
/// allocator's rounding and constants), so that a start kept by another version of them is
/// reconstructed again rather than trusted.
pub const START_RULES: u64 = {
    let sources: [&[u8]; 5] = [
        include_bytes!("reconstruct.rs"),
        include_bytes!("mod.rs"),
        include_bytes!("../alloc/caching.rs"),
        include_bytes!("../alloc/config.rs"),
        include_bytes!("../alloc/constants.rs"),
    ];
    // FNV-1a, in a const block.
    let mut hash: u64 = 0xcbf2_9ce4_8422_2325;
    let mut s = 0;
    while s < sources.len() {
        let mut i = 0;
        while i < sources[s].len() {
            hash = (hash ^ sources[s][i] as u64).wrapping_mul(0x0100_0000_01b3);
            i += 1;
        }
        s += 1;
    }
    hash
};

impl KnownStart {
    /// `device`'s start, reconstructed under the settings the snapshot was recorded with.
    pub fn of(snapshot: &Snapshot, device: i64) -> Result<KnownStart, ReplayError> {
        check_device(snapshot, device)?;
        let final_segments: Vec<&trace::Segment> = snapshot.segments_of(device).collect();
        let state = start_state(&final_segments, snapshot.trace_of(device), &recorded_config(snapshot)?);
        Ok(KnownStart {
            device,
            trace: Self::trace_of(snapshot, device),
            segments: Self::segments_of(snapshot),
            state: state.into(),
            recorded: Default::default(),
        })
    }

    fn trace_of(snapshot: &Snapshot, device: i64) -> (usize, usize) {
        let trace = snapshot.trace_of(device);
        (trace.actions().as_ptr() as usize, trace.len())
    }

    fn segments_of(snapshot: &Snapshot) -> (usize, usize) {
        (snapshot.segments.as_ptr() as usize, snapshot.segments.len())
    }

    /// A start kept beside `snapshot`'s decode, if it is one of its devices' and made by these
    /// rules (see [`START_RULES`]).
    pub fn from_kept(snapshot: &Snapshot, kept: trace::cache::KeptStart) -> Option<KnownStart> {
        let ours = kept.rules == START_RULES && snapshot.devices().contains(&kept.device);
        ours.then(|| KnownStart {
            device: kept.device,
            trace: Self::trace_of(snapshot, kept.device),
            segments: Self::segments_of(snapshot),
            state: StartState { segments: kept.segments, warnings: kept.warnings }.into(),
            recorded: Default::default(),
        })
    }

    /// This start, to keep beside its snapshot's decode.
    pub fn to_kept(&self) -> trace::cache::KeptStart {
        trace::cache::KeptStart { device: self.device, rules: START_RULES, segments: self.state.segments.clone(), warnings: self.state.warnings.clone() }
    }

    /// Each device's start, as kept beside `snapshot`'s decode (those made by other rules left
    /// out: they are reconstructed when asked for).
    pub fn all_kept(snapshot: &Snapshot, kept: Vec<trace::cache::KeptStart>) -> Vec<KnownStart> {
        kept.into_iter().filter_map(|k| KnownStart::from_kept(snapshot, k)).collect()
    }

    pub fn device(&self) -> i64 {
        self.device
    }

    /// The start state, if this is the start of `snapshot`'s `device`.
    pub fn of_trace(&self, snapshot: &Snapshot, device: i64) -> Option<&StartState> {
        let same = self.device == device && self.trace == Self::trace_of(snapshot, device) && self.segments == Self::segments_of(snapshot);
        same.then_some(&*self.state)
    }
}

/// Which state the replay starts from.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq, Serialize)]
#[serde(rename_all = "lowercase")]
pub enum StartMode {
    /// The recorded segments and blocks at the start of the trace, as PyTorch had them. Exact, but
    /// a trace recorded after warm-up then starts with every segment it will need already
    /// reserved, so other settings or a smaller card change nothing.
    #[default]
    Recorded,
    /// Only the allocations live at the start, placed afresh by the allocator under the replay's
    /// settings (in address order); cached free blocks are not carried over.
    Replaced,
    /// Nothing: the trace is a whole program, every allocation made by its own events (a trace
    /// `predict` synthesized). Its segment_free entries are cache releases only.
    Empty,
}

impl StartMode {
    pub fn parse(text: &str) -> Result<StartMode, String> {
        match text {
            "" | "recorded" => Ok(StartMode::Recorded),
            "replaced" => Ok(StartMode::Replaced),
            other => Err(format!("unknown start {other:?}: use recorded or replaced")),
        }
    }

    /// As `--start` and the JSON name it: `recorded`, `replaced`, `empty`.
    pub fn name(self) -> &'static str {
        match self {
            StartMode::Recorded => "recorded",
            StartMode::Replaced => "replaced",
            StartMode::Empty => "empty",
        }
    }
}

#[derive(Debug, thiserror::Error)]
pub enum ReplayError {
    #[error("the snapshot's allocator_settings are unusable: {0}")]
    Settings(#[from] ConfigError),
    #[error("device {0} has neither segments nor a trace in this snapshot (devices present: {1})")]
    NoSuchDevice(i64, String),
    #[error("the snapshot cannot be replayed: {0}")]
    Layout(String),
}

/// Segment and peak figures of one side of the comparison.
#[derive(Debug, Clone, Default, PartialEq, Eq, Serialize)]
pub struct Figures {
    pub segment_allocs: usize,
    pub segment_frees: usize,
    pub segment_maps: usize,
    pub segment_unmaps: usize,
    pub peak_reserved_bytes: u64,
    pub peak_allocated_bytes: u64,
}

#[derive(Debug, Clone, Serialize)]
pub struct Replayed {
    #[serde(flatten)]
    pub figures: Figures,
    pub ooms: usize,
    pub memory_stats: BTreeMap<String, i64>,
}

/// Where our allocator first decided differently from PyTorch.
#[derive(Debug, Clone, PartialEq, Eq, Serialize)]
pub struct Divergence {
    /// Index of the trace entry.
    pub event: usize,
    pub reason: String,
}

/// An out-of-memory PyTorch recorded (a trace entry `oom`): its request failed there, after the
/// allocator had freed its cache.
#[derive(Debug, Clone, PartialEq, Eq, Serialize)]
pub struct RecordedOom {
    pub event: usize,
    pub request_bytes: u64,
    /// The driver's free memory the entry records.
    pub device_free_bytes: Option<u64>,
    /// Reserved bytes in the replay when it met the entry (PyTorch's, where the replay agrees).
    pub reserved_bytes: u64,
    /// The card as PyTorch saw it then: reserved plus the free memory the entry records (what
    /// memory outside PyTorch took is not in it). `--capacity` with it reproduces the failure.
    pub capacity_estimate_bytes: Option<u64>,
}

/// The outcome for one device.
#[derive(Debug, Clone, Serialize)]
pub struct DeviceReplay {
    pub device: i64,
    pub events: usize,
    pub settings: String,
    pub expandable_segments: bool,
    pub capacity: Option<u64>,
    /// Reserved and allocated bytes at the start of the trace (reconstructed).
    pub start_reserved_bytes: u64,
    pub start_allocated_bytes: u64,
    pub recorded: Figures,
    pub replayed: Replayed,
    /// Fraction of recorded device allocations (segment_alloc / segment_map) reproduced in order
    /// with the same size.
    pub segment_alloc_match: f64,
    /// Fraction of allocs that got the recorded address.
    pub address_match: f64,
    /// Our final segments and blocks equal the snapshot's.
    pub final_state_match: bool,
    pub first_divergence: Option<Divergence>,
    /// Index of the first trace entry whose allocation ran out of memory in the replay.
    pub first_oom_event: Option<usize>,
    /// That allocation's error, in PyTorch's words.
    #[serde(skip)]
    pub first_oom_message: Option<String>,
    /// The first out-of-memory the trace records (an `oom` entry), as the replay met it.
    pub recorded_oom: Option<RecordedOom>,
    /// Where the recorded trace did not add up (a truncated or edited file).
    pub warnings: Vec<String>,
    pub start: StartMode,
    /// The start state itself did not fit the capacity: the run was out of memory before its
    /// first event.
    pub out_of_memory_at_start: Option<String>,
    /// memory_summary of our final state.
    #[serde(skip)]
    pub summary: String,
    /// Reserved bytes at each position (0: the start, i + 1: after event i), when asked for.
    #[serde(skip)]
    pub reserved_curve: Vec<f64>,
    /// The replayed trace and final state, when asked for.
    #[serde(skip)]
    pub snapshot: Option<Snapshot>,
    /// Trace entries replayed (all of them, or where `until` stopped it).
    pub events_replayed: usize,
    /// The allocator's segments where the replay stopped.
    #[serde(skip)]
    pub segments: Vec<trace::Segment>,
    /// The largest segment the replay started with or made (cudaMalloc; an expandable
    /// segment's maps are not segments): no setting about sizes above it changed a decision.
    #[serde(skip)]
    pub largest_segment_bytes: u64,
}

/// The allocator settings a snapshot was recorded with (defaults for files without them).
pub fn recorded_config(snapshot: &Snapshot) -> Result<AllocatorConfig, ConfigError> {
    match &snapshot.allocator_settings {
        Some(settings) => AllocatorConfig::from_snapshot_settings(settings),
        None => Ok(AllocatorConfig::default()),
    }
}

/// The device must have segments or a trace in the snapshot; the error lists those that do.
pub fn check_device(snapshot: &Snapshot, device: i64) -> Result<(), ReplayError> {
    let devices = snapshot.devices();
    if devices.contains(&device) {
        return Ok(());
    }
    let list = devices.iter().map(i64::to_string).collect::<Vec<_>>().join(", ");
    Err(ReplayError::NoSuchDevice(device, if list.is_empty() { "none".into() } else { list }))
}

/// Replays every device that has a trace or segments.
pub fn replay_snapshot(snapshot: &Snapshot, options: &ReplayOptions, progress: &mut dyn FnMut(usize, usize)) -> Result<Vec<DeviceReplay>, ReplayError> {
    snapshot.devices().into_iter().map(|d| replay_device(snapshot, d, options, progress)).collect()
}

/// Replays one device. `progress(done, total)` is called every few thousand events.
pub fn replay_device(snapshot: &Snapshot, device: i64, options: &ReplayOptions, progress: &mut dyn FnMut(usize, usize)) -> Result<DeviceReplay, ReplayError> {
    check_device(snapshot, device)?;
    snapshot.check_layout().map_err(ReplayError::Layout)?;
    let recorded_config = recorded_config(snapshot)?;
    let config = options.config.clone().unwrap_or_else(|| recorded_config.clone());
    let trace = snapshot.trace_of(device);
    let final_segments: Vec<&trace::Segment> = snapshot.segments_of(device).collect();
    // Reconstruct with the rules the trace was recorded under.
    let known = options.known_start.as_ref().filter(|known| options.start != StartMode::Empty && known.of_trace(snapshot, device).is_some());
    // Whether the entries name their pools (newer PyTorch) and the highest address the trace
    // names (the replay's own segments go above it): looked for while the start is
    // reconstructed, a pass over the trace of its own.
    let trace_facts = || {
        let (mut pools, mut highest) = (false, 0u64);
        for e in trace {
            pools |= e.pool_id().is_some();
            highest = highest.max(e.addr.saturating_add(e.size));
        }
        (pools, highest)
    };
    let start = || match known {
        _ if options.start == StartMode::Empty => StartState::default(),
        Some(known) => (*known.state).clone(),
        None => start_state(&final_segments, trace, &recorded_config),
    };
    // Two passes over a long trace at once (a thread costs more than a short one's passes).
    let long = trace.len() >= 1 << 16;
    let (start, (pools_named, highest)) = crate::threads::join(long, start, trace_facts);
    let start_totals = Totals::of_segments(&start.segments);
    let mut warnings = start.warnings.clone();
    // Where the entries do not name their pools, the final segments tell those of many.
    let inferred_pools = if pools_named { Default::default() } else { pools::PrivateRanges::of(trace, &final_segments) };

    let (mut run, out_of_memory_at_start) = Run::set_up(trace, highest, &final_segments, &start, &config, device, options, &mut warnings);
    run.inferred_pools = inferred_pools;
    let start_reserved = run.alloc.reserved();
    let start_allocated = run.alloc.stats().allocated_bytes.all().current as u64;
    let largest_at_start = run.alloc.segments().iter().map(|s| s.total_size).max().unwrap_or(0);
    // What the trace alone shows is counted while it is replayed (a pass of its own).
    let recorded = || match known {
        Some(known) => known.recorded.get_or_init(|| recorded_figures(trace, start_totals)).clone(),
        None => recorded_figures(trace, start_totals),
    };
    let ((replayed_to, reserved_curve), recorded) = crate::threads::join(long, || run.play(options.curves, progress), recorded);
    let largest_made = run.ours.device_allocs.iter().filter(|(action, _)| *action == Action::SegmentAlloc).map(|&(_, size)| size).max().unwrap_or(0);

    let segments = run.alloc.segments();
    let reached_end = replayed_to >= trace.len();
    let final_state_match = reached_end && same_layout(&segments, &final_segments);
    let mut first_divergence = run.divergence.clone();
    // Stopped early (`until`), the final state is not compared, so nothing diverged there.
    if first_divergence.is_none() && reached_end && !final_state_match {
        first_divergence = Some(Divergence { event: trace.len(), reason: "final segments differ from the snapshot's".into() });
    }
    Ok(DeviceReplay {
        device,
        events: trace.len(),
        settings: config.to_string(),
        expandable_segments: config.expandable_segments,
        capacity: options.capacity,
        start_reserved_bytes: start_reserved,
        start_allocated_bytes: start_allocated,
        recorded,
        replayed: run.replayed(),
        segment_alloc_match: run.segment_alloc_match(),
        address_match: ratio(run.address_hits, run.allocs),
        final_state_match,
        first_divergence,
        first_oom_event: run.first_oom_event,
        first_oom_message: run.first_oom_message.take(),
        recorded_oom: run.recorded_oom.take(),
        warnings,
        start: options.start,
        out_of_memory_at_start,
        summary: report::memory_summary(run.alloc.stats(), device, false),
        reserved_curve,
        snapshot: options.keep_snapshot.then(|| run.alloc.snapshot()),
        // A segment the trace records before the alloc that caused it is only made by that
        // alloc: stopped in between, the state is the one before the segment event.
        events_replayed: run.pending_since.unwrap_or(replayed_to),
        segments,
        largest_segment_bytes: largest_at_start.max(largest_made),
    })
}

fn ratio(a: usize, b: usize) -> f64 {
    if b == 0 { 1.0 } else { a as f64 / b as f64 }
}

/// What the trace alone shows: segment events and peaks, from the reconstructed start. Allocated
/// bytes here are requested sizes (as MemoryViz's timeline draws them), counted as the page's
/// curves count them ([`Totals::apply`]).
/// One pass over the trace: a 4 M entry trace's two passes took a tenth of each replay.
fn recorded_figures(trace: &Trace, start: Totals) -> Figures {
    let mut at = start;
    let mut f = Figures { peak_reserved_bytes: at.reserved, peak_allocated_bytes: at.allocated, ..Figures::default() };
    for e in trace {
        match e.action {
            Action::SegmentAlloc => f.segment_allocs += 1,
            Action::SegmentFree => f.segment_frees += 1,
            Action::SegmentMap => f.segment_maps += 1,
            Action::SegmentUnmap => f.segment_unmaps += 1,
            _ => {}
        }
        at.apply(e.action, e.size);
        f.peak_reserved_bytes = f.peak_reserved_bytes.max(at.reserved);
        f.peak_allocated_bytes = f.peak_allocated_bytes.max(at.allocated);
    }
    f
}

/// Segments and blocks agree in address, size, pool kind (small or large), owning pool, stream
/// and state.
fn same_layout(ours: &[trace::Segment], theirs: &[&trace::Segment]) -> bool {
    let key = |s: &trace::Segment| {
        (
            s.address,
            s.total_size,
            s.segment_type,
            s.segment_pool_id,
            s.stream,
            s.is_expandable,
            s.blocks.iter().map(|b| (b.address, b.size, b.state)).collect::<Vec<_>>(),
        )
    };
    let mut theirs: Vec<_> = theirs.iter().map(|s| key(s)).collect();
    theirs.sort_by_key(|k| k.0);
    ours.len() == theirs.len() && ours.iter().map(key).eq(theirs)
}
