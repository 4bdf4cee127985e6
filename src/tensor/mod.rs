//! Tensor = shared storage (one allocator block, freed when the last reference drops) + layout
//! (shape, strides, offset) + dtype. Views share storage; ops allocate their outputs and
//! temporaries through the device's allocator, where they appear in the trace.

pub(crate) mod autocast;
mod grad;
pub(crate) mod graph;
mod layout;
pub(crate) mod ops;

/// The matmul kernels and how a device picks one (`device::tune`), under the names tensors use.
pub use crate::device::{MatmulChoice, MatmulKernel, MatmulTuning};
pub use crate::dtype::{DType, Element};
pub use layout::{Layout, MAX_DIMS, broadcast_shapes};

use crate::alloc::Allocation;
use crate::device::Arg;
use crate::device::{Device, DeviceError};
use graph::Node;
use std::cell::{Cell, RefCell};
use std::rc::Rc;

#[derive(Debug, thiserror::Error)]
pub enum TensorError {
    #[error("shape error: {0}")]
    Shape(String),
    #[error("dtype error: {0}")]
    DType(String),
    #[error(transparent)]
    Device(#[from] DeviceError),
    #[error("{0}")]
    Unsupported(String),
    /// PyTorch's autograd errors, in its words.
    #[error("{0}")]
    Autograd(String),
}

impl From<crate::kernels::KernelError> for TensorError {
    fn from(e: crate::kernels::KernelError) -> TensorError {
        TensorError::Device(DeviceError::Kernel(e))
    }
}

impl From<crate::alloc::AllocError> for TensorError {
    fn from(e: crate::alloc::AllocError) -> TensorError {
        TensorError::Device(DeviceError::Alloc(e))
    }
}

pub type Result<T> = std::result::Result<T, TensorError>;

/// Memory behind a tensor: one block of the device's allocator (none for zero bytes, as in
/// PyTorch). Freed when the last tensor that uses it drops.
pub(crate) struct Storage {
    device: Device,
    block: Option<Allocation>,
    bytes: u64,
    id: u64,
    /// Bumped by every in-place write, shared by the views of the storage (PyTorch's version
    /// counter, which views share with their base): autograd checks what it saved against it.
    version: Cell<u64>,
}

impl Drop for Storage {
    fn drop(&mut self) {
        if let Some(block) = &self.block {
            self.device.release(block);
        }
    }
}

/// Memory without a tensor over it ([`Device::buffer`]), freed when dropped.
pub struct Buffer(Rc<Storage>);

impl Buffer {
    pub fn bytes(&self) -> u64 {
        self.0.bytes
    }
}

/// A tensor: a cheap handle (`Tensor::share` clones it, as Python's `y = x` names the same
/// object) to one record with an identity. Views are tensors of their own over the same storage.
/// Autograd keeps handles to the tensors it saves: real allocations held alive, which is what
/// the memory history shows.
pub struct Tensor(Rc<TensorImpl>);

/// What a tensor handle points to. Field access goes through `Deref`.
pub struct TensorImpl {
    id: u64,
    storage: Rc<Storage>,
    layout: Layout,
    dtype: DType,
    /// Set by the user on leaves (`requires_grad_`), and on the outputs of recorded ops.
    requires_grad: Cell<bool>,
    /// A leaf's accumulated gradient.
    grad: RefCell<Option<Tensor>>,
    /// The recorded op that made this tensor (None for leaves).
    grad_fn: RefCell<Option<Rc<Node>>>,
    /// Made by a view op over another tensor's storage: autograd does not follow an in-place
    /// write through a view back to its base, so it refuses one on a tracked view.
    is_view: bool,
}

impl std::ops::Deref for Tensor {
    type Target = TensorImpl;
    fn deref(&self) -> &TensorImpl {
        &self.0
    }
}

impl std::fmt::Debug for Tensor {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(f, "Tensor #{}({:?}, {}, strides {:?}, storage #{})", self.id, self.layout.shape, self.dtype, self.layout.strides, self.storage.id)
    }
}

impl Tensor {
    /// The node that made this tensor, taken out when this handle is the tensor's last (it is
    /// about to drop): autograd takes a graph apart without recursion through it.
    pub(crate) fn take_grad_fn_if_last(&self) -> Option<Rc<Node>> {
        (Rc::strong_count(&self.0) == 1).then(|| self.grad_fn.borrow_mut().take()).flatten()
    }

    fn from_parts(storage: Rc<Storage>, layout: Layout, dtype: DType, is_view: bool) -> Tensor {
        let id = storage.device.next_tensor_id();
        let (requires_grad, grad, grad_fn) = (Cell::new(false), RefCell::new(None), RefCell::new(None));
        Tensor(Rc::new(TensorImpl { id, storage, layout, dtype, requires_grad, grad, grad_fn, is_view }))
    }
}

impl Tensor {
    pub fn shape(&self) -> &[usize] {
        &self.layout.shape
    }

    pub fn strides(&self) -> &[usize] {
        &self.layout.strides
    }

    pub fn layout(&self) -> &Layout {
        &self.layout
    }

    pub fn dtype(&self) -> DType {
        self.dtype
    }

    pub fn numel(&self) -> usize {
        self.layout.numel()
    }

    pub fn ndim(&self) -> usize {
        self.layout.ndim()
    }

    pub fn device(&self) -> &Device {
        &self.storage.device
    }

    pub fn is_contiguous(&self) -> bool {
        self.layout.is_contiguous()
    }

    /// Address of the first element (`data_ptr()`); 0 for a tensor without bytes.
    pub fn data_ptr(&self) -> u64 {
        self.storage.block.map_or(0, |b| b.ptr + self.layout.offset as u64 * self.dtype.size() as u64)
    }

    /// Identifies the storage: views of one tensor share it.
    pub fn storage_id(&self) -> u64 {
        self.storage.id
    }

    /// Bytes of the storage (the request, before the allocator's rounding).
    pub fn storage_bytes(&self) -> u64 {
        self.storage.bytes
    }

    /// Another handle to the same tensor (Python's `y = x`): same identity, no memory.
    pub fn share(&self) -> Tensor {
        Tensor(self.0.clone())
    }

    /// Identifies the tensor: handles of one tensor share it; each view has its own.
    pub fn id(&self) -> u64 {
        self.id
    }

    /// Whether the tensor is a view of another's storage (`_is_view()`).
    pub fn is_view(&self) -> bool {
        self.0.is_view
    }

    /// Whether two handles name the same tensor (Python's `is`).
    pub fn same(&self, other: &Tensor) -> bool {
        Rc::ptr_eq(&self.0, &other.0)
    }

    fn view_with(&self, layout: Layout) -> Tensor {
        Tensor::from_parts(self.storage.clone(), layout, self.dtype, true)
    }

    /// An op's own fresh result given its final shape (a reduction's output without the reduced
    /// dimensions): the same storage, but not a view, as ATen allocates it in that shape.
    pub(crate) fn reshaped_result(&self, layout: Layout) -> Tensor {
        Tensor::from_parts(self.storage.clone(), layout, self.dtype, false)
    }

    /// The first `numel` elements of this tensor's storage read as `dtype`: a view, for kernels
    /// that use a byte buffer as scratch of another type.
    pub(crate) fn reinterpret(&self, dtype: DType, numel: usize) -> Tensor {
        debug_assert!((numel * dtype.size()) as u64 <= self.storage.bytes);
        Tensor::from_parts(self.storage.clone(), Layout::contiguous(&[numel]), dtype, true)
    }

    /// The storage as a kernel binding (None for zero bytes).
    pub(crate) fn arg(&self) -> Result<Option<Arg>> {
        let Some(block) = self.storage.block else { return Ok(None) };
        match self.device().block_arg(&block, self.storage.bytes) {
            Ok(arg) => Ok(Some(arg)),
            Err(DeviceError::Unsupported(e)) => Err(TensorError::Unsupported(e)),
            Err(e) => Err(e.into()),
        }
    }

    // ------------------------------------------------------------------ views (no memory)
    // Each records a node that saves nothing but sizes: its backward is a view or a reshape
    // of the gradient (expand's sums it back).

    /// Records a view op for autograd. `backward` makes (only when the op is recorded) the
    /// function from the output's gradient to the input's.
    #[track_caller]
    fn record_view<F: Fn(&Tensor) -> Result<Tensor> + 'static>(&self, name: &'static str, out: Tensor, backward: impl FnOnce() -> F) -> Tensor {
        if !graph::records(&[self]) {
            return out;
        }
        let backward = backward();
        graph::record(name, &[self], out, &[], Box::new(move |_, g| Ok(vec![Some(backward(g)?)])))
    }

    #[track_caller]
    pub fn transpose(&self, d0: isize, d1: isize) -> Result<Tensor> {
        let out = self.view_with(self.layout.transpose(d0, d1)?);
        Ok(self.record_view("TransposeBackward0", out, || move |g: &Tensor| g.transpose(d0, d1)))
    }

    /// Transpose of a 2-D tensor (`x.t()`).
    #[track_caller]
    pub fn t(&self) -> Result<Tensor> {
        if self.ndim() > 2 {
            return Err(TensorError::Shape(format!("t() expects at most 2 dims, got {}", self.ndim())));
        }
        if self.ndim() < 2 {
            return Ok(self.share());
        }
        let out = self.view_with(self.layout.transpose(0, 1)?);
        Ok(self.record_view("TBackward0", out, || |g: &Tensor| g.t()))
    }

    #[track_caller]
    pub fn permute(&self, dims: &[isize]) -> Result<Tensor> {
        let out = self.view_with(self.layout.permute(dims)?);
        Ok(self.record_view("PermuteBackward0", out, || {
            // Layout::permute checked that dims is a permutation of self's dimensions.
            let mut inverse = vec![0isize; dims.len()];
            for (i, &d) in dims.iter().enumerate() {
                inverse[if d < 0 { d + dims.len() as isize } else { d } as usize] = i as isize;
            }
            move |g: &Tensor| g.permute(&inverse)
        }))
    }

    /// `narrow` (PyTorch's `slice`): its backward writes the gradient into zeros of the
    /// input's shape (`slice_backward`, one allocation).
    #[track_caller]
    pub fn narrow(&self, dim: isize, start: usize, len: usize) -> Result<Tensor> {
        let out = self.view_with(self.layout.narrow(dim, start, len)?);
        Ok(self.record_view("SliceBackward0", out, || {
            let shape = self.shape().to_vec();
            move |g: &Tensor| g.placed_in_zeros(&shape, |z| z.narrow(dim, start, len))
        }))
    }

    /// `select`: as `narrow`, without the dimension (`select_backward`).
    #[track_caller]
    pub fn select(&self, dim: isize, index: usize) -> Result<Tensor> {
        let out = self.view_with(self.layout.select(dim, index)?);
        Ok(self.record_view("SelectBackward0", out, || {
            let shape = self.shape().to_vec();
            move |g: &Tensor| g.placed_in_zeros(&shape, |z| z.select(dim, index))
        }))
    }

    /// Zeros of `shape` with self copied into the part `part` picks (a slice's backward).
    #[track_caller]
    fn placed_in_zeros(&self, shape: &[usize], part: impl Fn(&Tensor) -> Result<Tensor>) -> Result<Tensor> {
        let zeros = self.device().zeros(shape, self.dtype)?;
        part(&zeros)?.copy_(self)?;
        Ok(zeros)
    }

    #[track_caller]
    pub fn unsqueeze(&self, dim: isize) -> Result<Tensor> {
        let out = self.view_with(self.layout.unsqueeze(dim)?);
        // The new dimension's index, once unsqueeze accepted it.
        let d = if dim < 0 { dim + out.ndim() as isize } else { dim };
        Ok(self.record_view("UnsqueezeBackward0", out, || move |g: &Tensor| g.squeeze(Some(d))))
    }

    #[track_caller]
    pub fn squeeze(&self, dim: Option<isize>) -> Result<Tensor> {
        let out = self.view_with(self.layout.squeeze(dim)?);
        let name = if dim.is_some() { "SqueezeBackward1" } else { "SqueezeBackward0" };
        Ok(self.record_view(name, out, || {
            let shape = self.signed_shape();
            move |g: &Tensor| g.reshape(&shape)
        }))
    }

    #[track_caller]
    pub fn expand(&self, shape: &[usize]) -> Result<Tensor> {
        let out = self.view_with(self.layout.expand(shape)?);
        Ok(self.record_view("ExpandBackward0", out, || {
            let input = self.shape().to_vec();
            move |g: &Tensor| g.sum_to(&input)
        }))
    }

    /// `view`: another shape over the same memory, or an error when that needs a copy.
    #[track_caller]
    pub fn view(&self, shape: &[isize]) -> Result<Tensor> {
        let dims = layout::infer_shape(shape, self.numel())?;
        Ok(self.viewed(self.layout.view(&dims)?))
    }

    /// Self seen through `layout` (a reshape that needs no copy), recorded as `view`.
    #[track_caller]
    fn viewed(&self, layout: Layout) -> Tensor {
        let out = self.view_with(layout);
        self.record_view("ViewBackward0", out, || {
            let input = self.signed_shape();
            move |g: &Tensor| g.reshape(&input)
        })
    }

    /// The shape as `view` and `reshape` take it.
    fn signed_shape(&self) -> Vec<isize> {
        self.shape().iter().map(|&n| n as isize).collect()
    }

    /// `reshape`: a view when possible, otherwise a contiguous copy (which allocates).
    #[track_caller]
    pub fn reshape(&self, shape: &[isize]) -> Result<Tensor> {
        self.reshape_for(shape, "clone")
    }

    /// `contiguous`: self if already contiguous (no memory), else a copy.
    #[track_caller]
    pub fn contiguous(&self) -> Result<Tensor> {
        if self.is_contiguous() {
            return Ok(self.share());
        }
        // `clone(memory_format=torch.contiguous_format)`.
        self.copy_for("clone")
    }

    /// PyTorch's `clone()`: always a new tensor with its own memory. Its layout is preserved
    /// (`memory_format=torch.preserve_format`): a transposed matrix's clone is transposed too.
    #[allow(clippy::should_implement_trait)]
    #[track_caller]
    pub fn clone(&self) -> Result<Tensor> {
        self.copy_into(self.device().empty_result(self.shape(), &[self], self.dtype, "clone")?)
    }

    /// A contiguous copy that an op makes of its operand (`op` names the allocation):
    /// `contiguous()`'s, or a matmul's when its batch dimensions fold into no strides.
    #[track_caller]
    pub(crate) fn copy_for(&self, op: &'static str) -> Result<Tensor> {
        self.copy_into(self.device().empty_tensor(self.shape(), self.dtype, op)?)
    }

    #[track_caller]
    fn copy_into(&self, out: Tensor) -> Result<Tensor> {
        out.unary_into(self, ops::Unary::Identity, 0.0)?;
        Ok(self.record_view("CloneBackward0", out, || |g: &Tensor| Ok(g.share())))
    }

    /// `reshape` as an op calls it inside itself: a copy it needs is named by `op`.
    #[track_caller]
    pub(crate) fn reshape_for(&self, shape: &[isize], op: &'static str) -> Result<Tensor> {
        let dims = layout::infer_shape(shape, self.numel())?;
        match self.layout.view(&dims) {
            Ok(l) => Ok(self.viewed(l)),
            Err(_) => self.copy_for(op)?.view(shape),
        }
    }

    /// Copies to the host (`tensor.tolist()` / `.cpu().numpy()`). A non-contiguous tensor is
    /// first made contiguous on the device (a temporary). Errors on the simulation device.
    pub async fn to_vec<T: Element>(&self) -> Result<Vec<T>> {
        if T::DTYPE != self.dtype {
            return Err(TensorError::DType(format!("to_vec::<{}> of a {} tensor; convert with to(dtype) first", T::DTYPE, self.dtype)));
        }
        if self.device().is_sim() {
            return Err(TensorError::Unsupported("readback on the simulation device: it has shapes but no data".into()));
        }
        if self.numel() == 0 {
            return Ok(Vec::new());
        }
        let dense = self.contiguous()?;
        let arg = dense.arg()?.expect("non-empty tensors have a block");
        let start = dense.layout.offset as u64 * self.dtype.size() as u64;
        let len = self.numel() as u64 * self.dtype.size() as u64;
        let bytes = self.device().read(&arg, start, len).await?;
        Ok(bytemuck::pod_collect_to_vec(&bytes))
    }

    /// `item()`: the single value of a one-element tensor.
    pub async fn item<T: Element>(&self) -> Result<T> {
        if self.numel() != 1 {
            return Err(TensorError::Shape(format!("item() needs one element, the tensor has {}", self.numel())));
        }
        Ok(self.to_vec::<T>().await?[0])
    }
}
