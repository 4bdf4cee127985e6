//! tensormem: a tensor engine that makes GPU memory visible.
//!
//! Modules follow the data flow from the bottom up (docs/layers.md, checked by
//! tests/layers.rs): `clock`, `units`, `files`, `dtype` and `trace` (pure data, snapshot formats), `alloc`
//! (PyTorch's caching allocator, device-agnostic), `report` (memory_stats and memory_summary),
//! `replay` (feed a recorded trace through the allocator and compare); the analysis:
//! `pytorch` (what PyTorch's frames say: phases, threads, module calls), `timeline` (a trace laid out for the page), `doctor` (what is wrong with a trace, each fix
//! verified by replay), `predict` (a program's memory at other sizes, from recordings at small
//! ones); the engine: `kernels` (WGSL generation), `device` (the allocator and the GPU, whose
//! wgpu side is the `gpu` feature), `autograd`, `tensor` (ops and their graph), `amp`
//! (autocast), `nn` (layers, losses, optimizers and the gradient scaler); `scenarios` (named
//! workloads); `web` is the page's wasm-bindgen surface.

pub mod alloc;
pub mod amp;
pub mod autograd;
pub mod bench;
pub mod cards;
mod clock;
pub mod device;
pub mod doctor;
pub mod dtype;
pub mod files;
// Without the `gpu` feature the ops still describe their kernels, but nothing compiles the WGSL.
#[cfg_attr(not(feature = "gpu"), allow(dead_code))]
pub(crate) mod kernels;
pub mod nn;
pub mod predict;
pub mod pytorch;
pub mod replay;
pub mod report;
pub mod scenarios;
pub mod tensor;
mod threads;
pub mod timeline;
pub mod trace;
pub mod units;
#[cfg(target_arch = "wasm32")]
pub mod web;

pub use device::{CudaCard, Device, DeviceError, GpuOptions, Multiprocessors, SimOptions};
/// The optimizers live with the layers (`nn::optim`), as torch.nn and torch.optim sit side by side.
pub use nn::optim;
pub use tensor::{DType, Tensor, TensorError};
