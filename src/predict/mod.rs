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
mod sweep;

pub use fit::{Fit, SEARCH_LIMIT, fit, largest_fitting};
pub use how_sure::HowSure;
pub use law::{Basis, Law};
pub use sweep::{Peak, predict_or_fit, sweep, sweep_values};

use crate::alloc::{AllocatorConfig, ConfigError};
use crate::replay::{self, ReplayError, ReplayOptions, StartMode};
use crate::trace::{self, Action, Category, Snapshot, Totals, TraceEntry};
use events::{Frameless, NO_ALLOC, Program, Stacks};
use law::Fitter;
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

/// The recordings made ready for predictions: aligned to the one nearest a target, each of its
/// allocations with its law. Predictions at other values of the same variables (a search for
/// what fits) reuse it.
pub struct Model<'r, 'a> {
    recordings: &'r [Recording<'a>],
    vars: Variables,
    stacks: Stacks,
    /// The reference recording's program, whose events are scaled.
    base: Program,
    reference: usize,
    devices: Vec<i64>,
    /// Per event of the reference (allocations only): its law, and its sizes in the recordings
    /// (none where it is not aligned).
    laws: Vec<Option<(Law, Vec<u64>)>>,
    aligned_fraction: f64,
    unaligned: Vec<(usize, u64)>,
    notes: Vec<String>,
    /// What the recordings themselves make doubtful (memory falling as a variable grows).
    warnings: Vec<String>,
}

impl<'r, 'a> Model<'r, 'a> {
    /// Checks the variables against `target` (which also picks the reference), then aligns and
    /// fits.
    pub fn new(recordings: &'r [Recording<'a>], target: &Values, options: &PredictOptions) -> Result<Model<'r, 'a>, PredictError> {
        let vars = variables(recordings, target)?;
        let mut stacks = Stacks::new();
        let mut devices = Vec::new();
        let mut programs: Vec<Program> = Vec::new();
        for r in recordings {
            let device = match options.device {
                Some(d) => d,
                None => r.snapshot.pick_device().ok_or_else(|| PredictError::Input(format!("{}: the snapshot has no segments and no trace", r.label)))?,
            };
            replay::check_device(r.snapshot, device).map_err(|e| PredictError::Replay(r.label.clone(), e))?;
            let config = replay::recorded_config(r.snapshot).map_err(|e| PredictError::Settings(r.label.clone(), e))?;
            programs.push(events::program(r.snapshot, device, &config, &mut stacks));
            devices.push(device);
        }
        refuse_same_run(recordings, &programs)?;
        let warnings = falling_memory(recordings, &vars, &programs);
        let reference = nearest(&vars);
        let others: Vec<usize> = (0..programs.len()).filter(|&i| i != reference).collect();
        let mut notes = Vec::new();
        // matched[o][i]: the counterpart in recording others[o] of the reference's event i. By
        // the exact stacks; where too little aligns, also without line numbers and generated files'
        // names; the better stands.
        let base = &programs[reference];
        let strict: Vec<u32> = (0..stacks.frames.len() as u32).collect();
        let mut matched = align_all(&programs, reference, &others, &strict);
        let allocs = base.entries.iter().filter(|e| e.action == Action::Alloc).count();
        if aligned_allocs(base, &matched) < allocs * 9 / 10 {
            let loose = align_all(&programs, reference, &others, stacks.loose_ids());
            if aligned_allocs(base, &loose) > aligned_allocs(base, &matched) {
                matched = loose;
                notes.push(
                    "aligned without line numbers and with torch.compile's generated files as one: the recordings' stacks differ only \
                     there (a script edited between them, or kernels compiled for each size)"
                        .to_string(),
                );
            }
        }
        let single = recordings.len() == 1;
        if !single && aligned_allocs(base, &matched) * 2 < allocs {
            let other = &programs[others[0]];
            return Err(PredictError::Input(format!(
                "{} and {} do not look like one program: only {} of {allocs} allocations align (same stacks in the same order); {}",
                recordings[reference].label,
                recordings[others[0]].label,
                aligned_allocs(base, &matched),
                first_difference(base, other, &stacks, (&recordings[reference].label, &recordings[others[0]].label))
            )));
        }

        // With one recording: what lives at the start is taken to be constant, and the sizes of
        // what is never freed or what tensormem's trace says holds parameters, gradients or
        // optimizer state, wherever they recur (the optimizer's temporaries). (Not the sizes live
        // at the start: a warm run's start holds the last step's activations too.)
        let model_state = |e: &TraceEntry| matches!(e.category, Some(Category::Parameter | Category::Gradient | Category::OptimizerState));
        let constant_sizes: rustc_hash::FxHashSet<u64> = if single {
            let constant = |i: usize, e: &TraceEntry| e.action == Action::Alloc && i >= base.at_start && (base.kept[i] || model_state(e));
            base.entries.iter().enumerate().filter(|&(i, e)| constant(i, e)).map(|(_, e)| e.size).collect()
        } else {
            Default::default()
        };
        let mut fitter = Fitter::new(vars.names.len());
        let mut laws = Vec::with_capacity(base.entries.len());
        let mut unfitted = 0usize;
        let mut in_all = vec![Vec::new(); programs.len()];
        for (i, e) in base.entries.iter().enumerate() {
            if e.action != Action::Alloc {
                laws.push(None);
                continue;
            }
            let counterparts: Option<Vec<usize>> = matched.iter().all(|m| m[i] != align::NONE).then(|| {
                let mut at = vec![i; programs.len()];
                for (o, m) in others.iter().zip(&matched) {
                    at[*o] = m[i] as usize;
                }
                at
            });
            let (law, recorded) = match &counterparts {
                _ if single => (law::from_factors(e.size, &vars.recorded[0], i >= base.at_start && !constant_sizes.contains(&e.size)), vec![e.size]),
                Some(at) => {
                    let sizes: Vec<u64> = at.iter().enumerate().map(|(r, &j)| programs[r].entries[j].size).collect();
                    (fitter.fit(&vars.recorded, &sizes), sizes)
                }
                None => (Law::constant(e.size, Basis::Unaligned, vars.names.len()), vec![]),
            };
            for (r, &j) in counterparts.iter().flat_map(|at| at.iter().enumerate()) {
                in_all[r].push(j);
            }
            if law.basis == Basis::Unfitted {
                unfitted += 1;
            }
            laws.push(Some((law, recorded)));
        }
        // An allocation of the reference without a counterpart (a step more in this recording,
        // a buffer some sizes make and others not) follows its aligned neighbours: the law of
        // one of the same stack and the same size here, else the growth of its stack's
        // one-term laws, scaled to its own size.
        let mut same_size: FxHashMap<(u32, u64), Law> = FxHashMap::default();
        let mut growth: FxHashMap<u32, FxHashMap<Vec<u32>, usize>> = FxHashMap::default();
        for (i, (law, _)) in laws.iter().enumerate().filter_map(|(i, l)| Some((i, l.as_ref()?))) {
            if law.basis == Basis::Fitted {
                same_size.entry((base.stacks[i], base.entries[i].size)).or_insert_with(|| law.clone());
                if let [(_, powers)] = law.terms.as_slice()
                    && !law.is_constant()
                    && law.blocks.iter().all(|&b| b == 1)
                {
                    *growth.entry(base.stacks[i]).or_default().entry(powers.clone()).or_default() += 1;
                }
            }
        }
        let at_reference = &vars.recorded[reference];
        let neighbour = |i: usize| -> Option<Law> {
            if let Some(law) = same_size.get(&(base.stacks[i], base.entries[i].size)) {
                return Some(Law { basis: Basis::Neighbour, ..law.clone() });
            }
            let (powers, _) = growth.get(&base.stacks[i])?.iter().max_by_key(|(powers, n)| (**n, std::cmp::Reverse((*powers).clone())))?;
            Law::scaled(base.entries[i].size, powers, at_reference, Basis::Neighbour)
        };
        let mut borrowed = 0usize;
        for (i, (law, _)) in laws.iter_mut().enumerate().filter_map(|(i, l)| Some((i, l.as_mut()?))) {
            if law.basis == Basis::Unaligned
                && let Some(found) = neighbour(i)
            {
                *law = found;
                borrowed += 1;
            }
        }

        // What no law covers: each recording's allocations outside the aligned tuples.
        let mut unaligned = Vec::new();
        let (mut aligned_count, mut total_count) = (0usize, 0usize);
        for (r, p) in programs.iter().enumerate() {
            let mut covered = vec![false; p.entries.len()];
            for &j in &in_all[r] {
                covered[j] = true;
            }
            let (mut count, mut bytes) = (0usize, 0u64);
            for (j, e) in p.entries.iter().enumerate().filter(|(_, e)| e.action == Action::Alloc) {
                total_count += 1;
                if covered[j] || single {
                    aligned_count += 1;
                } else {
                    count += 1;
                    bytes += e.size;
                }
            }
            unaligned.push((count, bytes));
        }

        if single {
            notes.push(
                "one recording: each allocation's law is a guess from the factors of its size (the variables whose values divide it; \
                 what is live at the start stays constant, and so do the sizes of parameters, gradients, optimizer state and \
                 allocations never freed wherever they recur). Record the program at a second size to fit laws."
                    .into(),
            );
        }
        for (r, (count, bytes)) in unaligned.iter().enumerate() {
            if *count > 0 {
                notes.push(format!(
                    "{}: {count} allocation(s), {} requested, have no counterpart in every other recording{}",
                    recordings[r].label,
                    crate::alloc::format_size(*bytes),
                    match (r == reference, borrowed) {
                        (true, 0) => "; the prediction keeps their recorded sizes".to_string(),
                        (true, n) => format!(
                            "; {n} of them follow their aligned neighbours' laws (the same stack's at their size), the others keep their recorded sizes"
                        ),
                        (false, _) => "; the prediction leaves them out".to_string(),
                    }
                ));
            }
        }
        let ones: Vec<String> =
            recordings.iter().flat_map(|r| vars.names.iter().filter(|n| r.values[*n] == 1).map(move |n| format!("{n} is at 1 in {}", r.label))).collect();
        if !single && !ones.is_empty() && unaligned.iter().any(|u| u.0 > 0) {
            notes.push(format!(
                "{}: a dimension of size 1 makes some copies no-ops (`.contiguous()` of a transposed tensor) that larger values make, \
                 so those allocations cannot align; record at 2 or more",
                ones.join(", ")
            ));
        }
        if unfitted > 0 {
            notes.push(format!("{unfitted} allocation(s) fit no law of up to three terms: their size in the nearest recording stands"));
        }
        let base = programs.swap_remove(reference);
        Ok(Model {
            recordings,
            vars,
            stacks,
            base,
            reference,
            devices,
            laws,
            aligned_fraction: if total_count == 0 { 1.0 } else { aligned_count as f64 / total_count as f64 },
            unaligned,
            notes,
            warnings,
        })
    }

    /// The prediction at `target` (the variables [`Model::new`] checked; one not given keeps the
    /// first recording's value), replayed under `options`' settings and capacity.
    pub fn predict(&self, target: &Values, options: &PredictOptions) -> Result<Prediction, PredictError> {
        let first = &self.recordings[0].values;
        let x: Vec<i128> = self.vars.names.iter().map(|n| target.get(n).unwrap_or(&first[n]).to_owned() as i128).collect();
        let base = &self.base;
        let mut entries: Vec<TraceEntry> = Vec::with_capacity(base.entries.len());
        let mut sureness = Vec::with_capacity(base.entries.len());
        let points = distinct_points(&self.vars);
        let mut sizes_now: FxHashMap<u64, u64> = FxHashMap::default();
        let mut groups: FxHashMap<(u32, String, Basis), StackLaw> = FxHashMap::default();
        // Allocations whose law goes negative at the target (clamped to 1 byte).
        let mut negative: Vec<usize> = Vec::new();
        for (i, e) in base.entries.iter().enumerate() {
            let mut e = e.clone();
            sureness.push(self.laws[i].as_ref().map(|(law, _)| law.sureness(points)));
            if let Some((law, recorded)) = &self.laws[i] {
                if law.value(&x) < 0 {
                    negative.push(i);
                    // Checked where the program was recorded, not where the law says less than
                    // nothing.
                    sureness[i] = Some(law::Sureness::Extrapolated);
                }
                e.size = law.eval(&x);
                sizes_now.insert(e.addr, e.size);
                let stack = base.stacks[i];
                let frames = &self.stacks.frames[stack as usize];
                let group = groups.entry((stack, law.display(&self.vars.names), law.basis)).or_insert_with(|| StackLaw {
                    stack: stack_name(frames),
                    frames: crate::doctor::frames_shown(frames.iter()),
                    law: law.display(&self.vars.names),
                    basis: law.basis,
                    constant: law.is_constant(),
                    allocations: 0,
                    recorded_bytes: vec![0; recorded.len()],
                    target_bytes: 0,
                });
                group.allocations += 1;
                group.target_bytes = group.target_bytes.saturating_add(e.size);
                for (sum, s) in group.recorded_bytes.iter_mut().zip(recorded) {
                    *sum += s;
                }
            } else if matches!(e.action, Action::FreeRequested | Action::FreeCompleted)
                && let Some(&s) = sizes_now.get(&e.addr)
            {
                e.size = s;
            }
            entries.push(e);
        }

        refuse_beyond_any_card(&entries, target)?;
        let mut warnings = self.warnings.clone();
        let how_sure = if negative.is_empty() {
            HowSure::new(&entries, &sureness, &self.vars, &x)
        } else {
            // The clamped allocations count at their size in the nearest recording, among the
            // bytes on laws only fitted: the peak would hold at least that much of them.
            let mut counted = entries.clone();
            for &i in &negative {
                counted[i].size = base.entries[i].size;
            }
            let mut how_sure = HowSure::new(&counted, &sureness, &self.vars, &x);
            warnings.push(self.negative_laws(&negative, &x, target));
            how_sure.warning = Some(format!(
                "not to be trusted: {} allocation(s) get their sizes from laws that go negative at {} (see the warnings); \
                 they count here at their size in {}, among the bytes on laws only fitted through the recordings",
                negative.len(),
                values_text(target),
                self.recordings[self.reference].label
            ));
            how_sure
        };
        let device = self.devices[self.reference];
        let mut synthesized = Snapshot { allocator_settings: self.recordings[self.reference].snapshot.allocator_settings.clone(), ..Default::default() };
        synthesized.device_traces = vec![Vec::new(); device as usize + 1];
        synthesized.device_traces[device as usize] = entries;
        let replay_options = ReplayOptions {
            config: options.config.clone(),
            capacity: options.capacity,
            start: StartMode::Empty,
            keep_snapshot: options.keep_snapshot,
            ..Default::default()
        };
        let label = format!("the trace predicted at {}", values_text(target));
        let replayed = replay::replay_device(&synthesized, device, &replay_options, &mut |_, _| {}).map_err(|e| PredictError::Replay(label, e))?;
        let mut laws: Vec<StackLaw> = groups.into_values().collect();
        laws.sort_by(|a, b| b.target_bytes.cmp(&a.target_bytes).then_with(|| a.stack.cmp(&b.stack)).then_with(|| a.law.cmp(&b.law)));
        let mut full_target = target.clone();
        for (name, value) in first {
            full_target.entry(name.clone()).or_insert(*value);
        }
        Ok(Prediction {
            target: full_target,
            peak_allocated_bytes: replayed.replayed.figures.peak_allocated_bytes,
            peak_reserved_bytes: replayed.replayed.figures.peak_reserved_bytes,
            peak_phase: peak_phase(&synthesized, device, base.at_start),
            out_of_memory: replayed.first_oom_message.clone().or(replayed.out_of_memory_at_start.clone()),
            aligned_fraction: self.aligned_fraction,
            unaligned_bytes: self.unaligned.iter().map(|u| u.1).sum(),
            how_sure,
            laws,
            fit: None,
            warnings,
            weak: self.recordings.len() == 1,
            reference: self.reference,
            devices: self.devices.clone(),
            settings: replayed.settings.clone(),
            events: synthesized.trace_of(device).len(),
            unaligned: self.unaligned.clone(),
            notes: self.notes.clone(),
            snapshot: replayed.snapshot,
        })
    }
}

impl Model<'_, '_> {
    /// The warning for the allocations (`negative`: indices of the reference's events) whose
    /// laws go negative at `x`: how many, and the one largest in the nearest recording.
    fn negative_laws(&self, negative: &[usize], x: &[i128], target: &Values) -> String {
        let base = &self.base;
        let bytes: u64 = negative.iter().map(|&i| base.entries[i].size).sum();
        let largest = negative.iter().copied().max_by_key(|&i| (base.entries[i].size, std::cmp::Reverse(i))).expect("one at least");
        let law = self.laws[largest].as_ref().map(|(law, _)| law).expect("an allocation with a law");
        format!(
            "{} allocation(s) ({} requested in all in {}) get their sizes from laws that go negative at {}, such as `{}` at {} \
             ({} bytes there): each is clamped to 1 byte, so the prediction leaves them out and is not to be trusted. A law that \
             falls as a variable grows usually means swapped values or a mislabeled file: check each recording's values, or record \
             nearer the target",
            negative.len(),
            crate::alloc::format_size(bytes),
            self.recordings[self.reference].label,
            values_text(target),
            law.display(&self.vars.names),
            stack_name(&self.stacks.frames[base.stacks[largest] as usize]),
            law.value(x)
        )
    }
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
    crate::doctor::entry_phase(&trace[position - 1], tensormem).map(str::to_string)
}

/// A stack in one line, as the page's groups name it.
fn stack_name(frames: &[trace::Frame]) -> String {
    crate::pytorch::group_name(frames).unwrap_or_else(|| "(no stack)".into())
}

#[cfg(test)]
mod tests;
