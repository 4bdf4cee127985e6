//! Dropout, from the device's counter-based generator (`rand` and `randn` are in `factory`).

use super::values;
use crate::kernels::WgslScalar;
use crate::kernels::elementwise::{Entry, Fused};
use crate::tensor::graph::{self, Save};
use crate::tensor::{DType, Result, Tensor, TensorError};

impl Tensor {
    /// `F.dropout(x, p, training)`. In training with 0 < p < 1 it is PyTorch's fused
    /// `native_dropout`: a bool mask (one byte per element) that autograd saves, then the output,
    /// in that order as `dropout_cuda` allocates them; otherwise the input itself, as PyTorch returns it.
    #[track_caller]
    pub fn dropout(&self, p: f64, training: bool) -> Result<Tensor> {
        if !(0.0..=1.0).contains(&p) {
            return Err(TensorError::Shape(format!("dropout probability has to be between 0 and 1, but got {p}")));
        }
        if !training || p == 0.0 || self.numel() == 0 {
            return Ok(self.share());
        }
        if p == 1.0 {
            // As ATen: a product with a zero-dimensional zeros tensor.
            return self.mul(&self.device().zeros(&[], self.dtype)?);
        }
        self.float_only("dropout")?;
        let scale = 1.0 / (1.0 - p);
        // Both `empty_like(self)`: in self's layout.
        let mask = self.device().empty_result(self.shape(), &[self], DType::Bool, "native_dropout")?;
        let out = self.device().empty_result(self.shape(), &[self], self.dtype, "native_dropout")?;
        mask.elementwise(Entry::Random(Fused::DropoutMask(p as f32).wgsl(WgslScalar::U32), self.device().next_seed()), &[], 0.0)?;
        out.masked_scale(self, &mask, scale)?;
        if !graph::records(&[self]) {
            return Ok(out);
        }
        Ok(graph::record(
            "NativeDropoutBackward0",
            &[self],
            out,
            &[Some(Save::Input(&mask))],
            Box::new(move |saved, g| {
                let mask = saved[0].as_ref().expect("saved");
                let grad = g.device().empty_result(g.shape(), &[g, mask], g.dtype, "native_dropout_backward")?;
                grad.masked_scale(g, mask, scale)?;
                Ok(vec![Some(grad)])
            }),
        ))
    }

    /// Writes `x * mask * scale` into self.
    fn masked_scale(&self, x: &Tensor, mask: &Tensor, scale: f64) -> Result<()> {
        let t = values(x.dtype, x.device())?;
        self.elementwise(Entry::Binary(Fused::MaskedScale.wgsl(t)), &[x, mask], scale)
    }
}
