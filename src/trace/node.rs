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
            Node::Compacted => "a trace entry",
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

    /// Builds the arena form of a JSON value. serde_json has already bounded its nesting (128).
    pub fn from_json(value: &serde_json::Value) -> (Arena, NodeId) {
        let mut arena = Arena::default();
        let root = arena.push_json(value);
        (arena, root)
    }

    fn push_json(&mut self, value: &serde_json::Value) -> NodeId {
        use serde_json::Value;
        let node = match value {
            Value::Null => Node::None,
            Value::Bool(b) => Node::Bool(*b),
            Value::Number(n) => match (n.as_i64(), n.as_u64()) {
                (Some(i), _) => Node::Int(i as i128),
                (None, Some(u)) => Node::Int(u as i128),
                _ => Node::Float(n.as_f64().unwrap_or(f64::NAN)),
            },
            Value::String(s) => Node::Str(s.as_str().into()),
            Value::Array(items) => Node::List(items.iter().map(|v| self.push_json(v)).collect()),
            Value::Object(map) => Node::Dict(
                map.iter()
                    .map(|(k, v)| {
                        let key = self.push(Node::Str(k.as_str().into()));
                        (key, self.push_json(v))
                    })
                    .collect(),
            ),
        };
        self.push(node)
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
            Node::BigInt | Node::Bytes(_) | Node::Compacted => return None,
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
