//! [`FrequencyMemory`]: what a policy remembers of the items it evicted, so an
//! item's count of acquisitions survives its eviction.
//!
//! A bounded map from an evicted item's hash to its count, forgetting the
//! item evicted longest ago once it holds [`FREQUENCY_MEMORY`] items. An item
//! allocated again takes its count back (and leaves the memory). The Python
//! twin keeps the same memory by identifier in eviction order.

use super::ghosts::GhostMap;

/// How many evicted items a [`FrequencyMemory`] remembers.
pub const FREQUENCY_MEMORY: usize = 8192;

#[derive(Debug, Clone, Default)]
pub struct FrequencyMemory {
    /// Evicted items' counts by hash, oldest eviction first.
    counts: GhostMap<u32, FREQUENCY_MEMORY>,
}

impl FrequencyMemory {
    /// Remember that the item `hash` was acquired `count` times before its eviction.
    pub fn insert(&mut self, hash: u64, count: u32) {
        self.counts.insert(hash, count);
    }

    /// The count remembered for `hash` (0 if none), which is forgotten.
    #[inline]
    pub fn take(&mut self, hash: u64) -> u32 {
        self.counts.take(hash).unwrap_or(0)
    }
}

#[cfg(test)]
mod tests {
    use super::{FrequencyMemory, FREQUENCY_MEMORY};

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
}
