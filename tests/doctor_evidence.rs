//! The evidence keys the page (`www/diagnosis.js`) and `tensormem.watch()`
//! (`python/tensormem/_watch.py`) read are keys the finders write: renamed on one side, a key
//! fails here instead of leaving a line blank on a user's screen. (The terminal printer,
//! `native-runner/src/doctor_print.rs`, reads the evidence's Rust types,
//! `tensormem::doctor::evidence`: the compiler checks its field names.) `READ` lists what they
//! read: every key the page reads straight off a finding's evidence must be listed (found by a
//! scan of its code; what it reads off a list's elements is listed by hand), and every entry must
//! be written by some finding on the snapshots the repository carries.

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
    // `tensormem.watch()` (python/tensormem/_watch.py) names the replay of a recorded OOM.
    ("oom", "capacity_bytes"),
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
    let watch = std::fs::read_to_string(root().join("python/tensormem/_watch.py")).unwrap();
    for (kind, path) in READ {
        let key = path.rsplit('.').next().unwrap().trim_end_matches("[]");
        let read = page.contains(key) || watch.contains(&format!("\"{key}\""));
        assert!(read, "{kind}: {path}: neither the page nor watch() reads {key:?} (take it off READ, or it is read under another name)");
    }
    // What the page reads straight off the evidence (`e.x.y` where `e` is a finding's evidence,
    // `evidence.x`, `evidence?.x?.y`, in code or in a template string): the first two steps of
    // a path listed. (What it reads off a list's elements is listed by hand.)
    let listed: Vec<String> = READ.iter().map(|(_, p)| p.replace("[]", "")).collect();
    let code: String = page.lines().filter(|l| !l.trim_start().starts_with("//")).collect::<Vec<_>>().join("\n");
    let ident = |c: char| c.is_ascii_alphanumeric() || matches!(c, '_' | '$' | '.');
    let mut read = Vec::new();
    for (at, _) in code.match_indices("e.").chain(code.match_indices("evidence?.")) {
        let word_start = code[..at].chars().next_back().is_none_or(|c| !ident(c));
        let evidence = code[..at].ends_with("evidenc") || code[at..].starts_with("evidence");
        if !(word_start || evidence) || code[at..].starts_with("e.g") {
            continue;
        }
        let rest = code[at..].split_once('.').unwrap().1;
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
