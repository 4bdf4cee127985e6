//! Predict: from two or more recordings of one program at different values of one or two
//! variables (`batch`, `context`, any name; the user states them), the program's memory at
//! other values, by replaying a synthesized trace through the caching allocator.
//!
//! The data flows top to bottom: each recording becomes a program of keyed events (`events`:
//! the allocations live at its start, then its allocs, frees and cache releases, each keyed by
//! its action and its allocation's stack); the other recordings are aligned to the one nearest
//! the target (`align`: a longest common subsequence of keys); every allocation aligned in all
//! of them gets a law, the simplest sum of monomials with integer coefficients that gives its
//! size in every recording (`law`); the nearest recording's events, with each size from its law
//! at the target, are replayed from an empty device under the recording's settings (or
//! others): the predicted peaks, an out-of-memory error if a capacity is given, and the
//! predicted trace as a snapshot. With one recording there is nothing to fit: each size is
//! scaled by the variables whose values divide it, a guess marked weak. `fit` searches, by such
//! predictions, the largest value that fits a card.
//!
//! Pure: no device, no page; `replay` does the allocator's work.

mod align;
mod events;
mod fit;
mod how_sure;
mod law;
mod model;
mod sweep;

pub use fit::{Fit, SEARCH_LIMIT, fit, largest_fitting};
pub use how_sure::HowSure;
pub use law::{Basis, Law};
pub use model::Model;
pub use sweep::{Peak, predict_or_fit, sweep, sweep_values};

use crate::alloc::{AllocatorConfig, ConfigError};
use crate::replay::ReplayError;
use crate::trace::{self, Action, Snapshot, Totals, TraceEntry};
use events::{Frameless, NO_ALLOC, Program, Stacks};
use rustc_hash::FxHashMap;
use serde::Serialize;
use std::collections::BTreeMap;

/// A variable's value per name: `context=128`.
pub type Values = BTreeMap<String, u64>;

/// One recording: a snapshot and the values it was recorded at.
#[derive(Debug, Clone)]
pub struct Recording<'a> {
    /// How messages name it (its file name).
    pub label: String,
    pub snapshot: &'a Snapshot,
    pub values: Values,
}

#[derive(Debug, Clone, Default)]
pub struct PredictOptions {
    /// The device of each snapshot; None: as the doctor picks it (the one with an
    /// out-of-memory entry, else the one that reserved the most).
    pub device: Option<i64>,
    /// Allocator settings instead of the nearest recording's.
    pub config: Option<AllocatorConfig>,
    /// Device memory in bytes; None: as much as the prediction needs.
    pub capacity: Option<u64>,
    /// Keep the predicted trace, replayed, as a snapshot.
    pub keep_snapshot: bool,
}

#[derive(Debug, thiserror::Error)]
pub enum PredictError {
    #[error("{0}")]
    Input(String),
    #[error("{0}: {1}")]
    Replay(String, ReplayError),
    #[error("{0}: the snapshot's allocator settings are unusable: {1}")]
    Settings(String, ConfigError),
}

/// PyTorch refuses to allocate 1 EB (2^60 bytes) or more; far below it no card exists either.
const ONE_EB: u128 = 1 << 60;

/// Refuses a predicted trace that holds 1 EB or more at once (counted exactly, before the
/// allocator's 64-bit counters could overflow): a target far past anything that runs.
fn refuse_beyond_any_card(entries: &[TraceEntry], target: &Values) -> Result<(), PredictError> {
    let mut live: FxHashMap<u64, u64> = FxHashMap::default();
    let (mut now, mut peak) = (0u128, 0u128);
    for e in entries {
        match e.action {
            Action::Alloc => {
                now += e.size as u128;
                now -= live.insert(e.addr, e.size).unwrap_or(0) as u128;
            }
            Action::FreeRequested => now -= live.remove(&e.addr).unwrap_or(0) as u128,
            _ => {}
        }
        peak = peak.max(now);
    }
    match peak >= ONE_EB {
        true => Err(PredictError::Input(format!(
            "at {} the program would hold more than 1 EB at once ({peak} bytes; PyTorch refuses to allocate 2^60 bytes or more): predict a smaller target",
            values_text(target)
        ))),
        false => Ok(()),
    }
}

/// The prediction. Its JSON (`predict --json`) has exactly the contract's fields; the rest is
/// for the printed report.
#[derive(Debug, Clone, Serialize)]
pub struct Prediction {
    pub target: Values,
    pub peak_allocated_bytes: u64,
    pub peak_reserved_bytes: u64,
    /// `forward`, `backward`, `optimizer step` (from the frames of the allocation at the peak of
    /// requested bytes); `start` when the allocations live at the start make the peak.
    pub peak_phase: Option<String>,
    /// PyTorch's message for the first allocation that did not fit the capacity.
    pub out_of_memory: Option<String>,
    /// Allocations with a counterpart in every recording, over all recordings' allocations.
    pub aligned_fraction: f64,
    /// Bytes requested by the allocations without one, summed over the recordings.
    pub unaligned_bytes: u64,
    /// How far to trust the figures: what the bytes at the peak rest on, and how far the
    /// target lies outside the recorded values.
    pub how_sure: HowSure,
    /// Per stack and law: what grows with what, largest at the target first.
    pub laws: Vec<StackLaw>,
    /// The largest value that fits (`--fit`), when asked for.
    pub fit: Option<Fit>,
    /// What looks mislabeled: recordings whose memory falls as a variable grows (swapped values,
    /// a file given another's values), laws that go negative at the target (their sizes clamped
    /// to 1 byte). Empty when nothing does.
    pub warnings: Vec<String>,
    /// One recording: the laws are guesses from the sizes' factors.
    #[serde(skip)]
    pub weak: bool,
    /// Index of the recording whose events were scaled (the nearest the target).
    #[serde(skip)]
    pub reference: usize,
    #[serde(skip)]
    pub devices: Vec<i64>,
    /// Allocator settings of the replay.
    #[serde(skip)]
    pub settings: String,
    /// Events of the predicted trace.
    #[serde(skip)]
    pub events: usize,
    /// Per recording: allocations and bytes without a counterpart in every other recording.
    #[serde(skip)]
    pub unaligned: Vec<(usize, u64)>,
    /// What the reader should know about how far to trust the figures.
    #[serde(skip)]
    pub notes: Vec<String>,
    /// The predicted trace as replayed (segments and trace with the recorded stacks).
    #[serde(skip)]
    pub snapshot: Option<Snapshot>,
}

/// The allocations of one stack that follow one law.
#[derive(Debug, Clone, Serialize)]
pub struct StackLaw {
    /// The stack in one line (the user's frame, or the op).
    pub stack: String,
    /// Its Python frames, else the frames that name the work, innermost first.
    pub frames: Vec<String>,
    /// Requested bytes per allocation: `4096*context + 512`.
    pub law: String,
    pub basis: Basis,
    /// The same size at every value.
    pub constant: bool,
    pub allocations: usize,
    /// Their bytes in each recording, in the order given.
    pub recorded_bytes: Vec<u64>,
    pub target_bytes: u64,
}

/// `trace.pickle@context=128` or `trace.pickle@batch=4,context=128`: the path and the values.
pub fn parse_recording(text: &str) -> Result<(String, Values), String> {
    let example = "give each recording's values as FILE@name=value, e.g. trace.pickle@context=128 or trace.pickle@batch=4,context=128";
    let (path, values) = text.rsplit_once('@').filter(|(p, v)| !p.is_empty() && v.contains('=')).ok_or_else(|| format!("{text}: {example}"))?;
    let values = parse_values(values).map_err(|e| format!("{text}: {e}"))?;
    Ok((path.to_string(), values))
}

/// `context=1024` or `batch=16,context=1024`.
pub fn parse_values(text: &str) -> Result<Values, String> {
    let mut values = Values::new();
    for item in text.split(',').map(str::trim).filter(|s| !s.is_empty()) {
        let (name, value) = item.split_once('=').ok_or_else(|| format!("expected name=value, got {item:?}"))?;
        let name = name.trim();
        let valid = name.chars().next().is_some_and(|c| c.is_ascii_alphabetic() || c == '_') && name.chars().all(|c| c.is_ascii_alphanumeric() || c == '_');
        if !valid {
            return Err(format!("{name:?} is not a variable name (letters, digits and _)"));
        }
        let value: u64 = value.trim().parse().ok().filter(|&v| v > 0).ok_or_else(|| format!("{name}={value}: a value is a positive whole number"))?;
        if values.insert(name.to_string(), value).is_some() {
            return Err(format!("{name} is given twice"));
        }
    }
    if values.is_empty() {
        return Err("no name=value given".into());
    }
    Ok(values)
}

/// The variables a law is over: the ones that differ between the recordings (with one
/// recording: all of them), with each recording's values and the target's.
struct Variables {
    names: Vec<String>,
    recorded: Vec<Vec<i128>>,
    target: Vec<i128>,
}

fn variables(recordings: &[Recording], target: &Values) -> Result<Variables, PredictError> {
    let input = |m: String| PredictError::Input(m);
    let first = recordings.first().ok_or_else(|| input("give at least one recording (two or more to fit laws)".into()))?;
    let names: Vec<&String> = first.values.keys().collect();
    if names.is_empty() {
        return Err(input(format!("{}: give the values it was recorded at, e.g. {}@context=128", first.label, first.label)));
    }
    for r in recordings {
        if r.values.keys().ne(names.iter().copied()) {
            let list = |v: &Values| v.keys().cloned().collect::<Vec<_>>().join(", ");
            return Err(input(format!(
                "{} gives {} but {} gives {}: every recording must give the same variables",
                first.label,
                list(&first.values),
                r.label,
                list(&r.values)
            )));
        }
    }
    if target.is_empty() {
        return Err(input("--to needs the values to predict, e.g. --to context=1024".into()));
    }
    for name in target.keys() {
        if !first.values.contains_key(name) {
            let known = names.iter().map(|s| s.as_str()).collect::<Vec<_>>().join(", ");
            return Err(input(format!("--to names {name}, which no recording gives (they give: {known})")));
        }
    }
    let varies = |name: &String| recordings.iter().any(|r| r.values[name] != first.values[name]);
    let single = recordings.len() == 1;
    let mut free = Vec::new();
    for &name in &names {
        let wanted = target.get(name).copied();
        if single || varies(name) {
            if !single && wanted.is_none() {
                return Err(input(format!("--to must give {name}: it differs between the recordings")));
            }
            free.push(name.clone());
        } else if let Some(v) = wanted.filter(|&v| v != first.values[name]) {
            return Err(input(format!("{name} is {} in every recording: record one at another {name} to predict {name}={v}", first.values[name])));
        }
    }
    let value = |values: &Values, name: &String| values[name] as i128;
    Ok(Variables {
        recorded: recordings.iter().map(|r| free.iter().map(|n| value(&r.values, n)).collect()).collect(),
        target: free.iter().map(|n| target.get(n).map_or_else(|| value(&first.values, n), |&v| v as i128)).collect(),
        names: free,
    })
}

/// How many distinct points (values of the free variables) the recordings give.
fn distinct_points(vars: &Variables) -> usize {
    let mut points = vars.recorded.clone();
    points.sort();
    points.dedup();
    points.len()
}

/// The recording nearest the target (log distance over the variables; the later of equals).
fn nearest(vars: &Variables) -> usize {
    let distance = |x: &Vec<i128>| x.iter().zip(&vars.target).map(|(&v, &t)| ((t as f64) / (v as f64)).ln().abs()).sum::<f64>();
    let mut best = 0;
    for (i, x) in vars.recorded.iter().enumerate() {
        if distance(x) <= distance(&vars.recorded[best]) {
            best = i;
        }
    }
    best
}

/// Predicts the program's memory at `target` from `recordings`.
pub fn predict(recordings: &[Recording], target: &Values, options: &PredictOptions) -> Result<Prediction, PredictError> {
    Model::new(recordings, target, options)?.predict(target, options)
}

/// Refuses two recordings given different values that record the same run (the same file twice,
/// a copy, a conversion): the same events, with the same actions, sizes, addresses and stacks,
/// the allocations live at their start included. Decided from their content, not their names.
fn refuse_same_run(recordings: &[Recording], programs: &[Program]) -> Result<(), PredictError> {
    for (j, b) in programs.iter().enumerate() {
        for (i, a) in programs[..j].iter().enumerate() {
            if recordings[i].values != recordings[j].values && same_run(a, b) {
                let (first, second) = (&recordings[i], &recordings[j]);
                return Err(PredictError::Input(format!(
                    "{} ({}) and {} ({}) record the same run: the same {} events, with the same sizes, addresses and stacks. \
                     A snapshot does not record the values it was made at, so these cannot both be right: give each value a \
                     recording made at it",
                    first.label,
                    values_text(&first.values),
                    second.label,
                    values_text(&second.values),
                    a.entries.len()
                )));
            }
        }
    }
    Ok(())
}

/// Whether two programs hold the same events: action, address, size and stack of each, in the
/// same order, and as many live at the start.
fn same_run(a: &Program, b: &Program) -> bool {
    let event = |e: &TraceEntry| (e.action, e.addr, e.size);
    !a.entries.is_empty()
        && a.at_start == b.at_start
        && a.entries.len() == b.entries.len()
        && a.stacks == b.stacks
        && a.entries.iter().map(event).eq(b.entries.iter().map(event))
}

/// The most bytes a program requests at once (its allocations live at the start included).
fn peak_requested(p: &Program) -> u64 {
    let mut live: FxHashMap<u64, u64> = FxHashMap::default();
    let (mut now, mut peak) = (0u64, 0u64);
    for e in &p.entries {
        match e.action {
            Action::Alloc => {
                now = now.saturating_add(e.size);
                now -= live.insert(e.addr, e.size).unwrap_or(0).min(now);
            }
            Action::FreeRequested => now -= live.remove(&e.addr).unwrap_or(0).min(now),
            _ => {}
        }
        peak = peak.max(now);
    }
    peak
}

/// A recording whose peak is more than this fraction below that of one at smaller values
/// (1%: a kernel's workspace may differ a little between runs) is said to fall.
const FALLS_BY: f64 = 0.01;

/// Warnings for each pair of recordings where one at values no smaller (each variable at least
/// as large, one larger) peaks lower: memory falling as a variable grows, which swapped values
/// or a file given another's values make.
fn falling_memory(recordings: &[Recording], vars: &Variables, programs: &[Program]) -> Vec<String> {
    let peaks: Vec<u64> = programs.iter().map(peak_requested).collect();
    let mut warnings = Vec::new();
    for (small, x) in vars.recorded.iter().enumerate() {
        for (large, y) in vars.recorded.iter().enumerate() {
            let grows = x != y && x.iter().zip(y).all(|(a, b)| a <= b);
            if !grows || (peaks[large] as f64) >= peaks[small] as f64 * (1.0 - FALLS_BY) {
                continue;
            }
            let grown: Vec<&str> = vars.names.iter().zip(x.iter().zip(y)).filter(|(_, (a, b))| a < b).map(|(n, _)| n.as_str()).collect();
            warnings.push(format!(
                "{} ({}) peaks at {} requested, less than {} ({}) at {}: memory falls as {} grows. A program's memory rarely \
                 does: check that each recording is given the values it was made at (swapped values, a mislabeled file)",
                recordings[large].label,
                values_text(&recordings[large].values),
                crate::alloc::format_size(peaks[large]),
                recordings[small].label,
                values_text(&recordings[small].values),
                crate::alloc::format_size(peaks[small]),
                grown.join(" and ")
            ));
        }
    }
    warnings
}

/// Every other recording aligned to the reference, by keys made with `stack_id`.
fn align_all(programs: &[Program], reference: usize, others: &[usize], stack_id: &[u32]) -> Vec<Vec<u32>> {
    // Allocations without frames keep their sizes first: those the variables leave alone (the
    // backward's gradients) anchor the alignment; between anchors they align in order.
    let keys = |p: &Program| (p.keys(stack_id, Frameless::BySize), p.keys(stack_id, Frameless::AsOne));
    let base = keys(&programs[reference]);
    others
        .iter()
        .map(|&o| {
            let other = keys(&programs[o]);
            align::align_refined((&base.0, &other.0), (&base.1, &other.1))
        })
        .collect()
}

/// Where two recordings' events first differ, in words: each one's trace entry there, its
/// action and stack (or that one ends there).
fn first_difference(a: &Program, b: &Program, stacks: &Stacks, labels: (&str, &str)) -> String {
    let strict: Vec<u32> = (0..stacks.frames.len() as u32).collect();
    let (ka, kb) = (a.keys(&strict, Frameless::AsOne), b.keys(&strict, Frameless::AsOne));
    let at = ka.iter().zip(&kb).take_while(|(x, y)| x == y).count();
    let describe = |p: &Program, label: &str| match p.entries.get(at) {
        None => format!("{label} has no more events"),
        Some(e) => {
            let place = p.trace_index[at].map_or("an allocation live at its start".to_string(), |i| format!("trace entry {i}"));
            let stack = match p.alloc_of[at] {
                NO_ALLOC => "no allocation".to_string(),
                alloc => stack_name(&stacks.frames[p.stacks[alloc] as usize]),
            };
            let at = if stack.starts_with('(') { stack } else { format!("at {stack}") };
            format!("{label} has {place}, {} of {} {at}", e.action.name(), crate::alloc::format_size(e.size))
        }
    };
    format!("they first differ at their event {at}: {}; {}", describe(a, labels.0), describe(b, labels.1))
}

/// The reference's allocations with a counterpart in every other recording.
fn aligned_allocs(base: &Program, matched: &[Vec<u32>]) -> usize {
    (0..base.entries.len()).filter(|&i| base.entries[i].action == Action::Alloc && matched.iter().all(|m| m[i] != align::NONE)).count()
}

/// `batch=16, context=1024`.
pub fn values_text(values: &Values) -> String {
    values.iter().map(|(k, v)| format!("{k}={v}")).collect::<Vec<_>>().join(", ")
}

/// The phase at the peak of requested bytes: the step's phases where the trace holds one
/// PyTorch training step, else the frames of the allocation that reached it.
fn peak_phase(snapshot: &Snapshot, device: i64, at_start: usize) -> Option<String> {
    let trace = snapshot.trace_of(device);
    let mut peak = (0u64, 0usize);
    for (position, at) in trace::running_totals(trace, Totals::default()).enumerate() {
        if at.allocated > peak.0 {
            peak = (at.allocated, position);
        }
    }
    let position = peak.1;
    if position == 0 {
        return None;
    }
    if position <= at_start {
        return Some("start".into());
    }
    if let Some(phase) = crate::pytorch::phase_at(snapshot, device, position) {
        return Some(phase.into());
    }
    let tensormem = trace.iter().any(|e| e.category.is_some());
    crate::doctor::entry_phase(trace.at(position - 1), tensormem).map(str::to_string)
}

/// A stack in one line, as the page's groups name it.
fn stack_name(frames: &[trace::Frame]) -> String {
    crate::pytorch::group_name(frames).unwrap_or_else(|| "(no stack)".into())
}

#[cfg(test)]
mod tests;
