//! Helpers of the doctor's tests (tests/doctor.rs, tests/doctor_hand_made.rs): diagnosing, reading
//! findings, and the checks every diagnosis and every verified figure must pass.

use serde_json::Value;
use tensormem::alloc::AllocatorConfig;
use tensormem::doctor::{self, Diagnosis, DoctorOptions, Finding, FindingConfidence, Verified};
use tensormem::replay::{self, ReplayOptions, StartMode};
use tensormem::trace::{self, Snapshot};

pub fn load(name: &str) -> Option<Snapshot> {
    Some(trace::load_file(&super::fixture(name)?).unwrap())
}

pub fn diagnose(snapshot: &Snapshot, capacity: Option<u64>) -> Diagnosis {
    doctor::diagnose(snapshot, &DoctorOptions { device: None, capacity, ..Default::default() }).unwrap()
}

pub fn kinds(d: &Diagnosis) -> Vec<&str> {
    d.findings.iter().map(|f| f.kind.as_str()).collect()
}

pub fn finding<'a>(d: &'a Diagnosis, kind: &str) -> &'a Finding {
    d.findings.iter().find(|f| f.kind == kind).unwrap_or_else(|| panic!("no {kind} finding in {:?}", kinds(d)))
}

pub fn start(text: &str) -> StartMode {
    StartMode::parse(text).unwrap()
}

/// A verified figure is a replay's: the same settings, start and capacity give the same peaks.
pub fn assert_replay_agrees(snapshot: &Snapshot, device: i64, v: &Verified) {
    let options =
        ReplayOptions { config: Some(AllocatorConfig::parse(&v.alloc_conf).unwrap()), capacity: v.capacity, start: start(&v.start), ..Default::default() };
    let r = replay::replay_device(snapshot, device, &options, &mut |_, _| {}).unwrap();
    assert_eq!(r.replayed.figures.peak_reserved_bytes, v.after_peak_reserved_bytes, "{}", v.how);
    assert_eq!(r.replayed.figures.peak_allocated_bytes, v.after_peak_allocated_bytes, "{}", v.how);
    assert_eq!(r.replayed.ooms > 0, v.after_out_of_memory, "{}", v.how);
}

/// The `peak` finding first (after `no-history` for a file without one), exactly once, then the
/// problems by bytes at stake, then `outside-allocator` (information, always last); JSON
/// round-trips.
pub fn assert_well_formed(name: &str, d: &Diagnosis) {
    let d = &Diagnosis { findings: d.findings.iter().filter(|f| f.kind != doctor::NO_HISTORY).cloned().collect(), notes: d.notes.clone() };
    assert_eq!(d.findings.first().map(|f| f.kind.as_str()), Some(doctor::PEAK), "{name}");
    assert_eq!(kinds(d).iter().filter(|&&k| k == doctor::PEAK).count(), 1, "{name}");
    assert_eq!(d.findings.last().map(|f| f.kind.as_str()), Some(doctor::OUTSIDE_ALLOCATOR), "{name}");
    assert_eq!(kinds(d).iter().filter(|&&k| k == doctor::OUTSIDE_ALLOCATOR).count(), 1, "{name}");
    // Problems by bytes, then the inconclusive findings (never ranked among them).
    let middle = &d.findings[1..d.findings.len() - 1];
    let problems: Vec<&Finding> = middle.iter().filter(|f| !f.is_inconclusive()).collect();
    let oom = problems.iter().position(|f| f.kind == doctor::OOM);
    assert!(oom.is_none_or(|i| i == 0), "{name}: an out-of-memory error comes first");
    // Memory from before the trace is about the recording: it comes after the program's problems.
    let truncated = problems.iter().position(|f| f.kind == doctor::TRUNCATED_TRACE);
    assert!(truncated.is_none_or(|i| i == problems.len() - 1), "{name}: truncated-trace after the program's problems");
    let bytes: Vec<u64> = problems.iter().filter(|f| f.kind != doctor::OOM && f.kind != doctor::TRUNCATED_TRACE).map(|f| f.bytes).collect();
    assert!(bytes.windows(2).all(|w| w[0] >= w[1]), "{name}: problems not ranked by bytes: {bytes:?}");
    assert!(middle.windows(2).all(|w| !w[0].is_inconclusive() || w[1].is_inconclusive()), "{name}: an inconclusive finding ranked among the problems");
    for f in &d.findings {
        assert_eq!(f.confidence_reason.is_some(), f.confidence != FindingConfidence::High, "{name}: {} says why it is not high exactly when it is not", f.kind);
    }
    for f in &d.findings {
        assert!(doctor::KINDS.contains(&f.kind.as_str()), "{name}: {}", f.kind);
        assert!(!f.title.contains('\n') && !f.why.is_empty() && !f.fix.is_empty(), "{name}: {f:?}");
    }
    let json = serde_json::to_string(d).unwrap();
    let back: Diagnosis = serde_json::from_str(&json).unwrap();
    assert_eq!(&back, d, "{name}");
    let value: Value = serde_json::from_str(&json).unwrap();
    assert!(value["findings"].is_array(), "{name}");
}
