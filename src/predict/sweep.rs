//! What the page draws beside a prediction: `tensormem predict`'s whole request (a fit, then the
//! prediction at the target) in one call, and the peaks over a range of values of one variable,
//! each by replay (one alignment and fit for all of them).

use super::{Model, PredictError, PredictOptions, Prediction, Recording, Values, fit, predict};
use serde::Serialize;

/// `tensormem predict`: with `fit` and a capacity, the largest value of that variable that fits
/// first; then the prediction at `target`, where the fitted variable, unless `target` gives it,
/// is the largest value that fits (the smallest recorded when none does).
pub fn predict_or_fit(recordings: &[Recording], target: &Values, fit_variable: Option<&str>, options: &PredictOptions) -> Result<Prediction, PredictError> {
    let mut target = target.clone();
    let found = match (fit_variable, options.capacity) {
        (Some(variable), Some(capacity)) => {
            let mut others = target.clone();
            others.remove(variable);
            let found = fit(recordings, &others, variable, capacity, options)?;
            let smallest = recordings.iter().filter_map(|r| r.values.get(variable)).min().copied().unwrap_or(1);
            target.entry(variable.to_string()).or_insert(found.largest.unwrap_or(smallest));
            Some(found)
        }
        (Some(variable), None) => {
            return Err(PredictError::Input(format!("--fit {variable} needs --capacity: the card's memory (a size, or a preset such as H100-80GB)")));
        }
        _ => None,
    };
    let mut prediction = predict(recordings, &target, options)?;
    prediction.fit = found;
    Ok(prediction)
}

/// Peaks predicted at one value.
#[derive(Debug, Clone, PartialEq, Eq, Serialize)]
pub struct Peak {
    pub value: u64,
    pub peak_allocated_bytes: u64,
    pub peak_reserved_bytes: u64,
}

/// About `points` values of `variable` from `low` to `high`, evenly spaced, with each of `also`
/// (recorded values, the target, the largest that fits) in that range, ascending.
pub fn sweep_values(low: u64, high: u64, points: usize, also: &[u64]) -> Vec<u64> {
    let (low, high) = (low.max(1), high.max(low.max(1)));
    let steps = points.max(2) as u64 - 1;
    let mut values: Vec<u64> = (0..=steps).map(|i| low + ((high - low) as u128 * i as u128 / steps as u128) as u64).collect();
    values.extend(also.iter().copied().filter(|v| (low..=high).contains(v)));
    values.sort_unstable();
    values.dedup();
    values
}

/// The predicted peaks at each of `values` of `variable` (the other variables as `others` gives
/// them), without a capacity, under `options`' settings; `progress(done, of)` after each.
pub fn sweep(
    recordings: &[Recording],
    others: &Values,
    variable: &str,
    values: &[u64],
    options: &PredictOptions,
    progress: &mut dyn FnMut(usize, usize),
) -> Result<Vec<Peak>, PredictError> {
    let at = |v: u64| {
        let mut target = others.clone();
        target.insert(variable.to_string(), v);
        target
    };
    let Some(&last) = values.last() else { return Ok(Vec::new()) };
    let model = Model::new(recordings, &at(last), options)?;
    let options = PredictOptions { capacity: None, keep_snapshot: false, ..options.clone() };
    let mut peaks = Vec::with_capacity(values.len());
    for (i, &v) in values.iter().enumerate() {
        let p = model.predict(&at(v), &options)?;
        peaks.push(Peak { value: v, peak_allocated_bytes: p.peak_allocated_bytes, peak_reserved_bytes: p.peak_reserved_bytes });
        progress(i + 1, values.len());
    }
    Ok(peaks)
}

#[cfg(test)]
mod tests {
    use super::sweep_values;

    #[test]
    fn values_are_spread_evenly_and_keep_the_ones_asked_for() {
        assert_eq!(sweep_values(128, 1024, 8, &[256, 1000, 5000]), [128, 256, 384, 512, 640, 768, 896, 1000, 1024]);
        assert_eq!(sweep_values(4, 4, 12, &[]), [4]);
        assert_eq!(sweep_values(1, 3, 12, &[]), [1, 2, 3]);
    }
}
