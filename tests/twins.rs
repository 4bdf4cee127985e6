//! Every scenario against its PyTorch twin recorded on a real H100 (PyTorch 2.11,
//! `../shared/fixtures/h100-twins/`, and the twins `predict` learns from,
//! `../shared/fixtures/predict-inputs/`: transformers' Llama with PEFT LoRA and SDPA, GPT-2 at
//! two contexts): the scenario run on the simulated H100 with the twin's parameters must agree
//! at every labelled step, and run out of memory where the twin did. Issue 33 asks 0.1% in
//! allocated bytes and 1% in reserved; every twin now agrees in reserved to the byte and in
//! allocated within 0.001%, so 0.1% for all three (the peak within each step too) catches a
//! regression long before it matters. `tools/twins/run_all.py` makes the same comparison on a
//! machine with the GPU; this is it from the recorded summaries.

mod common;

use std::path::Path;
use tensormem::scenarios::{self, RunRequest, RunResult};

const ALLOCATED_TOLERANCE: f64 = 0.001;
const RESERVED_TOLERANCE: f64 = 0.001;
/// The peak inside a step (max_allocated since the previous label). Until the Llama model freed
/// what Python frees when it does (`src/nn/hf/llama.rs`), an 8B generate peaked at prefill
/// 0.12% above PyTorch's and hf-train reserved 0.32% more; now within 0.001% and exact.
const PEAK_TOLERANCE: f64 = 0.001;

struct Row {
    twin: String,
    steps: usize,
    worst_allocated: (f64, String),
    worst_reserved: (f64, String),
    worst_peak: (f64, String),
    oom: (bool, bool),
}

/// A twin's parameter values as `--set` takes them.
fn set_value(v: &serde_json::Value) -> String {
    match v {
        serde_json::Value::String(s) => s.clone(),
        serde_json::Value::Array(items) => items.iter().map(set_value).collect::<Vec<_>>().join(","),
        other => other.to_string(),
    }
}

fn relative(simulated: u64, recorded: u64) -> f64 {
    (simulated as f64 - recorded as f64) / (recorded.max(1) as f64)
}

fn compare(summary: &Path) -> Row {
    let text = std::fs::read_to_string(summary).unwrap();
    let twin: serde_json::Value = serde_json::from_str(&text).unwrap();
    let name = twin["scenario"].as_str().unwrap().to_string();
    let variant = twin["variant"].as_str().map(str::to_string);
    let set = twin["parameters"].as_object().unwrap().iter().map(|(k, v)| (k.clone(), set_value(v))).collect();
    let request = RunRequest { scenario: name.clone(), variant: variant.clone(), set, device: Some("sim:H100-80GB".into()), ..Default::default() };
    let run: RunResult = scenarios::run(&request).unwrap_or_else(|e| panic!("{}: {e}", summary.display()));
    // The file's name: a program recorded at several settings has one summary for each.
    let label = summary.file_stem().unwrap().to_string_lossy().into_owned();
    let recorded = twin["steps"].as_array().unwrap();
    assert_eq!(
        run.steps.iter().map(|s| s.label.as_str()).collect::<Vec<_>>(),
        recorded.iter().map(|s| s["label"].as_str().unwrap()).collect::<Vec<_>>(),
        "{label}: the same labelled steps"
    );
    let mut row = Row {
        twin: label,
        steps: recorded.len(),
        worst_allocated: (0.0, String::new()),
        worst_reserved: (0.0, String::new()),
        worst_peak: (0.0, String::new()),
        oom: (run.out_of_memory.is_some(), !twin["out_of_memory"].is_null()),
    };
    for (sim, torch) in run.steps.iter().zip(recorded) {
        let allocated = relative(sim.allocated_bytes, torch["allocated_bytes"].as_u64().unwrap());
        let reserved = relative(sim.reserved_bytes, torch["reserved_bytes"].as_u64().unwrap());
        if allocated.abs() > row.worst_allocated.0.abs() {
            row.worst_allocated = (allocated, sim.label.clone());
        }
        if reserved.abs() > row.worst_reserved.0.abs() {
            row.worst_reserved = (reserved, sim.label.clone());
        }
        let peak = relative(sim.max_allocated_bytes, torch["max_allocated_bytes"].as_u64().unwrap());
        if peak.abs() > row.worst_peak.0.abs() {
            row.worst_peak = (peak, sim.label.clone());
        }
    }
    row
}

#[test]
fn every_scenario_agrees_with_its_twin_recorded_on_an_h100() {
    let Some(dir) = common::fixtures_dir() else { return };
    let summaries_in = |folder: &str| {
        let dir = dir.parent().unwrap().join(folder);
        let mut summaries: Vec<_> = std::fs::read_dir(&dir)
            .unwrap_or_else(|e| panic!("{}: {e}", dir.display()))
            .filter_map(|e| Some(e.ok()?.path()))
            .filter(|p| p.extension().is_some_and(|x| x == "json"))
            .collect();
        summaries.sort();
        summaries
    };
    let twins = summaries_in("h100-twins");
    let predict_inputs = summaries_in("predict-inputs");
    assert!(twins.len() >= 37 && predict_inputs.len() >= 4, "{} twin summaries and {} predict inputs", twins.len(), predict_inputs.len());
    let summaries: Vec<_> = twins.into_iter().chain(predict_inputs).collect();
    // Two at a time: the largest (an 8B generation, a 7B step) take most of the time.
    let rows: Vec<Row> = std::thread::scope(|s| {
        let (even, odd): (Vec<_>, Vec<_>) = summaries.iter().enumerate().partition(|(i, _)| i % 2 == 0);
        let work = |part: Vec<(usize, &std::path::PathBuf)>| part.into_iter().map(|(i, p)| (i, compare(p))).collect::<Vec<_>>();
        let a = s.spawn(move || work(even));
        let mut rows = work(odd);
        rows.extend(a.join().unwrap());
        rows.sort_by_key(|(i, _)| *i);
        rows.into_iter().map(|(_, r)| r).collect()
    });
    let mut table =
        vec![format!("{:<32} {:>5} {:>10} {:>10} {:>10}  {}", "twin", "steps", "allocated", "reserved", "step peak", "out of memory (sim, PyTorch)")];
    let mut wrong = Vec::new();
    for r in &rows {
        let agrees = r.worst_allocated.0.abs() <= ALLOCATED_TOLERANCE
            && r.worst_reserved.0.abs() <= RESERVED_TOLERANCE
            && r.worst_peak.0.abs() <= PEAK_TOLERANCE
            && r.oom.0 == r.oom.1;
        table.push(format!(
            "{:<32} {:>5} {:>+9.4}% {:>+9.4}% {:>+9.4}%  {:?}",
            r.twin,
            r.steps,
            100.0 * r.worst_allocated.0,
            100.0 * r.worst_reserved.0,
            100.0 * r.worst_peak.0,
            r.oom
        ));
        if !agrees {
            wrong.push(format!(
                "{}: allocated {:+.4}% at {:?}, reserved {:+.4}% at {:?}, step peak {:+.4}% at {:?}, out of memory {:?}",
                r.twin,
                100.0 * r.worst_allocated.0,
                r.worst_allocated.1,
                100.0 * r.worst_reserved.0,
                r.worst_reserved.1,
                100.0 * r.worst_peak.0,
                r.worst_peak.1,
                r.oom
            ));
        }
    }
    eprintln!("{}", table.join("\n"));
    assert!(wrong.is_empty(), "twins that disagree:\n{}", wrong.join("\n"));
}

#[test]
fn the_oom_twin_runs_out_on_the_same_request_given_the_memory_pytorch_had() {
    // On the H100 the CUDA context and the kernels loaded took memory outside the allocator, so
    // PyTorch had less than the card's total_memory. What it had is in its trace: the reserved
    // bytes and the device's free bytes at the failed request. Given exactly that, the scenario
    // fails on the same request with PyTorch's own figures.
    let Some(dir) = common::fixtures_dir() else { return };
    let twins = dir.parent().unwrap().join("h100-twins");
    let snapshot = tensormem::trace::load_file(&twins.join("oom.pickle")).unwrap();
    let replay = tensormem::replay::replay_device(&snapshot, 0, &Default::default(), &mut |_, _| {}).unwrap();
    let recorded = replay.recorded_oom.expect("the trace records its out-of-memory");
    let had = recorded.capacity_estimate_bytes.unwrap();
    assert_eq!((recorded.request_bytes, recorded.device_free_bytes), (64 << 20, Some(65_208_320)));

    let text = std::fs::read_to_string(twins.join("oom.json")).unwrap();
    let twin: serde_json::Value = serde_json::from_str(&text).unwrap();
    let set = twin["parameters"].as_object().unwrap().iter().map(|(k, v)| (k.clone(), set_value(v))).collect();
    let request = RunRequest { scenario: "oom".into(), set, device: Some("sim:H100-80GB".into()), capacity: Some(had), ..Default::default() };
    let run = scenarios::run(&request).unwrap();
    let ours = run.out_of_memory.expect("runs out");
    let pytorch = twin["out_of_memory"].as_str().unwrap();
    for figure in ["Tried to allocate 64.00 MiB", "of which 62.19 MiB is free", "76.94 GiB is allocated by", "1.45 GiB is reserved by"] {
        assert!(pytorch.contains(figure), "{pytorch}");
        assert!(ours.contains(figure), "{figure}: {ours}");
    }
    assert_eq!(run.peak_reserved_bytes, twin["peak_reserved_bytes"].as_u64().unwrap());
    assert_eq!(run.peak_allocated_bytes, twin["peak_allocated_bytes"].as_u64().unwrap());
    // Outside the allocator at that moment: 750.8 MiB (the doctor's outside-allocator finding
    // counts 700 MiB for the context, from this and another H100 measurement).
    assert_eq!(twin["capacity_bytes"].as_u64().unwrap() - had, 787_283_968);
}
