//! The device's recording context: what names and labels each allocation as it is made (the
//! module scope, the forward op a backward allocation belongs to, the autograd engine's thread),
//! the stacks built from it, and the cuBLAS workspaces each thread and stream gets. The device
//! itself (`mod.rs`) executes: backend, allocator, stream. A guard sets part of the context for a
//! while and puts back, when dropped, what was there ([`Restore`]).

use super::{BlasWorkspaces, Device, DeviceError};
use crate::alloc::Allocation;
use crate::trace::{Category, Frame, Frames};
use std::cell::{Cell, RefCell};
use std::sync::Arc;

/// A cached stack's key: call site (file address, line), op name (address, length), the
/// autograd node it runs for (address of its name, 0 for none), scope path.
type FrameKey = (usize, u32, usize, usize, usize, Arc<str>);

/// Where an op was recorded from (its call site and module scope) and the autograd node it made:
/// the allocations of its backward carry these instead of the autograd engine's own place.
#[derive(Clone)]
pub(crate) struct Origin {
    at: &'static std::panic::Location<'static>,
    scope: Arc<str>,
    node: &'static str,
}

/// Whose workspace: on autograd's thread or not, the stream, cuBLASLt's or cuBLAS's.
type WorkspaceKey = (bool, crate::alloc::Stream, bool);

pub(super) struct Recording {
    /// Module names pushed by nn layers (`gpt.h.3.attn`), recorded with each allocation.
    /// Each with the number of the guard that opened it.
    scope: RefCell<Vec<(String, u64)>>,
    /// Guards opened so far.
    scopes_opened: Cell<u64>,
    /// Stacks already built, by call site, op and scope: most allocations repeat one, and
    /// sharing it keeps recording cheap (as PyTorch's pickles share frames).
    frame_cache: RefCell<rustc_hash::FxHashMap<FrameKey, Frames>>,
    /// The scope stack joined with dots, rebuilt when it changes.
    scope_path: RefCell<Arc<str>>,
    /// While backward runs a node: where its op was recorded.
    backward_of: RefCell<Option<Origin>>,
    /// Backward is running: ops run on the autograd engine's thread, whose cuBLAS handle (and
    /// so workspace) is not the main thread's.
    on_autograd_thread: Cell<bool>,
    /// The size of each cuBLAS handle's workspaces (None: a card without cuBLAS).
    blas_workspaces: Option<BlasWorkspaces>,
    /// The workspaces made so far: kept to the end, as PyTorch keeps them.
    blas_made: RefCell<Vec<(WorkspaceKey, Allocation)>>,
}

impl Recording {
    pub(super) fn new(blas_workspaces: Option<BlasWorkspaces>) -> Recording {
        Recording {
            scope: RefCell::new(Vec::new()),
            scopes_opened: Cell::new(0),
            frame_cache: RefCell::new(rustc_hash::FxHashMap::default()),
            scope_path: RefCell::new(Arc::from("")),
            backward_of: RefCell::new(None),
            on_autograd_thread: Cell::new(false),
            blas_workspaces,
            blas_made: RefCell::new(Vec::new()),
        }
    }
}

/// Puts back, when dropped, what a part of the device's context was before a guard changed it
/// (the stream, the category, the backward's origin...).
#[must_use = "the setting holds only while the guard lives"]
pub struct Restore<T> {
    device: Device,
    before: Option<T>,
    put_back: fn(&Device, T),
}

impl<T> Restore<T> {
    fn new(device: &Device, before: T, put_back: fn(&Device, T)) -> Restore<T> {
        Restore { device: device.clone(), before: Some(before), put_back }
    }
}

impl<T> Drop for Restore<T> {
    fn drop(&mut self) {
        if let Some(before) = self.before.take() {
            (self.put_back)(&self.device, before);
        }
    }
}

/// Restores the labelling in force before [`Device::backward_of`] or [`Device::hook_frames`].
pub(crate) type BackwardGuard = Restore<Option<Origin>>;
/// Ends [`Device::autograd_thread`].
pub(crate) type ThreadGuard = Restore<bool>;
/// Restores the stream that was current before [`Device::stream`].
pub type StreamGuard = Restore<crate::alloc::Stream>;
/// Ends [`Device::defer_parameters`].
pub type DeferGuard = Restore<bool>;
/// Restores the category that was in force before [`Device::category`].
pub type CategoryGuard = Restore<Option<Category>>;

impl Device {
    pub(super) fn frames(&self, op: &'static str, at: &'static std::panic::Location) -> Frames {
        // In backward, the op's allocations belong to the forward op they differentiate.
        let (at, path, node) = match &*self.0.recording.backward_of.borrow() {
            Some(o) => (o.at, o.scope.clone(), Some(o.node)),
            None => (at, self.0.recording.scope_path.borrow().clone(), None),
        };
        // Call sites and names are static strings: their addresses identify them.
        let key = (at.file().as_ptr() as usize, at.line(), op.as_ptr() as usize, op.len(), node.map_or(0, |n| n.as_ptr() as usize), path);
        if let Some(f) = self.0.recording.frame_cache.borrow().get(&key) {
            return f.clone();
        }
        let name = match node {
            Some(node) => format!("{op} ({node})"),
            None => op.to_string(),
        };
        let mut frames = vec![Frame { filename: at.file().to_string(), line: at.line() as u64, name }];
        if !key.5.is_empty() {
            frames.push(Frame { filename: String::new(), line: 0, name: key.5.to_string() });
        }
        let frames: Frames = Arc::from(frames);
        let mut cache = self.0.recording.frame_cache.borrow_mut();
        if cache.len() >= 4096 {
            cache.clear();
        }
        cache.insert(key, frames.clone());
        frames
    }

    /// Where an op recording autograd node `node` is being called from (`at`, this scope).
    pub(crate) fn origin(&self, at: &'static std::panic::Location<'static>, node: &'static str) -> Origin {
        Origin { at, scope: self.0.recording.scope_path.borrow().clone(), node }
    }

    /// Labels the following allocations as the backward of `origin` until the guard drops.
    pub(crate) fn backward_of(&self, origin: &Origin) -> BackwardGuard {
        let before = self.0.recording.backward_of.replace(Some(origin.clone()));
        Restore::new(self, before, |device, before| *device.0.recording.backward_of.borrow_mut() = before)
    }

    /// Until the guard drops, ops run on the autograd engine's thread (see [`Self::blas_workspaces`]).
    pub(crate) fn autograd_thread(&self) -> ThreadGuard {
        let before = self.0.recording.on_autograd_thread.replace(true);
        Restore::new(self, before, |device, before| device.0.recording.on_autograd_thread.set(before))
    }

    /// What a matmul's first call on this thread and stream allocates after its output: the
    /// cuBLAS handle's workspace and, for a matmul through cuBLASLt (`lt`), the Lt workspace
    /// after it (see [`cublas`]). Later matmuls there allocate nothing.
    #[track_caller]
    pub(crate) fn blas_workspaces(&self, lt: bool) -> Result<(), DeviceError> {
        let Some(sizes) = self.0.recording.blas_workspaces else { return Ok(()) };
        let (thread, stream) = (self.0.recording.on_autograd_thread.get(), self.0.stream.get());
        let wanted = [(false, sizes.cublas, "at::cuda::getNewWorkspace"), (true, sizes.cublaslt, "at::cuda::getCUDABlasLtWorkspace")];
        for (is_lt, bytes, op) in wanted.into_iter().filter(|w| lt || !w.0) {
            let key = (thread, stream, is_lt);
            // A zero size (`:0:0`, or Lt unified with cuBLAS's) allocates nothing.
            if bytes == 0 || self.0.recording.blas_made.borrow().iter().any(|(k, _)| *k == key) {
                continue;
            }
            let block = self.allocate(bytes, op)?;
            self.0.recording.blas_made.borrow_mut().push((key, block));
        }
        Ok(())
    }

    /// Until the guard drops, allocations are named by the current scope rather than as the
    /// backward of a forward op: a module hook that runs in backward (FSDP's gathers and
    /// reduce-scatters) names itself.
    pub(crate) fn hook_frames(&self) -> BackwardGuard {
        let before = self.0.recording.backward_of.replace(None);
        Restore::new(self, before, |device, before| *device.0.recording.backward_of.borrow_mut() = before)
    }

    fn rebuild_scope_path(&self) {
        let scope = self.0.recording.scope.borrow();
        let names: Vec<&str> = scope.iter().map(|(name, _)| name.as_str()).collect();
        *self.0.recording.scope_path.borrow_mut() = Arc::from(names.join("."));
    }

    /// Names the module that the following allocations belong to, until the guard drops.
    /// Guards nest: dropping one ends its scope and any opened inside it, whatever the order.
    #[must_use = "the scope holds only while the guard lives (`let _ = ` drops it at once)"]
    pub fn scope(&self, name: &str) -> ScopeGuard {
        let number = self.0.recording.scopes_opened.get() + 1;
        self.0.recording.scopes_opened.set(number);
        self.0.recording.scope.borrow_mut().push((name.to_string(), number));
        self.rebuild_scope_path();
        ScopeGuard { device: self.clone(), number }
    }

    /// The scope of the module at `path` (`h.3.attn.q_proj`, as named_parameters() names it):
    /// inside its parent's scope (`h.3.attn`) it adds only its own part (`q_proj`), so that the
    /// joined scope path is the module's path.
    #[must_use = "the scope holds only while the guard lives (`let _ = ` drops it at once)"]
    pub fn module_scope(&self, path: &str) -> ScopeGuard {
        let current = self.0.recording.scope_path.borrow().clone();
        let own = path.strip_prefix(&*current).and_then(|rest| rest.strip_prefix('.')).filter(|_| !current.is_empty()).unwrap_or(path);
        self.scope(own)
    }

    /// Classifies the following allocations as `category` (parameter, gradient, ...: what the
    /// page colours them by) until the guard drops, which restores the one before.
    #[must_use = "the category holds only while the guard lives"]
    pub fn category(&self, category: Category) -> CategoryGuard {
        let before = self.0.alloc.borrow_mut().history_mut().set_category(Some(category));
        Restore::new(self, before, |device, before| {
            device.0.alloc.borrow_mut().history_mut().set_category(before);
        })
    }

    /// `torch.profiler.record_function(name)`: a range recorded beside the trace until the guard
    /// drops (the snapshot's `external_annotations`), as PyTorch records an optimizer's step.
    #[must_use = "the range ends when the guard drops"]
    pub fn record_function(&self, name: &str) -> RecordFunctionGuard {
        let mut alloc = self.0.alloc.borrow_mut();
        let index = alloc.device();
        alloc.history_mut().annotate(name, true, index);
        drop(alloc);
        RecordFunctionGuard { device: self.clone(), name: name.to_string() }
    }

    /// `with torch.cuda.stream(s)`: blocks allocated until the guard drops belong to stream `s`
    /// (the caching allocator keeps each stream's free blocks apart, as NCCL's collectives on
    /// their own streams see them).
    #[must_use = "the stream holds only while the guard lives"]
    pub fn stream(&self, stream: crate::alloc::Stream) -> StreamGuard {
        let before = self.0.stream.replace(stream);
        Restore::new(self, before, |device, before| device.0.stream.set(before))
    }

    /// Parameters made until the guard drops get no memory (on the sim device only: a GPU needs
    /// a buffer behind every tensor it computes with).
    #[must_use = "deferral holds only while the guard lives"]
    pub fn defer_parameters(&self) -> DeferGuard {
        let before = self.0.deferred_parameters.replace(self.is_sim());
        Restore::new(self, before, |device, before| device.0.deferred_parameters.set(before))
    }
}

/// Ends a [`Device::record_function`] range when dropped.
pub struct RecordFunctionGuard {
    device: Device,
    name: String,
}

impl Drop for RecordFunctionGuard {
    fn drop(&mut self) {
        let mut alloc = self.device.0.alloc.borrow_mut();
        let index = alloc.device();
        alloc.history_mut().annotate(&self.name, false, index);
    }
}

/// Ends its scope when dropped, with the scopes opened inside it; a guard whose scope an outer
/// guard already ended has nothing left to end.
pub struct ScopeGuard {
    device: Device,
    number: u64,
}

impl Drop for ScopeGuard {
    fn drop(&mut self) {
        let mut scope = self.device.0.recording.scope.borrow_mut();
        if let Some(at) = scope.iter().position(|&(_, n)| n == self.number) {
            scope.truncate(at);
            drop(scope);
            self.device.rebuild_scope_path();
        }
    }
}
