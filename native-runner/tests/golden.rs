//! Every `--json` the command line prints on the shared fixtures and the scenarios, byte for byte
//! against `tests/golden/`: a change of structure (moving modules, splitting files) must not
//! change one answer. When an answer should change, regenerate the files with
//! `TENSORMEM_BLESS=1 cargo test -p native-runner --test golden` and review their diff.

use std::path::{Path, PathBuf};
use std::process::Command;

#[path = "../../tests/common/mod.rs"]
mod common;

/// One command and the name of its golden file.
struct Case {
    name: String,
    args: Vec<String>,
}

fn case(name: impl Into<String>, args: &[&str]) -> Case {
    Case { name: name.into(), args: args.iter().map(|a| a.to_string()).collect() }
}

fn scenario_names() -> Vec<String> {
    let out = Command::new(env!("CARGO_BIN_EXE_tensormem")).args(["scenarios", "--json"]).output().expect("the binary runs");
    let list: serde_json::Value = serde_json::from_slice(&out.stdout).expect("scenarios --json is JSON");
    list.as_array().expect("a list").iter().map(|s| s["name"].as_str().expect("a name").to_string()).collect()
}

/// The commands: the snapshot tools on each PyTorch fixture, each scenario run and diagnosed,
/// predictions from the H100 recordings, and one `fit`.
fn cases(fixtures: &Path) -> Vec<Case> {
    let mut cases = vec![case("scenarios", &["scenarios", "--json"])];
    let mut snapshots: Vec<PathBuf> = std::fs::read_dir(fixtures)
        .expect("the fixture folder reads")
        .map(|e| e.expect("an entry").path())
        .filter(|p| p.extension().is_some_and(|e| e == "pickle"))
        .collect();
    snapshots.sort();
    for path in &snapshots {
        let stem = path.file_stem().unwrap().to_string_lossy();
        for command in ["summary", "replay", "doctor"] {
            cases.push(case(format!("{command}-{stem}"), &[command, path.to_str().unwrap(), "--json"]));
        }
    }
    for name in scenario_names() {
        cases.push(case(format!("run-{name}"), &["run", &name, "--json"]));
        cases.push(case(format!("doctor-scenario-{name}"), &["doctor", "--scenario", &name, "--json"]));
    }
    let recordings = fixtures.join("../predict-inputs");
    for (name, stem) in [("gpt2", "gpt2-train"), ("llama", "llama8b-lora16-sdpa-b2")] {
        let at = |context: u32| format!("{}@context={context}", recordings.join(format!("{stem}-ctx{context}.pickle")).display());
        cases.push(case(format!("predict-{name}"), &["predict", &at(256), &at(512), "--to", "context=1024", "--json"]));
    }
    cases.push(case("fit-lm-train", &["fit", "lm-train", "--json"]));
    cases
}

/// Where two outputs part, as a line and column with a little context.
fn first_difference(got: &str, want: &str) -> String {
    let at = got.bytes().zip(want.bytes()).position(|(a, b)| a != b).unwrap_or(got.len().min(want.len()));
    let line = want[..at.min(want.len())].matches('\n').count() + 1;
    let around = |s: &str| s.get(at.saturating_sub(60)..(at + 60).min(s.len())).unwrap_or("").to_string();
    format!("line {line}, byte {at}: got …{}… expected …{}…", around(got), around(want))
}

#[test]
fn every_json_answer_is_the_golden_one() {
    let Some(fixtures) = common::fixtures_dir() else { return };
    let golden = Path::new(env!("CARGO_MANIFEST_DIR")).join("tests/golden");
    let bless = std::env::var("TENSORMEM_BLESS").as_deref() == Ok("1");
    let mut wrong = Vec::new();
    let cases = cases(&fixtures);
    for case in &cases {
        let out = Command::new(env!("CARGO_BIN_EXE_tensormem")).args(&case.args).output().expect("the binary runs");
        // The out-of-memory scenario exits 1 after printing its answer; anything else must succeed.
        let expected_failure = case.name == "run-oom";
        if out.status.success() == expected_failure {
            wrong.push(format!("{}: exit {:?}: {}", case.name, out.status.code(), String::from_utf8_lossy(&out.stderr)));
            continue;
        }
        let got = String::from_utf8(out.stdout).expect("UTF-8 output");
        let file = golden.join(format!("{}.json", case.name));
        if bless {
            std::fs::create_dir_all(&golden).unwrap();
            std::fs::write(&file, &got).unwrap();
            continue;
        }
        match std::fs::read_to_string(&file) {
            Ok(want) if want == got => {}
            Ok(want) => wrong.push(format!("{}: {}", case.name, first_difference(&got, &want))),
            Err(e) => wrong.push(format!("{}: no golden file {} ({e}): run with TENSORMEM_BLESS=1", case.name, file.display())),
        }
    }
    // A golden file no command writes any more is stale.
    if !bless {
        let names: std::collections::HashSet<String> = cases.iter().map(|c| format!("{}.json", c.name)).collect();
        for entry in std::fs::read_dir(&golden).expect("tests/golden exists") {
            let name = entry.unwrap().file_name().to_string_lossy().into_owned();
            if !names.contains(&name) {
                wrong.push(format!("{name}: no command writes it any more: delete it"));
            }
        }
    }
    assert!(wrong.is_empty(), "{} of {} answers differ from tests/golden:\n{}", wrong.len(), cases.len(), wrong.join("\n"));
}
