//! [`GhostMap`]: what a cache remembers of items it evicted. Each is kept as
//! its 64-bit hash with a small value (nothing, a count, a size), in eviction
//! order, so the owner can forget the oldest first.
//!
//! A map from hash to value and a queue of places in eviction order. Place
//! `i` of the queue is stamped `first + i`, and an item's map entry carries
//! its place's stamp. Taking an item back, or remembering it again, marks
//! its old place dead through that stamp; forgetting the oldest pops the
//! queue's front and moves `first` past it, which leaves the item's map
//! entry forgotten by its stamp without touching the map. Dead places are
//! dropped once they outnumber the live ones, forgotten entries once they
//! are half as many (in one sequential pass over the map), so every
//! operation is O(1) amortised, and an eviction costs one map insertion and
//! one push: the default policy pays it on every eviction for its re-encode
//! counter.
//!
//! A map may also keep a [`Window`] on its newest items: what a smaller map
//! fed the same insertions and takes would remember, without a map of its
//! own. The re-encode counter (`stats`) keeps one, with the frequency memory
//! of `lfu-ghost` and `duel` as its window (`frequency_memory`); `duel`'s
//! shadows and ARC's ghost lists (`arc`) keep their own.

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

/// A place's stamp: place `i` of the queue has stamp `first + i`, so a
/// stamp below `first` means forgotten. 32 bits keep a map entry with a
/// count to 16 bytes; stamps never wrap, because the places are renumbered
/// from 0 once `first` reaches [`RENUMBER_AT`].
pub type Stamp = u32;

/// `first` at which the places are renumbered from 0: far below the most a
/// stamp can be, with room for any queue.
const RENUMBER_AT: Stamp = 1 << 31;

/// The index of the place stamped `stamp` in a queue of `len` places whose
/// front is stamped `first`; None if the stamp is not in it (forgotten).
#[inline]
fn place_index(stamp: Stamp, first: Stamp, len: usize) -> Option<usize> {
    let index = usize::try_from(stamp.checked_sub(first)?).ok()?;
    (index < len).then_some(index)
}

/// A map keyed by 64-bit item hashes.
pub(crate) type HashKeyed<V> = HashMap<u64, V, BuildHasherDefault<OwnHash>>;

/// One eviction in the queue: the item, its value, and whether it is still
/// the item's live place (false once the item was taken back or remembered
/// again).
#[derive(Debug, Clone, Copy)]
pub struct Place<V> {
    pub(crate) hash: u64,
    value: V,
    pub(crate) live: bool,
}

/// What a [`GhostMap`] keeps apart among the items it remembers: nothing
/// (`()`), or its newest up to a bound of their own
/// ([`FrequencyWindow`](super::frequency_memory::FrequencyWindow)). The map
/// tells it of every place that comes or goes; each method of `()` is empty.
pub trait Window: Clone + Default + std::fmt::Debug {
    /// A live place was pushed, the newest.
    #[inline]
    fn pushed(&mut self) {}

    /// The live place stamped `stamp` died: taken back, remembered again or forgotten.
    #[inline]
    fn left(&mut self, stamp: Stamp) {
        let _ = stamp;
    }

    /// Whether the live place stamped `stamp` is in the window.
    #[inline]
    fn holds(&self, stamp: Stamp) -> bool {
        let _ = stamp;
        false
    }

    /// After a push: lets the oldest of its places go past its bound. The
    /// queue `order` has its front stamped `first`.
    #[inline]
    fn trim<V>(&mut self, order: &VecDeque<Place<V>>, first: Stamp) {
        let _ = (order, first);
    }

    /// The queue, whose front was stamped `first`, was compacted: the live
    /// place at offset `i` is now stamped `new_stamps[i]`, and `kept` places stay.
    #[inline]
    fn renumbered(&mut self, first: Stamp, new_stamps: &[Stamp], kept: Stamp) {
        let _ = (first, new_stamps, kept);
    }

    /// `hash` is about to be inserted (its insertion may be deferred).
    #[inline]
    fn noted(&mut self, hash: u64) {
        let _ = hash;
    }

    /// False only if `hash` is surely not in the window, nor about to be.
    #[inline]
    fn may_hold(&self, hash: u64) -> bool {
        let _ = hash;
        false
    }

    /// Upkeep between batches of insertions and takes, on the queue `order`
    /// whose front is stamped `first`.
    #[inline]
    fn refresh<V>(&mut self, order: &VecDeque<Place<V>>, first: Stamp) {
        let _ = (order, first);
    }

    /// The owner's cache now holds `cache_size` embeddings.
    #[inline]
    fn sized(&mut self, cache_size: u64) {
        let _ = cache_size;
    }
}

impl Window for () {}

/// Evicted items by hash, each with a value, oldest first; at most `BOUND`
/// of them (past it, the oldest is forgotten).
///
/// Forgetting the oldest reads only the queue's front, which is sequential
/// memory: the map entry of a forgotten item is left in place and known
/// forgotten by its stamp (below `first`), and such entries are dropped in
/// one pass once they are half as many as the live ones. Taking an item
/// back marks its place dead through its stamp, so the queue never needs
/// the map either. Removing each forgotten entry at once would cost a cache
/// miss per eviction (the map is large, and the entry lands anywhere in it).
#[derive(Debug, Clone)]
pub(crate) struct GhostMap<V, const BOUND: usize, W = ()> {
    /// Hash -> (stamp of its place in `order`, value); entries stamped
    /// below `first` are forgotten.
    by_hash: HashKeyed<(Stamp, V)>,
    /// Places, oldest first; some dead.
    order: VecDeque<Place<V>>,
    /// The stamp of `order`'s front.
    first: Stamp,
    /// How many items are remembered: the live places.
    live: usize,
    window: W,
}

impl<V, const BOUND: usize, W: Window> Default for GhostMap<V, BOUND, W> {
    fn default() -> Self {
        Self { by_hash: HashKeyed::default(), order: VecDeque::new(), first: 0, live: 0, window: W::default() }
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

impl<V: Copy, const BOUND: usize, W: Window> GhostMap<V, BOUND, W> {
    /// How many items are remembered.
    #[cfg(test)]
    pub(crate) fn len(&self) -> usize {
        self.live
    }

    pub(crate) fn window(&self) -> &W {
        &self.window
    }

    pub(crate) fn window_mut(&mut self) -> &mut W {
        &mut self.window
    }

    /// Runs the window's upkeep ([`Window::refresh`]).
    pub(crate) fn refresh_window(&mut self) {
        self.window.refresh(&self.order, self.first);
    }

    /// The place in `order` of a map entry's stamp, if it is remembered.
    #[inline]
    fn index_of(&self, stamp: Stamp) -> Option<usize> {
        place_index(stamp, self.first, self.order.len())
    }

    /// Remembers `hash` with `value` as the newest.
    pub(crate) fn insert(&mut self, hash: u64, value: V) -> Inserted<V> {
        // The queue is far shorter than the room left above `RENUMBER_AT`.
        #[allow(clippy::cast_possible_truncation)]
        let stamp = self.first + self.order.len() as Stamp;
        let had = self.by_hash.insert(hash, (stamp, value));
        self.order.push_back(Place { hash, value, live: true });
        self.window.pushed();
        let inserted = self.made_room(had);
        self.window.trim(&self.order, self.first);
        inserted
    }

    /// After a push: marks the item's earlier place dead, if it had one, or
    /// forgets the oldest item past the bound.
    #[inline]
    fn made_room(&mut self, had: Option<(Stamp, V)>) -> Inserted<V> {
        if let Some((had_stamp, had)) = had {
            if let Some(index) = self.index_of(had_stamp) {
                self.order[index].live = false;
                self.window.left(had_stamp);
                self.compact_if_stale();
                return Inserted::Replaced(had);
            }
        }
        self.live += 1;
        if self.live > BOUND {
            if let Some((_, forgotten)) = self.pop_oldest() {
                return Inserted::Displaced(forgotten);
            }
        }
        Inserted::New
    }

    /// Whether `hash` is remembered.
    #[cfg(test)]
    pub(crate) fn contains(&self, hash: u64) -> bool {
        self.by_hash.get(&hash).is_some_and(|&(stamp, _)| self.index_of(stamp).is_some())
    }

    /// Forgets `hash`; its value if it was remembered.
    #[inline]
    pub(crate) fn take(&mut self, hash: u64) -> Option<V> {
        self.take_windowed(hash).map(|(value, _)| value)
    }

    /// Forgets `hash`; its value if it was remembered, and whether it was in the window.
    #[inline]
    pub(crate) fn take_windowed(&mut self, hash: u64) -> Option<(V, bool)> {
        if self.by_hash.is_empty() {
            return None;
        }
        let (stamp, value) = self.by_hash.remove(&hash)?;
        let index = self.index_of(stamp)?;
        self.order[index].live = false;
        self.live -= 1;
        let in_window = self.window.holds(stamp);
        self.window.left(stamp);
        self.compact_if_stale();
        Some((value, in_window))
    }

    /// Forgets the oldest item: its hash and value. Its map entry stays,
    /// forgotten by its stamp, until the next compaction.
    pub(crate) fn pop_oldest(&mut self) -> Option<(u64, V)> {
        while let Some(place) = self.order.pop_front() {
            self.first += 1;
            if place.live {
                self.live -= 1;
                self.window.left(self.first - 1);
                if self.first >= RENUMBER_AT {
                    self.compact();
                }
                self.compact_if_stale();
                return Some((place.hash, place.value));
            }
        }
        None
    }

    /// Drops the dead places (renumbering those that stay) once they
    /// outnumber the live ones, and the forgotten map entries once they are
    /// more than half as many as the remembered items (plus some slack). At
    /// that rule the map's table grows no larger than that of a map that
    /// removes each forgotten item at once: under churn, hashbrown's
    /// tombstones double that one's table too.
    #[inline]
    fn compact_if_stale(&mut self) {
        if stale_outnumber_live(self.order.len(), self.live) {
            self.compact();
        } else if self.by_hash.len() > self.live + self.live / 2 + 64 {
            let first = self.first;
            self.by_hash.retain(|_, &mut (stamp, _)| stamp >= first);
        }
    }

    /// Keeps only the live places and the map entries remembered, the
    /// places renumbered from 0.
    #[cold]
    fn compact(&mut self) {
        // Each live place's new stamp, by its old offset from `first`.
        let mut kept: Stamp = 0;
        let renumbered: Vec<Stamp> = self
            .order
            .iter()
            .map(|place| {
                let at = kept;
                kept += Stamp::from(place.live);
                at
            })
            .collect();
        self.order.retain(|place| place.live);
        let first = self.first;
        self.window.renumbered(first, &renumbered, kept);
        self.first = 0;
        self.by_hash.retain(|_, (stamp, _)| match place_index(*stamp, first, renumbered.len()) {
            Some(at) => {
                *stamp = renumbered[at];
                true
            }
            None => false,
        });
    }
}

#[cfg(test)]
mod tests {
    use super::{GhostMap, HashKeyed, Inserted, RENUMBER_AT};
    use crate::test_rng::Rng;

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
    fn forgotten_items_stay_forgotten_through_compactions() {
        let mut ghosts = GhostMap::<u64, 4>::default();
        for hash in 1..=4 {
            ghosts.insert(hash, hash);
        }
        assert_eq!(ghosts.take(2), Some(2), "a dead place in the middle");
        for hash in 5..=200 {
            assert!(matches!(ghosts.insert(hash, hash), Inserted::New | Inserted::Displaced(_)));
            let remembered = ghosts.len();
            assert!(ghosts.by_hash.len() <= remembered + remembered / 2 + 65, "forgotten entries are dropped: {}", ghosts.by_hash.len());
        }
        assert_eq!(ghosts.len(), 4);
        for hash in 1..=196 {
            assert!(!ghosts.contains(hash), "{hash} was forgotten");
        }
        assert_eq!(ghosts.insert(199, 1990), Inserted::Replaced(199), "renumbered places still match their entries");
        assert_eq!(ghosts.insert(3, 33), Inserted::Displaced(197), "a forgotten item comes back as new");
        assert_eq!(ghosts.take(1), None);
        let mut order = Vec::new();
        while let Some(oldest) = ghosts.pop_oldest() {
            order.push(oldest);
        }
        assert_eq!(order, [(198, 198), (200, 200), (199, 1990), (3, 33)]);
    }

    #[test]
    fn forgotten_entries_left_in_the_map_cost_no_larger_table() {
        // A full memory forgetting one item per insertion, some taken back:
        // its table is no larger than that of a map that removes each
        // forgotten item at once (under churn, hashbrown's tombstones make
        // that one grow too).
        let mut ghosts = GhostMap::<u32, 2048>::default();
        let mut eager = HashKeyed::<u32>::default();
        let mut eager_order = std::collections::VecDeque::new();
        for hash in 0..200_000u64 {
            ghosts.insert(hash, 1);
            eager.insert(hash, 1);
            eager_order.push_back(hash);
            if hash % 3 == 0 && hash >= 1000 {
                ghosts.take(hash - 1000);
                eager.remove(&(hash - 1000));
            }
            while eager.len() > 2048 {
                let oldest = eager_order.pop_front().unwrap();
                eager.remove(&oldest);
            }
        }
        assert_eq!(ghosts.len(), eager.len());
        assert!(
            ghosts.by_hash.allocation_size() <= eager.allocation_size(),
            "{} > {}",
            ghosts.by_hash.allocation_size(),
            eager.allocation_size()
        );
    }

    /// Drives `ghosts` and a plain list (the oldest first) through the same
    /// random insertions, takes and pops, checking every answer.
    fn check_against_a_plain_list(mut ghosts: GhostMap<u64, 16>) {
        let mut model: Vec<(u64, u64)> = Vec::new();
        let mut rng = Rng(0x9e37_79b9_7f4a_7c15);
        for step in 0..200_000u64 {
            let hash = rng.below(40) as u64;
            match rng.below(8) {
                0..=3 => {
                    let had = model.iter().position(|&(h, _)| h == hash).map(|at| model.remove(at).1);
                    model.push((hash, step));
                    let expected = match had {
                        Some(value) => Inserted::Replaced(value),
                        None if model.len() > 16 => Inserted::Displaced(model.remove(0).1),
                        None => Inserted::New,
                    };
                    assert_eq!(ghosts.insert(hash, step), expected, "insert {hash} at step {step}");
                }
                4..=6 => {
                    let expected = model.iter().position(|&(h, _)| h == hash).map(|at| model.remove(at).1);
                    assert_eq!(ghosts.take(hash), expected, "take {hash} at step {step}");
                }
                _ => {
                    let expected = (!model.is_empty()).then(|| model.remove(0));
                    assert_eq!(ghosts.pop_oldest(), expected, "pop at step {step}");
                }
            }
            assert_eq!(ghosts.len(), model.len());
        }
    }

    #[test]
    fn matches_a_plain_list_on_random_operations() {
        check_against_a_plain_list(GhostMap::default());
    }

    #[test]
    fn matches_a_plain_list_across_the_renumbering_of_its_places() {
        let ghosts = GhostMap { first: RENUMBER_AT - 3, ..GhostMap::default() };
        check_against_a_plain_list(ghosts);
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
