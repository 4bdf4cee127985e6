//! The ordered index of a pool's free blocks: keys are (size, address) packed in a u128, so the
//! first key at or after (request, 0) is PyTorch's best fit (smallest block, lowest address).
//!
//! Pools usually hold a handful of free blocks: a sorted vector (binary search, short moves) is
//! several times faster than a B-tree there. Past a few hundred entries it turns into a B-tree.

use std::collections::BTreeMap;
use std::ops::Bound;

pub type Key = u128;

pub fn key(size: u64, ptr: u64) -> Key {
    (size as u128) << 64 | ptr as u128
}

pub fn key_size(key: Key) -> u64 {
    (key >> 64) as u64
}

const PROMOTE: usize = 256;
const DEMOTE: usize = 96;

#[derive(Debug, Clone)]
pub enum FreeIndex {
    Sorted(Vec<(Key, u32)>),
    Tree(BTreeMap<Key, u32>),
}

impl Default for FreeIndex {
    fn default() -> Self {
        FreeIndex::Sorted(Vec::new())
    }
}

impl FreeIndex {
    #[cfg(test)]
    pub fn len(&self) -> usize {
        match self {
            FreeIndex::Sorted(v) => v.len(),
            FreeIndex::Tree(t) => t.len(),
        }
    }

    /// Inserts; false if the key was already there.
    pub fn insert(&mut self, k: Key, id: u32) -> bool {
        match self {
            FreeIndex::Sorted(v) => {
                let i = v.partition_point(|e| e.0 < k);
                if v.get(i).is_some_and(|e| e.0 == k) {
                    return false;
                }
                v.insert(i, (k, id));
                if v.len() > PROMOTE {
                    *self = FreeIndex::Tree(v.iter().copied().collect());
                }
                true
            }
            FreeIndex::Tree(t) => match t.entry(k) {
                std::collections::btree_map::Entry::Vacant(e) => {
                    e.insert(id);
                    true
                }
                std::collections::btree_map::Entry::Occupied(_) => false,
            },
        }
    }

    pub fn remove(&mut self, k: Key) -> Option<u32> {
        match self {
            FreeIndex::Sorted(v) => {
                let i = v.partition_point(|e| e.0 < k);
                if v.get(i).is_some_and(|e| e.0 == k) { Some(v.remove(i).1) } else { None }
            }
            FreeIndex::Tree(t) => {
                let id = t.remove(&k);
                if t.len() < DEMOTE {
                    *self = FreeIndex::Sorted(t.iter().map(|(k, v)| (*k, *v)).collect());
                }
                id
            }
        }
    }

    pub fn get(&self, k: Key) -> Option<u32> {
        match self {
            FreeIndex::Sorted(v) => v.binary_search_by(|e| e.0.cmp(&k)).ok().map(|i| v[i].1),
            FreeIndex::Tree(t) => t.get(&k).copied(),
        }
    }

    /// The first entry with a key at or after `k`.
    pub fn lower_bound(&self, k: Key) -> Option<(Key, u32)> {
        self.first_in(Bound::Included(k))
    }

    /// The first entry with a key strictly after `k`.
    pub fn next_after(&self, k: Key) -> Option<(Key, u32)> {
        self.first_in(Bound::Excluded(k))
    }

    fn first_in(&self, from: Bound<Key>) -> Option<(Key, u32)> {
        match self {
            FreeIndex::Sorted(v) => {
                let i = match from {
                    Bound::Included(k) => v.partition_point(|e| e.0 < k),
                    Bound::Excluded(k) => v.partition_point(|e| e.0 <= k),
                    Bound::Unbounded => 0,
                };
                v.get(i).copied()
            }
            FreeIndex::Tree(t) => t.range((from, Bound::Unbounded)).next().map(|(k, v)| (*k, *v)),
        }
    }

    /// The last entry with a key strictly before `k`.
    pub fn prev_before(&self, k: Key) -> Option<(Key, u32)> {
        match self {
            FreeIndex::Sorted(v) => {
                let i = v.partition_point(|e| e.0 < k);
                i.checked_sub(1).map(|i| v[i])
            }
            FreeIndex::Tree(t) => t.range(..k).next_back().map(|(k, v)| (*k, *v)),
        }
    }

    /// Every entry in key order.
    pub fn entries(&self) -> Vec<(Key, u32)> {
        match self {
            FreeIndex::Sorted(v) => v.clone(),
            FreeIndex::Tree(t) => t.iter().map(|(k, v)| (*k, *v)).collect(),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use proptest::prelude::*;

    proptest! {
        /// Both representations answer like a plain B-tree, across promotions and demotions.
        #[test]
        fn behaves_like_a_btree(ops in prop::collection::vec((0u8..4, 0u64..400, 0u64..4), 1..2000)) {
            let mut index = FreeIndex::default();
            let mut model: BTreeMap<Key, u32> = BTreeMap::new();
            for (i, (op, size, ptr)) in ops.into_iter().enumerate() {
                let k = key(size * 512, ptr * 512);
                match op {
                    0 | 1 => {
                        let fresh = !model.contains_key(&k);
                        if fresh {
                            model.insert(k, i as u32);
                        }
                        prop_assert_eq!(index.insert(k, i as u32), fresh);
                    }
                    2 => prop_assert_eq!(index.remove(k), model.remove(&k)),
                    _ => {
                        prop_assert_eq!(index.lower_bound(k), model.range(k..).next().map(|(a, b)| (*a, *b)));
                        prop_assert_eq!(index.next_after(k), model.range((Bound::Excluded(k), Bound::Unbounded)).next().map(|(a, b)| (*a, *b)));
                        prop_assert_eq!(index.prev_before(k), model.range(..k).next_back().map(|(a, b)| (*a, *b)));
                        prop_assert_eq!(index.get(k), model.get(&k).copied());
                    }
                }
                prop_assert_eq!(index.len(), model.len());
            }
            prop_assert_eq!(index.entries(), model.into_iter().collect::<Vec<_>>());
        }
    }
}
