//! Values the pickle's memo names without a node of their own (see `Parked`).

use super::*;

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
    /// The first list kept with each hash of its items, found by the hash alone: a map keyed by
    /// the items held a second boxed copy of every list, an allocation per trace entry...
    list_by_hash: rustc_hash::FxHashMap<u64, u32>,
    /// ...and the rare list whose hash another list already has.
    list_collided: rustc_hash::FxHashMap<Box<[NodeId]>, u32>,
    /// Strings (`PARKED_STRING | s` in the memo).
    pub strings: Vec<std::sync::Arc<str>>,
    string_index: rustc_hash::FxHashMap<std::sync::Arc<str>, u32>,
}

impl Parked {
    /// The index under which a list of memoized `items` is kept; None when there are too many.
    pub(super) fn list(&mut self, items: &[NodeId]) -> Option<u32> {
        use std::hash::BuildHasher;
        let hash = rustc_hash::FxBuildHasher.hash_one(items);
        let first = self.list_by_hash.get(&hash).copied();
        if let Some(k) = first {
            if *self.lists[k as usize] == *items {
                return Some(k);
            }
            if let Some(&k) = self.list_collided.get(items) {
                return Some(k);
            }
        }
        let k = u32::try_from(self.lists.len()).ok().filter(|&k| k < PARKED_MAX)?;
        self.lists.push(items.into());
        match first {
            None => self.list_by_hash.insert(hash, k),
            Some(_) => self.list_collided.insert(items.into(), k),
        };
        Some(k)
    }

    /// The index under which string `s` is kept; None when there are too many.
    pub(super) fn string(&mut self, s: &str) -> Option<u32> {
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
pub(super) enum Memo {
    Empty,
    Released,
    Node(NodeId),
    /// `Parked::lists[k]`.
    List(u32),
    /// `Parked::strings[s]`.
    String(u32),
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::hash::BuildHasher;

    #[test]
    fn a_list_is_kept_once_even_when_its_hash_is_another_lists() {
        let mut parked = Parked::default();
        assert_eq!(parked.list(&[1, 2]), Some(0));
        assert_eq!(parked.list(&[1, 2]), Some(0));
        // Make [3] collide with [1, 2]: the index's first list for its hash is list 0.
        let hash = rustc_hash::FxBuildHasher.hash_one(&[3u32][..]);
        parked.list_by_hash.insert(hash, 0);
        assert_eq!(parked.list(&[3]), Some(1));
        assert_eq!(parked.list(&[3]), Some(1));
        assert_eq!(parked.list(&[1, 2]), Some(0));
        assert_eq!(parked.list(&[]), Some(2));
        assert_eq!(parked.lists.len(), 3);
        assert_eq!(&*parked.lists[1], &[3]);
    }
}
