//! `growth`: memory that survives each iteration, from the same stacks every time: bytes per
//! iteration, the stacks that keep them, and the iteration at which the card runs out at this
//! rate. The first iteration is left out (optimizer state, caches warming up: a steady state, not
//! growth), and so is the last one's neighbour (a result kept until the next one replaces it).
//! A PyTorch loop without backward keeps its results and its cache on purpose: there only what
//! the forwards keep counts.

use super::Material;
use super::kinds::{Kind, Role};
use super::steps::{self, Steps};
use super::{AllocationRef, Finding, FindingConfidence, GROWTH, Patient, StackBytes, size};
use rustc_hash::FxHashSet;
use serde::{Deserialize, Serialize};

/// The card assumed when no capacity is given: tensormem's `sim:H100-80GB` preset.
const DEFAULT_CARD: (&str, u64) = crate::cards::H100_80GB;
/// Iterations needed: the first (warm-up), two examined, and the last (against which they are
/// examined).
const MIN_ITERATIONS: usize = 4;

#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct GrowthEvidence {
    #[serde(flatten)]
    pub iterations: steps::IterationsEvidence,
    /// The position examined: the trace's last allocation.
    pub position: u32,
    /// For iterations 2 to n - 2: bytes they made, from the growing stacks, still live there.
    pub kept_per_iteration: Vec<u64>,
    pub bytes_per_iteration: u64,
    pub allocations_per_iteration: usize,
    pub top_stacks: Vec<StackBytes>,
    pub allocations: Vec<AllocationRef>,
    pub capacity_bytes: u64,
    /// `given` (--capacity) or the card assumed.
    pub capacity_source: String,
    /// The iteration whose peak would no longer fit, at this rate; None: it does not fit now.
    pub runs_out_at_iteration: Option<u64>,
}

/// Whether growth counts allocation `id`. A PyTorch loop without backward (evaluation,
/// inference, generation) keeps its results on purpose (`preds.append(out.argmax(1))`, made
/// outside any module call) and its key/value cache: only what its forwards keep counts there.
fn loop_keeps(p: &Patient, s: &Steps, id: usize) -> bool {
    s.has_backward || s.tensormem || (s.phase[id] == Some(steps::Phase::Forward) && !steps::is_kv_cache(p, id))
}

pub(super) const KIND: Kind = Kind {
    name: GROWTH,
    label: "growth",
    about: "memory each iteration keeps",
    role: Role::Problem,
    find: |x| Ok(find(&x.patient, &x.steps, x.options.capacity)),
    material: Material::ANY,
};

pub(super) fn find(p: &Patient, s: &Steps, capacity: Option<u64>) -> Option<Finding> {
    let n = s.iterations.len();
    if n < MIN_ITERATIONS {
        return None;
    }
    let a = &p.timeline.allocations;
    let order = &s.order;
    let examined_at = order.last().map(|&id| a.start[id])?;
    let examined = 2..=n - 2;
    let mut kept: Vec<Vec<usize>> = vec![Vec::new(); n + 1];
    for &id in order {
        let k = s.iteration_of(a.start[id]);
        if a.start[id] > 0 && examined.contains(&k) && steps::live_at(p, id, examined_at) && !steps::is_library_buffer(p, id) && loop_keeps(p, s, id) {
            kept[k].push(id);
        }
    }
    // The stacks that keep memory in every examined iteration.
    let stacks = |k: usize| kept[k].iter().map(|&id| a.stack[id]).collect::<FxHashSet<u32>>();
    let mut common = stacks(2);
    for k in 3..=n - 2 {
        let next = stacks(k);
        common.retain(|st| next.contains(st));
    }
    if common.is_empty() {
        return None;
    }
    let growing: Vec<usize> = examined.clone().flat_map(|k| kept[k].iter().copied()).filter(|&id| common.contains(&a.stack[id])).collect();
    let per_iteration: Vec<u64> =
        examined.clone().map(|k| kept[k].iter().filter(|&&id| common.contains(&a.stack[id])).map(|&id| steps::bytes(p, id)).sum()).collect();
    if per_iteration.contains(&0) {
        return None;
    }
    let rate = per_iteration.iter().sum::<u64>() / per_iteration.len() as u64;

    let (capacity_bytes, capacity_source) = match capacity {
        Some(c) => (c, "given".to_string()),
        None => (DEFAULT_CARD.1, format!("assumed: an {} card (tensormem's sim preset; give --capacity for yours)", DEFAULT_CARD.0)),
    };
    let peak = p.timeline.summary.peak_allocated_bytes;
    let runs_out_at_iteration = capacity_bytes.checked_sub(peak).map(|headroom| n as u64 + headroom / rate + 1);
    let top_stacks = steps::top_stacks(p, &growing, 3);
    let keeper = top_stacks.first().and_then(|s| s.frames.first().cloned()).unwrap_or_else(|| "allocations without a stack".into());
    let card = if capacity.is_some() { "the card".to_string() } else { format!("an {}", DEFAULT_CARD.0) };
    let per = growing.len() / (n - 3);
    let title = format!(
        "Each iteration keeps {} more in {per} allocation{} ({keeper}): {}",
        size(rate),
        if per == 1 { "" } else { "s" },
        match runs_out_at_iteration {
            Some(i) => format!("at this rate {card} runs out at iteration {i}"),
            None => format!("the peak already exceeds {card}"),
        }
    );
    let why = format!(
        "Over {n} iterations, each one leaves {} allocated that the next ones never free, made by the same stacks every time. \
         A loop that keeps a reference to a tensor (a list of losses or outputs, a cache, a state carried over) keeps its \
         memory, and with autograd everything its graph saved; memory climbs until the card runs out.",
        size(rate)
    );
    let fix = "Find the reference the loop keeps at the stack above and drop it, or keep a number or a detached copy: \
               losses.append(loss.item()) instead of losses.append(loss), outputs.append(out.detach().cpu()), \
               hidden = hidden.detach() at each batch start."
        .to_string();
    let evidence = GrowthEvidence {
        iterations: s.evidence(p),
        position: examined_at,
        kept_per_iteration: per_iteration,
        bytes_per_iteration: rate,
        allocations_per_iteration: per,
        allocations: steps::largest(p, &growing, 5),
        top_stacks,
        capacity_bytes,
        capacity_source,
        runs_out_at_iteration,
    };
    let finding = Finding::new(title, rate * (n as u64 - 3), evidence, why, fix).estimate(Some(format!(
        "The iteration at which the card runs out assumes every later iteration keeps {} more than the peak so far ({}); \
             the bytes at stake are what iterations 2 to {} kept by the end.",
        size(rate),
        size(peak),
        n - 2
    )));
    // Fewer than three iterations examined: a steady state that warms up over a few steps looks the same.
    Some(match n - 3 {
        0..3 => finding.confidence(
            FindingConfidence::Medium,
            format!("seen over {} iteration{} only: a cache warming up over a few steps keeps memory too", n - 3, if n == 4 { "" } else { "s" }),
        ),
        _ => finding,
    })
}
