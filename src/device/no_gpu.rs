//! Stands in for `gpu/` in a build without the `gpu` feature (no wgpu): the analysis and the
//! simulation device build alone. No GPU device can be opened, so these types have no values,
//! and every method on them is a match with no arms.

use super::tune::{MatmulClass, MatmulTuning};
use super::{AdapterSummary, Bindings, Device, DeviceError, GpuOptions};
use crate::alloc::SegmentSource;
use crate::dtype::DType;
use crate::kernels::matmul::MatmulKernel;
use crate::kernels::{Grid, Kernel, WgslStruct};

/// A segment's memory: none in this build. (Its field is private, so code elsewhere is not
/// told that it is unreachable: it is written for both builds.)
#[derive(Clone)]
pub(crate) struct Buffer(Never);

#[derive(Clone)]
enum Never {}

impl Buffer {
    pub(super) fn destroy(&self) {
        match self.0 {}
    }
}

pub(crate) enum GpuContext {}

pub enum GpuSegments {}

impl GpuContext {
    pub(super) async fn open(_: &GpuOptions) -> Result<(GpuContext, GpuSegments), DeviceError> {
        Err(DeviceError::NoAdapter("this build of tensormem has no GPU support (the `gpu` feature is off)".into()))
    }
    pub(super) fn summary(&self) -> &AdapterSummary {
        match *self {}
    }
    pub(super) fn staging_memory(&self) -> (u64, u64) {
        match *self {}
    }
    pub(super) fn copy_buffer(&self, _: u64) -> Buffer {
        match *self {}
    }
    pub(super) fn record_copy(&self, _: &Buffer, _: &Buffer, _: u64) {
        match *self {}
    }
    pub(super) fn submit(&self) {
        match *self {}
    }
    pub(super) async fn wait_idle(&self) -> Result<(), DeviceError> {
        match *self {}
    }
    pub(super) fn take_error(&self) -> Result<(), DeviceError> {
        match *self {}
    }
    pub(super) fn upload(&self, _: &Buffer, _: u64, _: &[u8]) {
        match *self {}
    }
    pub(super) async fn read(&self, _: &Buffer, _: u64, _: u64) -> Result<Vec<u8>, DeviceError> {
        match *self {}
    }
}

impl GpuSegments {
    pub(crate) fn buffer(&self, _: u64) -> Option<&Buffer> {
        match *self {}
    }
}

impl SegmentSource for GpuSegments {
    fn allocate(&mut self, _: u64) -> Option<u64> {
        match *self {}
    }
    fn free(&mut self, _: u64, _: u64) {
        match *self {}
    }
}

impl Device {
    /// Kernels run only on GPU devices, which this build cannot open.
    pub(crate) fn launch<M: WgslStruct>(&self, _: &Kernel, _: &M, _: &Bindings, _: Grid) -> Result<(), DeviceError> {
        Err(DeviceError::Unsupported("kernels run on GPU devices: this build has no GPU support".into()))
    }

    pub(crate) fn matmul_kernel_for(&self, class: MatmulClass) -> MatmulKernel {
        class.heuristic
    }

    /// The kernel `matmul` would use: the fixed rule (nothing can be measured in this build).
    pub fn matmul_kernel(&self, dtype: DType, m: usize, n: usize, k: usize) -> MatmulKernel {
        self.matmul_kernel_for(MatmulClass::contiguous(dtype, false, m, n, k))
    }

    pub async fn tune_matmul(&self, dtype: DType, m: usize, n: usize, k: usize) -> MatmulKernel {
        self.matmul_kernel(dtype, m, n, k)
    }

    pub async fn measure_matmul(&self, _: DType, _: usize, _: usize, _: usize, _: [bool; 2]) -> Result<MatmulTuning, DeviceError> {
        Err(DeviceError::Unsupported("matmul kernels are measured on GPU devices: this build has no GPU support".into()))
    }
}
