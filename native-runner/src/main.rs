//! `tensormem`: the command line. Reads and replays PyTorch memory snapshots.
//!
//! Errors go to stderr as one line with a non-zero exit (1: bad input or a failed run, 2: bad
//! usage), never as a panic trace.

mod bench;

use clap::{Parser, Subcommand};
use indicatif::{ProgressBar, ProgressStyle};
use std::io::IsTerminal;
use std::path::{Path, PathBuf};
use std::process::ExitCode;
use tensormem::alloc::{format_size, AllocatorConfig};
use tensormem::replay::{self, DeviceReplay, ReplayOptions};
use tensormem::report;
use tensormem::trace::{self, Snapshot};

#[derive(Parser)]
#[command(name = "tensormem", version, about = "See, replay and explain GPU memory: PyTorch's caching allocator, reproduced.")]
struct Cli {
    #[command(subcommand)]
    command: Command,
}

#[derive(Subcommand)]
enum Command {
    /// Replay a PyTorch memory snapshot through tensormem's allocator and compare decisions.
    ///
    /// The start state is rebuilt by undoing the trace from the snapshot's final segments; every
    /// alloc and free then goes through the allocator with the file's settings (or --alloc-conf)
    /// on a device of --capacity bytes (unlimited by default).
    Replay {
        /// Snapshot file: pickle (torch.cuda.memory._dump_snapshot) or JSON.
        file: PathBuf,
        /// Only this device (default: every device with a trace or segments).
        #[arg(long)]
        device: Option<i64>,
        /// Allocator settings in PYTORCH_CUDA_ALLOC_CONF syntax, instead of the file's.
        #[arg(long, value_name = "STR")]
        alloc_conf: Option<String>,
        /// Device memory, e.g. 80GiB, 24GB, 512MiB or bytes (default: unlimited).
        #[arg(long, value_name = "SIZE", value_parser = size_arg)]
        capacity: Option<u64>,
        /// Print one JSON object per device instead of a table.
        #[arg(long)]
        json: bool,
        /// Also print memory_summary() of the replayed final state.
        #[arg(long)]
        summary: bool,
    },
    /// memory_summary() of a snapshot's final state, plus the peaks its trace shows.
    Summary {
        file: PathBuf,
        #[arg(long)]
        device: Option<i64>,
        /// memory_stats() and peaks as JSON.
        #[arg(long)]
        json: bool,
    },
    /// The GPU adapter wgpu finds: name, backend, features and limits.
    Info {
        #[arg(long)]
        json: bool,
    },
    /// Matmul (tiled vs naive kernel), elementwise bandwidth, and the caching allocator vs
    /// creating a buffer per tensor, measured in one run on the first adapter.
    Bench {
        /// Square matmul sizes.
        #[arg(long, value_delimiter = ',', default_values_t = [128usize, 256, 512])]
        sizes: Vec<usize>,
        #[arg(long)]
        json: bool,
    },
    /// Record an example snapshot (batched inference with a wobbling batch size) and replay it
    /// with the default settings and with expandable segments.
    Demo {
        /// Where to write the snapshot (.pickle or .json).
        #[arg(long, default_value = "target/tensormem-demo/variable-batch.pickle")]
        out: PathBuf,
    },
}

fn size_arg(s: &str) -> Result<u64, String> {
    report::parse_size(s)
}

/// A failure to report: message and exit status.
struct Failure(String, u8);

impl<E: std::fmt::Display> From<E> for Failure {
    fn from(e: E) -> Failure {
        Failure(e.to_string(), 1)
    }
}

fn main() -> ExitCode {
    let cli = Cli::parse();
    match run(cli.command) {
        Ok(()) => ExitCode::SUCCESS,
        Err(Failure(message, code)) => {
            eprintln!("error: {message}");
            ExitCode::from(code)
        }
    }
}

fn run(command: Command) -> Result<(), Failure> {
    match command {
        Command::Replay { file, device, alloc_conf, capacity, json, summary } => {
            let config = alloc_conf
                .map(|c| AllocatorConfig::parse(&c).map_err(|e| Failure(e.to_string(), 2)))
                .transpose()?;
            let snapshot = load(&file)?;
            let options = ReplayOptions { config, capacity };
            let results = replay_with_progress(&snapshot, device, &options, !json)?;
            for r in &results {
                if json {
                    println!("{}", serde_json::to_string(r)?);
                } else {
                    print_replay(r);
                    if summary {
                        print!("{}", r.summary);
                    }
                }
            }
            Ok(())
        }
        Command::Summary { file, device, json } => {
            let snapshot = load(&file)?;
            let results = replay_with_progress(&snapshot, device, &ReplayOptions::default(), !json)?;
            for r in &results {
                if json {
                    let value = serde_json::json!({
                        "device": r.device,
                        "events": r.events,
                        "settings": r.settings,
                        "memory_stats": r.replayed.memory_stats,
                        "trace_peak_reserved_bytes": r.recorded.peak_reserved_bytes,
                        "trace_peak_allocated_bytes": r.recorded.peak_allocated_bytes,
                        "final_state_match": r.final_state_match,
                    });
                    println!("{value}");
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
        Command::Demo { out } => demo(&out),
        Command::Info { json } => info(json),
        Command::Bench { sizes, json } => {
            let dev = open_gpu()?;
            let report = bench::run(&dev, &sizes, &mut |step| {
                if !json {
                    eprintln!("  {step}...");
                }
            })
            .map_err(|e| Failure(e, 1))?;
            if json {
                println!("{}", serde_json::to_string(&report)?);
            } else {
                println!("adapter: {}", report.adapter);
                for m in &report.matmul {
                    println!(
                        "matmul {}x{}x{}: register-blocked {:.2} GFLOP/s, tiled {:.2}, naive {:.2} (best vs naive {:.2}x)",
                        m.m,
                        m.n,
                        m.k,
                        m.blocked_gflops,
                        m.tiled_gflops,
                        m.naive_gflops,
                        m.gflops / m.naive_gflops
                    );
                }
                println!("elementwise: {:.2} GB/s", report.elementwise_gbps);
                println!(
                    "1 MiB tensor: cached alloc+free {:.0}/s, wgpu create+destroy buffer {:.0}/s ({:.0}x)",
                    report.alloc_free_per_s,
                    report.create_buffer_per_s,
                    report.alloc_free_per_s / report.create_buffer_per_s
                );
            }
            Ok(())
        }
    }
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

fn load(path: &Path) -> Result<Snapshot, Failure> {
    trace::load_file(path).map_err(|e| Failure(format!("{}: {e}", path.display()), 1))
}

fn replay_with_progress(snapshot: &Snapshot, device: Option<i64>, options: &ReplayOptions, show: bool) -> Result<Vec<DeviceReplay>, Failure> {
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
        results.push(replay::replay_device(snapshot, d, options, &mut tick)?);
        done_before += snapshot.trace_of(d).len();
    }
    if let Some(b) = bar {
        b.finish_and_clear();
    }
    Ok(results)
}

fn print_replay(r: &DeviceReplay) {
    let capacity = r.capacity.map_or("unlimited".to_string(), format_size);
    println!("device {}: {} events, settings {}, capacity {}", r.device, r.events, r.settings, capacity);
    println!("  start (rebuilt from the final state): {} reserved, {} allocated", format_size(r.start_reserved_bytes), format_size(r.start_allocated_bytes));
    println!("  {:<28} {:>16} {:>16}", "", "recorded", "replayed");
    let rows: [(&str, String, String); 6] = [
        ("segment allocs (cudaMalloc)", r.recorded.segment_allocs.to_string(), r.replayed.figures.segment_allocs.to_string()),
        ("segment frees", r.recorded.segment_frees.to_string(), r.replayed.figures.segment_frees.to_string()),
        ("pages mapped / unmapped", format!("{} / {}", r.recorded.segment_maps, r.recorded.segment_unmaps), format!("{} / {}", r.replayed.figures.segment_maps, r.replayed.figures.segment_unmaps)),
        ("peak reserved", format_size(r.recorded.peak_reserved_bytes), format_size(r.replayed.figures.peak_reserved_bytes)),
        ("peak allocated", format!("{} req.", format_size(r.recorded.peak_allocated_bytes)), format_size(r.replayed.figures.peak_allocated_bytes)),
        ("out of memory", "-".into(), r.replayed.ooms.to_string()),
    ];
    for (label, a, b) in rows {
        println!("  {label:<28} {a:>16} {b:>16}");
    }
    println!(
        "  segment decisions matched {:.2}%, addresses matched {:.2}%, final state {}",
        r.segment_alloc_match * 100.0,
        r.address_match * 100.0,
        if r.final_state_match { "identical" } else { "different" }
    );
    match &r.first_divergence {
        None => println!("  first divergence: none"),
        Some(d) => println!("  first divergence: event {}: {}", d.event, d.reason),
    }
    for w in &r.warnings {
        println!("  warning: {w}");
    }
}

fn demo(out: &Path) -> Result<(), Failure> {
    println!("Recording batched inference with a wobbling batch size (tensormem's allocator, virtual device)...");
    let snapshot = tensormem::scenarios::variable_batch_inference(AllocatorConfig::default(), None)?;
    if let Some(dir) = out.parent().filter(|d| !d.as_os_str().is_empty()) {
        std::fs::create_dir_all(dir).map_err(|e| Failure(format!("cannot create {}: {e}", dir.display()), 1))?;
    }
    trace::save_file(&snapshot, out)?;
    println!("wrote {} ({} trace events); pytorch.org/memory_viz opens it too\n", out.display(), snapshot.device_traces[0].len());
    let reloaded = load(out)?;
    let mut expandable = None;
    for (title, conf) in [("as recorded (default settings)", None), ("what if: expandable_segments:True", Some("expandable_segments:True"))] {
        println!("== replay {title}");
        let config = conf.map(|c| AllocatorConfig::parse(c).expect("valid"));
        let r = replay::replay_device(&reloaded, 0, &ReplayOptions { config, capacity: None }, &mut |_, _| {})?;
        print_replay(&r);
        println!();
        expandable = Some(r.replayed.figures.peak_reserved_bytes);
    }
    let classic: u64 = snapshot.segments.iter().map(|s| s.total_size).sum();
    if let Some(e) = expandable {
        println!(
            "Reserved at the end: {} with classic segments, {} with expandable segments (peak).",
            format_size(classic),
            format_size(e)
        );
    }
    println!("Try: tensormem replay {} --capacity 600MiB", out.display());
    Ok(())
}
