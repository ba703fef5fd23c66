//! [`FrequencyMemory`]: what a policy remembers of the items it evicted, so an
//! item's count of acquisitions survives its eviction.
//!
//! A bounded map from an evicted item's hash to its count, forgetting the
//! item evicted longest ago once it holds more than its bound. The bound
//! grows with the cache ([`frequency_memory_bound`]): a cache of many small
//! items evicts many items between two uses of a popular one, and a small
//! cache has no need of a memory that no longer fits beside it in the
//! processor's caches. An item allocated again takes its count back (and
//! leaves the memory). The Python twin keeps the same memory by identifier in
//! eviction order, with the same bound.

use super::ghosts::GhostMap;

/// The fewest evicted items a [`FrequencyMemory`] remembers: its bound for
/// caches of up to `FREQUENCY_MEMORY * FREQUENCY_MEMORY_EMBEDS` embeddings.
pub const FREQUENCY_MEMORY: usize = 2048;

/// Past the least bound, a [`FrequencyMemory`] remembers one evicted item per
/// this many embeddings the cache holds.
pub const FREQUENCY_MEMORY_EMBEDS: u64 = 64;

/// The most evicted items a [`FrequencyMemory`] remembers, however large the cache.
pub const FREQUENCY_MEMORY_MAX: usize = 1 << 16;

/// How many evicted items a cache of `cache_size` embeddings remembers the
/// counts of: one per [`FREQUENCY_MEMORY_EMBEDS`] embeddings, between
/// [`FREQUENCY_MEMORY`] and [`FREQUENCY_MEMORY_MAX`].
pub fn frequency_memory_bound(cache_size: u64) -> usize {
    usize::try_from(cache_size / FREQUENCY_MEMORY_EMBEDS).map_or(FREQUENCY_MEMORY_MAX, |n| n.clamp(FREQUENCY_MEMORY, FREQUENCY_MEMORY_MAX))
}

#[derive(Debug, Clone)]
pub struct FrequencyMemory {
    /// Evicted items' counts by hash, oldest eviction first.
    counts: GhostMap<u32, FREQUENCY_MEMORY_MAX>,
    /// How many it remembers (see [`frequency_memory_bound`]).
    bound: usize,
}

impl Default for FrequencyMemory {
    fn default() -> Self {
        Self { counts: GhostMap::default(), bound: FREQUENCY_MEMORY }
    }
}

impl FrequencyMemory {
    /// The cache now holds `cache_size` embeddings: the bound follows from
    /// the next eviction on.
    pub fn sized(&mut self, cache_size: u64) {
        self.bound = frequency_memory_bound(cache_size);
    }

    /// Remember that the item `hash` was acquired `count` times before its
    /// eviction, forgetting the oldest evictions past the bound.
    pub fn insert(&mut self, hash: u64, count: u32) {
        self.counts.insert(hash, count);
        while self.counts.len() > self.bound && self.counts.pop_oldest().is_some() {}
    }

    /// The count remembered for `hash` (0 if none), which is forgotten.
    #[inline]
    pub fn take(&mut self, hash: u64) -> u32 {
        self.counts.take(hash).unwrap_or(0)
    }
}

#[cfg(test)]
mod tests {
    use super::{frequency_memory_bound, FrequencyMemory, FREQUENCY_MEMORY, FREQUENCY_MEMORY_EMBEDS, FREQUENCY_MEMORY_MAX};

    #[test]
    fn a_count_is_taken_back_once() {
        let mut memory = FrequencyMemory::default();
        memory.insert(7, 5);
        assert_eq!(memory.take(7), 5);
        assert_eq!(memory.take(7), 0);
    }

    #[test]
    fn the_oldest_eviction_is_forgotten_first() {
        let mut memory = FrequencyMemory::default();
        for hash in 0..=FREQUENCY_MEMORY as u64 {
            memory.insert(hash, 2);
        }
        assert_eq!(memory.take(0), 0, "one over the bound: the first is forgotten");
        assert_eq!(memory.take(1), 2);
        assert_eq!(memory.take(FREQUENCY_MEMORY as u64), 2);
    }

    #[test]
    fn an_item_taken_back_and_evicted_again_counts_from_its_new_place() {
        let mut memory = FrequencyMemory::default();
        memory.insert(1, 3);
        memory.insert(2, 1);
        assert_eq!(memory.take(1), 3);
        memory.insert(1, 4); // now evicted after 2
        for hash in 3..=FREQUENCY_MEMORY as u64 + 1 {
            memory.insert(hash, 1);
        }
        assert_eq!(memory.take(2), 0, "the oldest live place goes");
        assert_eq!(memory.take(1), 4, "its stale first place did not count");
    }

    #[test]
    fn the_bound_grows_with_the_cache_between_its_limits() {
        let least = FREQUENCY_MEMORY as u64 * FREQUENCY_MEMORY_EMBEDS;
        assert_eq!(frequency_memory_bound(0), FREQUENCY_MEMORY);
        assert_eq!(frequency_memory_bound(least + FREQUENCY_MEMORY_EMBEDS - 1), FREQUENCY_MEMORY);
        assert_eq!(frequency_memory_bound(least + FREQUENCY_MEMORY_EMBEDS), FREQUENCY_MEMORY + 1);
        assert_eq!(frequency_memory_bound(u64::MAX), FREQUENCY_MEMORY_MAX);
    }

    #[test]
    fn a_larger_cache_remembers_more_and_a_shrunk_one_forgets_at_its_next_eviction() {
        let bound = FREQUENCY_MEMORY + 100;
        let mut memory = FrequencyMemory::default();
        memory.sized(bound as u64 * FREQUENCY_MEMORY_EMBEDS);
        for hash in 0..bound as u64 {
            memory.insert(hash, 2);
        }
        assert_eq!(memory.take(0), 2, "within the larger bound");
        memory.sized(0);
        assert_eq!(memory.take(1), 2, "nothing is forgotten before the next eviction");
        memory.insert(bound as u64, 2);
        assert_eq!(memory.take(bound as u64 - FREQUENCY_MEMORY as u64), 0, "past the least bound");
        assert_eq!(memory.take(bound as u64 - FREQUENCY_MEMORY as u64 + 1), 2);
    }
}
