//! The input positions one request holds, each with its item.
//!
//! A request's positions are its `mm_features` indices: small, dense, and
//! mostly scheduled and freed in order. So positions below [`NEAR`] live in a
//! vector indexed by position: no hashing, no rehashing as a request grows,
//! and ascending order for free when a whole request is released (the order
//! in which its entries become evictable). Positions beyond it, which only a
//! very long request or a caller's arbitrary ids reach, go to an ordered map,
//! so one large id costs one map entry, not a vector that long.

use std::collections::BTreeMap;

use super::Key;

/// Positions below this are indexed directly: at most 64 KiB of slots a request.
const NEAR: usize = 4096;

#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct HeldInputs {
    /// By position; never ends in an empty slot, so equal holdings compare equal.
    near: Vec<Option<Key>>,
    far: BTreeMap<usize, Key>,
    len: usize,
}

impl HeldInputs {
    pub fn len(&self) -> usize {
        self.len
    }

    pub fn is_empty(&self) -> bool {
        self.len == 0
    }

    pub fn get(&self, input_id: usize) -> Option<&Key> {
        if input_id < NEAR {
            self.near.get(input_id)?.as_ref()
        } else {
            self.far.get(&input_id)
        }
    }

    pub fn contains(&self, input_id: usize) -> bool {
        self.get(input_id).is_some()
    }

    /// Holds `item` at `input_id` unless something is held there already; true if it was placed.
    pub fn insert_vacant(&mut self, input_id: usize, item: Key) -> bool {
        let placed = if input_id < NEAR {
            if self.near.len() <= input_id {
                self.near.resize(input_id + 1, None);
            }
            let slot = &mut self.near[input_id];
            let vacant = slot.is_none();
            if vacant {
                *slot = Some(item);
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
        placed
    }

    pub fn remove(&mut self, input_id: usize) -> Option<Key> {
        let item = if input_id < NEAR {
            let item = self.near.get_mut(input_id)?.take()?;
            while let Some(None) = self.near.last() {
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
        Some(item)
    }

    /// Held positions with their items, in ascending position order.
    pub fn iter(&self) -> impl Iterator<Item = (usize, &Key)> {
        let near = self.near.iter().enumerate().filter_map(|(input_id, item)| Some((input_id, item.as_ref()?)));
        near.chain(self.far.iter().map(|(input_id, item)| (*input_id, item)))
    }

    pub fn positions(&self) -> impl Iterator<Item = usize> + '_ {
        self.iter().map(|(input_id, _)| input_id)
    }

    pub fn items(&self) -> impl Iterator<Item = &Key> {
        self.iter().map(|(_, item)| item)
    }

    /// The held items in ascending position order, emptying the holdings.
    pub fn into_items(self) -> impl Iterator<Item = Key> {
        self.near.into_iter().flatten().chain(self.far.into_values())
    }
}

impl FromIterator<(usize, Key)> for HeldInputs {
    /// A later item at an already held position is dropped.
    fn from_iter<I: IntoIterator<Item = (usize, Key)>>(inputs: I) -> Self {
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
        positions.iter().map(|&i| (i, Key::from(format!("item{i}")))).collect()
    }

    #[test]
    fn positions_near_and_far_are_held_removed_and_walked_in_order() {
        let mut inputs = held(&[NEAR + 5, 3, usize::MAX, 0, NEAR - 1]);
        assert_eq!(inputs.len(), 5);
        assert_eq!(inputs.positions().collect::<Vec<_>>(), [0, 3, NEAR - 1, NEAR + 5, usize::MAX]);
        assert!(!inputs.insert_vacant(3, Key::from("other")), "a held position is not replaced");
        assert_eq!(inputs.get(3).map(|k| &**k), Some("item3"));
        assert_eq!(inputs.remove(NEAR - 1).as_deref(), Some(&*format!("item{}", NEAR - 1)));
        assert_eq!(inputs.remove(NEAR - 1), None);
        assert_eq!(inputs.remove(usize::MAX).as_deref(), Some(&*format!("item{}", usize::MAX)));
        assert_eq!(inputs.remove(7), None);
        assert_eq!(inputs, held(&[0, 3, NEAR + 5]), "equal holdings compare equal, however they were reached");
        assert!(!inputs.contains(1) && inputs.contains(NEAR + 5));
        let items: Vec<Key> = inputs.into_items().collect();
        assert_eq!(items.iter().map(|k| &**k).collect::<Vec<_>>(), ["item0", "item3", &*format!("item{}", NEAR + 5)]);
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
