//! The caching allocator: PyTorch's native CUDA caching allocator rules, device-agnostic.
//!
//! Segments come from a [`SegmentSource`] (a GPU buffer each, or a virtual address range); blocks
//! are handed out as (segment, offset, size). History is recorded as `trace` entries.

mod caching;
mod config;
pub mod constants;
mod history;
mod index;
mod oom;
mod source;
mod stats;

pub use crate::units::format_size;
pub use caching::{
    AllocError, Allocation, CachingAllocator, DEFAULT_POOL, PoolFilter, PoolId, Stream, allocation_size, round_size, roundup_power2_next_division,
};
pub use config::{AllocatorConfig, ConfigError, ROUNDUP_INTERVALS};
pub use history::{History, MODELLED_EPOCH_US, RecordContext, TimeSource};
pub use oom::OutOfMemoryError;
pub use source::{SegmentSource, VIRTUAL_BASE, VirtualSegments};
pub use stats::{DeviceStats, Stat, StatArray, StatType};

/// The allocator over virtual segments: the simulation device, tests and replay.
pub type VirtualAllocator = CachingAllocator<VirtualSegments>;

impl VirtualAllocator {
    pub fn virtual_with(config: AllocatorConfig) -> VirtualAllocator {
        CachingAllocator::new(config, VirtualSegments::default())
    }
}
