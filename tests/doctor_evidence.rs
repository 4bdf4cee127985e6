//! The evidence keys the page (`www/diagnosis.js`) reads are keys the finders write: renamed on
//! one side, a key fails here instead of leaving a line blank on a user's screen. (The terminal
//! printer, `native-runner/src/doctor_print.rs`, reads the evidence's Rust types,
//! `tensormem::doctor::evidence`, so the compiler checks it.) `READ` lists what the page reads:
//! every key it reads off a finding's evidence must be listed, and every entry must be written
//! by some finding on the snapshots the repository carries.

use serde_json::Value;
use std::path::Path;
use tensormem::doctor::{self, DoctorOptions, Finding};
use tensormem::trace;

/// What the page reads: (the finding kind, or `*` for any; the path through its evidence, `[]`
/// for every element of a list).
const READ: &[(&str, &str)] = &[
    ("*", "live.position"),
    ("*", "live.bytes"),
    ("*", "live.allocations"),
    ("*", "live.by_group[].name"),
    ("*", "live.by_group[].bytes"),
    ("*", "live.by_group[].allocations"),
    ("*", "live.top_stacks[].bytes"),
    ("*", "live.top_stacks[].allocations"),
    ("*", "live.top_stacks[].frames"),
    ("*", "live.largest[].trace_index"),
    ("*", "live.largest[].address"),
    ("*", "allocations[].trace_index"),
    ("*", "allocations[].address"),
    ("*", "position"),
    ("*", "event"),
    ("fragmentation", "reserved_bytes"),
    ("fragmentation", "allocated_bytes"),
    ("fragmentation", "internal_bytes"),
    ("fragmentation", "external_bytes"),
    ("fragmentation", "free_blocks"),
    ("fragmentation", "largest_free_block_bytes"),
    ("oom", "smallest_capacity_bytes"),
    ("oom", "request_bytes"),
    ("oom", "reserved_bytes"),
];

/// Whether `value` holds `path` (`a.b[].c`): every step present, a list's elements each tried.
fn holds(value: &Value, path: &[&str]) -> bool {
    let Some((step, rest)) = path.split_first() else { return true };
    match step.strip_suffix("[]") {
        Some(list) => value.get(list).and_then(Value::as_array).is_some_and(|items| items.iter().any(|item| holds(item, rest))),
        None => value.get(*step).is_some_and(|next| holds(next, rest)),
    }
}

fn root() -> &'static Path {
    Path::new(env!("CARGO_MANIFEST_DIR"))
}

#[test]
fn every_key_listed_is_read_by_the_page_and_every_key_it_reads_is_listed() {
    let page = std::fs::read_to_string(root().join("www/diagnosis.js")).unwrap();
    for (kind, path) in READ {
        let key = path.rsplit('.').next().unwrap().trim_end_matches("[]");
        assert!(page.contains(key), "{kind}: {path}: the page does not read {key:?} (take it off READ, or it is read under another name)");
    }
    // What the page reads straight off the evidence (`e.x.y`, `evidence?.x?.y`): the first two
    // steps of a path listed. (What it reads off a list's elements is listed by hand.)
    let listed: Vec<String> = READ.iter().map(|(_, p)| p.replace("[]", "")).collect();
    let mut read = Vec::new();
    for (at, _) in page.match_indices("evidence?.").chain(page.match_indices(" e.")).chain(page.match_indices("(e.")) {
        let rest = page[at..].split_once('.').unwrap().1;
        let path: String = rest.chars().take_while(|c| c.is_ascii_alphanumeric() || matches!(c, '_' | '.' | '?')).collect();
        let steps: Vec<&str> = path.split('.').map(|s| s.trim_end_matches('?')).filter(|s| !s.is_empty()).take(2).collect();
        read.push(steps.join("."));
    }
    assert!(read.len() >= 15, "the page's reads were not found: {read:?}");
    let unlisted: Vec<&String> = read.iter().filter(|r| !listed.iter().any(|l| l == *r || l.starts_with(&format!("{r}.")))).collect();
    assert!(unlisted.is_empty(), "the page reads evidence keys READ does not list: {unlisted:?}");
}

#[test]
fn every_key_the_page_reads_is_written_by_a_finding() {
    let mut findings: Vec<Finding> = Vec::new();
    for dir in ["tests/data/real", "tests/data/corpus"] {
        let mut files: Vec<_> =
            std::fs::read_dir(root().join(dir)).unwrap().map(|e| e.unwrap().path()).filter(|p| p.extension().is_some_and(|x| x == "pickle")).collect();
        files.sort();
        for file in files {
            let snapshot = trace::load_file(&file).unwrap_or_else(|e| panic!("{}: {e}", file.display()));
            for device in snapshot.devices() {
                let options = DoctorOptions { device: Some(device), ..Default::default() };
                findings.extend(doctor::diagnose(&snapshot, &options).unwrap().findings);
            }
        }
    }
    let missing: Vec<String> = READ
        .iter()
        .filter(|(kind, path)| {
            let steps: Vec<&str> = path.split('.').collect();
            !findings.iter().any(|f| (*kind == "*" || f.kind == *kind) && holds(&f.evidence.json(), &steps))
        })
        .map(|(kind, path)| format!("{kind}: {path}"))
        .collect();
    assert!(missing.is_empty(), "read but written by no finding on the snapshots carried: {missing:?}");
}
