//! Fused elementwise ops: one kernel (and at most one output) where the composite would take
//! several: `where`, `masked_fill` and its backward, the optimizers' in-place updates, the
//! gradient scaler's unscale. Their WGSL is in `kernels::elementwise` (`Fused`, `Update`).

use crate::kernels::elementwise::{Entry, Fused, Update};
use crate::tensor::graph::{self, Save};
use crate::tensor::layout::broadcast_shapes;
use crate::tensor::ops::values;
use crate::tensor::{DType, Result, Tensor, TensorError};

impl Tensor {
    /// `torch._amp_foreach_non_finite_check_and_unscale_` for one float32 gradient: multiplies
    /// it by `inv_scale` in place and sets `found_inf` to 1 if it holds an inf or a NaN (both
    /// 0-d float32). Allocates nothing.
    pub(crate) fn unscale_and_check_(&self, inv_scale: &Tensor, found_inf: &Tensor) -> Result<()> {
        for t in [self, inv_scale, found_inf] {
            if t.dtype != DType::F32 {
                return Err(TensorError::DType(format!("unscaling needs float32 gradients and scales, got {}", t.dtype)));
            }
        }
        if inv_scale.numel() != 1 || found_inf.numel() != 1 {
            return Err(TensorError::Shape("found_inf and inv_scale must be 1-element tensors".into()));
        }
        self.elementwise(Entry::Unscale, &[self, inv_scale, found_inf], 0.0)?;
        self.bump_version();
        found_inf.bump_version();
        Ok(())
    }

    /// `torch.where(self, a, b)`: `self` is a bool condition; all three broadcast.
    #[track_caller]
    pub fn where_(&self, a: &Tensor, b: &Tensor) -> Result<Tensor> {
        if self.dtype != DType::Bool {
            return Err(TensorError::DType(format!("where needs a bool condition, got {}", self.dtype)));
        }
        if a.dtype != b.dtype {
            return Err(TensorError::DType(format!("where of {} and {}", a.dtype, b.dtype)));
        }
        let shape = broadcast_shapes(&broadcast_shapes(self.shape(), a.shape())?, b.shape())?;
        let out = self.device().empty_result(&shape, &[self, a, b], a.dtype, "where")?;
        out.elementwise(Entry::Ternary(Fused::WHERE.into()), &[self, a, b], 0.0)?;
        if !graph::records(&[a, b]) {
            return Ok(out);
        }
        // WhereBackward0 saves the condition; each side's gradient is where(condition, grad, 0)
        // (or the other way round), summed back to its shape by the engine.
        let need = [a.requires_grad(), b.requires_grad()];
        Ok(graph::record(
            "WhereBackward0",
            &[a, b],
            out,
            &[Some(Save::Input(self))],
            Box::new(move |saved, g| {
                let cond = saved[0].as_ref().expect("saved");
                // `where(condition, grad, 0)`: ATen wraps the 0 in a 0-d tensor on the device
                // first, freed when where returns.
                let side = |kept_where: bool| {
                    let zero = g.device().empty_tensor(&[], g.dtype(), "scalar_tensor")?;
                    let side = g.kept_where(cond, kept_where, "where");
                    drop(zero);
                    side
                };
                // `other` before `self`, as the generated node orders them; the engine sums each
                // back to its input's shape (validate_outputs).
                let gb = need[1].then(|| side(false)).transpose()?;
                let ga = need[0].then(|| side(true)).transpose()?;
                Ok(vec![ga, gb])
            }),
        ))
    }

    /// `masked_fill(mask, value)`: self where the bool `mask` (broadcast) is false, `value`
    /// where it is true; one output. `MaskedFillBackward0` saves the mask.
    #[track_caller]
    pub fn masked_fill(&self, mask: &Tensor, value: f64) -> Result<Tensor> {
        if mask.dtype != DType::Bool {
            return Err(TensorError::DType(format!("masked_fill only supports boolean masks, but got mask with dtype {}", mask.dtype)));
        }
        let shape = broadcast_shapes(self.shape(), mask.shape())?;
        if shape != self.shape() {
            return Err(TensorError::Shape(format!("masked_fill: mask {:?} does not broadcast to {:?}", mask.shape(), self.shape())));
        }
        let t = values(self.dtype, self.device())?;
        let out = self.device().empty_result(self.shape(), &[self], self.dtype, "masked_fill")?;
        out.elementwise(Entry::Binary(Fused::MaskedFill.wgsl(t)), &[self, mask], value)?;
        if !graph::records(&[self]) {
            return Ok(out);
        }
        Ok(graph::record(
            "MaskedFillBackward0",
            &[self],
            out,
            &[Some(Save::Input(mask))],
            Box::new(move |saved, g| Ok(vec![Some(g.kept_where(saved[0].as_ref().expect("saved"), false, "masked_fill")?)])),
        ))
    }

    /// Self (a gradient) where the bool `mask` is `kept_where`, zero elsewhere: the backward of
    /// where (`where(cond, grad, 0)` and `where(cond, 0, grad)`) and of masked_fill
    /// (`grad.masked_fill(mask, 0)`). One output.
    #[track_caller]
    fn kept_where(&self, mask: &Tensor, kept_where: bool, op: &'static str) -> Result<Tensor> {
        let t = values(self.dtype, self.device())?;
        let out = self.device().empty_result(self.shape(), &[self, mask], self.dtype, op)?;
        out.elementwise(Entry::Binary(Fused::KeptWhere(kept_where).wgsl(t)), &[self, mask], 0.0)?;
        Ok(out)
    }

    /// An in-place ternary update `self = expr(self, y, z, s)` (optimizer steps), which no
    /// graph tracks.
    fn update_(&self, update: Update, y: &Tensor, z: &Tensor, value: f64) -> Result<&Tensor> {
        let (op, expr) = update.decl();
        if y.dtype != self.dtype || z.dtype != self.dtype || !self.dtype.is_float() {
            return Err(TensorError::DType(format!("{op} of {}, {} and {}", self.dtype, y.dtype, z.dtype)));
        }
        self.check_inplace(op, &[y, z], false)?;
        self.elementwise(Entry::Ternary(expr.into()), &[self, y, z], value)?;
        self.bump_version();
        Ok(self)
    }

    /// `add_(other, alpha=value)`: self += value * other, in place, with no temporary.
    pub fn add_scaled_(&self, other: &Tensor, value: f64) -> Result<&Tensor> {
        self.update_(Update::Add, other, other, value)
    }

    /// `add(other, alpha=value)`: self + value * other in one new tensor (the optimizers' coupled
    /// weight decay, `grad.add(param, alpha=weight_decay)`), with no temporary.
    #[track_caller]
    pub fn add_scaled(&self, other: &Tensor, value: f64) -> Result<Tensor> {
        let (_, expr) = Update::Add.decl();
        if other.dtype != self.dtype || !self.dtype.is_float() {
            return Err(TensorError::DType(format!("add of {} and {}", self.dtype, other.dtype)));
        }
        let out = self.device().empty_result(&broadcast_shapes(self.shape(), other.shape())?, &[self, other], self.dtype, "add")?;
        out.elementwise(Entry::Ternary(expr.into()), &[self, other, other], value)?;
        Ok(out)
    }

    /// `lerp_(end, weight)`: self += weight * (end - self), in place (Adam's first moment).
    pub fn lerp_(&self, end: &Tensor, weight: f64) -> Result<&Tensor> {
        self.update_(Update::Lerp, end, end, weight)
    }

    /// `addcdiv_(t1, t2, value)`: self += value * t1 / t2, in place.
    pub fn addcdiv_(&self, t1: &Tensor, t2: &Tensor, value: f64) -> Result<&Tensor> {
        self.update_(Update::Addcdiv, t1, t2, value)
    }

    /// `addcmul_(t1, t2, value)`: self += value * t1 * t2, in place.
    pub fn addcmul_(&self, t1: &Tensor, t2: &Tensor, value: f64) -> Result<&Tensor> {
        self.update_(Update::Addcmul, t1, t2, value)
    }
}
