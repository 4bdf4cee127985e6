//! `optimizer-state`: what the optimizer step keeps (its state: Adam's two moments, momentum's
//! one buffer, made at the first step), what it holds only during the step (foreach
//! temporaries), and state made anew each step (moments computed out of place, the old ones freed
//! after the new ones exist). The state is what an optimizer pass allocates and leaves live when
//! it ends; "anew" is memory made before the step (or before the trace) that the step frees.

use super::Material;
use super::kinds::{Kind, Role};
use super::steps::{self, Phase, Steps};
use super::{AllocationRef, Finding, OPTIMIZER_STATE, Patient, StackBytes, size};
use crate::timeline::GroupKind;
use crate::trace::Category;
use serde::{Deserialize, Serialize};

#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct OptimizerStateEvidence {
    pub device: i64,
    pub optimizer_steps: usize,
    /// Where the step that made the most state starts.
    pub position: u32,
    /// Per step: bytes it made and left live.
    pub state_per_step: Vec<u64>,
    pub state_bytes: u64,
    /// The most the step's own short-lived allocations held at once.
    pub temporaries_peak_bytes: u64,
    /// Per step: bytes made before it that it freed (old state replaced by new).
    pub replaced_per_step: Vec<u64>,
    pub made_anew_each_step: bool,
    /// Parameters a step made anew (`p.data = p.data - ...`), not counted as state.
    pub parameters_remade: usize,
    /// The parameters' bytes, where the trace names them (tensormem's categories).
    pub parameter_bytes: Option<u64>,
    /// state / parameters: about 2 for Adam, 1 for momentum.
    pub state_per_parameter_byte: Option<f64>,
    pub top_stacks: Vec<StackBytes>,
    pub allocations: Vec<AllocationRef>,
}

/// State worth reporting: this share of the peak...
/// ...and at least this many bytes.
pub(super) const KIND: Kind = Kind {
    name: OPTIMIZER_STATE,
    label: "optimizer state",
    about: "the optimizer's state and what a leaner one saves",
    role: Role::Problem,
    find: |x| Ok(find(&x.patient, &x.steps)),
    material: Material { share: 0.01, min_bytes: 1 << 20 },
};

pub(super) fn find(p: &Patient, s: &Steps) -> Option<Finding> {
    let a = &p.timeline.allocations;
    let events = p.timeline.events as u32;
    let order = &s.order;
    let mut state_per_step = Vec::new();
    let mut replaced_per_step = Vec::new();
    let mut temporaries_peak = 0u64;
    let mut state_ids = Vec::new();
    let mut position = 0;
    // Parameters, and the allocations a step re-made them into (`p.data = p.data - lr * grad`
    // makes a new parameter and frees the old): what a step makes in place of one is the
    // parameter, not state.
    let first_iteration = s.iterations.first().copied().unwrap_or(0);
    // (What predates the trace could be anything: old state, too.)
    let mut parameter: Vec<bool> = (0..a.start.len()).map(|id| a.start[id] > 0 && a.start[id] < first_iteration && s.phase[id].is_none()).collect();
    let mut remade = Vec::new();
    let mut steps_temporaries: Vec<usize> = Vec::new();
    // What an optimizer step can replace (made before the trace, or by a step), by end.
    let mut by_end: Vec<usize> = order.iter().copied().filter(|&id| a.start[id] == 0 || parameter[id] || s.phase[id] == Some(Phase::Optimizer)).collect();
    by_end.sort_by_key(|&id| a.end[id]);
    for (i, q) in s.passes.iter().enumerate().filter(|(_, q)| q.phase == Phase::Optimizer) {
        let end = s.passes.get(i + 1).map_or(events, |next| next.first);
        let from = order.partition_point(|&id| a.start[id] < q.first);
        let to = order.partition_point(|&id| a.start[id] <= q.last);
        let mut made: Vec<usize> = order[from..to].iter().copied().filter(|&id| s.phase[id] == Some(Phase::Optimizer)).collect();
        // Parameters this step freed, by size: an allocation it made and kept, of one of their
        // sizes, replaces one.
        let mut freed_parameters: rustc_hash::FxHashMap<u64, usize> = Default::default();
        // (Passes may overlap where a loop never clears its gradients: an empty range then.)
        let from_freed = by_end.partition_point(|&id| a.end[id] <= q.first);
        let freed = from_freed..by_end.partition_point(|&id| a.end[id] <= end).max(from_freed);
        for &id in by_end[freed].iter().filter(|&&id| parameter[id]) {
            *freed_parameters.entry(steps::bytes(p, id)).or_default() += 1;
        }
        made.retain(|&id| match freed_parameters.get_mut(&steps::bytes(p, id)).filter(|_| steps::live_at(p, id, end)) {
            Some(left) if *left > 0 => {
                *left -= 1;
                parameter[id] = true;
                remade.push(id);
                false
            }
            _ => true,
        });
        // tensormem's traces name the state (its category): their last step's state is freed when the
        // program ends, with everything else. PyTorch's: what is still live when the next pass starts.
        let is_state = |id: usize| match s.tensormem {
            true => p.timeline.groups[a.group[id] as usize].kind == GroupKind::Category(Category::OptimizerState),
            false => steps::live_at(p, id, end),
        };
        let (state, temporaries): (Vec<usize>, Vec<usize>) = made.iter().partition(|&&id| is_state(id));
        state_per_step.push(state.iter().map(|&id| steps::bytes(p, id)).sum());
        if peak_of(p, &temporaries) > temporaries_peak {
            temporaries_peak = peak_of(p, &temporaries);
            steps_temporaries = temporaries.clone();
        }
        // Old state: made before the trace or by an earlier step, freed during this one.
        let freed = by_end.partition_point(|&id| a.end[id] <= q.first)..by_end.partition_point(|&id| a.end[id] <= q.last + 1);
        let replaced: u64 = by_end[freed].iter().filter(|&&id| a.start[id] < q.first && !parameter[id]).map(|&id| steps::bytes(p, id)).sum();
        replaced_per_step.push(replaced);
        if state.iter().map(|&id| steps::bytes(p, id)).sum::<u64>() >= state_ids.iter().map(|&id| steps::bytes(p, id)).sum() {
            state_ids = state;
            position = q.first.saturating_sub(1);
        }
    }
    // A step that keeps nothing has no state to speak of (its temporaries are the peak's).
    let state_bytes = state_per_step.iter().copied().max().filter(|&b| b > 0)?;
    let at_stake = state_bytes + temporaries_peak;
    if !s.material(p, at_stake, KIND.material) {
        return None;
    }
    // Made anew: every step (of those that made state) frees about as much old memory as it makes.
    let made_anew = state_per_step.iter().any(|st| *st > 0)
        && state_per_step.iter().zip(&replaced_per_step).filter(|(st, _)| **st > 0).all(|(st, r)| *r as f64 >= 0.5 * *st as f64);
    let parameter_bytes = (0..a.start.len())
        .filter(|&id| p.timeline.groups[a.group[id] as usize].kind == GroupKind::Category(Category::Parameter))
        .map(|id| steps::bytes(p, id))
        .sum::<u64>();
    let parameter_bytes = (parameter_bytes > 0).then_some(parameter_bytes);
    let ratio = parameter_bytes.map(|pb| state_bytes as f64 / pb as f64);
    let steps_count = state_per_step.len();
    let what = match ratio {
        Some(r) => format!(" ({r:.1}x the parameters' {}: Adam keeps 2x, SGD with momentum 1x)", size(parameter_bytes.unwrap_or(0))),
        None => String::new(),
    };
    let anew_words = if made_anew { ", made anew at every step" } else { "" };
    let title = format!(
        "The optimizer keeps {} of state{what}{anew_words}{}",
        size(state_bytes),
        if temporaries_peak > 0 { format!(", plus {} of temporaries during its step", size(temporaries_peak)) } else { String::new() }
    );
    let leaner = match ratio {
        Some(r) if (1.6..=2.4).contains(&r) => format!(
            "SGD with momentum keeps one buffer per parameter ({} less), plain SGD none; Adafactor or 8-bit Adam \
             (bitsandbytes) keep a fraction of it",
            size(state_bytes / 2)
        ),
        Some(r) if (0.8..1.2).contains(&r) => format!("SGD without momentum keeps nothing ({} less)", size(state_bytes)),
        _ => "A leaner optimizer (SGD with momentum: one buffer per parameter; Adafactor, 8-bit Adam) keeps less".to_string(),
    };
    let mut fix = format!("{leaner}.");
    // torch.optim's foreach and fused paths are options of its own optimizers (the innermost
    // Python frame is theirs); a hand-written step (a torch.optim.Optimizer subclass, under its
    // wrapper) makes its temporaries in its own expressions.
    let trace = p.snapshot.trace_of(p.device);
    let library_step = s.tensormem
        || state_ids
            .iter()
            .chain(&steps_temporaries)
            .filter_map(|&id| steps::trace_index(p, id).and_then(|i| trace.get(i)))
            .any(|e| e.frames.iter().flat_map(|f| f.iter()).find(|f| f.filename.ends_with(".py")).is_some_and(|f| f.filename.contains("torch/optim/")));
    if temporaries_peak > 0 && !library_step {
        fix.push_str(&format!(
            " The step's temporaries ({}) come from its own expressions: in-place updates (p.add_(...), \
             torch._foreach_mul_ and the other _foreach_*_ ops) make none.",
            size(temporaries_peak)
        ));
    } else if temporaries_peak > 0 {
        fix.push_str(&format!(
            " The step's temporaries ({}) come from the multi-tensor (foreach) path: foreach=False holds one parameter's \
             square root and quotient at a time (beside the previous parameter's denominator), fused=True none.",
            size(temporaries_peak)
        ));
    }
    if made_anew {
        fix.push_str(
            " Each step computes new moments before freeing the old ones: an in-place update (exp_avg.mul_(beta1).add_(...), \
             as torch.optim's own Adam does) keeps one copy.",
        );
    }
    let why = format!(
        "An optimizer's state lives from its first step to the end of training: Adam keeps two tensors the size of each \
         parameter (exp_avg, exp_avg_sq), SGD with momentum one, plain SGD none. It is made lazily at the first step, so \
         memory jumps there once; after that it is a steady cost, here {} over {steps_count} step{}.",
        size(state_bytes),
        if steps_count > 1 { "s" } else { "" }
    );
    let evidence = OptimizerStateEvidence {
        device: p.device,
        optimizer_steps: steps_count,
        position,
        state_per_step,
        state_bytes,
        temporaries_peak_bytes: temporaries_peak,
        replaced_per_step,
        made_anew_each_step: made_anew,
        parameters_remade: remade.len(),
        parameter_bytes,
        state_per_parameter_byte: ratio,
        top_stacks: steps::top_stacks(p, &state_ids, 3),
        allocations: steps::largest(p, &state_ids, 5),
    };
    Some(Finding::new(title, at_stake, evidence, why, fix).estimate(parameter_bytes.is_none().then(|| {
        "The trace does not say which allocations are parameters: what a leaner optimizer saves is read from the state's \
             size alone."
            .to_string()
    })))
}

/// The most `ids` hold at once.
fn peak_of(p: &Patient, ids: &[usize]) -> u64 {
    let a = &p.timeline.allocations;
    let mut changes: Vec<(u32, i64)> =
        ids.iter().flat_map(|&id| [(a.start[id], steps::bytes(p, id) as i64), (a.end[id], -(steps::bytes(p, id) as i64))]).collect();
    changes.sort_by_key(|&(x, d)| (x, d));
    let (mut now, mut most) = (0i64, 0i64);
    for (_, d) in changes {
        now += d;
        most = most.max(now);
    }
    most as u64
}
