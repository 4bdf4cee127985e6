//! The command line as a user meets it: output, JSON, exit codes, error lines.

use std::process::{Command, Output};

fn tensormem(args: &[&str]) -> Output {
    Command::new(env!("CARGO_BIN_EXE_tensormem")).args(args).output().expect("the binary runs")
}

#[path = "../../tests/common/mod.rs"]
mod common;
use common::fixture;

#[allow(dead_code)]
#[path = "../../examples/synth_snapshot.rs"]
mod synth;

fn stdout(o: &Output) -> String {
    String::from_utf8_lossy(&o.stdout).into_owned()
}

fn stderr(o: &Output) -> String {
    String::from_utf8_lossy(&o.stderr).into_owned()
}

#[test]
fn replay_json_reports_pytorchs_decisions() {
    let Some(path) = fixture("gpt-ctx128-forward.pickle") else { return };
    let out = tensormem(&["replay", path.to_str().unwrap(), "--json"]);
    assert!(out.status.success(), "{}", stderr(&out));
    let text = stdout(&out);
    let lines: Vec<&str> = text.lines().collect();
    assert_eq!(lines.len(), 1, "one JSON object per device");
    let v: serde_json::Value = serde_json::from_str(lines[0]).unwrap();
    assert_eq!(v["device"], 0);
    assert_eq!(v["events"], 8227);
    assert_eq!(v["recorded"]["segment_allocs"], 178);
    assert_eq!(v["replayed"]["segment_allocs"], 178);
    assert_eq!(v["recorded"]["peak_reserved_bytes"], 17_878_220_800u64);
    assert_eq!(v["replayed"]["peak_reserved_bytes"], 17_878_220_800u64);
    assert_eq!(v["segment_alloc_match"], 1.0);
    assert_eq!(v["address_match"], 1.0);
    assert_eq!(v["final_state_match"], true);
    assert!(v["first_divergence"].is_null());
    assert_eq!(v["replayed"]["ooms"], 0);
    assert_eq!(v["replayed"]["memory_stats"]["num_device_alloc"], 178);
    assert!(v["replayed"]["memory_stats"]["allocated_bytes.all.peak"].as_i64().unwrap() > 0);
    assert!(stderr(&out).is_empty(), "no progress bar in --json: {}", stderr(&out));
}

#[test]
fn replay_table_and_what_if() {
    let Some(path) = fixture("small-state.pickle") else { return };
    let out = tensormem(&["replay", path.to_str().unwrap(), "--alloc-conf", "expandable_segments:True", "--capacity", "4GiB", "--summary"]);
    assert!(out.status.success(), "{}", stderr(&out));
    let text = stdout(&out);
    assert!(text.contains("settings expandable_segments:True, capacity 4.00 GiB"), "{text}");
    assert!(text.contains("first divergence: event"), "other settings make other decisions: {text}");
    assert!(text.contains("PyTorch CUDA memory summary, device ID 0"), "{text}");
}

#[test]
fn summary_prints_pytorchs_table_and_trace_peaks() {
    let Some(path) = fixture("small-state.pickle") else { return };
    let out = tensormem(&["summary", path.to_str().unwrap()]);
    assert!(out.status.success(), "{}", stderr(&out));
    let text = stdout(&out);
    assert!(text.starts_with("|===="), "{text}");
    assert!(text.contains("| GPU reserved memory   |   3606 MiB |"), "{text}");
    assert!(text.contains("trace: 97 events; peak reserved 3.52 GiB (3781165056 bytes)"), "{text}");
    let json = tensormem(&["summary", path.to_str().unwrap(), "--json"]);
    let v: serde_json::Value = serde_json::from_str(stdout(&json).trim()).unwrap();
    assert_eq!(v["memory_stats"]["segment.all.current"], 9);
    assert_eq!(v["trace_peak_reserved_bytes"], 3_781_165_056u64);
}

#[test]
fn a_big_file_opens_again_from_its_cached_decode() {
    use tensormem::trace::{self, cache};
    let dir = std::env::temp_dir().join(format!("tensormem-cli-cache-{}", std::process::id()));
    let _ = std::fs::remove_dir_all(&dir);
    std::fs::create_dir_all(&dir).unwrap();
    // Big enough to be worth caching (a 16 MiB file decodes in a fraction of a second).
    let big = dir.join("big.pickle");
    trace::save_file(&synth::synthesize(300_000).0, &big).unwrap();
    let bytes = std::fs::read(&big).unwrap();
    assert!(bytes.len() as u64 >= cache::WORTH_CACHING, "{} bytes", bytes.len());
    let folder = dir.join("cache");
    let summary = |cache_setting: &std::path::Path| {
        let out =
            Command::new(env!("CARGO_BIN_EXE_tensormem")).args(["summary", big.to_str().unwrap()]).env("TENSORMEM_CACHE", cache_setting).output().unwrap();
        assert!(out.status.success(), "{}", stderr(&out));
        stdout(&out)
    };
    let first = summary(&folder);
    let cached = folder.join("decoded").join(cache::SourceKey::of(&bytes).file_name());
    assert!(cached.is_file(), "the decode is kept, under the file's hash");
    assert_eq!(std::fs::read_dir(cached.parent().unwrap()).unwrap().count(), 1, "nothing else is written there");
    assert_eq!(summary(&folder), first);
    // The second open reads the cache: a cache file saying something else under this file's
    // key is what the summary shows.
    let other = trace::load_file(&fixture("small-state.pickle").unwrap_or_else(|| "../tests/data/corpus/clean-train.pickle".into())).unwrap();
    std::fs::write(&cached, cache::encode_to_vec(&other, &[], &cache::SourceKey::of(&bytes))).unwrap();
    assert_ne!(summary(&folder), first);
    // A seen file changed in place, its length and time kept: its note names the decode above,
    // read back while the file is hashed, but the hashes differ, so the new bytes are decoded
    // (their summary is the first's: only a file name in a stack changed).
    let modified = std::fs::metadata(&big).unwrap().modified().unwrap();
    let set_time = || std::fs::File::options().append(true).open(&big).unwrap().set_modified(modified).unwrap();
    let mut edited = bytes.clone();
    let at = edited.windows(8).position(|w| w == b"train.py").expect("a stack names train.py");
    edited[at + 2] = b'e';
    std::fs::write(&big, &edited).unwrap();
    set_time();
    assert_eq!(summary(&folder), first);
    std::fs::write(&big, &bytes).unwrap();
    set_time();
    // Only a file seen before (its path, length and time) is hashed to look for its decode: the
    // same bytes under another name are decoded at once, and their decode kept over that one.
    let copy = dir.join("copy.pickle");
    std::fs::copy(&big, &copy).unwrap();
    let out = Command::new(env!("CARGO_BIN_EXE_tensormem")).args(["summary", copy.to_str().unwrap()]).env("TENSORMEM_CACHE", &folder).output().unwrap();
    assert_eq!(stdout(&out), first);
    assert_eq!(summary(&folder), first, "the decode kept for the copy is the same bytes'");
    // A cache file cut short is never used: the file is decoded again and its decode kept whole,
    // with each device's start state.
    let snapshot = trace::load(&bytes).unwrap();
    let starts: Vec<cache::KeptStart> = snapshot.devices().into_iter().map(|d| tensormem::replay::KnownStart::of(&snapshot, d).unwrap().to_kept()).collect();
    assert!(!starts.is_empty());
    let whole = cache::encode_to_vec(&snapshot, &starts, &cache::SourceKey::of(&bytes));
    std::fs::write(&cached, &whole[..whole.len() / 2]).unwrap();
    assert_eq!(summary(&folder), first);
    assert!(std::fs::read(&cached).unwrap() == whole);
    // Off: nothing is written (not a folder named "off" either).
    assert_eq!(summary(std::path::Path::new("off")), first);
    assert!(!std::path::Path::new("off").exists());
    std::fs::remove_dir_all(&dir).unwrap();
}

#[test]
fn bad_input_gives_one_clear_line_and_a_nonzero_status() {
    let out = tensormem(&["replay", "/nonexistent/file.pickle"]);
    assert_eq!(out.status.code(), Some(1));
    assert_eq!(stderr(&out).trim(), "error: /nonexistent/file.pickle: cannot read /nonexistent/file.pickle: No such file or directory (os error 2)");
    let dir = std::env::temp_dir().join(format!("tensormem-cli-{}", std::process::id()));
    std::fs::create_dir_all(&dir).unwrap();
    let garbage = dir.join("garbage.pickle");
    std::fs::write(&garbage, b"\x80\x04\x8c\x05posix\x94\x8c\x06system\x94\x93.").unwrap();
    let out = tensormem(&["replay", garbage.to_str().unwrap()]);
    assert_eq!(out.status.code(), Some(1));
    let err = stderr(&out);
    assert_eq!(err.lines().count(), 1, "{err}");
    assert!(err.contains("STACK_GLOBAL") && !err.contains("panicked"), "{err}");
    let out = tensormem(&["replay", garbage.to_str().unwrap(), "--alloc-conf", "max_split_size_mb:1"]);
    assert_eq!(out.status.code(), Some(2));
    assert!(stderr(&out).contains("max_split_size_mb too small, must be >= 20"));
    let out = tensormem(&["replay", garbage.to_str().unwrap(), "--capacity", "lots"]);
    assert_eq!(out.status.code(), Some(2));
    assert!(stderr(&out).contains("is not a size"));
    let out = tensormem(&["replay", garbage.to_str().unwrap(), "--device", "3"]);
    assert_eq!(out.status.code(), Some(1));
    std::fs::remove_dir_all(dir).ok();
}

#[test]
fn demo_writes_a_snapshot_that_loads_and_replays() {
    let dir = std::env::temp_dir().join(format!("tensormem-demo-{}", std::process::id()));
    std::fs::create_dir_all(&dir).unwrap();
    let out_file = dir.join("demo.json");
    let out = tensormem(&["demo", "--out", out_file.to_str().unwrap()]);
    assert!(out.status.success(), "{}", stderr(&out));
    let text = stdout(&out);
    assert!(text.contains("segment decisions matched 100.00%, addresses matched 100.00%, final state identical"), "{text}");
    assert!(text.contains("Reserved at the end: 746.00 MiB with classic segments, 460.00 MiB with expandable segments"), "{text}");
    let replay = tensormem(&["replay", out_file.to_str().unwrap(), "--json"]);
    let v: serde_json::Value = serde_json::from_str(stdout(&replay).trim()).unwrap();
    assert_eq!(v["final_state_match"], true);
    std::fs::remove_dir_all(dir).ok();
}

#[test]
fn help_names_every_command() {
    let out = tensormem(&["--help"]);
    let text = stdout(&out);
    for cmd in ["replay", "summary", "demo", "scenarios", "run", "compare"] {
        assert!(text.contains(cmd), "{text}");
    }
    let out = tensormem(&["replay", "--help"]);
    assert!(stdout(&out).contains("--alloc-conf"));
}

#[test]
fn run_json_has_the_contract_fields_and_the_fix_reserves_less() {
    let run = |extra: &[&str]| -> serde_json::Value {
        let mut args = vec!["run", "variable-batch", "--json", "--set", "layers=4,batches=32,31,40"];
        args.extend_from_slice(extra);
        let out = tensormem(&args);
        assert!(out.status.success(), "{}", stderr(&out));
        serde_json::from_str(stdout(&out).trim()).unwrap()
    };
    let mistake = run(&[]);
    for key in ["scenario", "variant", "device", "parameters", "model_parameters", "steps", "peak_allocated_bytes", "peak_reserved_bytes", "explanation"] {
        assert!(mistake.get(key).is_some(), "missing {key}: {mistake}");
    }
    assert_eq!(mistake["scenario"], "variable-batch");
    assert_eq!(mistake["variant"], "mistake");
    assert_eq!(mistake["device"], "sim:H100-80GB");
    assert_eq!(mistake["parameters"]["layers"], 4);
    assert_eq!(mistake["parameters"]["batches"], serde_json::json!([32, 31, 40]));
    let steps = mistake["steps"].as_array().unwrap();
    assert_eq!(steps.len(), 4);
    assert_eq!(steps[1]["label"], "batch 32");
    // 4 layers of 2 x 1024 x 4096 x 4 bytes: 128 MiB of weights after every step, and from the
    // first matmul on cuBLAS's workspace (32 MiB on an H100).
    assert_eq!(steps[0]["allocated_bytes"], 128u64 << 20);
    assert_eq!(steps[3]["allocated_bytes"], (128u64 + 32) << 20);
    // Batch 40: input 20 MiB + fc1 80 MiB + fc2 20 MiB on top of the weights and the workspace.
    assert_eq!(steps[3]["max_allocated_bytes"], (128u64 + 32 + 120) << 20);
    assert_eq!(mistake["peak_allocated_bytes"], (128u64 + 32 + 120) << 20);
    let fix = run(&["--variant", "fix"]);
    assert_eq!(fix["variant"], "fix");
    assert!(fix["peak_reserved_bytes"].as_u64().unwrap() < mistake["peak_reserved_bytes"].as_u64().unwrap());
}

#[test]
fn run_errors_are_one_line_and_name_the_choices() {
    for (args, needle) in [
        (vec!["run", "nope"], "known: variable-batch"),
        (vec!["run", "variable-batch", "--set", "foo=1"], "parameters: layers"),
        (vec!["run", "variable-batch", "--variant", "maybe"], "mistake or fix"),
        (vec!["run", "variable-batch", "--device", "sim:huge"], "sim:PRESET"),
        (vec!["run", "variable-batch", "--device", "gpu", "--variant", "fix"], "expandable_segments needs virtual memory mapping"),
        (vec!["run", "variable-batch", "--device", "tpu"], "use gpu, sim:PRESET"),
        (vec!["run", "variable-batch", "--set", "layers=x"], "whole number"),
        (vec!["run", "variable-batch", "--set", "hidden=3037000500"], "larger than tensormem can index"),
        (vec!["run", "variable-batch", "--set", "hidden=4294967296"], "larger than tensormem can index"),
        (vec!["run", "variable-batch", "--set", "seq=100000000000"], "larger than tensormem can index"),
    ] {
        let out = tensormem(&args);
        assert_eq!(out.status.code(), Some(2), "{args:?}");
        let err = stderr(&out);
        assert!(err.starts_with("error: ") && err.contains(needle) && !err.contains("panicked"), "{args:?}: {err}");
    }
    // A card too small: the run reports the out-of-memory error and exits 1.
    let out = tensormem(&["run", "variable-batch", "--device", "sim:200MiB"]);
    assert_eq!(out.status.code(), Some(1));
    assert!(stdout(&out).contains("out of memory: "), "{}", stdout(&out));
}

#[test]
fn replay_with_a_replaced_start_reports_it_and_writes_the_replayed_trace() {
    let Some(path) = fixture("small-state.pickle") else { return };
    let dir = std::env::temp_dir().join(format!("tensormem-cli-{}", std::process::id()));
    std::fs::create_dir_all(&dir).unwrap();
    let out_file = dir.join("replayed.json");
    let out = tensormem(&["replay", path.to_str().unwrap(), "--start", "replaced", "--snapshot", out_file.to_str().unwrap()]);
    assert!(out.status.success(), "{}", stderr(&out));
    assert!(stdout(&out).contains("start replaced"), "{}", stdout(&out));
    let again = tensormem(&["replay", out_file.to_str().unwrap(), "--json"]);
    assert!(again.status.success(), "{}", stderr(&again));
    let bad = tensormem(&["replay", path.to_str().unwrap(), "--start", "sideways"]);
    assert_eq!(bad.status.code(), Some(2));
    let _ = std::fs::remove_dir_all(dir);
}

#[test]
fn a_closed_pipe_ends_the_program_quietly() {
    use std::io::Read;
    use std::process::Stdio;
    // The reader takes a few bytes and hangs up while the program is still printing (3,000
    // steps: far more than a pipe buffers).
    let batches: Vec<String> = (0..3000).map(|b| (b % 50 + 1).to_string()).collect();
    let batches = batches.join(",");
    let mut child = Command::new(env!("CARGO_BIN_EXE_tensormem"))
        .args(["run", "variable-batch", "--set", &format!("layers=1,batches={batches}")])
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn()
        .unwrap();
    let mut first = [0u8; 16];
    child.stdout.take().unwrap().read_exact(&mut first).unwrap();
    // stdout is dropped here: the pipe is closed.
    let out = child.wait_with_output().unwrap();
    let err = String::from_utf8_lossy(&out.stderr);
    assert!(!err.contains("panicked") && !err.contains("Broken pipe"), "{err}");
}

#[test]
fn compare_prints_each_phase_of_a_run_against_a_recorded_training_step() {
    let Some(path) = fixture("gpt-medium-ctx128-training.pickle") else { return };
    let run = tensormem(&["run", "lm-train", "--set", "size=medium,batch=4,context=128", "--device", "sim:H100-80GB", "--json"]);
    assert!(run.status.success(), "{}", stderr(&run));
    let dir = std::env::temp_dir().join(format!("tensormem-compare-{}", std::process::id()));
    std::fs::create_dir_all(&dir).unwrap();
    let run_json = dir.join("run.json");
    std::fs::write(&run_json, &run.stdout).unwrap();
    let out = tensormem(&["compare", run_json.to_str().unwrap(), path.to_str().unwrap()]);
    assert!(out.status.success(), "{}", stderr(&out));
    let text = stdout(&out);
    for phase in ["end of forward", "end of loss", "end of backward", "end of optimizer step", "peak"] {
        assert!(text.lines().any(|l| l.starts_with(phase) && l.trim_end().ends_with('%')), "{phase} missing from:\n{text}");
    }
    assert!(text.contains("7013335044"), "the fixture's peak: {text}");
    // A run that is not a training run says so.
    let other = tensormem(&["run", "seed-basics", "--json"]);
    std::fs::write(&run_json, &other.stdout).unwrap();
    let out = tensormem(&["compare", run_json.to_str().unwrap(), path.to_str().unwrap()]);
    assert_eq!(out.status.code(), Some(1));
    assert!(stderr(&out).contains("compare takes lm-train or gpt2-train runs"), "{}", stderr(&out));
    std::fs::remove_dir_all(&dir).ok();
}

/// A scratch folder of this test's own.
fn scratch(name: &str) -> std::path::PathBuf {
    let dir = std::env::temp_dir().join(format!("tensormem-{name}-{}", std::process::id()));
    let _ = std::fs::remove_dir_all(&dir);
    std::fs::create_dir_all(&dir).unwrap();
    dir
}

/// A small snapshot made by a scenario run (no fixture needed).
fn recorded_snapshot(dir: &std::path::Path) -> std::path::PathBuf {
    let path = dir.join("recorded.json");
    let out = tensormem(&["run", "variable-batch", "--set", "layers=2,batches=8,16", "--snapshot", path.to_str().unwrap()]);
    assert!(out.status.success(), "{}", stderr(&out));
    path
}

#[test]
fn a_one_kilobyte_file_naming_device_2_pow_31_is_refused_not_an_abort() {
    let dir = scratch("device-index");
    let file = dir.join("device.json");
    std::fs::write(
        &file,
        br#"{"segments": [{"device": 2147483647, "address": 0, "total_size": 2097152, "stream": 0, "segment_type": "small",
            "blocks": [{"size": 2097152, "state": "inactive"}]}], "device_traces": []}"#,
    )
    .unwrap();
    let out_file = dir.join("out.pickle");
    let out = tensormem(&["replay", file.to_str().unwrap(), "--snapshot", out_file.to_str().unwrap()]);
    assert_eq!(out.status.code(), Some(1), "{}", stderr(&out));
    assert!(stderr(&out).contains("segments[0].device: device 2147483647 cannot be real: PyTorch's device indices are 0 to 127"), "{}", stderr(&out));
    assert!(!out_file.exists());
    std::fs::remove_dir_all(&dir).ok();
}

#[test]
fn snapshot_out_equal_to_the_input_is_refused_and_the_input_kept() {
    let dir = scratch("same-out");
    let input = recorded_snapshot(&dir);
    let before = std::fs::read(&input).unwrap();
    let other_spelling = dir.join(".").join("recorded.json");
    for out_path in [&input, &other_spelling] {
        let out = tensormem(&["replay", input.to_str().unwrap(), "--snapshot", out_path.to_str().unwrap()]);
        assert_eq!(out.status.code(), Some(2), "{}", stderr(&out));
        assert!(stderr(&out).contains("is the input file"), "{}", stderr(&out));
    }
    assert_eq!(std::fs::read(&input).unwrap(), before, "the recorded trace is untouched");
    std::fs::remove_dir_all(&dir).ok();
}

#[cfg(target_os = "linux")]
#[test]
fn a_failed_write_says_cannot_write_and_leaves_the_old_file_intact() {
    let dir = scratch("failed-write");
    let input = recorded_snapshot(&dir);
    let out_file = dir.join("replayed.pickle");
    std::fs::write(&out_file, b"the user's earlier result").unwrap();
    // A file-size limit of one block makes every larger write fail with EFBIG (SIGXFSZ ignored,
    // as an ignored signal stays ignored across exec), as a full disk or a quota would.
    let script =
        format!("trap '' XFSZ; ulimit -f 1; exec '{}' replay '{}' --snapshot '{}'", env!("CARGO_BIN_EXE_tensormem"), input.display(), out_file.display());
    let out = Command::new("sh").args(["-c", &script]).output().unwrap();
    assert_eq!(out.status.code(), Some(1), "{}", stderr(&out));
    assert!(stderr(&out).contains(&format!("cannot write {}: File too large", out_file.display())), "{}", stderr(&out));
    assert_eq!(std::fs::read(&out_file).unwrap(), b"the user's earlier result");
    let left: Vec<_> = std::fs::read_dir(&dir).unwrap().map(|e| e.unwrap().file_name()).collect();
    assert_eq!(left.len(), 2, "no temporary file left behind: {left:?}");
    // A device that takes no bytes: the error says so, in words about writing.
    let full = tensormem(&["replay", input.to_str().unwrap(), "--snapshot", "/dev/full"]);
    assert_eq!(full.status.code(), Some(1));
    assert!(stderr(&full).contains("cannot write /dev/full: No space left on device"), "{}", stderr(&full));
    std::fs::remove_dir_all(&dir).ok();
}

/// `tensormem doctor ... --json`'s findings.
fn doctor_findings(args: &[&str]) -> Vec<serde_json::Value> {
    let out = tensormem(args);
    assert!(out.status.success(), "{}", stderr(&out));
    let v: serde_json::Value = serde_json::from_str(stdout(&out).trim()).unwrap();
    v["findings"].as_array().unwrap().clone()
}

/// `tensormem replay` as the `verified` object describes it: its peak reserved.
fn replayed_peak_reserved(file: &str, verified: &serde_json::Value) -> u64 {
    let device = verified["command"].as_str().unwrap().split("--device ").nth(1).unwrap().split(' ').next().unwrap().to_string();
    let mut args = vec!["replay", file, "--json", "--device", &device, "--start", verified["start"].as_str().unwrap()];
    let alloc_conf = verified["alloc_conf"].as_str().unwrap();
    if !alloc_conf.is_empty() {
        args.extend(["--alloc-conf", alloc_conf]);
    }
    let capacity = verified["capacity"].as_u64().map(|c| c.to_string());
    if let Some(c) = &capacity {
        args.extend(["--capacity", c]);
    }
    let out = tensormem(&args);
    let v: serde_json::Value = serde_json::from_str(stdout(&out).trim()).unwrap();
    v["replayed"]["peak_reserved_bytes"].as_u64().unwrap()
}

#[test]
fn doctor_verified_figures_are_what_replay_reports() {
    // small-state starts empty (recorded start); eor-nn starts with memory reserved (replaced).
    for (name, start) in [("small-state.pickle", "recorded"), ("eor-nn-legacy-with-snapshots.pickle", "replaced")] {
        let Some(path) = fixture(name) else { return };
        let file = path.to_str().unwrap();
        let findings = doctor_findings(&["doctor", file, "--json"]);
        assert_eq!(findings[0]["kind"], "peak", "{name}");
        let fragmentation = findings.iter().find(|f| f["kind"] == "fragmentation").unwrap();
        assert_eq!(fragmentation["verified"]["start"], start, "{name}");
        for what_if in fragmentation["evidence"]["what_ifs"].as_array().unwrap() {
            assert_eq!(replayed_peak_reserved(file, what_if), what_if["after_peak_reserved_bytes"].as_u64().unwrap(), "{name}: {what_if}");
            // The before side is the file's settings, replayed from the same start.
            let before = serde_json::json!({"command": what_if["command"], "start": start, "alloc_conf": "", "capacity": null});
            assert_eq!(replayed_peak_reserved(file, &before), what_if["before_peak_reserved_bytes"].as_u64().unwrap(), "{name}");
        }
    }
    // The capacity that fits, at --capacity: `replay` at it runs out of nothing.
    let Some(path) = fixture("small-state.pickle") else { return };
    let findings = doctor_findings(&["doctor", path.to_str().unwrap(), "--capacity", "3GiB", "--json"]);
    let oom = findings.iter().find(|f| f["kind"] == "oom").unwrap();
    assert_eq!(oom["evidence"]["smallest_capacity_bytes"], 3_781_165_056u64);
    assert_eq!(oom["verified"]["command"], "tensormem replay FILE --device 0 --capacity 3781165056 --json");
    let at = |capacity: u64| {
        let out = tensormem(&["replay", path.to_str().unwrap(), "--capacity", &capacity.to_string(), "--json"]);
        serde_json::from_str::<serde_json::Value>(stdout(&out).trim()).unwrap()["replayed"]["ooms"].as_u64().unwrap()
    };
    assert_eq!((at(3_781_165_056), at(3_781_165_056 - (2 << 20)) > 0), (0, true));
}

#[test]
fn doctor_prints_each_finding_readably() {
    let Some(path) = fixture("expandable-3gpu-oom.pickle") else { return };
    let out = tensormem(&["doctor", path.to_str().unwrap()]);
    assert!(out.status.success(), "{}", stderr(&out));
    let text = stdout(&out);
    assert!(text.starts_with("[peak] Allocated memory peaks at 78.29 GiB at event 420, in the forward"), "{text}");
    assert!(text.contains("[oom] Out of memory at event 421: a request of 4.94 GiB with 91.25 MiB free failed"), "{text}");
    for part in ["  why: ", "  fix: ", "  verified: ", "peak reserved 78.42 GiB -> 83.36 GiB", "  estimate: ", "update_nodes (train/models.py:174)"] {
        assert!(text.contains(part), "{part:?} missing in {text}");
    }
}

#[test]
fn doctor_runs_a_scenario_and_diagnoses_its_trace() {
    let kinds = |variant: &str| -> Vec<String> {
        doctor_findings(&["doctor", "--scenario", "variable-batch", "--variant", variant, "--json"])
            .iter()
            .map(|f| f["kind"].as_str().unwrap().to_string())
            .collect()
    };
    assert_eq!(kinds("mistake"), ["peak", "fragmentation", "temporaries", "outside-allocator"]);
    assert_eq!(kinds("fix"), ["peak", "temporaries", "outside-allocator"]);
    // A training-loop kind: evaluation without no_grad, and its fix.
    let eval = |variant: &str| doctor_findings(&["doctor", "--scenario", "eval-no-grad", "--variant", variant, "--json"]);
    let mistake = eval("mistake");
    let missing = mistake.iter().find(|f| f["kind"] == "missing-no-grad").unwrap();
    assert!(missing["title"].as_str().unwrap().contains("no backward"), "{missing}");
    assert!(missing["evidence"]["held_per_iteration"].as_array().is_some_and(|h| h.len() == 4));
    assert!(eval("fix").iter().all(|f| f["kind"] != "missing-no-grad"));
    // Verified by running the fix variant: the figures `tensormem run` gives for its command.
    let v = &missing["verified"];
    let command = v["command"].as_str().unwrap();
    assert_eq!(command, "tensormem run eval-no-grad --variant fix --device sim:H100-80GB --json");
    let out = tensormem(&command.split(' ').skip(1).collect::<Vec<_>>());
    let fix: serde_json::Value = serde_json::from_str(stdout(&out).trim()).unwrap();
    assert_eq!(v["after_peak_allocated_bytes"], fix["peak_allocated_bytes"]);
    assert_eq!(v["after_peak_reserved_bytes"], fix["peak_reserved_bytes"]);
    let out = tensormem(&["run", "eval-no-grad", "--variant", "mistake", "--json"]);
    let mistake_run: serde_json::Value = serde_json::from_str(stdout(&out).trim()).unwrap();
    assert_eq!(v["before_peak_allocated_bytes"], mistake_run["peak_allocated_bytes"]);
    assert!(v["after_peak_allocated_bytes"].as_u64() < v["before_peak_allocated_bytes"].as_u64());
    let findings = doctor_findings(&["doctor", "--scenario", "variable-batch", "--set", "layers=2", "--device", "sim:24GiB", "--json"]);
    assert_eq!(findings[0]["kind"], "peak");
}

#[test]
fn doctor_usage_errors_are_one_line() {
    let none = tensormem(&["doctor"]);
    assert_eq!(none.status.code(), Some(2));
    let Some(path) = fixture("tiny-settings.pickle") else { return };
    let file = path.to_str().unwrap();
    for (args, code, says) in [
        (vec!["doctor", file, "--device", "sim:H100-80GB"], 2, "--device expects a device index"),
        (vec!["doctor", file, "--device", "5"], 1, "device 5 has neither segments nor a trace"),
        (vec!["doctor", "--scenario", "variable-batch", "--device", "gpu"], 2, "runs on the simulated card"),
        (vec!["doctor", "--scenario", "no-such-scenario"], 2, "unknown scenario"),
        (vec!["doctor", "/nonexistent.pickle"], 1, "cannot read"),
    ] {
        let out = tensormem(&args);
        assert_eq!(out.status.code(), Some(code), "{args:?}: {}", stderr(&out));
        assert!(stderr(&out).starts_with("error: ") && stderr(&out).contains(says), "{args:?}: {}", stderr(&out));
        assert_eq!(stderr(&out).lines().count(), 1, "{args:?}: {}", stderr(&out));
    }
}

/// `tensormem run lm-train` (small) at `context`, written to `dir`.
fn lm_recording(dir: &std::path::Path, context: u32) -> String {
    let path = dir.join(format!("lm-ctx{context}.pickle"));
    let set = format!("size=small,batch=2,context={context}");
    let out = tensormem(&["run", "lm-train", "--set", &set, "--snapshot", path.to_str().unwrap()]);
    assert!(out.status.success(), "{}", stderr(&out));
    path.to_str().unwrap().to_string()
}

#[test]
fn predict_json_has_exactly_the_contract_fields_and_writes_the_predicted_trace() {
    let dir = scratch("predict");
    let (a, b) = (lm_recording(&dir, 16), lm_recording(&dir, 32));
    let (a_at, b_at) = (format!("{a}@context=16"), format!("{b}@context=32"));
    let out_file = dir.join("predicted.json");
    let out = tensormem(&["predict", &a_at, &b_at, "--to", "context=128", "--snapshot", out_file.to_str().unwrap(), "--json"]);
    assert!(out.status.success(), "{}", stderr(&out));
    let v: serde_json::Value = serde_json::from_str(stdout(&out).trim()).unwrap();
    let mut keys: Vec<&str> = v.as_object().unwrap().keys().map(String::as_str).collect();
    keys.sort_unstable();
    assert_eq!(
        keys,
        [
            "aligned_fraction",
            "fit",
            "how_sure",
            "laws",
            "out_of_memory",
            "peak_allocated_bytes",
            "peak_phase",
            "peak_reserved_bytes",
            "target",
            "unaligned_bytes",
            "warnings"
        ]
    );
    assert_eq!(v["target"], serde_json::json!({"context": 128}));
    assert_eq!(v["warnings"], serde_json::json!([]), "nothing looks mislabeled");
    assert!(v["fit"].is_null() && v["out_of_memory"].is_null());
    assert_eq!(v["aligned_fraction"], 1.0);
    assert!(v["laws"].as_array().unwrap().iter().any(|l| l["law"].as_str().unwrap().contains("context^2")));
    // The same run at 128 directly: the same peaks.
    let direct = tensormem(&["run", "lm-train", "--set", "size=small,batch=2,context=128", "--json"]);
    let d: serde_json::Value = serde_json::from_str(stdout(&direct).trim()).unwrap();
    assert_eq!((&v["peak_allocated_bytes"], &v["peak_reserved_bytes"]), (&d["peak_allocated_bytes"], &d["peak_reserved_bytes"]));
    // The written trace replays to the same peaks.
    let replayed = tensormem(&["replay", out_file.to_str().unwrap(), "--json"]);
    let r: serde_json::Value = serde_json::from_str(stdout(&replayed).trim()).unwrap();
    assert_eq!(r["replayed"]["peak_reserved_bytes"], v["peak_reserved_bytes"]);

    // The text form, a capacity too small, an input as OUT, a missing value, an unknown name.
    let text = tensormem(&["predict", &a_at, &b_at, "--to", "context=128", "--capacity", "1GiB"]);
    assert!(text.status.success(), "{}", stderr(&text));
    assert!(stdout(&text).contains("OUT OF MEMORY: Out of memory. Tried to allocate"), "{}", stdout(&text));
    assert!(stdout(&text).contains("what grows"), "{}", stdout(&text));
    let same = tensormem(&["predict", &a_at, &b_at, "--to", "context=128", "--snapshot", &a]);
    assert_eq!(same.status.code(), Some(2));
    assert!(stderr(&same).contains("is the input file"), "{}", stderr(&same));
    let bare = tensormem(&["predict", &a, &b_at, "--to", "context=128"]);
    assert_eq!(bare.status.code(), Some(2));
    assert!(stderr(&bare).starts_with("error: ") && stderr(&bare).contains("FILE@name=value"), "{}", stderr(&bare));
    let unknown = tensormem(&["predict", &a_at, &b_at, "--to", "seq=128"]);
    assert_eq!(unknown.status.code(), Some(2));
    assert!(stderr(&unknown).contains("--to names seq"), "{}", stderr(&unknown));
    // --capacity takes a card preset (the simulator's names) as well as a size.
    let card = tensormem(&["predict", &a_at, &b_at, "--to", "context=128", "--capacity", "browser-2GB", "--json"]);
    let size = tensormem(&["predict", &a_at, &b_at, "--to", "context=128", "--capacity", "2GiB", "--json"]);
    assert!(card.status.success(), "{}", stderr(&card));
    assert_eq!(stdout(&card), stdout(&size));
    let no_card = tensormem(&["predict", &a_at, &b_at, "--to", "context=128", "--capacity", "H100"]);
    assert_eq!(no_card.status.code(), Some(2));
    let said = stderr(&no_card);
    assert!(said.contains("or a card: H100-80GB, H200-141GB, A100-80GB") && said.contains("B200-180GB"), "{said}");
    std::fs::remove_dir_all(&dir).ok();
}

/// `../shared/fixtures/predict-inputs`: PyTorch's own recordings of GPT-2 training at context
/// 256 and 512 (H100, `stacks="python"`).
fn predict_inputs() -> Option<std::path::PathBuf> {
    let inputs = common::fixtures_dir()?.parent()?.join("predict-inputs");
    if inputs.is_dir() {
        return Some(inputs);
    }
    if std::env::var("CI").as_deref() == Ok("true") {
        panic!("fixture folder {} is missing; CI requires it", inputs.display());
    }
    common::skip(format!("fixture folder {} not found (set TENSORMEM_FIXTURES)", inputs.display()));
    None
}

/// Mislabeled recordings (issue 49, item 7): the same run given two values is refused, whatever
/// the files are named; swapped values are warned of and not trusted; the right pair says nothing.
#[test]
fn predict_refuses_the_same_run_at_two_values_and_warns_of_swapped_ones() {
    let Some(inputs) = predict_inputs() else { return };
    let (small, large) = (inputs.join("gpt2-train-ctx256.pickle"), inputs.join("gpt2-train-ctx512.pickle"));
    let at = |path: &std::path::Path, context: u32| format!("{}@context={context}", path.display());
    let json = |out: &Output| -> serde_json::Value {
        assert!(out.status.success(), "{}", stderr(out));
        serde_json::from_str(stdout(out).trim()).unwrap()
    };

    // The right pair: PyTorch's 22.42 GiB at context 1024, every byte at the peak checked, no warning.
    let right = json(&tensormem(&["predict", &at(&small, 256), &at(&large, 512), "--to", "context=1024", "--json"]));
    assert_eq!(right["peak_allocated_bytes"], 24_077_857_792u64);
    assert_eq!((&right["how_sure"]["checked_share"], &right["warnings"]), (&serde_json::json!(1.0), &serde_json::json!([])));
    let text = tensormem(&["predict", &at(&small, 256), &at(&large, 512), "--to", "context=1024"]);
    assert!(text.status.success() && !stdout(&text).contains("WARNING"), "{}", stdout(&text));

    // The same file twice, and a byte-identical copy under another name: a usage error naming both.
    let dir = scratch("predict-mislabeled");
    let copy = dir.join("renamed.pickle");
    std::fs::copy(&small, &copy).unwrap();
    for second in [&small, &copy] {
        for json_flag in [None, Some("--json")] {
            let mut args = vec!["predict".to_string(), at(&small, 256), at(second, 512), "--to".into(), "context=1024".into()];
            args.extend(json_flag.map(String::from));
            let out = tensormem(&args.iter().map(String::as_str).collect::<Vec<_>>());
            assert_eq!(out.status.code(), Some(2), "{args:?}: {}", stderr(&out));
            let said = format!(
                "error: {} (context=256) and {} (context=512) record the same run: the same 7641 events, with the same sizes, addresses and stacks.",
                small.display(),
                second.display()
            );
            assert!(stderr(&out).starts_with(&said), "{args:?}: {}", stderr(&out));
            assert_eq!(stderr(&out).lines().count(), 1, "{}", stderr(&out));
            assert!(stdout(&out).is_empty(), "no prediction: {}", stdout(&out));
        }
    }

    // The values swapped: the recorded memory falls as the context grows, and at the target the
    // activations' laws go negative (clamped to 1 byte): warned of, and "how sure" drops from
    // 100% (they count at their recorded sizes, as not checked).
    let swapped = |to: &str, json_flag: bool| {
        let mut args = vec!["predict".to_string(), at(&large, 256), at(&small, 512), "--to".into(), to.into()];
        args.extend(json_flag.then(|| "--json".to_string()));
        tensormem(&args.iter().map(String::as_str).collect::<Vec<_>>())
    };
    let v = json(&swapped("context=1024", true));
    let warnings: Vec<&str> = v["warnings"].as_array().unwrap().iter().map(|w| w.as_str().unwrap()).collect();
    assert_eq!(warnings.len(), 2, "{warnings:?}");
    assert!(
        warnings[0].starts_with(&format!(
            "{} (context=512) peaks at 4.81 GiB requested, less than {} (context=256) at 9.41 GiB: memory falls as context grows",
            small.display(),
            large.display()
        )),
        "{}",
        warnings[0]
    );
    assert!(warnings[1].starts_with("1380 allocation(s) (19.68 GiB requested in all in "), "{}", warnings[1]);
    assert!(warnings[1].contains("go negative at context=1024, such as `-1608224*context + 1235116032`"), "{}", warnings[1]);
    let share = v["how_sure"]["checked_share"].as_f64().unwrap();
    assert!((0.30..0.31).contains(&share), "{share}");
    assert!(v["how_sure"]["warning"].as_str().unwrap().starts_with("not to be trusted: 1380 allocation(s)"), "{}", v["how_sure"]);
    // The contract's fields are all still there.
    for key in [
        "target",
        "peak_allocated_bytes",
        "peak_reserved_bytes",
        "peak_phase",
        "out_of_memory",
        "aligned_fraction",
        "unaligned_bytes",
        "how_sure",
        "laws",
        "fit",
    ] {
        assert!(v.get(key).is_some(), "{key}");
    }
    let text = swapped("context=2048", false);
    assert!(text.status.success(), "{}", stderr(&text));
    let text = stdout(&text);
    assert!(text.contains("  how sure         30.5% of the bytes at the peak"), "{text}");
    assert!(text.contains("  WARNING: not to be trusted: 1380 allocation(s) get their sizes from laws that go negative at context=2048"), "{text}");
    assert!(text.contains("memory falls as context grows"), "{text}");
    assert!(text.contains("such as `-1608224*context + 1235116032`"), "{text}");
    std::fs::remove_dir_all(&dir).ok();
}
