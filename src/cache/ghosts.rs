//! [`GhostMap`]: what a cache remembers of items it evicted. Each is kept as
//! its 64-bit hash with a small value (nothing, a count, a size), in eviction
//! order, so the owner can forget the oldest first.
//!
//! A map from hash to value and a queue of hashes in eviction order. An
//! item's place in the queue carries a stamp, and so does its map entry, so
//! a place left by an item taken back or remembered again is known stale
//! and skipped. The queue is compacted when stale places outnumber live
//! ones, so every operation is O(1) amortised. This costs less per eviction
//! than an index-linked list (one map insertion and one push, where the list
//! needs a lookup, an insertion and three links), and the default policy
//! pays it on every eviction for its re-encode counter.
//!
//! Three things keep one: the re-encode counter (`stats`), `lfu-ghost`'s
//! frequency memory (`frequency_memory`) and ARC's ghost lists (`arc`).

use std::collections::VecDeque;
use std::hash::{BuildHasherDefault, Hasher};

use hashbrown::HashMap;

/// Keys that are already 64-bit hashes (`hash_key`'s, well mixed) are their
/// own hash: hashing them again would only cost time.
#[derive(Debug, Clone, Copy, Default)]
pub(crate) struct OwnHash(u64);

impl Hasher for OwnHash {
    fn finish(&self) -> u64 {
        self.0
    }

    fn write(&mut self, bytes: &[u8]) {
        // Only u64 keys are hashed with this; other input folds in bytewise.
        for &byte in bytes {
            self.0 = self.0.rotate_left(8) ^ u64::from(byte);
        }
    }

    fn write_u64(&mut self, value: u64) {
        self.0 = value;
    }
}

/// Whether a queue of `places`, `live` of them live, should drop its stale
/// ones: once they outnumber the live ones (with some slack), so that
/// compacting costs O(1) amortised per place pushed. Every stamped queue
/// here (the ghost maps' and the shadows') compacts by this rule.
#[inline]
pub(crate) fn stale_outnumber_live(places: usize, live: usize) -> bool {
    places > 2 * live + 64
}

/// A place's stamp. Stamps wrap, which is safe: a stale place is dropped,
/// by compaction (see [`stale_outnumber_live`]) or as the oldest, within a
/// few times `BOUND` insertions, far fewer than the 2^32 after which its
/// stamp comes round again, so a stale place never matches its item's live
/// stamp. 32 bits keep a map entry with a count to 16 bytes.
type Stamp = u32;

/// A map keyed by 64-bit item hashes.
pub(crate) type HashKeyed<V> = HashMap<u64, V, BuildHasherDefault<OwnHash>>;

/// Evicted items by hash, each with a value, oldest first; at most `BOUND`
/// of them (past it, the oldest is forgotten).
#[derive(Debug, Clone)]
pub(crate) struct GhostMap<V, const BOUND: usize> {
    /// Hash -> (stamp of its place in `order`, value).
    by_hash: HashKeyed<(Stamp, V)>,
    /// (stamp, hash), oldest first; some places stale.
    order: VecDeque<(Stamp, u64)>,
    last_stamp: Stamp,
}

impl<V, const BOUND: usize> Default for GhostMap<V, BOUND> {
    fn default() -> Self {
        Self { by_hash: HashKeyed::default(), order: VecDeque::new(), last_stamp: 0 }
    }
}

/// What remembering an item did to the others.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum Inserted<V> {
    /// The item is new, and there was room.
    New,
    /// The item was remembered already, with this value; it moved to the newest.
    Replaced(V),
    /// The item is new, and the oldest item, with this value, was forgotten to make room.
    Displaced(V),
}

impl<V: Copy, const BOUND: usize> GhostMap<V, BOUND> {
    /// How many items are remembered.
    #[inline]
    pub(crate) fn len(&self) -> usize {
        self.by_hash.len()
    }

    /// Remembers `hash` with `value` as the newest.
    pub(crate) fn insert(&mut self, hash: u64, value: V) -> Inserted<V> {
        self.last_stamp = self.last_stamp.wrapping_add(1);
        let had = self.by_hash.insert(hash, (self.last_stamp, value));
        self.order.push_back((self.last_stamp, hash));
        if let Some((_, had)) = had {
            self.compact_if_stale();
            return Inserted::Replaced(had);
        }
        if self.by_hash.len() > BOUND {
            if let Some((_, forgotten)) = self.pop_oldest() {
                return Inserted::Displaced(forgotten);
            }
        }
        Inserted::New
    }

    /// Whether `hash` is remembered.
    #[cfg(test)]
    pub(crate) fn contains(&self, hash: u64) -> bool {
        self.by_hash.contains_key(&hash)
    }

    /// Forgets `hash`; its value if it was remembered.
    #[inline]
    pub(crate) fn take(&mut self, hash: u64) -> Option<V> {
        if self.by_hash.is_empty() {
            return None;
        }
        let (_, value) = self.by_hash.remove(&hash)?;
        self.compact_if_stale();
        Some(value)
    }

    /// Forgets the oldest item: its hash and value.
    pub(crate) fn pop_oldest(&mut self) -> Option<(u64, V)> {
        while let Some((stamp, hash)) = self.order.pop_front() {
            if let hashbrown::hash_map::EntryRef::Occupied(place) = self.by_hash.entry_ref(&hash) {
                if place.get().0 == stamp {
                    let (_, value) = place.remove();
                    return Some((hash, value));
                }
            }
        }
        None
    }

    /// Drops the stale places once they outnumber the live ones.
    #[inline]
    fn compact_if_stale(&mut self) {
        if stale_outnumber_live(self.order.len(), self.by_hash.len()) {
            let by_hash = &self.by_hash;
            self.order.retain(|&(stamp, hash)| by_hash.get(&hash).is_some_and(|&(live, _)| live == stamp));
        }
    }
}

#[cfg(test)]
mod tests {
    use super::{GhostMap, Inserted};

    #[test]
    fn the_oldest_goes_first_and_a_repeat_moves_to_the_newest() {
        let mut ghosts = GhostMap::<u64, 8>::default();
        for hash in 1..=4 {
            assert_eq!(ghosts.insert(hash, hash * 10), Inserted::New);
        }
        assert_eq!(ghosts.insert(2, 21), Inserted::Replaced(20), "a repeat gives back its old value");
        assert_eq!(ghosts.take(3), Some(30));
        assert_eq!(ghosts.take(3), None, "taken once");
        let mut order = Vec::new();
        while let Some(oldest) = ghosts.pop_oldest() {
            order.push(oldest);
        }
        assert_eq!(order, [(1, 10), (4, 40), (2, 21)]);
        assert_eq!(ghosts.len(), 0);
        assert_eq!(ghosts.insert(5, 50), Inserted::New);
        assert_eq!(ghosts.len(), 1);
    }

    #[test]
    fn stale_places_are_dropped_and_never_counted() {
        let mut ghosts = GhostMap::<u64, 1000>::default();
        for round in 0..500 {
            ghosts.insert(7, round);
            assert_eq!(ghosts.take(7), Some(round));
        }
        ghosts.insert(8, 1);
        assert!(ghosts.order.len() <= 2 * ghosts.len() + 64, "compacted: {} places", ghosts.order.len());
        assert_eq!(ghosts.pop_oldest(), Some((8, 1)), "stale places are skipped");
    }

    #[test]
    fn stamps_that_wrap_keep_the_order_and_skip_stale_places() {
        let mut ghosts = GhostMap::<u64, 8> { last_stamp: u32::MAX - 2, ..GhostMap::default() };
        assert_eq!(ghosts.insert(1, 10), Inserted::New); // stamp MAX - 1
        assert_eq!(ghosts.insert(2, 20), Inserted::New); // stamp MAX
        assert_eq!(ghosts.insert(3, 30), Inserted::New); // stamp 0
        assert_eq!(ghosts.insert(1, 11), Inserted::Replaced(10), "its first place, stamped before the wrap, is stale");
        let mut order = Vec::new();
        while let Some(oldest) = ghosts.pop_oldest() {
            order.push(oldest);
        }
        assert_eq!(order, [(2, 20), (3, 30), (1, 11)]);
    }

    #[test]
    fn past_the_bound_the_oldest_is_forgotten() {
        let mut ghosts = GhostMap::<u64, 3>::default();
        for hash in 1..=3 {
            assert_eq!(ghosts.insert(hash, hash * 10), Inserted::New);
        }
        assert_eq!(ghosts.insert(4, 40), Inserted::Displaced(10));
        assert_eq!(ghosts.insert(5, 50), Inserted::Displaced(20));
        assert_eq!(ghosts.len(), 3);
        assert_eq!((ghosts.take(1), ghosts.take(2)), (None, None));
        assert_eq!(ghosts.pop_oldest(), Some((3, 30)));
        assert_eq!(ghosts.len(), 2);
    }
}
