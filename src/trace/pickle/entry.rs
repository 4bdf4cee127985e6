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
//!     (value: an integer inline | BINGET | None | a new list of BINGETs: a frame list)
//!     ...
//! SETITEMS
//! ```
//!
//! Anything else (a key or a frame met for the first time, a tuple, a chunk that ends inside
//! the entry) changes nothing, and the same bytes run through the generic opcodes, which give
//! the same result; so the fast path only has to be right where it says yes.

use super::*;

/// A value written once the shape holds (see `read_entry`'s `none_at` and `list_at`).
const PLACEHOLDER: Val = Val::Int(0);

/// Where the entry's frame list comes from: new in the entry, or a freed one read again.
#[derive(Clone, Copy)]
enum ListMemo {
    New,
    Parked(usize),
}

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

impl Parser {
    /// A node the memo holds at `idx`, if it holds a plain one (not a freed entry, not a parked list).
    fn memo_node(&self, idx: usize) -> Option<NodeId> {
        match self.memo.get(idx).copied() {
            Some(id) if id != MEMO_EMPTY && id != MEMO_RELEASED && !is_compacted(id) => Some(id),
            _ => None,
        }
    }

    /// The memo index a BINGET / LONG_BINGET (`op`) reads, unless it is one this entry writes
    /// itself (`pending`).
    fn memo_read(op: u8, b: &mut Bytes, pending: &[Option<usize>; 2]) -> Option<usize> {
        let idx = match op {
            b'h' => b.u8()? as usize,
            b'j' => b.u32()? as usize,
            _ => return None,
        };
        (!pending.contains(&Some(idx))).then_some(idx)
    }

    /// A memoized node read by BINGET / LONG_BINGET (`op`).
    fn got(&self, op: u8, b: &mut Bytes, pending: &[Option<usize>; 2]) -> Option<NodeId> {
        self.memo_node(Self::memo_read(op, b, pending)?)
    }

    /// Reads the trace entry whose EMPTY_DICT opcode ends at `r.pos`, through its SETITEMS, and
    /// leaves the dict on the stack as `set_items_as_entry` does. False: not in the shape this
    /// reads (nothing was changed; the generic opcodes take over at the same byte).
    pub(super) fn read_entry(&mut self, r: &mut Reader, compact: &mut dyn Compact) -> bool {
        let mut b = Bytes { data: r.data, pos: r.pos };
        let read = r.base + r.pos;
        let mut next = self.memo.len();
        // Memo indices this entry writes: the dict's, its frame list's.
        let mut pending: [Option<usize>; 2] = [None, None];
        let Some(op) = b.u8() else { return false };
        let Some(dict_memo) = memo_index(op, &mut b, &mut next, read) else { return false };
        pending[0] = dict_memo;
        let mark = if dict_memo.is_some() { b.u8() } else { Some(op) };
        if mark != Some(b'(') {
            return false;
        }
        // Keys and values as SETITEMS would find them on the stack; nodes read with BINGET are
        // shared once the shape is known to hold. The frame list's place is marked by `list_at`.
        self.items.clear();
        self.list_items.clear();
        // Where the value is not known until the shape holds (None, the frame list), `items`
        // holds `PLACEHOLDER` until then.
        let mut list_at = None;
        let mut list_memo = ListMemo::New;
        let mut none_at: u32 = 0;
        loop {
            let Some(op) = b.u8() else { return false };
            if op == b'u' {
                break;
            }
            if self.items.len() == MAX_ENTRY_ITEMS {
                return false;
            }
            let Some(key) = self.got(op, &mut b, &pending) else { return false };
            if !matches!(self.arena.get(key), Node::Str(_)) {
                return false;
            }
            let Some(op) = b.u8() else { return false };
            let value = match op {
                b'K' => b.u8().map(|v| Val::Int(v as i64)),
                b'M' => b.u16().map(|v| Val::Int(v as i64)),
                b'J' => b.take(4).map(|v| Val::Int(i32::from_le_bytes(v.try_into().expect("4 bytes")) as i64)),
                0x8a => match b.u8() {
                    Some(len @ 0..=8) => b.take(len as usize).and_then(|bytes| match long_from_bytes(bytes) {
                        Node::Int(v) => i64::try_from(v).ok().map(Val::Int),
                        _ => None,
                    }),
                    _ => None,
                },
                b'N' => {
                    none_at |= 1 << (self.items.len() / 2);
                    Some(PLACEHOLDER)
                }
                b'h' | b'j' => match Self::memo_read(op, &mut b, &pending) {
                    Some(idx) => match self.memo.get(idx).copied() {
                        // A frame list freed with the entry that first had it (`park`), read
                        // again (a free names its alloc's list): rebuilt below, as BINGET does.
                        Some(parked) if parked != MEMO_EMPTY && parked != MEMO_RELEASED && is_compacted(parked) && list_at.is_none() => {
                            list_at = Some(self.items.len() + 1);
                            self.list_items.extend_from_slice(&self.parked[(parked & !COMPACTED) as usize]);
                            list_memo = ListMemo::Parked(idx);
                            Some(PLACEHOLDER)
                        }
                        _ => self.memo_node(idx).map(Val::Node),
                    },
                    None => None,
                },
                b']' if list_at.is_none() => {
                    list_at = Some(self.items.len() + 1);
                    list_memo = ListMemo::New;
                    self.scan_list(&mut b, &mut next, &mut pending, read).map(|()| PLACEHOLDER)
                }
                _ => None,
            };
            let Some(value) = value else { return false };
            self.items.extend([Val::Node(key), value]);
        }
        if self.items.is_empty() || self.arena.len() + MAX_ENTRY_ITEMS >= (COMPACTED - 1) as usize {
            return false;
        }
        // The shape holds: write what the opcodes would have written.
        r.pos = b.pos;
        let dict = self.new_node(Node::Dict(Vec::new()));
        if let Some(idx) = dict_memo {
            self.memo_put(idx, dict);
        }
        let mut items = std::mem::take(&mut self.items);
        for (at, value) in items.iter_mut().enumerate() {
            match *value {
                _ if at % 2 == 1 && none_at & (1 << (at / 2)) != 0 => *value = Val::Node(self.new_node(Node::None)),
                _ if Some(at) == list_at => {
                    let list_items = self.list_items.clone();
                    // A new list's items were read with BINGET, which shares them (a rebuilt
                    // list's items are not read again).
                    if matches!(list_memo, ListMemo::New) {
                        for &item in &list_items {
                            self.share(item);
                        }
                    }
                    let list = self.new_node(Node::List(list_items));
                    match list_memo {
                        ListMemo::New => {
                            if let Some(idx) = pending[1] {
                                self.memo_put(idx, list);
                            }
                        }
                        // Kept from now on, as BINGET keeps a rebuilt list.
                        ListMemo::Parked(idx) => {
                            self.memo[idx] = list;
                            self.share(list);
                        }
                    }
                    *value = Val::Node(list);
                }
                Val::Node(id) => self.share(id),
                Val::Int(_) => {}
            }
        }
        self.stack.push(Slot::Node(dict));
        // From here on, what SETITEMS does: a decoded entry, or else a dict of nodes.
        if !self.decode_entry(dict, &items, compact) {
            let pairs = items.chunks_exact(2).map(|kv| (self.node_of_val(kv[0]), self.node_of_val(kv[1]))).collect();
            *self.arena.get_mut(dict) = Node::Dict(pairs);
        }
        self.items = items;
        true
    }

    /// A new list of memoized items after EMPTY_LIST: `[MEMOIZE | BINPUT i]`, then nothing, one
    /// item and APPEND, or MARK, items and APPENDS. Its items go to `list_items`.
    fn scan_list(&mut self, b: &mut Bytes, next: &mut usize, pending: &mut [Option<usize>; 2], read: usize) -> Option<()> {
        let op = b.peek()?;
        if matches!(op, 0x94 | b'q' | b'r') {
            b.u8();
            pending[1] = memo_index(op, b, next, read)?;
        }
        match b.peek()? {
            b'h' | b'j' => {
                let op = b.u8()?;
                let item = self.got(op, b, pending)?;
                (b.u8()? == b'a').then_some(())?;
                self.list_items.push(item);
            }
            b'(' => {
                b.u8();
                loop {
                    let op = b.u8()?;
                    if op == b'e' {
                        break;
                    }
                    let item = self.got(op, b, pending)?;
                    self.list_items.push(item);
                }
            }
            _ => {}
        }
        Some(())
    }
}
