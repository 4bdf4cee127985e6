//! The one wasm-bindgen surface the page (`www/`) uses. It runs inside the page's Web Worker:
//! parse a snapshot, lay out a device's timeline as flat arrays, replay under other settings,
//! run a scenario, diagnose (the doctor), export. Results cross to JavaScript as typed arrays and JSON strings.

use crate::doctor;
use crate::replay::{self, KnownStart, ReplayOptions, StartMode};
use crate::scenarios::{self, RunRequest};
use crate::timeline;
use crate::trace::{self, Snapshot};
use std::collections::BTreeMap;
use wasm_bindgen::prelude::*;

mod arrays;
pub use arrays::{LaidOut, TimelineArrays};

#[wasm_bindgen]
extern "C" {
    #[wasm_bindgen(js_namespace = console, js_name = error)]
    fn console_error(message: &str);
}

thread_local! {
    /// The last panic's message and place, for the worker to show instead of `unreachable`.
    static LAST_PANIC: std::cell::RefCell<Option<String>> = const { std::cell::RefCell::new(None) };
}

/// Runs when the module is instantiated: a panic is logged and kept with where it happened (the
/// page's wasm has no function names, so this is what a report can quote).
#[wasm_bindgen(start)]
fn start() {
    std::panic::set_hook(Box::new(|info| {
        let message = info.to_string();
        console_error(&message);
        LAST_PANIC.with(|last| *last.borrow_mut() = Some(message));
    }));
}

/// The doctor's finder that was running when a diagnosis stopped with a panic (None otherwise).
#[wasm_bindgen]
pub fn finder_running() -> Option<String> {
    doctor::finder_running().map(str::to_string)
}

/// Makes one finder panic whenever it runs (None: none): the page's tests check that the other
/// findings are still reported.
#[wasm_bindgen]
pub fn make_finder_fail_for_tests(kind: Option<String>) {
    doctor::make_finder_fail_for_tests(kind.as_deref());
}

/// The message of the panic that stopped the last call, once (None if none did).
#[wasm_bindgen]
pub fn take_panic() -> Option<String> {
    LAST_PANIC.with(|last| last.borrow_mut().take())
}

fn js_error(e: impl std::fmt::Display) -> JsError {
    JsError::new(&e.to_string())
}

/// Reads a snapshot fed in chunks as the file streams in (pickles are parsed on the way; the file
/// is never held whole).
#[wasm_bindgen]
pub struct TraceLoader {
    loader: Option<trace::Loader>,
    /// The key of the bytes fed (for the decode the page keeps).
    hasher: trace::cache::SourceHasher,
}

#[wasm_bindgen]
impl TraceLoader {
    /// `total`: the file's size in bytes, or 0 when unknown.
    #[wasm_bindgen(constructor)]
    pub fn new(total: f64) -> TraceLoader {
        let total = (total > 0.0).then_some(total as usize);
        TraceLoader { loader: Some(trace::Loader::new(total)), hasher: Default::default() }
    }

    pub fn feed(&mut self, chunk: &[u8]) -> Result<(), JsError> {
        self.hasher.update(chunk);
        self.loader.as_mut().ok_or_else(|| JsError::new("the loader has finished"))?.feed(chunk).map_err(js_error)
    }

    /// Trace entries decoded so far (a pickle's, as it streams; a JSON text's at the end).
    pub fn entries_decoded(&self) -> f64 {
        self.loader.as_ref().map_or(0, |l| l.entries_decoded()) as f64
    }

    /// The key of the bytes fed so far ([`SourceHasher::key`]).
    pub fn source_key(&self) -> String {
        self.hasher.finish().file_name()
    }

    pub fn finish(&mut self) -> Result<LoadedTrace, JsError> {
        let loader = self.loader.take().ok_or_else(|| JsError::new("the loader has finished"))?;
        Ok(LoadedTrace::new(loader.finish().map_err(js_error)?, None))
    }
}

/// Hashes a file as it streams in: the key under which the page keeps its decode (IndexedDB).
#[wasm_bindgen]
#[derive(Default)]
pub struct SourceHasher {
    hasher: trace::cache::SourceHasher,
}

#[wasm_bindgen]
impl SourceHasher {
    #[wasm_bindgen(constructor)]
    pub fn new() -> SourceHasher {
        SourceHasher::default()
    }

    pub fn update(&mut self, chunk: &[u8]) {
        self.hasher.update(chunk);
    }

    /// The key: the bytes' xxh3-128 hash and length (as a cache file's name).
    pub fn key(&self) -> String {
        self.hasher.finish().file_name()
    }
}

/// Gives each chunk the encoder writes to a JavaScript function, as a new Uint8Array: the kept
/// decode is assembled outside wasm memory, which never gives memory back.
struct ToJs<'a>(&'a js_sys::Function);

impl std::io::Write for ToJs<'_> {
    fn write(&mut self, buf: &[u8]) -> std::io::Result<usize> {
        self.0.call1(&JsValue::NULL, &js_sys::Uint8Array::from(buf)).map_err(|e| std::io::Error::other(format!("{e:?}")))?;
        Ok(buf.len())
    }

    fn flush(&mut self) -> std::io::Result<()> {
        Ok(())
    }
}

fn source_key(key: &str) -> Result<trace::cache::SourceKey, JsError> {
    trace::cache::SourceKey::from_file_name(key).ok_or_else(|| JsError::new(&format!("not a source key: {key}")))
}

/// A loaded snapshot (a file, or a scenario's recording).
#[wasm_bindgen]
pub struct LoadedTrace {
    snapshot: Snapshot,
    /// `tensormem run --json` of the scenario that recorded it.
    run_json: Option<String>,
    /// Each device's start state, reconstructed once for its layout, its states at the cursor,
    /// its what-ifs and its diagnosis (a 1 GB trace's takes about half a second natively).
    starts: std::cell::RefCell<BTreeMap<i64, KnownStart>>,
}

impl LoadedTrace {
    fn new(snapshot: Snapshot, run_json: Option<String>) -> LoadedTrace {
        LoadedTrace { snapshot, run_json, starts: Default::default() }
    }

    /// A what-if replay's options (see [`what_if`]), from this trace's start (but from nothing).
    fn what_if(&self, device: i32, alloc_conf: &str, capacity: &str, start: &str) -> Result<ReplayOptions, JsError> {
        let options = what_if(alloc_conf, capacity, start)?;
        let known_start = if options.start == StartMode::Empty { None } else { Some(self.start_of(device as i64)?) };
        Ok(ReplayOptions { known_start, ..options })
    }

    /// `device`'s start state (reconstructed the first time).
    fn start_of(&self, device: i64) -> Result<KnownStart, JsError> {
        if let Some(known) = self.starts.borrow().get(&device) {
            return Ok(known.clone());
        }
        let known = KnownStart::of(&self.snapshot, device).map_err(js_error)?;
        self.starts.borrow_mut().insert(device, known.clone());
        Ok(known)
    }
}

#[wasm_bindgen]
impl LoadedTrace {
    /// Parses a pickle (protocols 2-5) or JSON snapshot.
    pub fn parse(bytes: &[u8]) -> Result<LoadedTrace, JsError> {
        let snapshot = trace::load(bytes).map_err(js_error)?;
        Ok(LoadedTrace::new(snapshot, None))
    }

    /// Reads back a decode kept by [`LoadedTrace::keep_decoded`] for the file `key` names
    /// ([`SourceHasher::key`]); an error if the bytes are not that, whole.
    /// The start states kept with it are used, not reconstructed again.
    pub fn from_decoded(bytes: &[u8], key: &str) -> Result<LoadedTrace, JsError> {
        let decoded = trace::cache::decode_with_starts(bytes, &source_key(key)?).map_err(js_error)?;
        let starts = KnownStart::all_kept(&decoded.snapshot, decoded.starts);
        let trace = LoadedTrace::new(decoded.snapshot, None);
        trace.starts.borrow_mut().extend(starts.into_iter().map(|k| (k.device(), k)));
        Ok(trace)
    }

    /// Whether `head` and `tail`, the first and last bytes of a decode kept by
    /// [`LoadedTrace::keep_decoded`] (`decoded_ends()` of each) `len` bytes long, say it is
    /// one kept for the file `key` names, as long as written (see `trace::cache::ends_agree`):
    /// checked before the page draws that file from its layout kept.
    pub fn decoded_ends_agree(head: &[u8], tail: &[u8], len: f64, key: &str) -> Result<bool, JsError> {
        Ok(trace::cache::ends_agree(head, tail, len as u64, &source_key(key)?))
    }

    /// How many bytes of a kept decode's start and end `decoded_ends_agree` reads.
    pub fn decoded_ends() -> Vec<u32> {
        vec![trace::cache::HEADER as u32, trace::cache::TRAILER as u32]
    }

    /// This snapshot's decode, to keep for the next open of the file `key` names, with the
    /// start states reconstructed so far: given to `chunk` a megabyte at a time (Uint8Arrays).
    pub fn keep_decoded(&self, key: &str, chunk: &js_sys::Function) -> Result<(), JsError> {
        let starts: Vec<_> = self.starts.borrow().values().map(KnownStart::to_kept).collect();
        trace::cache::encode(&self.snapshot, &starts, &source_key(key)?, &mut ToJs(chunk)).map_err(js_error)
    }

    /// The layout of `view` (a timeline of this trace) to keep for the next open of the file `key`
    /// names (read back by `TimelineArrays::from_kept`): given to `chunk` a megabyte at a time
    /// (Uint8Arrays).
    pub fn keep_layout(&self, view: &TimelineArrays, key: &str, chunk: &js_sys::Function) -> Result<(), JsError> {
        self.trace_laid_out(view)?;
        crate::timeline::kept::encode(view.timeline(), view.to_keep(), &source_key(key)?, &mut ToJs(chunk)).map_err(js_error)
    }

    /// The curves of `view` (a timeline of this trace) as numbers to keep beside its layout:
    /// `[allocated..., reserved..., time_us...]` as `curves` gives them (f64, little-endian),
    /// given to `chunk` a megabyte at a time (Uint8Arrays), so that neither wasm nor JavaScript
    /// holds them whole again (276 MB for 11.5 M events).
    pub fn keep_curves(&self, view: &TimelineArrays, chunk: &js_sys::Function) -> Result<(), JsError> {
        use std::io::Write;
        let (t, trace) = (view.timeline(), self.trace_laid_out(view)?);
        let mut out = std::io::BufWriter::with_capacity(1 << 20, ToJs(chunk));
        let fields: [fn(&timeline::CurvePoint) -> f64; 3] = [|p| p.allocated as f64, |p| p.reserved as f64, |p| p.time_us];
        for field in fields {
            for p in t.curves(trace) {
                out.write_all(&field(&p).to_le_bytes()).map_err(js_error)?;
            }
        }
        out.flush().map_err(js_error)
    }

    /// The number of entries in `device`'s trace (0 for a device without one).
    pub fn events_of(&self, device: i32) -> u32 {
        self.snapshot.trace_of(device as i64).len() as u32
    }

    /// Device indices with segments or a trace.
    pub fn devices(&self) -> Vec<i32> {
        self.snapshot.devices().into_iter().map(|d| d as i32).collect()
    }

    /// The device the page opens on: the doctor's choice (the one with an out-of-memory entry,
    /// else the one that reserved the most); `undefined` for a snapshot without devices.
    pub fn default_device(&self) -> Option<i32> {
        self.snapshot.pick_device().map(|d| d as i32)
    }

    /// A label per device for the device selector: `cuda:1 · out of memory` where its trace
    /// records an OOM.
    pub fn device_labels(&self) -> Vec<String> {
        self.snapshot
            .devices()
            .into_iter()
            .map(|d| {
                let oom = self.snapshot.trace_of(d).iter().any(|e| e.action == crate::trace::Action::Oom);
                format!("cuda:{d}{}", if oom { " · out of memory" } else { "" })
            })
            .collect()
    }

    /// One device's timeline, without its curves: see [`LoadedTrace::curves`].
    /// Its bands are coloured as the trace groups them: by its own categories where it records
    /// them, else by frame (see [`TimelineArrays::set_color_by`]).
    pub fn timeline(&self, device: i32) -> Result<TimelineArrays, JsError> {
        let t = timeline::build_without_curves_from(&self.snapshot, device as i64, &self.start_of(device as i64)?).map_err(js_error)?;
        Ok(TimelineArrays::new(t, &self.snapshot))
    }

    /// [`LoadedTrace::timeline`] with its bands laid out a sample per pixel column of an image
    /// `width` pixels wide, for the first image of a long trace; the full layout follows with
    /// [`TimelineArrays::lay_full_bands`].
    pub fn timeline_for_first_image(&self, device: i32, width: u32) -> Result<TimelineArrays, JsError> {
        let t = timeline::build_for_first_image_from(&self.snapshot, device as i64, &self.start_of(device as i64)?, width).map_err(js_error)?;
        Ok(TimelineArrays::new(t, &self.snapshot))
    }

    /// The curves of `view` (a timeline of this trace) as three new Float64Arrays, `[allocated,
    /// reserved, time_us]`, one value a position. Filled a chunk at a time, so that wasm memory
    /// never holds them whole (24 MB for a 1 M event trace, beside its bands).
    pub fn curves(&self, view: &TimelineArrays) -> Result<js_sys::Array, JsError> {
        let (t, trace) = (view.timeline(), self.trace_laid_out(view)?);
        let n = trace.len() + 1;
        let out: [js_sys::Float64Array; 3] = std::array::from_fn(|_| js_sys::Float64Array::new_with_length(n as u32));
        const CHUNK: usize = 1 << 16;
        let mut chunk: [Vec<f64>; 3] = std::array::from_fn(|_| Vec::with_capacity(CHUNK));
        let mut at = 0u32;
        let flush = |chunk: &mut [Vec<f64>; 3], at: &mut u32| {
            let end = *at + chunk[0].len() as u32;
            for (array, values) in out.iter().zip(chunk.iter_mut()) {
                array.subarray(*at, end).copy_from(values);
                values.clear();
            }
            *at = end;
        };
        for p in t.curves(trace) {
            chunk[0].push(p.allocated as f64);
            chunk[1].push(p.reserved as f64);
            chunk[2].push(p.time_us);
            if chunk[0].len() == CHUNK {
                flush(&mut chunk, &mut at);
            }
        }
        flush(&mut chunk, &mut at);
        Ok(out.into_iter().collect())
    }

    /// The trace `view` was laid out from: this trace's of its device, or an error.
    fn trace_laid_out(&self, view: &TimelineArrays) -> Result<&trace::Trace, JsError> {
        let trace = self.snapshot.trace_of(view.timeline().device);
        if trace.len() != view.timeline().events {
            return Err(JsError::new("this timeline was not laid out from this trace"));
        }
        Ok(trace)
    }

    /// Replays one device under other settings; `start` is `recorded` or `replaced`. Returns
    /// `tensormem replay --json`'s object plus `reserved_curve` (bytes at every position) and the
    /// `memory_summary` at the end.
    pub fn replay(&self, device: i32, alloc_conf: &str, capacity: &str, start: &str) -> Result<String, JsError> {
        let options = ReplayOptions { curves: true, ..self.what_if(device, alloc_conf, capacity, start)? };
        let r = replay::replay_device(&self.snapshot, device as i64, &options, &mut |_, _| {}).map_err(js_error)?;
        serde_json::to_string(&serde_json::json!({
            "replay": r,
            "reserved_curve": r.reserved_curve,
            "memory_summary": r.summary,
        }))
        .map_err(js_error)
    }

    /// The same what-if replay, as a trace of its own (to compare with, or to export).
    pub fn replayed(&self, device: i32, alloc_conf: &str, capacity: &str, start: &str) -> Result<LoadedTrace, JsError> {
        let options = ReplayOptions { keep_snapshot: true, ..self.what_if(device, alloc_conf, capacity, start)? };
        let r = replay::replay_device(&self.snapshot, device as i64, &options, &mut |_, _| {}).map_err(js_error)?;
        let snapshot = r.snapshot.ok_or_else(|| JsError::new("the replay kept no trace"))?;
        Ok(LoadedTrace::new(snapshot, None))
    }

    /// The allocator's state after the first `position` trace entries, replayed with the file's
    /// own settings: `{events_replayed, segments: [{address, total_size, stream, segment_type,
    /// segment_pool_id, is_expandable, blocks: [{address, size, requested_size, state}]}],
    /// memory_summary}`.
    pub fn state_at(&self, device: i32, position: u32) -> Result<String, JsError> {
        let options = ReplayOptions { until: Some(position as usize), known_start: Some(self.start_of(device as i64)?), ..Default::default() };
        let r = replay::replay_device(&self.snapshot, device as i64, &options, &mut |_, _| {}).map_err(js_error)?;
        let segments: Vec<_> = r
            .segments
            .iter()
            .map(|s| {
                let blocks: Vec<_> = s
                    .blocks
                    .iter()
                    .map(|b| serde_json::json!({ "address": b.address, "size": b.size, "requested_size": b.requested_size, "state": b.state }))
                    .collect();
                serde_json::json!({
                    "address": s.address, "total_size": s.total_size, "stream": s.stream,
                    "segment_type": s.segment_type, "segment_pool_id": s.segment_pool_id, "is_expandable": s.is_expandable, "blocks": blocks,
                })
            })
            .collect();
        Ok(serde_json::json!({ "events_replayed": r.events_replayed, "segments": segments, "memory_summary": r.summary }).to_string())
    }

    /// The doctor's findings on one device, as `tensormem doctor FILE --device N --json` prints
    /// them: `{findings: [{kind, title, bytes, evidence, why, fix, verified, estimate?}]}`, the
    /// `peak` summary first, then the problems, most bytes first.
    pub fn diagnose(&self, device: i32) -> Result<String, JsError> {
        self.diagnose_skipping(device, Vec::new())
    }

    /// `diagnose` without the finders named in `skip`, each named in a note as failed (the
    /// worker's retry after a finder's panic, which wasm cannot catch: see `finder_running`).
    pub fn diagnose_skipping(&self, device: i32, skip: Vec<String>) -> Result<String, JsError> {
        self.diagnose_laid_out(device, None, skip)
    }

    /// `diagnose_skipping` reading the page's timeline of this trace's `device` (its view's
    /// `laid_out`), which it would otherwise lay out again: seconds on a 1 GB trace.
    pub fn diagnose_laid_out(&self, device: i32, laid_out: Option<LaidOut>, skip: Vec<String>) -> Result<String, JsError> {
        let options = doctor::DoctorOptions { device: Some(device as i64), capacity: None, known_start: Some(self.start_of(device as i64)?) };
        let laid_out = laid_out.as_ref().and_then(|l| l.timeline_of(&self.snapshot));
        let diagnosis = doctor::diagnose_laid_out(&self.snapshot, &options, &skip, laid_out).map_err(js_error)?;
        serde_json::to_string(&diagnosis).map_err(js_error)
    }

    /// The snapshot as a protocol-4 pickle (pytorch.org/memory_viz opens it).
    pub fn to_pickle(&self) -> Vec<u8> {
        trace::to_pickle(&self.snapshot)
    }

    pub fn to_json(&self) -> String {
        trace::to_json(&self.snapshot)
    }

    /// The scenario run that recorded this trace, as `tensormem run --json` prints it.
    pub fn run_json(&self) -> Option<String> {
        self.run_json.clone()
    }
}

/// Replay options from the page's what-if inputs (empty means: the file's own).
fn what_if(alloc_conf: &str, capacity: &str, start: &str) -> Result<ReplayOptions, JsError> {
    let config = match alloc_conf.trim() {
        "" => None,
        text => Some(crate::alloc::AllocatorConfig::parse(text).map_err(js_error)?),
    };
    let capacity = match capacity.trim() {
        "" => None,
        text => Some(crate::report::parse_size(text).map_err(js_error)?),
    };
    let start = StartMode::parse(start).map_err(js_error)?;
    Ok(ReplayOptions { config, capacity, start, ..Default::default() })
}

/// One device's timeline. The page gets copies of its arrays (for hit testing and the panels);
/// the worker keeps it to rasterise views of it.
/// A size as the command line takes it (`80GiB`, `512MB`, bytes), for the page's inputs.
#[wasm_bindgen]
pub fn parse_size(text: &str) -> Result<f64, JsError> {
    crate::report::parse_size(text).map(|b| b as f64).map_err(js_error)
}

/// Every scenario with its parameters, variants and explanation, the simulated cards, the
/// Hugging Face configs shipped with tensormem (`hf_presets`: the names `config=` takes), the
/// linears LoRA can adapt (`lora_targets`: `q_proj`..., as `lora_targets=` takes them) and the
/// strategies "what fits" compares by default (`fit_strategies`, as `tensormem fit`).
#[wasm_bindgen]
pub fn scenarios_json() -> String {
    let presets: Vec<_> = crate::device::PRESETS.iter().map(|(name, bytes)| serde_json::json!({ "name": name, "bytes": bytes })).collect();
    let hf_presets: Vec<&str> = crate::nn::HF_PRESETS.iter().map(|(name, _)| *name).collect();
    serde_json::json!({
        "scenarios": scenarios::list(), "presets": presets, "hf_presets": hf_presets, "lora_targets": crate::nn::LORA_TARGETS,
        "fit_strategies": scenarios::fit::default_strategies(),
    })
    .to_string()
}

/// What fits (`tensormem fit`): the largest `vary` (batch or context) for every strategy on
/// every card, each found by running the step. `request` is JSON: `{scenario, set?: {name:
/// value}, vary: "batch" | "context", strategies: [...], cards: [...]}`; `progress(done, of)`
/// is called after each cell. Returns the table as JSON (`scenarios::fit::FitTable`).
#[wasm_bindgen]
pub fn fit_table(request: &str, progress: &js_sys::Function) -> Result<String, JsError> {
    #[derive(serde::Deserialize)]
    struct Request {
        scenario: String,
        #[serde(default)]
        set: BTreeMap<String, String>,
        vary: String,
        strategies: Vec<String>,
        cards: Vec<String>,
    }
    let r: Request = serde_json::from_str(request).map_err(js_error)?;
    let base = RunRequest { scenario: r.scenario, set: r.set, ..Default::default() };
    let table = scenarios::fit::fit_table(&base, &r.vary, &r.strategies, &r.cards, &mut |done, of| {
        let _ = progress.call2(&JsValue::NULL, &JsValue::from(done as u32), &JsValue::from(of as u32));
    })
    .map_err(js_error)?;
    serde_json::to_string(&table).map_err(js_error)
}

/// Runs a scenario on a simulated card or, with `device: "gpu"`, on this browser's WebGPU
/// adapter (real kernels). `request` is JSON: `{scenario, variant?, set?: {name: value},
/// device?: "sim:H100-80GB" | "gpu", capacity?: "24GiB", alloc_conf?: "..."}`.
#[wasm_bindgen]
pub async fn run_scenario(request: String) -> Result<LoadedTrace, JsError> {
    let result = scenarios::run_anywhere(&run_request(&request)?).await.map_err(js_error)?;
    let run_json = serde_json::to_string(&result).map_err(js_error)?;
    Ok(LoadedTrace::new(result.snapshot, Some(run_json)))
}

/// A scenario run diagnosed as `tensormem doctor --scenario` diagnoses it
/// (`scenarios::diagnose`: a mistake's findings that its fix removes are verified by running
/// the fix), on its simulated card, without the finders named in `skip` (see
/// `LoadedTrace::diagnose_skipping`). JSON: `{findings, notes, variant, peak_allocated_bytes,
/// peak_reserved_bytes}`.
#[wasm_bindgen]
pub fn diagnose_scenario(request: &str, skip: Vec<String>) -> Result<String, JsError> {
    let d = scenarios::diagnose_skipping(&run_request(request)?, &doctor::DoctorOptions::default(), &skip).map_err(js_error)?;
    let answer = serde_json::json!({
        "findings": d.diagnosis.findings,
        "notes": d.diagnosis.notes,
        "variant": d.run.variant,
        "peak_allocated_bytes": d.run.peak_allocated_bytes,
        "peak_reserved_bytes": d.run.peak_reserved_bytes,
    });
    Ok(answer.to_string())
}

/// A scenario request as the page sends it (`tensormem run`'s options; empty texts are unset).
fn run_request(request: &str) -> Result<RunRequest, JsError> {
    #[derive(serde::Deserialize)]
    struct Request {
        scenario: String,
        variant: Option<String>,
        #[serde(default)]
        set: BTreeMap<String, String>,
        device: Option<String>,
        capacity: Option<String>,
        alloc_conf: Option<String>,
    }
    let r: Request = serde_json::from_str(request).map_err(js_error)?;
    let capacity = r.capacity.filter(|c| !c.trim().is_empty()).map(|c| crate::report::parse_size(&c)).transpose().map_err(js_error)?;
    Ok(RunRequest {
        scenario: r.scenario,
        variant: r.variant.filter(|v| !v.is_empty()),
        set: r.set,
        device: r.device,
        capacity,
        alloc_conf: r.alloc_conf.filter(|c| !c.trim().is_empty()),
        ..Default::default()
    })
}

/// A device's curves cut to at most `points` buckets of positions, each the largest value in it
/// (the peaks stay): `{device, events, allocated: [...], reserved: [...], peak_allocated_bytes,
/// peak_reserved_bytes}`. For the "What fits" view's small plots.
fn overview(snapshot: &Snapshot, device: i64, points: usize) -> Result<serde_json::Value, JsError> {
    let t = timeline::build_without_curves(snapshot, device).map_err(js_error)?;
    let s = &t.summary;
    let trace = snapshot.trace_of(device);
    let n = trace.len() + 1;
    let buckets = points.clamp(2, n.max(2));
    let (mut allocated, mut reserved) = (vec![0f64; buckets], vec![0f64; buckets]);
    for (i, p) in timeline::curves(trace, s.start_allocated_bytes, s.start_reserved_bytes).enumerate() {
        let b = i * buckets / n;
        allocated[b] = allocated[b].max(p.allocated as f64);
        reserved[b] = reserved[b].max(p.reserved as f64);
    }
    let filled = n.min(buckets);
    allocated.truncate(filled);
    reserved.truncate(filled);
    Ok(serde_json::json!({
        "device": device, "events": trace.len(), "allocated": allocated, "reserved": reserved,
        "peak_allocated_bytes": s.peak_allocated_bytes, "peak_reserved_bytes": s.peak_reserved_bytes,
    }))
}

/// Points of the small curves the "What fits" view draws.
const OVERVIEW_POINTS: usize = 600;

#[wasm_bindgen]
impl LoadedTrace {
    /// The curves of the device `tensormem predict` reads (the doctor's pick), for the "What
    /// fits" view; see `overview`.
    pub fn overview_json(&self) -> Result<String, JsError> {
        let device = self.snapshot.pick_device().ok_or_else(|| JsError::new("the snapshot has no segments and no trace"))?;
        Ok(overview(&self.snapshot, device, OVERVIEW_POINTS)?.to_string())
    }
}

/// `tensormem predict` for the page: the recordings added (copies of loaded traces), then
/// `predict(request, progress)`.
#[wasm_bindgen]
pub struct Predictor {
    recordings: Vec<(String, Snapshot)>,
    predicted: Option<Snapshot>,
}

impl Default for Predictor {
    fn default() -> Self {
        Predictor::new()
    }
}

#[wasm_bindgen]
impl Predictor {
    #[wasm_bindgen(constructor)]
    pub fn new() -> Predictor {
        Predictor { recordings: Vec::new(), predicted: None }
    }

    /// A recording, named `label` in messages; its values come with each request.
    pub fn add(&mut self, trace: &LoadedTrace, label: String) {
        self.recordings.push((label, trace.snapshot.clone()));
    }

    /// `request` is JSON: `{values: ["context=128", ...] (one per recording, in the order
    /// added), to?: "context=1024", fit?: "context", capacity?: "80GiB" | "H100-80GB",
    /// alloc_conf?: "...", points?: 12}`. Returns `{prediction (tensormem predict --json's
    /// object), curve (the predicted trace's, see overview), sweep: {variable, points: [{value,
    /// peak_allocated_bytes, peak_reserved_bytes}]}, capacity_bytes, settings, reference, notes}`.
    /// `progress(done, of)` is called after each value of the sweep.
    pub fn predict(&mut self, request: &str, progress: &js_sys::Function) -> Result<String, JsError> {
        use crate::predict::{self, PredictOptions, Recording};
        #[derive(serde::Deserialize)]
        struct Request {
            values: Vec<String>,
            to: Option<String>,
            fit: Option<String>,
            capacity: Option<String>,
            alloc_conf: Option<String>,
            points: Option<usize>,
        }
        let r: Request = serde_json::from_str(request).map_err(js_error)?;
        let given = |s: &Option<String>| s.as_deref().map(str::trim).filter(|s| !s.is_empty()).map(str::to_string);
        if r.values.len() != self.recordings.len() {
            return Err(JsError::new(&format!("{} recordings but {} sets of values", self.recordings.len(), r.values.len())));
        }
        let mut recordings = Vec::new();
        for ((label, snapshot), values) in self.recordings.iter().zip(&r.values) {
            let values = predict::parse_values(values).map_err(|e| JsError::new(&format!("{label}: {e} (write its values as context=128)")))?;
            recordings.push(Recording { label: label.clone(), snapshot, values });
        }
        let target = match given(&r.to) {
            Some(to) => predict::parse_values(&to).map_err(|e| JsError::new(&format!("target {to}: {e}")))?,
            None => predict::Values::new(),
        };
        let fit = given(&r.fit);
        if fit.is_none() && target.is_empty() {
            return Err(JsError::new("set a target value or a card to fit"));
        }
        let capacity = given(&r.capacity).map(|c| crate::device::parse_capacity(&c)).transpose().map_err(js_error)?;
        let config = given(&r.alloc_conf).map(|c| crate::alloc::AllocatorConfig::parse(&c)).transpose().map_err(js_error)?;
        let options = PredictOptions { device: None, capacity, config, keep_snapshot: true };
        let mut prediction = predict::predict_or_fit(&recordings, &target, fit.as_deref(), &options).map_err(js_error)?;
        let device = prediction.devices[prediction.reference];
        let snapshot = prediction.snapshot.take().ok_or_else(|| JsError::new("the prediction kept no trace"))?;
        let curve = overview(&snapshot, device, OVERVIEW_POINTS)?;
        self.predicted = Some(snapshot);

        // The sweep: along the fitted variable, else the one the recordings vary.
        let first = &recordings[0].values;
        let varies = |n: &String| recordings.iter().any(|r| r.values[n] != first[n]);
        let variable = fit.clone().or_else(|| first.keys().find(|n| varies(n)).cloned()).or_else(|| target.keys().next().cloned());
        let mut sweep = serde_json::Value::Null;
        if let Some(variable) = variable.filter(|v| first.contains_key(v)) {
            let recorded: Vec<u64> = recordings.iter().map(|r| r.values[&variable]).collect();
            let (low, top) = (*recorded.iter().min().unwrap_or(&1), *recorded.iter().max().unwrap_or(&1));
            let mut also = recorded.clone();
            let mut high = top;
            if let Some(&t) = prediction.target.get(&variable) {
                also.push(t);
                high = high.max(t);
            }
            if let Some(f) = &prediction.fit {
                for v in [f.largest, f.largest_expandable].into_iter().flatten() {
                    // Past the search's limit: the plot stops at 16 x the largest recorded.
                    let v = if v >= f.search_limit { high.max(16 * top) } else { v };
                    also.push(v);
                    high = high.max(v);
                }
            }
            // A little past the largest value that fits, to show where it stops fitting.
            if prediction.fit.is_some() {
                high += high / 8;
            }
            let values = predict::sweep_values(low, high, r.points.unwrap_or(12), &also);
            let mut others = prediction.target.clone();
            others.remove(&variable);
            let sweep_options = PredictOptions { keep_snapshot: false, ..options.clone() };
            let mut report = |done: usize, of: usize| {
                let _ = progress.call2(&JsValue::NULL, &JsValue::from(done as u32), &JsValue::from(of as u32));
            };
            let points = predict::sweep(&recordings, &others, &variable, &values, &sweep_options, &mut report).map_err(js_error)?;
            sweep = serde_json::json!({ "variable": variable, "points": points });
        }
        serde_json::to_string(&serde_json::json!({
            "prediction": prediction,
            "curve": curve,
            "sweep": sweep,
            "capacity_bytes": capacity,
            "settings": prediction.settings,
            "reference": prediction.reference,
            "weak": prediction.weak,
            "notes": prediction.notes,
        }))
        .map_err(js_error)
    }

    /// The last prediction's trace, replayed, as a trace of its own (the timeline shows it).
    pub fn predicted_trace(&self) -> Option<LoadedTrace> {
        self.predicted.clone().map(|snapshot| LoadedTrace::new(snapshot, None))
    }

    /// The last prediction's trace, replayed, as a protocol-4 pickle (pytorch.org/memory_viz
    /// opens it); empty before the first.
    pub fn predicted_pickle(&self) -> Vec<u8> {
        self.predicted.as_ref().map(trace::to_pickle).unwrap_or_default()
    }
}
