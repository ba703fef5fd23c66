//! [`FrequencyMemory`]: what a policy remembers of the items it evicted, so an
//! item's count of acquisitions survives its eviction.
//!
//! A bounded map from an evicted item's hash to its count, forgetting the
//! item evicted longest ago once it holds [`FREQUENCY_MEMORY`] items. An item
//! allocated again takes its count back (and leaves the memory). The Python
//! twin keeps the same memory by identifier in eviction order.

use std::collections::VecDeque;

use hashbrown::HashMap;

/// How many evicted items a [`FrequencyMemory`] remembers.
pub const FREQUENCY_MEMORY: usize = 8192;

#[derive(Debug, Clone, Default)]
pub struct FrequencyMemory {
    /// Hash -> (stamp of its place in `order`, count).
    counts: HashMap<u64, (u64, u32)>,
    /// (stamp, hash) in eviction order; places whose item left are skipped.
    order: VecDeque<(u64, u64)>,
    last_stamp: u64,
}

impl FrequencyMemory {
    /// Remember that the item `hash` was acquired `count` times before its eviction.
    pub fn insert(&mut self, hash: u64, count: u32) {
        self.last_stamp += 1;
        self.counts.insert(hash, (self.last_stamp, count));
        self.order.push_back((self.last_stamp, hash));
        while self.counts.len() > FREQUENCY_MEMORY {
            let Some((stamp, oldest)) = self.order.pop_front() else { break };
            if self.counts.get(&oldest).is_some_and(|&(s, _)| s == stamp) {
                self.counts.remove(&oldest);
            }
        }
        if self.order.len() > 2 * FREQUENCY_MEMORY {
            let counts = &self.counts;
            self.order.retain(|(stamp, hash)| counts.get(hash).is_some_and(|&(s, _)| s == *stamp));
        }
    }

    /// The count remembered for `hash` (0 if none), which is forgotten.
    #[inline]
    pub fn take(&mut self, hash: u64) -> u32 {
        if self.counts.is_empty() {
            return 0;
        }
        self.counts.remove(&hash).map_or(0, |(_, count)| count)
    }

    #[cfg(test)]
    pub fn len(&self) -> usize {
        self.counts.len()
    }
}
