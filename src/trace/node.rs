//! A generic tree of plain values kept in an arena, the common form of pickle and JSON input.
//!
//! Containers hold node ids, so an object that a pickle memoizes once and references many times
//! (every frame list of a real snapshot) is stored once and shared; mutation through one reference
//! is seen through all, exactly as in Python. Nothing here recurses, so hostile nesting is harmless.

pub type NodeId = u32;

/// A list item with this bit set is not a node: it is the index of an item that a
/// `pickle::Compact` stored in typed form while parsing (a trace entry, see `decode.rs`).
pub const COMPACTED: NodeId = 1 << 31;

pub fn is_compacted(id: NodeId) -> bool {
    id & COMPACTED != 0
}

#[derive(Debug, Clone, PartialEq)]
pub enum Node {
    None,
    Bool(bool),
    /// Wide enough for both i64 and u64 values (real frames carry line 2^64-1).
    Int(i128),
    /// An integer that does not fit 128 bits (kept only to say so if a field needs it).
    BigInt,
    Float(f64),
    Str(Box<str>),
    Bytes(usize),
    List(Vec<NodeId>),
    Tuple(Vec<NodeId>),
    Dict(Vec<(NodeId, NodeId)>),
    Set(Vec<NodeId>),
    /// What `Arena::get` answers for a compacted list item.
    Compacted,
    /// A trace-entry dict decoded as soon as its items were set (`pickle::Compact::entry`),
    /// waiting to be appended to its list: the index of the decoded entry.
    Entry(u32),
}

/// A value on the way into a container: a node, or an integer not given a node of its own
/// (the pickle parser keeps integers on its stack until something needs them as nodes, so the
/// tens of millions of a large trace's addresses and sizes never become nodes).
#[derive(Debug, Clone, Copy, PartialEq)]
pub enum Val {
    Node(NodeId),
    /// Every integer of a trace entry fits 64 bits; a wider one (a frame's line 2^64 - 1) gets a node.
    Int(i64),
}

impl From<NodeId> for Val {
    fn from(id: NodeId) -> Val {
        Val::Node(id)
    }
}

impl Node {
    pub fn kind(&self) -> &'static str {
        match self {
            Node::None => "None",
            Node::Bool(_) => "a bool",
            Node::Int(_) => "an integer",
            Node::BigInt => "an integer larger than 128 bits",
            Node::Float(_) => "a float",
            Node::Str(_) => "a string",
            Node::Bytes(_) => "bytes",
            Node::List(_) => "a list",
            Node::Tuple(_) => "a tuple",
            Node::Dict(_) => "a dict",
            Node::Set(_) => "a set",
            Node::Compacted | Node::Entry(_) => "a trace entry",
        }
    }
}

#[derive(Debug, Default)]
pub struct Arena {
    nodes: Vec<Node>,
    /// Released slots, reused by `push`.
    free: Vec<NodeId>,
}

impl Arena {
    pub fn with_capacity(n: usize) -> Arena {
        Arena { nodes: Vec::with_capacity(n), free: Vec::new() }
    }

    pub fn push(&mut self, node: Node) -> NodeId {
        if let Some(id) = self.free.pop() {
            self.nodes[id as usize] = node;
            return id;
        }
        self.nodes.push(node);
        (self.nodes.len() - 1) as NodeId
    }

    /// Slots in use or free.
    pub fn len(&self) -> usize {
        self.nodes.len()
    }

    /// Frees a node no one refers to any more; its slot is reused.
    pub fn release(&mut self, id: NodeId) {
        self.nodes[id as usize] = Node::None;
        self.free.push(id);
    }

    pub fn get(&self, id: NodeId) -> &Node {
        if is_compacted(id) {
            return &Node::Compacted;
        }
        &self.nodes[id as usize]
    }

    pub fn get_mut(&mut self, id: NodeId) -> &mut Node {
        &mut self.nodes[id as usize]
    }

    /// Looks a string key up in a dict node (the last entry wins, as in Python).
    pub fn dict_get(&self, dict: NodeId, key: &str) -> Option<NodeId> {
        match self.get(dict) {
            Node::Dict(entries) => entries.iter().rev().find(|(k, _)| matches!(self.get(*k), Node::Str(s) if &**s == key)).map(|&(_, v)| v),
            _ => None,
        }
    }

    /// Builds the arena form of a JSON text directly, never as a `serde_json::Value` tree (which
    /// takes 13 to 19 times the text), offering each list item to `compact` as it is appended, as
    /// the pickle parser does: a JSON snapshot's trace entries are stored typed as they are read,
    /// and their nodes freed. (JSON shares nothing, so a compacted item's whole subtree goes.)
    /// serde_json bounds the nesting (128).
    pub fn parse_json(text: &[u8], compact: &mut dyn crate::trace::pickle::Compact) -> Result<(Arena, NodeId), serde_json::Error> {
        use serde::de::DeserializeSeed;
        let mut builder = JsonBuilder { arena: Arena::default(), compact, release: Vec::new(), below: Vec::new() };
        let mut reader = serde_json::Deserializer::from_slice(text);
        let root = JsonNode(&mut builder).deserialize(&mut reader)?;
        reader.end()?;
        Ok((builder.arena, root))
    }

    /// Converts a node to JSON, for free-form parts of a snapshot (allocator settings).
    /// Depth is bounded so a self-referencing pickle cannot recurse forever.
    pub fn to_json(&self, id: NodeId, depth: usize) -> Option<serde_json::Value> {
        use serde_json::Value;
        if depth > 32 {
            return None;
        }
        Some(match self.get(id) {
            Node::None => Value::Null,
            Node::Bool(b) => Value::Bool(*b),
            Node::Int(i) => match (i64::try_from(*i), u64::try_from(*i)) {
                (Ok(v), _) => Value::from(v),
                (_, Ok(v)) => Value::from(v),
                _ => return None,
            },
            Node::BigInt | Node::Bytes(_) | Node::Compacted | Node::Entry(_) => return None,
            Node::Float(f) => serde_json::Number::from_f64(*f).map(Value::Number).unwrap_or(Value::Null),
            Node::Str(s) => Value::String(s.to_string()),
            Node::List(items) | Node::Tuple(items) | Node::Set(items) => {
                Value::Array(items.iter().map(|&i| self.to_json(i, depth + 1)).collect::<Option<_>>()?)
            }
            Node::Dict(entries) => {
                let mut map = serde_json::Map::new();
                for &(k, v) in entries {
                    let key = match self.get(k) {
                        Node::Str(s) => s.to_string(),
                        Node::Int(i) => i.to_string(),
                        _ => return None,
                    };
                    map.insert(key, self.to_json(v, depth + 1)?);
                }
                Value::Object(map)
            }
        })
    }
}

/// What [`Arena::parse_json`] builds into.
struct JsonBuilder<'c> {
    arena: Arena,
    compact: &'c mut dyn crate::trace::pickle::Compact,
    release: Vec<NodeId>,
    /// Scratch for walking a released subtree.
    below: Vec<NodeId>,
}

impl JsonBuilder<'_> {
    /// `item` was appended to `list`: offered to the compactor, and if taken, replaced by its
    /// index and freed with everything below it.
    fn appended(&mut self, list: NodeId, at: usize, item: NodeId) {
        self.release.clear();
        // JSON shares nothing: every node goes with its item.
        let Some(k) = self.compact.compact(&self.arena, list, item, &|_| false, &mut self.release) else { return };
        if let Node::List(items) = self.arena.get_mut(list) {
            items[at] = COMPACTED | k;
        }
        self.below.clear();
        self.below.push(item);
        while let Some(id) = self.below.pop() {
            if is_compacted(id) {
                continue;
            }
            match self.arena.get(id) {
                Node::List(children) | Node::Tuple(children) | Node::Set(children) => self.below.extend_from_slice(children),
                Node::Dict(entries) => self.below.extend(entries.iter().flat_map(|&(k, v)| [k, v])),
                _ => {}
            }
            self.arena.release(id);
        }
    }
}

/// One JSON value, built into the arena.
struct JsonNode<'b, 'c>(&'b mut JsonBuilder<'c>);

impl<'de> serde::de::DeserializeSeed<'de> for JsonNode<'_, '_> {
    type Value = NodeId;

    fn deserialize<D: serde::Deserializer<'de>>(self, deserializer: D) -> Result<NodeId, D::Error> {
        deserializer.deserialize_any(self)
    }
}

impl<'de> serde::de::Visitor<'de> for JsonNode<'_, '_> {
    type Value = NodeId;

    fn expecting(&self, f: &mut std::fmt::Formatter) -> std::fmt::Result {
        f.write_str("a JSON value")
    }

    fn visit_unit<E>(self) -> Result<NodeId, E> {
        Ok(self.0.arena.push(Node::None))
    }

    fn visit_bool<E>(self, b: bool) -> Result<NodeId, E> {
        Ok(self.0.arena.push(Node::Bool(b)))
    }

    fn visit_i64<E>(self, i: i64) -> Result<NodeId, E> {
        Ok(self.0.arena.push(Node::Int(i as i128)))
    }

    fn visit_u64<E>(self, u: u64) -> Result<NodeId, E> {
        Ok(self.0.arena.push(Node::Int(u as i128)))
    }

    fn visit_f64<E>(self, f: f64) -> Result<NodeId, E> {
        Ok(self.0.arena.push(Node::Float(f)))
    }

    fn visit_str<E>(self, s: &str) -> Result<NodeId, E> {
        Ok(self.0.arena.push(Node::Str(s.into())))
    }

    fn visit_seq<A: serde::de::SeqAccess<'de>>(self, mut seq: A) -> Result<NodeId, A::Error> {
        let list = self.0.arena.push(Node::List(Vec::new()));
        let mut at = 0;
        while let Some(item) = seq.next_element_seed(JsonNode(&mut *self.0))? {
            if let Node::List(items) = self.0.arena.get_mut(list) {
                items.push(item);
            }
            self.0.appended(list, at, item);
            at += 1;
        }
        Ok(list)
    }

    fn visit_map<A: serde::de::MapAccess<'de>>(self, mut map: A) -> Result<NodeId, A::Error> {
        let mut entries = Vec::new();
        while let Some(key) = map.next_key::<std::borrow::Cow<'de, str>>()? {
            let key = self.0.arena.push(Node::Str(key.as_ref().into()));
            let value = map.next_value_seed(JsonNode(&mut *self.0))?;
            entries.push((key, value));
        }
        Ok(self.0.arena.push(Node::Dict(entries)))
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// A JSON snapshot of `n` trace entries, each with its own frames (JSON shares nothing).
    fn json_snapshot(n: usize) -> String {
        let entry = |i: usize| {
            format!(r#"{{"action":"alloc","addr":{},"size":512,"stream":0,"time_us":{i},"frames":[{{"filename":"x.py","line":{i},"name":"f"}}]}}"#, i * 512)
        };
        let entries: Vec<String> = (0..n).map(entry).collect();
        format!(r#"{{"segments":[],"device_traces":[[{}]]}}"#, entries.join(","))
    }

    #[test]
    fn json_trace_entries_are_stored_typed_as_they_are_read() {
        let mut compactor = crate::trace::decode::EntryCompactor::unshared();
        let (arena, _) = Arena::parse_json(json_snapshot(10_000).as_bytes(), &mut compactor).unwrap();
        // Each entry's nodes are freed once it is typed and their slots reused: the arena holds
        // a few entries' worth, not 10,000 (about 20 nodes each).
        assert!(arena.len() < 100, "{} node slots for 10,000 entries", arena.len());
        let snapshot = crate::trace::load(json_snapshot(10_000).as_bytes()).unwrap();
        let trace = &snapshot.device_traces[0];
        assert_eq!(trace.len(), 10_000);
        // Each entry keeps its own stack, though its nodes' ids were reused by later entries.
        for (i, e) in trace.iter().enumerate() {
            assert_eq!(e.addr, i as u64 * 512);
            assert_eq!(e.frames.as_deref().map(|f| f[0].line), Some(i as u64), "entry {i}");
        }
    }

    #[test]
    fn json_errors_name_where_they_are() {
        let mut compactor = crate::trace::decode::EntryCompactor::unshared();
        let err = Arena::parse_json(br#"{"segments": [1, 2,]}"#, &mut compactor).unwrap_err();
        assert_eq!((err.line(), err.column()), (1, 20), "{err}");
        let err = Arena::parse_json(br#"{"a": 1} trailing"#, &mut compactor).unwrap_err();
        assert!(err.to_string().contains("trailing characters"), "{err}");
    }
}
