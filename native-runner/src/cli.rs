//! The command line's grammar: every subcommand, its arguments and their help (clap), and the
//! parsers of sizes, cards and replay starts. `main.rs` runs what this parses.

use clap::{Parser, Subcommand};
use std::path::PathBuf;
use tensormem::replay::StartMode;
use tensormem::report;
use tensormem::scenarios;

#[derive(Parser)]
#[command(name = "tensormem", version, about = "See, replay and explain GPU memory: PyTorch's caching allocator, reproduced.")]
pub(crate) struct Cli {
    #[command(subcommand)]
    pub(crate) command: Command,
}

#[derive(Subcommand)]
pub(crate) enum Command {
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
        /// Start state: `recorded` (the file's segments and blocks, exact) or `replaced` (only the
        /// live allocations, placed afresh under the new settings; cached blocks not carried over).
        #[arg(long, value_name = "recorded|replaced", default_value = "recorded", value_parser = start_arg)]
        start: StartMode,
        /// Write the replayed trace (with the recorded stacks) as a snapshot: .pickle or .json.
        #[arg(long, value_name = "OUT")]
        snapshot: Option<PathBuf>,
    },
    /// List the scenarios, with their parameters and variants.
    Scenarios {
        #[arg(long)]
        json: bool,
    },
    /// Run a scenario on a simulated card: labelled steps with allocated and reserved bytes.
    Run {
        /// Scenario name (see `tensormem scenarios`).
        name: String,
        /// `mistake` or `fix`, for scenarios that show a mistake (default: mistake).
        #[arg(long)]
        variant: Option<String>,
        /// Parameter values: --set layers=4 --set hidden=2048, or --set layers=4,hidden=2048.
        #[arg(long = "set", value_name = "KEY=VALUE")]
        set: Vec<String>,
        /// gpu (this machine's adapter, real kernels), sim:PRESET (e.g. sim:H100-80GB) or sim:SIZE (e.g. sim:24GiB).
        #[arg(long, default_value = "sim:H100-80GB")]
        device: String,
        /// Device memory, overriding the card's.
        #[arg(long, value_name = "SIZE", value_parser = size_arg)]
        capacity: Option<u64>,
        /// Allocator settings in PYTORCH_CUDA_ALLOC_CONF syntax, on top of the variant's.
        #[arg(long, value_name = "STR")]
        alloc_conf: Option<String>,
        /// cuBLAS's workspace per thread in CUBLAS_WORKSPACE_CONFIG syntax (:SIZE_KIB:COUNT, e.g.
        /// :4096:8 for 32 MiB, :4096:2:16:8 for PyTorch's pre-Hopper default); default: PyTorch 2.11's
        /// for the card.
        #[arg(long, value_name = "STR")]
        cublas_workspace_config: Option<String>,
        /// Steps to record (the training scenarios' `steps`: after the `warmup` steps).
        #[arg(long, value_name = "N")]
        steps: Option<u64>,
        /// Write the run's trace as a snapshot: .pickle or .json.
        #[arg(long, value_name = "OUT")]
        snapshot: Option<PathBuf>,
        #[arg(long)]
        json: bool,
    },
    /// A training run's memory (`tensormem run lm-train ... --json`) against a real PyTorch trace
    /// of a training step: allocated at the end of forward, loss, backward and the optimizer
    /// step, and the peak, with their differences.
    Compare {
        /// The run's JSON (`tensormem run lm-train --json > run.json`).
        run: PathBuf,
        /// The PyTorch snapshot (pickle or JSON) of one training step.
        file: PathBuf,
        #[arg(long, default_value_t = 0)]
        device: i64,
        #[arg(long)]
        json: bool,
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
    /// Say what is wrong with a snapshot's memory (or a scenario's): the peak, an out-of-memory
    /// error, fragmentation, a truncated trace; each with its evidence, the fix and, where a
    /// replay can measure it, what the fix saves.
    Doctor {
        /// Snapshot file: pickle (torch.cuda.memory._dump_snapshot) or JSON.
        #[arg(required_unless_present = "scenario", conflicts_with = "scenario")]
        file: Option<PathBuf>,
        /// Run this scenario on a simulated card and diagnose its trace instead.
        #[arg(long, value_name = "NAME")]
        scenario: Option<String>,
        /// With --scenario: `mistake` or `fix`.
        #[arg(long, requires = "scenario")]
        variant: Option<String>,
        /// With --scenario: parameter values, as `tensormem run` takes them.
        #[arg(long = "set", value_name = "KEY=VALUE", requires = "scenario")]
        set: Vec<String>,
        /// A file's device index (default: the one with an out-of-memory error, else the one that
        /// reserved the most); with --scenario, the card: sim:PRESET or sim:SIZE.
        #[arg(long)]
        device: Option<String>,
        /// Check the trace against a card of this size (an `oom` finding when it does not fit).
        #[arg(long, value_name = "SIZE", value_parser = size_arg)]
        capacity: Option<u64>,
        /// Print {"findings": [...]}.
        #[arg(long)]
        json: bool,
    },
    /// Predict a program's memory at another batch or context from snapshots recorded at small ones.
    ///
    /// Give two or more snapshots of the same program, each with the values of one or two
    /// variables it was recorded at (any names: `small.pickle@context=128 big.pickle@context=256`,
    /// or `a.pickle@batch=2,context=128`). Their events are aligned (same stacks in the same
    /// order), each allocation's size is fitted as a law of the variables (constant, linear,
    /// quadratic, products), and the trace at --to is replayed through the caching allocator.
    /// With one snapshot the laws are guesses from the sizes' factors and the prediction weaker.
    Predict {
        /// Recordings, each as FILE@name=value[,name=value].
        #[arg(required = true, value_name = "FILE@VAR=VALUE")]
        recordings: Vec<String>,
        /// The values to predict at: context=1024, or batch=16,context=1024 (with --fit, the
        /// fitted variable defaults to the largest value that fits).
        #[arg(long, value_name = "VAR=VALUE", required_unless_present = "fit")]
        to: Option<String>,
        /// Find the largest value of this variable that fits --capacity, by replaying
        /// predictions, with the settings given and with expandable_segments:True.
        #[arg(long, value_name = "VAR", requires = "capacity")]
        fit: Option<String>,
        /// The snapshots' device index (default: as the doctor picks it).
        #[arg(long)]
        device: Option<i64>,
        /// Device memory, e.g. 80GiB, or a card preset (H100-80GB, A100-40GB, ...): an
        /// out-of-memory error, with PyTorch's text, when the prediction does not fit.
        #[arg(long, value_name = "SIZE|CARD", value_parser = capacity_arg)]
        capacity: Option<u64>,
        /// Allocator settings in PYTORCH_CUDA_ALLOC_CONF syntax, instead of the recordings'.
        #[arg(long, value_name = "STR")]
        alloc_conf: Option<String>,
        /// Write the predicted trace, replayed, as a snapshot: .pickle or .json.
        #[arg(long, value_name = "OUT")]
        snapshot: Option<PathBuf>,
        /// Print {"target", "peak_allocated_bytes", "peak_reserved_bytes", "peak_phase",
        /// "out_of_memory", "aligned_fraction", "unaligned_bytes", "how_sure", "laws", "fit",
        /// "warnings"}.
        #[arg(long)]
        json: bool,
    },
    /// A Model Context Protocol server on stdin/stdout: the summary, replay, doctor, run and
    /// scenarios tools, each returning what its subcommand's --json prints.
    ///
    /// Register it with an assistant as the command `tensormem mcp`. It reads the files it is
    /// given and writes none; it ends when its input ends.
    Mcp {
        /// Run one tool call (its JSON-RPC request line on stdin) and print its reply: what the
        /// server runs each call in.
        #[arg(long, hide = true)]
        call: bool,
        /// With --call: a call of the Python API (its request line, then a snapshot's bytes).
        #[arg(long, hide = true, requires = "call")]
        python: bool,
    },
    /// The GPU adapter wgpu finds: name, backend, features and limits.
    Info {
        #[arg(long)]
        json: bool,
    },
    /// What fits: the largest batch (or context) a training scenario's step runs at without any
    /// rank running out of memory, found by running the step, for every strategy on every card.
    Fit {
        /// A training scenario: lm-train, gpt2-train, oom, hf-train.
        name: String,
        /// Parameter values, as `run`'s (world=8, config=llama-3-8b, ...).
        #[arg(long = "set", value_name = "KEY=VALUE")]
        set: Vec<String>,
        /// The parameter to search.
        #[arg(long, default_value = "batch", value_parser = ["batch", "context"])]
        vary: String,
        /// Strategies to compare (one column each).
        #[arg(long, value_delimiter = ',', default_values_t = scenarios::fit::default_strategies().iter().map(|s| s.to_string()))]
        strategies: Vec<String>,
        /// Cards to compare (simulator presets or sizes such as 24GiB).
        #[arg(long, value_delimiter = ',', default_values_t = scenarios::fit::DEFAULT_CARDS.map(String::from))]
        cards: Vec<String>,
        #[arg(long)]
        json: bool,
    },
    /// Engine speed on the first adapter, each figure beside a baseline measured in the same
    /// run: matmul kernels vs the naive one, elementwise add vs the device's buffer copy, small
    /// ops with outputs from the caching allocator vs a fresh buffer each.
    Bench {
        /// Square matmul sizes.
        #[arg(long, value_delimiter = ',', default_values_t = [256usize, 512, 1024])]
        sizes: Vec<usize>,
        /// f32 elements of the bandwidth figures (add, copy, sums). Two sizes tell a fixed cost
        /// per op from bandwidth.
        #[arg(long, default_value_t = 16 << 20)]
        elements: usize,
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
    /// Serve the web page (www/, with the wasm build in www/pkg/) over HTTP on this machine.
    ///
    /// Prints one line with the page's URL, then serves until killed. With FILE, the page opens
    /// with that snapshot loaded (the file is served at /snapshot/<its name>).
    Serve {
        /// Snapshot to open in the page: pickle (torch.cuda.memory._dump_snapshot) or JSON.
        file: Option<PathBuf>,
        /// Port to listen on; 0 picks a free one.
        #[arg(long, value_name = "N", default_value_t = 8080)]
        port: u16,
        /// Address to listen on.
        #[arg(long, value_name = "H", default_value = "127.0.0.1")]
        host: String,
        /// Folder to serve (default: www in the current directory, else the workspace's www).
        #[arg(long, value_name = "DIR")]
        root: Option<PathBuf>,
        /// Stop when stdin ends: how a parent process (Python's tensormem.serve) takes the server
        /// down with it, even when it is killed.
        #[arg(long, hide = true)]
        until_stdin_ends: bool,
        /// The snapshot is a temporary copy made for this server: remove it when stdin ends.
        #[arg(long, hide = true, requires = "until_stdin_ends")]
        remove_file_at_end: bool,
    },
}

fn size_arg(s: &str) -> Result<u64, String> {
    report::parse_size(s)
}

fn capacity_arg(s: &str) -> Result<u64, String> {
    tensormem::device::parse_capacity(s)
}

fn start_arg(s: &str) -> Result<StartMode, String> {
    StartMode::parse(s)
}
