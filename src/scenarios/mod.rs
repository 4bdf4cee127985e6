//! Named workloads: the list the page and `tensormem scenarios` / `tensormem run` share.
//!
//! Each scenario has parameters with defaults, optional `mistake` / `fix` variants, and an
//! explanation; a run records labelled steps (allocated and reserved after each) and the whole
//! trace as a snapshot. Scenarios are tensor programs: the same program runs on a simulated card
//! (timed by a clock modelled on the card's speed) or on the GPU (real kernels, wall clock), and
//! allocates identically on both.

use crate::alloc::{AllocError, AllocatorConfig, ConfigError, RecordContext, format_size};
use crate::device::{DeviceError, SimOptions};
use crate::tensor::TensorError;
use crate::trace::{Category, Snapshot};
use crate::{Device, GpuOptions};
use serde::Serialize;

pub mod compare;
pub mod fit;
mod fix_variant;
mod generation;
mod graphs;
mod pitfalls;
mod ranks;
mod seeds;
mod techniques;
mod training;
mod variable_batch;

pub use fix_variant::{DiagnoseError, Diagnosed, diagnose, diagnose_skipping};
pub use ranks::RankResult;
use std::collections::BTreeMap;
pub use variable_batch::variable_batch_inference;

/// A scenario as the list shows it.
#[derive(Debug, Clone, Serialize)]
pub struct ScenarioInfo {
    pub name: &'static str,
    pub title: &'static str,
    pub explanation: &'static str,
    pub parameters: Vec<Parameter>,
    /// `["mistake", "fix"]` where the scenario shows a mistake; empty otherwise.
    pub variants: Vec<&'static str>,
}

#[derive(Debug, Clone, Serialize)]
pub struct Parameter {
    pub name: &'static str,
    pub default: &'static str,
    pub help: &'static str,
    /// What values it takes; every value is checked against it before anything runs.
    pub kind: Kind,
}

/// A parameter's type.
#[derive(Debug, Clone, Copy, Serialize)]
#[serde(tag = "type", rename_all = "snake_case")]
pub enum Kind {
    /// A whole number in `min..=max`.
    Integer { min: u64, max: u64 },
    /// A comma-separated list of whole numbers, each in `min..=max`.
    Integers { min: u64, max: u64, max_len: usize },
    /// `true` or `false`.
    Flag,
    /// One of the options, or an alias: another spelling that stands for an option (`amp=true`
    /// is `amp=float16`) and is read as that option.
    Choice {
        options: &'static [&'static str],
        #[serde(skip_serializing_if = "no_aliases")]
        aliases: &'static [(&'static str, &'static str)],
    },
    /// Free text of at most `max_len` bytes (a preset's name or a file's path).
    Text { max_len: usize },
}

fn no_aliases(aliases: &&[(&str, &str)]) -> bool {
    aliases.is_empty()
}

impl Parameter {
    pub const fn integer(name: &'static str, default: &'static str, min: u64, max: u64, help: &'static str) -> Parameter {
        Parameter { name, default, help, kind: Kind::Integer { min, max } }
    }

    pub const fn flag(name: &'static str, default: &'static str, help: &'static str) -> Parameter {
        Parameter { name, default, help, kind: Kind::Flag }
    }

    pub const fn choice(name: &'static str, default: &'static str, options: &'static [&'static str], help: &'static str) -> Parameter {
        Parameter { name, default, help, kind: Kind::Choice { options, aliases: &[] } }
    }

    pub const fn text(name: &'static str, default: &'static str, max_len: usize, help: &'static str) -> Parameter {
        Parameter { name, default, help, kind: Kind::Text { max_len } }
    }

    /// A choice that also accepts `aliases`, each `(spelling, option)`: the value used is the
    /// option.
    pub const fn choice_with_aliases(
        name: &'static str,
        default: &'static str,
        options: &'static [&'static str],
        aliases: &'static [(&'static str, &'static str)],
        help: &'static str,
    ) -> Parameter {
        Parameter { name, default, help, kind: Kind::Choice { options, aliases } }
    }

    /// The value as typed, checked against the kind, as JSON.
    fn parse(&self, text: &str) -> Result<serde_json::Value, String> {
        let text = text.trim();
        let whole = |t: &str, min: u64, max: u64| match t.trim().parse::<u64>() {
            Ok(n) if (min..=max).contains(&n) => Ok(n),
            _ => Err(format!("{} must be a whole number from {min} to {max}, got {text:?}", self.name)),
        };
        Ok(match self.kind {
            Kind::Integer { min, max } => whole(text, min, max)?.into(),
            Kind::Integers { min, max, max_len } => {
                let values = text.split(',').map(|t| whole(t, min, max)).collect::<Result<Vec<_>, _>>()?;
                if values.is_empty() || values.len() > max_len {
                    return Err(format!("{} takes 1 to {max_len} comma-separated numbers, got {}", self.name, values.len()));
                }
                values.into()
            }
            Kind::Flag => match text {
                "true" | "1" | "yes" => true.into(),
                "false" | "0" | "no" => false.into(),
                _ => return Err(format!("{} must be true or false, got {text:?}", self.name)),
            },
            Kind::Text { max_len } if text.is_empty() || text.len() > max_len => {
                return Err(format!("{} takes 1 to {max_len} bytes of text, got {}", self.name, text.len()));
            }
            Kind::Text { .. } => text.into(),
            Kind::Choice { options, .. } if options.contains(&text) => text.into(),
            Kind::Choice { options, aliases } => match aliases.iter().find(|(alias, _)| *alias == text) {
                Some((_, option)) => (*option).into(),
                None => {
                    let aliases: Vec<String> = aliases.iter().map(|(alias, option)| format!("{alias} = {option}")).collect();
                    let aliases = if aliases.is_empty() { String::new() } else { format!(" ({})", aliases.join(", ")) };
                    return Err(format!("{} must be one of {}{aliases}, got {text:?}", self.name, options.join(", ")));
                }
            },
        })
    }
}

/// The checked parameter values a program runs with.
pub(crate) struct Values {
    map: BTreeMap<String, serde_json::Value>,
    variant: Option<String>,
}

impl Values {
    /// An integer parameter whose bounds fit an index (usize is 32 bits in wasm).
    pub fn int(&self, name: &str) -> usize {
        usize::try_from(self.u64(name)).expect("checked against bounds that fit an index")
    }

    pub fn u64(&self, name: &str) -> u64 {
        self.map[name].as_u64().expect("checked as an integer")
    }

    pub fn ints(&self, name: &str) -> Vec<u64> {
        self.map[name].as_array().expect("checked as a list").iter().map(|v| v.as_u64().expect("checked")).collect()
    }

    pub fn flag(&self, name: &str) -> bool {
        self.map[name].as_bool().expect("checked as a flag")
    }

    pub fn choice(&self, name: &str) -> &str {
        self.map[name].as_str().expect("checked as a choice")
    }

    pub fn text(&self, name: &str) -> &str {
        self.map[name].as_str().expect("checked as text")
    }

    /// Whether the run shows the fix (else the mistake, or a scenario without variants).
    pub fn fix(&self) -> bool {
        self.variant.as_deref() == Some("fix")
    }
}

/// A scenario: what the list shows, and its program.
pub(crate) struct Scenario {
    pub info: ScenarioInfo,
    /// Checks that need several parameters at once (sizes that would not index), and the
    /// work a run takes with these values, estimated before it runs (see [`WORK_BUDGET`]).
    pub check: fn(&Values) -> Result<Work, String>,
    /// Allocator settings the fix variant brings (PYTORCH_CUDA_ALLOC_CONF syntax), if any.
    pub fix_settings: Option<&'static str>,
    pub program: Program,
}

/// A scenario's tensor program. Most are plain functions; a program that waits for the device
/// (the gradient scaler reads found_inf, as PyTorch's `.item()` does) is async. On the sim
/// device nothing waits, so both run to the end at once.
pub(crate) enum Program {
    Sync(fn(&mut Recorder, &Values) -> Result<(), TensorError>),
    Async(for<'a> fn(&'a mut Recorder, &'a Values) -> LocalFuture<'a>),
}

pub(crate) type LocalFuture<'a> = std::pin::Pin<Box<dyn std::future::Future<Output = Result<(), TensorError>> + 'a>>;

/// The value of a future that is ready at once (a program on the sim device).
fn now<T>(future: impl std::future::Future<Output = T>) -> Option<T> {
    let mut future = std::pin::pin!(future);
    match future.as_mut().poll(&mut std::task::Context::from_waker(std::task::Waker::noop())) {
        std::task::Poll::Ready(value) => Some(value),
        std::task::Poll::Pending => None,
    }
}

/// The most work one run may take, in layer passes: a layer's forward is one pass, a training
/// micro-batch costs four per layer (forward, backward, the optimizer), a generated token one per
/// layer, an LSTM timestep one. On the simulated card a pass takes 0.1 to 0.5 ms on a 2-core
/// machine, so the budget is at most a few minutes of simulation. Parameters each have a range;
/// this bounds their product (steps x accumulation x layers, layers x new tokens, ...): a run
/// past it is refused before it starts, with the estimate.
pub const WORK_BUDGET: u64 = 1 << 19;

/// A run's estimated work: layer passes, and how they were counted.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Work {
    pub passes: u64,
    /// The product, as a person reads it (`(warmup 1 + steps 1000) x accumulation 1024 x 12 layers x 4`).
    pub counted: String,
}

impl Work {
    /// The product of `factors` (`(name, value)`), saturating.
    pub(crate) fn product(factors: &[(&str, u64)]) -> Work {
        let passes = factors.iter().fold(1u64, |n, &(_, f)| n.saturating_mul(f));
        let counted = factors.iter().map(|(name, f)| if name.is_empty() { f.to_string() } else { format!("{name} {f}") }).collect::<Vec<_>>().join(" x ");
        Work { passes, counted }
    }
}

/// The check of a small program that repeats a step, whose parameters need no joint check: its
/// work, the product of whichever repetition counts
/// it takes (`steps`, `micro_batches`, `timesteps`, `layers`), four passes each (forward,
/// backward, optimizer) on a model of four layers unless it names its own.
fn repeated_steps(v: &Values) -> Result<Work, String> {
    let mut factors = vec![];
    for name in ["steps", "micro_batches", "timesteps"] {
        if v.map.contains_key(name) {
            factors.push((name, v.u64(name)));
        }
    }
    factors.push(("layers", if v.map.contains_key("layers") { v.u64("layers") } else { 4 }));
    factors.push(("", 4));
    Ok(Work::product(&factors))
}

/// What to run: a scenario by name, its variant and parameter overrides, on which card.
#[derive(Debug, Clone, Default)]
pub struct RunRequest {
    pub scenario: String,
    pub variant: Option<String>,
    /// Overrides, `name -> value` as typed (`--set layers=4`).
    pub set: BTreeMap<String, String>,
    /// `gpu`, `sim:PRESET` or `sim:SIZE` (default `sim:H100-80GB`).
    pub device: Option<String>,
    /// Overrides the card's memory.
    pub capacity: Option<u64>,
    /// Allocator settings (PYTORCH_CUDA_ALLOC_CONF syntax) on top of the variant's.
    pub alloc_conf: Option<String>,
    /// cuBLAS's workspace per handle in `CUBLAS_WORKSPACE_CONFIG` syntax (`:4096:8`); None:
    /// PyTorch's default for the card.
    pub cublas_workspace_config: Option<String>,
}

/// One labelled point of a run.
#[derive(Debug, Clone, PartialEq, Eq, Serialize)]
pub struct Step {
    pub label: String,
    pub allocated_bytes: u64,
    pub reserved_bytes: u64,
    /// `max_memory_allocated()` since the previous step.
    pub max_allocated_bytes: u64,
    /// What the live tensors asked for (allocated counts whole blocks), and its peak since the
    /// previous step.
    pub requested_bytes: u64,
    pub max_requested_bytes: u64,
}

/// A finished run; its JSON is `tensormem run --json`'s.
#[derive(Debug, Clone, Serialize)]
pub struct RunResult {
    pub scenario: String,
    pub variant: Option<String>,
    pub device: String,
    pub capacity_bytes: u64,
    pub settings: String,
    /// Every parameter's value as used (defaults included).
    pub parameters: BTreeMap<String, serde_json::Value>,
    /// Parameter count, where the scenario has a model.
    pub model_parameters: Option<u64>,
    /// The parameters that require grad (hf-train: all of them, or the adapters under LoRA).
    #[serde(skip_serializing_if = "Option::is_none")]
    pub trainable_parameters: Option<u64>,
    pub steps: Vec<Step>,
    /// `max_memory_allocated()` / `max_memory_reserved()` over the run.
    pub peak_allocated_bytes: u64,
    pub peak_reserved_bytes: u64,
    /// The run's out-of-memory error, when it ran out (the steps before it are kept).
    pub out_of_memory: Option<String>,
    /// Training over several simulated GPUs (`world` > 1): every rank, in order. The run's own
    /// steps, peaks and snapshot are those of the rank it records (`rank`).
    #[serde(skip_serializing_if = "Vec::is_empty")]
    pub ranks: Vec<RankResult>,
    pub explanation: String,
    #[serde(skip)]
    pub snapshot: Snapshot,
}

#[derive(Debug, thiserror::Error)]
pub enum ScenarioError {
    #[error("unknown scenario {0:?}; known: {1}")]
    Unknown(String, String),
    #[error("scenario {scenario}: {message}")]
    Parameter { scenario: String, message: String },
    #[error("unknown device {0:?}: use gpu, sim:PRESET (one of {1}) or sim:SIZE such as sim:24GiB")]
    Device(String, String),
    #[error("a scenario on the GPU runs asynchronously (scenarios::run_anywhere); scenarios::run takes sim devices only")]
    GpuIsAsync,
    #[error(transparent)]
    Gpu(#[from] DeviceError),
    #[error("scenario {scenario} failed: {error}")]
    Failed { scenario: String, error: TensorError },
    #[error(transparent)]
    Settings(#[from] ConfigError),
    #[error("{0}")]
    Workspace(String),
}

/// Every scenario, in the order the page lists them.
fn all() -> Vec<Scenario> {
    // The page opens on the first.
    let mut all = vec![variable_batch::scenario()];
    all.extend(seeds::scenarios());
    all.extend(pitfalls::scenarios());
    all.extend(techniques::scenarios());
    all.extend(graphs::scenarios());
    all.extend(training::scenarios());
    all.push(generation::scenario());
    all
}

/// Every scenario as the list shows it.
pub fn list() -> Vec<ScenarioInfo> {
    all().into_iter().map(|s| s.info).collect()
}

pub fn find(name: &str) -> Option<ScenarioInfo> {
    list().into_iter().find(|s| s.name == name)
}

/// The card a device string names: `sim:H100-80GB`, `sim:24GiB`, or a preset name alone.
pub fn parse_device(text: &str) -> Result<SimOptions, ScenarioError> {
    let body = text.strip_prefix("sim:").unwrap_or(text);
    let presets = || crate::device::PRESETS.iter().map(|p| p.0).collect::<Vec<_>>().join(", ");
    if let Some(preset) = SimOptions::find(body) {
        return Ok(preset);
    }
    crate::report::parse_size(body).map(SimOptions::custom).map_err(|_| ScenarioError::Device(text.into(), presets()))
}

/// A request checked and resolved: the scenario, its variant, the parameter values, the
/// allocator settings and the card, before any device exists.
struct Plan {
    scenario: Scenario,
    values: Values,
    config: AllocatorConfig,
    /// The simulated card; None for the GPU (`--device gpu`).
    card: Option<SimOptions>,
    /// The memory asked for instead of the card's (or, on a GPU, of the adapter's guess).
    capacity: Option<u64>,
    /// `CUBLAS_WORKSPACE_CONFIG`'s bytes per handle, where given.
    cublas_workspace: Option<u64>,
    /// The run's estimated work, within [`WORK_BUDGET`].
    work: Work,
}

fn plan(request: &RunRequest) -> Result<Plan, ScenarioError> {
    let names = || list().iter().map(|s| s.name).collect::<Vec<_>>().join(", ");
    let scenario = all().into_iter().find(|s| s.info.name == request.scenario).ok_or_else(|| ScenarioError::Unknown(request.scenario.clone(), names()))?;
    let info = &scenario.info;
    let bad = |message: String| ScenarioError::Parameter { scenario: info.name.into(), message };
    let variant = match &request.variant {
        None if info.variants.is_empty() => None,
        None => Some("mistake".to_string()),
        Some(v) if info.variants.contains(&v.as_str()) => Some(v.clone()),
        Some(v) if info.variants.is_empty() => return Err(bad(format!("has no variants (asked for {v:?})"))),
        Some(v) => return Err(bad(format!("unknown variant {v:?}; use {}", info.variants.join(" or ")))),
    };
    for key in request.set.keys() {
        if !info.parameters.iter().any(|p| p.name == key) {
            let known = info.parameters.iter().map(|p| p.name).collect::<Vec<_>>().join(", ");
            return Err(bad(if known.is_empty() {
                format!("takes no parameters (got {key:?})")
            } else {
                format!("unknown parameter {key:?}; parameters: {known}")
            }));
        }
    }
    let mut map = BTreeMap::new();
    for p in &info.parameters {
        let text = request.set.get(p.name).map(String::as_str).unwrap_or(p.default);
        map.insert(p.name.to_string(), p.parse(text).map_err(bad)?);
    }
    let values = Values { map, variant };
    let work = (scenario.check)(&values).map_err(bad)?;
    if work.passes > WORK_BUDGET {
        return Err(bad(format!(
            "this run would take about {} layer passes ({}), more than the {} one run may take (a few minutes of simulation): lower the counts that multiply",
            crate::units::format_count(work.passes),
            work.counted,
            crate::units::format_count(WORK_BUDGET)
        )));
    }
    let card = match request.device.as_deref().unwrap_or("sim:H100-80GB") {
        "gpu" => None,
        other => Some(parse_device(other)?),
    };
    let mut config = AllocatorConfig::default();
    if let (true, Some(settings)) = (values.fix(), scenario.fix_settings) {
        config.apply(settings)?;
    }
    if let Some(conf) = &request.alloc_conf {
        config.apply(conf)?;
    }
    let cublas_workspace =
        request.cublas_workspace_config.as_deref().map(crate::device::cublas::parse_workspace_config).transpose().map_err(ScenarioError::Workspace)?;
    let card = card.map(|card| SimOptions { cublas_workspace: cublas_workspace.or(card.cublas_workspace), ..card });
    Ok(Plan { scenario, values, config, card, capacity: request.capacity, cublas_workspace, work })
}

/// Checks a request as `run` would (the scenario, its variant and parameters, the card and the
/// settings) without running it.
pub fn check(request: &RunRequest) -> Result<(), ScenarioError> {
    plan(request).map(|_| ())
}

/// The work a run of `request` would take (checked as `run` checks it, the budget included).
pub fn work(request: &RunRequest) -> Result<Work, ScenarioError> {
    plan(request).map(|plan| plan.work)
}

/// Runs a scenario on a simulated card (`sim:...`, the default).
pub fn run(request: &RunRequest) -> Result<RunResult, ScenarioError> {
    let plan = plan(request)?;
    if plan.card.is_none() {
        return Err(ScenarioError::GpuIsAsync);
    }
    now(plan.run_on_sim()).unwrap_or(Err(ScenarioError::GpuIsAsync))
}

/// Runs a scenario on this machine's GPU (natively through wgpu, in a browser through WebGPU)
/// or, for a `sim:` device, on the simulated card.
pub async fn run_anywhere(request: &RunRequest) -> Result<RunResult, ScenarioError> {
    let plan = plan(request)?;
    if plan.card.is_some() {
        return plan.run_on_sim().await;
    }
    let options = GpuOptions { capacity: plan.capacity, cublas_workspace: plan.cublas_workspace, ..Default::default() };
    let device = Device::gpu_with(options, plan.config.clone()).await?;
    let result = plan.run_on(device.clone(), None).await?;
    // As torch.cuda.synchronize does, waiting reports a command the GPU rejected meanwhile.
    device.wait().await?;
    Ok(result)
}

impl Plan {
    async fn run_on_sim(self) -> Result<RunResult, ScenarioError> {
        let Some(card) = self.card.clone() else { return Err(ScenarioError::GpuIsAsync) };
        let card = SimOptions { capacity: self.capacity.unwrap_or(card.capacity), ..card };
        let (device, config) = (Device::sim_with(card.clone(), self.config.clone()), self.config.clone());
        self.run_on(device, Some((card, config))).await
    }

    /// Runs the program; running out of memory is a result (the steps before it are kept), any
    /// other failure an error.
    async fn run_on(self, device: Device, sim: Option<(SimOptions, AllocatorConfig)>) -> Result<RunResult, ScenarioError> {
        let mut rec = Recorder::new(device);
        rec.sim = sim;
        let outcome = match self.scenario.program {
            Program::Sync(program) => program(&mut rec, &self.values),
            Program::Async(program) => program(&mut rec, &self.values).await,
        };
        let out_of_memory = out_of_memory(outcome).map_err(|error| ScenarioError::Failed { scenario: self.scenario.info.name.into(), error })?;
        let recorded = std::mem::take(&mut rec.recorded_ranks);
        if let Some(&first) = recorded.first() {
            let summary = ranks::summarize(&mut rec, first, out_of_memory.clone());
            rec.ranks.extend(recorded.iter().map(|&rank| RankResult { rank, ..summary.clone() }));
            rec.ranks.sort_by_key(|r| r.rank);
        }
        rec.fold_peaks();
        let (peak_allocated_bytes, peak_reserved_bytes) = rec.peaks;
        let dev = &rec.device;
        let capacity = dev.capacity().unwrap_or(0);
        let device = match &self.card {
            Some(card) => format!("sim:{}", card.name),
            None => dev.name().to_string(),
        };
        let mut explanation = self.scenario.info.explanation.to_string();
        if let Some(e) = &out_of_memory {
            explanation = format!("Out of memory on {device} ({}): {e}\n\n{explanation}", format_size(capacity));
        }
        Ok(RunResult {
            scenario: self.scenario.info.name.into(),
            variant: self.values.variant,
            device,
            capacity_bytes: capacity,
            settings: self.config.to_string(),
            parameters: self.values.map,
            model_parameters: rec.model_parameters,
            trainable_parameters: rec.trainable_parameters,
            peak_allocated_bytes,
            peak_reserved_bytes,
            out_of_memory,
            explanation,
            snapshot: dev.snapshot(),
            steps: rec.steps,
            ranks: rec.ranks,
        })
    }
}

/// Running out of memory is a result (PyTorch's message); any other failure stays an error.
pub(crate) fn out_of_memory(outcome: Result<(), TensorError>) -> Result<Option<String>, TensorError> {
    match outcome {
        Ok(()) => Ok(None),
        Err(TensorError::Device(DeviceError::Alloc(AllocError::OutOfMemory(e)))) => Ok(Some(e.to_string())),
        Err(e) => Err(e),
    }
}

/// What [`observe_steps`] calls: the step's number and label.
type StepObserverFn = Box<dyn FnMut(usize, &str)>;

thread_local! {
    static STEP_OBSERVER: std::cell::RefCell<Option<StepObserverFn>> = const { std::cell::RefCell::new(None) };
}

/// Calls `observe(n, label)` at each labelled step (the n-th) of the runs this thread makes, until
/// the returned guard drops: how a command line shows a long run's progress.
pub fn observe_steps(observe: impl FnMut(usize, &str) + 'static) -> StepObserver {
    STEP_OBSERVER.with(|o| *o.borrow_mut() = Some(Box::new(observe)));
    StepObserver(())
}

/// Stops [`observe_steps`]' observer when dropped.
pub struct StepObserver(());

impl Drop for StepObserver {
    fn drop(&mut self) {
        STEP_OBSERVER.with(|o| *o.borrow_mut() = None);
    }
}

/// A device recording everything, plus the labelled steps taken so far.
pub(crate) struct Recorder {
    pub device: Device,
    steps: Vec<Step>,
    /// The parameter count of the run's model, if it has one.
    pub model_parameters: Option<u64>,
    /// The number of parameters that require grad (hf-train).
    pub trainable_parameters: Option<u64>,
    /// Peak allocated and reserved over the whole run (the device's peaks restart each step).
    peaks: (u64, u64),
    /// The trace's length at each step: where each step's allocations end.
    step_positions: Vec<usize>,
    /// The simulated card and settings, to simulate other ranks alike (None on a GPU).
    sim: Option<(SimOptions, AllocatorConfig)>,
    /// Ranks simulated on devices of their own, summarised.
    pub ranks: Vec<RankResult>,
    /// The ranks whose allocations are this recorder's own (the recorded rank and its equals).
    pub recorded_ranks: Vec<usize>,
}

impl Recorder {
    fn new(device: Device) -> Recorder {
        device.record_memory_history(true, RecordContext::All, 1 << 22);
        Recorder {
            device,
            steps: Vec::new(),
            model_parameters: None,
            trainable_parameters: None,
            peaks: (0, 0),
            step_positions: Vec::new(),
            sim: None,
            ranks: Vec::new(),
            recorded_ranks: Vec::new(),
        }
    }

    /// A recorder on a fresh simulated card like this one's: another rank. None on a GPU.
    pub fn sibling(&self) -> Option<Recorder> {
        let (card, config) = self.sim.clone()?;
        let mut rec = Recorder::new(Device::sim_with(card.clone(), config.clone()));
        rec.sim = Some((card, config));
        Some(rec)
    }

    /// Summarises this recorder's run as rank `rank` (another rank's device, before it is
    /// dropped).
    pub fn summarize(&mut self, rank: usize, out_of_memory: Option<String>) -> RankResult {
        ranks::summarize(self, rank, out_of_memory)
    }

    /// Records a labelled point: allocated and reserved now, and the peak since the last one.
    pub fn step(&mut self, label: impl Into<String>) {
        let label = label.into();
        STEP_OBSERVER.with(|o| {
            if let Some(observe) = o.borrow_mut().as_mut() {
                observe(self.steps.len() + 1, &label);
            }
        });
        let dev = &self.device;
        self.steps.push(Step {
            label,
            allocated_bytes: dev.memory_allocated(),
            reserved_bytes: dev.memory_reserved(),
            max_allocated_bytes: dev.max_memory_allocated(),
            requested_bytes: dev.memory_requested(),
            max_requested_bytes: dev.max_memory_requested(),
        });
        self.step_positions.push(dev.history_len());
        self.fold_peaks();
        self.device.reset_peak_memory_stats();
    }

    fn fold_peaks(&mut self) {
        self.peaks.0 = self.peaks.0.max(self.device.max_memory_allocated());
        self.peaks.1 = self.peaks.1.max(self.device.max_memory_reserved());
    }
}

/// A batch of token ids [batch, context] and their next-token targets, spread over the
/// vocabulary (tagged as input).
pub(crate) fn token_batch(dev: &Device, batch: usize, context: usize, vocab: usize) -> Result<(crate::Tensor, crate::Tensor), TensorError> {
    let _inputs = dev.category(Category::Input);
    let ids: Vec<i64> = (0..batch * context).map(|i| (i * 7919 % vocab) as i64).collect();
    let targets: Vec<i64> = ids.iter().map(|&t| (t + 1) % vocab as i64).collect();
    Ok((dev.from_slice(&ids, &[batch, context])?, dev.from_slice(&targets, &[batch, context])?))
}
