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
}

impl<T> Default for Table<T> {
    fn default() -> Self {
        Self { slots: Vec::new(), vacant: Vec::new(), index: HashTable::new() }
    }
}

impl<T: Named> Table<T> {
    pub(crate) fn len(&self) -> usize {
        self.index.len()
    }

    /// The slot of `name`: its handle when still valid, else by hash and text.
    #[inline]
    pub(crate) fn find(&self, name: &KeyArg<'_>) -> Option<u32> {
        if let Some(handle) = name.handle() {
            if let Some(Slot { generation, value: Some(value) }) = self.slots.get(handle.index as usize) {
                if *generation == handle.generation && value.hash() == name.hash() {
                    return Some(handle.index);
                }
            }
        }
        self.find_hashed(name, name.hash())
    }

    #[inline]
    pub(crate) fn find_hashed(&self, name: &KeyArg<'_>, hash: u64) -> Option<u32> {
        let slots = &self.slots;
        self.index.find(hash, |&i| slots[i as usize].value.as_ref().is_some_and(|v| v.hash() == hash && name.names(v.key()))).copied()
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
            self.slots.push(Slot { generation: 0, value: Some(value) });
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
        slot.generation = slot.generation.wrapping_add(1);
        let hash = value.hash();
        if let Ok(found) = self.index.find_entry(hash, |&i| i == index) {
            found.remove();
        }
        self.vacant.push(index);
        if self.index.is_empty() {
            // All gone: give a burst's memory back.
            self.slots.clear();
            self.vacant.clear();
            self.index.shrink_to_fit(|_| 0);
        } else if self.index.capacity() > 64 && self.index.len() * 4 < self.index.capacity() {
            let slots = &self.slots;
            self.index.shrink_to(self.index.len() * 2, |&i| slots[i as usize].value.as_ref().map_or(0, Named::hash));
        }
        value
    }

    /// Every live slot with its value, in slot order.
    pub(crate) fn iter(&self) -> impl Iterator<Item = (u32, &T)> {
        (0u32..).zip(&self.slots).filter_map(|(i, slot)| Some((i, slot.value.as_ref()?)))
    }
}
