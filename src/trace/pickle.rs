//! A pickle reader (protocols 2 to 5) that builds plain data and never runs code.
//!
//! Every opcode that could import or call something (GLOBAL, STACK_GLOBAL, REDUCE, BUILD, INST,
//! OBJ, NEWOBJ, persistent ids, extension registry) is refused: real snapshots need none. Memo
//! entries are node ids, so shared objects stay shared (see `node.rs`). Declared lengths are checked
//! against the bytes that remain, so a hostile file cannot make us allocate more than it is long.

mod entry;
mod parked;

use super::node::{Arena, COMPACTED, Node, NodeId, Val, is_compacted};
use parked::Memo;
pub use parked::Parked;
use std::fmt;

#[derive(Debug, Clone, PartialEq, Eq)]
pub struct PickleError {
    pub offset: usize,
    pub message: String,
}

impl fmt::Display for PickleError {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "bad pickle at byte {}: {}", self.offset, self.message)
    }
}

impl std::error::Error for PickleError {}

/// Names of the opcodes we refuse, for a clear message.
fn forbidden_opcode(op: u8) -> Option<&'static str> {
    Some(match op {
        b'c' => "GLOBAL",
        0x93 => "STACK_GLOBAL",
        b'R' => "REDUCE",
        b'b' => "BUILD",
        b'i' => "INST",
        b'o' => "OBJ",
        0x81 => "NEWOBJ",
        0x92 => "NEWOBJ_EX",
        b'P' => "PERSID",
        b'Q' => "BINPERSID",
        0x82 => "EXT1",
        0x83 => "EXT2",
        0x84 => "EXT4",
        _ => return None,
    })
}

#[derive(Clone, Copy)]
enum Slot {
    Node(NodeId),
    /// An integer that no container or memo entry has needed as a node yet (64 bits: a wider
    /// one is a node at once, which keeps a slot small).
    Int(i64),
    Mark,
}

/// Turns a finished container into typed data while the file is still being read, so that the
/// arena never holds the millions of trace-entry dicts of a large snapshot at once (see
/// `decode::EntryCompactor`). Called for each item appended to a list.
pub trait Compact {
    /// If `item`, just appended to `list`, can be stored in typed form, stores it and returns its
    /// index among the items compacted into that list; `release` receives the nodes it consumed
    /// (the item first, then its children), which the parser frees where nothing else refers to them.
    /// `lasting(id)`: whether node `id` outlives this item (the pickle memoized it, so a later
    /// reference may read it again and it is never freed): only such nodes may be remembered by
    /// id, as a freed node's id is reused.
    fn compact(&mut self, arena: &Arena, list: NodeId, item: NodeId, lasting: &dyn Fn(NodeId) -> bool, release: &mut Vec<NodeId>) -> Option<u32>;

    /// `items` (keys and values, alternating) are about to be set on an empty dict: if they make
    /// an item this compactor stores typed (a trace entry), decodes them straight from the
    /// parser's stack, never as a dict of nodes, and returns the index that `Node::Entry` keeps
    /// until `compact` receives the dict. `release`: the value nodes it consumed.
    fn entry(&mut self, _arena: &Arena, _items: &[Val], _lasting: &dyn Fn(NodeId) -> bool, _release: &mut Vec<NodeId>) -> Option<u32> {
        None
    }

    /// The bytes of a trace entry in PyTorch's shape were read straight into keys (memoized
    /// strings) and values (`pickle/entry.rs`): if they make an entry this compactor stores
    /// typed, stores it and returns the index that `Node::Entry` keeps. None leaves the same
    /// bytes to the generic opcodes, so this only decodes what it is sure of; nothing it did
    /// may be visible then. `parked`: the lists and strings `EntryValue` names; `lasting`: as
    /// for `compact`.
    fn read_entry(&mut self, _arena: &Arena, _items: &[(NodeId, EntryValue)], _parked: &Parked, _lasting: &dyn Fn(NodeId) -> bool) -> Option<u32> {
        None
    }
}

/// A trace entry's value as the parser's fast path reads it from the bytes, never as a node.
#[derive(Debug, Clone, Copy, PartialEq)]
pub enum EntryValue {
    Int(i64),
    /// `None`, which a field reads as absent.
    None,
    /// A memoized object read again (a string, a list a segment's block memoized first).
    Node(NodeId),
    /// A frame list of memoized frame dicts: `Parked::lists[k]` holds its items.
    Frames(u32),
    /// A string met in the entry (`Parked::strings[s]`).
    Str(u32),
}

/// Compacts nothing: the whole file stays a node tree.
#[cfg(test)]
pub struct KeepAll;

#[cfg(test)]
impl Compact for KeepAll {
    fn compact(&mut self, _: &Arena, _: NodeId, _: NodeId, _: &dyn Fn(NodeId) -> bool, _: &mut Vec<NodeId>) -> Option<u32> {
        None
    }
}

/// Why a step stopped early.
enum Halt {
    /// The opcode continues past the bytes fed so far.
    NeedMore,
    Error(PickleError),
}

impl From<PickleError> for Halt {
    fn from(e: PickleError) -> Halt {
        Halt::Error(e)
    }
}

struct Reader<'a> {
    data: &'a [u8],
    pos: usize,
    op_start: usize,
    /// Absolute offset of `data[0]` in the file.
    base: usize,
    /// The file's whole length (declared lengths are checked against it).
    total: usize,
    /// `data` reaches the end of the file: a short read is a truncation, not a wait.
    at_end: bool,
}

impl<'a> Reader<'a> {
    fn err(&self, message: impl Into<String>) -> PickleError {
        PickleError { offset: self.base + self.op_start, message: message.into() }
    }

    fn take(&mut self, n: usize) -> Result<&'a [u8], Halt> {
        let in_file = self.total.saturating_sub(self.base + self.pos);
        let here = self.data.len() - self.pos;
        if n > here {
            if self.at_end || n > in_file {
                let remain = if self.at_end { here } else { in_file };
                let plural = if n == 1 { "" } else { "s" };
                return Err(Halt::Error(self.err(format!("needs {n} byte{plural} but only {remain} remain (truncated file or bad length)"))));
            }
            return Err(Halt::NeedMore);
        }
        let bytes = &self.data[self.pos..self.pos + n];
        self.pos += n;
        Ok(bytes)
    }

    fn u8(&mut self) -> Result<u8, Halt> {
        Ok(self.take(1)?[0])
    }

    fn u16(&mut self) -> Result<u16, Halt> {
        Ok(u16::from_le_bytes(self.take(2)?.try_into().unwrap()))
    }

    fn u32(&mut self) -> Result<u32, Halt> {
        Ok(u32::from_le_bytes(self.take(4)?.try_into().unwrap()))
    }

    fn u64_len(&mut self) -> Result<usize, Halt> {
        let v = u64::from_le_bytes(self.take(8)?.try_into().unwrap());
        usize::try_from(v).map_err(|_| Halt::Error(self.err(format!("length {v} does not fit this machine"))))
    }

    fn utf8(&mut self, n: usize) -> Result<Box<str>, Halt> {
        let bytes = self.take(n)?;
        std::str::from_utf8(bytes).map(Into::into).map_err(|e| Halt::Error(self.err(format!("string is not UTF-8: {e}"))))
    }
}

/// Parses a whole pickle held in memory.
#[cfg(test)]
pub fn parse(data: &[u8]) -> Result<(Arena, NodeId), PickleError> {
    let mut parser = Parser::new(Some(data.len()));
    parser.feed(data, &mut KeepAll)?;
    parser.finish(&mut KeepAll)
}

/// Memo slots: a node id, or one of these.
const MEMO_EMPTY: u32 = u32::MAX;
/// The memoized object was compacted and freed; reading it again is refused.
const MEMO_RELEASED: u32 = u32::MAX - 1;
/// A parked list (`PARKED_LIST | k`) or string (`PARKED_STRING | s`), `k` and `s` below
/// `PARKED_MAX` (so that neither reads as the two above).
const PARKED_LIST: u32 = COMPACTED;
const PARKED_STRING: u32 = COMPACTED | 1 << 30;
const PARKED_MAX: u32 = (1 << 30) - 2;
/// `memo_slot` of a node referenced from more than one place: it is never freed.
const SHARED: u32 = u32::MAX;
const NOT_MEMOIZED: u32 = u32::MAX - 1;
/// Keys and values of a SETITEMS that may be a trace entry: 16 pairs (an entry has eleven keys
/// at most); a larger SETITEMS is something else.
const MAX_ENTRY_ITEMS: usize = 2 * 16;

/// A pickle reader fed in chunks (a file read as a stream): each `feed` runs every opcode whose
/// bytes have arrived and keeps the incomplete tail for the next.
pub struct Parser {
    /// Bytes of an opcode not complete yet.
    pending: Vec<u8>,
    /// Absolute offset of `pending[0]`.
    base: usize,
    total: usize,
    arena: Arena,
    stack: Vec<Slot>,
    memo: Vec<u32>,
    /// What the memo names without a node (see `Parked`).
    parked: Parked,
    /// Per node: the memo index that refers to it, `NOT_MEMOIZED`, or `SHARED` once anything
    /// (BINGET, DUP, a second memo write) refers to it a second time.
    memo_slot: Vec<u32>,
    release: Vec<NodeId>,
    /// Scratch: the items of a SETITEMS offered to `Compact::entry`.
    items: Vec<Val>,
    /// Scratch: the items of the frame list `read_entry` met.
    list_items: Vec<NodeId>,
    /// Scratch: the keys and values `read_entry` read.
    entry_items: Vec<(NodeId, EntryValue)>,
    /// Trace entries `read_entry` decoded (the rest took the generic opcodes).
    read_fast: usize,
    /// Trace entries are read by the fast paths (`read_entry`, `set_items_as_entry`); off, only
    /// by the generic opcodes and `Compact::compact` (which tests compare them with).
    fast_entries: bool,
    stopped: bool,
}

impl Parser {
    /// `total`: the file's length when known (lengths beyond it are errors at once).
    pub fn new(total: Option<usize>) -> Parser {
        let total = total.unwrap_or(usize::MAX);
        Parser {
            pending: Vec::new(),
            base: 0,
            total,
            // Roughly one node per 3 bytes in real snapshots; the cap keeps a tiny hostile file cheap.
            arena: Arena::with_capacity((total / 4).min(1 << 16)),
            stack: Vec::new(),
            memo: Vec::new(),
            parked: Parked::default(),
            memo_slot: Vec::new(),
            release: Vec::new(),
            items: Vec::new(),
            list_items: Vec::new(),
            entry_items: Vec::new(),
            read_fast: 0,
            fast_entries: true,
            stopped: false,
        }
    }

    /// Bytes fed so far.
    pub fn position(&self) -> usize {
        self.base + self.pending.len()
    }

    pub fn feed(&mut self, chunk: &[u8], compact: &mut dyn Compact) -> Result<(), PickleError> {
        if self.pending.is_empty() {
            let used = self.run(chunk, false, compact)?;
            self.base += used;
            self.pending.extend_from_slice(&chunk[used..]);
        } else {
            let mut data = std::mem::take(&mut self.pending);
            data.extend_from_slice(chunk);
            let used = self.run(&data, false, compact)?;
            self.base += used;
            data.drain(..used);
            self.pending = data;
        }
        Ok(())
    }

    /// Ends the input: the pickle must have stopped, with nothing but zero padding after.
    pub fn finish(mut self, compact: &mut dyn Compact) -> Result<(Arena, NodeId), PickleError> {
        let data = std::mem::take(&mut self.pending);
        self.total = self.base + data.len();
        self.run(&data, true, compact)?;
        match self.stack.as_slice() {
            [Slot::Node(root)] => Ok((self.arena, *root)),
            &[Slot::Int(i)] => {
                let root = self.arena.push(Node::Int(i as i128));
                Ok((self.arena, root))
            }
            _ => Err(PickleError { offset: self.total, message: "STOP with a stack that does not hold exactly one value".into() }),
        }
    }

    /// Runs the opcodes complete in `data` (which starts at `self.base`); returns how many bytes
    /// they used.
    fn run(&mut self, data: &[u8], at_end: bool, compact: &mut dyn Compact) -> Result<usize, PickleError> {
        let mut r = Reader { data, pos: 0, op_start: 0, base: self.base, total: self.total, at_end };
        if self.stopped {
            if data.iter().any(|&b| b != 0) {
                // Trailing garbage after STOP is almost certainly a concatenation or corruption.
                return Err(PickleError { offset: self.base + data.iter().position(|&b| b != 0).unwrap_or(0), message: "data continues after STOP".into() });
            }
            return Ok(data.len());
        }
        loop {
            r.op_start = r.pos;
            if r.pos == data.len() {
                if !at_end {
                    return Ok(r.pos);
                }
                return Err(r.err("the file ends before the pickle does (truncated?)"));
            }
            match self.step(&mut r, compact) {
                Ok(true) => continue,
                Ok(false) => {
                    self.stopped = true;
                    let rest = &data[r.pos..];
                    if let Some(i) = rest.iter().position(|&b| b != 0) {
                        return Err(PickleError { offset: self.base + r.pos + i, message: "data continues after STOP".into() });
                    }
                    return Ok(data.len());
                }
                Err(Halt::NeedMore) => return Ok(r.op_start),
                Err(Halt::Error(e)) => return Err(e),
            }
        }
    }

    fn new_node(&mut self, node: Node) -> NodeId {
        let id = self.arena.push(node);
        let i = id as usize;
        if i >= self.memo_slot.len() {
            self.memo_slot.resize(i + 1, NOT_MEMOIZED);
        }
        self.memo_slot[i] = NOT_MEMOIZED;
        id
    }

    fn push(&mut self, node: Node) {
        let id = self.new_node(node);
        self.stack.push(Slot::Node(id));
    }

    /// A value slot's node: an integer kept on the stack gets one now.
    fn node_of(&mut self, slot: Slot) -> NodeId {
        match slot {
            Slot::Node(id) => id,
            Slot::Int(i) => self.new_node(Node::Int(i as i128)),
            Slot::Mark => unreachable!("callers pass value slots"),
        }
    }

    fn pop_value(&mut self, r: &Reader) -> Result<NodeId, PickleError> {
        match self.stack.pop() {
            Some(Slot::Mark) => Err(r.err("found a MARK where a value was expected")),
            Some(slot) => Ok(self.node_of(slot)),
            None => Err(r.err("stack underflow")),
        }
    }

    /// The top value's node, which stays on the stack (an integer gets its node here, once, so
    /// that a memo entry and the container it goes into share it).
    fn top_value(&mut self, r: &Reader) -> Result<NodeId, PickleError> {
        match self.stack.last().copied() {
            Some(Slot::Mark) => Err(r.err("found a MARK where a value was expected")),
            Some(slot) => {
                let id = self.node_of(slot);
                *self.stack.last_mut().expect("just read") = Slot::Node(id);
                Ok(id)
            }
            None => Err(r.err("stack underflow")),
        }
    }

    /// Where the last MARK is on the stack.
    fn mark(&self, r: &Reader) -> Result<usize, PickleError> {
        self.stack.iter().rposition(|s| matches!(s, Slot::Mark)).ok_or_else(|| r.err("no MARK on the stack"))
    }

    fn pop_to_mark(&mut self, r: &Reader) -> Result<Vec<NodeId>, PickleError> {
        let mark = self.mark(r)?;
        // Integers kept on the stack become nodes here, many at once.
        if self.arena.len() + (self.stack.len() - mark) >= (COMPACTED - 1) as usize {
            return Err(r.err("more objects than node ids"));
        }
        let slots: Vec<Slot> = self.stack.drain(mark..).skip(1).collect();
        Ok(slots.into_iter().map(|slot| self.node_of(slot)).collect())
    }

    /// SETITEMS of a trace entry's keys and values onto the empty dict below their MARK: the
    /// compactor decodes them straight from the stack (`Compact::entry`) and the dict becomes a
    /// `Node::Entry`. False (anything else) leaves the items to the generic path.
    fn set_items_as_entry(&mut self, mark: usize, compact: &mut dyn Compact) -> bool {
        let Some(&Slot::Node(dict)) = mark.checked_sub(1).and_then(|i| self.stack.get(i)) else { return false };
        if !matches!(self.arena.get(dict), Node::Dict(items) if items.is_empty()) || self.memo_slot[dict as usize] == SHARED {
            return false;
        }
        let n = self.stack.len() - mark - 1;
        if n == 0 || !n.is_multiple_of(2) || n > MAX_ENTRY_ITEMS {
            return false;
        }
        self.items.clear();
        for slot in &self.stack[mark + 1..] {
            self.items.push(match *slot {
                Slot::Node(id) => Val::Node(id),
                Slot::Int(i) => Val::Int(i),
                Slot::Mark => return false,
            });
        }
        let items = std::mem::take(&mut self.items);
        let decoded = self.decode_entry(dict, &items, compact);
        self.items = items;
        if decoded {
            self.stack.truncate(mark);
        }
        decoded
    }

    /// Offers the keys and values about to be set on the empty `dict` to `Compact::entry`; when
    /// they make a trace entry, `dict` becomes its `Node::Entry` and the value nodes it consumed
    /// are freed (where nothing else reaches them). The one step both fast paths end with.
    fn decode_entry(&mut self, dict: NodeId, items: &[Val], compact: &mut dyn Compact) -> bool {
        let mut release = std::mem::take(&mut self.release);
        release.clear();
        let memo_slot = &self.memo_slot;
        let lasting = |id: NodeId| memo_slot.get(id as usize).is_some_and(|&slot| slot != NOT_MEMOIZED);
        let decoded = compact.entry(&self.arena, items, &lasting, &mut release);
        if let Some(k) = decoded {
            *self.arena.get_mut(dict) = Node::Entry(k);
            self.free_consumed(&release, false);
        }
        self.release = release;
        decoded.is_some()
    }

    /// A second reference to `id` exists: it must never be freed.
    fn share(&mut self, id: NodeId) {
        self.memo_slot[id as usize] = SHARED;
    }

    fn memoize(&mut self, idx: usize, r: &Reader) -> Result<(), Halt> {
        let top = self.top_value(r)?;
        self.memo_put(idx, top);
        Ok(())
    }

    fn memo_put(&mut self, idx: usize, id: NodeId) {
        if idx >= self.memo.len() {
            self.memo.resize(idx + 1, MEMO_EMPTY);
        }
        self.memo[idx] = id;
        let slot = &mut self.memo_slot[id as usize];
        *slot = if *slot == NOT_MEMOIZED { idx as u32 } else { SHARED };
    }

    /// Items were appended to `list`: offer each to the compactor.
    fn appended(&mut self, list: NodeId, from: usize, compact: &mut dyn Compact) {
        let Node::List(items) = self.arena.get(list) else { return };
        let n = items.len();
        for at in from..n {
            let Node::List(items) = self.arena.get(list) else { return };
            let item = items[at];
            if is_compacted(item) || self.memo_slot[item as usize] == SHARED {
                continue;
            }
            self.release.clear();
            let mut release = std::mem::take(&mut self.release);
            let memo_slot = &self.memo_slot;
            // Memoized children are never freed (see below); the item itself may be.
            let lasting = |id: NodeId| id != item && memo_slot.get(id as usize).is_some_and(|&slot| slot != NOT_MEMOIZED);
            if let Some(k) = compact.compact(&self.arena, list, item, &lasting, &mut release) {
                if let Node::List(items) = self.arena.get_mut(list) {
                    items[at] = COMPACTED | k;
                }
                self.free_consumed(&release, true);
            }
            self.release = release;
        }
    }

    /// Frees what a compactor consumed (`release`, the item itself first where `with_item`)
    /// and no one else can reach: nodes never memoized (a memoized child, like a string, may
    /// be read again later).
    fn free_consumed(&mut self, release: &[NodeId], with_item: bool) {
        for (n, &id) in release.iter().enumerate() {
            if is_compacted(id) {
                continue;
            }
            let child = n > 0 || !with_item;
            match self.memo_slot[id as usize] {
                SHARED => continue,
                NOT_MEMOIZED => {}
                // A memoized child stays, unless it is a list of nodes that stay (an
                // entry's frames): its items are kept for the memo instead.
                idx if child => match self.park(id) {
                    Some(k) if self.memo[idx as usize] == id => self.memo[idx as usize] = PARKED_LIST | k,
                    _ => continue,
                },
                // Unless a later PUT reused the index for another object.
                idx if self.memo[idx as usize] == id => self.memo[idx as usize] = MEMO_RELEASED,
                _ => {}
            }
            self.arena.release(id);
        }
    }

    /// The index under which list `id`'s items are kept, when each of them stays in the arena
    /// (memoized: never freed); None for anything else.
    fn park(&mut self, id: NodeId) -> Option<u32> {
        let Node::List(items) = self.arena.get(id) else { return None };
        if !items.iter().all(|&item| !is_compacted(item) && self.memo_slot.get(item as usize).is_some_and(|&slot| slot != NOT_MEMOIZED)) {
            return None;
        }
        self.parked.list(items)
    }

    /// Writes a parked list or string (`PARKED_LIST | k`, `PARKED_STRING | s`) at memo index
    /// `idx`, where a node would be.
    fn memo_park(&mut self, idx: usize, parked: u32) {
        if idx >= self.memo.len() {
            self.memo.resize(idx + 1, MEMO_EMPTY);
        }
        self.memo[idx] = parked;
    }

    /// What memo entry `idx` holds.
    fn memo_at(&self, idx: usize) -> Memo {
        match self.memo.get(idx).copied().unwrap_or(MEMO_EMPTY) {
            MEMO_EMPTY => Memo::Empty,
            MEMO_RELEASED => Memo::Released,
            v if v & PARKED_STRING == PARKED_STRING => Memo::String(v & !PARKED_STRING),
            v if is_compacted(v) => Memo::List(v & !PARKED_LIST),
            id => Memo::Node(id),
        }
    }

    /// Runs one opcode; `Ok(false)` at STOP.
    fn step(&mut self, r: &mut Reader, compact: &mut dyn Compact) -> Result<bool, Halt> {
        let op = r.u8()?;
        if self.arena.len() >= (COMPACTED - 1) as usize {
            return Err(r.err("more objects than node ids").into());
        }
        if let Some(name) = forbidden_opcode(op) {
            return Err(r.err(format!("opcode {name} (0x{op:02x}) would import or call Python code; snapshots never need it, so it is refused")).into());
        }
        match op {
            0x80 => {
                let proto = r.u8()?;
                if !(2..=5).contains(&proto) {
                    return Err(r.err(format!("unsupported pickle protocol {proto} (2 to 5 are read)")).into());
                }
            }
            0x95 => {
                r.take(8)?; // FRAME: a length hint only
            }
            b'.' => return Ok(false),
            b'(' => self.stack.push(Slot::Mark),
            b'0' => match self.stack.pop() {
                Some(Slot::Mark) => return Err(r.err("found a MARK where a value was expected").into()),
                Some(_) => {}
                None => return Err(r.err("stack underflow").into()),
            },
            b'1' => {
                let mark = self.mark(r)?;
                self.stack.truncate(mark);
            }
            b'2' => {
                let top = self.top_value(r)?;
                self.share(top);
                self.stack.push(Slot::Node(top));
            }
            b'N' => self.push(Node::None),
            0x88 => self.push(Node::Bool(true)),
            0x89 => self.push(Node::Bool(false)),
            b'J' => {
                let v = i32::from_le_bytes(r.take(4)?.try_into().unwrap());
                self.stack.push(Slot::Int(v as i64))
            }
            b'K' => {
                let v = r.u8()?;
                self.stack.push(Slot::Int(v as i64))
            }
            b'M' => {
                let v = r.u16()?;
                self.stack.push(Slot::Int(v as i64))
            }
            0x8a | 0x8b => {
                let n = if op == 0x8a { r.u8()? as usize } else { r.u32()? as usize };
                let bytes = r.take(n)?;
                match long_from_bytes(bytes) {
                    Node::Int(v) if let Ok(v) = i64::try_from(v) => self.stack.push(Slot::Int(v)),
                    big => self.push(big),
                }
            }
            b'G' => {
                let v = f64::from_be_bytes(r.take(8)?.try_into().unwrap());
                self.push(Node::Float(v))
            }
            0x8c => {
                let n = r.u8()? as usize;
                let s = r.utf8(n)?;
                self.push(Node::Str(s))
            }
            b'X' => {
                let n = r.u32()? as usize;
                let s = r.utf8(n)?;
                self.push(Node::Str(s))
            }
            0x8d => {
                let n = r.u64_len()?;
                let s = r.utf8(n)?;
                self.push(Node::Str(s))
            }
            b'C' | b'B' | 0x8e | 0x96 => {
                let n = match op {
                    b'C' => r.u8()? as usize,
                    b'B' => r.u32()? as usize,
                    _ => r.u64_len()?,
                };
                r.take(n)?;
                self.push(Node::Bytes(n))
            }
            b'}' => {
                if !(self.fast_entries && self.read_entry(r, compact)) {
                    self.push(Node::Dict(Vec::new()))
                }
            }
            b']' => self.push(Node::List(Vec::new())),
            b')' => self.push(Node::Tuple(Vec::new())),
            0x8f => self.push(Node::Set(Vec::new())),
            b't' => {
                let items = self.pop_to_mark(r)?;
                self.push(Node::Tuple(items))
            }
            b'l' => {
                let items = self.pop_to_mark(r)?;
                self.push(Node::List(items));
                let list = self.top_value(r)?;
                self.appended(list, 0, compact);
            }
            0x91 => {
                let items = self.pop_to_mark(r)?;
                self.push(Node::Set(items))
            }
            0x85..=0x87 => {
                let n = (op - 0x84) as usize;
                let mut items = Vec::with_capacity(n);
                for _ in 0..n {
                    items.push(self.pop_value(r)?);
                }
                items.reverse();
                self.push(Node::Tuple(items))
            }
            b'd' => {
                let items = self.pop_to_mark(r)?;
                let entries = pairs(items, r)?;
                self.push(Node::Dict(entries))
            }
            b'a' | b'e' => {
                let new_items = if op == b'a' { vec![self.pop_value(r)?] } else { self.pop_to_mark(r)? };
                let list = self.top_value(r)?;
                let from = match self.arena.get_mut(list) {
                    Node::List(items) => {
                        let from = items.len();
                        items.extend(new_items);
                        from
                    }
                    other => return Err(r.err(format!("APPEND to {}", other.kind())).into()),
                };
                self.appended(list, from, compact);
            }
            0x90 => {
                let new_items = self.pop_to_mark(r)?;
                let set = self.top_value(r)?;
                match self.arena.get_mut(set) {
                    Node::Set(items) => items.extend(new_items),
                    other => return Err(r.err(format!("ADDITEMS to {}", other.kind())).into()),
                }
            }
            b's' => {
                let value = self.pop_value(r)?;
                let key = self.pop_value(r)?;
                let dict = self.top_value(r)?;
                dict_insert(&mut self.arena, dict, vec![(key, value)], r)?;
            }
            b'u' => {
                let mark = self.mark(r)?;
                if self.fast_entries && self.set_items_as_entry(mark, compact) {
                    return Ok(true);
                }
                let items = self.pop_to_mark(r)?;
                let entries = pairs(items, r)?;
                let dict = self.top_value(r)?;
                dict_insert(&mut self.arena, dict, entries, r)?;
            }
            0x94 => {
                let idx = self.memo.len();
                self.memoize(idx, r)?;
            }
            b'q' | b'r' => {
                let idx = if op == b'q' { r.u8()? as usize } else { r.u32()? as usize };
                // A real pickler numbers memo entries in order, one per opcode at least, so an
                // index beyond the bytes read so far is hostile (and would size the memo by it).
                let read = self.base + r.pos;
                if idx > read.saturating_mul(2).saturating_add(16).min(u32::MAX as usize - 2) {
                    return Err(r.err(format!("memo index {idx} is absurd after {read} bytes of pickle")).into());
                }
                self.memoize(idx, r)?;
            }
            b'h' | b'j' => {
                let idx = if op == b'h' { r.u8()? as usize } else { r.u32()? as usize };
                match self.memo_at(idx) {
                    Memo::Empty => return Err(r.err(format!("memo entry {idx} is read before it is written")).into()),
                    Memo::Released => {
                        return Err(r
                            .err(format!(
                                "memo entry {idx} (a trace entry) is referenced a second time; PyTorch never writes that, and tensormem has already decoded and freed it"
                            ))
                            .into())
                    }
                    // A parked list or string read again: a node from now on.
                    parked @ (Memo::List(_) | Memo::String(_)) => {
                        let node = match parked {
                            Memo::List(k) => Node::List(self.parked.lists[k as usize].to_vec()),
                            Memo::String(s) => Node::Str(self.parked.strings[s as usize].as_ref().into()),
                            _ => unreachable!("matched above"),
                        };
                        self.push(node);
                        let id = self.top_value(r)?;
                        self.memo[idx] = id;
                        self.share(id);
                    }
                    Memo::Node(id) => {
                        self.share(id);
                        self.stack.push(Slot::Node(id));
                    }
                }
            }
            0x97 | 0x98 => return Err(r.err("out-of-band buffers (protocol 5) are not supported").into()),
            b'I' | b'L' | b'F' | b'S' | b'V' | b'T' | b'U' | b'g' | b'p' => {
                return Err(r.err(format!("text opcode '{}' belongs to pickle protocol 0/1; snapshots use protocol 2 or later", op as char)).into());
            }
            _ => return Err(r.err(format!("unknown opcode 0x{op:02x}")).into()),
        }
        Ok(true)
    }
}

fn pairs(items: Vec<NodeId>, r: &Reader) -> Result<Vec<(NodeId, NodeId)>, PickleError> {
    if !items.len().is_multiple_of(2) {
        return Err(r.err("odd number of items for a dict"));
    }
    Ok(items.chunks_exact(2).map(|kv| (kv[0], kv[1])).collect())
}

fn dict_insert(arena: &mut Arena, dict: NodeId, entries: Vec<(NodeId, NodeId)>, r: &Reader) -> Result<(), PickleError> {
    // A repeated key is kept twice; `Arena::dict_get` reads the last one, as Python would keep it.
    match arena.get_mut(dict) {
        Node::Dict(current) => {
            current.extend(entries);
            Ok(())
        }
        other => Err(r.err(format!("SETITEM on {}", other.kind()))),
    }
}

fn long_from_bytes(bytes: &[u8]) -> Node {
    if bytes.len() <= 8 {
        return Node::Int(le_i64(bytes) as i128);
    }
    let negative = bytes[bytes.len() - 1] & 0x80 != 0;
    let pad = if negative { 0xff } else { 0 };
    // Sign-extension bytes may pad a value that still fits.
    let significant = bytes.len() - bytes.iter().rev().take_while(|&&b| b == pad).count();
    if significant > 16 || (significant == 16 && (bytes[15] & 0x80 != 0) != negative) {
        return Node::BigInt;
    }
    let mut buf = [pad; 16];
    let n = bytes.len().min(16);
    buf[..n].copy_from_slice(&bytes[..n]);
    Node::Int(i128::from_le_bytes(buf))
}

/// A little-endian two's-complement integer of at most 8 bytes, sign-extended (0 for none).
/// Built in a register: copying the bytes into a padded buffer and loading it back stalled
/// the load on every address and time of a trace (store forwarding fails on such a copy).
fn le_i64(bytes: &[u8]) -> i64 {
    debug_assert!(bytes.len() <= 8);
    if bytes.is_empty() {
        return 0;
    }
    let v = bytes.iter().rev().fold(0u64, |v, &b| v << 8 | b as u64);
    let unused = 64 - 8 * bytes.len() as u32;
    ((v << unused) as i64) >> unused
}

#[cfg(test)]
mod tests;
