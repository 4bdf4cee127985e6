//! `DeviceStats`: the counters behind `memory_stats()` (reference section 2).

/// One counter with PyTorch's four faces.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct Stat {
    pub current: i64,
    pub peak: i64,
    pub allocated: i64,
    pub freed: i64,
}

impl Stat {
    #[inline]
    pub fn increase(&mut self, amount: u64) {
        self.current += amount as i64;
        self.peak = self.peak.max(self.current);
        self.allocated += amount as i64;
    }

    #[inline]
    pub fn decrease(&mut self, amount: u64) {
        self.current -= amount as i64;
        debug_assert!(self.current >= 0, "negative tracked stat (allocator logic error)");
        self.freed += amount as i64;
    }

    fn reset_accumulated(&mut self) {
        self.allocated = 0;
        self.freed = 0;
    }

    fn reset_peak(&mut self) {
        self.peak = self.current;
    }
}

/// Which pool a stat belongs to; PyTorch's `StatType` (AGGREGATE, SMALL_POOL, LARGE_POOL).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum StatType {
    All = 0,
    SmallPool = 1,
    LargePool = 2,
}

impl StatType {
    pub const ALL: [StatType; 3] = [StatType::All, StatType::SmallPool, StatType::LargePool];

    pub fn key(self) -> &'static str {
        match self {
            StatType::All => "all",
            StatType::SmallPool => "small_pool",
            StatType::LargePool => "large_pool",
        }
    }

    pub fn for_pool(small: bool) -> StatType {
        if small { StatType::SmallPool } else { StatType::LargePool }
    }
}

/// A stat for the aggregate and for each pool.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct StatArray(pub [Stat; 3]);

impl StatArray {
    /// Changes the aggregate and the given pool's stat together, as every PyTorch update does.
    #[inline]
    pub fn increase(&mut self, pool: StatType, amount: u64) {
        self.0[StatType::All as usize].increase(amount);
        self.0[pool as usize].increase(amount);
    }

    #[inline]
    pub fn decrease(&mut self, pool: StatType, amount: u64) {
        self.0[StatType::All as usize].decrease(amount);
        self.0[pool as usize].decrease(amount);
    }

    pub fn get(&self, t: StatType) -> &Stat {
        &self.0[t as usize]
    }

    pub fn all(&self) -> &Stat {
        &self.0[0]
    }
}

/// Every counter of one device's allocator.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct DeviceStats {
    pub allocation: StatArray,
    pub segment: StatArray,
    pub active: StatArray,
    pub inactive_split: StatArray,
    pub allocated_bytes: StatArray,
    pub reserved_bytes: StatArray,
    pub active_bytes: StatArray,
    pub inactive_split_bytes: StatArray,
    pub requested_bytes: StatArray,
    pub num_alloc_retries: i64,
    pub num_ooms: i64,
    pub num_sync_all_streams: i64,
    pub num_device_alloc: i64,
    pub num_device_free: i64,
    pub oversize_allocations: Stat,
    pub oversize_segments: Stat,
    pub max_split_size: i64,
}

impl DeviceStats {
    /// The nine stat arrays with their `memory_stats` names, in PyTorch's declaration order.
    pub fn arrays(&self) -> [(&'static str, &StatArray); 9] {
        [
            ("allocation", &self.allocation),
            ("segment", &self.segment),
            ("active", &self.active),
            ("inactive_split", &self.inactive_split),
            ("allocated_bytes", &self.allocated_bytes),
            ("reserved_bytes", &self.reserved_bytes),
            ("active_bytes", &self.active_bytes),
            ("inactive_split_bytes", &self.inactive_split_bytes),
            ("requested_bytes", &self.requested_bytes),
        ]
    }

    fn arrays_mut(&mut self) -> [&mut StatArray; 9] {
        [
            &mut self.allocation,
            &mut self.segment,
            &mut self.active,
            &mut self.inactive_split,
            &mut self.allocated_bytes,
            &mut self.reserved_bytes,
            &mut self.active_bytes,
            &mut self.inactive_split_bytes,
            &mut self.requested_bytes,
        ]
    }

    pub fn reset_accumulated(&mut self) {
        for array in self.arrays_mut() {
            array.0.iter_mut().for_each(Stat::reset_accumulated);
        }
        self.num_alloc_retries = 0;
        self.num_ooms = 0;
        self.num_sync_all_streams = 0;
        self.num_device_alloc = 0;
        self.num_device_free = 0;
        self.oversize_allocations.reset_accumulated();
        self.oversize_segments.reset_accumulated();
    }

    pub fn reset_peak(&mut self) {
        for array in self.arrays_mut() {
            array.0.iter_mut().for_each(Stat::reset_peak);
        }
        self.oversize_allocations.reset_peak();
        self.oversize_segments.reset_peak();
    }
}
