//! Typed snapshot from the generic node tree, with errors that name the offending field.
//!
//! Accepts every generation seen in the wild: G1 (segments + device_traces, no time), G1t, G2
//! (allocator_settings, external_annotations), G3 (compile_context, user_metadata), the very old
//! block `history` list, and a bare list of segments (`torch.cuda.memory_snapshot()`).

use super::Trace;
use super::model::limits;
use super::model::*;
use super::node::{Arena, COMPACTED, Node, NodeId, Val, is_compacted};
use super::pickle::{Compact, EntryValue, Parked};
use rustc_hash::FxHashMap;
use std::sync::Arc;

mod fast;
mod lists;

use lists::{Growing, Lists};

#[derive(Debug, Clone, PartialEq, Eq)]
pub struct FieldError {
    pub path: String,
    pub message: String,
}

type Result<T> = std::result::Result<T, FieldError>;
/// How a field's value is read: `Decoder::bytes`, `Decoder::address`, `Decoder::int`, ...
type Reader<'d, T> = fn(&Decoder<'d>, Val, &dyn Fn() -> String) -> Result<T>;

/// What decoding remembers across nodes.
#[derive(Default)]
struct Caches {
    /// Frame lists by the ids of their frame dicts: PyTorch writes each frame dict once but a
    /// new list per trace entry, so lists with the same frames share one `Frames`. (Not by the
    /// list's own id: a memoized list is a new one per entry, and 11.5 M of them made a map of
    /// their own.)
    frame_lists: FxHashMap<Vec<NodeId>, Frames>,
    frame_dicts: FxHashMap<NodeId, Frame>,
    /// Every distinct stack once, by content: a JSON snapshot repeats a stack as separate
    /// lists of separate frame objects, which the caches above cannot see are the same.
    by_content: rustc_hash::FxHashSet<Frames>,
    /// Strings repeated on every entry (`compile_context` "N/A", `user_metadata` ""), stored once.
    strings: FxHashMap<NodeId, Arc<str>>,
    /// Each distinct set of an entry's rarer keys once.
    extras: rustc_hash::FxHashSet<Arc<EntryExtra>>,
    last_extra: Option<Arc<EntryExtra>>,
    /// Actions by the string node that names them (memoized, read again by every entry).
    actions: FxHashMap<NodeId, Action>,
    /// Nodes are never shared and their ids are reused once freed (JSON, read as it streams):
    /// the caches by node id above would answer for another node, so only `by_content` serves.
    unshared: bool,
    /// Entries decoded from the pickle parser's stack, until their dict reaches its list.
    decoded: Decoded,
    /// The frames of each list the pickle parser parked (`EntryValue::Frames`), by its index.
    parked_frames: Vec<Option<Frames>>,
    /// The last rarer keys' values the fast path read (`Caches::fast_entry`), and their extra.
    last_read_extra: Option<([EntryValue; 4], Option<Arc<EntryExtra>>)>,
}

/// Trace entries decoded before their list is known, by the index a `Node::Entry` keeps; a
/// slot is reused once taken (a few entries wait at a time: the pickle appends entries to
/// their list in batches of a thousand).
#[derive(Default)]
struct Decoded {
    slots: Vec<Option<TraceEntry>>,
    free: Vec<u32>,
}

impl Decoded {
    fn put(&mut self, entry: TraceEntry) -> Option<u32> {
        if let Some(k) = self.free.pop() {
            self.slots[k as usize] = Some(entry);
            return Some(k);
        }
        let k = u32::try_from(self.slots.len()).ok()?;
        self.slots.push(Some(entry));
        Some(k)
    }

    fn take(&mut self, k: u32) -> Option<TraceEntry> {
        let entry = self.slots.get_mut(k as usize)?.take()?;
        self.free.push(k);
        Some(entry)
    }
}

impl Caches {
    fn shared_extra(&mut self, extra: EntryExtra) -> Arc<EntryExtra> {
        // Entries in a row mostly have the same (a G3 file's "N/A" and "" on every one).
        if let Some(last) = &self.last_extra
            && **last == extra
        {
            return last.clone();
        }
        let extra = match self.extras.get(&extra) {
            Some(known) => known.clone(),
            None => {
                let extra = Arc::new(extra);
                self.extras.insert(extra.clone());
                extra
            }
        };
        self.last_extra = Some(extra.clone());
        extra
    }
}

/// Decodes trace entries while the pickle is parsed (`pickle::Compact`): each entry dict becomes a
/// `TraceEntry` as soon as it is appended to its list, pushed onto that list's columns, and its
/// nodes are freed, so a 1 M entry snapshot never exists as a node tree
/// (`examples/load_memory.rs` measures the peak heap while loading one).
#[derive(Default)]
pub struct EntryCompactor {
    caches: Caches,
    /// Entries by the list they were appended to, in order.
    lists: Lists,
    /// The key node last seen at each position of an entry's items, and which key it is.
    keys_at: Vec<(NodeId, Option<u8>)>,
}

impl EntryCompactor {
    /// Trace entries decoded so far.
    pub fn entries(&self) -> usize {
        self.lists.entries()
    }

    /// For input whose nodes are never shared and are freed as it streams (JSON).
    pub fn unshared() -> EntryCompactor {
        let mut compactor = EntryCompactor::default();
        compactor.caches.unshared = true;
        compactor
    }
}

impl Compact for EntryCompactor {
    fn compact(&mut self, arena: &Arena, list: NodeId, item: NodeId, lasting: &dyn Fn(NodeId) -> bool, release: &mut Vec<NodeId>) -> Option<u32> {
        let entry = match arena.get(item) {
            Node::Entry(k) => self.caches.decoded.take(*k)?,
            Node::Dict(fields) => {
                let mut decoder = Decoder { arena, c: &mut self.caches, lasting };
                let f = decoder.entry_fields(item, &String::new).ok()?;
                if !f.is_entry(arena) {
                    return None;
                }
                // A bad entry stays a node: decoding it again at the end names its path.
                let entry = decoder.entry(&f, &String::new).ok()?;
                release.extend(fields.iter().map(|&(_, value)| value));
                entry
            }
            _ => return None,
        };
        release.insert(0, item);
        Some(self.lists.push(list, entry) as u32)
    }

    fn entry(&mut self, arena: &Arena, items: &[Val], lasting: &dyn Fn(NodeId) -> bool, release: &mut Vec<NodeId>) -> Option<u32> {
        let mut f = EntryFields::default();
        for (at, pair) in items.chunks_exact(2).enumerate() {
            let Val::Node(key) = pair[0] else { return None };
            if let Some(index) = self.key_at(arena, at, key, lasting) {
                f.set_at(arena, index, pair[1]);
            }
        }
        if !f.is_entry(arena) {
            return None;
        }
        // A bad entry takes the generic path, whose decoding at the end names its path.
        let entry = Decoder { arena, c: &mut self.caches, lasting }.entry(&f, &String::new).ok()?;
        let k = self.caches.decoded.put(entry)?;
        release.extend(items.chunks_exact(2).filter_map(|pair| match pair[1] {
            Val::Node(id) => Some(id),
            Val::Int(_) => None,
        }));
        Some(k)
    }

    fn read_entry(&mut self, arena: &Arena, items: &[(NodeId, EntryValue)], parked: &Parked, lasting: &dyn Fn(NodeId) -> bool) -> Option<u32> {
        // By `EntryFields::KEYS`; the last of a repeated key counts, and None is no value.
        let mut f = [EntryValue::None; EntryFields::KEYS.len()];
        for (at, &(key, value)) in items.iter().enumerate() {
            if let Some(index) = self.key_at(arena, at, key, lasting) {
                f[index as usize] = value;
            }
        }
        let entry = self.caches.fast_entry(arena, &f, parked, lasting)?;
        self.caches.decoded.put(entry)
    }
}

/// The values of a trace entry's keys, from a dict node (`Decoder::entry_fields`) or straight
/// from the pickle parser's stack (`EntryCompactor::entry`).
#[derive(Default)]
struct EntryFields {
    action: Option<Val>,
    addr: Option<Val>,
    size: Option<Val>,
    stream: Option<Val>,
    time_us: Option<Val>,
    frames: Option<Val>,
    device_free: Option<Val>,
    compile_context: Option<Val>,
    user_metadata: Option<Val>,
    pool_id: Option<Val>,
    category: Option<Val>,
}

impl EntryFields {
    /// The keys read, in the order `slot` numbers them.
    const KEYS: [&'static str; 11] =
        ["action", "addr", "size", "stream", "time_us", "frames", "device_free", "compile_context", "user_metadata", "pool_id", "category"];

    /// Which of `KEYS` a key node is, if any.
    fn key_index(arena: &Arena, key: NodeId) -> Option<u8> {
        let Node::Str(key) = arena.get(key) else { return None };
        Self::KEYS.iter().position(|k| *k == &**key).map(|i| i as u8)
    }

    fn slot(&mut self, index: u8) -> &mut Option<Val> {
        match index {
            0 => &mut self.action,
            1 => &mut self.addr,
            2 => &mut self.size,
            3 => &mut self.stream,
            4 => &mut self.time_us,
            5 => &mut self.frames,
            6 => &mut self.device_free,
            7 => &mut self.compile_context,
            8 => &mut self.user_metadata,
            9 => &mut self.pool_id,
            _ => &mut self.category,
        }
    }

    /// Sets `key`'s value (the last of a repeated key counts, and a None value is no value, as
    /// `Decoder::field` reads a dict); other keys are ignored.
    fn set(&mut self, arena: &Arena, key: NodeId, value: Val) {
        if let Some(index) = Self::key_index(arena, key) {
            self.set_at(arena, index, value);
        }
    }

    fn set_at(&mut self, arena: &Arena, index: u8, value: Val) {
        *self.slot(index) = match value {
            Val::Node(id) if matches!(arena.get(id), Node::None) => None,
            value => Some(value),
        };
    }

    /// Whether these are a trace entry's: `action` is a string.
    fn is_entry(&self, arena: &Arena) -> bool {
        matches!(self.action, Some(Val::Node(id)) if matches!(arena.get(id), Node::Str(_)))
    }
}

struct Decoder<'a> {
    arena: &'a Arena,
    c: &'a mut Caches,
    /// Whether a node outlives the entry being decoded: only those are remembered by id (a
    /// freed node's id is reused). PyTorch memoizes each frame dict and each repeated string
    /// once; each entry's frame list is new, and read by content.
    lasting: &'a dyn Fn(NodeId) -> bool,
}

impl<'a> Decoder<'a> {
    fn fail<T>(&self, path: &dyn Fn() -> String, message: impl Into<String>) -> Result<T> {
        Err(FieldError { path: path(), message: message.into() })
    }

    fn field(&self, dict: NodeId, key: &str) -> Option<NodeId> {
        self.arena.dict_get(dict, key).filter(|&v| !matches!(self.arena.get(v), Node::None))
    }

    fn required(&self, dict: NodeId, key: &str, path: &dyn Fn() -> String) -> Result<NodeId> {
        match self.arena.get(dict) {
            Node::Dict(_) => {}
            other => return self.fail(path, format!("expected a dict, found {}", other.kind())),
        }
        match self.field(dict, key) {
            Some(v) => Ok(v),
            None => self.fail(&|| format!("{}.{key}", path()), "missing"),
        }
    }

    /// A memory pool's id: a pair of integers (a tuple in a pickle, a list in JSON).
    fn pool_id(&self, id: NodeId, path: &dyn Fn() -> String) -> Result<(i64, i64)> {
        match self.seq(id, path)? {
            &[a, b] => Ok((self.int(a.into(), path)?, self.int(b.into(), path)?)),
            _ => self.fail(path, "expected a pair"),
        }
    }

    fn wide_int(&self, value: Val, path: &dyn Fn() -> String) -> Result<i128> {
        let id = match value {
            Val::Int(i) => return Ok(i as i128),
            Val::Node(id) => id,
        };
        match self.arena.get(id) {
            Node::Int(i) => Ok(*i),
            Node::Bool(b) => Ok(*b as i128),
            other => self.fail(path, format!("expected an integer, found {}", other.kind())),
        }
    }

    fn int(&self, id: Val, path: &dyn Fn() -> String) -> Result<i64> {
        let v = self.wide_int(id, path)?;
        i64::try_from(v).or_else(|_| self.fail(path, format!("integer {v} does not fit this field (a signed 64-bit integer)")))
    }

    /// Counts and other non-negative integers.
    fn uint(&self, id: Val, path: &dyn Fn() -> String) -> Result<u64> {
        let v = self.wide_int(id, path)?;
        u64::try_from(v).or_else(|_| self.fail(path, format!("expected a non-negative 64-bit integer, found {v}")))
    }

    /// A size in bytes: below the 1 EB PyTorch refuses to allocate.
    fn bytes(&self, id: Val, path: &dyn Fn() -> String) -> Result<u64> {
        let v = self.uint(id, path)?;
        if v >= limits::ONE_EXABYTE {
            return self.fail(path, format!("{v} bytes cannot be real: PyTorch refuses to allocate 1 EB (2^60 bytes) or more"));
        }
        Ok(v)
    }

    /// A device address: inside a 57-bit virtual address space.
    fn address(&self, id: Val, path: &dyn Fn() -> String) -> Result<u64> {
        let v = self.uint(id, path)?;
        if v >= limits::ADDRESS_LIMIT {
            return self.fail(path, format!("address {v:#x} cannot be real: no device maps addresses beyond 57 bits"));
        }
        Ok(v)
    }

    /// A device index; `-1` (no device) only where `allow_none`.
    fn device(&self, dict: NodeId, key: &str, allow_none: bool, path: &dyn Fn() -> String) -> Result<i64> {
        let p = || format!("{}.{key}", path());
        let Some(id) = self.field(dict, key) else { return Ok(0) };
        let v = self.int(id.into(), &p)?;
        let lowest = if allow_none { -1 } else { 0 };
        if !(lowest..=limits::MAX_DEVICE_INDEX).contains(&v) {
            return self.fail(&p, format!("device {v} cannot be real: PyTorch's device indices are 0 to {} (an int8)", limits::MAX_DEVICE_INDEX));
        }
        Ok(v)
    }

    /// Line numbers: PyTorch writes an unknown C++ line as size_t -1 (2^64 - 1); a Python -1 wraps to it too.
    fn line(&self, id: Val, path: &dyn Fn() -> String) -> Result<u64> {
        let v = self.wide_int(id, path)?;
        match (u64::try_from(v), i64::try_from(v)) {
            (Ok(u), _) => Ok(u),
            (_, Ok(i)) => Ok(i as u64),
            _ => self.fail(path, format!("line {v} does not fit 64 bits")),
        }
    }

    /// A required field read by `read` (`Self::bytes`, `Self::address`, ...).
    fn required_with<T>(&self, dict: NodeId, key: &str, read: Reader<'a, T>, path: &dyn Fn() -> String) -> Result<T> {
        let p = || format!("{}.{key}", path());
        read(self, self.required(dict, key, path)?.into(), &p)
    }

    fn optional_with<T>(&self, dict: NodeId, key: &str, read: Reader<'a, T>, path: &dyn Fn() -> String) -> Result<Option<T>> {
        let p = || format!("{}.{key}", path());
        self.field(dict, key).map(|v| read(self, v.into(), &p)).transpose()
    }

    fn opt_int_field(&self, dict: NodeId, key: &str, path: &dyn Fn() -> String) -> Result<Option<i64>> {
        let p = || format!("{}.{key}", path());
        self.field(dict, key).map(|v| self.int(v.into(), &p)).transpose()
    }

    fn str<'b>(&'b self, id: NodeId, path: &dyn Fn() -> String) -> Result<&'b str> {
        match self.arena.get(id) {
            Node::Str(s) => Ok(s),
            other => self.fail(path, format!("expected a string, found {}", other.kind())),
        }
    }

    fn opt_string_field(&self, dict: NodeId, key: &str, path: &dyn Fn() -> String) -> Result<Option<String>> {
        let p = || format!("{}.{key}", path());
        self.field(dict, key).map(|v| self.str(v, &p).map(str::to_string)).transpose()
    }

    fn opt_shared_str(&mut self, value: Option<NodeId>, key: &str, path: &dyn Fn() -> String) -> Result<Option<Arc<str>>> {
        let Some(v) = value else { return Ok(None) };
        if let Some(s) = self.c.strings.get(&v) {
            return Ok(Some(s.clone()));
        }
        let s: Arc<str> = self.str(v, &|| format!("{}.{key}", path()))?.into();
        if (self.lasting)(v) {
            self.c.strings.insert(v, s.clone());
        }
        Ok(Some(s))
    }

    fn bool_field(&self, dict: NodeId, key: &str, default: bool, path: &dyn Fn() -> String) -> Result<bool> {
        match self.field(dict, key) {
            None => Ok(default),
            Some(v) => match self.arena.get(v) {
                Node::Bool(b) => Ok(*b),
                Node::Int(i) => Ok(*i != 0),
                other => self.fail(&|| format!("{}.{key}", path()), format!("expected a bool, found {}", other.kind())),
            },
        }
    }

    fn seq<'b>(&'b self, id: NodeId, path: &dyn Fn() -> String) -> Result<&'b [NodeId]> {
        match self.arena.get(id) {
            Node::List(items) | Node::Tuple(items) => Ok(items),
            other => self.fail(path, format!("expected a list, found {}", other.kind())),
        }
    }

    fn frames(&mut self, id: Option<NodeId>, path: &dyn Fn() -> String) -> Result<Frames> {
        let Some(id) = id else { return Ok(no_frames()) };
        if self.c.unshared {
            let items = self.seq(id, path)?.to_vec();
            return self.frames_by_content(&items, path);
        }
        let items = self.seq(id, path)?;
        // Known (a cache hit, the usual case): no copy of the items.
        if items.iter().all(|&f| (self.lasting)(f))
            && let Some(f) = self.c.frame_lists.get(items)
        {
            return Ok(f.clone());
        }
        let items = items.to_vec();
        self.frames_of_items(&items, path)
    }

    /// The frames of a list of frame dicts.
    fn frames_of_items(&mut self, items: &[NodeId], path: &dyn Fn() -> String) -> Result<Frames> {
        // A list of lasting frame dicts is known by their ids.
        let by_items = items.iter().all(|&f| (self.lasting)(f));
        if by_items && let Some(f) = self.c.frame_lists.get(items) {
            return Ok(f.clone());
        }
        let frames = self.frames_by_content(items, path)?;
        if by_items {
            self.c.frame_lists.insert(items.to_vec(), frames.clone());
        }
        Ok(frames)
    }

    /// A frame list read frame by frame (each frame dict once, where nodes are shared), stored
    /// once per distinct content.
    fn frames_by_content(&mut self, items: &[NodeId], path: &dyn Fn() -> String) -> Result<Frames> {
        let mut frames = Vec::with_capacity(items.len());
        for (i, &f) in items.iter().enumerate() {
            if let Some(frame) = self.c.frame_dicts.get(&f).filter(|_| !self.c.unshared && (self.lasting)(f)) {
                frames.push(frame.clone());
                continue;
            }
            let p = || format!("{}[{i}]", path());
            let frame = Frame {
                filename: windows_path_as_posix(self.opt_string_field(f, "filename", &p)?.unwrap_or_default()),
                line: match self.field(f, "line") {
                    Some(l) => self.line(l.into(), &|| format!("{}.line", p()))?,
                    None => 0,
                },
                name: self.opt_string_field(f, "name", &p)?.unwrap_or_default(),
            };
            if !self.c.unshared && (self.lasting)(f) {
                self.c.frame_dicts.insert(f, frame.clone());
            }
            frames.push(frame);
        }
        let frames: Frames = Arc::from(frames);
        Ok(match self.c.by_content.get(&frames) {
            Some(same) => same.clone(),
            None => {
                self.c.by_content.insert(frames.clone());
                frames
            }
        })
    }

    fn block(&mut self, id: NodeId, next_address: u64, path: &dyn Fn() -> String) -> Result<Block> {
        let size = self.required_with(id, "size", Self::bytes, path)?;
        let address = self.optional_with(id, "address", Self::address, path)?.unwrap_or(next_address);
        let state_id = self.required(id, "state", path)?;
        let state = match self.str(state_id, &|| format!("{}.state", path()))? {
            "active_allocated" => BlockState::ActiveAllocated,
            // The `_snapshot` docstring's spelling of the same state.
            "active_pending_free" | "active_awaiting_free" => BlockState::ActivePendingFree,
            "inactive" => BlockState::Inactive,
            other => return self.fail(&|| format!("{}.state", path()), format!("unknown block state {other:?}")),
        };
        let (requested_size, frames) = match self.field(id, "history") {
            // PyTorch <= 2.0: the last history entry holds the live request and its stack.
            Some(history) if self.field(id, "frames").is_none() => {
                let hp = || format!("{}.history", path());
                match self.seq(history, &hp)?.last().copied() {
                    Some(last) => (self.optional_with(last, "real_size", Self::bytes, &hp)?.unwrap_or(0), self.frames(self.field(last, "frames"), &hp)?),
                    None => (0, no_frames()),
                }
            }
            _ => (
                self.optional_with(id, "requested_size", Self::bytes, path)?.unwrap_or(size),
                self.frames(self.field(id, "frames"), &|| format!("{}.frames", path()))?,
            ),
        };
        Ok(Block { address, size, requested_size, state, frames })
    }

    fn segment(&mut self, id: NodeId, path: &dyn Fn() -> String) -> Result<Segment> {
        let address = self.required_with(id, "address", Self::address, path)?;
        let total_size = self.required_with(id, "total_size", Self::bytes, path)?;
        let blocks_id = self.required(id, "blocks", path)?;
        let block_ids = self.seq(blocks_id, &|| format!("{}.blocks", path()))?.to_vec();
        let mut blocks = Vec::with_capacity(block_ids.len());
        let mut next = address;
        for (i, b) in block_ids.into_iter().enumerate() {
            let block = self.block(b, next, &|| format!("{}.blocks[{i}]", path()))?;
            next = block.address.saturating_add(block.size);
            blocks.push(block);
        }
        let sum = |f: &dyn Fn(&Block) -> Option<u64>| blocks.iter().filter_map(f).fold(0u64, u64::saturating_add);
        let segment_type = match self.field(id, "segment_type") {
            Some(t) => match self.str(t, &|| format!("{}.segment_type", path()))? {
                "small" => PoolKind::Small,
                "large" => PoolKind::Large,
                other => return self.fail(&|| format!("{}.segment_type", path()), format!("unknown pool {other:?}")),
            },
            None if total_size == 2 << 20 => PoolKind::Small,
            None => PoolKind::Large,
        };
        let pool_id = match self.field(id, "segment_pool_id") {
            Some(p) => self.pool_id(p, &|| format!("{}.segment_pool_id", path()))?,
            None => (0, 0),
        };
        Ok(Segment {
            device: self.device(id, "device", false, path)?,
            address,
            total_size,
            allocated_size: match self.optional_with(id, "allocated_size", Self::bytes, path)? {
                Some(v) => v,
                None => sum(&|b| (b.state == BlockState::ActiveAllocated).then_some(b.size)),
            },
            active_size: match self.optional_with(id, "active_size", Self::bytes, path)? {
                Some(v) => v,
                None => sum(&|b| b.state.is_active().then_some(b.size)),
            },
            requested_size: match self.optional_with(id, "requested_size", Self::bytes, path)? {
                Some(v) => v,
                None => sum(&|b| b.state.is_active().then_some(b.requested_size)),
            },
            stream: self.opt_int_field(id, "stream", path)?.unwrap_or(0),
            segment_type,
            segment_pool_id: pool_id,
            is_expandable: self.bool_field(id, "is_expandable", false, path)?,
            frames: self.frames(self.field(id, "frames"), &|| format!("{}.frames", path()))?,
            blocks,
        })
    }

    /// A trace entry's fields, read in one pass over its keys (looked up one by one, ten keys
    /// per entry, string compares took a tenth of decoding a 1 GB file). As `field`: the last
    /// of a repeated key counts, and a None value is no value.
    fn entry_fields(&self, id: NodeId, path: &dyn Fn() -> String) -> Result<EntryFields> {
        let Node::Dict(entries) = self.arena.get(id) else {
            return self.fail(path, format!("expected a dict, found {}", self.arena.get(id).kind()));
        };
        let mut f = EntryFields::default();
        for &(key, value) in entries.iter() {
            f.set(self.arena, key, value.into());
        }
        Ok(f)
    }

    /// A trace entry from its dict node, or the one decoded when its items were set (`Node::Entry`).
    fn entry_node(&mut self, id: NodeId, path: &dyn Fn() -> String) -> Result<TraceEntry> {
        // Still waiting at the end, it was never appended, or it is shared (read again before it
        // was appended, as Python may write and as `compact` leaves it): each reference gets a copy.
        if let Node::Entry(k) = self.arena.get(id) {
            return match self.c.decoded.slots.get(*k as usize) {
                Some(Some(entry)) => Ok(entry.clone()),
                _ => self.fail(path, "the same trace entry appears twice"),
            };
        }
        let f = self.entry_fields(id, path)?;
        self.entry(&f, path)
    }

    /// A value that must be a node (a string, a list): an integer is reported as the node would be.
    fn node(&self, value: Val, expected: &str, path: &dyn Fn() -> String) -> Result<NodeId> {
        match value {
            Val::Node(id) => Ok(id),
            Val::Int(_) => self.fail(path, format!("expected {expected}, found an integer")),
        }
    }

    /// The action a string node names, known by its node once read (where the node lasts).
    fn action(&mut self, id: NodeId, path: &dyn Fn() -> String) -> Result<Action> {
        if let Some(&known) = self.c.actions.get(&id) {
            return Ok(known);
        }
        let name = self.str(id, path)?;
        let Some(action) = Action::from_name(name) else {
            return self.fail(path, format!("unknown action {name:?}"));
        };
        if !self.c.unshared && (self.lasting)(id) {
            self.c.actions.insert(id, action);
        }
        Ok(action)
    }

    fn entry(&mut self, f: &EntryFields, path: &dyn Fn() -> String) -> Result<TraceEntry> {
        let at = |key: &'static str| move || format!("{}.{key}", path());
        let Some(action) = f.action else { return self.fail(&at("action"), "missing") };
        let action_id = self.node(action, "a string", &at("action"))?;
        let action = self.action(action_id, &at("action"))?;
        let device_free = f.device_free.map(|v| self.bytes(v, &at("device_free"))).transpose()?;
        let addr = match (action, f.addr) {
            (_, Some(a)) => self.address(a, &at("addr"))?,
            (Action::Oom | Action::Snapshot | Action::Annotate, None) => 0,
            (_, None) => return self.fail(&at("addr"), "missing"),
        };
        let frames = match f.frames {
            Some(v) => Some(self.frames(Some(self.node(v, "a list", &at("frames"))?), &at("frames"))?),
            None => None,
        };
        let node = |v: Option<Val>, key: &'static str| v.map(|v| self.node(v, "a string", &at(key))).transpose();
        let (compile_context, user_metadata, pool_id, category) =
            (node(f.compile_context, "compile_context")?, node(f.user_metadata, "user_metadata")?, node(f.pool_id, "pool_id")?, node(f.category, "category")?);
        let extra = EntryExtra {
            device_free,
            compile_context: self.opt_shared_str(compile_context, "compile_context", path)?,
            user_metadata: self.opt_shared_str(user_metadata, "user_metadata", path)?,
            pool_id: pool_id.map(|v| self.pool_id(v, &at("pool_id"))).transpose()?,
        };
        // A failed request may be of any size: PyTorch's 1 EB check is for what it allocates.
        let size: Reader<'a, u64> = if action == Action::Oom { Self::uint } else { Self::bytes };
        Ok(TraceEntry {
            action,
            addr,
            size: f.size.map(|v| size(self, v, &at("size"))).transpose()?.unwrap_or(0),
            stream: f.stream.map(|v| self.int(v, &at("stream"))).transpose()?.unwrap_or(0),
            time_us: f.time_us.map(|v| self.int(v, &at("time_us"))).transpose()?,
            frames,
            extra: (extra != EntryExtra::default()).then(|| self.c.shared_extra(extra)),
            category: match self.opt_shared_str(category, "category", path)? {
                None => None,
                Some(name) => match Category::parse(&name) {
                    Some(c) => c,
                    None => return self.fail(&at("category"), format!("unknown category {name:?}")),
                },
            },
        })
    }

    fn annotation(&mut self, id: NodeId, path: &dyn Fn() -> String) -> Result<Annotation> {
        Ok(Annotation {
            name: self.opt_string_field(id, "name", path)?.unwrap_or_default(),
            stage: self.opt_string_field(id, "stage", path)?.unwrap_or_default(),
            device: self.device(id, "device", true, path)?,
            time_us: self.opt_int_field(id, "time_us", path)?,
        })
    }

    fn segments(&mut self, list: NodeId) -> Result<Vec<Segment>> {
        let ids = self.seq(list, &|| "segments".into())?.to_vec();
        ids.into_iter().enumerate().map(|(i, s)| self.segment(s, &|| format!("segments[{i}]"))).collect()
    }

    fn snapshot(&mut self, root: NodeId, compacted: &mut FxHashMap<NodeId, Growing>) -> Result<Snapshot> {
        if let Node::List(_) = self.arena.get(root) {
            return Ok(Snapshot { segments: self.segments(root)?, ..Snapshot::default() });
        }
        let top = || String::from("snapshot");
        let segments_id = self.required(root, "segments", &top)?;
        let segments = self.segments(segments_id)?;
        let mut device_traces = Vec::new();
        if let Some(traces) = self.field(root, "device_traces") {
            let devices = self.seq(traces, &|| "device_traces".into())?.to_vec();
            if devices.len() as i64 > limits::MAX_DEVICE_INDEX + 1 {
                return self.fail(&|| "device_traces".into(), format!("{} device traces cannot be real: PyTorch addresses at most 128 devices", devices.len()));
            }
            for (d, t) in devices.into_iter().enumerate() {
                let items = self.seq(t, &|| format!("device_traces[{d}]"))?;
                let mut done = compacted.remove(&t).unwrap_or_default();
                // The usual case: every entry was decoded while parsing, in order.
                if done.len == items.len() && items.iter().enumerate().all(|(i, &e)| e == COMPACTED | i as u32) {
                    device_traces.push(done.into_trace());
                    continue;
                }
                let items = items.to_vec();
                let mut trace = Trace::new();
                trace.reserve(items.len());
                for (i, e) in items.into_iter().enumerate() {
                    let p = || format!("device_traces[{d}][{i}]");
                    trace.push(match is_compacted(e) {
                        true => match done.take((e & !COMPACTED) as usize) {
                            Some(entry) => entry,
                            None => return self.fail(&p, "the same trace entry appears twice"),
                        },
                        false => self.entry_node(e, &p)?,
                    });
                }
                trace.shrink_to_fit();
                device_traces.push(trace);
            }
        }
        let allocator_settings = match self.field(root, "allocator_settings") {
            Some(s) => match self.arena.to_json(s, 0) {
                Some(serde_json::Value::Object(map)) => Some(map),
                _ => return self.fail(&|| "allocator_settings".into(), "expected a dict of plain values"),
            },
            None => None,
        };
        let external_annotations = match self.field(root, "external_annotations") {
            Some(list) => {
                let ids = self.seq(list, &|| "external_annotations".into())?.to_vec();
                let mut out = Vec::with_capacity(ids.len());
                for (i, a) in ids.into_iter().enumerate() {
                    out.push(self.annotation(a, &|| format!("external_annotations[{i}]"))?);
                }
                Some(out)
            }
            None => None,
        };
        let tensormem = match self.field(root, "tensormem").filter(|&t| matches!(self.arena.get(t), Node::Dict(_))) {
            Some(t) => {
                let p = || String::from("tensormem");
                Some(Recording {
                    time: self.opt_string_field(t, "time", &p)?.unwrap_or_default(),
                    device: self.opt_string_field(t, "device", &p)?.unwrap_or_default(),
                })
            }
            None => None,
        };
        Ok(Snapshot { segments, device_traces, allocator_settings, external_annotations, tensormem })
    }
}

/// The typed snapshot of a parsed tree, with the entries `compactor` decoded during the parse.
pub fn snapshot(arena: &Arena, root: NodeId, compactor: EntryCompactor) -> Result<Snapshot> {
    let EntryCompactor { mut caches, lists, .. } = compactor;
    Decoder { arena, c: &mut caches, lasting: &|_| true }.snapshot(root, &mut lists.finish())
}

/// A Windows path (`C:\...\torch\functional.py`) with forward slashes, as Windows also
/// accepts: what reads frames (library or user code, PyTorch's own files) then reads it as on
/// Linux.
fn windows_path_as_posix(filename: String) -> String {
    if filename.contains('\\') { filename.replace('\\', "/") } else { filename }
}
