//! Shared helpers for integration tests.
#![allow(dead_code)]

use std::path::PathBuf;

/// The folder of real PyTorch snapshots: `TENSORMEM_FIXTURES`, or `../shared/fixtures/pytorch-snapshots`.
/// Returns None (test skipped with a note) when missing, except under CI where that is a failure.
pub fn fixtures_dir() -> Option<PathBuf> {
    let dir = std::env::var_os("TENSORMEM_FIXTURES")
        .map(PathBuf::from)
        .unwrap_or_else(|| PathBuf::from(env!("CARGO_MANIFEST_DIR")).join("../shared/fixtures/pytorch-snapshots"));
    if dir.is_dir() {
        return Some(dir);
    }
    if std::env::var("CI").as_deref() == Ok("true") {
        panic!("fixture folder {} is missing (set TENSORMEM_FIXTURES); CI requires it", dir.display());
    }
    eprintln!("skipping: fixture folder {} not found", dir.display());
    None
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
