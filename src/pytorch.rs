//! What PyTorch's frames say about a trace, as a reader of it would tell: which phase of a
//! training step an event belongs to, which thread made it, whether it ran inside a module's
//! forward, and the names Hugging Face's KV cache allocates under; where a stack sits among
//! module calls, which frame is the user's, and what a band is grouped by. The analysis (timeline,
//! doctor, predict) and the scenarios' comparisons ask here, so that this knowledge of
//! PyTorch's files lives in one place.
//!
//! A step's phases come from its Python frames: backward starts at the first event under
//! `torch/autograd/__init__.py`; the optimizer step at the first event under
//! `torch/optim/optimizer.py` (or its `Optimizer.step` annotation), and ends with that
//! annotation or the trace; the forward pass ends after the last allocation made inside a module
//! call (`torch/nn/modules/module.py`) before backward, and the loss where backward starts.

use crate::trace::{Action, Entry, Frame, PerStack, Snapshot};
use serde::Serialize;

/// The scopes a KV cache's allocations are made in, named as transformers' methods that make
/// them (`cache_utils.py`).
pub const KV_CACHE_SCOPES: [&str; 2] = ["DynamicLayer.update", "StaticLayer.lazy_initialization"];

/// Where the phases of one training step lie in a trace: each end is a curve position
/// (the state after that many events).
#[derive(Debug, Clone, PartialEq, Eq, Serialize)]
pub struct TracePhases {
    pub forward_end: usize,
    pub backward_start: usize,
    pub optimizer_start: usize,
    pub end: usize,
}

/// Whether a Python frame of `frames` is in one of `files`.
fn frames_under(frames: &[Frame], files: &[&str]) -> bool {
    frames.iter().filter(|f| f.filename.ends_with(".py")).any(|f| files.iter().any(|file| f.filename.ends_with(file)))
}

/// `loss.backward()`: torch/autograd/__init__.py's backward (or _make_grads) is on the stack.
/// (torch/_tensor.py alone is not enough: `1 - mask` runs Tensor.__rsub__ there in forward.)
const BACKWARD_FILE: &str = "torch/autograd/__init__.py";
const OPTIMIZER_FILE: &str = "torch/optim/optimizer.py";
const MODULE_FILE: &str = "torch/nn/modules/module.py";

/// The phase one event belongs to, from its own frames alone: backward (Python's
/// `loss.backward()`, the autograd engine's C++ thread, or Python the engine runs: a custom
/// Function's backward, a checkpoint's recomputation), the optimizer step, or a module's
/// forward (a module *call*: `model.to()`, `_apply` and `load_state_dict` also run in
/// module.py, and are setup, not a forward). None when its frames do not say.
pub fn event_phase(e: Entry<'_>) -> Option<&'static str> {
    frames_phase(e.frames.as_deref().unwrap_or_default())
}

/// [`event_phase`] of one stack.
pub fn frames_phase(frames: &[Frame]) -> Option<&'static str> {
    let on_autograd_thread = || frames.iter().any(|f| f.name.contains("torch::autograd::Engine::") || f.name.contains("torch::autograd::generated::"));
    if frames_under(frames, &[BACKWARD_FILE]) || on_autograd_thread() || python_on_autograd_thread(frames) {
        Some("backward")
    } else if frames_under(frames, &[OPTIMIZER_FILE]) {
        Some("optimizer step")
    } else if in_module_call(frames) {
        Some("forward")
    } else {
        None
    }
}

/// Python the autograd engine runs on its own thread: the stack's outermost Python frame is
/// where the engine calls into Python (a custom Function's backward, `BackwardCFunction.apply`
/// in torch/autograd/function.py; a checkpoint's recomputation in torch/utils/checkpoint.py). A
/// main thread's stack starts at the script (`<module>`, or runpy's frames for `python -m`).
fn python_on_autograd_thread(frames: &[Frame]) -> bool {
    frames
        .iter()
        .rfind(|f| f.filename.ends_with(".py"))
        .is_some_and(|f| f.filename.ends_with("torch/autograd/function.py") || f.filename.ends_with("torch/utils/checkpoint.py"))
}

/// Whether a Python stack was not made on the program's main thread: its outermost Python frame
/// is not the script's (`<module>`, or runpy's for `python -m`). During a backward that is the
/// autograd engine's thread running a hook (DDP's reducer, a tensor hook).
pub fn off_the_main_thread(frames: &[Frame]) -> bool {
    frames.iter().rfind(|f| f.filename.ends_with(".py")).is_some_and(|f| f.name != "<module>" && !f.filename.ends_with("runpy.py"))
}

/// Whether the stack is inside a module call (`module(x)`: `_call_impl` in module.py) and not
/// in setup that runs there too (`model.to()`, `.cuda()`, `_apply`, `load_state_dict`).
pub fn in_module_call(frames: &[Frame]) -> bool {
    let in_module = |f: &&Frame| f.filename.ends_with(MODULE_FILE);
    let mut module_frames = frames.iter().filter(in_module);
    module_frames.clone().any(|f| f.name == "_call_impl" || f.name == "_wrapped_call_impl")
        && !module_frames.any(|f| SETUP_FUNCTIONS.contains(&f.name.as_str()))
}

/// module.py's functions that move or load a model: their allocations are setup.
const SETUP_FUNCTIONS: [&str; 7] = ["_apply", "to", "cuda", "convert", "load_state_dict", "_load_from_state_dict", "to_empty"];

/// The phase of a position (the state after `position` events): from the step's phases when the
/// trace holds one training step, otherwise from the frames of the event that led there.
pub fn phase_at(snapshot: &Snapshot, device: i64, position: usize) -> Option<&'static str> {
    if let Ok(p) = trace_phases(snapshot, device)
        && position <= p.end
    {
        return Some(match position {
            x if x <= p.forward_end => "forward",
            x if x <= p.backward_start => "loss",
            x if x <= p.optimizer_start => "backward",
            _ => "optimizer step",
        });
    }
    let trace = snapshot.trace_of(device);
    position.checked_sub(1).and_then(|i| trace.get(i)).and_then(event_phase)
}

/// The phases of the (first) training step in the trace, or why they cannot be found.
pub fn trace_phases(snapshot: &Snapshot, device: i64) -> Result<TracePhases, String> {
    crate::replay::check_device(snapshot, device).map_err(|e| e.to_string())?;
    let trace = snapshot.trace_of(device);
    // Which of the three files each entry runs under, read once per distinct stack.
    let mut per_stack = PerStack::default();
    let marks: Vec<[bool; 3]> = trace
        .iter()
        .map(|e| per_stack.get(e.frames, |frames| [BACKWARD_FILE, OPTIMIZER_FILE, MODULE_FILE].map(|file| frames_under(frames, &[file]))))
        .collect();
    let marks = &marks;
    let [backward, optimizer, module] = [0, 1, 2].map(|k| move |i: usize| marks[i][k]);
    let backward_start = (0..trace.len())
        .position(backward)
        .ok_or("the trace has no event under loss.backward() (torch/autograd/__init__.py): record a whole training step, with Python stacks")?;
    // The optimizer step's record_function range, on this device and after backward started.
    let started = trace.range(..=backward_start).rev().find_map(|e| e.time_us);
    let annotation = |stage: &str| {
        snapshot
            .external_annotations
            .iter()
            .flatten()
            .filter(|a| a.device == device && a.stage == stage && a.name.starts_with("Optimizer.step"))
            .filter_map(|a| a.time_us)
            .find(|&t| started.is_none_or(|s| t >= s))
    };
    let (step_start, step_end) = (annotation("START"), annotation("END"));
    let optimizer_start = (backward_start..trace.len())
        .position(|i| optimizer(i) || step_start.zip(trace.at(i).time_us).is_some_and(|(start, t)| t >= start))
        .map(|i| backward_start + i)
        .ok_or("the trace has no optimizer step after backward (torch/optim/optimizer.py)")?;
    // The step ends where the optimizer's range ends, else where the trace does; a second
    // backward after it means the trace holds several steps, which the phases cannot tell apart.
    let end = match step_end {
        Some(end) => trace.iter().rposition(|e| e.time_us.is_some_and(|t| t <= end)).map_or(trace.len(), |i| i + 1),
        None => trace.len(),
    };
    if (optimizer_start..end).any(backward) {
        return Err("the trace holds more than one training step: record one (the comparison needs its phases)".into());
    }
    let forward_end = (0..backward_start)
        .rev()
        .find(|&i| trace.at(i).action == Action::Alloc && module(i))
        .map(|i| i + 1)
        .ok_or("the trace has no allocation inside a module's forward before backward")?;
    Ok(TracePhases { forward_end, backward_start, optimizer_start, end })
}

/// A frame of PyTorch's module machinery (`torch/nn/modules/module.py`: module calls, `_apply`,
/// loading).
pub fn in_module_file(f: &Frame) -> bool {
    f.filename.ends_with(MODULE_FILE)
}

/// A key/value cache's own tensor is made here: transformers' `cache_utils.py` (DynamicCache's
/// cat, the static cache's zeros) or tensormem's scopes named after its methods.
pub fn is_kv_cache_frame(f: &Frame) -> bool {
    f.filename.ends_with("transformers/cache_utils.py")
        // vLLM's cache engine (`CacheEngine._allocate_kv_cache`): its paged KV cache.
        || (f.filename.ends_with("cache_engine.py") && f.name == "_allocate_kv_cache")
        || KV_CACHE_SCOPES.iter().any(|s| f.name.ends_with(s))
}

/// A frame of the call that makes cuBLAS's (or cuBLASLt's) workspace; it is near the top of the
/// stack, so callers look at the first dozen frames.
pub fn is_cublas_workspace(f: &Frame) -> bool {
    f.name.contains("getNewWorkspace") || f.name.contains("BlasLtWorkspace") || f.name.contains("setWorkspaceForHandle")
}

/// A frame that runs in backward: PyTorch's `loss.backward()` or its autograd engine's C++
/// thread, or tensormem's autograd engine and its nodes (`mm (MmBackward0)`).
pub fn is_backward_frame(f: &Frame) -> bool {
    f.filename.ends_with("torch/autograd/__init__.py")
        || f.name.contains("torch::autograd::Engine::")
        || f.name.contains("torch::autograd::generated::")
        || (f.name.contains("Backward") && f.name.ends_with(')'))
        || f.filename.ends_with("autograd/engine.rs")
}

/// Where a stack sits among `nn.Module` calls, outermost first, as indices into `frames`
/// (innermost first): for each module call, the Python line that called the module
/// (`self.attn(x)`), then the line inside the innermost module's `forward` that allocated.
/// Empty outside any module (an optimizer step, backward on the autograd thread). A snapshot
/// names no module classes; these lines are what identifies a module instance.
///
/// tensormem's own stacks are the op's frame, then (inside a module) one frame naming the
/// module's path (`layers.0.attention.q_proj`, no file): their scope is that path, then the op.
pub fn module_scope(frames: &[Frame]) -> Vec<usize> {
    if let [_, path] = frames
        && path.filename.is_empty()
        && path.line == 0
        && !path.name.is_empty()
    {
        return vec![1, 0];
    }
    // Python frames only: with context='all' the interpreter's C++ frames sit between them.
    let py: Vec<usize> = (0..frames.len()).filter(|&i| frames[i].filename.ends_with(".py")).collect();
    let in_module_py = |k: usize| in_module_file(&frames[py[k]]);
    let mut scope = Vec::new();
    let mut leaf = None;
    let mut k = 0;
    while k < py.len() {
        if in_module_py(k) && frames[py[k]].name.ends_with("_call_impl") {
            if leaf.is_none() && k > 0 {
                leaf = Some(py[k - 1]);
            }
            // Past `_call_impl` and `_wrapped_call_impl`: the caller of the module.
            let mut j = k;
            while j < py.len() && in_module_py(j) {
                j += 1;
            }
            if j < py.len() {
                scope.push(py[j]);
            }
            k = j;
        } else {
            k += 1;
        }
    }
    scope.reverse();
    scope.extend(leaf);
    scope
}

/// The frame a user would recognise as theirs: the first Python frame outside torch itself, else
/// the first Python frame, else the first frame with a name.
pub fn user_frame(frames: &[Frame]) -> Option<&Frame> {
    let python = |f: &&Frame| f.filename.ends_with(".py");
    frames
        .iter()
        .filter(python)
        .find(|f| !f.filename.contains("/torch/") && !f.filename.starts_with("<frozen"))
        .or_else(|| frames.iter().find(python))
        .or_else(|| frames.iter().find(|f| !f.name.is_empty()))
}

/// What a band is coloured and grouped by: the user's Python frame; for stacks without one (the
/// autograd engine runs backward on its own C++ thread) the autograd node or the ATen op.
pub fn group_name(frames: &[Frame]) -> Option<String> {
    if let Some(f) = user_frame(frames).filter(|f| f.filename.ends_with(".py")) {
        return Some(format!("{} ({}:{})", f.name, short_path(&f.filename), f.line));
    }
    // tensormem's engine: the op and the line of the program that called it, as a Python
    // stack names the line of `forward` (the module path is in the stack, as its scope).
    if let Some(f) = frames.first().filter(|f| f.filename.ends_with(".rs")) {
        return Some(format!("{} ({}:{})", f.name, short_path(&f.filename), f.line));
    }
    let between = |name: &str, start: &str, end: &str| -> Option<String> {
        let rest = &name[name.find(start)? + start.len()..];
        Some(rest[..rest.find(end)?].to_string())
    };
    if let Some(node) = frames.iter().find_map(|f| between(&f.name, "torch::autograd::generated::", "::apply(")) {
        return Some(format!("{node} (autograd backward)"));
    }
    if let Some(op) = frames.iter().find_map(|f| f.name.strip_prefix("at::_ops::").and_then(|r| r.split("::").next().map(str::to_string))) {
        return Some(format!("aten::{op}"));
    }
    frames.iter().find(|f| !f.name.is_empty() && !is_plumbing(f)).map(|f| f.name.clone())
}

/// A C++ frame of the recording itself or of the allocator (the unwinder, the caching
/// allocator, c10's storage): in every stack, naming nothing of the user's.
pub fn is_plumbing(frame: &Frame) -> bool {
    const PLUMBING: [&str; 4] = ["torch::unwind", "torch::CapturedTraceback", "torch::cuda::", "c10::"];
    PLUMBING.iter().any(|p| frame.name.starts_with(p))
}

/// The last two components of a path: enough to recognise a file.
pub fn short_path(path: &str) -> &str {
    let mut cut = path.len();
    for _ in 0..2 {
        match path[..cut].rfind('/') {
            Some(i) => cut = i,
            None => return path,
        }
    }
    &path[cut + 1..]
}
