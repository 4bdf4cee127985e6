//! tensormem: a tensor engine that makes GPU memory visible.
//!
//! Modules follow the data flow from the bottom up: `files` (writing files whole),
//! `trace` (pure data, snapshot formats), `alloc` (PyTorch's caching allocator,
//! device-agnostic), `report` (memory_stats and memory_summary), `replay` (feed a recorded
//! trace through the allocator and compare), `kernels` (WGSL generation), `device` (the
//! allocator and the GPU), `tensor` and `autograd` (ops and their graph), `amp` (autocast),
//! `nn` (layers, losses, optimizers and the gradient scaler), `scenarios` (named workloads),
//! `timeline` (a trace laid out for the page), `doctor` (what is wrong with a trace, each fix
//! verified by replay), `predict` (a program's memory at other sizes, from recordings at small
//! ones: align, fit, replay); `web` is the page's wasm-bindgen surface.

pub mod alloc;
pub mod amp;
pub mod autograd;
pub mod bench;
pub mod device;
pub mod doctor;
pub mod dtype;
pub mod files;
pub(crate) mod kernels;
pub mod nn;
pub mod predict;
pub mod replay;
pub mod report;
pub mod scenarios;
pub mod tensor;
pub mod timeline;
pub mod trace;
#[cfg(target_arch = "wasm32")]
pub mod web;

pub use device::{CudaCard, Device, DeviceError, GpuOptions, Multiprocessors, SimOptions};
/// The optimizers live with the layers (`nn::optim`), as DESIGN.md places them.
pub use nn::optim;
pub use tensor::{DType, Tensor, TensorError};
