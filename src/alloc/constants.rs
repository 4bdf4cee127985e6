//! The allocator's size constants (reference 1.1).

/// Every request is rounded up to a multiple of this, and to at least this.
pub const MIN_BLOCK_SIZE: u64 = 512;
/// Largest "small" request: rounded sizes up to 1 MiB go to the small pool.
pub const SMALL_SIZE: u64 = 1 << 20;
/// Segment size of the small pool (and its expandable page size).
pub const SMALL_BUFFER: u64 = 2 << 20;
/// Segment size for 1-10 MiB requests; default oversize tolerance; large expandable page size.
pub const LARGE_BUFFER: u64 = 20 << 20;
/// Requests below this (and above 1 MiB) get a 20 MiB segment.
pub const MIN_LARGE_ALLOC: u64 = 10 << 20;
/// Larger requests get a segment rounded up to a multiple of this.
pub const ROUND_LARGE: u64 = 2 << 20;
/// Requests of this size or more are refused outright, as PyTorch does.
pub const ONE_EXABYTE: u64 = crate::trace::limits::ONE_EXABYTE;
