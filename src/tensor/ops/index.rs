//! Ops that gather or place slices: cat, stack, index_select, embedding.

use super::{bind, check_u32, shape_meta, strided, values};
use crate::kernels::{ELEMENTWISE_WORKGROUP, ElementwiseMeta, Family, Grid, Kernel};
use crate::tensor::grad::not_differentiated_yet;
use crate::tensor::layout::wrap_dim;
use crate::tensor::{DType, Result, Tensor, TensorError};

impl Tensor {
    /// `torch.cat(tensors, dim)`: one output allocation; each input is copied into its slice.
    #[track_caller]
    pub fn cat(tensors: &[&Tensor], dim: isize) -> Result<Tensor> {
        let first = *tensors.first().ok_or_else(|| TensorError::Shape("cat of no tensors".into()))?;
        let d = wrap_dim(dim, first.ndim())?;
        let mut shape = first.shape().to_vec();
        shape[d] = 0;
        for t in tensors {
            first.same_device(t)?;
            let same = t.ndim() == first.ndim() && (0..t.ndim()).all(|i| i == d || t.shape()[i] == first.shape()[i]);
            if !same || t.dtype != first.dtype {
                return Err(TensorError::Shape(format!(
                    "cat: {:?} {} does not match {:?} {} outside dimension {d}",
                    t.shape(),
                    t.dtype,
                    first.shape(),
                    first.dtype
                )));
            }
            shape[d] += t.shape()[d];
        }
        not_differentiated_yet("cat", tensors)?;
        let out = first.device().empty_tensor(&shape, first.dtype, "cat")?;
        let mut at = 0;
        for t in tensors {
            out.narrow(d as isize, at, t.shape()[d])?.copy_(t)?;
            at += t.shape()[d];
        }
        Ok(out)
    }

    /// `torch.stack(tensors, dim)`: cat of unsqueezed views (no extra memory).
    #[track_caller]
    pub fn stack(tensors: &[&Tensor], dim: isize) -> Result<Tensor> {
        let ndim = tensors.first().map_or(0, |t| t.ndim()) + 1;
        let d = wrap_dim(dim, ndim)? as isize;
        let views = tensors.iter().map(|t| t.unsqueeze(d)).collect::<Result<Vec<_>>>()?;
        Tensor::cat(&views.iter().collect::<Vec<_>>(), d)
    }

    /// `index_select(dim, index)`: `index` is a 1-D int64 or int32 tensor.
    #[track_caller]
    pub fn index_select(&self, dim: isize, index: &Tensor) -> Result<Tensor> {
        if index.ndim() != 1 || !matches!(index.dtype, DType::I64 | DType::I32) {
            return Err(TensorError::Shape(format!("index_select needs a 1-D int64 index, got {:?} {}", index.shape(), index.dtype)));
        }
        let d = wrap_dim(dim, self.ndim())?;
        let mut shape = self.shape().to_vec();
        shape[d] = index.numel();
        not_differentiated_yet("index_select", &[self])?;
        let out = self.device().empty_tensor(&shape, self.dtype, "index_select")?;
        let device = self.device().clone();
        self.same_device(index)?;
        // It reads the index and only the selected rows: as many bytes as it writes.
        if !out.launches(&[index, &out], 0) {
            return Ok(out);
        }
        if self.shape()[d] == 0 {
            return Err(TensorError::Shape("index_select from an empty dimension".into()));
        }
        for t in [self, index, &out] {
            check_u32(t)?;
        }
        let operands = [&out, self, index, &out];
        let b = bind(&operands)?;
        let spec = [("out", self.dtype), ("a", self.dtype), ("b", index.dtype), ("c", self.dtype)];
        let out_t = values(self.dtype, &device)?;
        let kernel = Kernel::new(Family::Elementwise, "gather")
            .with_meta::<ElementwiseMeta>()
            .with_operands(device.native_f16(), &b.plan, &spec)?
            .with("SCALAR", "info.scalar")
            .with("UNARY", format!("{out_t}(x)"))
            .with("BINARY", format!("{out_t}(x)"))
            .with("TERNARY", format!("{out_t}(x)"))
            .with("FILL", format!("{out_t}(s)"));
        let meta = ElementwiseMeta {
            numel: out.numel() as u32,
            ndim: out.ndim() as u32,
            shape: shape_meta(&shape),
            out: strided(&out.layout, b.plan.base(0)),
            a: strided(&self.layout, b.plan.base(1)),
            b: strided(&index.layout, b.plan.base(2)),
            c: strided(&out.layout, b.plan.base(0)),
            // The selected dimension, and its length (indices are clamped into it).
            scalar: d as u32,
            seed: 0,
            limit: self.shape()[d] as u32,
        };
        device.launch(&kernel, &meta, &b, Grid::Threads { threads: out.numel() as u64, workgroup: ELEMENTWISE_WORKGROUP })?;
        Ok(out)
    }

    /// `F.embedding(ids, weight)`: rows of `self` (the weight) picked by `ids` of any shape.
    #[track_caller]
    pub fn embedding(&self, ids: &Tensor) -> Result<Tensor> {
        if self.ndim() != 2 {
            return Err(TensorError::Shape(format!("embedding weight must be 2-D, got {:?}", self.shape())));
        }
        let flat = ids.reshape(&[-1])?;
        let rows = self.index_select(0, &flat)?;
        let mut shape: Vec<isize> = ids.shape().iter().map(|&n| n as isize).collect();
        shape.push(self.shape()[1] as isize);
        rows.view(&shape)
    }
}
