//! `outside-allocator`: what `nvidia-smi` shows that PyTorch's counters do not, so that a user can
//! reconcile the two figures. Always reported, as information rather than a problem: it is ranked
//! last (after the problems, whatever its bytes), so that an estimate of the CUDA context never
//! pushes a measured problem down the list.
//!
//! - The CUDA context (driver, runtime, the kernels loaded so far) is in no snapshot: an estimate.
//!   PyTorch's maintainers put it at about 300 MB with CUDA 11.7+'s lazy kernel loading and above
//!   1,000 MB before it, when every kernel was loaded at start
//!   (<https://github.com/pytorch/pytorch/issues/107667>); users see 200+ to 700+ MB in
//!   `nvidia-smi` and nothing in `torch.cuda` right after CUDA starts
//!   (<https://github.com/pytorch/pytorch/issues/28113>). Lazy loading is the default on Linux
//!   since CUDA 12.2 (NVIDIA's forums). The range below, 300 to 600 MiB per card on a data-center
//!   card (A100, H100) with lazy loading, is a typical figure, not a measurement.
//! - cuBLAS/cuBLASLt workspaces go through the caching allocator (`at::cuda::getNewWorkspace`):
//!   they are inside reserved, and allocated, but are not tensors. One per handle, and a handle
//!   per thread and stream: backward runs on autograd's own thread, so its first matmul makes a
//!   second workspace. A trace that starts mid-run misses the ones made before it: blocks live at
//!   its start, without a stack, of exactly PyTorch's default size per handle
//!   (`CublasHandlePool.cpp`: 4096 * 1024 * 2 + 16 * 1024 * 8 = 8,519,680 B, or 4096 * 8 * 1024 =
//!   32 MiB on compute capability 9.x, 10.x, 12.x) are listed apart, as likely workspaces.
//! - NCCL (when frames show `nccl`, `ProcessGroupNCCL` or `c10d`) keeps its buffers outside the
//!   allocator: an estimate too.

use super::Material;
use super::kinds::{Kind, Role};
use super::{Finding, OUTSIDE_ALLOCATOR, Patient, size};
use crate::timeline::GroupKind;
use crate::trace::{Action, Frame};
use serde::{Deserialize, Serialize};

const MIB: u64 = 1 << 20;
/// The CUDA context on a data-center card with lazy loading, with the kernels a program loads:
/// a range, and the figure the finding adds. Measured on an H100 (driver 580, CUDA 13.0,
/// PyTorch 2.11) as the card's total_memory less reserved and free at an out-of-memory: 685 MiB
/// once an MLP's forward kernels were loaded, 751 MiB once a 7B transformer's training step's were.
/// Older CUDA versions and smaller cards take less.
const CONTEXT_LOW: u64 = 300 * MIB;
const CONTEXT_HIGH: u64 = 800 * MIB;
pub(super) const CONTEXT_TYPICAL: u64 = 700 * MIB;
/// NCCL's own buffers per card (NCCL_BUFFSIZE, 4 MiB by default, per channel and peer, and its
/// kernels' context share): a typical range, not a measurement.
const NCCL_LOW: u64 = 256 * MIB;
const NCCL_HIGH: u64 = 1024 * MIB;
const NCCL_TYPICAL: u64 = 512 * MIB;

#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct Workspace {
    /// Position of its `alloc` entry in the device's trace.
    pub trace_index: usize,
    pub addr: u64,
    pub bytes: u64,
    pub stream: i64,
    /// Made inside backward (autograd's thread: a handle, and a workspace, of its own).
    pub backward: bool,
    /// The frame that names it.
    pub frame: String,
}

/// PyTorch's default cuBLAS workspace per handle (no CUBLAS_WORKSPACE_CONFIG): before Hopper,
/// and on compute capability 9.x, 10.x and 12.x.
const DEFAULT_WORKSPACES: [u64; 2] = [4096 * 1024 * 2 + 16 * 1024 * 8, 4096 * 8 * 1024];

/// cuBLAS makes one workspace per handle, and a handle per thread and stream: the program's
/// thread and autograd's backward thread on each stream. A guess by size names at most that
/// many blocks per stream, less the workspaces the trace itself shows there.
const HANDLES_PER_STREAM: usize = 2;

/// A block live at the trace's start, without a stack, of a default workspace's size.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct LikelyWorkspace {
    pub addr: u64,
    pub bytes: u64,
    pub stream: i64,
}

#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct Range {
    pub low_bytes: u64,
    pub high_bytes: u64,
    pub typical_bytes: u64,
}

#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct OutsideAllocatorEvidence {
    pub device: i64,
    pub peak_reserved_bytes: u64,
    /// Estimated bytes `nvidia-smi` shows beyond reserved (the finding's bytes).
    pub outside_bytes: u64,
    pub cuda_context: Range,
    /// Inside reserved (and allocated), but not tensors.
    pub cublas_workspaces: Vec<Workspace>,
    pub cublas_workspace_bytes: u64,
    /// Blocks that predate the trace, without a stack, of exactly PyTorch's default workspace
    /// size: likely cuBLAS workspaces made before recording started (inferred by size).
    pub likely_cublas_workspaces_before_trace: Vec<LikelyWorkspace>,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub nccl: Option<Range>,
    /// The frame that shows NCCL, when one does.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub nccl_frame: Option<String>,
}

fn is_nccl(name: &str, filename: &str) -> bool {
    let nccl = |text: &str| text.as_bytes().windows(4).any(|w| w.eq_ignore_ascii_case(b"nccl"));
    nccl(name) || name.contains("c10d") || nccl(filename) || filename.contains("c10d")
}

pub(super) const KIND: Kind = Kind {
    name: OUTSIDE_ALLOCATOR,
    label: "outside the allocator",
    about: "what nvidia-smi shows beyond reserved",
    role: Role::Last,
    find: |x| Ok(Some(find(&x.patient))),
    material: Material::ANY,
};

pub(super) fn find(p: &Patient) -> Finding {
    let trace = p.snapshot.trace_of(p.device);
    let mut workspaces = Vec::new();
    let mut nccl_frame = None;
    // Entries share their stacks: each stack is read for NCCL once.
    let mut stacks_read: rustc_hash::FxHashSet<*const Frame> = Default::default();
    let mut workspace_stacks: rustc_hash::FxHashMap<(*const Frame, usize), Option<(String, bool)>> = Default::default();
    for (i, e) in trace.iter().enumerate() {
        let frames: &[Frame] = e.frames.as_deref().unwrap_or_default();
        if nccl_frame.is_none()
            && stacks_read.insert(frames.as_ptr())
            && let Some(f) = frames.iter().find(|f| is_nccl(&f.name, &f.filename))
        {
            nccl_frame = Some(f.name.clone());
        }
        if e.action != Action::Alloc {
            continue;
        }
        // Whether a stack makes a workspace (its frame's name, in backward or not): read once.
        let workspace = workspace_stacks.entry((frames.as_ptr(), frames.len())).or_insert_with(|| {
            let f = frames.iter().take(12).find(|f| crate::pytorch::is_cublas_workspace(f))?;
            Some((f.name.clone(), frames.iter().any(crate::pytorch::is_backward_frame)))
        });
        if let Some((frame, backward)) = workspace {
            workspaces.push(Workspace { trace_index: i, addr: e.addr, bytes: e.size, stream: e.stream, backward: *backward, frame: frame.clone() });
        }
    }
    let workspace_bytes: u64 = workspaces.iter().map(|w| w.bytes).sum();
    let a = &p.timeline.allocations;
    let mut likely: Vec<LikelyWorkspace> = (0..a.start.len())
        .filter(|&id| a.start[id] == 0 && p.timeline.groups[a.group[id] as usize].kind == GroupKind::BeforeTrace)
        .filter(|&id| DEFAULT_WORKSPACES.contains(&(a.size[id] as u64)))
        .map(|id| LikelyWorkspace { addr: a.addr[id] as u64, bytes: a.size[id] as u64, stream: a.stream[id] as i64 })
        .collect();
    // More blocks of a workspace's size on a stream than it has handles are tensors of that size
    // (a KV cache's 32 MiB blocks), and nothing tells which, if any, is a workspace: none is named.
    let on_stream = |stream: i64| likely.iter().filter(|w| w.stream == stream).count() + workspaces.iter().filter(|w| w.stream == stream).count();
    let too_many: Vec<bool> = likely.iter().map(|w| on_stream(w.stream) > HANDLES_PER_STREAM).collect();
    let set_aside = too_many.iter().filter(|&&t| t).count();
    let mut keep = too_many.iter().map(|&t| !t);
    likely.retain(|_| keep.next().unwrap_or(false));
    let likely_bytes: u64 = likely.iter().map(|w| w.bytes).sum();
    let nccl = nccl_frame.is_some().then_some(Range { low_bytes: NCCL_LOW, high_bytes: NCCL_HIGH, typical_bytes: NCCL_TYPICAL });
    let outside = CONTEXT_TYPICAL + nccl.as_ref().map_or(0, |n| n.typical_bytes);
    let reserved = p.timeline.summary.peak_reserved_bytes;

    let mut title = format!(
        "nvidia-smi will show about {} more than reserved ({}): the CUDA context (~{}, estimated)",
        size(outside),
        size(reserved),
        size(CONTEXT_TYPICAL)
    );
    if let Some(n) = &nccl {
        title.push_str(&format!(", NCCL's buffers (~{}, estimated)", size(n.typical_bytes)));
    }
    if !workspaces.is_empty() {
        title.push_str(&format!(
            "; {} cuBLAS workspace{} ({}) {} inside reserved but not tensors",
            workspaces.len(),
            if workspaces.len() == 1 { "" } else { "s" },
            size(workspace_bytes),
            if workspaces.len() == 1 { "is" } else { "are" }
        ));
    }
    if !likely.is_empty() {
        title.push_str(&format!(
            "; {} block{} from before the trace ({}) {} likely cuBLAS workspaces",
            likely.len(),
            if likely.len() == 1 { "" } else { "s" },
            size(likely_bytes),
            if likely.len() == 1 { "is" } else { "are" }
        ));
    }
    let mut why = "PyTorch's counters (allocated, reserved) and its snapshots see only the caching allocator. The CUDA context \
                   (driver, runtime and the kernels loaded so far) is made when CUDA starts and never goes through it, so \
                   nvidia-smi shows it on top of reserved."
        .to_string();
    if !workspaces.is_empty() || !likely.is_empty() {
        why.push_str(
            " cuBLAS's workspaces do go through the allocator: they count in reserved and allocated but hold no tensor, one per \
             handle, and there is a handle per thread and stream (backward runs on autograd's own thread, so its first matmul \
             makes a second workspace).",
        );
    }
    if nccl.is_some() {
        why.push_str(" NCCL allocates its communication buffers with CUDA directly: they are outside reserved too.");
    }
    let mut fix = "Nothing to fix: to compare with nvidia-smi, add the context to torch.cuda.memory_reserved(); \
                   torch.cuda.mem_get_info() gives the card's free memory as the driver sees it. Keep CUDA_MODULE_LOADING=LAZY \
                   (the default since CUDA 12.2): loading every kernel at start makes the context above 1 GiB."
        .to_string();
    if !workspaces.is_empty() || !likely.is_empty() {
        fix.push_str(" CUBLAS_WORKSPACE_CONFIG (e.g. :4096:8) sets cuBLAS's workspace size.");
    }
    if nccl.is_some() {
        fix.push_str(" NCCL_BUFFSIZE and NCCL_MAX_NCHANNELS bound NCCL's buffers.");
    }
    let mut estimate = format!(
        "The CUDA context is an estimate, not in any snapshot: {} to {} per card (A100/H100 class, CUDA 11.7+ with lazy kernel \
         loading; above 1 GiB without it), {} counted: on an H100 with CUDA 13.0 and PyTorch 2.11 it measured 685 MiB to 751 MiB \
         with the kernels of the program loaded; older CUDA versions and smaller cards take less.",
        size(CONTEXT_LOW),
        size(CONTEXT_HIGH),
        size(CONTEXT_TYPICAL)
    );
    if nccl.is_some() {
        estimate.push_str(&format!(
            " NCCL's buffers are an estimate too: {} to {} per card, {} counted, depending on NCCL_BUFFSIZE, channels and peers.",
            size(NCCL_LOW),
            size(NCCL_HIGH),
            size(NCCL_TYPICAL)
        ));
    }
    if !workspaces.is_empty() {
        estimate.push_str(" The cuBLAS workspaces are exact: the trace's own allocations, already inside reserved.");
    }
    if !likely.is_empty() {
        estimate.push_str(
            " The blocks from before the trace are taken for cuBLAS workspaces by their size alone (PyTorch's default per \
             handle, 8,519,680 B, or 32 MiB on Hopper and later), with no stack to confirm it: a guess.",
        );
    }
    if set_aside > 0 {
        estimate.push_str(&format!(
            " {set_aside} blocks from before the trace have a workspace's size, more than the {HANDLES_PER_STREAM} handles (a thread's \
             and autograd's) a stream has: they are tensors of that size, and none is taken for a workspace."
        ));
    }
    Finding::new(
        title,
        outside,
        OutsideAllocatorEvidence {
            device: p.device,
            peak_reserved_bytes: reserved,
            outside_bytes: outside,
            cuda_context: Range { low_bytes: CONTEXT_LOW, high_bytes: CONTEXT_HIGH, typical_bytes: CONTEXT_TYPICAL },
            cublas_workspaces: workspaces,
            cublas_workspace_bytes: workspace_bytes,
            likely_cublas_workspaces_before_trace: likely,
            nccl,
            nccl_frame,
        },
        why,
        fix,
    )
    .estimate(Some(estimate))
}
