//! The doctor: reads one device's trace and says what is wrong with its memory, with the
//! evidence, the fix, how sure it is, and (wherever a replay can measure it) what the fix saves.
//!
//! The data flows top to bottom: pick the device, lay its trace out once (`timeline`), read its
//! training loop once (`steps`: the phase of each allocation from its frames or tensormem's
//! categories, the passes, the iterations, the buffers made once) and the op of each allocation
//! (`ops`), then run each row of the registry (`kinds`: one per finding kind, its finder, its
//! threshold). `peak` says what the peak is made of; the problems are `truncated` (memory that
//! predates the trace), `oom` (a recorded or replayed out-of-memory, and the capacity that fits,
//! searched by replay), `fragmentation` (what an allocator setting recovers, verified by
//! replay), those about the training loop: `growth` (memory each iteration keeps), `retained`
//! (`retained-graph`: forward tensors alive past their backward), `no_grad`
//! (`missing-no-grad`: forwards that keep a graph no backward uses, read from the lifetimes),
//! `grads` (`grads-kept`: gradients alive through the next forward) and `optimizer`
//! (`optimizer-state`), and those about single expressions: `temporaries` (an out-of-place op's
//! inputs at the peak), `copies` (clone, contiguous at the peak) and, when nothing else is
//! found, `intermediates` (the peak by op); `outside` (`outside-allocator`, always last) says
//! what nvidia-smi shows beyond reserved. `live` describes what is live at a position;
//! `what_if` runs the replays. The doctor sits below scenarios (docs/layers.md): it knows only
//! snapshots, and diagnoses a scenario's as it does a user's file.

mod categories;
mod copies;
pub mod evidence;
mod fragmentation;
mod grads;
mod growth;
mod intermediates;
mod kept;
mod kinds;
mod live;
mod no_grad;
mod no_history;
mod oom;
mod ops;
mod optimizer;
mod outside;
mod peak;
mod pools;
mod retained;
mod steps;
mod temporaries;
mod truncated;
mod what_if;

pub use categories::{CATEGORIES, Confidence, Inferred, InferredAllocation, UNKNOWN, grouping, infer, infer_categories, infer_codes};
pub use evidence::Evidence;
pub use kinds::{Kind, Role};
pub use live::{AllocationRef, GroupBytes, Live, StackBytes, frames_shown};
pub use oom::{smallest_fitting_capacity, with_failed_request};
pub use steps::entry_phase;
pub use what_if::{CAPACITY_RESOLUTION, Outcome, Setup};

use crate::alloc::ConfigError;
use crate::replay::{self, ReplayError, StartMode};
use crate::timeline;
use crate::trace::Snapshot;
use serde::{Deserialize, Serialize};
use std::borrow::Cow;

/// Kinds of finding (a contract: the page and outside checks read them).
pub const PEAK: &str = "peak";
/// A snapshot taken without `_record_memory_history()`: the state at the end, no history.
pub const NO_HISTORY: &str = "no-history";
pub const FRAGMENTATION: &str = "fragmentation";
pub const OOM: &str = "oom";
pub const TRUNCATED_TRACE: &str = "truncated-trace";
pub const GROWTH: &str = "growth";
pub const RETAINED_GRAPH: &str = "retained-graph";
pub const MISSING_NO_GRAD: &str = "missing-no-grad";
pub const GRADS_KEPT: &str = "grads-kept";
pub const OPTIMIZER_STATE: &str = "optimizer-state";
/// Memory CUDA graphs' and MemPools' own pools hold, which no other allocation can use.
pub const PRIVATE_POOLS: &str = "private-pools";
/// Blocks made inside module forwards, alive at the end of a file without history.
pub const KEPT_ACTIVATIONS: &str = "kept-activations";
/// Memory at the peak that one expression needs for a moment (an out-of-place op's inputs).
pub const TEMPORARIES: &str = "temporaries";
/// Copies in another layout (clone, contiguous, reshape) at the peak, where views cost nothing.
pub const COPIES: &str = "copies";
/// Information, only when no problem is found: the peak by the op that made each allocation.
pub const INTERMEDIATES: &str = "intermediates";
/// Information rather than a problem: always reported, last.
pub const OUTSIDE_ALLOCATOR: &str = "outside-allocator";

/// The registry: every kind, one row each (see [`kinds`]), those about the training loop first,
/// then the allocator's, then those about single expressions.
pub const REGISTRY: [&Kind; 16] = [
    &no_history::KIND,
    &peak::KIND,
    &growth::KIND,
    &retained::KIND,
    &no_grad::KIND,
    &grads::KIND,
    &optimizer::KIND,
    &kept::KIND,
    &fragmentation::KIND,
    &pools::KIND,
    &oom::KIND,
    &truncated::KIND,
    &outside::KIND,
    &temporaries::KIND,
    &copies::KIND,
    &intermediates::KIND,
];

/// Every kind's name, in the registry's order.
pub const KINDS: [&str; REGISTRY.len()] = {
    let mut names = [""; REGISTRY.len()];
    let mut i = 0;
    while i < names.len() {
        names[i] = REGISTRY[i].name;
        i += 1;
    }
    names
};

/// The registry's row of `kind`.
pub fn kind(name: &str) -> Option<&'static Kind> {
    REGISTRY.into_iter().find(|k| k.name == name)
}

/// What the doctor found: `no-history` where nothing was recorded, the `peak` summary (with `intermediates` when there is no
/// problem), then the problems (an `oom` first, the others most bytes first, `truncated-trace` last of them), then the inconclusive findings (what the
/// trace cannot tell), then `outside-allocator` (information, estimated: ranked last whatever
/// its bytes).
#[derive(Debug, Clone, Default, PartialEq, Serialize, Deserialize)]
pub struct Diagnosis {
    pub findings: Vec<Finding>,
    /// What the trace cannot show, said once (a file whose stacks name no op cannot show
    /// temporaries or copies).
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub notes: Vec<String>,
}

#[derive(Debug, Clone, PartialEq, Serialize)]
pub struct Finding {
    /// A stable name: one of [`KINDS`].
    pub kind: String,
    /// Its label, as the page shows it (the registry's).
    pub label: String,
    /// One line in plain words, with the figure.
    pub title: String,
    /// Bytes at stake.
    pub bytes: u64,
    /// What the finding rests on: trace positions, addresses, stacks, bytes per group; its
    /// kind's type (see [`evidence`]).
    pub evidence: Evidence,
    /// Two or three sentences a learner understands.
    pub why: String,
    /// The code or setting to change.
    pub fix: String,
    /// The fix's effect, measured by replay.
    pub verified: Option<Verified>,
    /// Which figures are estimates, and what they rest on.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub estimate: Option<String>,
    /// How sure the doctor is that the finding holds (see [`FindingConfidence`]).
    pub confidence: FindingConfidence,
    /// Why it is not `high`: what the trace lacks to tell.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub confidence_reason: Option<String>,
}

impl<'de> Deserialize<'de> for Finding {
    /// As `doctor --json` writes it: the evidence is read as its kind's type (so a kind this
    /// version does not know is an error). A field absent or null is its default where the
    /// field has one (the label, the confidence, the options): what is written here decides.
    fn deserialize<D: serde::Deserializer<'de>>(deserializer: D) -> Result<Finding, D::Error> {
        use serde::de::{DeserializeOwned, Error};
        let mut json = serde_json::Map::deserialize(deserializer)?;
        // A field absent (or null) is its default where it has one: as the derive's `default`.
        let mut field = |name: &str| json.remove(name).unwrap_or_default();
        fn read<T: DeserializeOwned, E: Error>(name: &str, value: serde_json::Value) -> Result<T, E> {
            serde_json::from_value(value).map_err(|e| E::custom(format!("a finding's {name}: {e}")))
        }
        fn or_default<T: DeserializeOwned + Default, E: Error>(name: &str, value: serde_json::Value) -> Result<T, E> {
            if value.is_null() { Ok(T::default()) } else { read(name, value) }
        }
        let kind: String = read("kind", field("kind"))?;
        Ok(Finding {
            evidence: Evidence::from_json(&kind, field("evidence")).map_err(D::Error::custom)?,
            kind,
            label: or_default("label", field("label"))?,
            title: read("title", field("title"))?,
            bytes: read("bytes", field("bytes"))?,
            why: read("why", field("why"))?,
            fix: read("fix", field("fix"))?,
            verified: read("verified", field("verified"))?,
            estimate: read("estimate", field("estimate"))?,
            confidence: or_default("confidence", field("confidence"))?,
            confidence_reason: read("confidence_reason", field("confidence_reason"))?,
        })
    }
}

/// How sure a finding is (a contract: `high`, `medium`, `inconclusive`). An inconclusive finding
/// says what the trace cannot tell; it is listed apart, after the problems, and never ranked
/// among them.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "lowercase")]
pub enum FindingConfidence {
    #[default]
    High,
    Medium,
    Inconclusive,
}

impl Finding {
    /// The one way findings are made: what every kind has; the rest is added by the methods below.
    pub(crate) fn new(title: String, bytes: u64, evidence: impl Into<Evidence>, why: String, fix: String) -> Finding {
        let evidence = evidence.into();
        let kind = evidence.kind();
        Finding {
            kind: kind.to_string(),
            label: self::kind(kind).map_or(kind, |k| k.label).to_string(),
            title,
            bytes,
            evidence,
            why,
            fix,
            verified: None,
            estimate: None,
            confidence: FindingConfidence::High,
            confidence_reason: None,
        }
    }

    pub(crate) fn verified(mut self, verified: Option<Verified>) -> Finding {
        self.verified = verified;
        self
    }

    pub(crate) fn estimate(mut self, estimate: Option<String>) -> Finding {
        self.estimate = estimate;
        self
    }

    /// Less than `high`, and why.
    pub(crate) fn confidence(mut self, confidence: FindingConfidence, reason: String) -> Finding {
        self.confidence = confidence;
        self.confidence_reason = (confidence != FindingConfidence::High).then_some(reason);
        self
    }

    /// Whether it counts as a problem to rank (not information, not inconclusive).
    pub fn is_inconclusive(&self) -> bool {
        self.confidence == FindingConfidence::Inconclusive
    }
}

/// A fix measured by replaying the trace: the same figures `tensormem replay` reports for the
/// same settings (`command` reproduces the after side, when the replayed trace is the file's);
/// or, for a scenario's mistake (`doctor --scenario`), by running its fix variant: the figures
/// `tensormem run` reports, `command` its line (`scenarios::diagnose`).
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct Verified {
    /// In words: "replay with expandable_segments:True".
    pub how: String,
    /// The `tensormem replay` command line that gives the after figures; None where the replayed
    /// trace is not the file's own (a failed request added to it).
    pub command: Option<String>,
    /// Settings of the after side, in PYTORCH_CUDA_ALLOC_CONF syntax.
    pub alloc_conf: String,
    /// `recorded` or `replaced` (see `tensormem replay --start`).
    pub start: String,
    pub capacity: Option<u64>,
    pub before_peak_reserved_bytes: u64,
    pub after_peak_reserved_bytes: u64,
    pub before_peak_allocated_bytes: u64,
    pub after_peak_allocated_bytes: u64,
    pub before_out_of_memory: bool,
    pub after_out_of_memory: bool,
}

#[derive(Debug, Clone, Default)]
pub struct DoctorOptions {
    /// The device to diagnose; None: the one with an out-of-memory entry, else the one that
    /// reserved the most.
    pub device: Option<i64>,
    /// Device memory to check the trace against (an out-of-memory finding when it does not fit).
    pub capacity: Option<u64>,
    /// The device's start state, already reconstructed (the page's worker keeps one per device);
    /// None, or another trace's: reconstructed here.
    pub known_start: Option<replay::KnownStart>,
}

#[derive(Debug, thiserror::Error)]
pub enum DoctorError {
    #[error("{0}")]
    Replay(#[from] ReplayError),
    #[error("the snapshot's allocator settings are unusable: {0}")]
    Settings(#[from] ConfigError),
    #[error("the snapshot has no segments and no trace: nothing to diagnose")]
    Empty,
    #[error("no capacity up to {0} lets the trace replay without running out of memory")]
    NoCapacityFits(String),
}

/// Diagnoses one device of a snapshot.
pub fn diagnose(snapshot: &Snapshot, options: &DoctorOptions) -> Result<Diagnosis, DoctorError> {
    diagnose_with(snapshot, options, &REGISTRY, None)
}

/// [`diagnose`] without the finders of `skip` (each named in a note as failed): where a panic
/// cannot be caught (the page's wasm), the caller asks [`finder_running`] which finder stopped
/// the diagnosis and runs it again without that one.
pub fn diagnose_skipping(snapshot: &Snapshot, options: &DoctorOptions, skip: &[String]) -> Result<Diagnosis, DoctorError> {
    diagnose_laid_out(snapshot, options, skip, None)
}

/// [`diagnose_skipping`] reading `laid_out`, the device's timeline already built (the page's,
/// with or without its bands and curves), instead of building it again. It must have been laid
/// out from this snapshot, from the start state in `options`, grouped as the trace groups its
/// allocations: the caller's word, checked only so far as one of another device or length is
/// not used.
pub fn diagnose_laid_out(
    snapshot: &Snapshot,
    options: &DoctorOptions,
    skip: &[String],
    laid_out: Option<&timeline::Timeline>,
) -> Result<Diagnosis, DoctorError> {
    let registry: Vec<&Kind> = REGISTRY.into_iter().filter(|k| !skip.iter().any(|s| s == k.name)).collect();
    let mut d = diagnose_with(snapshot, options, &registry, laid_out)?;
    d.notes.extend(REGISTRY.iter().filter(|k| skip.iter().any(|s| s == k.name)).map(|k| failed_note(k.name)));
    Ok(d)
}

thread_local! {
    /// The finder running now (None between finders): what stopped a diagnosis that did not return.
    static RUNNING: std::cell::Cell<Option<&'static str>> = const { std::cell::Cell::new(None) };
    /// A finder made to fail, for the page's tests of the above.
    static MADE_TO_FAIL: std::cell::Cell<Option<&'static str>> = const { std::cell::Cell::new(None) };
}

/// The finder that was running when the last diagnosis stopped without returning (a panic in
/// the page's wasm, which aborts); None after a diagnosis that returned.
pub fn finder_running() -> Option<&'static str> {
    RUNNING.get()
}

/// Makes the finder of `kind` panic whenever it runs (None: none), so that the page's tests can
/// check that a failing finder does not take the diagnosis down. Not for anything else.
#[doc(hidden)]
pub fn make_finder_fail_for_tests(kind: Option<&str>) {
    MADE_TO_FAIL.set(kind.and_then(self::kind).map(|k| k.name));
}

fn failed_note(name: &str) -> String {
    format!("the {name} finder failed on this trace (a bug in tensormem: please report it with the file); the other findings stand")
}

/// Diagnoses with the kinds of `registry` (the registry, or a test's).
fn diagnose_with(snapshot: &Snapshot, options: &DoctorOptions, registry: &[&Kind], laid_out: Option<&timeline::Timeline>) -> Result<Diagnosis, DoctorError> {
    let device = match options.device {
        Some(d) => {
            replay::check_device(snapshot, d)?;
            d
        }
        None => default_device(snapshot)?,
    };
    // Every replay of the file's own trace starts from the same reconstructed state.
    let known_start = match options.known_start.clone().filter(|k| k.of_trace(snapshot, device).is_some()) {
        Some(known) => known,
        None => replay::KnownStart::of(snapshot, device)?,
    };
    let timeline = match laid_out.filter(|t| t.device == device && t.events == snapshot.trace_of(device).len()) {
        Some(t) => Cow::Borrowed(t),
        None => Cow::Owned(timeline::build_lifetimes_from(snapshot, device, &known_start)?),
    };
    let what_if_start = what_if_start(&timeline);
    let patient = Patient { snapshot, device, timeline, what_if_start, known_start, as_recorded: Default::default() };
    let steps = steps::find(&patient);
    let ops = ops::Ops::new(&patient.timeline);
    let exam = kinds::Exam { patient, steps, ops, options };
    // A finder that fails on a trace is a bug, never the end of the diagnosis: the others
    // report, and a note names it. (Natively; a wasm build aborts on a panic.)
    let failed = std::cell::RefCell::new(Vec::new());
    let run = |role: Role| -> Result<Vec<Finding>, DoctorError> {
        let mut found = Vec::new();
        for kind in registry.iter().filter(|k| k.role == role) {
            RUNNING.set(Some(kind.name));
            let result = std::panic::catch_unwind(std::panic::AssertUnwindSafe(|| {
                if MADE_TO_FAIL.get() == Some(kind.name) {
                    panic!("the {} finder was made to fail for a test", kind.name);
                }
                (kind.find)(&exam)
            }));
            RUNNING.set(None);
            match result {
                Ok(result) => found.extend(result?),
                Err(_) => failed.borrow_mut().push(kind.name),
            }
        }
        Ok(found)
    };

    let mut problems = run(Role::Problem)?;
    // An out-of-memory error is what the file is about: it comes first, whatever its request.
    // Memory from before the trace is about the recording, not a mistake of the program: it
    // comes after the program's own problems.
    problems.sort_by(|a, b| {
        (b.kind == OOM)
            .cmp(&(a.kind == OOM))
            .then((a.kind == TRUNCATED_TRACE).cmp(&(b.kind == TRUNCATED_TRACE)))
            .then(b.bytes.cmp(&a.bytes))
            .then_with(|| a.kind.cmp(&b.kind))
    });
    let (inconclusive, problems): (Vec<Finding>, Vec<Finding>) = problems.into_iter().partition(Finding::is_inconclusive);

    let mut findings = run(Role::Summary)?;
    if problems.is_empty() {
        findings.extend(run(Role::WhenNoProblem)?);
    }
    findings.extend(problems);
    findings.extend(inconclusive);
    findings.extend(run(Role::Last)?);
    let mut notes: Vec<String> = exam.ops.unreadable_note(&exam.patient.timeline).into_iter().collect();
    notes.extend(failed.into_inner().into_iter().map(failed_note));
    Ok(Diagnosis { findings, notes })
}

/// What every finding looks at: one device's trace, laid out once.
pub(crate) struct Patient<'a> {
    snapshot: &'a Snapshot,
    device: i64,
    /// Built without its bands and curves ([`timeline::build_lifetimes_from`]), or the page's
    /// (see [`diagnose_laid_out`]): the doctor reads neither (`timeline.curves` walks the curves).
    timeline: Cow<'a, timeline::Timeline>,
    /// The start the what-if replays use (see [`what_if_start`]).
    what_if_start: StartMode,
    /// The trace's start state, reconstructed once for all its replays.
    known_start: replay::KnownStart,
    /// The trace replayed under its own settings from that start: the before side of every
    /// what-if, replayed once (`what_if::as_recorded`).
    as_recorded: std::sync::OnceLock<what_if::Outcome>,
}

impl Patient<'_> {
    /// Where the trace records an out-of-memory (its first `oom` entry): the program stopped
    /// there, mid-iteration, so what would have come after (a backward) is not evidence.
    fn stopped_by_oom(&self) -> Option<usize> {
        self.snapshot.trace_of(self.device).iter().position(|e| e.action == crate::trace::Action::Oom)
    }
}

/// Bytes worth a finding: at least `min_bytes`, and `share` of the whole they are part of (each
/// finder says which whole: the peak of the program's own memory, the peak reserved...).
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct Material {
    pub share: f64,
    pub min_bytes: u64,
}

impl Material {
    /// For kinds that report whatever they find.
    pub const ANY: Material = Material { share: 0.0, min_bytes: 0 };

    /// The one threshold test.
    pub fn holds(&self, bytes: u64, whole: u64) -> bool {
        bytes >= self.min_bytes && bytes as f64 >= self.share * whole as f64
    }
}

/// The device with an out-of-memory entry (the one the user is asking about), else the one whose
/// trace reserved the most.
fn default_device(snapshot: &Snapshot) -> Result<i64, DoctorError> {
    snapshot.pick_device().ok_or(DoctorError::Empty)
}

/// A trace that starts with memory already reserved starts, replayed as recorded, with every
/// segment it will need: other settings or a smaller card would change nothing. Its what-ifs
/// start from the live allocations alone, placed afresh (`--start replaced`); a trace that
/// starts empty replays from its recorded (empty) start.
fn what_if_start(timeline: &timeline::Timeline) -> StartMode {
    if timeline.summary.start_reserved_bytes == 0 { StartMode::Recorded } else { StartMode::Replaced }
}

/// `1.23 GiB` with the exact bytes for a person checking the figure.
fn size(bytes: u64) -> String {
    crate::alloc::format_size(bytes)
}

#[cfg(test)]
mod tests {
    use super::*;

    /// A finder with a bug: it panics on every trace.
    fn broken(_: &kinds::Exam) -> Result<Option<Finding>, DoctorError> {
        let positions: Vec<usize> = vec![149, 1];
        Ok(positions[positions[0]..positions[1]].first().map(|_| unreachable!()))
    }

    #[test]
    fn a_finder_that_fails_is_named_and_the_others_report() {
        const BROKEN: Kind = Kind { name: GROWTH, label: "growth", about: "a finder with a bug", role: Role::Problem, find: broken, material: Material::ANY };
        // Three allocations of 1 MiB, freed at the end.
        let entry = |action: &str, addr: u64| {
            format!(r#"{{"action":"{action}","addr":{addr},"size":1048576,"stream":0,"frames":[{{"filename":"/home/u/t.py","line":1,"name":"f"}}]}}"#)
        };
        let mut trace = vec![r#"{"action":"segment_alloc","addr":0,"size":20971520,"stream":0,"frames":[]}"#.to_string()];
        trace.extend((0..3).map(|i| entry("alloc", i << 20)));
        trace.extend((0..3).flat_map(|i| [entry("free_requested", i << 20), entry("free_completed", i << 20)]));
        let text = format!(r#"{{"segments":[],"device_traces":[[{}]]}}"#, trace.join(","));
        let snapshot = crate::trace::load(text.as_bytes()).unwrap();
        let whole = diagnose(&snapshot, &DoctorOptions::default()).unwrap();
        let registry: Vec<&Kind> = REGISTRY.iter().map(|&k| if k.name == GROWTH { &BROKEN } else { k }).collect();
        let diagnosis = diagnose_with(&snapshot, &DoctorOptions::default(), &registry, None).unwrap();
        let others: Vec<&Finding> = whole.findings.iter().filter(|f| f.kind != GROWTH).collect();
        assert_eq!(diagnosis.findings.iter().collect::<Vec<_>>(), others, "every other finding, as without the bug");
        assert!(diagnosis.notes.iter().any(|n| n.starts_with("the growth finder failed on this trace")), "{:?}", diagnosis.notes);
    }
}
