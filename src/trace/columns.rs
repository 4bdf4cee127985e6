//! A device's trace as columns: one array per key of a trace entry, with each distinct stack and
//! each distinct set of rarer keys stored once and named by a small index.
//!
//! A million-entry trace is read far more often than it is built, and most reads look at one or
//! two keys (the curves read actions and sizes only). Columns keep those reads dense, and an
//! entry costs 42 bytes instead of 72 natively (56 in wasm) as a row of [`TraceEntry`].
//! [`Entry`] is one entry read back from the columns: the keys as fields, the stack and the
//! rarer keys by reference into the trace's tables.

use super::model::{Action, Category, EntryExtra, Frames, TraceEntry};
use rustc_hash::FxHashMap;
use serde::{Serialize, Serializer};
use std::sync::Arc;

/// Index of a stack in a trace's table of stacks: 0 for an entry without frames.
pub type StackId = u32;

/// One device's trace ring buffer, oldest entry first.
#[derive(Clone)]
pub struct Trace {
    action: Vec<Action>,
    addr: Vec<u64>,
    size: Vec<u64>,
    stream: Vec<i64>,
    /// `time_us`, where `timed` has the entry's bit set (older snapshots have none).
    time_us: Vec<i64>,
    timed: Vec<u64>,
    category: Vec<Option<Category>>,
    stack: Vec<StackId>,
    extra: Vec<u32>,
    /// Entry 0 of both tables is "none".
    stacks: Vec<Option<Frames>>,
    extras: Vec<Option<Arc<EntryExtra>>>,
    /// Where each table's values are, by the address of what they share: a decoder gives every
    /// entry of one stack the same list, so looking one up costs no comparison of frames.
    stack_ids: FxHashMap<(usize, usize), StackId>,
    extra_ids: FxHashMap<usize, u32>,
}

/// One entry of a [`Trace`], read from its columns. Two entries are equal when their keys are
/// (their `stack` ids, which only name a row of their own trace's table, are not compared).
#[derive(Debug, Clone, Copy, Serialize)]
pub struct Entry<'a> {
    pub action: Action,
    /// Address; 0 for `snapshot`. PyTorch omits it for `oom`, where `device_free` stands instead.
    pub addr: u64,
    pub size: u64,
    pub stream: i64,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub time_us: Option<i64>,
    #[serde(skip_serializing_if = "is_none")]
    pub frames: &'a Option<Frames>,
    /// tensormem's own key (see [`TraceEntry::category`]).
    #[serde(skip_serializing_if = "Option::is_none")]
    pub category: Option<Category>,
    #[serde(flatten, skip_serializing_if = "is_none")]
    pub extra: &'a Option<Arc<EntryExtra>>,
    /// The entry's stack in its trace's table: entries with equal ids have the same frames.
    #[serde(skip)]
    pub stack: StackId,
}

impl PartialEq for Entry<'_> {
    fn eq(&self, other: &Self) -> bool {
        (self.action, self.addr, self.size, self.stream, self.time_us, self.frames, self.category, self.extra)
            == (other.action, other.addr, other.size, other.stream, other.time_us, other.frames, other.category, other.extra)
    }
}

fn is_none<T>(value: &&Option<T>) -> bool {
    value.is_none()
}

impl<'a> Entry<'a> {
    /// An allocation that does not say what it is for.
    pub fn is_uncategorized_alloc(&self) -> bool {
        self.action == Action::Alloc && self.category.is_none()
    }

    /// Only on `oom`: bytes the device reported free.
    pub fn device_free(&self) -> Option<u64> {
        self.extra.as_ref()?.device_free
    }

    pub fn compile_context(&self) -> Option<&'a str> {
        self.extra.as_ref()?.compile_context.as_deref()
    }

    pub fn user_metadata(&self) -> Option<&'a str> {
        self.extra.as_ref()?.user_metadata.as_deref()
    }

    /// The memory pool the entry names, if it names one (`(0, 0)`: the default pool).
    pub fn pool_id(&self) -> Option<(i64, i64)> {
        self.extra.as_ref()?.pool_id
    }

    /// The entry as a row of its own, to edit or to push onto another trace.
    pub fn owned(&self) -> TraceEntry {
        TraceEntry {
            action: self.action,
            addr: self.addr,
            size: self.size,
            stream: self.stream,
            time_us: self.time_us,
            frames: self.frames.clone(),
            category: self.category,
            extra: self.extra.clone(),
        }
    }
}

impl Default for Trace {
    fn default() -> Trace {
        Trace::new()
    }
}

impl Trace {
    pub fn new() -> Trace {
        Trace {
            action: Vec::new(),
            addr: Vec::new(),
            size: Vec::new(),
            stream: Vec::new(),
            time_us: Vec::new(),
            timed: Vec::new(),
            category: Vec::new(),
            stack: Vec::new(),
            extra: Vec::new(),
            stacks: vec![None],
            extras: vec![None],
            stack_ids: FxHashMap::default(),
            extra_ids: FxHashMap::default(),
        }
    }

    pub fn len(&self) -> usize {
        self.action.len()
    }

    pub fn is_empty(&self) -> bool {
        self.action.is_empty()
    }

    /// Entry `i`; panics past the end, as indexing a slice does.
    #[inline]
    pub fn at(&self, i: usize) -> Entry<'_> {
        assert!(i < self.len(), "entry {i} of a trace of {}", self.len());
        // SAFETY: every column holds `len()` values and `timed` a bit for each: `push_with_stack`
        // grows them together (`action`, which `len()` reads, last) and `truncate` cuts them
        // together; `retain`, `edit` and the constructors build a trace by pushing, `reserve`
        // and `shrink_to_fit` change capacities only. Every id in `stack` and `extra` names a row
        // of its table: tables start with row 0 (`new`), only grow, and `push_with_stack`
        // checks the stack id it is given and interns the extra itself. One check instead of one per column lets a reader that uses
        // two keys load only those two (in wasm, checking each made reads a third slower).
        unsafe {
            let stack = *self.stack.get_unchecked(i);
            let timed = *self.timed.get_unchecked(i / 64) >> (i % 64) & 1 == 1;
            Entry {
                action: *self.action.get_unchecked(i),
                addr: *self.addr.get_unchecked(i),
                size: *self.size.get_unchecked(i),
                stream: *self.stream.get_unchecked(i),
                time_us: timed.then(|| *self.time_us.get_unchecked(i)),
                frames: self.stacks.get_unchecked(stack as usize),
                category: *self.category.get_unchecked(i),
                extra: self.extras.get_unchecked(*self.extra.get_unchecked(i) as usize),
                stack,
            }
        }
    }

    pub fn get(&self, i: usize) -> Option<Entry<'_>> {
        (i < self.len()).then(|| self.at(i))
    }

    pub fn first(&self) -> Option<Entry<'_>> {
        self.get(0)
    }

    pub fn last(&self) -> Option<Entry<'_>> {
        self.len().checked_sub(1).map(|i| self.at(i))
    }

    pub fn iter(&self) -> Iter<'_> {
        self.range(0..self.len())
    }

    /// The entries of `range`, in order; panics if it reaches past the end, as slicing does.
    pub fn range(&self, range: impl std::ops::RangeBounds<usize>) -> Iter<'_> {
        use std::ops::Bound;
        let start = match range.start_bound() {
            Bound::Included(&i) => i,
            Bound::Excluded(&i) => i.checked_add(1).expect("a range of entries starting past usize::MAX"),
            Bound::Unbounded => 0,
        };
        let end = match range.end_bound() {
            Bound::Included(&i) => i.checked_add(1).expect("a range of entries ending past usize::MAX"),
            Bound::Excluded(&i) => i,
            Bound::Unbounded => self.len(),
        };
        let range = start..end;
        assert!(range.start <= range.end && range.end <= self.len(), "entries {range:?} of a trace of {}", self.len());
        Iter { trace: self, range }
    }

    /// The first position whose entry `before` is false for, in a trace where it is true of a
    /// first part and false of the rest (as `slice::partition_point`).
    pub fn partition_point(&self, mut before: impl FnMut(Entry<'_>) -> bool) -> usize {
        let (mut low, mut high) = (0, self.len());
        while low < high {
            let mid = low + (high - low) / 2;
            if before(self.at(mid)) {
                low = mid + 1;
            } else {
                high = mid;
            }
        }
        low
    }

    /// Every entry's `time_us`, in order: the one column and its presence bits, for scans that
    /// need nothing else.
    pub fn times(&self) -> impl DoubleEndedIterator<Item = Option<i64>> + ExactSizeIterator + Clone + '_ {
        (0..self.len()).map(|i| self.time_at(i))
    }

    /// Entry `i`'s `time_us` alone.
    #[inline]
    pub fn time_at(&self, i: usize) -> Option<i64> {
        let time = self.time_us[i];
        (self.timed[i / 64] >> (i % 64) & 1 == 1).then_some(time)
    }

    /// Every entry's action, for scans that need nothing else.
    pub fn actions(&self) -> &[Action] {
        &self.action
    }

    /// Every entry's size.
    pub fn sizes(&self) -> &[u64] {
        &self.size
    }

    /// Which entries a writer names `unknown` ([`Category::UNKNOWN`]): none where no entry has a
    /// category; else the allocations without one, or, where every allocation has one, the
    /// first entry without (MemoryViz needs `unknown` among the categories of a snapshot that
    /// has some). A trace whose every entry has a category gets none.
    pub fn unknown_categories(&self) -> UnknownCategories {
        if self.category.iter().all(Option::is_none) {
            UnknownCategories::Nowhere
        } else if self.action.iter().zip(&self.category).any(|(&a, c)| a == Action::Alloc && c.is_none()) {
            UnknownCategories::OnUncategorizedAllocs
        } else {
            self.category.iter().position(Option::is_none).map_or(UnknownCategories::Nowhere, UnknownCategories::OnEntry)
        }
    }

    /// The table of stacks the entries' `stack` ids name (0: none).
    pub fn stacks(&self) -> &[Option<Frames>] {
        &self.stacks
    }

    /// The table of the rarer keys' sets the entries share (entry 0: none).
    pub fn extras(&self) -> &[Option<Arc<EntryExtra>>] {
        &self.extras
    }

    /// The id of `frames` in this trace's table, adding it if it is new. Lists are told apart by
    /// address: entries that share one list share one id.
    pub fn intern_stack(&mut self, frames: &Option<Frames>) -> StackId {
        let Some(list) = frames else { return 0 };
        let key = (list.as_ptr() as usize, list.len());
        let next = self.stacks.len();
        *self.stack_ids.entry(key).or_insert_with(|| {
            self.stacks.push(Some(list.clone()));
            StackId::try_from(next).expect("at most u32::MAX distinct stacks")
        })
    }

    #[inline]
    fn intern_extra(&mut self, extra: &Option<Arc<EntryExtra>>) -> u32 {
        let Some(shared) = extra else { return 0 };
        let next = self.extras.len();
        *self.extra_ids.entry(Arc::as_ptr(shared) as usize).or_insert_with(|| {
            self.extras.push(Some(shared.clone()));
            u32::try_from(next).expect("at most u32::MAX distinct sets of rarer keys")
        })
    }

    pub fn push(&mut self, entry: TraceEntry) {
        let stack = self.intern_stack(&entry.frames);
        self.push_with_stack(entry, stack);
    }

    /// Pushes `entry` whose frames the caller interned already as `stack` (its `frames` are
    /// not read).
    #[inline]
    pub fn push_with_stack(&mut self, entry: TraceEntry, stack: StackId) {
        assert!((stack as usize) < self.stacks.len(), "stack {stack} is not in this trace's table of {}", self.stacks.len());
        let extra = self.intern_extra(&entry.extra);
        let i = self.len();
        if i.is_multiple_of(64) {
            self.timed.push(0);
        }
        if let Some(time) = entry.time_us {
            self.timed[i / 64] |= 1 << (i % 64);
            self.time_us.push(time);
        } else {
            self.time_us.push(0);
        }
        self.addr.push(entry.addr);
        self.size.push(entry.size);
        self.stream.push(entry.stream);
        self.category.push(entry.category);
        self.stack.push(stack);
        self.extra.push(extra);
        // Last: `len()` reads this column (see `at`).
        self.action.push(entry.action);
    }

    /// Keeps the first `len` entries (the tables keep every value they hold).
    pub fn truncate(&mut self, len: usize) {
        if len >= self.len() {
            return;
        }
        for column in self.columns_mut() {
            column.truncate_to(len);
        }
        self.timed.truncate(len.div_ceil(64));
        if !len.is_multiple_of(64) {
            self.timed[len / 64] &= (1 << (len % 64)) - 1;
        }
    }

    pub fn clear(&mut self) {
        self.truncate(0);
    }

    /// Removes the last entry.
    pub fn pop(&mut self) -> Option<TraceEntry> {
        let last = self.last()?.owned();
        self.truncate(self.len() - 1);
        Some(last)
    }

    /// Every entry as a row of its own.
    pub fn to_vec(&self) -> Vec<TraceEntry> {
        self.iter().map(|e| e.owned()).collect()
    }

    /// Keeps the entries `keep` is true of.
    pub fn retain(&mut self, mut keep: impl FnMut(Entry<'_>) -> bool) {
        *self = self.iter().filter(|&e| keep(e)).map(|e| e.owned()).collect();
    }

    /// Edits every entry as a row (the trace is built anew).
    pub fn edit(&mut self, mut edit: impl FnMut(&mut TraceEntry)) {
        *self = self
            .iter()
            .map(|e| {
                let mut row = e.owned();
                edit(&mut row);
                row
            })
            .collect();
    }

    /// Room for `more` entries without growing a column.
    pub fn reserve(&mut self, more: usize) {
        for column in self.columns_mut() {
            column.reserve_more(more);
        }
        self.timed.reserve(more.div_ceil(64));
    }

    /// Bytes the columns and the interning hold (the stacks' frames are not counted: entries
    /// only share them).
    pub fn heap_bytes(&self) -> usize {
        use std::mem::size_of;
        let columns: usize = self.columns().iter().map(|c| c.bytes_held()).sum();
        columns
            + self.timed.capacity() * 8
            + self.stacks.capacity() * size_of::<Option<Frames>>()
            + self.extras.capacity() * size_of::<Option<Arc<EntryExtra>>>()
            + self.stack_ids.capacity() * size_of::<((usize, usize), StackId)>()
            + self.extra_ids.capacity() * size_of::<(usize, u32)>()
    }

    /// Drops the lookups that only pushing needs, and the columns' room to grow. (Pushing
    /// afterwards still works: a stack pushed again gets a row of its own.)
    pub fn shrink_to_fit(&mut self) {
        self.stack_ids = FxHashMap::default();
        self.extra_ids = FxHashMap::default();
        for column in self.columns_mut() {
            column.shrink();
        }
        self.timed.shrink_to_fit();
        self.stacks.shrink_to_fit();
        self.extras.shrink_to_fit();
    }

    /// The columns with one value per entry.
    fn columns(&self) -> [&dyn Column; 8] {
        [&self.action, &self.addr, &self.size, &self.stream, &self.time_us, &self.category, &self.stack, &self.extra]
    }

    fn columns_mut(&mut self) -> [&mut dyn Column; 8] {
        [&mut self.action, &mut self.addr, &mut self.size, &mut self.stream, &mut self.time_us, &mut self.category, &mut self.stack, &mut self.extra]
    }
}

/// What `Trace` does to each of its columns alike.
trait Column {
    fn truncate_to(&mut self, len: usize);
    fn reserve_more(&mut self, more: usize);
    fn shrink(&mut self);
    fn bytes_held(&self) -> usize;
}

impl<T> Column for Vec<T> {
    fn truncate_to(&mut self, len: usize) {
        self.truncate(len);
    }

    fn reserve_more(&mut self, more: usize) {
        self.reserve(more);
    }

    fn shrink(&mut self) {
        self.shrink_to_fit();
    }

    fn bytes_held(&self) -> usize {
        self.capacity() * std::mem::size_of::<T>()
    }
}

/// Entries of a trace, in order.
#[derive(Clone)]
pub struct Iter<'a> {
    trace: &'a Trace,
    range: std::ops::Range<usize>,
}

impl<'a> Iterator for Iter<'a> {
    type Item = Entry<'a>;

    #[inline]
    fn next(&mut self) -> Option<Entry<'a>> {
        self.range.next().map(|i| self.trace.at(i))
    }

    #[inline]
    fn size_hint(&self) -> (usize, Option<usize>) {
        self.range.size_hint()
    }

    #[inline]
    fn nth(&mut self, n: usize) -> Option<Entry<'a>> {
        self.range.nth(n).map(|i| self.trace.at(i))
    }
}

impl DoubleEndedIterator for Iter<'_> {
    #[inline]
    fn next_back(&mut self) -> Option<Self::Item> {
        self.range.next_back().map(|i| self.trace.at(i))
    }
}

impl ExactSizeIterator for Iter<'_> {}

impl<'a> IntoIterator for &'a Trace {
    type Item = Entry<'a>;
    type IntoIter = Iter<'a>;

    fn into_iter(self) -> Iter<'a> {
        self.iter()
    }
}

impl FromIterator<TraceEntry> for Trace {
    fn from_iter<I: IntoIterator<Item = TraceEntry>>(entries: I) -> Trace {
        let mut trace = Trace::new();
        trace.extend(entries);
        trace
    }
}

impl Extend<TraceEntry> for Trace {
    fn extend<I: IntoIterator<Item = TraceEntry>>(&mut self, entries: I) {
        let entries = entries.into_iter();
        self.reserve(entries.size_hint().0);
        for entry in entries {
            self.push(entry);
        }
    }
}

impl From<Vec<TraceEntry>> for Trace {
    fn from(entries: Vec<TraceEntry>) -> Trace {
        entries.into_iter().collect()
    }
}

impl<const N: usize> From<[TraceEntry; N]> for Trace {
    fn from(entries: [TraceEntry; N]) -> Trace {
        entries.into_iter().collect()
    }
}

/// Equal entries in the same order, however the tables were filled.
impl PartialEq for Trace {
    fn eq(&self, other: &Trace) -> bool {
        self.len() == other.len() && self.iter().eq(other.iter())
    }
}

impl std::fmt::Debug for Trace {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_list().entries(self.iter()).finish()
    }
}

/// Where a trace's writer puts `category: "unknown"` ([`Trace::unknown_categories`]).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum UnknownCategories {
    Nowhere,
    OnUncategorizedAllocs,
    OnEntry(usize),
}

impl UnknownCategories {
    /// Whether entry `i` is written `unknown`.
    pub fn on(self, i: usize, e: &Entry) -> bool {
        match self {
            UnknownCategories::Nowhere => false,
            UnknownCategories::OnUncategorizedAllocs => e.is_uncategorized_alloc(),
            UnknownCategories::OnEntry(at) => i == at,
        }
    }
}

/// As the list of entries PyTorch writes, `unknown` where [`Trace::unknown_categories`] says.
impl Serialize for Trace {
    fn serialize<S: Serializer>(&self, serializer: S) -> Result<S::Ok, S::Error> {
        #[derive(Serialize)]
        struct Written<'a> {
            #[serde(flatten)]
            entry: Entry<'a>,
            #[serde(rename = "category", skip_serializing_if = "Option::is_none")]
            unknown: Option<&'static str>,
        }
        let unknown = self.unknown_categories();
        if unknown == UnknownCategories::Nowhere {
            return serializer.collect_seq(self.iter());
        }
        serializer.collect_seq(self.iter().enumerate().map(|(i, entry)| Written { unknown: unknown.on(i, &entry).then_some(Category::UNKNOWN), entry }))
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::trace::Frame;

    fn frames(name: &str) -> Frames {
        Arc::from(vec![Frame { filename: "f.py".into(), line: 1, name: name.into() }])
    }

    #[test]
    fn entries_read_back_as_pushed() {
        let a = frames("a");
        let extra = Arc::new(EntryExtra { device_free: Some(7), ..Default::default() });
        let rows: Vec<TraceEntry> = (0..200u64)
            .map(|i| TraceEntry {
                time_us: (i % 3 != 0).then_some(i as i64 * 10),
                frames: (i % 2 == 0).then(|| a.clone()),
                category: (i % 20 == 0).then_some(Category::Activation),
                extra: (i == 150).then(|| extra.clone()),
                ..TraceEntry::new(Action::ALL[i as usize % 10], i * 512, i + 1, i as i64 % 2)
            })
            .collect();
        let trace = Trace::from(rows.clone());
        assert_eq!(trace.len(), 200);
        assert_eq!(trace.iter().map(|e| e.owned()).collect::<Vec<_>>(), rows);
        assert_eq!(trace.iter().rev().map(|e| e.owned()).collect::<Vec<_>>(), rows.iter().rev().cloned().collect::<Vec<_>>());
        // One list of frames and one set of rare keys, each stored once.
        assert_eq!(trace.stacks().len(), 2);
        assert_eq!(trace.at(0).stack, trace.at(198).stack);
        assert_eq!(trace.at(150).device_free(), Some(7));
        assert_eq!(trace.range(190..200).len(), 10);
        let mut cut = trace.clone();
        cut.truncate(130);
        assert_eq!(cut.iter().map(|e| e.owned()).collect::<Vec<_>>(), rows[..130]);
        cut.push(rows[131].clone());
        assert_eq!(cut.last().map(|e| e.owned()), Some(rows[131].clone()));
        assert_eq!(cut.at(130).time_us, rows[131].time_us);
        // Serialized as the rows are, `unknown` on the allocations without a category (some
        // have one).
        let mut expected: Vec<serde_json::Value> = rows.iter().map(|r| serde_json::to_value(r).unwrap()).collect();
        for (row, value) in rows.iter().zip(&mut expected) {
            if row.action == Action::Alloc && row.category.is_none() {
                value["category"] = Category::UNKNOWN.into();
            }
        }
        assert_eq!(serde_json::to_value(&trace).unwrap(), serde_json::Value::Array(expected));
    }

    #[test]
    fn an_entry_costs_42_bytes_and_a_stack_is_kept_once() {
        let a = frames("a");
        let mut trace: Trace = (0..10_000u64).map(|i| TraceEntry { frames: Some(a.clone()), ..TraceEntry::new(Action::Alloc, i, i, 0) }).collect();
        trace.shrink_to_fit();
        let per_entry = 1 + 8 + 8 + 8 + 8 + 1 + 4 + 4;
        assert_eq!(per_entry, 42);
        // The columns, the presence bits of the times, a table of two stacks (none, and `a`)
        // and one of rarer keys (none).
        assert_eq!(trace.heap_bytes(), 10_000 * per_entry + 10_000usize.div_ceil(64) * 8 + 2 * 16 + 8);
        assert!(std::mem::size_of::<TraceEntry>() >= 56, "a row is larger: {}", std::mem::size_of::<TraceEntry>());
    }

    #[test]
    #[should_panic(expected = "is not in this trace's table")]
    fn a_stack_id_the_trace_never_made_is_refused() {
        Trace::new().push_with_stack(TraceEntry::new(Action::Alloc, 0, 1, 0), 1);
    }

    #[test]
    #[should_panic(expected = "entry 3 of a trace of 3")]
    fn reading_past_the_end_panics() {
        Trace::from(vec![TraceEntry::new(Action::Alloc, 0, 1, 0); 3]).at(3);
    }

    #[test]
    fn equal_entries_are_equal_traces_however_interned() {
        let rows = vec![TraceEntry { frames: Some(frames("a")), ..TraceEntry::new(Action::Alloc, 0, 1, 0) }, TraceEntry::new(Action::Alloc, 0, 1, 0)];
        assert!(Trace::new().range(..).next().is_none() && Trace::default().stacks().len() == 1);
        let forward = Trace::from(rows.clone());
        let mut backward = Trace::new();
        backward.intern_stack(&None);
        let b = frames("b");
        backward.intern_stack(&Some(b));
        backward.extend(rows);
        assert_eq!(forward, backward);
        assert_ne!(forward.at(0).stack, backward.at(0).stack);
    }
}
