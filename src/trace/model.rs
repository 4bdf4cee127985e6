//! The snapshot model of `torch.cuda.memory._snapshot()` (reference section 4), as plain data.
//!
//! Field names follow PyTorch's dict keys so that serde writes JSON that MemoryViz loads as is.
//! Optional fields are `Option`s: they are absent in older generations (G1 has no `time_us`,
//! G1/G1t have no `allocator_settings`, G3 adds `compile_context` and `user_metadata`).

use super::Trace;
use serde::{Deserialize, Serialize};
use std::sync::Arc;

/// What a real snapshot can hold. Values beyond these come from a damaged or forged file, and
/// reading refuses them with the field's path instead of sizing memory or arithmetic by them.
pub mod limits {
    /// Device indices are `c10::DeviceIndex`, an `int8_t`: 0 to 127 address a device.
    pub const MAX_DEVICE_INDEX: i64 = i8::MAX as i64;
    /// PyTorch refuses any allocation of this size or more ("Tried to allocate more than 1EB
    /// memory"), so no segment, block or trace entry is this large.
    pub const ONE_EXABYTE: u64 = 1 << 60;
    /// No CPU or GPU maps more than 57-bit virtual addresses (5-level paging; Hopper's VA).
    pub const ADDRESS_LIMIT: u64 = 1 << 57;
}

/// One stack frame, innermost first in a [`Frames`] list.
#[derive(Debug, Clone, PartialEq, Eq, Hash, Serialize, Deserialize)]
pub struct Frame {
    pub filename: String,
    /// Unsigned: PyTorch reports an unknown C++ line as 2^64 - 1.
    pub line: u64,
    pub name: String,
}

/// A shared stack. Real snapshots reference one frame list from many blocks and trace entries;
/// sharing it keeps a loaded snapshot small and lets the pickle writer memoize it again.
pub type Frames = Arc<[Frame]>;

/// A whole snapshot: every device's segments plus each device's trace ring buffer.
#[derive(Debug, Clone, Default, PartialEq, Serialize)]
pub struct Snapshot {
    pub segments: Vec<Segment>,
    pub device_traces: Vec<Trace>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub allocator_settings: Option<serde_json::Map<String, serde_json::Value>>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub external_annotations: Option<Vec<Annotation>>,
    /// Only in snapshots tensormem recorded: which clock stamped `time_us`. A top-level key of
    /// its own, which PyTorch's MemoryViz and `_memory_viz.py` ignore (they read keys by name).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub tensormem: Option<Recording>,
}

/// How tensormem recorded a snapshot.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct Recording {
    /// `"wall"`: the system clock (a GPU device); `"modelled"`: a clock that advances by each
    /// op's modelled cost on the simulated card, from 2026-01-01T00:00:00Z.
    pub time: String,
    /// The device, as `Device::name()` gives it: `sim (H100-80GB)`, `gpu (llvmpipe, Vulkan)`.
    pub device: String,
}

/// Which pool a segment belongs to (`segment_type`).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, Serialize, Deserialize)]
#[serde(rename_all = "lowercase")]
pub enum PoolKind {
    Small,
    Large,
}

/// One cudaMalloc (or one contiguous mapped range of an expandable segment).
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct Segment {
    pub device: i64,
    pub address: u64,
    pub total_size: u64,
    pub allocated_size: u64,
    pub active_size: u64,
    pub requested_size: u64,
    pub stream: i64,
    pub segment_type: PoolKind,
    pub segment_pool_id: (i64, i64),
    pub is_expandable: bool,
    #[serde(default = "no_frames")]
    pub frames: Frames,
    pub blocks: Vec<Block>,
}

/// The state of a block inside a segment.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum BlockState {
    /// In use by a tensor.
    ActiveAllocated,
    /// Freed by the user, but still waiting on other streams (record_stream).
    ActivePendingFree,
    /// Free and cached.
    Inactive,
}

impl BlockState {
    pub fn is_active(self) -> bool {
        !matches!(self, BlockState::Inactive)
    }
}

#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct Block {
    pub address: u64,
    pub size: u64,
    pub requested_size: u64,
    pub state: BlockState,
    #[serde(default = "no_frames")]
    pub frames: Frames,
}

/// What a trace entry records.
#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord, Hash, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum Action {
    Alloc,
    FreeRequested,
    FreeCompleted,
    SegmentAlloc,
    SegmentFree,
    SegmentMap,
    SegmentUnmap,
    Snapshot,
    Oom,
    /// A user annotation (newest PyTorch).
    Annotate,
}

impl Action {
    pub const ALL: [Action; 10] = [
        Action::Alloc,
        Action::FreeRequested,
        Action::FreeCompleted,
        Action::SegmentAlloc,
        Action::SegmentFree,
        Action::SegmentMap,
        Action::SegmentUnmap,
        Action::Snapshot,
        Action::Oom,
        Action::Annotate,
    ];

    /// A call to the device (cudaMalloc, cudaFree, or an expandable segment's map or unmap).
    pub fn is_segment_call(self) -> bool {
        matches!(self, Action::SegmentAlloc | Action::SegmentFree | Action::SegmentMap | Action::SegmentUnmap)
    }

    pub fn name(self) -> &'static str {
        match self {
            Action::Alloc => "alloc",
            Action::FreeRequested => "free_requested",
            Action::FreeCompleted => "free_completed",
            Action::SegmentAlloc => "segment_alloc",
            Action::SegmentFree => "segment_free",
            Action::SegmentMap => "segment_map",
            Action::SegmentUnmap => "segment_unmap",
            Action::Snapshot => "snapshot",
            Action::Oom => "oom",
            Action::Annotate => "annotate",
        }
    }

    pub fn from_name(name: &str) -> Option<Action> {
        Action::ALL.into_iter().find(|a| a.name() == name)
    }
}

/// One entry of a device's trace ring buffer, as a row of its own: what a recorder or a decoder
/// pushes onto a [`Trace`], and what an edit of one works on. A trace keeps its entries as
/// columns, and reads them back as [`super::Entry`]s.
#[derive(Debug, Clone, PartialEq, Serialize)]
pub struct TraceEntry {
    pub action: Action,
    /// Address; 0 for `snapshot`. PyTorch omits it for `oom`, where `device_free` stands instead.
    pub addr: u64,
    pub size: u64,
    pub stream: i64,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub time_us: Option<i64>,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub frames: Option<Frames>,
    /// On `alloc` entries the engine could classify: what the memory is for, in torch.profiler's
    /// memory-timeline categories. PyTorch's allocator never writes it; its `_profile_to_snapshot`
    /// (a snapshot made from a profile) does, `unknown` where it could not classify.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub category: Option<Category>,
    /// `device_free`, `compile_context`, `user_metadata`, where the entry has any.
    #[serde(flatten, skip_serializing_if = "Option::is_none")]
    pub extra: Option<Arc<EntryExtra>>,
}

/// The keys of a trace entry that most entries lack, or share: a decoder gives every entry with
/// the same values one `EntryExtra` (a G3 snapshot writes `compile_context: "N/A"` and
/// `user_metadata: ""` on every entry).
#[derive(Debug, Clone, Default, PartialEq, Eq, Hash, Serialize)]
pub struct EntryExtra {
    /// Only on `oom`: bytes the device reported free.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub device_free: Option<u64>,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub compile_context: Option<Arc<str>>,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub user_metadata: Option<Arc<str>>,
    /// The memory pool of the block (PyTorch's `pool_id`, newer versions): tensormem writes it on
    /// the entries of private pools (CUDA graphs, MemPool) only.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub pool_id: Option<(i64, i64)>,
}

impl EntryExtra {
    fn is_empty(&self) -> bool {
        *self == EntryExtra::default()
    }
}

impl TraceEntry {
    pub fn new(action: Action, addr: u64, size: u64, stream: i64) -> TraceEntry {
        TraceEntry { action, addr, size, stream, time_us: None, frames: None, category: None, extra: None }
    }

    /// Sets the rarer keys (none set: no `EntryExtra` at all).
    pub fn with_extra(mut self, extra: EntryExtra) -> TraceEntry {
        self.extra = (!extra.is_empty()).then(|| Arc::new(extra));
        self
    }

    /// Only on `oom`: bytes the device reported free.
    pub fn device_free(&self) -> Option<u64> {
        self.extra.as_ref()?.device_free
    }

    pub fn compile_context(&self) -> Option<&str> {
        self.extra.as_ref()?.compile_context.as_deref()
    }

    pub fn user_metadata(&self) -> Option<&str> {
        self.extra.as_ref()?.user_metadata.as_deref()
    }

    /// The memory pool the entry names, if it names one (`(0, 0)`: the default pool).
    pub fn pool_id(&self) -> Option<(i64, i64)> {
        self.extra.as_ref()?.pool_id
    }
}

/// What an allocation holds, as torch.profiler's memory timeline (`_memory_profiler.Category`)
/// names it.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum Category {
    Parameter,
    Gradient,
    OptimizerState,
    Activation,
    Temporary,
    Input,
    AutogradDetail,
}

impl Category {
    pub const ALL: [Category; 7] = [
        Category::Parameter,
        Category::Gradient,
        Category::OptimizerState,
        Category::Activation,
        Category::Temporary,
        Category::Input,
        Category::AutogradDetail,
    ];

    /// The key as written in a snapshot: `optimizer_state`.
    pub const fn name(self) -> &'static str {
        match self {
            Category::Parameter => "parameter",
            Category::Gradient => "gradient",
            Category::OptimizerState => "optimizer_state",
            Category::Activation => "activation",
            Category::Temporary => "temporary",
            Category::Input => "input",
            Category::AutogradDetail => "autograd_detail",
        }
    }

    pub fn from_name(name: &str) -> Option<Category> {
        Category::ALL.into_iter().find(|c| c.name() == name)
    }

    /// How PyTorch names an allocation of no known category: `_profile_to_snapshot` writes it on
    /// every allocation the profiler could not classify, and MemoryViz, given any category,
    /// needs it among them (its `annotate_snapshot` fails on a snapshot whose categories lack
    /// it). Read as no category; written on the allocations that have none, beside others that do.
    pub const UNKNOWN: &'static str = "unknown";

    /// A category key as written: `Some` of a category or of none (`unknown`); `None` if the
    /// name is not one.
    pub fn parse(name: &str) -> Option<Option<Category>> {
        if name == Category::UNKNOWN { Some(None) } else { Category::from_name(name).map(Some) }
    }

    /// As a person reads it: `optimizer state`.
    pub fn label(self) -> String {
        self.name().replace('_', " ")
    }
}

/// A record_function START/END marker.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct Annotation {
    pub name: String,
    pub stage: String,
    pub device: i64,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub time_us: Option<i64>,
}

pub fn no_frames() -> Frames {
    Arc::from(Vec::new())
}

/// A question about stacks answered once per distinct stack: the entries of a trace share their
/// frame lists (a loaded pickle shares one per stack), so per-entry work over frames, whose
/// count a file decides, is paid once per list instead.
pub struct PerStack<T> {
    answers: rustc_hash::FxHashMap<(*const Frame, usize), T>,
}

impl<T: Copy> Default for PerStack<T> {
    fn default() -> Self {
        PerStack { answers: Default::default() }
    }
}

impl<T: Copy> PerStack<T> {
    /// `ask(frames)` for this entry's frames (empty without any), remembered by the list.
    pub fn get(&mut self, frames: &Option<Frames>, ask: impl FnOnce(&[Frame]) -> T) -> T {
        let frames: &[Frame] = frames.as_deref().unwrap_or_default();
        *self.answers.entry((frames.as_ptr(), frames.len())).or_insert_with(|| ask(frames))
    }
}

impl Snapshot {
    /// Device indices that have segments or a trace.
    pub fn devices(&self) -> Vec<i64> {
        let mut devices: Vec<i64> = self.segments.iter().map(|s| s.device).collect();
        devices.extend((0..self.device_traces.len() as i64).filter(|&d| !self.device_traces[d as usize].is_empty()));
        devices.sort_unstable();
        devices.dedup();
        devices
    }

    /// The device a file is about (the one the doctor diagnoses and the page opens unless told):
    /// the one with an out-of-memory entry, else the one whose trace reserved the most; None
    /// when the snapshot has no segments and no trace.
    pub fn pick_device(&self) -> Option<i64> {
        let devices = self.devices();
        // One device is the choice without reading its trace (60 ms of a 1 GB file's open in wasm).
        if let [only] = devices[..] {
            return Some(only);
        }
        // One pass over each trace: whether it ran out of memory, and the bytes it mapped.
        let read = |d: i64| -> (bool, u64) {
            let mut oom = false;
            let mut mapped = 0u64;
            for e in self.trace_of(d) {
                match e.action {
                    Action::Oom => oom = true,
                    Action::SegmentAlloc | Action::SegmentMap => mapped += e.size,
                    _ => {}
                }
            }
            let at_end: u64 = self.segments_of(d).map(|s| s.total_size).sum();
            (oom, at_end.max(mapped))
        };
        let devices: Vec<(i64, (bool, u64))> = devices.into_iter().map(|d| (d, read(d))).collect();
        if let Some(&(d, _)) = devices.iter().find(|(_, (oom, _))| *oom) {
            return Some(d);
        }
        devices.iter().max_by_key(|&&(d, (_, reserved))| (reserved, -d)).map(|&(d, _)| d)
    }

    pub fn segments_of(&self, device: i64) -> impl Iterator<Item = &Segment> {
        self.segments.iter().filter(move |s| s.device == device)
    }

    pub fn trace_of(&self, device: i64) -> &Trace {
        static NONE: std::sync::LazyLock<Trace> = std::sync::LazyLock::new(Trace::default);
        usize::try_from(device).ok().and_then(|d| self.device_traces.get(d)).unwrap_or(&NONE)
    }
}

impl Snapshot {
    /// Checks that the segments describe memory that can exist: blocks tile each segment from its
    /// address with no gap or overlap, and segments of one device do not overlap. A snapshot that
    /// fails cannot be replayed; the message names the first problem.
    pub fn check_layout(&self) -> Result<(), String> {
        let mut by_device: std::collections::BTreeMap<i64, Vec<(u64, u64)>> = Default::default();
        for (i, s) in self.segments.iter().enumerate() {
            let end = s.address.checked_add(s.total_size).ok_or_else(|| format!("segments[{i}]: address + total_size overflows"))?;
            let mut at = s.address;
            for (j, b) in s.blocks.iter().enumerate() {
                if b.address != at {
                    return Err(format!("segments[{i}].blocks[{j}] starts at {:#x}, expected {at:#x} (blocks must tile the segment)", b.address));
                }
                if b.size == 0 {
                    return Err(format!("segments[{i}].blocks[{j}] has size 0"));
                }
                at = at.checked_add(b.size).ok_or_else(|| format!("segments[{i}].blocks[{j}]: address + size overflows"))?;
            }
            if at != end || s.blocks.is_empty() {
                return Err(format!("segments[{i}] at {:#x}: blocks cover {} bytes of {}", s.address, at - s.address, s.total_size));
            }
            by_device.entry(s.device).or_default().push((s.address, end));
        }
        for (device, mut ranges) in by_device {
            ranges.sort_unstable();
            for w in ranges.windows(2) {
                if w[1].0 < w[0].1 {
                    return Err(format!("device {device}: segments at {:#x} and {:#x} overlap", w[0].0, w[1].0));
                }
            }
        }
        Ok(())
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// A row, as recorders, decoders and edits make them: 56 bytes on wasm32 (72 natively),
    /// where the rarer keys inline made 88. (A trace keeps its entries in 42 bytes of columns.)
    #[test]
    fn a_trace_entry_stays_small() {
        let expected = if cfg!(target_pointer_width = "64") { 72 } else { 56 };
        assert_eq!(std::mem::size_of::<TraceEntry>(), expected);
    }

    #[test]
    fn the_rarer_keys_are_written_as_keys_of_the_entry() {
        let oom = TraceEntry::new(Action::Oom, 0, 1024, 7).with_extra(EntryExtra {
            device_free: Some(512),
            user_metadata: Some("step 3".into()),
            ..Default::default()
        });
        let json = serde_json::to_value(&oom).unwrap();
        assert_eq!(json, serde_json::json!({"action": "oom", "addr": 0, "size": 1024, "stream": 7, "device_free": 512, "user_metadata": "step 3"}));
        assert_eq!((oom.device_free(), oom.user_metadata(), oom.compile_context()), (Some(512), Some("step 3"), None));
        // None set: no shared part at all.
        assert!(TraceEntry::new(Action::Alloc, 0, 1, 0).with_extra(EntryExtra::default()).extra.is_none());
    }
}
