//! The recordings made ready for predictions (`Model`): aligned, every allocation with its law,
//! and a prediction at a target: the scaled program replayed through the caching allocator.

use super::events::{Program, Stacks};
use super::law::{self, Basis, Fitter, Law};
use super::{
    HowSure, PredictError, PredictOptions, Prediction, Recording, StackLaw, Values, Variables, align, align_all, aligned_allocs, distinct_points, events,
    falling_memory, first_difference, nearest, peak_phase, refuse_beyond_any_card, refuse_same_run, stack_name, values_text, variables,
};
use crate::replay::{self, ReplayOptions, StartMode};
use crate::trace::{Action, Category, Snapshot, Trace, TraceEntry};
use rustc_hash::FxHashMap;

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
        synthesized.device_traces = vec![Trace::new(); device as usize + 1];
        synthesized.device_traces[device as usize] = Trace::from(entries);
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
