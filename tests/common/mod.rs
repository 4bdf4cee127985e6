//! Shared helpers for integration tests.
#![allow(dead_code)]

pub mod doctor;
pub mod shapes;
pub mod taught;

use std::path::PathBuf;

/// The folder of real PyTorch snapshots: `TENSORMEM_FIXTURES`, or `../shared/fixtures/pytorch-snapshots`.
/// Returns None (test skipped with a note) when missing, except under CI where that is a failure.
pub fn fixtures_dir() -> Option<PathBuf> {
    // The workspace root (this file also serves native-runner's tests) holds Cargo.lock.
    let manifest = PathBuf::from(env!("CARGO_MANIFEST_DIR"));
    let root = manifest.ancestors().find(|d| d.join("Cargo.lock").is_file()).unwrap_or(&manifest).to_path_buf();
    let dir = std::env::var_os("TENSORMEM_FIXTURES").map(PathBuf::from).unwrap_or_else(|| root.join("../shared/fixtures/pytorch-snapshots"));
    if dir.is_dir() {
        return Some(dir);
    }
    if std::env::var("CI").as_deref() == Ok("true") {
        panic!("fixture folder {} is missing (set TENSORMEM_FIXTURES); CI requires it", dir.display());
    }
    skip(format!("fixture folder {} not found (set TENSORMEM_FIXTURES)", dir.display()));
    None
}

/// Says that the running test cannot run here and why, on a line of its own that the test
/// harness does not capture: `SKIPPED name: reason` (scripts/test.sh counts them). The caller
/// then returns; under CI=true callers fail instead.
pub fn skip(reason: impl std::fmt::Display) {
    use std::io::Write;
    let name = std::thread::current().name().unwrap_or("a test").to_string();
    // One write, so that the line stays whole among the harness's own output.
    let _ = std::io::stderr().write_all(format!("SKIPPED {name}: {reason}\n").as_bytes());
}

/// Every real snapshot we hold: the files of tests/data (real programs, the doctor's corpus)
/// and the fixture folder, in order.
pub fn real_snapshot_files() -> Vec<PathBuf> {
    let root = std::path::Path::new(env!("CARGO_MANIFEST_DIR"));
    let mut dirs = vec![root.join("tests/data/real"), root.join("tests/data/corpus")];
    dirs.extend(fixtures_dir());
    let mut files: Vec<PathBuf> = dirs
        .iter()
        .flat_map(|d| std::fs::read_dir(d).unwrap().map(|e| e.unwrap().path()))
        .filter(|p| p.extension().is_some_and(|e| e == "pickle" || e == "pkl"))
        .collect();
    files.sort();
    files
}

pub fn fixture(name: &str) -> Option<PathBuf> {
    fixtures_dir().map(|d| d.join(name))
}

pub const FIXTURES: [&str; 7] = [
    "eor-nn-legacy-with-snapshots.pickle",
    "expandable-3gpu-oom.pickle",
    "finetune-legacy.pickle",
    "gpt-ctx128-forward.pickle",
    "gpt-medium-ctx128-training.pickle",
    "small-state.pickle",
    "tiny-settings.pickle",
];

/// A scenario run request with `--set` values.
pub fn scenario_request(scenario: &str, set: &[(&str, &str)]) -> tensormem::scenarios::RunRequest {
    tensormem::scenarios::RunRequest { scenario: scenario.into(), set: set.iter().map(|(k, v)| (k.to_string(), v.to_string())).collect(), ..Default::default() }
}

/// Runs a scenario on the default simulated card; any error fails the test.
pub fn run_scenario(scenario: &str, set: &[(&str, &str)]) -> tensormem::scenarios::RunResult {
    tensormem::scenarios::run(&scenario_request(scenario, set)).unwrap_or_else(|e| panic!("{scenario} {set:?}: {e}"))
}

/// The error a scenario run is refused with.
pub fn scenario_error(scenario: &str, set: &[(&str, &str)]) -> String {
    tensormem::scenarios::run(&scenario_request(scenario, set)).map(|_| ()).unwrap_err().to_string()
}

/// What the live tensors asked for after the step labelled `label`.
pub fn requested_at(steps: &[tensormem::scenarios::Step], label: &str) -> u64 {
    steps.iter().find(|s| s.label == label).unwrap_or_else(|| panic!("no step {label:?} in {steps:?}")).requested_bytes
}
