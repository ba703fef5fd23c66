//! [`Shadows`]: two caches that hold no data, only item hashes and sizes,
//! fed every acquisition the real cache sees, each evicting by its own rule:
//! vLLM's (least recently used) and `lfu-ghost`'s (least frequently used,
//! weighted by cost per size, with counts that survive eviction). Each counts
//! the embeddings it would have had to encode; the `duel` policy evicts in
//! the order of whichever counted fewer lately.
//!
//! A shadow cache sees every item acquired once per (request, input), as the
//! real cache counts hits and misses, but holds no references: an item is
//! never pinned there. The counts are halved every [`SHADOW_HALF_LIFE`]
//! acquisitions, so the recent traffic decides.
//!
//! The Python twin (`encoder_cache.reference.shadows`) keeps the same two
//! caches by identifier and decides the same.

use std::cmp::Reverse;
use std::collections::BinaryHeap;

use super::frequency_memory::FrequencyMemory;
use super::ghosts::{GhostMap, HashKeyed, Inserted};
use super::lanes::rank_of;
use super::policies::Policy;

/// Acquisitions after which both shadows' counts of encoded embeddings are halved.
pub const SHADOW_HALF_LIFE: u32 = 4096;

/// Least recently used, over hashes and sizes.
#[derive(Debug, Clone, Default)]
struct ShadowLru {
    /// Sizes by hash, least recently acquired first.
    items: GhostMap<u64, { usize::MAX }>,
    used: u64,
}

impl ShadowLru {
    /// Acquires `hash` of `num_embeds`; the embeddings a miss encodes (0 on a hit).
    fn acquire(&mut self, hash: u64, num_embeds: u64, capacity: u64) -> u64 {
        if let Inserted::Replaced(_) = self.items.insert(hash, num_embeds) {
            return 0;
        }
        self.used += num_embeds;
        while self.used > capacity && self.items.len() > 1 {
            let Some((_, size)) = self.items.pop_oldest() else { break };
            self.used -= size;
        }
        num_embeds
    }
}

/// What the LFU shadow keeps per item.
#[derive(Debug, Clone, Copy)]
struct Counted {
    count: u32,
    num_embeds: u64,
    /// The sequence number of its live heap place.
    place: u64,
}

/// Least frequently used (`count * cost / size`, ties: the older place
/// first), counts remembered across eviction as `lfu-ghost` does.
#[derive(Debug, Clone, Default)]
struct ShadowLfu {
    items: HashKeyed<Counted>,
    /// (rank, sequence, hash), lowest first; a place is live while its
    /// sequence is the item's `place`.
    heap: BinaryHeap<Reverse<(i64, u64, u64)>>,
    memory: FrequencyMemory,
    used: u64,
    sequence: u64,
}

/// Gives `item` a new heap place, the newest, at its current priority.
fn place(heap: &mut BinaryHeap<Reverse<(i64, u64, u64)>>, sequence: &mut u64, hash: u64, item: &mut Counted) {
    *sequence += 1;
    item.place = *sequence;
    let priority = f64::from(item.count) * Policy::gdsf_value(item.num_embeds);
    heap.push(Reverse((rank_of(priority), *sequence, hash)));
}

impl ShadowLfu {
    fn acquire(&mut self, hash: u64, num_embeds: u64, capacity: u64) -> u64 {
        if let Some(item) = self.items.get_mut(&hash) {
            item.count = item.count.saturating_add(1);
            place(&mut self.heap, &mut self.sequence, hash, item);
            self.compact_if_stale();
            return 0;
        }
        let count = self.memory.take(hash).saturating_add(1);
        self.used += num_embeds;
        while self.used > capacity && !self.items.is_empty() {
            let Some(Reverse((_, sequence, victim))) = self.heap.pop() else { break };
            if let hashbrown::hash_map::EntryRef::Occupied(held) = self.items.entry_ref(&victim) {
                if held.get().place == sequence {
                    let item = held.remove();
                    self.used -= item.num_embeds;
                    self.memory.insert(victim, item.count);
                }
            }
        }
        let mut item = Counted { count, num_embeds, place: 0 };
        place(&mut self.heap, &mut self.sequence, hash, &mut item);
        self.items.insert(hash, item);
        num_embeds
    }

    /// Rebuilds the heap from the live places once stale ones outnumber them.
    fn compact_if_stale(&mut self) {
        if self.heap.len() > 2 * self.items.len() + 64 {
            let items = &self.items;
            self.heap.retain(|Reverse((_, sequence, hash))| items.get(hash).is_some_and(|item| item.place == *sequence));
        }
    }
}

/// The two shadow caches and what each would have encoded lately.
#[derive(Debug, Clone, Default)]
pub(crate) struct Shadows {
    lru: ShadowLru,
    lfu: ShadowLfu,
    capacity: u64,
    /// Embeddings each would have encoded (LRU, LFU), halved every [`SHADOW_HALF_LIFE`] acquisitions.
    encoded: [u64; 2],
    acquisitions: u32,
}

impl Shadows {
    /// Both shadows now hold up to `capacity` embeddings (from their next miss on).
    pub(crate) fn resize(&mut self, capacity: u64) {
        self.capacity = capacity;
    }

    /// The item `hash` of `num_embeds` was acquired (a hit or an allocation).
    #[inline]
    pub(crate) fn acquire(&mut self, hash: u64, num_embeds: u64) {
        self.encoded[0] += self.lru.acquire(hash, num_embeds, self.capacity);
        self.encoded[1] += self.lfu.acquire(hash, num_embeds, self.capacity);
        self.acquisitions += 1;
        if self.acquisitions == SHADOW_HALF_LIFE {
            self.acquisitions = 0;
            self.encoded = self.encoded.map(|encoded| encoded / 2);
        }
    }

    /// Whether the LFU shadow encoded strictly less lately.
    #[inline]
    pub(crate) fn lfu_leads(&self) -> bool {
        self.encoded[1] < self.encoded[0]
    }

    /// (LRU, LFU): what each would have encoded lately.
    #[cfg(test)]
    fn encoded(&self) -> [u64; 2] {
        self.encoded
    }
}

#[cfg(test)]
mod tests {
    use super::Shadows;

    #[test]
    fn a_scan_favours_lfu_and_a_moving_working_set_favours_lru() {
        // One hot item acquired between one-off items: LRU keeps losing it, LFU keeps it.
        let mut shadows = Shadows::default();
        shadows.resize(20);
        for k in 0..200 {
            shadows.acquire(1, 10);
            shadows.acquire(1000 + k, 10);
            shadows.acquire(5000 + k, 10);
        }
        assert!(shadows.lfu_leads(), "{:?}", shadows.encoded());

        // Items used a few times in a row, then never again: LFU holds on to the old counts.
        let mut shadows = Shadows::default();
        shadows.resize(30);
        for k in 0..200u64 {
            for _ in 0..3 {
                shadows.acquire(k, 10);
                shadows.acquire(k + 1, 10);
            }
        }
        assert!(!shadows.lfu_leads(), "{:?}", shadows.encoded());
    }

    #[test]
    fn counts_are_halved_so_recent_traffic_decides() {
        let mut shadows = Shadows::default();
        shadows.resize(10);
        for k in 0..u64::from(super::SHADOW_HALF_LIFE) {
            shadows.acquire(k, 10);
        }
        assert_eq!(shadows.encoded(), [u64::from(super::SHADOW_HALF_LIFE) * 10 / 2; 2]);
    }
}
