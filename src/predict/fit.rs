//! What fits: the largest value of one variable at which the predicted program does not run out
//! of memory on a card, found by replaying predictions (a search, not a formula), under the
//! settings given and under `expandable_segments:True`, side by side.

use super::{Model, PredictError, PredictOptions, Recording, Values};
use crate::alloc::AllocatorConfig;
use crate::replay;
use serde::Serialize;

/// Values are searched up to this (2^24 tokens or sequences).
pub const SEARCH_LIMIT: u64 = 1 << 24;

#[derive(Debug, Clone, PartialEq, Eq, Serialize)]
pub struct Fit {
    pub variable: String,
    pub capacity_bytes: u64,
    /// Settings of the first search (the recording's own unless others are given).
    pub settings: String,
    /// The largest value that fits; None: not even 1 does.
    pub largest: Option<u64>,
    /// The same with `expandable_segments:True` on top of those settings.
    pub expandable_settings: String,
    pub largest_expandable: Option<u64>,
    /// A largest value equal to this may be larger still: the search stopped there.
    pub search_limit: u64,
    /// Predictions replayed by both searches.
    pub replays: usize,
    /// Said when a largest value lies more than 4x beyond the recorded ones: the laws are
    /// checked only where the program was recorded.
    pub warning: Option<String>,
}

/// The largest value of `variable` (the others as `others` gives them, where they vary) whose
/// prediction fits `capacity`.
pub fn fit(recordings: &[Recording], others: &Values, variable: &str, capacity: u64, options: &PredictOptions) -> Result<Fit, PredictError> {
    let Some(first) = recordings.first() else { return Err(PredictError::Input("give at least one recording".into())) };
    let Some(&start) = recordings.iter().filter_map(|r| r.values.get(variable)).max() else {
        let known = first.values.keys().cloned().collect::<Vec<_>>().join(", ");
        return Err(PredictError::Input(format!("--fit {variable}: no recording gives {variable} (they give: {known})")));
    };
    if recordings.len() > 1 && recordings.iter().all(|r| r.values.get(variable) == Some(&start)) {
        return Err(PredictError::Input(format!("--fit {variable}: {variable} is {start} in every recording: record one at another {variable}")));
    }
    let base = match &options.config {
        Some(c) => c.clone(),
        None => replay::recorded_config(first.snapshot).map_err(|e| PredictError::Settings(first.label.clone(), e))?,
    };
    let expandable_text = [base.raw.as_str(), "expandable_segments:True"].iter().filter(|s| !s.is_empty()).copied().collect::<Vec<_>>().join(",");
    let expandable = AllocatorConfig::parse(&expandable_text).map_err(|e| PredictError::Input(e.to_string()))?;
    let at = |v: u64| {
        let mut target = others.clone();
        target.insert(variable.to_string(), v);
        target
    };
    // Aligned and fitted once, for the largest recorded value (the search goes up from there).
    let model = Model::new(recordings, &at(start), options)?;
    let mut replays = 0;
    let mut largest = |config: &AllocatorConfig| -> Result<Option<u64>, PredictError> {
        let options = PredictOptions { config: Some(config.clone()), capacity: Some(capacity), keep_snapshot: false, ..options.clone() };
        let mut fits = |v: u64| -> Result<bool, PredictError> {
            replays += 1;
            Ok(model.predict(&at(v), &options)?.out_of_memory.is_none())
        };
        largest_fitting(start, SEARCH_LIMIT, &mut fits)
    };
    let found = largest(&base)?;
    let found_expandable = largest(&expandable)?;
    let farthest = found.max(found_expandable).unwrap_or(0);
    let warning = (farthest as f64 > super::how_sure::FAR_BEYOND * start as f64).then(|| {
        format!(
            "{variable}={farthest} lies {:.1}x beyond the largest recorded {variable} ({start}): the laws are checked only where the \
             program was recorded; record nearer the values found to be sure",
            farthest as f64 / start as f64
        )
    });
    Ok(Fit {
        variable: variable.to_string(),
        capacity_bytes: capacity,
        settings: base.to_string(),
        largest: found,
        expandable_settings: expandable.to_string(),
        largest_expandable: found_expandable,
        search_limit: SEARCH_LIMIT,
        replays,
        warning,
    })
}

/// The largest v in 1..=`limit` with `fits(v)`, taking memory to grow with v: doubling (or
/// halving) from `start` to bracket it, then bisecting. The one search for "the largest value
/// that fits": `predict --fit` replays predictions with it, `tensormem fit` runs scenarios.
pub fn largest_fitting<E>(start: u64, limit: u64, fits: &mut dyn FnMut(u64) -> Result<bool, E>) -> Result<Option<u64>, E> {
    let start = start.clamp(1, limit);
    // `low` fits, `high` does not.
    let (mut low, mut high) = if fits(start)? {
        let mut low = start;
        loop {
            if low == limit {
                return Ok(Some(limit));
            }
            let next = low.saturating_mul(2).min(limit);
            if !fits(next)? {
                break (low, next);
            }
            low = next;
        }
    } else {
        let mut high = start;
        loop {
            if high == 1 {
                return Ok(None);
            }
            let next = high / 2;
            if fits(next)? {
                break (next, high);
            }
            high = next;
        }
    };
    while high - low > 1 {
        let mid = low + (high - low) / 2;
        if fits(mid)? { low = mid } else { high = mid }
    }
    Ok(Some(low))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn search_finds_the_boundary_from_either_side() {
        for (start, boundary) in [(128, 1000), (128, 128), (128, 5), (1, 1), (7, 7_000_000)] {
            let mut calls = 0;
            let found = largest_fitting::<PredictError>(start, SEARCH_LIMIT, &mut |v| {
                calls += 1;
                Ok(v <= boundary)
            })
            .unwrap();
            assert_eq!(found, Some(boundary), "start {start}");
            assert!(calls <= 60);
        }
        assert_eq!(largest_fitting::<PredictError>(128, SEARCH_LIMIT, &mut |_| Ok(false)).unwrap(), None);
        assert_eq!(largest_fitting::<PredictError>(128, SEARCH_LIMIT, &mut |_| Ok(true)).unwrap(), Some(SEARCH_LIMIT));
    }
}
