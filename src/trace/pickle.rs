//! A pickle reader (protocols 2 to 5) that builds plain data and never runs code.
//!
//! Every opcode that could import or call something (GLOBAL, STACK_GLOBAL, REDUCE, BUILD, INST,
//! OBJ, NEWOBJ, persistent ids, extension registry) is refused: real snapshots need none. Memo
//! entries are node ids, so shared objects stay shared (see `node.rs`). Declared lengths are checked
//! against the bytes that remain, so a hostile file cannot make us allocate more than it is long.

use super::node::{Arena, Node, NodeId};
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

enum Slot {
    Value(NodeId),
    Mark,
}

struct Reader<'a> {
    data: &'a [u8],
    pos: usize,
    op_start: usize,
}

impl<'a> Reader<'a> {
    fn err(&self, message: impl Into<String>) -> PickleError {
        PickleError { offset: self.op_start, message: message.into() }
    }

    fn take(&mut self, n: usize) -> Result<&'a [u8], PickleError> {
        if n > self.data.len() - self.pos {
            return Err(self.err(format!(
                "needs {n} bytes but only {} remain (truncated file or bad length)",
                self.data.len() - self.pos
            )));
        }
        let bytes = &self.data[self.pos..self.pos + n];
        self.pos += n;
        Ok(bytes)
    }

    fn u8(&mut self) -> Result<u8, PickleError> {
        Ok(self.take(1)?[0])
    }

    fn u16(&mut self) -> Result<u16, PickleError> {
        Ok(u16::from_le_bytes(self.take(2)?.try_into().unwrap()))
    }

    fn u32(&mut self) -> Result<u32, PickleError> {
        Ok(u32::from_le_bytes(self.take(4)?.try_into().unwrap()))
    }

    fn u64_len(&mut self) -> Result<usize, PickleError> {
        let n = u64::from_le_bytes(self.take(8)?.try_into().unwrap());
        usize::try_from(n).map_err(|_| self.err("length does not fit in memory"))
    }

    fn utf8(&mut self, n: usize) -> Result<Box<str>, PickleError> {
        let bytes = self.take(n)?;
        std::str::from_utf8(bytes).map(Into::into).map_err(|_| self.err("string is not valid UTF-8"))
    }
}

/// Parses a pickle into an arena of plain values and returns the root.
pub fn parse(data: &[u8]) -> Result<(Arena, NodeId), PickleError> {
    let mut r = Reader { data, pos: 0, op_start: 0 };
    // Roughly one node per 3 bytes in real snapshots; the cap keeps a tiny hostile file cheap.
    let mut arena = Arena::with_capacity((data.len() / 4).min(1 << 20));
    let mut stack: Vec<Slot> = Vec::new();
    let mut memo: Vec<Option<NodeId>> = Vec::new();
    // A memo index beyond this cannot come from a real pickler (they number entries in order).
    let memo_limit = data.len().saturating_mul(2) + 16;

    macro_rules! push {
        ($node:expr) => {{
            let id = arena.push($node);
            stack.push(Slot::Value(id));
        }};
    }

    loop {
        r.op_start = r.pos;
        let op = r.u8().map_err(|_| r.err("the file ends before the pickle does (truncated?)"))?;
        if let Some(name) = forbidden_opcode(op) {
            return Err(r.err(format!(
                "opcode {name} (0x{op:02x}) would import or call Python code; snapshots never need it, so it is refused"
            )));
        }
        match op {
            0x80 => {
                let proto = r.u8()?;
                if !(2..=5).contains(&proto) {
                    return Err(r.err(format!("unsupported pickle protocol {proto} (2 to 5 are read)")));
                }
            }
            0x95 => {
                r.take(8)?; // FRAME: a length hint only
            }
            b'.' => break,
            b'(' => stack.push(Slot::Mark),
            b'0' => {
                pop_value(&mut stack, &r)?;
            }
            b'1' => {
                pop_to_mark(&mut stack, &r)?;
            }
            b'2' => {
                let top = top_value(&stack, &r)?;
                stack.push(Slot::Value(top));
            }
            b'N' => push!(Node::None),
            0x88 => push!(Node::Bool(true)),
            0x89 => push!(Node::Bool(false)),
            b'J' => {
                let v = i32::from_le_bytes(r.take(4)?.try_into().unwrap());
                push!(Node::Int(v as i128))
            }
            b'K' => {
                let v = r.u8()?;
                push!(Node::Int(v as i128))
            }
            b'M' => {
                let v = r.u16()?;
                push!(Node::Int(v as i128))
            }
            0x8a | 0x8b => {
                let n = if op == 0x8a { r.u8()? as usize } else { r.u32()? as usize };
                let bytes = r.take(n)?;
                push!(long_from_bytes(bytes))
            }
            b'G' => {
                let v = f64::from_be_bytes(r.take(8)?.try_into().unwrap());
                push!(Node::Float(v))
            }
            0x8c => {
                let n = r.u8()? as usize;
                let s = r.utf8(n)?;
                push!(Node::Str(s))
            }
            b'X' => {
                let n = r.u32()? as usize;
                let s = r.utf8(n)?;
                push!(Node::Str(s))
            }
            0x8d => {
                let n = r.u64_len()?;
                let s = r.utf8(n)?;
                push!(Node::Str(s))
            }
            b'C' | b'B' | 0x8e | 0x96 => {
                let n = match op {
                    b'C' => r.u8()? as usize,
                    b'B' => r.u32()? as usize,
                    _ => r.u64_len()?,
                };
                r.take(n)?;
                push!(Node::Bytes(n))
            }
            b'}' => push!(Node::Dict(Vec::new())),
            b']' => push!(Node::List(Vec::new())),
            b')' => push!(Node::Tuple(Vec::new())),
            0x8f => push!(Node::Set(Vec::new())),
            b't' => {
                let items = pop_to_mark(&mut stack, &r)?;
                push!(Node::Tuple(items))
            }
            b'l' => {
                let items = pop_to_mark(&mut stack, &r)?;
                push!(Node::List(items))
            }
            0x91 => {
                let items = pop_to_mark(&mut stack, &r)?;
                push!(Node::Set(items))
            }
            0x85..=0x87 => {
                let n = (op - 0x84) as usize;
                let mut items = Vec::with_capacity(n);
                for _ in 0..n {
                    items.push(pop_value(&mut stack, &r)?);
                }
                items.reverse();
                push!(Node::Tuple(items))
            }
            b'd' => {
                let items = pop_to_mark(&mut stack, &r)?;
                let entries = pairs(items, &r)?;
                push!(Node::Dict(entries))
            }
            b'a' => {
                let item = pop_value(&mut stack, &r)?;
                let list = top_value(&stack, &r)?;
                match arena.get_mut(list) {
                    Node::List(items) => items.push(item),
                    other => return Err(r.err(format!("APPEND to {}", other.kind()))),
                }
            }
            b'e' => {
                let new_items = pop_to_mark(&mut stack, &r)?;
                let list = top_value(&stack, &r)?;
                match arena.get_mut(list) {
                    Node::List(items) => items.extend(new_items),
                    other => return Err(r.err(format!("APPENDS to {}", other.kind()))),
                }
            }
            0x90 => {
                let new_items = pop_to_mark(&mut stack, &r)?;
                let set = top_value(&stack, &r)?;
                match arena.get_mut(set) {
                    Node::Set(items) => items.extend(new_items),
                    other => return Err(r.err(format!("ADDITEMS to {}", other.kind()))),
                }
            }
            b's' => {
                let value = pop_value(&mut stack, &r)?;
                let key = pop_value(&mut stack, &r)?;
                let dict = top_value(&stack, &r)?;
                dict_insert(&mut arena, dict, vec![(key, value)], &r)?;
            }
            b'u' => {
                let items = pop_to_mark(&mut stack, &r)?;
                let entries = pairs(items, &r)?;
                let dict = top_value(&stack, &r)?;
                dict_insert(&mut arena, dict, entries, &r)?;
            }
            0x94 => {
                let top = top_value(&stack, &r)?;
                memo.push(Some(top));
            }
            b'q' | b'r' => {
                let idx = if op == b'q' { r.u8()? as usize } else { r.u32()? as usize };
                let top = top_value(&stack, &r)?;
                if idx > memo_limit {
                    return Err(r.err(format!("memo index {idx} is absurd for a file of {} bytes", data.len())));
                }
                if idx >= memo.len() {
                    memo.resize(idx + 1, None);
                }
                memo[idx] = Some(top);
            }
            b'h' | b'j' => {
                let idx = if op == b'h' { r.u8()? as usize } else { r.u32()? as usize };
                match memo.get(idx).copied().flatten() {
                    Some(id) => stack.push(Slot::Value(id)),
                    None => return Err(r.err(format!("memo entry {idx} is read before it is written"))),
                }
            }
            0x97 | 0x98 => return Err(r.err("out-of-band buffers (protocol 5) are not supported")),
            b'I' | b'L' | b'F' | b'S' | b'V' | b'T' | b'U' | b'g' | b'p' => {
                return Err(r.err(format!(
                    "text opcode '{}' belongs to pickle protocol 0/1; snapshots use protocol 2 or later",
                    op as char
                )));
            }
            _ => return Err(r.err(format!("unknown opcode 0x{op:02x}"))),
        }
    }
    if r.pos != data.len() && data[r.pos..].iter().any(|&b| b != 0) {
        // Trailing garbage after STOP is almost certainly a concatenation or corruption.
        return Err(PickleError { offset: r.pos, message: "data continues after STOP".into() });
    }
    match stack.as_slice() {
        [Slot::Value(root)] => Ok((arena, *root)),
        _ => Err(PickleError { offset: r.pos, message: "STOP with a stack that does not hold exactly one value".into() }),
    }
}

fn pop_value(stack: &mut Vec<Slot>, r: &Reader) -> Result<NodeId, PickleError> {
    match stack.pop() {
        Some(Slot::Value(id)) => Ok(id),
        Some(Slot::Mark) => Err(r.err("found a MARK where a value was expected")),
        None => Err(r.err("stack underflow")),
    }
}

fn top_value(stack: &[Slot], r: &Reader) -> Result<NodeId, PickleError> {
    match stack.last() {
        Some(Slot::Value(id)) => Ok(*id),
        Some(Slot::Mark) => Err(r.err("found a MARK where a value was expected")),
        None => Err(r.err("stack underflow")),
    }
}

fn pop_to_mark(stack: &mut Vec<Slot>, r: &Reader) -> Result<Vec<NodeId>, PickleError> {
    let mark = stack
        .iter()
        .rposition(|s| matches!(s, Slot::Mark))
        .ok_or_else(|| r.err("no MARK on the stack"))?;
    let items = stack
        .drain(mark + 1..)
        .map(|s| match s {
            Slot::Value(id) => id,
            Slot::Mark => unreachable!("rposition found the last mark"),
        })
        .collect();
    stack.pop();
    Ok(items)
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
