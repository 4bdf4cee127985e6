//! Per-rank results of a run over several simulated GPUs (`world` > 1): each rank's peaks,
//! what its peak holds by category, and its steps. Ranks are simulated one after another on
//! devices of their own, each summarised and dropped, so memory stays that of one rank.

use super::{Recorder, Step};
use crate::trace::{Action, Category};
use rustc_hash::FxHashMap;
use serde::Serialize;
use std::collections::BTreeMap;

/// One rank of a run (`ranks` in `run --json`).
#[derive(Debug, Clone, PartialEq, Serialize)]
pub struct RankResult {
    pub rank: usize,
    pub peak_allocated_bytes: u64,
    pub peak_reserved_bytes: u64,
    /// What the live tensors asked for when they asked for the most (the trace's sizes, before
    /// the allocator rounds them: a little under `peak_allocated_bytes`), by torch.profiler's
    /// category: tensormem tags parameters, gradients, optimizer state and inputs as it makes
    /// them; an untagged allocation is an `activation` when made in a forward or loss phase and
    /// a `temporary` otherwise.
    pub by_category: BTreeMap<&'static str, u64>,
    /// Allocated and reserved after each labelled step, as the run's own `steps`.
    pub steps: Vec<Step>,
    /// Where the rank ran out of memory, PyTorch's message.
    pub out_of_memory: Option<String>,
}

/// The category keys `by_category` uses.
const ACTIVATION: &str = "activation";
const TEMPORARY: &str = "temporary";

/// Summarises the rank a recorder ran: its peaks and the live bytes by category at the moment
/// the live tensors asked for the most.
pub(crate) fn summarize(rec: &mut Recorder, rank: usize, out_of_memory: Option<String>) -> RankResult {
    rec.fold_peaks();
    let snapshot = rec.device.snapshot();
    let trace = snapshot.trace_of(0);
    // A step's label for each trace position: the first step recorded after it. (The ring
    // buffer holds a whole training run; were it to wrap, positions would shift and phases
    // default to temporary.)
    let untagged = |index: usize| {
        let step = rec.step_positions.iter().position(|&end| index < end);
        match step.map(|s| rec.steps[s].label.as_str()) {
            Some(label) if label.ends_with("forward") || label.ends_with("loss") => ACTIVATION,
            _ => TEMPORARY,
        }
    };
    let names: Vec<&'static str> = Category::ALL.iter().map(|c| c.name()).chain([ACTIVATION, TEMPORARY]).collect();
    let slot = |name: &str| names.iter().position(|n| *n == name).expect("a known name");
    let mut live: FxHashMap<u64, (u64, usize)> = FxHashMap::default();
    let (mut now, mut total, mut best, mut at_best) = (vec![0u64; names.len()], 0u64, 0u64, vec![0u64; names.len()]);
    for (index, e) in trace.iter().enumerate() {
        match e.action {
            Action::Alloc => {
                let k = match e.category {
                    Some(c) => slot(c.name()),
                    None => slot(untagged(index)),
                };
                live.insert(e.addr, (e.size, k));
                now[k] += e.size;
                total += e.size;
                if total > best {
                    best = total;
                    at_best.clone_from(&now);
                }
            }
            Action::FreeCompleted => {
                if let Some((size, k)) = live.remove(&e.addr) {
                    now[k] -= size;
                    total -= size;
                }
            }
            _ => {}
        }
    }
    let by_category = names.iter().zip(at_best).filter(|(_, bytes)| *bytes > 0).map(|(n, b)| (*n, b)).collect();
    RankResult { rank, peak_allocated_bytes: rec.peaks.0, peak_reserved_bytes: rec.peaks.1, by_category, steps: rec.steps.clone(), out_of_memory }
}
