//! The operands of a kernel launch as the tensor layer hands them to the device: each tensor's
//! segment buffer, offset and size, and how they bind. In every build; without the `gpu`
//! feature no buffer exists, so none is ever made.

use super::gpu::Buffer;
use super::{Device, DeviceError};
use crate::kernels::BindingPlan;

/// A tensor's bytes: its segment's buffer, the block's offset in it and a size.
#[derive(Clone)]
pub(crate) struct Arg {
    pub buffer: Buffer,
    pub segment: u64,
    pub offset: u64,
    pub size: u64,
}

/// The operands of one dispatch: where they bind (see [`BindingPlan`]) and the buffer behind
/// each binding.
pub(crate) struct Bindings {
    pub plan: BindingPlan,
    #[cfg_attr(not(feature = "gpu"), allow(dead_code))]
    pub(super) buffers: Vec<Buffer>,
}

impl Bindings {
    pub fn new(operands: &[Arg], element_sizes: &[u64]) -> Result<Bindings, DeviceError> {
        let spans: Vec<(u64, u64, u64)> = operands.iter().map(|a| (a.segment, a.offset, a.size)).collect();
        let plan = BindingPlan::new(&spans, element_sizes)?;
        let buffers = plan
            .ranges
            .iter()
            .map(|&(segment, ..)| operands.iter().find(|a| a.segment == segment).expect("a range is some operand's").buffer.clone())
            .collect();
        Ok(Bindings { plan, buffers })
    }
}

impl Device {
    /// Whether kernels may use f16 in registers (the adapter has `shader-f16`).
    pub(crate) fn native_f16(&self) -> bool {
        self.adapter().is_some_and(|a| a.native_f16)
    }
}
