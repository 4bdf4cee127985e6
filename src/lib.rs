//! tensormem: a tensor engine that makes GPU memory visible.
//!
//! Modules follow the data flow from the bottom up: `trace` (pure data, snapshot formats),
//! `alloc` (PyTorch's caching allocator, device-agnostic), `report` (memory_stats and
//! memory_summary), `replay` (feed a recorded trace through the allocator and compare),
//! `scenarios` (named workloads).

pub mod alloc;
pub mod replay;
pub mod report;
pub mod scenarios;
pub mod trace;
