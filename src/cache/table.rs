//! Where entries and requests live: a slab of values addressed by small
//! integer indices (stable while the value lives, reused after), each slot
//! with a generation for [`Handle`]s, and a hash index from names to slots.
//! Every name is hashed once, by the caller or on insertion; the index keeps
//! only slot numbers and compares stored hashes before any text.

use hashbrown::HashTable;

use super::keys::{Handle, Key, KeyArg};

/// A value that the table finds by name.
pub(crate) trait Named {
    fn key(&self) -> &Key;
    fn hash(&self) -> u64;
}

#[derive(Debug, Clone)]
struct Slot<T> {
    generation: u32,
    value: Option<T>,
}

/// Named values in a slab, found by name through a hash index.
#[derive(Debug, Clone)]
pub(crate) struct Table<T> {
    slots: Vec<Slot<T>>,
    vacant: Vec<u32>,
    index: HashTable<u32>,
    /// The next generation to give: every new slot and every freed one takes
    /// the next, so no (slot, generation) pair is ever given twice, even
    /// after trailing slots are given back.
    fresh: u32,
}

impl<T> Default for Table<T> {
    fn default() -> Self {
        Self { slots: Vec::new(), vacant: Vec::new(), index: HashTable::new(), fresh: 0 }
    }
}

impl<T: Named> Table<T> {
    pub(crate) fn len(&self) -> usize {
        self.index.len()
    }

    /// The slot of `name`: its handle when still valid, else by hash and text.
    #[inline]
    pub(crate) fn find(&self, name: &KeyArg<'_>) -> Option<u32> {
        match self.by_handle(name) {
            Some((index, _)) => Some(index),
            None => self.find_hashed(name, name.hash()),
        }
    }

    /// The value named `name`, found as [`Self::find`] finds its slot.
    #[inline]
    pub(crate) fn find_value(&self, name: &KeyArg<'_>) -> Option<&T> {
        match self.by_handle(name) {
            Some((_, value)) => Some(value),
            None => self.find_hashed(name, name.hash()).map(|index| self.get(index)),
        }
    }

    /// The slot and value `name`'s handle gives, if the handle is still valid.
    #[inline]
    pub(crate) fn by_handle(&self, name: &KeyArg<'_>) -> Option<(u32, &T)> {
        let handle = name.handle()?;
        match self.slots.get(handle.index as usize) {
            Some(Slot { generation, value: Some(value) }) if *generation == handle.generation && value.hash() == name.hash() => {
                Some((handle.index, value))
            }
            _ => None,
        }
    }

    #[inline]
    pub(crate) fn find_hashed(&self, name: &KeyArg<'_>, hash: u64) -> Option<u32> {
        let slots = &self.slots;
        self.index.find(hash, |&i| slots[i as usize].value.as_ref().is_some_and(|v| v.hash() == hash && name.names(v.key()))).copied()
    }

    /// Whether `handle` still names the value it was given for.
    #[inline]
    pub(crate) fn is_live(&self, handle: Handle) -> bool {
        self.slots.get(handle.index as usize).is_some_and(|slot| slot.generation == handle.generation && slot.value.is_some())
    }

    pub(crate) fn handle(&self, index: u32) -> Handle {
        Handle { index, generation: self.slots[index as usize].generation }
    }

    #[inline]
    pub(crate) fn get(&self, index: u32) -> &T {
        self.slots[index as usize].value.as_ref().expect("a live slot")
    }

    #[inline]
    pub(crate) fn get_mut(&mut self, index: u32) -> &mut T {
        self.slots[index as usize].value.as_mut().expect("a live slot")
    }

    pub(crate) fn try_get_mut(&mut self, index: u32) -> Option<&mut T> {
        self.slots.get_mut(index as usize)?.value.as_mut()
    }

    /// Adds `value`, whose name must not be in the table; its slot.
    pub(crate) fn insert(&mut self, value: T) -> u32 {
        let hash = value.hash();
        let index = if let Some(index) = self.vacant.pop() {
            self.slots[index as usize].value = Some(value);
            index
        } else {
            let index = u32::try_from(self.slots.len()).expect("fewer than 2^32 slots");
            self.slots.push(Slot { generation: self.fresh, value: Some(value) });
            self.fresh = self.fresh.wrapping_add(1);
            index
        };
        let slots = &self.slots;
        self.index.insert_unique(hash, index, |&i| slots[i as usize].value.as_ref().map_or(0, Named::hash));
        index
    }

    /// Takes the value out of slot `index`; the slot's handles go stale.
    pub(crate) fn remove(&mut self, index: u32) -> T {
        let slot = &mut self.slots[index as usize];
        let value = slot.value.take().expect("a live slot");
        slot.generation = self.fresh;
        self.fresh = self.fresh.wrapping_add(1);
        let hash = value.hash();
        if let Ok(found) = self.index.find_entry(hash, |&i| i == index) {
            found.remove();
        }
        self.vacant.push(index);
        if self.slots.len() > 64 && self.index.len() * 4 < self.slots.len() {
            self.give_back();
        }
        value
    }

    /// Gives a burst's memory back: the vacant slots at the end go, and the
    /// slab and index shrink to twice what is live. O(slots), at most once per
    /// halving, so O(1) per removal.
    fn give_back(&mut self) {
        while self.slots.last().is_some_and(|slot| slot.value.is_none()) {
            self.slots.pop();
        }
        let (len, live) = (self.slots.len(), self.index.len());
        self.vacant.retain(|&i| (i as usize) < len);
        self.slots.shrink_to(len.max(2 * live));
        self.vacant.shrink_to(2 * live);
        let slots = &self.slots;
        self.index.shrink_to(2 * live, |&i| slots[i as usize].value.as_ref().map_or(0, Named::hash));
    }

    /// Every live slot with its value, in slot order.
    pub(crate) fn iter(&self) -> impl Iterator<Item = (u32, &T)> {
        (0u32..).zip(&self.slots).filter_map(|(i, slot)| Some((i, slot.value.as_ref()?)))
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::cache::keys::hash_key;
    use crate::cache::requests::RequestRefs;

    fn named(n: usize) -> RequestRefs {
        let key = Key::from(format!("r{n}"));
        let hash = hash_key(&key);
        RequestRefs::new(key, hash)
    }

    #[test]
    fn a_burst_is_given_back_and_no_handle_is_given_twice() {
        let mut table = Table::default();
        let slots: Vec<u32> = (0..1000).map(|n| table.insert(named(n))).collect();
        let old = table.handle(slots[999]);
        for &slot in &slots[10..] {
            table.remove(slot);
        }
        assert_eq!(table.len(), 10);
        assert!(table.slots.capacity() <= 64, "capacity {} for 10 live slots", table.slots.capacity());
        assert!(!table.is_live(old));
        let mut reused = Vec::new();
        for n in 1000..2000 {
            let slot = table.insert(named(n));
            reused.push(table.handle(slot));
        }
        assert!(reused.iter().all(|handle| *handle != old), "a slot given back and made again has a new generation");
        assert_eq!(table.find(&KeyArg::from("r5")), Some(slots[5]));
        assert_eq!(table.find(&KeyArg::from("r999").at(Some(old))), None, "a stale handle falls back to the name");
    }
}
