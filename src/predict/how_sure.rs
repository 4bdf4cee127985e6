//! How far to trust a prediction: the bytes live at the predicted peak by what their sizes rest
//! on, and how far beyond the recorded values the target lies.

use super::{Variables, law};
use crate::trace::{Action, TraceEntry};
use rustc_hash::FxHashMap;
use serde::Serialize;

/// How far to trust a prediction. The bytes live at the predicted peak (requested), by what
/// their sizes rest on: a law a recording checks beyond those that determine it (constants seen
/// in every recording, one-term laws through two sizes), a law that only passes through the
/// recordings (two terms through two sizes, fractional coefficients, a guess from one
/// recording's factors), or no law (the nearest recording's size stands). An allocation whose
/// law goes negative at the target (clamped to 1 byte) counts at its size in the nearest
/// recording, as only fitted, with a warning that the figures are not to be trusted.
#[derive(Debug, Clone, Default, Serialize)]
pub struct HowSure {
    pub checked_bytes: u64,
    pub extrapolated_bytes: u64,
    pub recorded_size_bytes: u64,
    /// `checked_bytes` over the bytes live at the peak (1 when none are).
    pub checked_share: f64,
    /// How many times beyond the recorded range the target lies: over all variables, the target
    /// over the largest recorded value, or the smallest recorded value over the target (1:
    /// within the range).
    pub beyond_recorded: f64,
    /// Said when the target is far outside the recorded range or most bytes are extrapolated.
    pub warning: Option<String>,
}

/// A target more than this many times beyond the recorded values is far outside them.
pub(super) const FAR_BEYOND: f64 = 4.0;

impl HowSure {
    /// From the predicted trace (`entries`, with each allocation's sureness), the variables and
    /// their values at the target.
    pub(super) fn new(entries: &[TraceEntry], sureness: &[Option<law::Sureness>], vars: &Variables, target: &[i128]) -> HowSure {
        use law::Sureness;
        let mut live: FxHashMap<u64, (u64, Sureness)> = FxHashMap::default();
        let mut now = [0u64; 3];
        let (mut peak, mut at_peak) = (0u64, [0u64; 3]);
        let slot = |s: Sureness| s as usize;
        for (e, s) in entries.iter().zip(sureness) {
            match (e.action, s) {
                (Action::Alloc, Some(s)) => {
                    if let Some((size, old)) = live.insert(e.addr, (e.size, *s)) {
                        now[slot(old)] -= size;
                    }
                    now[slot(*s)] += e.size;
                }
                (Action::FreeRequested, _) => {
                    if let Some((size, old)) = live.remove(&e.addr) {
                        now[slot(old)] -= size;
                    }
                }
                _ => {}
            }
            let total = now.iter().sum::<u64>();
            if total > peak {
                (peak, at_peak) = (total, now);
            }
        }
        // Per variable: how many times beyond its recorded values the target lies (1 within).
        let beyond = |v: usize| {
            let recorded = vars.recorded.iter().map(|x| x[v] as f64);
            let (low, high) = (recorded.clone().fold(f64::INFINITY, f64::min), recorded.fold(0.0, f64::max));
            let t = target[v] as f64;
            (t / high).max(low / t).max(1.0)
        };
        let beyond_recorded = (0..vars.names.len()).map(beyond).fold(1.0, f64::max);
        let [checked_bytes, extrapolated_bytes, recorded_size_bytes] = at_peak;
        let checked_share = if peak == 0 { 1.0 } else { checked_bytes as f64 / peak as f64 };
        let warning = if beyond_recorded > FAR_BEYOND {
            let far: Vec<String> = (0..vars.names.len()).filter(|&v| beyond(v) > FAR_BEYOND).map(|v| format!("{}={}", vars.names[v], target[v])).collect();
            Some(format!(
                "{} lies {beyond_recorded:.1}x beyond the recorded values: the laws are checked only where the program was recorded; \
                 kernels chosen by size (attention backends, cuBLAS heuristics) may allocate otherwise there. Record nearer the target to be sure.",
                far.join(", ")
            ))
        } else if extrapolated_bytes + recorded_size_bytes > checked_bytes {
            Some(format!(
                "most bytes at the peak rest on laws no recording checks ({} only fitted through the recordings, {} at a recorded size): \
                 record the program at one more value to check them",
                crate::alloc::format_size(extrapolated_bytes),
                crate::alloc::format_size(recorded_size_bytes)
            ))
        } else {
            None
        };
        HowSure { checked_bytes, extrapolated_bytes, recorded_size_bytes, checked_share, beyond_recorded, warning }
    }
}
