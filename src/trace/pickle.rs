//! A pickle reader (protocols 2 to 5) that builds plain data and never runs code.
//!
//! Every opcode that could import or call something (GLOBAL, STACK_GLOBAL, REDUCE, BUILD, INST,
//! OBJ, NEWOBJ, persistent ids, extension registry) is refused: real snapshots need none. Memo
//! entries are node ids, so shared objects stay shared (see `node.rs`). Declared lengths are checked
//! against the bytes that remain, so a hostile file cannot make us allocate more than it is long.

mod entry;

use super::node::{Arena, COMPACTED, Node, NodeId, Val, is_compacted};
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

/// What the memo names without a node, each distinct value once: lists freed while the memo
/// still names them, and strings the fast path for trace entries read (`pickle/entry.rs`).
/// A real snapshot memoizes every trace entry's frame list (a new one per entry, of frame
/// dicts memoized once): 11.5 M lists held as nodes were most of the memory a 1 GB file took.
/// A G3 snapshot adds a new memoized `"N/A"` string per entry. A later reference (BINGET)
/// makes a node of it.
#[derive(Default)]
pub struct Parked {
    /// Items of lists of memoized nodes (`PARKED_LIST | k` in the memo).
    pub lists: Vec<Box<[NodeId]>>,
    list_index: rustc_hash::FxHashMap<Box<[NodeId]>, u32>,
    /// Strings (`PARKED_STRING | s` in the memo).
    pub strings: Vec<std::sync::Arc<str>>,
    string_index: rustc_hash::FxHashMap<std::sync::Arc<str>, u32>,
}

impl Parked {
    /// The index under which a list of memoized `items` is kept; None when there are too many.
    fn list(&mut self, items: &[NodeId]) -> Option<u32> {
        if let Some(&k) = self.list_index.get(items) {
            return Some(k);
        }
        let k = u32::try_from(self.lists.len()).ok().filter(|&k| k < PARKED_MAX)?;
        let items: Box<[NodeId]> = items.into();
        self.lists.push(items.clone());
        self.list_index.insert(items, k);
        Some(k)
    }

    /// The index under which string `s` is kept; None when there are too many.
    fn string(&mut self, s: &str) -> Option<u32> {
        if let Some(&k) = self.string_index.get(s) {
            return Some(k);
        }
        let k = u32::try_from(self.strings.len()).ok().filter(|&k| k < PARKED_MAX)?;
        let s: std::sync::Arc<str> = s.into();
        self.strings.push(s.clone());
        self.string_index.insert(s, k);
        Some(k)
    }
}

/// What a memo entry holds (`Parser::memo_at`).
#[derive(Clone, Copy)]
enum Memo {
    Empty,
    Released,
    Node(NodeId),
    /// `Parked::lists[k]`.
    List(u32),
    /// `Parked::strings[s]`.
    String(u32),
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
    if bytes.is_empty() {
        return Node::Int(0);
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

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn long1_decodes_twos_complement() {
        assert_eq!(long_from_bytes(&[0xff]), Node::Int(-1));
        assert_eq!(long_from_bytes(&[0x00, 0x80, 0x5c, 0x1e, 0x5b, 0x7f]), Node::Int(0x7f5b1e5c8000));
        // 2^64 - 1, as real frames carry for an unknown line
        assert_eq!(long_from_bytes(&[0xff, 0xff, 0xff, 0xff, 0xff, 0xff, 0xff, 0xff, 0]), Node::Int(u64::MAX as i128));
        assert_eq!(long_from_bytes(&[1, 0, 0, 0, 0, 0, 0, 0, 0]), Node::Int(1));
        assert_eq!(long_from_bytes(&[0; 17]), Node::Int(0));
        let mut huge = [0u8; 17];
        huge[16] = 1;
        assert_eq!(long_from_bytes(&huge), Node::BigInt);
    }

    #[test]
    fn refuses_globals() {
        // pickle.dumps(os.system, protocol=2) starts with PROTO 2, GLOBAL 'posix\nsystem\n'
        let data = b"\x80\x02cposix\nsystem\nq\x00.";
        let err = parse(data).unwrap_err();
        assert!(err.message.contains("GLOBAL"), "{err}");
        assert_eq!(err.offset, 2);
    }

    #[test]
    fn declared_length_beyond_file_is_an_error() {
        let data = b"\x80\x04X\xff\xff\xff\x7fabc.";
        let err = parse(data).unwrap_err();
        assert!(err.message.contains("remain"), "{err}");
    }

    /// A pickle decoded with or without the fast paths for trace entries, fed in chunks; with
    /// how many entries `read_entry` read.
    fn decode(data: &[u8], fast: bool, chunk: usize) -> (crate::trace::Snapshot, usize) {
        let mut parser = Parser::new(Some(data.len()));
        parser.fast_entries = fast;
        let mut compactor = crate::trace::decode::EntryCompactor::default();
        for piece in data.chunks(chunk) {
            parser.feed(piece, &mut compactor).unwrap();
        }
        let read_fast = parser.read_fast;
        let (arena, root) = parser.finish(&mut compactor).unwrap();
        (crate::trace::decode::snapshot(&arena, root, compactor).unwrap(), read_fast)
    }

    /// The real pickles the repository carries decode to the same snapshot through the fast
    /// paths for trace entries as through the generic opcodes alone, fed whole and in chunks
    /// that cut entries anywhere.
    #[test]
    fn the_fast_paths_for_trace_entries_decode_what_the_generic_opcodes_do() {
        let dir = std::path::Path::new(env!("CARGO_MANIFEST_DIR")).join("tests/data/real");
        let (mut read, mut total_fast, mut total) = (0, 0, 0);
        for file in std::fs::read_dir(&dir).unwrap() {
            let path = file.unwrap().path();
            if path.extension().is_none_or(|e| e != "pickle") {
                continue;
            }
            // The smaller ones (20 of them, from a dozen programs): a debug build is slow.
            if std::fs::metadata(&path).unwrap().len() > 1_500_000 {
                continue;
            }
            let data = std::fs::read(&path).unwrap();
            let (generic, _) = decode(&data, false, data.len().max(1));
            let (fast, read_fast) = decode(&data, true, data.len().max(1));
            assert!(fast == generic, "{}", path.display());
            assert!(decode(&data, true, 997).0 == generic, "{} in chunks", path.display());
            // The fast path reads PyTorch's entries, all but those that meet a frame dict or
            // a key for the first time.
            let entries: usize = generic.device_traces.iter().map(Vec::len).sum();
            (total_fast, total) = (total_fast + read_fast, total + entries);
            read += 1;
        }
        assert!(read >= 15, "{read} pickles in {}", dir.display());
        assert!(total_fast * 100 >= total * 95, "{total_fast} of {total} entries read fast");
    }

    /// A protocol-2 pickle as Python writes it (`pickle.dumps(snapshot, protocol=2)`: BINPUT for
    /// every memo entry, all entries appended at the end in one APPENDS, a frame list read again
    /// before its entry is appended, an `oom` entry with a 2^62-byte request and `device_free`,
    /// a line of 2^64 - 1) reads the same with and without the fast paths, fed whole or byte by byte.
    #[test]
    fn a_protocol_2_pickle_reads_the_same_with_and_without_the_fast_paths() {
        const DATA: &[u8] = b"\x80\x02\x7d\x71\x00\x28\x58\x08\x00\x00\x00\x73\x65\x67\x6d\x65\x6e\x74\x73\x71\x01\x5d\x71\x02\
\x58\x0d\x00\x00\x00\x64\x65\x76\x69\x63\x65\x5f\x74\x72\x61\x63\x65\x73\x71\x03\x5d\x71\x04\x5d\
\x71\x05\x28\x7d\x71\x06\x28\x58\x06\x00\x00\x00\x61\x63\x74\x69\x6f\x6e\x71\x07\x58\x0d\x00\x00\
\x00\x73\x65\x67\x6d\x65\x6e\x74\x5f\x61\x6c\x6c\x6f\x63\x71\x08\x58\x04\x00\x00\x00\x61\x64\x64\
\x72\x71\x09\x8a\x06\x00\x00\x00\x00\x00\x01\x58\x04\x00\x00\x00\x73\x69\x7a\x65\x71\x0a\x4a\x00\
\x00\x20\x00\x58\x06\x00\x00\x00\x73\x74\x72\x65\x61\x6d\x71\x0b\x4b\x00\x58\x07\x00\x00\x00\x74\
\x69\x6d\x65\x5f\x75\x73\x71\x0c\x8a\x07\x00\x40\x1e\x18\x24\x0b\x06\x58\x06\x00\x00\x00\x66\x72\
\x61\x6d\x65\x73\x71\x0d\x5d\x71\x0e\x7d\x71\x0f\x28\x58\x08\x00\x00\x00\x66\x69\x6c\x65\x6e\x61\
\x6d\x65\x71\x10\x58\x08\x00\x00\x00\x74\x72\x61\x69\x6e\x2e\x70\x79\x71\x11\x58\x04\x00\x00\x00\
\x6c\x69\x6e\x65\x71\x12\x4b\x0c\x58\x04\x00\x00\x00\x6e\x61\x6d\x65\x71\x13\x58\x04\x00\x00\x00\
\x73\x74\x65\x70\x71\x14\x75\x61\x75\x7d\x71\x15\x28\x68\x07\x58\x05\x00\x00\x00\x61\x6c\x6c\x6f\
\x63\x71\x16\x68\x09\x8a\x06\x00\x00\x00\x00\x00\x01\x68\x0a\x4d\x00\x02\x68\x0b\x4b\x00\x68\x0c\
\x8a\x07\x00\x40\x1e\x18\x24\x0b\x06\x68\x0d\x5d\x71\x17\x28\x68\x0f\x7d\x71\x18\x28\x68\x10\x58\
\x08\x00\x00\x00\x6d\x6f\x64\x65\x6c\x2e\x70\x79\x71\x19\x68\x12\x8a\x09\xff\xff\xff\xff\xff\xff\
\xff\xff\x00\x68\x13\x58\x07\x00\x00\x00\x66\x6f\x72\x77\x61\x72\x64\x71\x1a\x75\x65\x75\x7d\x71\
\x1b\x28\x68\x07\x68\x16\x68\x09\x8a\x06\x00\x02\x00\x00\x00\x01\x68\x0a\x4d\x00\x04\x68\x0b\x4b\
\x00\x68\x0c\x8a\x07\x00\x42\x1e\x18\x24\x0b\x06\x68\x0d\x5d\x71\x1c\x28\x68\x18\x68\x0f\x65\x75\
\x7d\x71\x1d\x28\x68\x07\x58\x0e\x00\x00\x00\x66\x72\x65\x65\x5f\x72\x65\x71\x75\x65\x73\x74\x65\
\x64\x71\x1e\x68\x09\x8a\x06\x00\x00\x00\x00\x00\x01\x68\x0a\x4d\x00\x02\x68\x0b\x4b\x00\x68\x0c\
\x8a\x07\x00\x40\x1e\x18\x24\x0b\x06\x68\x0d\x68\x17\x75\x7d\x71\x1f\x28\x68\x07\x58\x0e\x00\x00\
\x00\x66\x72\x65\x65\x5f\x63\x6f\x6d\x70\x6c\x65\x74\x65\x64\x71\x20\x68\x09\x8a\x06\x00\x00\x00\
\x00\x00\x01\x68\x0a\x4d\x00\x02\x68\x0b\x4b\x00\x68\x0c\x8a\x07\x00\x40\x1e\x18\x24\x0b\x06\x68\
\x0d\x68\x17\x75\x7d\x71\x21\x28\x68\x07\x58\x03\x00\x00\x00\x6f\x6f\x6d\x71\x22\x68\x09\x4b\x00\
\x68\x0a\x8a\x08\x00\x00\x00\x00\x00\x00\x00\x40\x68\x0b\x4b\x00\x68\x0c\x8a\x07\x00\x40\x1e\x18\
\x24\x0a\x06\x68\x0d\x5d\x71\x23\x58\x0b\x00\x00\x00\x64\x65\x76\x69\x63\x65\x5f\x66\x72\x65\x65\
\x71\x24\x4b\x03\x75\x65\x61\x75\x2e";
        let decoded: Vec<_> = [(false, DATA.len()), (true, DATA.len()), (true, 1), (false, 1)].map(|(fast, chunk)| decode(DATA, fast, chunk).0).into();
        assert!(decoded.iter().all(|s| *s == decoded[0]));
        let trace = &decoded[0].device_traces[0];
        let actions: Vec<&str> = trace.iter().map(|e| e.action.name()).collect();
        assert_eq!(actions, ["segment_alloc", "alloc", "alloc", "free_requested", "free_completed", "oom"]);
        assert_eq!((trace[2].addr, trace[2].size, trace[2].time_us), ((1 << 40) + 512, 1024, Some(1_700_000_000_000_000 + (1 << 40) + 512)));
        assert_eq!((trace[5].size, trace[5].device_free()), (1 << 62, Some(3)));
        let frames = trace[1].frames.as_deref().unwrap();
        assert_eq!((frames[1].name.as_str(), frames[1].line), ("forward", u64::MAX));
        assert!(std::sync::Arc::ptr_eq(trace[1].frames.as_ref().unwrap(), trace[3].frames.as_ref().unwrap()));
    }

    /// A frame list and a string met in entries the fast path reads are parked at once; later
    /// entries the generic opcodes read (a key the fast path does not know, holding a tuple)
    /// read them back as nodes, and more entries the fast path reads find those nodes: the
    /// same decode as the generic opcodes alone give, one stack and one string shared.
    #[test]
    fn what_the_fast_path_parked_is_read_back_by_the_generic_opcodes() {
        // pickle.dumps(protocol=4) of seven entries: the first meets its frame dict (generic),
        // the second has a new list of it (fast), the third an odd key (generic), the fourth
        // the second's list again (fast), the fifth a new "N/A" (fast), the sixth that string
        // and an odd key (generic), the seventh that string again (fast).
        const DATA: &[u8] = b"\x80\x04\x95\x7c\x01\x00\x00\x00\x00\x00\x00\x7d\x94\x28\x8c\x08\x73\x65\x67\x6d\x65\x6e\x74\x73\
\x94\x5d\x94\x8c\x0d\x64\x65\x76\x69\x63\x65\x5f\x74\x72\x61\x63\x65\x73\x94\x5d\x94\x5d\x94\x28\
\x7d\x94\x28\x8c\x06\x61\x63\x74\x69\x6f\x6e\x94\x8c\x05\x61\x6c\x6c\x6f\x63\x94\x8c\x04\x61\x64\
\x64\x72\x94\x4b\x00\x8c\x04\x73\x69\x7a\x65\x94\x4d\x00\x02\x8c\x06\x73\x74\x72\x65\x61\x6d\x94\
\x4b\x00\x8c\x06\x66\x72\x61\x6d\x65\x73\x94\x5d\x94\x7d\x94\x28\x8c\x08\x66\x69\x6c\x65\x6e\x61\
\x6d\x65\x94\x8c\x04\x61\x2e\x70\x79\x94\x8c\x04\x6c\x69\x6e\x65\x94\x4b\x01\x8c\x04\x6e\x61\x6d\
\x65\x94\x8c\x01\x66\x94\x75\x61\x75\x7d\x94\x28\x68\x07\x68\x08\x68\x09\x4d\x00\x04\x68\x0a\x4d\
\x00\x02\x68\x0b\x4b\x00\x68\x0c\x5d\x94\x68\x0e\x61\x75\x7d\x94\x28\x68\x07\x8c\x0e\x66\x72\x65\
\x65\x5f\x72\x65\x71\x75\x65\x73\x74\x65\x64\x94\x68\x09\x4d\x00\x04\x68\x0a\x4d\x00\x02\x68\x0b\
\x4b\x00\x68\x0c\x68\x15\x8c\x0f\x63\x6f\x6d\x70\x69\x6c\x65\x5f\x63\x6f\x6e\x74\x65\x78\x74\x94\
\x8c\x01\x78\x94\x8c\x03\x6f\x64\x64\x94\x4b\x00\x4b\x01\x86\x94\x75\x7d\x94\x28\x68\x07\x68\x17\
\x68\x09\x4d\x00\x04\x68\x0a\x4d\x00\x02\x68\x0b\x4b\x00\x68\x0c\x68\x15\x75\x7d\x94\x28\x68\x07\
\x68\x08\x68\x09\x4d\x00\x08\x68\x0a\x4d\x00\x02\x68\x0b\x4b\x00\x68\x0c\x68\x15\x68\x18\x8c\x03\
\x4e\x2f\x41\x94\x75\x7d\x94\x28\x68\x07\x68\x08\x68\x09\x4d\x00\x10\x68\x0a\x4d\x00\x02\x68\x0b\
\x4b\x00\x68\x0c\x68\x15\x68\x18\x68\x1e\x68\x1a\x4b\x00\x4b\x01\x4b\x02\x87\x94\x75\x7d\x94\x28\
\x68\x07\x68\x08\x68\x09\x4d\x00\x20\x68\x0a\x4d\x00\x02\x68\x0b\x4b\x00\x68\x0c\x68\x15\x68\x18\
\x68\x1e\x75\x65\x61\x75\x2e";
        let (generic, _) = decode(DATA, false, DATA.len());
        let (fast, read_fast) = decode(DATA, true, DATA.len());
        assert_eq!(read_fast, 4);
        assert!(fast == generic);
        assert!(decode(DATA, true, 1).0 == generic);
        let trace = &fast.device_traces[0];
        let addrs = [0, 1024, 1024, 1024, 2048, 4096, 8192];
        assert_eq!(trace.iter().map(|e| e.addr).collect::<Vec<_>>(), addrs);
        let frames = |i: usize| trace[i].frames.clone().unwrap();
        assert_eq!((frames(1)[0].filename.as_str(), frames(1)[0].line, frames(1)[0].name.as_str()), ("a.py", 1, "f"));
        assert!((2..7).all(|i| std::sync::Arc::ptr_eq(&frames(1), &frames(i))));
        let context = |i: usize| trace[i].extra.as_ref().and_then(|x| x.compile_context.clone());
        assert_eq!(context(2).as_deref(), Some("x"));
        assert!((4..7).all(|i| context(i).as_deref() == Some("N/A")));
    }

    #[test]
    fn memo_sharing_is_kept() {
        // [d, d] where d = {} is memoized once: pickle.dumps([d, d], protocol=4)
        let data = b"\x80\x04\x95\x09\x00\x00\x00\x00\x00\x00\x00]\x94(}\x94h\x01e.";
        let (arena, root) = parse(data).unwrap();
        let Node::List(items) = arena.get(root) else { panic!() };
        assert_eq!(items.len(), 2);
        assert_eq!(items[0], items[1]);
    }
}
