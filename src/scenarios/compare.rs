//! A training run's predicted memory against a real PyTorch trace of a training step
//! (`torch.cuda.memory._record_memory_history`, dumped after the step): allocated bytes at the
//! end of the forward pass, of the loss, of backward and of the optimizer step, and the peak.
//! The trace's phases are found from its Python frames ([`trace_phases`]).

pub use crate::pytorch::{TracePhases, trace_phases};
use crate::replay::ReplayError;
use crate::timeline;
use crate::trace::Snapshot;
use serde::Serialize;

/// One phase's allocated bytes in the trace and in the run.
#[derive(Debug, Clone, Serialize)]
pub struct PhaseComparison {
    pub phase: &'static str,
    /// Allocated in the trace: the bytes its tensors requested (the trace's sizes), from the
    /// state reconstructed at its start.
    pub trace_bytes: u64,
    /// The run's: the bytes its live tensors requested (as the trace counts them; whole blocks,
    /// `memory_allocated()`, are a little more).
    pub run_bytes: u64,
}

impl PhaseComparison {
    /// (run - trace) / trace.
    pub fn difference(&self) -> f64 {
        (self.run_bytes as f64 - self.trace_bytes as f64) / self.trace_bytes.max(1) as f64
    }
}

/// The allocated bytes of the run's last recorded step against the trace's, phase by phase,
/// and the peaks. `run` is `tensormem run --json`'s output for lm-train or gpt2-train.
pub fn compare(run: &serde_json::Value, snapshot: &Snapshot, device: i64) -> Result<Vec<PhaseComparison>, String> {
    let phases = trace_phases(snapshot, device)?;
    let timeline = timeline::build_without_bands(snapshot, device).map_err(|e: ReplayError| e.to_string())?;
    let at = |position: usize| timeline.allocated[position] as u64;
    let steps = run["steps"].as_array().ok_or("the run's JSON has no steps (use tensormem run ... --json)")?;
    let step = |phase: &str| -> Result<&serde_json::Value, String> {
        steps
            .iter()
            .rev()
            .find(|s| s["label"].as_str().is_some_and(|l| (l == phase || l.ends_with(&format!(" {phase}"))) && !l.starts_with("warm-up")))
            .ok_or(format!("the run has no {phase:?} step: compare takes lm-train or gpt2-train runs"))
    };
    let bytes = |phase: &str, key: &str| -> Result<u64, String> { step(phase)?[key].as_u64().ok_or(format!("step {phase:?} has no {key}")) };
    let trace_peak = timeline.allocated[..=phases.end].iter().fold(0f64, |m, &v| m.max(v)) as u64;
    let run_peak = ["forward", "loss", "backward", "optimizer step"].iter().map(|p| bytes(p, "max_requested_bytes")).collect::<Result<Vec<_>, _>>()?;
    Ok(vec![
        PhaseComparison { phase: "end of forward", trace_bytes: at(phases.forward_end), run_bytes: bytes("forward", "requested_bytes")? },
        PhaseComparison { phase: "end of loss", trace_bytes: at(phases.backward_start), run_bytes: bytes("loss", "requested_bytes")? },
        PhaseComparison { phase: "end of backward", trace_bytes: at(phases.optimizer_start), run_bytes: bytes("backward", "requested_bytes")? },
        PhaseComparison { phase: "end of optimizer step", trace_bytes: at(phases.end), run_bytes: bytes("optimizer step", "requested_bytes")? },
        PhaseComparison { phase: "peak", trace_bytes: trace_peak, run_bytes: run_peak.into_iter().max().unwrap_or(0) },
    ])
}
