//! Random tensors from the device's counter-based generator.

use super::elementwise::Entry;
use super::values;
use crate::tensor::{DType, Result, Tensor, TensorError};

impl crate::device::Device {
    /// `torch.rand`: uniform in [0, 1), from the device's counter-based generator.
    #[track_caller]
    pub fn rand(&self, shape: &[usize], dtype: DType) -> Result<Tensor> {
        self.random(shape, dtype, "rand", "uniform(i, 0u)")
    }

    /// `torch.randn`: standard normal.
    #[track_caller]
    pub fn randn(&self, shape: &[usize], dtype: DType) -> Result<Tensor> {
        self.random(shape, dtype, "randn", "normal(i)")
    }

    #[track_caller]
    fn random(&self, shape: &[usize], dtype: DType, op: &'static str, expr: &str) -> Result<Tensor> {
        if !dtype.is_float() {
            return Err(TensorError::DType(format!("{op} makes floating tensors, not {dtype}")));
        }
        let t = self.empty_tensor(shape, dtype, op)?;
        let out_t = values(dtype, self).or_else(|e| if self.is_sim() { Ok("f32") } else { Err(e) })?;
        t.elementwise(Entry::Random(format!("{out_t}({expr})"), self.next_seed()), &[], 0.0)?;
        Ok(t)
    }
}
