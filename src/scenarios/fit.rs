//! What fits: the largest `batch` (or `context`) a training step runs at without any rank
//! running out of memory, found by running the step (doubling, then bisecting), for one card
//! and strategy or for a table of strategies by cards.

use super::{RunRequest, ScenarioError, run};
use serde::Serialize;

/// One cell of the table: a strategy on a card.
#[derive(Debug, Clone, PartialEq, Serialize)]
pub struct FitCell {
    pub strategy: String,
    pub card: String,
    pub capacity_bytes: u64,
    /// The largest value that fits; None when even 1 does not.
    pub largest: Option<u64>,
    /// At `largest`: the heaviest rank and its peaks.
    pub heaviest_rank: Option<usize>,
    pub peak_allocated_bytes: Option<u64>,
    pub peak_reserved_bytes: Option<u64>,
    /// What stopped the search short of running out of memory (the parameter's own limit).
    pub limited_by: Option<String>,
    /// Steps run to find it.
    pub runs: usize,
}

/// `tensormem fit`: every strategy on every card.
#[derive(Debug, Clone, Serialize)]
pub struct FitTable {
    pub scenario: String,
    /// The parameter searched (`batch` or `context`).
    pub vary: String,
    pub world: u64,
    pub cells: Vec<FitCell>,
}

/// The parameters a fit may search.
pub const FIT_PARAMETERS: [&str; 2] = ["batch", "context"];

/// The strategies a table compares unless told otherwise (the registry's rows that say so).
pub fn default_strategies() -> &'static [&'static str] {
    crate::nn::parallel::Strategy::fit_defaults()
}
/// The cards a table compares unless told otherwise.
pub const DEFAULT_CARDS: [&str; 3] = ["H100-80GB", "A100-40GB", "RTX4090-24GB"];

/// The outcome of one probe: it fits (the heaviest rank's peaks), it ran out of memory, or the
/// value is refused by the scenario's own checks (a limit, not memory).
enum Probe {
    Fits { rank: usize, allocated: u64, reserved: u64 },
    OutOfMemory,
    Refused(String),
}

fn probe(base: &RunRequest, vary: &str, value: u64) -> Result<Probe, ScenarioError> {
    let mut request = base.clone();
    request.set.insert(vary.to_string(), value.to_string());
    let result = match run(&request) {
        Ok(result) => result,
        Err(ScenarioError::Parameter { message, .. }) => return Ok(Probe::Refused(message)),
        Err(e) => return Err(e),
    };
    if result.out_of_memory.is_some() || result.ranks.iter().any(|r| r.out_of_memory.is_some()) {
        return Ok(Probe::OutOfMemory);
    }
    let rank = result.parameters.get("rank").and_then(|v| v.as_u64()).unwrap_or(0) as usize;
    let heaviest = result.ranks.iter().max_by_key(|r| (r.peak_allocated_bytes, std::cmp::Reverse(r.rank)));
    Ok(match heaviest {
        Some(r) => Probe::Fits { rank: r.rank, allocated: r.peak_allocated_bytes, reserved: r.peak_reserved_bytes },
        None => Probe::Fits { rank, allocated: result.peak_allocated_bytes, reserved: result.peak_reserved_bytes },
    })
}

/// The largest value of `vary` at which `base` runs without running out of memory: 1, 2, 4, ...
/// until a step runs out (or the scenario refuses the value), then bisection
/// ([`crate::predict::largest_fitting`]).
pub fn largest_that_fits(base: &RunRequest, vary: &str) -> Result<FitCell, ScenarioError> {
    if !FIT_PARAMETERS.contains(&vary) {
        return Err(ScenarioError::Parameter { scenario: base.scenario.clone(), message: format!("fit searches batch or context, not {vary:?}") });
    }
    let mut runs = 0;
    // The probe at the largest value that fitted, and the last refusal.
    let mut best: Option<(u64, Probe)> = None;
    let mut limited_by = None;
    crate::predict::largest_fitting::<ScenarioError>(1, u64::MAX, &mut |value| {
        runs += 1;
        Ok(match probe(base, vary, value)? {
            fits @ Probe::Fits { .. } => {
                if best.as_ref().is_none_or(|(b, _)| value > *b) {
                    best = Some((value, fits));
                }
                true
            }
            Probe::OutOfMemory => false,
            Probe::Refused(message) => {
                limited_by = Some(message);
                false
            }
        })
    })?;
    let (largest, rank, allocated, reserved) = match best {
        Some((value, Probe::Fits { rank, allocated, reserved })) => (Some(value), Some(rank), Some(allocated), Some(reserved)),
        _ => (None, None, None, None),
    };
    let strategy = base.set.get("strategy").cloned().unwrap_or_else(|| "ddp".into());
    let card = base.device.clone().unwrap_or_else(|| "sim:H100-80GB".into());
    let capacity_bytes = base.capacity.unwrap_or_else(|| super::parse_device(&card).map(|c| c.capacity).unwrap_or(0));
    Ok(FitCell {
        strategy,
        card: card.trim_start_matches("sim:").to_string(),
        capacity_bytes,
        largest,
        heaviest_rank: rank,
        peak_allocated_bytes: allocated,
        peak_reserved_bytes: reserved,
        limited_by,
        runs,
    })
}

/// The most steps (warm-up included) and micro-batches fit runs per candidate: it runs the step
/// a dozen times per cell, and the peak repeats from the step after the first optimizer step
/// (AdamW's moments exist then), and from the second micro-batch.
pub const FIT_MAX_STEPS: u64 = 4;
pub const FIT_MAX_ACCUMULATION: u64 = 8;

/// Refuses settings that would make every candidate's run long without changing its peak.
fn refuse_long_searches(base: &RunRequest) -> Result<(), ScenarioError> {
    let value = |key: &str, default: u64| base.set.get(key).and_then(|v| v.trim().parse::<u64>().ok()).unwrap_or(default);
    let (warmup, steps, accumulation) = (value("warmup", 1), value("steps", 1), value("accumulation", 1));
    let refuse = |message: String| Err(ScenarioError::Parameter { scenario: base.scenario.clone(), message });
    if warmup.saturating_add(steps) > FIT_MAX_STEPS {
        return refuse(format!(
            "fit runs the step for each value it tries on each card, and the peak repeats after the first optimizer step: warmup + steps must be at most {FIT_MAX_STEPS} (got {warmup} + {steps})"
        ));
    }
    if accumulation > FIT_MAX_ACCUMULATION {
        return refuse(format!(
            "fit runs the step for each value it tries on each card, and the peak repeats from the second micro-batch: accumulation must be at most {FIT_MAX_ACCUMULATION} (got {accumulation})"
        ));
    }
    Ok(())
}

/// The most cells a table may have (strategies x cards).
pub const FIT_MAX_CELLS: usize = 36;

/// Refuses a table with a strategy or card named twice (its rows would not line up), more than
/// [`FIT_MAX_CELLS`] cells, or more work than one run may take ([`super::WORK_BUDGET`]): every
/// cell runs the step up to twice per bit of the searched parameter's range.
fn refuse_large_tables(plain: &RunRequest, vary: &str, strategies: &[String], cards: &[String]) -> Result<(), ScenarioError> {
    let refuse = |message: String| Err(ScenarioError::Parameter { scenario: plain.scenario.clone(), message });
    for (what, names) in [("strategies", strategies), ("cards", cards)] {
        if let Some(name) = names.iter().enumerate().find_map(|(i, n)| names[..i].contains(n).then_some(n)) {
            return refuse(format!("{what}: {name} is named twice"));
        }
    }
    let cells = strategies.len() * cards.len();
    if cells > FIT_MAX_CELLS {
        return refuse(format!(
            "a table of {} strategies x {} cards is {cells} cells, more than {FIT_MAX_CELLS}: each runs a dozen steps or more; compare fewer at once",
            strategies.len(),
            cards.len()
        ));
    }
    let Ok(one_run) = super::work(plain) else { return Ok(()) };
    let range = super::find(&plain.scenario)
        .and_then(|s| s.parameters.into_iter().find(|p| p.name == vary))
        .and_then(|p| match p.kind {
            super::Kind::Integer { max, .. } => Some(max),
            _ => None,
        })
        .unwrap_or(u64::MAX);
    let probes = 2 * u64::from(64 - range.leading_zeros()) + 1;
    let total = one_run.passes.saturating_mul(probes).saturating_mul(cells as u64);
    if total > super::WORK_BUDGET {
        return refuse(format!(
            "this table would take up to {} layer passes ({cells} cells x up to {probes} runs x {} for one run: {}), more than the {} a run or a table may take: compare fewer strategies or cards, or a smaller model",
            crate::units::format_count(total),
            crate::units::format_count(one_run.passes),
            one_run.counted,
            crate::units::format_count(super::WORK_BUDGET)
        ));
    }
    Ok(())
}

/// The table a user compares: the largest value for every strategy on every card.
/// `progress(done, total)` is called after each cell.
pub fn fit_table(
    base: &RunRequest,
    vary: &str,
    strategies: &[String],
    cards: &[String],
    progress: &mut dyn FnMut(usize, usize),
) -> Result<FitTable, ScenarioError> {
    // A setting the scenario refuses whatever the strategy and the value (a bad rank, an
    // unknown parameter) is an error, not a cell of the table.
    let mut plain = base.clone();
    plain.set.insert(vary.to_string(), "1".into());
    plain.set.remove("strategy");
    if let Err(e @ ScenarioError::Parameter { .. }) = super::check(&plain)
        && !strategies.is_empty()
    {
        return Err(e);
    }
    refuse_long_searches(base)?;
    refuse_large_tables(&plain, vary, strategies, cards)?;
    let total = strategies.len() * cards.len();
    let mut cells = Vec::with_capacity(total);
    for strategy in strategies {
        for card in cards {
            let mut request = base.clone();
            request.set.insert("strategy".into(), strategy.clone());
            request.device = Some(if card.starts_with("sim:") { card.clone() } else { format!("sim:{card}") });
            request.capacity = None;
            cells.push(largest_that_fits(&request, vary)?);
            progress(cells.len(), total);
        }
    }
    let world = base.set.get("world").and_then(|w| w.parse().ok()).unwrap_or(1);
    Ok(FitTable { scenario: base.scenario.clone(), vary: vary.to_string(), world, cells })
}
