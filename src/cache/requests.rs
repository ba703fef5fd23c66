//! Requests: what each one holds ([`RequestRefs`] in the requests table),
//! and the input positions it holds, each with its item's entry slot
//! ([`HeldInputs`]).
//!
//! A request's positions are its `mm_features` indices: small, dense, and
//! mostly scheduled and freed in order. So positions below [`NEAR`] live in a
//! vector indexed by position: no hashing, no rehashing as a request grows,
//! and ascending order for free when a whole request is released (the order
//! in which its entries become evictable). Positions beyond it, which only a
//! very long request or a caller's arbitrary ids reach, go to an ordered map,
//! so one large id costs one map entry, not a vector that long.

use std::collections::BTreeMap;

use hashbrown::HashMap;

use super::entries::NIL;
use super::keys::Key;
use super::table::Named;

/// What one request holds: each cached input position with its item's entry
/// slot, and how many of those positions hold each item (the occurrence count
/// that decides when the request's reference is released).
#[derive(Debug, Clone)]
pub(crate) struct RequestRefs {
    pub(crate) id: Key,
    pub(crate) hash: u64,
    pub(crate) inputs: HeldInputs,
    /// Occurrences beyond the first, by entry slot, for items held at several
    /// inputs (an image re-sent in a chat). Most items are held once and need
    /// no count: the entry's referrers already say that the request holds it.
    pub(crate) repeats: HashMap<u32, u32>,
}

impl RequestRefs {
    pub(crate) fn new(id: Key, hash: u64) -> Self {
        Self { id, hash, inputs: HeldInputs::default(), repeats: HashMap::new() }
    }

    /// How many inputs hold each entry slot the request holds (or counts).
    pub(crate) fn occurrences(&self) -> HashMap<u32, u32> {
        let mut counts: HashMap<u32, u32> = HashMap::with_capacity(self.inputs.len());
        for item in self.inputs.items().chain(self.repeats.keys().copied()) {
            counts.entry(item).or_insert_with(|| 1 + self.repeats.get(&item).copied().unwrap_or(0));
        }
        counts
    }
}

impl Named for RequestRefs {
    fn key(&self) -> &Key {
        &self.id
    }

    fn hash(&self) -> u64 {
        self.hash
    }
}

/// Positions below this are indexed directly: at most 64 KiB of slots a request.
const NEAR: usize = 4096;

#[derive(Debug, Clone, Default)]
pub struct HeldInputs {
    /// Entry slots by position ([`NIL`]: none); never ends in an empty slot, so equal holdings compare equal.
    near: Vec<u32>,
    far: BTreeMap<usize, u32>,
    len: usize,
    /// Positions placed or removed since these holdings were made.
    changes: u64,
}

/// By what is held, not by how it was reached (`changes` aside). Cheapest
/// first: the counts, the near slots, and the far map only when either has one.
impl PartialEq for HeldInputs {
    fn eq(&self, other: &Self) -> bool {
        self.len == other.len && self.near == other.near && ((self.far.is_empty() && other.far.is_empty()) || self.far == other.far)
    }
}

impl Eq for HeldInputs {}

impl HeldInputs {
    pub fn len(&self) -> usize {
        self.len
    }

    pub fn is_empty(&self) -> bool {
        self.len == 0
    }

    /// How many times a position was placed or removed since these holdings
    /// were made: while it stays the same, so do they (the bindings hand out
    /// the same `get_cached_input_ids` answer again on that alone).
    pub fn changes(&self) -> u64 {
        self.changes
    }

    pub fn get(&self, input_id: usize) -> Option<u32> {
        if input_id < NEAR {
            self.near.get(input_id).copied().filter(|&item| item != NIL)
        } else {
            self.far.get(&input_id).copied()
        }
    }

    pub fn contains(&self, input_id: usize) -> bool {
        self.get(input_id).is_some()
    }

    /// Holds `item` at `input_id` unless something is held there already; true if it was placed.
    pub fn insert_vacant(&mut self, input_id: usize, item: u32) -> bool {
        let placed = if input_id < NEAR {
            if self.near.len() <= input_id {
                self.near.resize(input_id + 1, NIL);
            }
            let slot = &mut self.near[input_id];
            let vacant = *slot == NIL;
            if vacant {
                *slot = item;
            }
            vacant
        } else {
            match self.far.entry(input_id) {
                std::collections::btree_map::Entry::Vacant(slot) => {
                    slot.insert(item);
                    true
                }
                std::collections::btree_map::Entry::Occupied(_) => false,
            }
        };
        self.len += usize::from(placed);
        self.changes += u64::from(placed);
        placed
    }

    pub fn remove(&mut self, input_id: usize) -> Option<u32> {
        let item = if input_id < NEAR {
            let slot = self.near.get_mut(input_id)?;
            let item = std::mem::replace(slot, NIL);
            if item == NIL {
                return None;
            }
            while self.near.last() == Some(&NIL) {
                self.near.pop();
            }
            // Gives memory back after a long request's tail is freed; O(1) per removal.
            if self.near.capacity() > 64 && self.near.len() * 4 < self.near.capacity() {
                self.near.shrink_to(self.near.len() * 2);
            }
            item
        } else {
            self.far.remove(&input_id)?
        };
        self.len -= 1;
        self.changes += 1;
        Some(item)
    }

    /// Held positions with their items, in ascending position order.
    pub fn iter(&self) -> impl Iterator<Item = (usize, u32)> + '_ {
        let near = self.near.iter().enumerate().filter(|(_, &item)| item != NIL).map(|(input_id, &item)| (input_id, item));
        near.chain(self.far.iter().map(|(input_id, item)| (*input_id, *item)))
    }

    pub fn positions(&self) -> impl Iterator<Item = usize> + '_ {
        self.iter().map(|(input_id, _)| input_id)
    }

    pub fn items(&self) -> impl Iterator<Item = u32> + '_ {
        self.iter().map(|(_, item)| item)
    }

    /// The held items in ascending position order, emptying the holdings.
    pub fn into_items(self) -> impl Iterator<Item = u32> {
        self.near.into_iter().filter(|&item| item != NIL).chain(self.far.into_values())
    }
}

impl FromIterator<(usize, u32)> for HeldInputs {
    /// A later item at an already held position is dropped.
    fn from_iter<I: IntoIterator<Item = (usize, u32)>>(inputs: I) -> Self {
        let mut held = Self::default();
        for (input_id, item) in inputs {
            held.insert_vacant(input_id, item);
        }
        held
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn held(positions: &[usize]) -> HeldInputs {
        positions.iter().map(|&i| (i, u32::try_from(i % 1_000_000).unwrap())).collect()
    }

    #[test]
    fn positions_near_and_far_are_held_removed_and_walked_in_order() {
        let mut inputs = held(&[NEAR + 5, 3, usize::MAX, 0, NEAR - 1]);
        assert_eq!(inputs.len(), 5);
        assert_eq!(inputs.positions().collect::<Vec<_>>(), [0, 3, NEAR - 1, NEAR + 5, usize::MAX]);
        assert!(!inputs.insert_vacant(3, 77), "a held position is not replaced");
        assert_eq!(inputs.get(3), Some(3));
        assert_eq!(inputs.remove(NEAR - 1), Some(u32::try_from(NEAR - 1).unwrap()));
        assert_eq!(inputs.remove(NEAR - 1), None);
        assert_eq!(inputs.remove(usize::MAX), Some(u32::try_from(usize::MAX % 1_000_000).unwrap()));
        assert_eq!(inputs.remove(7), None);
        assert_eq!(inputs, held(&[0, 3, NEAR + 5]), "equal holdings compare equal, however they were reached");
        assert!(!inputs.contains(1) && inputs.contains(NEAR + 5));
        let items: Vec<u32> = inputs.into_items().collect();
        assert_eq!(items, [0, 3, u32::try_from(NEAR + 5).unwrap()]);
    }

    #[test]
    fn holdings_differing_anywhere_compare_unequal() {
        let base = held(&[0, 3, NEAR + 5]);
        assert_ne!(base, held(&[0, 3]), "one far position fewer");
        assert_ne!(base, held(&[0, 3, NEAR + 6]), "another far position, same count");
        assert_ne!(base, held(&[0, 4, NEAR + 5]), "another near position, same count");
        assert_ne!(held(&[0, 3]), held(&[0, NEAR + 3]), "near against far, same count");
        let other_item: HeldInputs = [(0, 0), (3, 9), (NEAR + 5, 5)].into_iter().collect();
        assert_ne!(base, other_item, "the same positions holding another item");
        assert_eq!(held(&[]), HeldInputs::default());
    }

    #[test]
    fn freeing_a_long_request_gives_its_slots_back() {
        let mut inputs = held(&(0..NEAR).collect::<Vec<_>>());
        for input_id in (1..NEAR).rev() {
            inputs.remove(input_id);
        }
        assert_eq!(inputs.len(), 1);
        assert!(inputs.near.capacity() <= 64, "capacity {} for one held position", inputs.near.capacity());
        inputs.remove(0);
        assert!(inputs.is_empty() && inputs == HeldInputs::default());
    }
}
