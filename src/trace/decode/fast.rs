//! Trace entries from what the pickle parser's fast path read (`pickle/entry.rs`): typed at
//! once, for the entries PyTorch writes, and left to `Decoder::entry` for anything else.

use super::*;

impl Caches {
    /// A trace entry from the values the parser's fast path read (by `EntryFields::KEYS`), for
    /// the entries PyTorch writes: integers inline, strings and frame lists memoized. None for
    /// anything else, or anything `Decoder::entry` would refuse, which then decodes it (and
    /// names what is wrong): the same entry either way.
    pub(super) fn fast_entry(
        &mut self,
        arena: &Arena,
        f: &[EntryValue; EntryFields::KEYS.len()],
        parked: &Parked,
        lasting: &dyn Fn(NodeId) -> bool,
    ) -> Option<TraceEntry> {
        use EntryValue as V;
        // An integer field: Some(None) when absent, None when it is not an integer.
        let int = |v: EntryValue| match v {
            V::Int(i) => Some(Some(i)),
            V::None => Some(None),
            _ => None,
        };
        let bytes = |v: EntryValue| match int(v)? {
            Some(b) if !(0..limits::ONE_EXABYTE as i64).contains(&b) => None,
            b => Some(b.map(|b| b as u64)),
        };
        let [action, addr, size, stream, time_us, frames, device_free, compile_context, user_metadata, pool_id, category] = *f;
        let action = match action {
            V::Node(action) => Decoder { arena, c: self, lasting }.action(action, &String::new).ok()?,
            V::Str(s) => Action::from_name(parked.strings.get(s as usize)?)?,
            _ => return None,
        };
        let addr = match (int(addr)?, action) {
            (Some(a), _) if (0..limits::ADDRESS_LIMIT as i64).contains(&a) => a as u64,
            (None, Action::Oom | Action::Snapshot | Action::Annotate) => 0,
            _ => return None,
        };
        // A failed request may be of any size: PyTorch's 1 EB check is for what it allocates.
        let size = match action {
            Action::Oom => match int(size)? {
                Some(s) if s < 0 => return None,
                s => s.map(|s| s as u64),
            },
            _ => bytes(size)?,
        };
        let frames = match frames {
            V::Frames(k) => Some(self.parked_frames(arena, k, parked, lasting)?),
            V::Node(list) => Some(Decoder { arena, c: self, lasting }.frames(Some(list), &String::new).ok()?),
            V::None => None,
            V::Int(_) | V::Str(_) => return None,
        };
        let category = match self.shared_str(arena, category, parked, lasting)? {
            Some(name) => Category::parse(&name)?,
            None => None,
        };
        // Entries in a row mostly have the same rarer keys (a G3 file's "N/A" and "" on
        // every one): known by their values' nodes, they are read once.
        let extra_values = [device_free, compile_context, user_metadata, pool_id];
        let extra = match &self.last_read_extra {
            Some((values, extra)) if *values == extra_values => extra.clone(),
            _ => {
                let (compile_context, user_metadata) =
                    (self.shared_str(arena, compile_context, parked, lasting)?, self.shared_str(arena, user_metadata, parked, lasting)?);
                let pool_id = match pool_id {
                    V::None => None,
                    V::Node(id) => Some(Decoder { arena, c: self, lasting }.pool_id(id, &String::new).ok()?),
                    _ => return None,
                };
                let extra = EntryExtra { device_free: bytes(device_free)?, compile_context, user_metadata, pool_id };
                let extra = (extra != EntryExtra::default()).then(|| self.shared_extra(extra));
                // Only nodes that outlive this entry, and do not change, identify its values (a
                // pool id that is a list may be appended to).
                let lasting_values = extra_values.iter().all(|v| match v {
                    V::Node(id) => lasting(*id) && matches!(arena.get(*id), Node::Str(_) | Node::Tuple(_)),
                    _ => true,
                });
                if lasting_values {
                    self.last_read_extra = Some((extra_values, extra.clone()));
                }
                extra
            }
        };
        Some(TraceEntry { action, addr, size: size.unwrap_or(0), stream: int(stream)?.unwrap_or(0), time_us: int(time_us)?, frames, category, extra })
    }

    /// A string field: Some(None) when absent, None when it is not a string.
    fn shared_str(&mut self, arena: &Arena, v: EntryValue, parked: &Parked, lasting: &dyn Fn(NodeId) -> bool) -> Option<Option<Arc<str>>> {
        match v {
            EntryValue::None => Some(None),
            EntryValue::Node(id) => Decoder { arena, c: self, lasting }.opt_shared_str(Some(id), "", &String::new).ok(),
            EntryValue::Str(s) => Some(Some(parked.strings.get(s as usize)?.clone())),
            _ => None,
        }
    }

    /// The frames of parked list `k` (`parked[k]`: memoized frame dicts), decoded once.
    fn parked_frames(&mut self, arena: &Arena, k: u32, parked: &Parked, lasting: &dyn Fn(NodeId) -> bool) -> Option<Frames> {
        let k = k as usize;
        if let Some(Some(frames)) = self.parked_frames.get(k) {
            return Some(frames.clone());
        }
        let frames = Decoder { arena, c: self, lasting }.frames_of_items(parked.lists.get(k)?, &String::new).ok()?;
        if self.parked_frames.len() <= k {
            self.parked_frames.resize(k + 1, None);
        }
        self.parked_frames[k] = Some(frames.clone());
        Some(frames)
    }
}

impl EntryCompactor {
    /// Which of `EntryFields::KEYS` the key node at position `at` of an entry is. Every entry
    /// names its keys with the same memoized strings, in the same order: the key at each
    /// position is matched by name once, then known by its node (only a `lasting` one).
    /// (`lasting` is asked only of a key not known at `at`: reading its memo slot for every
    /// key of every entry cost more than matching them.)
    pub(super) fn key_at(&mut self, arena: &Arena, at: usize, key: NodeId, lasting: &dyn Fn(NodeId) -> bool) -> Option<u8> {
        match self.keys_at.get(at) {
            Some(&(known, index)) if known == key => index,
            _ => {
                let index = EntryFields::key_index(arena, key);
                if lasting(key) {
                    if self.keys_at.len() <= at {
                        self.keys_at.resize(at + 1, (COMPACTED, None));
                    }
                    self.keys_at[at] = (key, index);
                }
                index
            }
        }
    }
}
