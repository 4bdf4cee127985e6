//! The out-of-memory error, carrying the facts of PyTorch's message.

use crate::units::format_size;
use std::fmt;

#[derive(Debug, Clone, PartialEq, Eq)]
pub struct OutOfMemoryError {
    pub device: i64,
    /// The caller's request in bytes.
    pub requested: u64,
    /// What the allocator tried to get from the device: the segment size (PyTorch prints this).
    pub tried_to_allocate: u64,
    /// Device capacity; None when the device has no stated size (only a source failure then).
    pub total_capacity: Option<u64>,
    pub free: u64,
    /// `set_per_process_memory_fraction` limit, if any.
    pub allowed: Option<u64>,
    pub allocated: u64,
    pub reserved: u64,
    /// Bytes cached free in private pools (PyTorch's "allocated in private pools (e.g., CUDA
    /// Graphs)": the pools' free blocks, which the failed request could not use).
    pub in_private_pools: u64,
    pub expandable_segments: bool,
    pub more_than_exabyte: bool,
}

impl OutOfMemoryError {
    pub fn more_than_exabyte(device: i64) -> Box<OutOfMemoryError> {
        Box::new(OutOfMemoryError {
            device,
            requested: 0,
            tried_to_allocate: 0,
            total_capacity: None,
            free: 0,
            allowed: None,
            allocated: 0,
            reserved: 0,
            in_private_pools: 0,
            expandable_segments: false,
            more_than_exabyte: true,
        })
    }

    /// Memory the allocator holds but no tensor uses: what fragmentation costs.
    pub fn reserved_but_unallocated(&self) -> u64 {
        self.reserved.saturating_sub(self.allocated)
    }
}

impl fmt::Display for OutOfMemoryError {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        if self.more_than_exabyte {
            return f.write_str("Out of memory. Tried to allocate more than 1EB memory.");
        }
        write!(f, "Out of memory. Tried to allocate {}. ", format_size(self.tried_to_allocate))?;
        match self.total_capacity {
            Some(total) => write!(f, "GPU {} has a total capacity of {} of which {} is free. ", self.device, format_size(total), format_size(self.free))?,
            None => write!(f, "GPU {} refused a new segment. ", self.device)?,
        }
        if let Some(allowed) = self.allowed {
            write!(f, "{} allowed; ", format_size(allowed))?;
        }
        // As PyTorch words it, the private pools' free blocks count as allocated: no other
        // request can have them.
        write!(f, "Of the allocated memory {} is allocated by tensormem, ", format_size(self.allocated + self.in_private_pools))?;
        if self.in_private_pools > 0 {
            write!(f, "with {} allocated in private pools (e.g., CUDA Graphs), ", format_size(self.in_private_pools))?;
        }
        let unallocated = self.reserved_but_unallocated().saturating_sub(self.in_private_pools);
        write!(f, "and {} is reserved by tensormem but unallocated.", format_size(unallocated))?;
        // PyTorch prints this hint even when the setting is on (issue #173049); we do not.
        if !self.expandable_segments {
            f.write_str(
                " If reserved but unallocated memory is large try setting \
                 PYTORCH_CUDA_ALLOC_CONF=expandable_segments:True to avoid fragmentation.",
            )?;
        }
        f.write_str(
            "  See documentation for Memory Management  \
             (https://docs.pytorch.org/docs/stable/notes/cuda.html#optimizing-memory-usage-with-pytorch-cuda-alloc-conf)",
        )
    }
}

impl std::error::Error for OutOfMemoryError {}
