//! Factory functions (PyTorch's creation ops: `torch.empty`, `zeros`, `ones`, `full`, `tensor`,
//! `arange`, `rand`, `randn`): the device methods that make tensors. The device itself is
//! below the tensor layer and knows nothing of tensors; these extend it from here.

use super::values;
use crate::device::Device;
use crate::kernels::WgslScalar;
use crate::kernels::elementwise::{Entry, Fused, Unary};
use crate::tensor::layout::{Layout, MAX_DIMS};
use crate::tensor::{Buffer, DType, Element, Result, Storage, Tensor, TensorError};
use std::cell::Cell;
use std::rc::Rc;

impl Device {
    /// A new uninitialised contiguous tensor: one allocation.
    #[track_caller]
    pub(crate) fn empty_tensor(&self, shape: &[usize], dtype: DType, op: &'static str) -> Result<Tensor> {
        self.empty_dense(Layout::contiguous(shape), dtype, op)
    }

    /// A new uninitialised tensor for an elementwise result over `operands`: laid out as
    /// TensorIterator lays it out (contiguous, or dense in the operands' order of dimensions).
    #[track_caller]
    pub(crate) fn empty_result(&self, shape: &[usize], operands: &[&Tensor], dtype: DType, op: &'static str) -> Result<Tensor> {
        let layouts: Vec<&Layout> = operands.iter().map(|t| t.layout()).collect();
        let layout = match Layout::result_order(shape, &layouts) {
            None => Layout::contiguous(shape),
            Some(order) => Layout::dense_in_order(shape, &order),
        };
        self.empty_dense(layout, dtype, op)
    }

    /// One allocation for a dense layout (every element once, no gaps).
    #[track_caller]
    fn empty_dense(&self, layout: Layout, dtype: DType, op: &'static str) -> Result<Tensor> {
        let shape = &layout.shape;
        if shape.len() > MAX_DIMS {
            return Err(TensorError::Shape(format!("{} dims; at most {MAX_DIMS} are supported", shape.len())));
        }
        let numel = shape.iter().try_fold(1u64, |acc, &n| acc.checked_mul(n as u64));
        let bytes = numel
            .and_then(|n| n.checked_mul(dtype.size() as u64))
            .ok_or_else(|| TensorError::Shape(format!("shape {shape:?} has more bytes than fit 64 bits")))?;
        // Element indices are usize: 32 bits in wasm, where a tensor is limited to 2^32 - 1
        // elements (16 GiB of f32; still room for a 7B model's largest weight).
        if numel.is_some_and(|n| usize::try_from(n).is_err()) {
            return Err(TensorError::Shape(format!("shape {shape:?} has more elements than this platform indexes ({})", usize::MAX)));
        }
        let block = if bytes == 0 { None } else { Some(self.allocate(bytes, op)?) };
        let storage = Storage { device: self.clone(), block, bytes, id: self.next_storage_id(), version: Cell::new(0) };
        Ok(Tensor::from_parts(Rc::new(storage), layout, dtype, false))
    }

    /// `bytes` of memory with no tensor over it (a communication bucket), freed when dropped.
    /// Counted in u64: a bucket of a whole model may hold more elements than a tensor indexes
    /// on a 32-bit platform.
    #[track_caller]
    pub(crate) fn buffer(&self, bytes: u64, op: &'static str) -> Result<Buffer> {
        let block = if bytes == 0 { None } else { Some(self.allocate(bytes, op)?) };
        Ok(Buffer(Rc::new(Storage { device: self.clone(), block, bytes, id: self.next_storage_id(), version: Cell::new(0) })))
    }

    /// A tensor with a shape and no memory: a deferred parameter, whose memory a sharding
    /// strategy holds elsewhere (the sim device computes with shapes only).
    pub(crate) fn unbacked(&self, shape: &[usize], dtype: DType) -> Result<Tensor> {
        let bytes = shape.iter().product::<usize>() as u64 * dtype.size() as u64;
        let storage = Storage { device: self.clone(), block: None, bytes, id: self.next_storage_id(), version: Cell::new(0) };
        Ok(Tensor::from_parts(Rc::new(storage), Layout::contiguous(shape), dtype, false))
    }

    /// `torch.empty`: allocates without writing (contents are whatever the block held).
    #[track_caller]
    pub fn empty(&self, shape: &[usize], dtype: DType) -> Result<Tensor> {
        self.empty_tensor(shape, dtype, "empty")
    }

    /// `torch.zeros`.
    #[track_caller]
    pub fn zeros(&self, shape: &[usize], dtype: DType) -> Result<Tensor> {
        self.full(shape, 0.0, dtype)
    }

    /// `torch.ones`.
    #[track_caller]
    pub fn ones(&self, shape: &[usize], dtype: DType) -> Result<Tensor> {
        self.full(shape, 1.0, dtype)
    }

    /// `torch.full`.
    #[track_caller]
    pub fn full(&self, shape: &[usize], value: f64, dtype: DType) -> Result<Tensor> {
        let t = self.empty_tensor(shape, dtype, "full")?;
        t.fill_(value)?;
        Ok(t)
    }

    /// `torch.tensor(data).reshape(shape)`: uploads host data.
    #[track_caller]
    pub fn from_slice<T: Element>(&self, data: &[T], shape: &[usize]) -> Result<Tensor> {
        let numel: usize = shape.iter().product();
        if numel != data.len() {
            return Err(TensorError::Shape(format!("{} values cannot fill shape {shape:?} ({numel} elements)", data.len())));
        }
        let t = self.empty_tensor(shape, T::DTYPE, "from_slice")?;
        // The sim device keeps shapes, not data: the upload is only its modelled cost.
        if t.launches(&[], 0)
            && let Some(arg) = t.arg()?
        {
            self.upload(&arg, bytemuck::cast_slice(data));
        }
        Ok(t)
    }

    /// `torch.arange(n)`.
    #[track_caller]
    pub fn arange(&self, n: usize, dtype: DType) -> Result<Tensor> {
        let t = self.empty_tensor(&[n], dtype, "arange")?;
        t.unary_into(&t, Unary::Index, 0.0)?;
        Ok(t)
    }

    /// `torch.rand`: uniform in [0, 1), from the device's counter-based generator.
    #[track_caller]
    pub fn rand(&self, shape: &[usize], dtype: DType) -> Result<Tensor> {
        self.random(shape, dtype, "rand", Fused::Uniform)
    }

    /// `torch.randn`: standard normal.
    #[track_caller]
    pub fn randn(&self, shape: &[usize], dtype: DType) -> Result<Tensor> {
        self.random(shape, dtype, "randn", Fused::Normal)
    }

    #[track_caller]
    fn random(&self, shape: &[usize], dtype: DType, op: &'static str, distribution: Fused) -> Result<Tensor> {
        if !dtype.is_float() {
            return Err(TensorError::DType(format!("{op} makes floating tensors, not {dtype}")));
        }
        let t = self.empty_tensor(shape, dtype, op)?;
        let out_t = values(dtype, self).or_else(|e| if self.is_sim() { Ok(WgslScalar::F32) } else { Err(e) })?;
        t.elementwise(Entry::Random(distribution.wgsl(out_t), self.next_seed()), &[], 0.0)?;
        Ok(t)
    }
}
