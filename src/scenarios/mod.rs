//! Named workloads: the list the page and `tensormem scenarios` / `tensormem run` share.
//!
//! Each scenario has parameters with defaults, optional `mistake` / `fix` variants, and an
//! explanation; a run records labelled steps (allocated and reserved after each) and the whole
//! trace as a snapshot, timed by a clock modelled on the card's speed. For now the scenarios are
//! allocator-level programs (tensor-sized requests with stacks) on a simulated card; tensor-level
//! ones arrive with autograd.

use crate::alloc::{format_size, AllocError, AllocatorConfig, ConfigError, RecordContext, TimeSource, VirtualAllocator};
use crate::device::SimOptions;
use crate::trace::{Frame, Frames, Snapshot};
use serde::Serialize;
use std::collections::BTreeMap;
use std::sync::Arc;

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
}

/// What to run: a scenario by name, its variant and parameter overrides, on which card.
#[derive(Debug, Clone, Default)]
pub struct RunRequest {
    pub scenario: String,
    pub variant: Option<String>,
    /// Overrides, `name -> value` as typed (`--set layers=4`).
    pub set: BTreeMap<String, String>,
    /// `sim:PRESET` or `sim:SIZE` (default `sim:H100-80GB`).
    pub device: Option<String>,
    /// Overrides the card's memory.
    pub capacity: Option<u64>,
    /// Allocator settings (PYTORCH_CUDA_ALLOC_CONF syntax) on top of the variant's.
    pub alloc_conf: Option<String>,
}

/// One labelled point of a run.
#[derive(Debug, Clone, PartialEq, Eq, Serialize)]
pub struct Step {
    pub label: String,
    pub allocated_bytes: u64,
    pub reserved_bytes: u64,
    /// `max_memory_allocated()` since the previous step.
    pub max_allocated_bytes: u64,
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
    pub steps: Vec<Step>,
    /// `max_memory_allocated()` / `max_memory_reserved()` over the run.
    pub peak_allocated_bytes: u64,
    pub peak_reserved_bytes: u64,
    /// The run's out-of-memory error, when it ran out (the steps before it are kept).
    pub out_of_memory: Option<String>,
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
    #[error("unknown device {0:?}: use sim:PRESET (one of {1}) or sim:SIZE such as sim:24GiB")]
    Device(String, String),
    #[error("the scenarios of this release are allocator programs that run on a simulated card only: use --device sim:PRESET or sim:SIZE")]
    NoGpu,
    #[error(transparent)]
    Settings(#[from] ConfigError),
}

/// Every scenario, in the order the page lists them.
pub fn list() -> Vec<ScenarioInfo> {
    vec![ScenarioInfo {
        name: "variable-batch",
        title: "Variable batch sizes fragment the cache",
        explanation: "Batched inference whose batch size wobbles from step to step. Each batch needs activation blocks a little \
                      larger or smaller than the last; the cached blocks of earlier batches rarely fit, so the allocator reserves new \
                      segments and reserved memory drifts far above what is allocated (look at the gap between the two curves). \
                      The fix is PyTorch's expandable segments (PYTORCH_CUDA_ALLOC_CONF=expandable_segments:True): one segment \
                      that grows and shrinks in 20 MiB pages, so reserved memory follows what is live. Also try \
                      max_split_size_mb:64 as a what-if.",
        parameters: vec![
            Parameter { name: "layers", default: "8", help: "MLP blocks (weights 2 x hidden x 4 hidden x 4 bytes each)" },
            Parameter { name: "hidden", default: "1024", help: "hidden size" },
            Parameter { name: "seq", default: "128", help: "tokens per sequence" },
            Parameter { name: "batches", default: DEFAULT_BATCHES, help: "batch size of each step" },
        ],
        variants: vec!["mistake", "fix"],
    }]
}

pub fn find(name: &str) -> Option<ScenarioInfo> {
    list().into_iter().find(|s| s.name == name)
}

/// The card a device string names: `sim:H100-80GB`, `sim:24GiB`, or a preset name alone.
pub fn parse_device(text: &str) -> Result<SimOptions, ScenarioError> {
    let body = text.strip_prefix("sim:").unwrap_or(text);
    let presets = || crate::device::PRESETS.iter().map(|p| p.0).collect::<Vec<_>>().join(", ");
    if text == "gpu" {
        return Err(ScenarioError::NoGpu);
    }
    if let Some(preset) = SimOptions::find(body) {
        return Ok(preset);
    }
    crate::report::parse_size(body).map(SimOptions::custom).map_err(|_| ScenarioError::Device(text.into(), presets()))
}

/// Runs a scenario.
pub fn run(request: &RunRequest) -> Result<RunResult, ScenarioError> {
    let names = || list().iter().map(|s| s.name).collect::<Vec<_>>().join(", ");
    let info = find(&request.scenario).ok_or_else(|| ScenarioError::Unknown(request.scenario.clone(), names()))?;
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
            return Err(bad(format!("unknown parameter {key:?}; parameters: {known}")));
        }
    }
    let value = |name: &str| -> &str {
        request.set.get(name).map(String::as_str).unwrap_or_else(|| info.parameters.iter().find(|p| p.name == name).map_or("", |p| p.default))
    };
    let card = parse_device(request.device.as_deref().unwrap_or("sim:H100-80GB"))?;
    let capacity = request.capacity.unwrap_or(card.capacity);
    let mut config = AllocatorConfig::default();
    if variant.as_deref() == Some("fix") && info.name == "variable-batch" {
        config.apply("expandable_segments:True")?;
    }
    if let Some(conf) = &request.alloc_conf {
        config.apply(conf)?;
    }
    let mut rec = Recorder::new(config.clone(), Some(capacity), &card);
    let mut parameters = BTreeMap::new();

    let outcome = match info.name {
        "variable-batch" => {
            let int = |name: &str| value(name).trim().parse::<u64>().map_err(|_| bad(format!("{name} must be a whole number, got {:?}", value(name))));
            let (layers, hidden, seq) = (int("layers")?, int("hidden")?, int("seq")?);
            let batches: Vec<u64> = value("batches")
                .split(',')
                .map(|b| b.trim().parse::<u64>())
                .collect::<Result<_, _>>()
                .map_err(|_| bad(format!("batches must be a comma-separated list of whole numbers, got {:?}", value("batches"))))?;
            if layers == 0 || hidden == 0 || seq == 0 || batches.is_empty() || batches.contains(&0) || layers > 1000 || batches.len() > 10_000 {
                return Err(bad("layers, hidden, seq and every batch must be positive (at most 1000 layers and 10000 batches)".into()));
            }
            // The largest figures the program computes must fit in 64 bits (16 EiB): a card
            // that small is refused later with an out-of-memory error, an overflow never.
            let max_batch = batches.iter().copied().max().unwrap_or(1);
            let product = |factors: &[u64]| factors.iter().try_fold(1u64, |p, &f| p.checked_mul(f));
            let fits = [product(&[64, hidden, hidden]), product(&[80, max_batch, seq, hidden]), product(&[16, max_batch, seq, hidden, hidden])];
            if fits.iter().any(Option::is_none) {
                return Err(bad(format!("hidden={hidden}, seq={seq} and batch {max_batch} make tensors larger than 16 EiB")));
            }
            parameters.insert("layers".into(), layers.into());
            parameters.insert("hidden".into(), hidden.into());
            parameters.insert("seq".into(), seq.into());
            parameters.insert("batches".into(), serde_json::Value::from(batches.clone()));
            variable_batch(&mut rec, layers, hidden, seq, &batches)
        }
        _ => unreachable!("every listed scenario has a program"),
    };
    let out_of_memory = match outcome {
        Ok(()) => None,
        Err(AllocError::OutOfMemory(e)) => Some(e.to_string()),
        Err(e) => Some(e.to_string()),
    };
    rec.fold_peaks();
    let (peak_allocated_bytes, peak_reserved_bytes) = rec.peaks;
    let snapshot = rec.snapshot();
    let mut explanation = info.explanation.to_string();
    if let Some(e) = &out_of_memory {
        explanation = format!("Out of memory on {} ({}): {e}\n\n{explanation}", card.name, format_size(capacity));
    }
    Ok(RunResult {
        scenario: info.name.into(),
        variant,
        device: format!("sim:{}", card.name),
        capacity_bytes: capacity,
        settings: config.to_string(),
        parameters,
        model_parameters: None,
        steps: rec.steps,
        peak_allocated_bytes,
        peak_reserved_bytes,
        out_of_memory,
        explanation,
        snapshot,
    })
}

/// The allocator plus the labelled steps taken so far, on a simulated card.
struct Recorder {
    alloc: VirtualAllocator,
    steps: Vec<Step>,
    /// Peak allocated and reserved over the whole run (the allocator's peaks restart each step).
    peaks: (u64, u64),
    card: SimOptions,
}

impl Recorder {
    /// Records everything, at times modelled on `card` (whose memory `capacity` may override).
    fn new(config: AllocatorConfig, capacity: Option<u64>, card: &SimOptions) -> Recorder {
        let mut alloc = VirtualAllocator::virtual_with(config);
        alloc.set_capacity(capacity);
        alloc.record_memory_history(true, RecordContext::All, 1 << 22);
        alloc.history_mut().set_time_source(TimeSource::modelled());
        Recorder { alloc, steps: Vec::new(), peaks: (0, 0), card: card.clone() }
    }

    /// The program ran f32 work moving `bytes` and doing `flops`: the clock moves by its cost
    /// on the card, the sim device's cost model.
    fn run(&mut self, bytes: u64, flops: u64) {
        self.alloc.advance_time_us(self.card.speed.op_time_us(bytes, flops, false));
    }

    fn snapshot(&mut self) -> Snapshot {
        self.alloc.snapshot_on(&self.card.device_name())
    }

    fn step(&mut self, label: String) {
        let stats = self.alloc.stats();
        self.steps.push(Step {
            label,
            allocated_bytes: stats.allocated_bytes.all().current as u64,
            reserved_bytes: stats.reserved_bytes.all().current as u64,
            max_allocated_bytes: stats.allocated_bytes.all().peak as u64,
        });
        self.fold_peaks();
        self.alloc.reset_peak_stats();
    }

    fn fold_peaks(&mut self) {
        let stats = self.alloc.stats();
        self.peaks.0 = self.peaks.0.max(stats.allocated_bytes.all().peak as u64);
        self.peaks.1 = self.peaks.1.max(stats.reserved_bytes.all().peak as u64);
    }
}

fn frames(name: &str, line: u64) -> Frames {
    Arc::from(vec![Frame { filename: "scenarios/variable_batch.py".into(), line, name: name.into() }])
}

/// Batched inference whose batch size wobbles from step to step: the pattern that expandable
/// segments were made for (PyTorch's Note [Expandable Segments]). Each step pushes activations
/// through `layers` MLP blocks; a slightly larger batch no longer fits the cached blocks of the
/// previous ones, so new segments pile up and reserved memory drifts above allocated.
/// The variable-batch scenario's default batch sizes: a wobble around 32.
const DEFAULT_BATCHES: &str = "32,31,33,30,34,29,36,31,38,27,40,33";

fn variable_batch(rec: &mut Recorder, layers: u64, hidden: u64, seq: u64, batches: &[u64]) -> Result<(), AllocError> {
    // fc1 [hidden, 4 hidden] and fc2 [4 hidden, hidden], f32.
    let layer_weights = 2 * hidden * 4 * hidden * 4;
    let mut weights = Vec::new();
    for layer in 0..layers {
        weights.push(rec.alloc.malloc(layer_weights, 0, Some(frames(&format!("layers.{layer}.weights"), 20)))?);
    }
    rec.step("weights loaded".into());
    for &batch in batches {
        let activation = batch * seq * hidden * 4;
        let mut x = rec.alloc.malloc(activation, 0, Some(frames("input", 30)))?;
        for layer in 0..layers {
            let hidden_act = rec.alloc.malloc(4 * activation, 0, Some(frames(&format!("layers.{layer}.fc1"), 33)))?;
            let y = rec.alloc.malloc(activation, 0, Some(frames(&format!("layers.{layer}.fc2"), 34)))?;
            // fc1 reads x and its weights and writes the 4x wider activation; fc2 reads that and
            // its weights and writes y. Every token multiplies and adds each f32 weight once:
            // 2 FLOPs per 4 bytes.
            rec.run(10 * activation + layer_weights, (batch * seq).saturating_mul(layer_weights / 2));
            rec.alloc.free(hidden_act.ptr, None)?;
            rec.alloc.free(x.ptr, None)?;
            x = y;
        }
        rec.alloc.free(x.ptr, None)?;
        rec.step(format!("batch {batch}"));
    }
    Ok(())
}

/// The variable-batch program with its default parameters under `config`, on an unlimited card
/// (or `capacity`) as fast as an H100: `tensormem demo`'s recording.
pub fn variable_batch_inference(config: AllocatorConfig, capacity: Option<u64>) -> Result<Snapshot, AllocError> {
    let mut rec = Recorder::new(config, capacity, &SimOptions::preset("H100-80GB"));
    let batches: Vec<u64> = DEFAULT_BATCHES.split(',').map(|b| b.parse().expect("the default batches are numbers")).collect();
    variable_batch(&mut rec, 8, 1024, 128, &batches)?;
    Ok(rec.snapshot())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn expandable_segments_reserve_less_for_variable_batches() {
        let classic = variable_batch_inference(AllocatorConfig::default(), None).unwrap();
        let expandable = variable_batch_inference(AllocatorConfig::parse("expandable_segments:True").unwrap(), None).unwrap();
        let reserved = |s: &Snapshot| s.segments.iter().map(|s| s.total_size).sum::<u64>();
        const MIB: u64 = 1 << 20;
        // Peak live bytes: 8 x 32 MiB of weights, then at batch 40 an input (20 MiB), the fc1
        // activation (80 MiB) and the fc2 output (20 MiB) at once: 376 MiB. One expandable segment
        // holds exactly that, in 20 MiB pages: 19 pages.
        assert_eq!(reserved(&expandable), 19 * 20 * MIB);
        // Classic segments keep every size that was once needed (pinned from the rules: 714 MiB).
        assert_eq!(reserved(&classic), 714 * MIB);
        assert!(reserved(&expandable) < reserved(&classic));
    }
}
