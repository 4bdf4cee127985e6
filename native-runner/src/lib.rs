//! `tensormem`: the command line, as a library that the binary (`src/main.rs`) and the Python
//! package (`python/`) both run. Reads and replays PyTorch memory snapshots.
//!
//! Errors go to stderr as one line with a non-zero exit (1: bad input or a failed run, 2: bad
//! usage), never as a panic trace. `tensormem mcp --call --python` gives any subcommand's
//! `--json` lines (the MCP server's tools) to the Python API, in a process of its own.

mod bench;
mod cli;
mod doctor_print;
mod mcp;
mod predict_print;
mod print;
mod serve;

use clap::Parser;
use cli::{Cli, Command};
use indicatif::{ProgressBar, ProgressStyle};
use print::{print_replay, print_run};
use std::io::IsTerminal;
use std::path::{Path, PathBuf};
use tensormem::alloc::{AllocatorConfig, format_size};
use tensormem::predict::{self, PredictOptions};
use tensormem::replay::{self, DeviceReplay, KnownStart, ReplayOptions, StartMode};
use tensormem::scenarios::{self, RunRequest, RunResult};
use tensormem::trace::{self, Snapshot};

/// A failure to report: message and exit status.
struct Failure(String, u8);

impl<E: std::fmt::Display> From<E> for Failure {
    fn from(e: E) -> Failure {
        Failure(e.to_string(), 1)
    }
}

/// Runs the command line on `args` (the program's name first) and returns its exit status.
/// `page`: where the web page's files are when `serve` is given no `--root` (the Python
/// package's copy).
pub fn main(args: impl IntoIterator<Item = std::ffi::OsString>, page: Option<PathBuf>) -> u8 {
    let cli = match Cli::try_parse_from(args) {
        Ok(cli) => cli,
        Err(e) => {
            // --help and --version print and succeed; a usage error prints and exits 2.
            let _ = e.print();
            return if e.use_stderr() { 2 } else { 0 };
        }
    };
    if !matches!(cli.command, Command::Serve { .. }) {
        set_signals();
    }
    if let Some(page) = page {
        serve::set_packaged_root(page);
    }
    match run(cli.command) {
        Ok(()) => 0,
        Err(Failure(message, code)) => {
            eprintln!("error: {message}");
            code
        }
    }
}

/// `tensormem summary FILE | head` must end quietly when `head` closes the pipe, as other Unix
/// tools do: Rust ignores SIGPIPE, so a write fails and `println!` panics; restoring the default
/// lets the signal end the process. (The server keeps ignoring it: a client hanging up is a write
/// error on that connection only.)
fn set_signals() {
    #[cfg(unix)]
    // SAFETY: setting a signal's disposition to its default at start-up, before any thread runs.
    unsafe {
        libc::signal(libc::SIGPIPE, libc::SIG_DFL);
    }
    // A file-size limit (`ulimit -f`) kills a writer with SIGXFSZ mid-write, leaving its
    // temporary file behind; ignored, the write fails with EFBIG and the file is removed.
    #[cfg(unix)]
    // SAFETY: as above.
    unsafe {
        libc::signal(libc::SIGXFSZ, libc::SIG_IGN);
    }
}

/// Runs one subcommand.
fn run(command: Command) -> Result<(), Failure> {
    match command {
        Command::Replay { file, device, alloc_conf, capacity, json, summary, start, snapshot: out } => {
            replay_command(&file, device, alloc_conf.as_deref(), capacity, json, summary, start, out.as_deref())
        }
        Command::Summary { file, device, json } => summary_command(&file, device, json),
        Command::Demo { out } => demo(&out),
        Command::Scenarios { json } => scenarios_command(json),
        Command::Run { name, variant, set, device, capacity, alloc_conf, cublas_workspace_config, steps, snapshot, json } => {
            run_command(ScenarioRun { name, variant, set, device, capacity, alloc_conf, cublas_workspace_config, steps }, snapshot.as_deref(), json)
        }
        Command::Compare { run, file, device, json } => compare_command(&run, &file, device, json),
        Command::Doctor { file, scenario, variant, set, device, capacity, json } => {
            doctor(DoctorRequest { file, scenario, variant, set, device, capacity }, json)
        }
        Command::Predict { recordings, to, fit, device, capacity, alloc_conf, snapshot, json } => {
            let options = PredictOptions { device, capacity, config: None, keep_snapshot: snapshot.is_some() };
            predict_command(&recordings, to.as_deref(), fit.as_deref(), options, alloc_conf.as_deref(), snapshot.as_deref(), json)
        }
        Command::Mcp { call: false, .. } => mcp::serve(),
        Command::Mcp { call: true, python: false } => mcp::call_from_stdin(),
        Command::Mcp { call: true, python: true } => mcp::python_call_from_stdin(),
        Command::Info { json } => info(json),
        Command::Serve { file, port, host, root, until_stdin_ends, remove_file_at_end } => {
            let end = serve::End { until_stdin_ends, remove_file_at_end };
            serve::run(file.as_deref(), &host, port, root.as_deref(), end).map_err(|e| Failure(e, 1))
        }
        Command::Bench { sizes, elements, json } => bench_command(&sizes, elements, json),
        Command::Fit { name, set, vary, strategies, cards, json } => fit_command(name, &set, &vary, &strategies, &cards, json),
    }
}

/// `tensormem replay`: each device's replay as a table or JSON, and the replayed trace if asked.
#[allow(clippy::too_many_arguments)] // the subcommand's arguments, as clap parsed them
fn replay_command(
    file: &Path,
    device: Option<i64>,
    alloc_conf: Option<&str>,
    capacity: Option<u64>,
    json: bool,
    summary: bool,
    start: StartMode,
    out: Option<&Path>,
) -> Result<(), Failure> {
    refuse_overwriting_input(out, file)?;
    let mut results = replay_file(file, device, alloc_conf, capacity, start, out.is_some(), !json)?;
    if let Some(out) = out {
        let replayed = merge_snapshots(results.iter_mut().filter_map(|r| r.snapshot.take()));
        save(&replayed, out)?;
        if !json {
            println!("wrote the replayed trace to {}", out.display());
        }
    }
    for r in &results {
        if json {
            println!("{}", json_line(r)?);
        } else {
            print_replay(r);
            if summary {
                print!("{}", r.summary);
            }
        }
    }
    Ok(())
}

/// A file's replay on each device (or `device`) under other settings: what `tensormem replay`
/// prints and the `replay` tool of `tensormem mcp` returns, one JSON line per device.
fn replay_file(
    file: &Path,
    device: Option<i64>,
    alloc_conf: Option<&str>,
    capacity: Option<u64>,
    start: StartMode,
    keep_snapshot: bool,
    progress: bool,
) -> Result<Vec<DeviceReplay>, Failure> {
    let config = alloc_conf.map(|c| AllocatorConfig::parse(c).map_err(|e| Failure(e.to_string(), 2))).transpose()?;
    let options = ReplayOptions { config, capacity, start, keep_snapshot, ..Default::default() };
    with_loaded(file, |snapshot, starts| replay_with_progress(snapshot, device, &options, starts, progress))
}

/// The JSON line that a subcommand's `--json` prints for one value; `tensormem mcp`'s tools
/// return the same lines.
fn json_line<T: serde::Serialize + ?Sized>(value: &T) -> Result<String, Failure> {
    Ok(serde_json::to_string(value)?)
}

/// `tensormem summary`: memory_summary() of the final state and the trace's peaks.
fn summary_command(file: &Path, device: Option<i64>, json: bool) -> Result<(), Failure> {
    let results = replay_file(file, device, None, None, StartMode::default(), false, !json)?;
    for r in &results {
        if json {
            println!("{}", json_line(&summary_json(r))?);
        } else {
            print!("{}", r.summary);
            println!(
                "trace: {} events; peak reserved {} ({} bytes); peak requested by live tensors {} ({} bytes)",
                r.events,
                format_size(r.recorded.peak_reserved_bytes),
                r.recorded.peak_reserved_bytes,
                format_size(r.recorded.peak_allocated_bytes),
                r.recorded.peak_allocated_bytes
            );
            if !r.final_state_match {
                println!("note: the replayed final state differs from the file's; figures above are the replay's");
            }
        }
    }
    Ok(())
}

/// One device's line of `tensormem summary --json`: memory_stats() and the trace's peaks.
fn summary_json(r: &DeviceReplay) -> serde_json::Value {
    serde_json::json!({
        "device": r.device,
        "events": r.events,
        "settings": r.settings,
        "memory_stats": r.replayed.memory_stats,
        "trace_peak_reserved_bytes": r.recorded.peak_reserved_bytes,
        "trace_peak_allocated_bytes": r.recorded.peak_allocated_bytes,
        "final_state_match": r.final_state_match,
    })
}

/// `tensormem scenarios`: the list, with parameters and variants.
fn scenarios_command(json: bool) -> Result<(), Failure> {
    let list = scenarios::list();
    if json {
        println!("{}", json_line(&list)?);
    } else {
        for s in list {
            let variants = if s.variants.is_empty() { String::new() } else { format!(" [--variant {}]", s.variants.join("|")) };
            println!("{}{variants}: {}", s.name, s.title);
            for p in s.parameters {
                println!("    --set {}={:<12} {}", p.name, p.default, p.help);
            }
        }
    }
    Ok(())
}

/// `tensormem fit`: the strategy x card table of the largest value that fits.
fn fit_command(name: String, set: &[String], vary: &str, strategies: &[String], cards: &[String], json: bool) -> Result<(), Failure> {
    let request = RunRequest { scenario: name, set: parse_set(set)?, ..Default::default() };
    let bar = indicatif::ProgressBar::new((strategies.len() * cards.len()) as u64);
    if json || !std::io::IsTerminal::is_terminal(&std::io::stderr()) {
        bar.set_draw_target(indicatif::ProgressDrawTarget::hidden());
    }
    let table =
        scenarios::fit::fit_table(&request, vary, strategies, cards, &mut |done, _| bar.set_position(done as u64)).map_err(|e| Failure(e.to_string(), 2))?;
    bar.finish_and_clear();
    if json {
        println!("{}", json_line(&table)?);
        return Ok(());
    }
    println!(
        "the largest {vary} that fits, {} on {} GPU{} (each found by running the step):",
        table.scenario,
        table.world,
        if table.world == 1 { "" } else { "s" }
    );
    print!("  {:<10}", "strategy");
    for card in cards {
        print!(" {card:>16}");
    }
    println!();
    for strategy in strategies {
        print!("  {strategy:<10}");
        for cell in table.cells.iter().filter(|c| &c.strategy == strategy) {
            let text = match (cell.largest, &cell.limited_by) {
                (Some(v), None) => v.to_string(),
                (Some(v), Some(_)) => format!("{v}+"),
                (None, None) => "does not fit".into(),
                (None, Some(_)) => "refused".into(),
            };
            print!(" {text:>16}");
        }
        println!();
    }
    let limits: std::collections::BTreeSet<&String> = table.cells.iter().filter_map(|c| c.limited_by.as_ref()).collect();
    for limit in limits {
        println!("  (+ / refused: {limit})");
    }
    Ok(())
}

/// `tensormem run`: one scenario's steps; running out of memory is a failure, after the steps.
fn run_command(request: ScenarioRun, snapshot: Option<&Path>, json: bool) -> Result<(), Failure> {
    // A config.json named as OUT is refused before the run (save refuses any input after it).
    if let Some(config) = parse_set(&request.set)?.get("config") {
        refuse_overwriting_input(snapshot, Path::new(config))?;
    }
    // On a terminal, a spinner naming the step the run is at (long runs: thousands of tokens,
    // hundreds of steps); nothing into a pipe.
    let spinner = std::io::stderr().is_terminal().then(|| {
        let s = ProgressBar::new_spinner();
        s.set_style(ProgressStyle::with_template("{spinner} {msg} ({elapsed})").unwrap());
        s.enable_steady_tick(std::time::Duration::from_millis(120));
        s.set_message(format!("{}: starting", request.name));
        s
    });
    let observer = spinner.clone().map(|s| {
        let name = request.name.clone();
        scenarios::observe_steps(move |n, label| s.set_message(format!("{name}: step {n}, {label}")))
    });
    let result = run_scenario(request);
    drop(observer);
    if let Some(s) = spinner {
        s.finish_and_clear();
    }
    let result = result?;
    if let Some(out) = snapshot {
        save(&result.snapshot, out)?;
    }
    if json {
        println!("{}", json_line(&result)?);
    } else {
        print_run(&result);
    }
    run_outcome(&result, snapshot)
}

/// A scenario to run: `tensormem run`'s arguments, or the `run` tool's.
struct ScenarioRun {
    name: String,
    variant: Option<String>,
    set: Vec<String>,
    device: String,
    capacity: Option<u64>,
    alloc_conf: Option<String>,
    cublas_workspace_config: Option<String>,
    steps: Option<u64>,
}

/// One scenario's run, as `tensormem run` and the `run` tool of `tensormem mcp` make it.
fn run_scenario(request: ScenarioRun) -> Result<RunResult, Failure> {
    let ScenarioRun { name, variant, set, device, capacity, alloc_conf, cublas_workspace_config, steps } = request;
    let mut values = parse_set(&set)?;
    if let Some(steps) = steps
        && let Some(set) = values.insert("steps".into(), steps.to_string()).filter(|v| *v != steps.to_string())
    {
        return Err(Failure(format!("--steps {steps} and --set steps={set} disagree"), 2));
    }
    let request = RunRequest { scenario: name, variant, set: values, device: Some(device), capacity, alloc_conf, cublas_workspace_config };
    pollster::block_on(scenarios::run_anywhere(&request)).map_err(|e| Failure(e.to_string(), 2))
}

/// A run that ran out of memory fails, after its steps are shown.
fn run_outcome(result: &RunResult, snapshot: Option<&Path>) -> Result<(), Failure> {
    match (&result.out_of_memory, snapshot) {
        (None, _) => Ok(()),
        // The run's own result, as PyTorch's OOM observers dump theirs: the trace up to the error
        // is what a user opens to see why.
        (Some(_), Some(out)) => Err(Failure(format!("the scenario ran out of memory (see above); its trace up to the error is in {}", out.display()), 1)),
        (Some(_), None) => Err(Failure("the scenario ran out of memory (see above)".into(), 1)),
    }
}

/// `tensormem compare`: a run's phases against a PyTorch trace's.
fn compare_command(run: &Path, file: &Path, device: i64, json: bool) -> Result<(), Failure> {
    // A run's JSON: its steps and ranks, never near this bound.
    let text = tensormem::files::read_small(run, 64 << 20, "a run's JSON (tensormem run --json)").map_err(|e| Failure(e, 1))?;
    let run_json: serde_json::Value = serde_json::from_str(&text).map_err(|e| Failure(format!("{}: not a run's JSON: {e}", run.display()), 1))?;
    let phases = with_loaded(file, |snapshot, _| scenarios::compare::compare(&run_json, snapshot, device).map_err(|e| Failure(e, 1)))?;
    if json {
        println!("{}", serde_json::to_string(&phases)?);
    } else {
        println!("{:<22} {:>16} {:>16} {:>9}", "phase", "trace (bytes)", "tensormem", "diff");
        for p in &phases {
            println!("{:<22} {:>16} {:>16} {:>+8.2}%", p.phase, p.trace_bytes, p.run_bytes, 100.0 * p.difference());
        }
    }
    Ok(())
}

/// `tensormem bench`: the engine's speed on the first adapter.
fn bench_command(sizes: &[usize], elements: usize, json: bool) -> Result<(), Failure> {
    if elements == 0 || !elements.is_multiple_of(1024) || elements > 1 << 30 {
        return Err(Failure(format!("--elements {elements}: the sums run over rows of 1024, so give a positive multiple of 1024, at most 2^30"), 2));
    }
    let dev = open_gpu()?;
    // A spinner naming the step on a terminal; nothing under --json or into a pipe.
    let spinner = (!json && std::io::stderr().is_terminal()).then(|| {
        let s = ProgressBar::new_spinner();
        s.set_style(ProgressStyle::with_template("{spinner} {msg} ({elapsed})").unwrap());
        s.enable_steady_tick(std::time::Duration::from_millis(120));
        s
    });
    let report = pollster::block_on(tensormem::bench::run(&dev, &bench::options(sizes, elements), &mut |step| {
        if let Some(s) = &spinner {
            s.set_message(step.to_string());
        }
    }))
    .map_err(|e| Failure(e, 1))?;
    if let Some(s) = spinner {
        s.finish_and_clear();
    }
    if json {
        println!("{}", serde_json::to_string(&report)?);
    } else {
        bench::print(&report);
    }
    Ok(())
}

/// `tensormem predict`: the recordings' program at --to (or at the largest value that fits),
/// replayed.
fn predict_command(
    specs: &[String],
    to: Option<&str>,
    fit: Option<&str>,
    options: PredictOptions,
    alloc_conf: Option<&str>,
    out: Option<&Path>,
    json: bool,
) -> Result<(), Failure> {
    let (mut prediction, parsed) = predict_files(specs, to, fit, options, alloc_conf, out)?;
    if let (Some(out), Some(snapshot)) = (out, prediction.snapshot.take()) {
        save(&snapshot, out)?;
        if !json {
            println!("wrote the predicted trace to {}", out.display());
        }
    }
    if json {
        println!("{}", json_line(&prediction)?);
    } else {
        predict_print::print(&prediction, &parsed);
    }
    Ok(())
}

/// What `tensormem predict` (and the MCP tool) computes: the recordings (FILE@name=value) read,
/// the fit searched when asked, the prediction made; with each recording's path and values.
pub(crate) fn predict_files(
    specs: &[String],
    to: Option<&str>,
    fit: Option<&str>,
    mut options: PredictOptions,
    alloc_conf: Option<&str>,
    out: Option<&Path>,
) -> Result<(predict::Prediction, Vec<(String, predict::Values)>), Failure> {
    let usage = |e: String| Failure(e, 2);
    let parsed: Vec<(String, predict::Values)> = specs.iter().map(|s| predict::parse_recording(s).map_err(usage)).collect::<Result<_, _>>()?;
    let target = match to {
        Some(to) => predict::parse_values(to).map_err(|e| usage(format!("--to {to}: {e}")))?,
        None => predict::Values::new(),
    };
    options.config = alloc_conf.map(|c| AllocatorConfig::parse(c).map_err(|e| usage(e.to_string()))).transpose()?;
    for (path, _) in &parsed {
        refuse_overwriting_input(out, Path::new(path))?;
    }
    let snapshots: Vec<Snapshot> = parsed.iter().map(|(path, _)| load_kept(Path::new(path))).collect::<Result<_, _>>()?;
    let recordings: Vec<predict::Recording> =
        parsed.iter().zip(&snapshots).map(|((path, values), snapshot)| predict::Recording { label: path.clone(), snapshot, values: values.clone() }).collect();
    let prediction = predict::predict_or_fit(&recordings, &target, fit, &options).map_err(|e| match e {
        predict::PredictError::Input(m) => Failure(m, 2),
        other => Failure(other.to_string(), 1),
    })?;
    Ok((prediction, parsed))
}

/// `tensormem doctor`: a file's trace, or a scenario's run on the sim device, diagnosed alike.
fn doctor(request: DoctorRequest, json: bool) -> Result<(), Failure> {
    let diagnosis = diagnose(request)?;
    if json {
        println!("{}", json_line(&diagnosis)?);
    } else {
        doctor_print::print(&diagnosis);
    }
    Ok(())
}

/// What the doctor is asked about: `tensormem doctor`'s arguments, or the `doctor` tool's.
struct DoctorRequest {
    file: Option<PathBuf>,
    scenario: Option<String>,
    variant: Option<String>,
    set: Vec<String>,
    device: Option<String>,
    capacity: Option<u64>,
}

/// The doctor's findings on a file or a scenario's run, as `tensormem doctor` and the `doctor`
/// tool of `tensormem mcp` give them.
fn diagnose(request: DoctorRequest) -> Result<tensormem::doctor::Diagnosis, Failure> {
    let DoctorRequest { file, scenario, variant, set, device, capacity } = request;
    let diagnosis = match (file, scenario) {
        (Some(file), _) => {
            let device =
                device.map(|d| d.parse::<i64>().map_err(|_| Failure(format!("--device expects a device index for a file, got {d:?}"), 2))).transpose()?;
            let options = tensormem::doctor::DoctorOptions { device, capacity, ..Default::default() };
            with_loaded(&file, |snapshot, starts| {
                // The device the doctor will examine, from its start if it was kept.
                let device = options.device.or_else(|| snapshot.pick_device());
                let known_start = starts.iter().find(|k| Some(k.device()) == device).cloned();
                Ok(tensormem::doctor::diagnose(snapshot, &tensormem::doctor::DoctorOptions { known_start, ..options.clone() })?)
            })?
        }
        (None, Some(scenario)) => {
            if device.as_deref().is_some_and(|d| !d.starts_with("sim:")) {
                return Err(Failure("doctor --scenario runs on the simulated card: use --device sim:PRESET or sim:SIZE".into(), 2));
            }
            let values = parse_set(&set)?;
            let request = RunRequest { scenario, variant, set: values, device: device.or(Some("sim:H100-80GB".into())), ..Default::default() };
            let options = tensormem::doctor::DoctorOptions { capacity, ..Default::default() };
            scenarios::diagnose(&request, &options)
                .map_err(|e| match e {
                    scenarios::DiagnoseError::Scenario(e) => Failure(e.to_string(), 2),
                    scenarios::DiagnoseError::Doctor(e) => e.into(),
                })?
                .diagnosis
        }
        (None, None) => return Err(Failure("doctor needs a FILE or --scenario NAME".into(), 2)),
    };
    Ok(diagnosis)
}

fn open_gpu() -> Result<tensormem::Device, Failure> {
    pollster::block_on(tensormem::Device::gpu(tensormem::GpuOptions::default())).map_err(|e| Failure(e.to_string(), 1))
}

fn info(json: bool) -> Result<(), Failure> {
    let dev = open_gpu()?;
    let a = dev.adapter().expect("a GPU device has an adapter");
    let value = serde_json::json!({
        "name": a.name,
        "backend": a.backend,
        "device_type": a.device_type,
        "driver": a.driver,
        "shader_f16": a.native_f16,
        "limits": {
            "max_buffer_size": a.max_buffer_size,
            "max_storage_buffer_binding_size": a.max_storage_buffer_binding_size,
            "min_storage_buffer_offset_alignment": a.min_storage_buffer_offset_alignment,
            "max_compute_workgroup_size_x": a.max_compute_workgroup_size_x,
            "max_compute_invocations_per_workgroup": a.max_compute_invocations_per_workgroup,
            "max_compute_workgroups_per_dimension": a.max_compute_workgroups_per_dimension,
            "max_storage_buffers_per_shader_stage": a.max_storage_buffers_per_shader_stage,
            "max_compute_workgroup_storage_size": a.max_compute_workgroup_storage_size,
        },
        "capacity": dev.capacity(),
    });
    if json {
        println!("{value}");
    } else {
        println!("adapter:  {} ({}, {})", a.name, a.backend, a.device_type);
        println!("driver:   {}", a.driver);
        println!("f16:      {}", if a.native_f16 { "shader-f16 (native)" } else { "packed in u32 words (no shader-f16)" });
        for (k, v) in value["limits"].as_object().unwrap() {
            println!("{k:<40} {v}");
        }
        println!("capacity assumed for the allocator: {}", dev.capacity().map_or("unlimited".into(), format_size));
    }
    Ok(())
}

/// `--set` values as `name -> value`.
fn parse_set(set: &[String]) -> Result<std::collections::BTreeMap<String, String>, Failure> {
    let mut values = std::collections::BTreeMap::new();
    for item in set.iter().flat_map(|s| split_settings(s)) {
        let (k, v) = item.split_once('=').ok_or_else(|| Failure(format!("--set expects KEY=VALUE, got {item:?}"), 2))?;
        values.insert(k.trim().to_string(), v.trim().to_string());
    }
    Ok(values)
}

/// `--set a=1,b=2`: splits on commas that start a new `key=` (a value may hold commas, as in
/// `batches=32,31,33`).
pub(crate) fn split_settings(text: &str) -> Vec<String> {
    let mut items: Vec<String> = Vec::new();
    for part in text.split(',') {
        match items.last_mut() {
            Some(last) if !part.contains('=') => {
                last.push(',');
                last.push_str(part);
            }
            _ => items.push(part.to_string()),
        }
    }
    items
}

/// One snapshot from per-device replays (each holds its own device's trace).
fn merge_snapshots(parts: impl Iterator<Item = Snapshot>) -> Snapshot {
    let mut merged = Snapshot::default();
    for part in parts {
        merged.segments.extend(part.segments);
        if merged.device_traces.len() < part.device_traces.len() {
            merged.device_traces.resize(part.device_traces.len(), Default::default());
        }
        for (d, t) in part.device_traces.into_iter().enumerate() {
            if !t.is_empty() {
                merged.device_traces[d] = t;
            }
        }
        merged.allocator_settings = part.allocator_settings;
        merged.external_annotations = part.external_annotations;
        merged.tensormem = part.tensormem.or(merged.tensormem);
    }
    merged
}

/// Writes a snapshot the command made: whole or not at all (an existing OUT stays as it was
/// when the write fails).
fn save(snapshot: &Snapshot, out: &Path) -> Result<(), Failure> {
    if let Some(input) = tensormem::files::input_named_by(out) {
        return Err(Failure(format!("--snapshot {} is a file this command read ({}): write the result to another file", out.display(), input.display()), 2));
    }
    trace::save_file(snapshot, out).map_err(|e| Failure(e.to_string(), 1))
}

/// A command never writes over a file it reads: checked before any work is done.
fn refuse_overwriting_input(out: Option<&Path>, input: &Path) -> Result<(), Failure> {
    match out {
        Some(out) if tensormem::files::same_file(out, input) => {
            Err(Failure(format!("--snapshot {} is the input file {}: write the result to another file", out.display(), input.display()), 2))
        }
        _ => Ok(()),
    }
}

thread_local! {
    /// A snapshot given in place of a file to a tool call: read (taken, not copied: a tool loads its file
    /// once) in place of the file `file` names.
    static GIVEN_SNAPSHOT: std::cell::RefCell<Option<Snapshot>> = const { std::cell::RefCell::new(None) };
}

/// The name a snapshot given as bytes goes by (in messages, and as the tool's `file`).
const GIVEN_FILE: &str = "<snapshot>";

/// Holds a snapshot given as bytes for `load` while a tool runs; lets go when dropped.
struct GivenSnapshot;

impl GivenSnapshot {
    fn hold(snapshot: Option<Snapshot>) -> GivenSnapshot {
        GIVEN_SNAPSHOT.with(|given| *given.borrow_mut() = snapshot);
        GivenSnapshot
    }
}

impl Drop for GivenSnapshot {
    fn drop(&mut self) {
        GIVEN_SNAPSHOT.with(|given| given.borrow_mut().take());
    }
}

/// A decode to keep in the cache folder for the next open of the same bytes.
struct ToKeep {
    folder: trace::cache::Folder,
    key: trace::cache::SourceKey,
    path: PathBuf,
}

impl ToKeep {
    /// Keeps the decode, and each device's start state (reconstructed here, on the keeping
    /// thread, while the command does its work).
    fn write(&self, snapshot: &Snapshot) {
        let starts: Vec<_> = snapshot.devices().into_iter().filter_map(|d| KnownStart::of(snapshot, d).ok()).map(|k| k.to_kept()).collect();
        if let Err(e) = self.folder.put(&self.key, snapshot, &starts).and_then(|()| self.folder.note_seen(&self.path, &self.key)) {
            eprintln!("note: could not keep the decoded snapshot in {} (TENSORMEM_CACHE): {e}", self.folder.dir.display());
        }
    }
}

/// Loads the snapshot at `path` (see [`load`]) for `work`, with the start states kept beside its
/// decode when it was read back. A decode to keep for the next open is written meanwhile, on
/// another thread (for a 1 GB file, about a second that `work` does not wait for), and the
/// decode kept whole before this returns.
///
/// The snapshot is freed on a thread of its own: freeing 11.5 M entries one by one takes 0.15 s
/// that the answer need not wait for (a command's process ends before, the OS taking the
/// memory back at once; a longer-lived caller, Python's `cli`, gets it freed meanwhile).
fn with_loaded<R>(path: &Path, work: impl FnOnce(&Snapshot, &[KnownStart]) -> Result<R, Failure>) -> Result<R, Failure> {
    let (snapshot, starts, to_keep) = load(path)?;
    let result = match &to_keep {
        None => work(&snapshot, &starts),
        Some(to_keep) => std::thread::scope(|scope| {
            let keeping = scope.spawn(|| {
                yield_to_the_work();
                to_keep.write(&snapshot)
            });
            let result = work(&snapshot, &starts);
            if keeping.join().is_err() {
                eprintln!("note: could not keep the decoded snapshot in {} (TENSORMEM_CACHE)", to_keep.folder.dir.display());
            }
            result
        }),
    };
    std::thread::spawn(move || drop(snapshot));
    result
}

/// Lowers the calling thread's priority: the decode kept for the next open is written while
/// this open's work (a replay and its own second thread) runs, and on two cores three threads
/// at one priority took a tenth of a second from the 1 GB summary. The command still waits for
/// the file, so on a machine busy with other work it may end later. Linux only (elsewhere the
/// call would lower the whole process); a refusal changes nothing.
fn yield_to_the_work() {
    #[cfg(target_os = "linux")]
    // SAFETY: setpriority reads no memory of ours; `who` 0 is the calling thread on Linux.
    unsafe {
        libc::setpriority(libc::PRIO_PROCESS, 0, 10);
    }
}

/// [`load`], its decode kept before it returns (for work on several files).
fn load_kept(path: &Path) -> Result<Snapshot, Failure> {
    let (snapshot, _, to_keep) = load(path)?;
    if let Some(to_keep) = to_keep {
        to_keep.write(&snapshot);
    }
    Ok(snapshot)
}

/// The snapshot at `path` (or the one a tool call was given in its place); the start states
/// kept beside its decode when it was read back, or its decode to keep when it was decoded from
/// a file worth keeping.
fn load(path: &Path) -> Result<(Snapshot, Vec<KnownStart>, Option<ToKeep>), Failure> {
    if path == Path::new(GIVEN_FILE)
        && let Some(snapshot) = GIVEN_SNAPSHOT.with(|given| given.borrow_mut().take())
    {
        return Ok((snapshot, Vec::new(), None));
    }
    // A big file takes seconds: on a terminal, how far reading and decoding have got.
    let length = std::fs::metadata(path).ok().filter(|m| m.is_file()).map(|m| m.len());
    let bar = (length.is_some_and(|n| n > 64 << 20) && std::io::stderr().is_terminal()).then(|| {
        let bar = ProgressBar::new(0);
        bar.set_style(ProgressStyle::with_template("{prefix} {bar:40} {bytes}/{total_bytes}, {msg} ({eta})").unwrap());
        bar
    });
    let show = |stage: &'static str, p: trace::LoadProgress| {
        if let Some(bar) = &bar {
            bar.set_prefix(stage);
            bar.set_length(p.total_bytes.unwrap_or(p.bytes_read) as u64);
            bar.set_position(p.bytes_read as u64);
            bar.set_message(format!("{} entries decoded", p.entries_decoded));
        }
    };
    let failed = |e: trace::TraceError| Failure(format!("{}: {e}", path.display()), 1);
    // A big regular file's decode is kept in the cache folder, keyed by the file's hash: the
    // next open of the same bytes reads it back instead of decoding again. Only a file seen
    // before is hashed first to look for it.
    let cache = length.filter(|&n| n >= trace::cache::WORTH_CACHING).and_then(|_| trace::cache::Folder::from_env());
    if let Some(folder) = cache.as_ref().filter(|folder| folder.seen(path)) {
        // The decode its note names is read back on a second thread while the file is hashed;
        // it serves only if the hash agrees.
        let noted = folder.noted_key(path);
        let (key, read_back) = std::thread::scope(|scope| {
            let reading = noted.map(|noted| scope.spawn(move || folder.get(&noted)));
            let key = trace::key_of_file(path, &mut |p| show("hashing", p));
            (key, reading.and_then(|r| r.join().ok()))
        });
        let key = key.map_err(failed)?;
        let kept = match read_back {
            Some(decoded) if noted == Some(key) => decoded,
            _ => folder.get(&key),
        };
        if let Some(decoded) = kept {
            if let Some(bar) = &bar {
                bar.finish_and_clear();
            }
            let starts = KnownStart::all_kept(&decoded.snapshot, decoded.starts);
            return Ok((decoded.snapshot, starts, None));
        }
    }
    let loaded = trace::load_file_keyed(path, &mut |p| show("reading", p));
    if let Some(bar) = bar {
        bar.finish_and_clear();
    }
    let (snapshot, key) = loaded.map_err(failed)?;
    Ok((snapshot, Vec::new(), cache.map(|folder| ToKeep { folder, key, path: path.to_path_buf() })))
}

/// Replays each device (or `device`) of `snapshot`, from its start in `starts` where it is
/// there (kept beside the snapshot's decode), with a progress bar on a terminal.
fn replay_with_progress(
    snapshot: &Snapshot,
    device: Option<i64>,
    options: &ReplayOptions,
    starts: &[KnownStart],
    show: bool,
) -> Result<Vec<DeviceReplay>, Failure> {
    let devices = match device {
        Some(d) => vec![d],
        None => snapshot.devices(),
    };
    if devices.is_empty() {
        return Err(Failure("the snapshot has no segments and no trace".into(), 1));
    }
    let total: usize = devices.iter().map(|&d| snapshot.trace_of(d).len()).sum();
    let bar = if show && std::io::stderr().is_terminal() && total > 50_000 {
        let bar = ProgressBar::new(total as u64);
        bar.set_style(ProgressStyle::with_template("replaying {bar:40} {pos}/{len} events ({per_sec}, {eta})").unwrap());
        Some(bar)
    } else {
        None
    };
    let mut done_before = 0;
    let mut results = Vec::new();
    for d in devices {
        let mut tick = |done: usize, _total: usize| {
            if let Some(b) = &bar {
                b.set_position((done_before + done) as u64);
            }
        };
        let known_start = starts.iter().find(|k| k.device() == d).cloned();
        let options = ReplayOptions { known_start: known_start.or_else(|| options.known_start.clone()), ..options.clone() };
        results.push(replay::replay_device(snapshot, d, &options, &mut tick)?);
        done_before += snapshot.trace_of(d).len();
    }
    if let Some(b) = bar {
        b.finish_and_clear();
    }
    Ok(results)
}

fn demo(out: &Path) -> Result<(), Failure> {
    println!("Recording batched inference with a wobbling batch size (tensormem's allocator, virtual device)...");
    let snapshot = tensormem::scenarios::variable_batch_inference(AllocatorConfig::default(), None)?;
    save(&snapshot, out)?;
    println!("wrote {} ({} trace events); pytorch.org/memory_viz opens it too\n", out.display(), snapshot.device_traces[0].len());
    let reloaded = load_kept(out)?;
    let mut expandable = None;
    for (title, conf) in [("as recorded (default settings)", None), ("what if: expandable_segments:True", Some("expandable_segments:True"))] {
        println!("== replay {title}");
        let config = conf.map(|c| AllocatorConfig::parse(c).expect("valid"));
        let r = replay::replay_device(&reloaded, 0, &ReplayOptions { config, ..Default::default() }, &mut |_, _| {})?;
        print_replay(&r);
        println!();
        expandable = Some(r.replayed.figures.peak_reserved_bytes);
    }
    let classic: u64 = snapshot.segments.iter().map(|s| s.total_size).sum();
    if let Some(e) = expandable {
        println!("Reserved at the end: {} with classic segments, {} with expandable segments (peak).", format_size(classic), format_size(e));
    }
    println!("Try: tensormem replay {} --capacity 600MiB", out.display());
    Ok(())
}
