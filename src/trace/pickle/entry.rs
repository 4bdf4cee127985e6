//! The parser's fast path for trace entries: the bytes of one entry dict, in the shape PyTorch's
//! pickler writes them, read in one pass instead of opcode by opcode through the stack.
//!
//! A 1 GB snapshot is 11.5 million such dicts, and the generic machine (a stack slot per value,
//! a node per container, memo bookkeeping per opcode) cost ten times a plain walk over the
//! opcodes. The shape read here:
//!
//! ```text
//! EMPTY_DICT [MEMOIZE | BINPUT i] MARK
//!     (key: BINGET of a memoized string)
//!     (value: an integer inline | BINGET | None | a string [MEMOIZE | BINPUT i]
//!      | a new list of BINGETs [MEMOIZE | BINPUT i]: a frame list)
//!     ...
//! SETITEMS
//! ```
//!
//! Anything else (a key or a frame met for the first time, a tuple, a chunk that ends inside
//! the entry) changes nothing the memo shows (at most a string or list is parked that nothing
//! names), and the same bytes run through the generic opcodes, which give the same result; so
//! the fast path only has to be right where it says yes.

use super::*;

/// Where a memo index comes from: MEMOIZE takes the next one, BINPUT names it. `Some(None)`:
/// `op` writes no memo entry; None: an index the generic path refuses (the shape does not hold).
fn memo_index(op: u8, b: &mut Bytes, next: &mut usize, read: usize) -> Option<Option<usize>> {
    let idx = match op {
        0x94 => *next,
        b'q' => b.u8()? as usize,
        b'r' => b.u32()? as usize,
        _ => return Some(None),
    };
    // What the generic path refuses as absurd, it refuses itself.
    if idx > read.saturating_mul(2).saturating_add(16).min(u32::MAX as usize - 2) {
        return None;
    }
    *next = (*next).max(idx + 1);
    Some(Some(idx))
}

/// Bytes of one chunk, read with bounds: running out is a reason to let the generic path wait.
struct Bytes<'a> {
    data: &'a [u8],
    pos: usize,
}

impl Bytes<'_> {
    fn u8(&mut self) -> Option<u8> {
        let v = *self.data.get(self.pos)?;
        self.pos += 1;
        Some(v)
    }

    fn take(&mut self, n: usize) -> Option<&[u8]> {
        let bytes = self.data.get(self.pos..self.pos.checked_add(n)?)?;
        self.pos += n;
        Some(bytes)
    }

    fn u16(&mut self) -> Option<u16> {
        Some(u16::from_le_bytes(self.take(2)?.try_into().ok()?))
    }

    fn u32(&mut self) -> Option<u32> {
        Some(u32::from_le_bytes(self.take(4)?.try_into().ok()?))
    }

    fn peek(&self) -> Option<u8> {
        self.data.get(self.pos).copied()
    }
}

/// The memo entries an entry writes, made once it is decoded: the dict's (its node is made
/// then) and those of its new frame list and strings, parked (`Parked`).
#[derive(Default)]
struct Writes {
    dict: Option<usize>,
    parked: [(usize, u32); Writes::MAX_PARKED],
    len: usize,
}

impl Writes {
    /// A frame list and three strings: more is not an entry PyTorch writes.
    const MAX_PARKED: usize = 4;

    fn writes(&self, idx: usize) -> bool {
        self.dict == Some(idx) || self.parked[..self.len].iter().any(|&(i, _)| i == idx)
    }

    /// Memo entry `idx` will name `parked` (`PARKED_LIST | k`, `PARKED_STRING | s`).
    fn park(&mut self, idx: Option<usize>, parked: u32) -> Option<()> {
        let Some(idx) = idx else { return Some(()) };
        if self.len == Self::MAX_PARKED {
            return None;
        }
        self.parked[self.len] = (idx, parked);
        self.len += 1;
        Some(())
    }
}

impl Parser {
    /// A node the memo holds at `idx`, if it holds a plain one (not a freed entry, not a parked value).
    fn memo_node(&self, idx: usize) -> Option<NodeId> {
        match self.memo_at(idx) {
            Memo::Node(id) => Some(id),
            _ => None,
        }
    }

    /// The memo index a BINGET / LONG_BINGET (`op`) reads, unless it is one this entry writes
    /// itself.
    fn memo_read(op: u8, b: &mut Bytes, writes: &Writes) -> Option<usize> {
        let idx = match op {
            b'h' => b.u8()? as usize,
            b'j' => b.u32()? as usize,
            _ => return None,
        };
        (!writes.writes(idx)).then_some(idx)
    }

    /// A memoized node read by BINGET / LONG_BINGET (`op`).
    fn got(&self, op: u8, b: &mut Bytes, writes: &Writes) -> Option<NodeId> {
        self.memo_node(Self::memo_read(op, b, writes)?)
    }

    /// The memo index an optional MEMOIZE / BINPUT after a value writes.
    fn memoized(b: &mut Bytes, next: &mut usize, read: usize) -> Option<Option<usize>> {
        match b.peek()? {
            op @ (0x94 | b'q' | b'r') => {
                b.u8();
                memo_index(op, b, next, read)
            }
            _ => Some(None),
        }
    }

    /// Reads the trace entry whose EMPTY_DICT opcode ends at `r.pos`, through its SETITEMS,
    /// into keys and values that `Compact::read_entry` decodes, and leaves its `Node::Entry`
    /// on the stack, as SETITEMS would leave the dict. No node is made for its values: its new
    /// frame list and strings are parked at once, as the generic path parks the list once the
    /// entry is decoded. False: not in the shape this reads, or not an entry the compactor is
    /// sure of (nothing the memo shows was changed; the generic opcodes take over at the same
    /// byte).
    pub(super) fn read_entry(&mut self, r: &mut Reader, compact: &mut dyn Compact) -> bool {
        let mut items = std::mem::take(&mut self.entry_items);
        items.clear();
        let read = self.read_entry_items(r, compact, &mut items).is_some();
        self.entry_items = items;
        if read {
            self.read_fast += 1;
        }
        read
    }

    fn read_entry_items(&mut self, r: &mut Reader, compact: &mut dyn Compact, items: &mut Vec<(NodeId, EntryValue)>) -> Option<()> {
        let mut b = Bytes { data: r.data, pos: r.pos };
        let read = r.base + r.pos;
        let mut next = self.memo.len();
        let mut writes = Writes::default();
        let op = b.u8()?;
        writes.dict = memo_index(op, &mut b, &mut next, read)?;
        let mark = if writes.dict.is_some() { b.u8()? } else { op };
        (mark == b'(').then_some(())?;
        // The entry's new frame list, parked as `k` (one at most).
        let mut new_list = None;
        loop {
            let op = b.u8()?;
            if op == b'u' {
                break;
            }
            if items.len() == MAX_ENTRY_ITEMS / 2 {
                return None;
            }
            let key = self.got(op, &mut b, &writes)?;
            let value = match b.u8()? {
                b'K' => EntryValue::Int(b.u8()? as i64),
                b'M' => EntryValue::Int(b.u16()? as i64),
                b'J' => EntryValue::Int(i32::from_le_bytes(b.take(4)?.try_into().ok()?) as i64),
                0x8a => match b.u8()? {
                    len @ 0..=8 => EntryValue::Int(le_i64(b.take(len as usize)?)),
                    _ => return None,
                },
                b'N' => EntryValue::None,
                op @ (b'h' | b'j') => match self.memo_at(Self::memo_read(op, &mut b, &writes)?) {
                    // A frame list parked with the entry that first had it, read again (a free
                    // names its alloc's list).
                    Memo::List(k) => EntryValue::Frames(k),
                    Memo::String(s) => EntryValue::Str(s),
                    Memo::Node(id) => EntryValue::Node(id),
                    Memo::Empty | Memo::Released => return None,
                },
                // A string met here (a G3 snapshot writes a new "N/A" in every entry).
                op @ (0x8c | b'X') => {
                    let len = if op == 0x8c { b.u8()? as usize } else { b.u32()? as usize };
                    let s = self.parked.string(std::str::from_utf8(b.take(len)?).ok()?)?;
                    writes.park(Self::memoized(&mut b, &mut next, read)?, PARKED_STRING | s)?;
                    EntryValue::Str(s)
                }
                b']' if new_list.is_none() => {
                    let list_memo = Self::memoized(&mut b, &mut next, read)?;
                    let mut list = std::mem::take(&mut self.list_items);
                    list.clear();
                    let k = self.scan_list(&mut b, &writes, list_memo, &mut list).and_then(|()| self.parked.list(&list));
                    self.list_items = list;
                    let k = k?;
                    writes.park(list_memo, PARKED_LIST | k)?;
                    new_list = Some(k);
                    EntryValue::Frames(k)
                }
                _ => return None,
            };
            items.push((key, value));
        }
        if items.is_empty() || self.arena.len() + 1 >= (COMPACTED - 1) as usize {
            return None;
        }
        let memo_slot = &self.memo_slot;
        let lasting = |id: NodeId| memo_slot.get(id as usize).is_some_and(|&slot| slot != NOT_MEMOIZED);
        let k = compact.read_entry(&self.arena, items, &self.parked, &lasting)?;
        // Decoded: write what the opcodes would have left.
        r.pos = b.pos;
        let entry = self.new_node(Node::Entry(k));
        if let Some(idx) = writes.dict {
            self.memo_put(idx, entry);
        }
        for &(idx, parked) in &writes.parked[..writes.len] {
            self.memo_park(idx, parked);
        }
        // What BINGET read is referred to twice now: never freed (a new list's items too: one
        // of them may be an entry dict still waiting on the stack, which `appended` would free).
        for &(key, value) in items.iter() {
            self.share(key);
            if let EntryValue::Node(id) = value {
                self.share(id);
            }
        }
        if let Some(k) = new_list {
            for &item in self.parked.lists[k as usize].iter() {
                self.memo_slot[item as usize] = SHARED;
            }
        }
        self.stack.push(Slot::Node(entry));
        Some(())
    }

    /// The items of a new list of memoized items after EMPTY_LIST and its memo write (`own`):
    /// nothing, one item and APPEND, or MARK, items and APPENDS. Its items go to `list`.
    fn scan_list(&self, b: &mut Bytes, writes: &Writes, own: Option<usize>, list: &mut Vec<NodeId>) -> Option<()> {
        let item = |b: &mut Bytes, op: u8| {
            let idx = Self::memo_read(op, b, writes).filter(|&idx| Some(idx) != own)?;
            self.memo_node(idx)
        };
        match b.peek()? {
            b'h' | b'j' => {
                let op = b.u8()?;
                let item = item(b, op)?;
                (b.u8()? == b'a').then_some(())?;
                list.push(item);
            }
            b'(' => {
                b.u8();
                loop {
                    let op = b.u8()?;
                    if op == b'e' {
                        break;
                    }
                    let item = item(b, op)?;
                    list.push(item);
                }
            }
            _ => {}
        }
        Some(())
    }
}
