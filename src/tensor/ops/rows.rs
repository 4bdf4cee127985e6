//! Ops that walk one dimension per row: softmax, log_softmax, layer_norm, var, argmax, and the
//! backward kernels of the first three.

use super::{bind, check_u32, shape_meta, strided};
use crate::kernels::{Family, Grid, Kernel, RowsMeta, WORKGROUP};
use crate::tensor::autocast::{self as amp, Policy};
use crate::tensor::grad::not_differentiated_yet;
use crate::tensor::graph::{self, Save};
use crate::tensor::layout::wrap_dim;
use crate::tensor::{DType, Result, Tensor, TensorError};

/// A rows-family entry point.
#[derive(Clone, Copy, PartialEq, Eq)]
enum Rows {
    Softmax,
    LogSoftmax,
    LayerNorm,
    Variance,
    Argmax,
    SoftmaxBackward,
    LogSoftmaxBackward,
    LayerNormBackward,
    LayerNormWeightBackward,
    MaxDim,
    MaxBackward,
}

impl Rows {
    fn entry(self) -> &'static str {
        match self {
            Rows::Softmax => "softmax",
            Rows::LogSoftmax => "log_softmax",
            Rows::LayerNorm => "layer_norm",
            Rows::Variance => "variance",
            Rows::Argmax => "argmax",
            Rows::SoftmaxBackward => "softmax_backward",
            Rows::LogSoftmaxBackward => "log_softmax_backward",
            Rows::LayerNormBackward => "layer_norm_backward",
            Rows::LayerNormWeightBackward => "layer_norm_weight_backward",
            Rows::MaxDim => "max_dim",
            Rows::MaxBackward => "max_backward",
        }
    }
}

impl Tensor {
    /// Runs a rows kernel walking `dim` of self. `out` has self's shape, or self's with `dim`
    /// of size 1. `extras` are layer_norm's weight, bias, mean and rstd; backward kernels bind
    /// the incoming gradient (self's shape) where the bias goes.
    fn rows(&self, kind: Rows, out: &Tensor, dim: usize, param: f32, extras: &[&Tensor]) -> Result<()> {
        let device = self.device().clone();
        let n = self.shape()[dim];
        let mut operands: Vec<&Tensor> = vec![out, self];
        operands.extend(extras);
        // Checked before anything runs, so that the sim device refuses what the GPU refuses.
        if n == 0 && out.numel() > 0 {
            return Err(TensorError::Shape(match kind {
                Rows::Argmax | Rows::MaxDim => {
                    format!("{}(): Expected reduction dim {dim} to have non-zero size.", if kind == Rows::Argmax { "argmax" } else { "max" })
                }
                _ => format!("{} over an empty dimension", kind.entry()),
            }));
        }
        if !out.launches(&operands[1..], 0) {
            return Ok(());
        }
        for t in [self, out].into_iter().chain(extras.iter().copied()) {
            self.same_device(t)?;
            check_u32(t)?;
        }
        while operands.len() < 6 {
            operands.push(out);
        }
        let b = bind(&operands)?;
        let names = ["out", "a", "w", "b", "mean", "rstd"];
        let spec: Vec<(&str, DType)> = names.iter().zip(&operands).map(|(&n, t)| (n, t.dtype)).collect();
        let kernel = Kernel::new(Family::Rows, kind.entry()).with_meta::<RowsMeta>().with_operands(device.native_f16(), &b.plan, &spec)?;
        let mut row_shape = self.shape().to_vec();
        row_shape[dim] = 1;
        let rows = self.numel() / n;
        let mut out_layout = out.layout.clone();
        out_layout.shape = row_shape.clone();
        // Weight and bias are read along their last dimension; mean and rstd are contiguous.
        let vector = |i: usize| (b.plan.base(i) + operands[i].layout.offset as u32, operands[i].layout.strides.last().copied().unwrap_or(0) as u32);
        let ((w_offset, w_stride), (b_offset, b_stride)) = (vector(2), vector(3));
        let meta = RowsMeta {
            rows: rows as u32,
            ndim: self.ndim() as u32,
            shape: shape_meta(&row_shape),
            out: strided(&out_layout, b.plan.base(0)),
            a: strided(&self.layout, b.plan.base(1)),
            g: strided(&operands[3].layout, b.plan.base(3)),
            dim: dim as u32,
            n: n as u32,
            param,
            w_offset,
            w_stride,
            b_offset,
            b_stride,
            mean_offset: vector(4).0,
            rstd_offset: vector(5).0,
        };
        Ok(device.launch(&kernel, &meta, &b, Grid::Threads { threads: rows as u64, workgroup: WORKGROUP })?)
    }

    #[track_caller]
    fn along(&self, kind: Rows, dim: isize, dtype: DType) -> Result<Tensor> {
        self.float_only(kind.entry())?;
        if !dtype.is_float() {
            return Err(TensorError::DType(format!("{} into {dtype}: PyTorch requires a floating dtype", kind.entry())));
        }
        // As ATen: f16 to float32 is read directly (`half_to_float`); other conversions copy first.
        if dtype != self.dtype && !(self.dtype == DType::F16 && dtype == DType::F32) {
            return self.to(dtype)?.along(kind, dim, dtype);
        }
        let d = wrap_dim(dim, self.ndim())?;
        let input_dtype = self.dtype;
        let out = self.device().empty_tensor(self.shape(), dtype, kind.entry())?;
        self.rows(kind, &out, d, 0.0, &[])?;
        if !graph::records(&[self]) {
            return Ok(out);
        }
        // Both save their result; their backward kernels write one gradient.
        let (name, backward) = match kind {
            Rows::Softmax => ("SoftmaxBackward0", Rows::SoftmaxBackward),
            _ => ("LogSoftmaxBackward0", Rows::LogSoftmaxBackward),
        };
        Ok(graph::record(
            name,
            &[self],
            out,
            &[Some(Save::Output)],
            Box::new(move |saved, g| {
                let result = saved[0].as_ref().expect("saved");
                // In the input's type (`_softmax_backward_data(..., input_dtype)`).
                let grad = g.device().empty_tensor(g.shape(), input_dtype, backward.entry())?;
                // CUDA's softmax backward first computes `tmp = grad * output` into a
                // temporary, freed when it returns (log_softmax's reads grad directly). Here
                // the kernel needs no such buffer: only the allocation is PyTorch's.
                let tmp = match kind {
                    Rows::Softmax => Some(g.device().empty_tensor(g.shape(), if g.dtype() == result.dtype() { g.dtype() } else { DType::F32 }, "mul")?),
                    _ => None,
                };
                result.rows(backward, &grad, d, 0.0, &[&grad, g])?;
                drop(tmp);
                Ok(vec![Some(grad)])
            }),
        ))
    }

    /// `softmax(dim)`.
    #[track_caller]
    pub fn softmax(&self, dim: isize) -> Result<Tensor> {
        self.along_autocast(Rows::Softmax, dim)
    }

    /// `softmax(dim, dtype=...)`: the result in `dtype`.
    #[track_caller]
    pub fn softmax_to_dtype(&self, dim: isize, dtype: DType) -> Result<Tensor> {
        self.along(Rows::Softmax, dim, dtype)
    }

    /// `log_softmax(dim)`.
    #[track_caller]
    pub fn log_softmax(&self, dim: isize) -> Result<Tensor> {
        self.along_autocast(Rows::LogSoftmax, dim)
    }

    /// `log_softmax(dim, dtype=...)`: the result in `dtype`.
    #[track_caller]
    pub fn log_softmax_to_dtype(&self, dim: isize, dtype: DType) -> Result<Tensor> {
        self.along(Rows::LogSoftmax, dim, dtype)
    }

    /// softmax and log_softmax are on autocast's float32 list: their result is float32.
    #[track_caller]
    fn along_autocast(&self, kind: Rows, dim: isize) -> Result<Tensor> {
        match amp::fp32_output(self) {
            Some(_autocast_off) => self.along(kind, dim, DType::F32),
            None => self.along(kind, dim, self.dtype),
        }
    }

    /// `layer_norm` over the last dimension with weight and bias. As PyTorch's
    /// native_layer_norm it reads a contiguous input (a copy if it is not) and also writes the
    /// per-row mean and 1/std (float32, one value per row); autograd keeps them with the input
    /// for backward, otherwise they are freed on return.
    #[track_caller]
    pub fn layer_norm(&self, weight: &Tensor, bias: &Tensor, eps: f64) -> Result<Tensor> {
        if let Some((cast, _autocast_off)) = amp::cast_inputs(Policy::Fp32, &[self, weight, bias])? {
            return cast[0].layer_norm(&cast[1], &cast[2], eps);
        }
        self.float_only("layer_norm")?;
        let n = *self.shape().last().ok_or_else(|| TensorError::Shape("layer_norm of a 0-d tensor".into()))?;
        for (name, t) in [("weight", weight), ("bias", bias)] {
            if t.shape() != [n] || t.dtype != self.dtype {
                return Err(TensorError::Shape(format!("layer_norm {name} must be [{n}] {}, got {:?} {}", self.dtype, t.shape(), t.dtype)));
            }
        }
        let input = self.contiguous()?;
        let rows = self.numel() / n.max(1);
        let out = self.device().empty_tensor(self.shape(), self.dtype, "layer_norm")?;
        let mean = self.device().empty_tensor(&[rows], DType::F32, "layer_norm")?;
        let rstd = self.device().empty_tensor(&[rows], DType::F32, "layer_norm")?;
        input.rows(Rows::LayerNorm, &out, self.ndim() - 1, eps as f32, &[weight, bias, &mean, &rstd])?;
        if !graph::records(&[&input, weight, bias]) {
            return Ok(out);
        }
        let need = [input.requires_grad(), weight.requires_grad(), bias.requires_grad()];
        // As derivatives.yaml: input, weight, bias, and the mean and rstd (result1, result2).
        let save = [Some(Save::Input(&input)), Some(Save::Input(weight)), Some(Save::Input(&mean)), Some(Save::Input(&rstd)), Some(Save::Input(bias))];
        Ok(graph::record(
            "NativeLayerNormBackward0",
            &[&input, weight, bias],
            out,
            &save,
            Box::new(move |saved, g| {
                let [x, w, mean, rstd] = [0, 1, 2, 3].map(|i| saved[i].as_ref().expect("saved"));
                let g = g.contiguous()?;
                // As ATen: the input's gradient, then the weight's, then the bias's.
                let dx = if need[0] {
                    let dx = g.device().empty_tensor(x.shape(), x.dtype, "native_layer_norm_backward")?;
                    x.rows(Rows::LayerNormBackward, &dx, x.ndim() - 1, 0.0, &[w, &g, mean, rstd])?;
                    Some(dx)
                } else {
                    None
                };
                let features = w.numel();
                let dw = if need[1] {
                    let dw = g.device().empty_tensor(&[features], w.dtype, "native_layer_norm_backward")?;
                    // Walk each feature's column down the rows.
                    let (x2, g2) = (x.view(&[-1, features as isize])?, g.view(&[-1, features as isize])?);
                    x2.rows(Rows::LayerNormWeightBackward, &dw.view(&[1, features as isize])?, 0, 0.0, &[&dw, &g2, mean, rstd])?;
                    Some(dw)
                } else {
                    None
                };
                // ATen's gamma/beta kernel sums the bias's gradient itself: one [features]
                // result, no reduction scratch.
                let db = match g.ndim() {
                    _ if !need[2] => None,
                    1 => Some(g.clone()?),
                    ndim => Some(g.sum_inside(&(0..ndim as isize - 1).collect::<Vec<_>>(), "native_layer_norm_backward")?),
                };
                Ok(vec![dx, dw, db])
            }),
        ))
    }

    #[track_caller]
    fn reduce_rows(&self, kind: Rows, dim: isize, keepdim: bool, dtype: DType, param: f32) -> Result<Tensor> {
        let d = wrap_dim(dim, self.ndim())?;
        let mut shape = self.shape().to_vec();
        shape[d] = 1;
        let out = self.device().empty_tensor(&shape, dtype, kind.entry())?;
        self.rows(kind, &out, d, param, &[])?;
        if keepdim { Ok(out) } else { out.squeeze(Some(d as isize)) }
    }

    /// `var(dim, correction, keepdim)`: correction 1 is PyTorch's unbiased default.
    #[track_caller]
    pub fn var(&self, dim: isize, correction: f64, keepdim: bool) -> Result<Tensor> {
        self.float_only("var")?;
        not_differentiated_yet("var", &[self])?;
        let d = wrap_dim(dim, self.ndim())?;
        if self.shape()[d] == 0 {
            // The variance of nothing is NaN in PyTorch (with a warning), not an error.
            let mut shape = self.shape().to_vec();
            shape[d] = 1;
            let out = self.device().empty_tensor(&shape, self.dtype, Rows::Variance.entry())?;
            out.fill_(f64::NAN)?;
            return if keepdim { Ok(out) } else { out.squeeze(Some(d as isize)) };
        }
        self.reduce_rows(Rows::Variance, dim, keepdim, self.dtype, correction as f32)
    }

    /// `max(dim, keepdim)`: the values and their int64 indices (`torch.max(x, dim)`), in that
    /// order. `MaxBackward0` saves the indices.
    #[track_caller]
    pub fn max_dim(&self, dim: isize, keepdim: bool) -> Result<(Tensor, Tensor)> {
        let d = wrap_dim(dim, self.ndim())?;
        let mut shape = self.shape().to_vec();
        shape[d] = 1;
        let values = self.device().empty_tensor(&shape, self.dtype, "max")?;
        let indices = self.device().empty_tensor(&shape, DType::I64, "max")?;
        self.rows(Rows::MaxDim, &values, d, 0.0, &[&values, &values, &indices])?;
        let squeeze = |t: Tensor| if keepdim { Ok(t) } else { t.squeeze(Some(d as isize)) };
        let (values, indices) = (squeeze(values)?, squeeze(indices)?);
        if !graph::records(&[self]) {
            return Ok((values, indices));
        }
        let input_shape = self.shape().to_vec();
        let values = graph::record(
            "MaxBackward0",
            &[self],
            values,
            &[Some(Save::Input(&indices))],
            Box::new(move |saved, g| {
                let indices = saved[0].as_ref().expect("saved");
                let g = if keepdim { g.share() } else { g.unsqueeze(d as isize)? };
                let grad = g.device().empty_tensor(&input_shape, g.dtype, "value_selecting_reduction_backward")?;
                g.expand(&input_shape)?.rows(Rows::MaxBackward, &grad, d, 0.0, &[&grad, &grad, indices])?;
                Ok(vec![Some(grad)])
            }),
        );
        Ok((values, indices))
    }

    /// `argmax(dim, keepdim)`: int64 indices, as in PyTorch.
    #[track_caller]
    pub fn argmax(&self, dim: isize, keepdim: bool) -> Result<Tensor> {
        self.reduce_rows(Rows::Argmax, dim, keepdim, DType::I64, 0.0)
    }
}
