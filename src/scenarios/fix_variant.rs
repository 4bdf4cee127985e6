//! A scenario's mistake, verified by running its fix variant: the findings the fix no longer
//! shows get the two runs' peaks as their `verified` (where no replay of the file itself already
//! measured one).
//! The doctor reads the mistake's trace alone; this only adds what running the fix measured.

use super::RunResult;
use crate::alloc::AllocatorConfig;
use crate::doctor::{Diagnosis, PEAK, Verified};

/// Adds the fix run's effect to each problem of `diagnosis` (the mistake's) that `fixed` (the
/// fix's diagnosis) does not report. `command` is the `tensormem run` line of the fix.
pub fn verify_by_fix(diagnosis: &mut Diagnosis, mistake: &RunResult, fix: &RunResult, fixed: &Diagnosis, command: &str) {
    let remains = |kind: &str| fixed.findings.iter().any(|f| f.kind == kind);
    // A run of the fix outranks a replay of an edited trace (a verification without a command).
    let replaceable = |v: &Option<Verified>| v.as_ref().is_none_or(|v| v.command.is_none());
    for finding in diagnosis.findings.iter_mut().filter(|f| f.kind != PEAK && replaceable(&f.verified) && !remains(&f.kind)) {
        finding.verified = Some(Verified {
            how: format!("run the scenario's fix variant ({} --variant fix): the finding is gone", mistake.scenario),
            command: Some(command.to_string()),
            // The run's settings, where they are settings ("(defaults)" is none).
            alloc_conf: AllocatorConfig::parse(&fix.settings).map(|_| fix.settings.clone()).unwrap_or_default(),
            start: "recorded".into(),
            capacity: None,
            before_peak_reserved_bytes: mistake.peak_reserved_bytes,
            after_peak_reserved_bytes: fix.peak_reserved_bytes,
            before_peak_allocated_bytes: mistake.peak_allocated_bytes,
            after_peak_allocated_bytes: fix.peak_allocated_bytes,
            before_out_of_memory: mistake.out_of_memory.is_some(),
            after_out_of_memory: fix.out_of_memory.is_some(),
        });
    }
}
