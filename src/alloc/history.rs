//! Allocation history: PyTorch's `_record_memory_history` ring buffer of trace entries.

use crate::trace::{Action, Annotation, Category, Trace, TraceEntry};

/// Where modelled clocks start: 2026-01-01T00:00:00Z in microseconds since the Unix epoch, so
/// viewers show a plausible date rather than 1970.
pub const MODELLED_EPOCH_US: i64 = 1_767_225_600_000_000;

/// Where the `time_us` of new trace entries comes from.
#[derive(Debug, Clone, Copy, PartialEq, Default)]
pub enum TimeSource {
    /// Entries carry no time (replay, which re-decides a recorded run rather than running one).
    #[default]
    None,
    /// The system clock in microseconds since the Unix epoch, as PyTorch records.
    Wall,
    /// A modelled clock at [`MODELLED_EPOCH_US`] + `elapsed_us`; it moves only by
    /// [`History::advance_time_us`]. Fractional, so that many short ops add up.
    Modelled { elapsed_us: f64 },
}

impl TimeSource {
    /// A modelled clock at its start.
    pub fn modelled() -> TimeSource {
        TimeSource::Modelled { elapsed_us: 0.0 }
    }

    /// The current time in whole microseconds since the Unix epoch.
    pub fn now_us(&self) -> Option<i64> {
        match *self {
            TimeSource::None => None,
            TimeSource::Wall => Some(crate::clock::wall_clock_us()),
            TimeSource::Modelled { elapsed_us } => Some(MODELLED_EPOCH_US + elapsed_us as i64),
        }
    }

    /// How snapshots name it (their `tensormem.time`); None when entries carry no time.
    pub fn name(&self) -> Option<&'static str> {
        match self {
            TimeSource::None => None,
            TimeSource::Wall => Some("wall"),
            TimeSource::Modelled { .. } => Some("modelled"),
        }
    }
}

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
    time: TimeSource,
    /// The category stamped on new `alloc` entries (what the engine is allocating for).
    category: Option<Category>,
    /// Only device calls are recorded ([`Action::is_segment_call`]): what a replay that keeps no
    /// snapshot counts, without an entry made for every alloc and free.
    segment_calls_only: bool,
    /// `record_function` ranges, as PyTorch keeps them beside the trace (its
    /// `external_annotations`): an optimizer's step. A ring of `max_entries` too, as PyTorch's
    /// `annotation_buffer` is.
    annotations: std::collections::VecDeque<Annotation>,
}

impl History {
    pub fn configure(&mut self, enabled: bool, context: RecordContext, max_entries: usize) {
        self.enabled = enabled;
        self.context = if enabled { context } else { RecordContext::Never };
        let max_entries = max_entries.max(1);
        if max_entries != self.max_entries {
            let keep = self.entries.len().saturating_sub(max_entries);
            self.entries = self.entries[self.next..].iter().chain(&self.entries[..self.next]).skip(keep).cloned().collect();
            self.next = 0;
            self.max_entries = max_entries;
            let over = self.annotations.len().saturating_sub(max_entries);
            self.annotations.drain(..over);
        }
        if !enabled {
            self.clear();
        }
    }

    /// Where new entries' `time_us` comes from.
    pub fn set_time_source(&mut self, time: TimeSource) {
        self.time = time;
    }

    pub fn time_source(&self) -> TimeSource {
        self.time
    }

    /// Moves a modelled clock forward by `us` microseconds (other clocks ignore it).
    pub fn advance_time_us(&mut self, us: f64) {
        if let TimeSource::Modelled { elapsed_us } = &mut self.time {
            *elapsed_us += us.max(0.0);
        }
    }

    /// Stamps the following `alloc` entries with `category` (None: unclassified); returns the
    /// category it replaces, so that a caller can restore it.
    pub fn set_category(&mut self, category: Option<Category>) -> Option<Category> {
        std::mem::replace(&mut self.category, category)
    }

    pub fn is_recording(&self) -> bool {
        self.enabled
    }

    /// Records only device calls from now on (or everything again).
    pub fn record_segment_calls_only(&mut self, only: bool) {
        self.segment_calls_only = only;
    }

    /// Whether an entry of `action` would be recorded now.
    pub fn records(&self, action: Action) -> bool {
        self.enabled && (!self.segment_calls_only || action.is_segment_call())
    }

    pub fn context(&self) -> RecordContext {
        self.context
    }

    /// Records `entry`, stamped with the current time unless it already carries one.
    pub fn push(&mut self, mut entry: TraceEntry) {
        if entry.time_us.is_none() {
            entry.time_us = self.time.now_us();
        }
        if entry.action == Action::Alloc && entry.category.is_none() {
            entry.category = self.category;
        }
        if self.entries.len() < self.max_entries {
            self.entries.push(entry);
        } else {
            self.entries[self.next] = entry;
            self.next = (self.next + 1) % self.max_entries;
        }
    }

    /// Stamps `category` on the allocation at `addr` when it is among the last `within` entries
    /// and has none: what an allocation is for is sometimes known only after it is made (a
    /// gradient that AccumulateGrad takes over as a leaf's `.grad`).
    pub fn categorize_recent(&mut self, addr: u64, category: Category, within: usize) {
        let len = self.entries.len();
        for back in 1..=within.min(len) {
            let entry = &mut self.entries[(self.next + len - back) % len];
            if entry.addr == addr && entry.action == Action::Alloc {
                entry.category.get_or_insert(category);
                return;
            }
        }
    }

    /// Entries oldest first.
    pub fn entries(&self) -> Trace {
        self.entries[self.next..].iter().chain(&self.entries[..self.next]).cloned().collect()
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
        self.annotations.clear();
    }

    /// Opens (`start`) or closes a `record_function` range named `name` on `device`, stamped
    /// with the clock. A modelled clock moves one microsecond past the range's edge, so that
    /// every entry inside it and none outside has a time within it (as a reader places ranges).
    pub fn annotate(&mut self, name: &str, start: bool, device: i64) {
        if !self.enabled {
            return;
        }
        if start {
            self.advance_time_us(1.0);
        }
        if self.annotations.len() >= self.max_entries.max(1) {
            self.annotations.pop_front();
        }
        self.annotations.push_back(Annotation {
            name: name.to_string(),
            stage: if start { "START" } else { "END" }.into(),
            device,
            time_us: self.time.now_us(),
        });
        if !start {
            self.advance_time_us(1.0);
        }
    }

    /// The ranges recorded (the last `max_entries` of them), in order.
    pub fn annotations(&self) -> Vec<Annotation> {
        self.annotations.iter().cloned().collect()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn annotations_are_a_ring_of_max_entries_as_the_trace_is() {
        let mut h = History::default();
        h.configure(true, RecordContext::All, 4);
        for step in 0..3 {
            h.annotate(&format!("Optimizer.step#SGD.step {step}"), true, 0);
            h.annotate(&format!("Optimizer.step#SGD.step {step}"), false, 0);
        }
        let kept: Vec<(String, String)> = h.annotations().into_iter().map(|a| (a.name, a.stage)).collect();
        let expected: Vec<(String, String)> =
            [(1, "START"), (1, "END"), (2, "START"), (2, "END")].iter().map(|(s, st)| (format!("Optimizer.step#SGD.step {s}"), st.to_string())).collect();
        assert_eq!(kept, expected);
        h.configure(true, RecordContext::All, 1);
        assert_eq!(h.annotations().len(), 1);
        assert_eq!(h.annotations()[0].stage, "END");
    }
}
