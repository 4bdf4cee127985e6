//! The doctor's labelled corpus (issue 31): real PyTorch recordings of ordinary programs in
//! tests/data/corpus, and the H100 twins and real snapshots under ../shared/fixtures, each with
//! the kinds it must and must not show (tests/data/corpus/labels.json). The corpus is kept sound
//! (every file labelled and loadable with the stacks it claims, every label a known kind), the
//! doctor is scored on it (precision and recall, printed), and the twins give the table of
//! taught kinds (`cargo test --test doctor_corpus -- --nocapture`).

mod common;

use common::taught::{NEED_THE_OP, TAUGHT};
use serde_json::Value;
use std::path::Path;
use tensormem::{doctor, trace};

fn corpus() -> (std::path::PathBuf, Value) {
    let dir = Path::new(env!("CARGO_MANIFEST_DIR")).join("tests/data/corpus");
    let labels: Value = serde_json::from_str(&std::fs::read_to_string(dir.join("labels.json")).unwrap()).unwrap();
    (dir, labels)
}

#[test]
fn every_recording_is_labelled_with_known_kinds_and_loads_with_its_stacks() {
    let (dir, labels) = corpus();
    let files = labels["files"].as_object().unwrap();
    let mut on_disk: Vec<String> = std::fs::read_dir(&dir)
        .unwrap()
        .map(|e| e.unwrap().file_name().to_string_lossy().into_owned())
        .filter_map(|n| n.strip_suffix(".pickle").map(str::to_string))
        .collect();
    on_disk.sort();
    let mut labelled: Vec<String> = files.keys().cloned().collect();
    labelled.sort();
    assert_eq!(on_disk, labelled, "every recording has a label and every label a recording");
    for (name, label) in labels["shared"].as_object().unwrap() {
        for key in ["expect", "absent", "inconclusive"] {
            for kind in label[key].as_array().unwrap() {
                assert!(doctor::KINDS.contains(&kind.as_str().unwrap()), "{name}: {key} names an unknown kind {kind}");
            }
        }
        assert_eq!(name.contains('#'), label.get("device").is_some(), "{name}: a device named in the key and the label alike");
    }
    for (name, label) in files {
        for key in ["expect", "absent", "inconclusive"] {
            for kind in label[key].as_array().unwrap() {
                assert!(doctor::KINDS.contains(&kind.as_str().unwrap()), "{name}: {key} names an unknown kind {kind}");
            }
        }
        let snapshot = trace::load_file(&dir.join(format!("{name}.pickle"))).unwrap();
        let entries = snapshot.trace_of(0);
        assert!(entries.iter().filter(|e| e.action == trace::Action::Alloc).count() >= 10, "{name}: a program's allocations");
        let frames = || entries.iter().flat_map(|e| e.frames.iter().flat_map(|f| f.iter()));
        assert!(frames().any(|f| f.filename.ends_with(".py")), "{name}: Python frames");
        let cpp = frames().any(|f| !f.filename.ends_with(".py") && !f.filename.is_empty());
        assert_eq!(cpp, name.ends_with("all-stacks"), "{name}: C++ frames only where recorded with stacks='all'");
    }
}

/// The findings that are problems: not information (`peak`, `intermediates`,
/// `outside-allocator`), not inconclusive.
fn problems(d: &doctor::Diagnosis) -> Vec<&str> {
    let information = [doctor::PEAK, doctor::INTERMEDIATES, doctor::OUTSIDE_ALLOCATOR];
    d.findings.iter().filter(|f| !information.contains(&f.kind.as_str()) && !f.is_inconclusive()).map(|f| f.kind.as_str()).collect()
}

/// One label checked: `expect` holds when the kind is among the first two problems; `absent`
/// and `inconclusive` when it is not a problem at all (an inconclusive finding is not one).
struct Check {
    file: String,
    kind: String,
    asked: String,
    holds: bool,
}

fn judge(file: &str, path: &Path, label: &Value) -> Vec<Check> {
    let snapshot = trace::load_file(path).unwrap_or_else(|e| panic!("{file}: {e}"));
    let options = doctor::DoctorOptions { device: label["device"].as_i64(), capacity: None };
    let d = doctor::diagnose(&snapshot, &options).unwrap_or_else(|e| panic!("{file}: {e}"));
    let problems = problems(&d);
    let mut checks = Vec::new();
    for asked in ["expect", "absent", "inconclusive"] {
        for kind in label[asked].as_array().unwrap().iter().filter_map(Value::as_str) {
            let holds = if asked == "expect" { problems.iter().take(2).any(|k| *k == kind) } else { !problems.contains(&kind) };
            checks.push(Check { file: file.to_string(), kind: kind.to_string(), asked: asked.to_string(), holds });
        }
    }
    checks
}

/// Every labelled file: the corpus recorded for the doctor, then the files under ../shared/fixtures
/// (None where that folder is missing, outside CI).
fn all_checks() -> Option<Vec<Check>> {
    let (dir, labels) = corpus();
    let shared = common::fixtures_dir()?.parent().unwrap().to_path_buf();
    let mut checks = Vec::new();
    for (name, label) in labels["files"].as_object().unwrap() {
        checks.extend(judge(name, &dir.join(format!("{name}.pickle")), label));
    }
    for (name, label) in labels["shared"].as_object().unwrap() {
        let file = name.split('#').next().unwrap();
        checks.extend(judge(name, &shared.join(file), label));
    }
    Some(checks)
}

#[test]
fn the_doctor_is_right_on_the_labelled_corpus_precision_and_recall() {
    let Some(checks) = all_checks() else { return };
    let count = |asked: &str, holds: bool| checks.iter().filter(|c| c.asked == asked && c.holds == holds).count();
    let (found, missed) = (count("expect", true), count("expect", false));
    let false_alarms = count("absent", false) + count("inconclusive", false);
    let precision = found as f64 / (found + false_alarms).max(1) as f64;
    let recall = found as f64 / (found + missed).max(1) as f64;
    let files: std::collections::BTreeSet<&str> = checks.iter().map(|c| c.file.as_str()).collect();
    eprintln!(
        "doctor over {} labelled files, {} checks: precision {:.3} ({found} found, {false_alarms} false alarms), recall {:.3} ({missed} missed)",
        files.len(),
        checks.len(),
        precision,
        recall
    );
    let wrong: Vec<String> = checks.iter().filter(|c| !c.holds).map(|c| format!("{}: {} {}", c.file, c.asked, c.kind)).collect();
    assert!(wrong.is_empty(), "labels the doctor gets wrong:\n{}", wrong.join("\n"));
}

#[test]
fn each_twin_is_diagnosed_with_the_kind_its_scenario_teaches() {
    let Some(dir) = common::fixtures_dir() else { return };
    let twins = dir.parent().unwrap().join("h100-twins");
    let mut table = vec![format!("{:<16} {:<8} {:<16} {:<7} {}", "twin", "variant", "taught kind", "found", "problems")];
    let mut wrong = Vec::new();
    // The lessons Python stacks can show.
    for (scenario, kind) in TAUGHT.into_iter().filter(|(_, kind)| !NEED_THE_OP.contains(kind)) {
        let variants: &[Option<&str>] = if twins.join(format!("{scenario}-mistake.pickle")).is_file() { &[Some("mistake"), Some("fix")] } else { &[None] };
        for &variant in variants {
            let file = match variant {
                Some(v) => format!("{scenario}-{v}.pickle"),
                None => format!("{scenario}.pickle"),
            };
            let snapshot = trace::load_file(&twins.join(&file)).unwrap_or_else(|e| panic!("{file}: {e}"));
            let d = doctor::diagnose(&snapshot, &doctor::DoctorOptions::default()).unwrap();
            let problems = problems(&d);
            let rank = problems.iter().position(|k| *k == kind).map(|i| i + 1);
            let holds = if variant == Some("fix") { rank.is_none() } else { rank.is_some_and(|r| r <= 2) };
            let found = rank.map_or("absent".to_string(), |r| format!("#{r}"));
            table.push(format!("{scenario:<16} {:<8} {kind:<16} {found:<7} {}", variant.unwrap_or("-"), problems.join(", ")));
            if !holds {
                wrong.push(format!("{file}: {kind} {found}"));
            }
        }
    }
    eprintln!("{}", table.join("\n"));
    assert!(wrong.is_empty(), "{wrong:?}");
}

#[test]
fn python_only_stacks_say_once_what_they_cannot_show() {
    // The same program recorded with Python frames only and with C++ frames too: only the first
    // lacks the ops that copies and temporaries read, and the diagnosis says so, once.
    let (dir, _) = corpus();
    let diagnose = |name: &str| doctor::diagnose(&trace::load_file(&dir.join(name)).unwrap(), &doctor::DoctorOptions::default()).unwrap();
    let python = diagnose("clean-train.pickle");
    assert_eq!(python.notes.len(), 1, "{:?}", python.notes);
    assert!(python.notes[0].contains("stacks=\"all\""), "{}", python.notes[0]);
    assert!(diagnose("clean-train-all-stacks.pickle").notes.is_empty());
}
