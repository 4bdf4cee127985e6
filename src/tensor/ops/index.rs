//! Ops that gather or place slices: cat, stack, index_select, embedding, nll_loss, and their
//! backward.

use super::{bind, check_u32, cuda_embedding, shape_meta, strided, values};
use crate::kernels::ElementwiseMeta;
use crate::kernels::elementwise::{ElementwiseKernel, Entry, Fused};
use crate::tensor::autocast::{self as amp, Policy};
use crate::tensor::graph::{self, Save};
use crate::tensor::layout::{Layout, wrap_dim};
use crate::tensor::{DType, Result, Tensor, TensorError};

impl Tensor {
    /// `torch.cat(tensors, dim)`: one output allocation; each input is copied into its slice.
    /// Its backward saves nothing: each input's gradient is a slice (a view) of the output's.
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
        let out = first.device().empty_tensor(&shape, first.dtype, "cat")?;
        let mut starts = Vec::with_capacity(tensors.len());
        {
            let _no_grad = graph::no_grad();
            let mut at = 0;
            for t in tensors {
                out.narrow(d as isize, at, t.shape()[d])?.copy_(t)?;
                starts.push((at, t.shape()[d]));
                at += t.shape()[d];
            }
        }
        if !graph::records(tensors) {
            return Ok(out);
        }
        Ok(graph::record(
            "CatBackward0",
            tensors,
            out,
            &[],
            Box::new(move |_, g| starts.iter().map(|&(at, len)| g.narrow(d as isize, at, len).map(Some)).collect()),
        ))
    }

    /// `torch.stack(tensors, dim)`: cat of unsqueezed views (no extra memory).
    #[track_caller]
    pub fn stack(tensors: &[&Tensor], dim: isize) -> Result<Tensor> {
        let ndim = tensors.first().map_or(0, |t| t.ndim()) + 1;
        let d = wrap_dim(dim, ndim)? as isize;
        let views = tensors.iter().map(|t| t.unsqueeze(d)).collect::<Result<Vec<_>>>()?;
        Tensor::cat(&views.iter().collect::<Vec<_>>(), d)
    }

    /// `index_select(dim, index)`: `index` is a 1-D int64 or int32 tensor. Its backward saves
    /// the index and sums the gradient's slices into zeros of the input's shape.
    #[track_caller]
    pub fn index_select(&self, dim: isize, index: &Tensor) -> Result<Tensor> {
        let out = self.select_rows(dim, index)?;
        Ok(self.record_index("IndexSelectBackward0", wrap_dim(dim, self.ndim())?, index, out))
    }

    /// `F.embedding(ids, weight)`: rows of `self` (the weight) picked by `ids` of any shape.
    /// `EmbeddingBackward0` saves the ids.
    #[track_caller]
    pub fn embedding(&self, ids: &Tensor) -> Result<Tensor> {
        if self.ndim() != 2 {
            return Err(TensorError::Shape(format!("embedding weight must be 2-D, got {:?}", self.shape())));
        }
        let flat = ids.reshape(&[-1])?;
        let rows = self.select_rows(0, &flat)?;
        let mut shape: Vec<isize> = ids.shape().iter().map(|&n| n as isize).collect();
        shape.push(self.shape()[1] as isize);
        let out = rows.view(&shape)?;
        Ok(self.record_index("EmbeddingBackward0", 0, &flat, out))
    }

    /// `F.nll_loss(self, target)` with `reduction="mean"`: self holds log-probabilities
    /// [N, classes], `target` int64 class indices [N]; rows whose target is -100 (PyTorch's
    /// `ignore_index`) are left out. As ATen's `nll_loss_forward` it writes two 0-d tensors,
    /// the loss and `total_weight` (the rows counted), and `NllLossBackward0` saves self, the
    /// target and total_weight. On autocast's float32 list: f16 log-probabilities are copied
    /// to f32 first, and the copy is what backward keeps.
    #[track_caller]
    pub fn nll_loss(&self, target: &Tensor) -> Result<Tensor> {
        if let Some((cast, _autocast_off)) = amp::cast_inputs(Policy::Fp32, &[self, target])? {
            return cast[0].nll_loss(&cast[1]);
        }
        self.float_only("nll_loss")?;
        let &[n, classes] = self.shape() else {
            return Err(TensorError::Shape(format!("nll_loss expects [N, classes] input, got {:?} (flatten the batch first)", self.shape())));
        };
        if target.ndim() != 1 || target.dtype != DType::I64 {
            return Err(TensorError::Shape(format!("nll_loss expects a 1-D int64 target, got {:?} {}", target.shape(), target.dtype)));
        }
        if target.shape()[0] != n {
            return Err(TensorError::Shape(format!("Expected input batch_size ({n}) to match target batch_size ({}).", target.shape()[0])));
        }
        if classes == 0 {
            return Err(TensorError::Shape("nll_loss of an input with no classes".into()));
        }
        self.same_device(target)?;
        let out = self.device().empty_tensor(&[], self.dtype, "nll_loss")?;
        let total_weight = self.device().empty_tensor(&[], self.dtype, "nll_loss")?;
        // It reads the targets and one log-probability per row (as many bytes as the targets,
        // for float32): the sim device's clock counts the targets twice.
        if out.launches(&[target, target], 0) {
            out.indexed("nll_loss", self, target, &total_weight, classes, n)?;
        }
        if !graph::records(&[self]) {
            return Ok(out);
        }
        // (total_weight is the forward's second output; Save::Input keeps any tensor as it is.)
        let saves = [Some(Save::Input(self)), Some(Save::Input(target)), Some(Save::Input(&total_weight))];
        Ok(graph::record(
            "NllLossBackward0",
            &[self],
            out,
            &saves,
            Box::new(move |saved, g| {
                let [Some(input), Some(target), Some(total_weight)] = saved else { unreachable!("NllLossBackward0 saves three tensors") };
                Ok(vec![Some(g.nll_loss_backward(input.shape(), target, total_weight)?)])
            }),
        ))
    }

    /// `nll_loss_backward` of the 0-d gradient `self`: as ATen's, one [N, classes] tensor, zero
    /// except -grad / total_weight at each counted row's target.
    #[track_caller]
    fn nll_loss_backward(&self, shape: &[usize], target: &Tensor, total_weight: &Tensor) -> Result<Tensor> {
        let out = self.device().empty_tensor(shape, self.dtype, "nll_loss_backward")?;
        let t = values(self.dtype, self.device())?;
        out.elementwise(Entry::Ternary(Fused::NllLossBackward.wgsl(t)), &[&target.view(&[-1, 1])?, self, total_weight], shape[1] as f64)?;
        Ok(out)
    }

    /// `torch.gather(self, dim, index)`: out[p] = self[p with p[dim] = index[p]], shaped as the
    /// int64 `index` (which must match self outside `dim`). `GatherBackward0` saves self (for
    /// its shape, but the whole tensor stays alive) and the index.
    #[track_caller]
    pub fn gather(&self, dim: isize, index: &Tensor) -> Result<Tensor> {
        let d = wrap_dim(dim, self.ndim())?;
        let matches = index.ndim() == self.ndim() && (0..self.ndim()).all(|i| i == d || index.shape()[i] == self.shape()[i]);
        if index.dtype != DType::I64 || !matches {
            return Err(TensorError::Shape(format!(
                "gather along dim {d} needs an int64 index shaped as {:?} outside that dim, got {:?} {}",
                self.shape(),
                index.shape(),
                index.dtype
            )));
        }
        self.same_device(index)?;
        let out = self.device().empty_tensor(index.shape(), self.dtype, "gather")?;
        if out.launches(&[index, &out], 0) {
            if self.shape()[d] == 0 {
                return Err(TensorError::Shape("gather from an empty dimension".into()));
            }
            out.indexed("gather", self, index, &out, d, self.shape()[d])?;
        }
        if !graph::records(&[self]) {
            return Ok(out);
        }
        Ok(graph::record(
            "GatherBackward0",
            &[self],
            out,
            &[Some(Save::Input(self)), Some(Save::Input(index))],
            Box::new(move |saved, g| {
                let [Some(input), Some(index)] = saved else { unreachable!("GatherBackward0 saves two tensors") };
                Ok(vec![Some(g.scatter_add_to_zeros("scatter_add", d, index, input.shape())?)])
            }),
        ))
    }

    /// Records an op whose output holds `self`'s slices along `dim` picked by `index`.
    #[track_caller]
    fn record_index(&self, name: &'static str, dim: usize, index: &Tensor, out: Tensor) -> Tensor {
        if !graph::records(&[self]) {
            return out;
        }
        let (shape, flat) = (self.shape().to_vec(), out.shape().len() != self.ndim());
        graph::record(
            name,
            &[self],
            out,
            &[Some(Save::Input(index))],
            Box::new(move |saved, g| {
                let index = saved[0].as_ref().expect("saved");
                // Embedding's gradient comes shaped as the ids plus a feature dimension.
                if flat {
                    return Ok(vec![Some(g.reshape(&[-1, shape[1] as isize])?.embedding_dense_backward(index, &shape)?)]);
                }
                Ok(vec![Some(g.scatter_add_to_zeros("index_select_backward", dim, &index.spread(dim, g.shape()), &shape)?)])
            }),
        )
    }

    /// The rows of self picked along `dim` by the 1-D `index`, in a new tensor.
    #[track_caller]
    fn select_rows(&self, dim: isize, index: &Tensor) -> Result<Tensor> {
        if index.ndim() != 1 || !matches!(index.dtype, DType::I64 | DType::I32) {
            return Err(TensorError::Shape(format!("index_select needs a 1-D int64 index, got {:?} {}", index.shape(), index.dtype)));
        }
        let d = wrap_dim(dim, self.ndim())?;
        let mut shape = self.shape().to_vec();
        shape[d] = index.numel();
        let out = self.device().empty_tensor(&shape, self.dtype, "index_select")?;
        self.same_device(index)?;
        // It reads the index and only the selected rows: as many bytes as it writes.
        if !out.launches(&[index, &out], 0) {
            return Ok(out);
        }
        if self.shape()[d] == 0 {
            return Err(TensorError::Shape("index_select from an empty dimension".into()));
        }
        out.indexed("gather", self, &index.spread(d, &shape), &out, d, self.shape()[d])?;
        Ok(out)
    }

    /// A 1-D index as a view of `shape`: its values along `dim`, repeated (stride 0) along the
    /// other dims, the form the gather and scatter_add kernels read.
    fn spread(&self, dim: usize, shape: &[usize]) -> Tensor {
        let mut strides = vec![0; shape.len()];
        strides[dim] = self.layout.strides[0];
        self.view_with(Layout { shape: shape.to_vec(), strides, offset: self.layout.offset })
    }

    /// `embedding_dense_backward`: self, the gradient of the picked rows [ids, features], summed
    /// into zeros of the table's `shape` at the rows `ids` name. Where the device models a CUDA
    /// card, past 3072 ids the allocations of PyTorch's sorting kernel come around the result's,
    /// in its order (see [`cuda_embedding`]); the sum itself is one scatter-add either way.
    #[track_caller]
    fn embedding_dense_backward(&self, ids: &Tensor, shape: &[usize]) -> Result<Tensor> {
        const OP: &str = "embedding_dense_backward";
        let n = ids.numel();
        let device = self.device();
        if device.cuda_card().is_none() || n <= cuda_embedding::UNSORTED_IDS {
            return self.scatter_add_to_zeros(OP, 0, &ids.spread(0, self.shape()), shape);
        }
        // (No closures: they would hide the caller's location from the trace.) Locals drop in
        // reverse order, as the C++ destructors run.
        let (id, u8, i64) = (ids.dtype, DType::U8, DType::I64);
        let sorted_ids = device.empty_tensor(&[n], id, OP)?;
        let positions = device.empty_tensor(&[n], id, OP)?;
        let range = device.empty_tensor(&[n], id, OP)?;
        drop(device.empty_tensor(&[cuda_embedding::radix_sort_pairs_temp(n as u64, id.size() as u64) as usize], u8, OP)?);
        drop(range);
        let grad_weight = self.scatter_add_to_zeros(OP, 0, &ids.spread(0, self.shape()), shape)?;
        let scratch = cuda_embedding::SegmentScratch::new(n, shape[0]);
        let segment_offsets = device.empty_tensor(&[n], id, OP)?;
        let segments = device.empty_tensor(&[], i64, OP)?;
        let unique_ids = device.empty_tensor(&[n], id, OP)?;
        drop(device.empty_tensor(&[cuda_embedding::unique_by_key_temp(n as u64) as usize], u8, OP)?);
        drop(unique_ids);
        let partials_per_segment = device.empty_tensor(&[scratch.max_segments], id, OP)?;
        let partials_offsets = device.empty_tensor(&[scratch.max_segments], id, OP)?;
        drop(device.empty_tensor(&[cuda_embedding::exclusive_sum_temp(scratch.max_segments as u64) as usize], u8, OP)?);
        let partial_segments = device.empty_tensor(&[], i64, OP)?;
        let partial_segment_offsets = device.empty_tensor(&[scratch.max_partial_segments], id, OP)?;
        // Partial sums in the accumulator's type: f32 for f16 and bf16 gradients.
        let acc = if matches!(self.dtype, DType::F16 | DType::BF16) { DType::F32 } else { self.dtype };
        drop(device.empty_tensor(&[scratch.max_partial_segments, shape[1]], acc, OP)?);
        drop((partial_segment_offsets, partial_segments, partials_offsets, partials_per_segment, segments, segment_offsets, positions, sorted_ids));
        Ok(grad_weight)
    }

    /// `gather_backward` and `index_select_backward`: zeros of `shape` with self's elements
    /// summed in where `index` (self's shape) points along `dim`. One allocation: the kernel
    /// writes every element, summing the matching ones.
    #[track_caller]
    fn scatter_add_to_zeros(&self, op: &'static str, dim: usize, index: &Tensor, shape: &[usize]) -> Result<Tensor> {
        let out = self.device().empty_tensor(shape, self.dtype, op)?;
        if out.launches(&[self, index], 0) {
            out.indexed("scatter_add", self, index, &out, dim, self.shape()[dim])?;
        }
        Ok(out)
    }

    /// Runs an index kernel (`gather`, `scatter_add`, `nll_loss`) writing self (and `c`, which
    /// is self when the entry writes nothing else) from `a` and the 1-D `index`; `scalar` is
    /// the dimension indexed (the class count for nll_loss), `limit` the kernel's bound (the
    /// source's length, or the index's).
    fn indexed(&self, entry: &'static str, a: &Tensor, index: &Tensor, c: &Tensor, scalar: usize, limit: usize) -> Result<()> {
        for t in [a, index, c, self] {
            check_u32(t)?;
        }
        let device = self.device().clone();
        let operands = [self, a, index, c];
        let b = bind(&operands)?;
        let kernel = ElementwiseKernel::indexing(entry, [self.dtype, a.dtype, index.dtype, c.dtype], device.native_f16(), &b.plan)?;
        let meta = ElementwiseMeta {
            numel: self.numel() as u32,
            ndim: self.ndim() as u32,
            shape: shape_meta(self.shape()),
            out: strided(&self.layout, b.plan.base(0)),
            a: strided(&a.layout, b.plan.base(1)),
            b: strided(&index.layout, b.plan.base(2)),
            c: strided(&c.layout, b.plan.base(3)),
            scalar: scalar as u32,
            seed: 0,
            limit: limit as u32,
        };
        device.launch(&kernel, &meta, &b, ElementwiseKernel::grid(self.numel(), false))?;
        Ok(())
    }
}
