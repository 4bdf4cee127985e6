//! A scenario diagnosed: its run's findings, and for a mistake its fix run too, the mistake's
//! findings the fix no longer shows getting the two runs' peaks as their `verified` (where no
//! replay of the file itself already measured one). The command line, the MCP tool and the tests
//! ask here. The doctor reads the mistake's trace alone; this only adds what running the fix
//! measured.

use super::{RunRequest, RunResult, ScenarioError};
use crate::alloc::AllocatorConfig;
use crate::doctor::{self, Diagnosis, DoctorError, DoctorOptions, PEAK, Verified};

/// A scenario's run and its diagnosis; for a mistake, its fix's run and diagnosis as well.
pub struct Diagnosed {
    pub run: RunResult,
    pub diagnosis: Diagnosis,
    pub fix: Option<(RunResult, Diagnosis)>,
}

#[derive(Debug, thiserror::Error)]
pub enum DiagnoseError {
    #[error(transparent)]
    Scenario(#[from] ScenarioError),
    #[error(transparent)]
    Doctor(#[from] DoctorError),
}

/// Runs `request` on its simulated card and diagnoses the run (`options`: the doctor's); a
/// mistake's fix variant is run and diagnosed too, and verifies the findings it removes, naming
/// the `tensormem run` command that repeats it.
pub fn diagnose(request: &RunRequest, options: &DoctorOptions) -> Result<Diagnosed, DiagnoseError> {
    diagnose_skipping(request, options, &[])
}

/// [`diagnose`] without the finders named in `skip` (`doctor::diagnose_skipping`: the page's
/// retry after a finder's panic).
pub fn diagnose_skipping(request: &RunRequest, options: &DoctorOptions, skip: &[String]) -> Result<Diagnosed, DiagnoseError> {
    let run = super::run(request)?;
    let mut diagnosis = doctor::diagnose_skipping(&run.snapshot, options, skip)?;
    let mut fix = None;
    if run.variant.as_deref() == Some("mistake") {
        let fix_request = RunRequest { variant: Some("fix".into()), ..request.clone() };
        let fix_run = super::run(&fix_request)?;
        let fixed = doctor::diagnose_skipping(&fix_run.snapshot, options, skip)?;
        let sets: String = fix_request.set.iter().map(|(k, v)| format!(" --set {k}={v}")).collect();
        let command = format!("tensormem run {} --variant fix{sets} --device {} --json", fix_run.scenario, fix_run.device);
        verify_by_fix(&mut diagnosis, &run, &fix_run, &fixed, &command);
        fix = Some((fix_run, fixed));
    }
    Ok(Diagnosed { run, diagnosis, fix })
}

/// Adds the fix run's effect to each problem of `diagnosis` (the mistake's) that `fixed` (the
/// fix's diagnosis) does not report. `command` is the `tensormem run` line of the fix.
fn verify_by_fix(diagnosis: &mut Diagnosis, mistake: &RunResult, fix: &RunResult, fixed: &Diagnosis, command: &str) {
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
