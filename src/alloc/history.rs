//! Allocation history: PyTorch's `_record_memory_history` ring buffer of trace entries.

use crate::trace::TraceEntry;

/// How much stack context is kept (PyTorch's `context` argument).
#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord, Default)]
pub enum RecordContext {
    /// No stacks.
    #[default]
    Never,
    /// Stacks of live blocks only (shown in snapshots).
    State,
    /// Also on alloc trace entries.
    Alloc,
    /// Also on free trace entries.
    All,
}

impl RecordContext {
    pub fn parse(s: &str) -> Option<RecordContext> {
        Some(match s {
            "None" | "none" | "never" => RecordContext::Never,
            "state" => RecordContext::State,
            "alloc" => RecordContext::Alloc,
            "all" => RecordContext::All,
            _ => return None,
        })
    }
}

/// The trace ring buffer: oldest entries are overwritten once `max_entries` is reached.
#[derive(Debug, Clone, Default)]
pub struct History {
    enabled: bool,
    context: RecordContext,
    max_entries: usize,
    entries: Vec<TraceEntry>,
    next: usize,
    clock: Option<fn() -> i64>,
}

impl History {
    pub fn configure(&mut self, enabled: bool, context: RecordContext, max_entries: usize) {
        self.enabled = enabled;
        self.context = if enabled { context } else { RecordContext::Never };
        let max_entries = max_entries.max(1);
        if max_entries != self.max_entries {
            let entries = self.entries();
            let keep = entries.len().saturating_sub(max_entries);
            self.entries = entries[keep..].to_vec();
            self.next = 0;
            self.max_entries = max_entries;
        }
        if !enabled {
            self.clear();
        }
    }

    /// Timestamps for new entries (`time_us`); without a clock entries carry none.
    pub fn set_clock(&mut self, clock: Option<fn() -> i64>) {
        self.clock = clock;
    }

    pub fn is_recording(&self) -> bool {
        self.enabled
    }

    pub fn context(&self) -> RecordContext {
        self.context
    }

    pub fn push(&mut self, mut entry: TraceEntry) {
        if entry.time_us.is_none() {
            entry.time_us = self.clock.map(|c| c());
        }
        if self.entries.len() < self.max_entries {
            self.entries.push(entry);
        } else {
            self.entries[self.next] = entry;
            self.next = (self.next + 1) % self.max_entries;
        }
    }

    /// Entries oldest first.
    pub fn entries(&self) -> Vec<TraceEntry> {
        let mut out = Vec::with_capacity(self.entries.len());
        out.extend_from_slice(&self.entries[self.next..]);
        out.extend_from_slice(&self.entries[..self.next]);
        out
    }

    pub fn len(&self) -> usize {
        self.entries.len()
    }

    pub fn is_empty(&self) -> bool {
        self.entries.is_empty()
    }

    /// Entries recorded since the buffer held `start` entries, as long as it has not wrapped.
    pub fn since(&self, start: usize) -> &[TraceEntry] {
        if self.next == 0 { &self.entries[start.min(self.entries.len())..] } else { &[] }
    }

    pub fn clear(&mut self) {
        self.entries.clear();
        self.next = 0;
    }
}
