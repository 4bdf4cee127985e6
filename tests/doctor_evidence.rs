//! The evidence keys the terminal printer (`native-runner/src/doctor_print.rs`) and the page
//! (`www/diagnosis.js`) read are keys the finders write: renamed on one side, a key fails here
//! instead of leaving a line blank on a user's screen. `READ` lists what the two readers read;
//! every entry must be read by one of them and written by some finding on the snapshots the
//! repository carries.

use serde_json::Value;
use std::path::Path;
use tensormem::doctor::{self, DoctorOptions, Finding};
use tensormem::trace;

/// (the finding kind, or `*` for any; the path through its evidence, `[]` for every element
/// of a list).
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
    ("*", "top_stacks[].bytes"),
    ("*", "top_stacks[].frames"),
    ("*", "position"),
    ("*", "event"),
    ("fragmentation", "reserved_bytes"),
    ("fragmentation", "allocated_bytes"),
    ("fragmentation", "internal_bytes"),
    ("fragmentation", "external_bytes"),
    ("fragmentation", "free_blocks"),
    ("fragmentation", "largest_free_block_bytes"),
    ("fragmentation", "what_ifs[].alloc_conf"),
    ("fragmentation", "what_ifs[].before_peak_reserved_bytes"),
    ("fragmentation", "what_ifs[].after_peak_reserved_bytes"),
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
fn every_key_listed_is_read_by_the_printer_or_the_page() {
    let readers: String = ["www/diagnosis.js", "native-runner/src/doctor_print.rs"].iter().map(|f| std::fs::read_to_string(root().join(f)).unwrap()).collect();
    for (kind, path) in READ {
        let key = path.rsplit('.').next().unwrap().trim_end_matches("[]");
        assert!(readers.contains(key), "{kind}: {path}: neither reader reads {key:?} (take it off READ, or it is read under another name)");
    }
}

#[test]
fn every_key_the_readers_read_is_written_by_a_finding() {
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
            !findings.iter().any(|f| (*kind == "*" || f.kind == *kind) && holds(&f.evidence, &steps))
        })
        .map(|(kind, path)| format!("{kind}: {path}"))
        .collect();
    assert!(missing.is_empty(), "read but written by no finding on the snapshots carried: {missing:?}");
}
