//! What `lfu-ghost` and `duel` remember of the items they evicted, so an
//! item's count of acquisitions survives its eviction: the counts of the
//! items evicted last, forgetting the one evicted longest ago past a bound.
//! The bound grows with the cache ([`frequency_memory_bound`]): a cache of
//! many small items evicts many items between two uses of a popular one,
//! and a small cache has no need of a memory that no longer fits beside it
//! in the processor's caches. An item allocated again takes its count back
//! (and leaves the memory).
//!
//! The memory is a [`FrequencyWindow`] on the ghosts that recognise
//! re-encodes, not a map of its own, and a small filter of hash bits
//! answers most allocations of items it does not hold without looking in
//! the ghosts' map. The Python twin keeps the same memory by identifier in
//! eviction order, with the same bound.

use std::collections::VecDeque;

use super::ghosts::{Place, Stamp, Window};

/// The fewest evicted items the frequency memory remembers: its bound for
/// caches of up to `FREQUENCY_MEMORY * FREQUENCY_MEMORY_EMBEDS` embeddings.
pub const FREQUENCY_MEMORY: usize = 2048;

/// Past the least bound, the frequency memory remembers one evicted item per
/// this many embeddings the cache holds.
pub const FREQUENCY_MEMORY_EMBEDS: u64 = 64;

/// The most evicted items the frequency memory remembers, however large the cache.
pub const FREQUENCY_MEMORY_MAX: usize = 1 << 16;

/// How many evicted items a cache of `cache_size` embeddings remembers the
/// counts of: one per [`FREQUENCY_MEMORY_EMBEDS`] embeddings, between
/// [`FREQUENCY_MEMORY`] and [`FREQUENCY_MEMORY_MAX`].
pub fn frequency_memory_bound(cache_size: u64) -> usize {
    usize::try_from(cache_size / FREQUENCY_MEMORY_EMBEDS).map_or(FREQUENCY_MEMORY_MAX, |n| n.clamp(FREQUENCY_MEMORY, FREQUENCY_MEMORY_MAX))
}

/// Bits a [`Seen`] filter keeps per item of the memory's bound.
const SEEN_BITS_PER_ITEM: usize = 32;

/// One bit per slot of hashes, set for every item remembered since the
/// filter was last rebuilt: a clear bit proves an item is not remembered, so
/// the allocation of an item never evicted (most of them) is answered from a
/// few KiB that stay in the processor's nearer caches, not from the map,
/// where its slot would be a cache miss. Bits are never cleared one by one:
/// the filter is rebuilt from the remembered items once it took twice the
/// bound's items since, which keeps about one bit in ten set.
#[derive(Debug, Clone)]
struct Seen {
    words: Vec<u64>,
    /// Items added since the last rebuild.
    added: usize,
}

impl Seen {
    /// The word and bit of `hash` (its upper half: the map uses the lower bits).
    #[inline]
    fn slot(&self, hash: u64) -> (usize, u64) {
        // The words are a power of two, far fewer than 2^32 * 64.
        #[allow(clippy::cast_possible_truncation)]
        let bit = (hash >> 32) as usize & (self.words.len() * 64 - 1);
        (bit / 64, 1 << (bit % 64))
    }

    /// An empty filter sized for a memory of `bound` items.
    fn for_bound(bound: usize) -> Self {
        let mut seen = Self { words: Vec::new(), added: 0 };
        seen.reset(bound);
        seen
    }

    /// Empties the filter and sizes it for a memory of `bound` items.
    fn reset(&mut self, bound: usize) {
        let words = (bound * SEEN_BITS_PER_ITEM / 64).next_power_of_two();
        self.words.clear();
        self.words.resize(words, 0);
        self.added = 0;
    }

    /// False only if `hash` was not added since the last rebuild.
    #[inline]
    fn may_contain(&self, hash: u64) -> bool {
        let (word, bit) = self.slot(hash);
        self.words[word] & bit != 0
    }

    #[inline]
    fn add(&mut self, hash: u64) {
        let (word, bit) = self.slot(hash);
        self.words[word] |= bit;
        self.added += 1;
    }

    /// Whether it took twice `bound`'s items since its last rebuild.
    #[inline]
    fn is_stale(&self, bound: usize) -> bool {
        self.added > 2 * bound
    }

    /// Empties it, sized for `bound`, and adds `remembered`: every item still remembered.
    fn rebuild(&mut self, bound: usize, remembered: impl Iterator<Item = u64>) {
        self.reset(bound);
        for hash in remembered {
            self.add(hash);
        }
    }
}

/// The frequency memory of `lfu-ghost` and `duel`, as a [`Window`] on the
/// ghosts that recognise re-encodes (`stats`): those see every eviction and
/// every allocation, in order, as a memory of the policy's own would, and
/// keep each item's count. So the newest of their remembered items, up to
/// the bound, are the items a bounded map of evicted counts would remember,
/// with the same counts, and the policy keeps no map of its own.
#[derive(Debug, Clone)]
pub struct FrequencyWindow {
    /// The ghosts' live places stamped at or after this are in the window.
    first: Stamp,
    /// How many live places are in it.
    live: usize,
    /// How many it holds at most (see [`frequency_memory_bound`]).
    bound: usize,
    /// Every item in it or about to be, and some no longer there.
    seen: Seen,
}

impl Default for FrequencyWindow {
    fn default() -> Self {
        Self { first: 0, live: 0, bound: FREQUENCY_MEMORY, seen: Seen::for_bound(FREQUENCY_MEMORY) }
    }
}

impl FrequencyWindow {
    /// The offset of the window's oldest stamp in the ghosts' queue, whose
    /// front is stamped `first`. Stamps below the front are forgotten: they
    /// count as the front.
    #[inline]
    fn offset_in(&self, first: Stamp) -> usize {
        self.first.saturating_sub(first) as usize
    }
}

impl Window for FrequencyWindow {
    #[inline]
    fn pushed(&mut self) {
        self.live += 1;
    }

    #[inline]
    fn left(&mut self, stamp: Stamp) {
        if stamp >= self.first {
            self.live -= 1;
        }
    }

    #[inline]
    fn holds(&self, stamp: Stamp) -> bool {
        stamp >= self.first
    }

    #[inline]
    fn trim<V>(&mut self, order: &VecDeque<Place<V>>, first: Stamp) {
        while self.live > self.bound {
            let mut at = self.offset_in(first);
            while order.get(at).is_some_and(|place| !place.live) {
                at += 1;
            }
            if at >= order.len() {
                // Every live place of the window is in the queue, so this is never reached.
                self.live = 0;
                break;
            }
            // Offsets in the queue fit a stamp (see `Stamp`).
            #[allow(clippy::cast_possible_truncation)]
            let passed = first + at as Stamp;
            self.first = passed + 1;
            self.live -= 1;
        }
    }

    #[inline]
    fn renumbered(&mut self, first: Stamp, new_stamps: &[Stamp], kept: Stamp) {
        self.first = new_stamps.get(self.offset_in(first)).copied().unwrap_or(kept);
    }

    #[inline]
    fn noted(&mut self, hash: u64) {
        self.seen.add(hash);
    }

    #[inline]
    fn may_hold(&self, hash: u64) -> bool {
        self.seen.may_contain(hash)
    }

    /// Rebuilds the filter from the window's items once it took twice the
    /// bound's items since its last rebuild.
    fn refresh<V>(&mut self, order: &VecDeque<Place<V>>, first: Stamp) {
        if self.seen.is_stale(self.bound) {
            let from = self.offset_in(first);
            self.seen.rebuild(self.bound, order.iter().skip(from).filter(|place| place.live).map(|place| place.hash));
        }
    }

    fn sized(&mut self, cache_size: u64) {
        self.bound = frequency_memory_bound(cache_size);
    }
}

#[cfg(test)]
mod tests {
    use super::super::ghosts::GhostMap;
    use super::super::stats::{Ghosts, Tally};
    use super::{frequency_memory_bound, FrequencyWindow, FREQUENCY_MEMORY, FREQUENCY_MEMORY_EMBEDS, FREQUENCY_MEMORY_MAX};
    use crate::test_rng::Rng;

    #[test]
    fn the_window_on_the_ghosts_remembers_what_a_memory_of_its_own_would() {
        // One cache's evictions and allocations, given to ghosts with a
        // frequency window, to a bare bounded map of evicted counts and to
        // plain ghosts: every allocation gets the count the map gives (the
        // bound applied at each eviction), and the window's
        // ghosts count the re-encodes the plain ones count. Across changes
        // of the bound (up to the ghosts' own), the filter's rebuilds, the
        // ghosts forgetting past their bound and their compactions.
        let mut tally = Tally::default();
        let mut windowed = Ghosts::<FrequencyWindow>::default();
        let (mut plain, mut plain_tally) = (Ghosts::<()>::default(), Tally::default());
        let (mut memory, mut bound) = (GhostMap::<u32, FREQUENCY_MEMORY_MAX>::default(), FREQUENCY_MEMORY);
        let mut cached: Vec<u64> = Vec::new();
        let mut rng = Rng(7);
        let (mut resumed, mut allocations) = (0, 0);
        // (cache size, items): a bound of 2,048, 5,000, 2,048 (shrunk), the
        // ghosts' own (whose items outnumber it) and 3,000; a few more items
        // than the bound, so that allocations often find the window's oldest.
        let phases = [
            (0, 2_600),
            (5_000 * FREQUENCY_MEMORY_EMBEDS, 6_000),
            (0, 2_600),
            (u64::MAX, 90_000),
            (3_000 * FREQUENCY_MEMORY_EMBEDS, 3_600),
        ];
        let mut items = 0;
        for step in 0..500_000usize {
            if step % 100_000 == 0 {
                let cache_size;
                (cache_size, items) = phases[step / 100_000];
                windowed.sized(cache_size, &mut tally);
                bound = frequency_memory_bound(cache_size);
            }
            let hash = (rng.below(items) as u64).wrapping_mul(0x9e37_79b9_7f4a_7c15).rotate_left(29);
            if cached.len() < 64 || rng.below(2) == 0 {
                if cached.contains(&hash) {
                    continue;
                }
                cached.push(hash);
                allocations += 1;
                let count = windowed.allocated_counted(hash, 1, 8, &mut tally);
                plain.allocated(hash, 1, 8, &mut plain_tally);
                assert_eq!(count, memory.take(hash).unwrap_or(0), "allocation at step {step}");
                resumed += usize::from(count > 0);
            } else {
                let hash = cached.swap_remove(rng.below(cached.len()));
                let count = u32::try_from(rng.below(50)).unwrap() + 1;
                windowed.evicted(hash, count, &mut tally);
                plain.evicted(hash, count, &mut plain_tally);
                memory.insert(hash, count);
                while memory.len() > bound && memory.pop_oldest().is_some() {}
            }
        }
        windowed.apply(&mut tally);
        plain.apply(&mut plain_tally);
        assert_eq!(tally.report(), plain_tally.report());
        let reencodes = tally.report().total.reencodes;
        assert!(
            resumed > 5_000 && reencodes > resumed as u64 + 5_000,
            "{resumed} resumed, {reencodes} re-encodes, {allocations} allocations"
        );
    }

    #[test]
    fn the_bound_grows_with_the_cache_between_its_limits() {
        let least = FREQUENCY_MEMORY as u64 * FREQUENCY_MEMORY_EMBEDS;
        assert_eq!(frequency_memory_bound(0), FREQUENCY_MEMORY);
        assert_eq!(frequency_memory_bound(least + FREQUENCY_MEMORY_EMBEDS - 1), FREQUENCY_MEMORY);
        assert_eq!(frequency_memory_bound(least + FREQUENCY_MEMORY_EMBEDS), FREQUENCY_MEMORY + 1);
        assert_eq!(frequency_memory_bound(u64::MAX), FREQUENCY_MEMORY_MAX);
    }
}
