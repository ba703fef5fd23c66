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
//! Both shadows keep their items in one map, so an acquisition looks its
//! item up once; each keeps its own order (a queue of placings for the LRU
//! one, a rising run and a heap for the LFU one), whose stale places are
//! skipped. The Python twin (`encoder_cache.reference.shadows`) keeps the
//! same two caches apart, by identifier, and decides the same.

use std::cmp::Reverse;
use std::collections::{BinaryHeap, VecDeque};

use hashbrown::hash_map::EntryRef;

use super::frequency_memory::FREQUENCY_MEMORY;
use super::ghosts::{stale_outnumber_live, HashKeyed};
use super::lanes::rank_of;
use super::policies::Policy;

/// Acquisitions after which both shadows' counts of encoded embeddings are halved.
pub const SHADOW_HALF_LIFE: u32 = 4096;

/// The LFU shadow leads only once it encoded less by more than this fraction
/// (1 / `SHADOW_NEAR_TIE`) of its own count; closer counts are a tie, which
/// goes to vLLM's order. A lead that small is noise, and following it lets
/// the real cache drift from what the LFU shadow measured.
pub const SHADOW_NEAR_TIE: u64 = 256;

/// What the shadows know of one item. It stays in the map while either
/// holds it or the LFU one remembers its count.
#[derive(Debug, Clone, Copy, Default)]
struct Shadowed {
    /// In the LRU shadow: when it was last placed there (0: not there).
    lru_placed: u64,
    /// Its size as the LRU shadow last saw it.
    lru_embeds: u64,
    /// The LFU shadow's count of it: 0 if it neither holds nor remembers it.
    count: u32,
    /// Held by the LFU shadow.
    held: bool,
    /// Its size as the LFU shadow admitted it.
    num_embeds: u64,
    /// Held: the sequence number of its live place; remembered: when it was evicted.
    place: u64,
}

impl Shadowed {
    fn remembered_since(&self, evicted: u64) -> bool {
        !self.held && self.count > 0 && self.place == evicted
    }
}

/// A place in the LFU shadow's order: (rank, sequence, hash), lowest first.
type Place = (i64, u64, u64);

/// The LFU shadow's places, lowest first: a run of places pushed in rising
/// order (as items of one size and count come), and a heap of the rest.
/// Places go stale when their item moves or leaves; they are skipped.
#[derive(Debug, Clone, Default)]
struct Places {
    run: VecDeque<Place>,
    heap: BinaryHeap<Reverse<Place>>,
}

impl Places {
    /// Moves the live place `(_, placed, hash)` to `place`, which is later
    /// in the order: in the run's last slot if it is there (the run stays
    /// rising), else as a new place, the old one left stale.
    fn replace(&mut self, placed: u64, hash: u64, place: Place) {
        match self.run.back_mut() {
            Some(last) if (last.1, last.2) == (placed, hash) => *last = place,
            _ => self.push(place),
        }
    }

    fn push(&mut self, place: Place) {
        if self.run.back().is_none_or(|&last| place >= last) {
            self.run.push_back(place);
        } else {
            self.heap.push(Reverse(place));
        }
    }

    fn pop(&mut self) -> Option<Place> {
        match (self.run.front(), self.heap.peek()) {
            (Some(first), Some(Reverse(lowest))) if lowest < first => self.heap.pop().map(|Reverse(place)| place),
            (Some(_), _) => self.run.pop_front(),
            (None, _) => self.heap.pop().map(|Reverse(place)| place),
        }
    }

    fn len(&self) -> usize {
        self.run.len() + self.heap.len()
    }

    fn retain(&mut self, mut live: impl FnMut(&Place) -> bool) {
        self.run.retain(&mut live);
        self.heap.retain(|Reverse(place)| live(place));
    }
}

fn rank(count: u32, num_embeds: u64) -> i64 {
    rank_of(f64::from(count) * Policy::gdsf_value(num_embeds))
}

/// The two shadow caches and what each would have encoded lately.
#[derive(Debug, Clone, Default)]
pub(crate) struct Shadows {
    items: HashKeyed<Shadowed>,
    capacity: u64,
    /// Numbers every placing, in either shadow, and every LFU eviction.
    sequence: u64,
    /// The LRU shadow's (placed, hash), oldest first; live while the item's `lru_placed`.
    lru_order: VecDeque<(u64, u64)>,
    lru_len: usize,
    lru_used: u64,
    /// The LFU shadow's order; a place is live while its item is held there.
    places: Places,
    /// (when evicted, hash) of the LFU shadow's evictions, oldest first; the
    /// last [`FREQUENCY_MEMORY`] remembered keep their counts.
    evictions: VecDeque<(u64, u64)>,
    held: usize,
    remembered: usize,
    lfu_used: u64,
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
    pub(crate) fn acquire(&mut self, hash: u64, num_embeds: u64) {
        self.sequence += 1;
        let now = self.sequence;
        let item = self.items.entry(hash).or_default();
        let recency_hit = item.lru_placed != 0;
        // Placed last already: the queue's last placing moves with it, and no stale one is left.
        let lru_last = recency_hit && self.lru_order.back() == Some(&(item.lru_placed, hash));
        let lfu_placed = item.place;
        item.lru_placed = now;
        item.lru_embeds = num_embeds;
        let frequency_hit = item.held;
        if frequency_hit {
            item.count = item.count.saturating_add(1);
        } else {
            if item.count > 0 {
                self.remembered -= 1;
            }
            *item = Shadowed { count: item.count.saturating_add(1), held: true, num_embeds, ..*item };
        }
        item.place = now;
        let placed = (rank(item.count, item.num_embeds), now, hash);
        if lru_last {
            if let Some(last) = self.lru_order.back_mut() {
                last.0 = now;
            }
        } else {
            self.lru_order.push_back((now, hash));
        }
        if recency_hit {
            self.compact_lru_if_stale();
        } else {
            self.lru_len += 1;
            self.lru_used += num_embeds;
            self.encoded[0] += num_embeds;
            while self.lru_used > self.capacity && self.lru_len > 1 {
                self.evict_lru();
            }
        }
        if frequency_hit {
            self.places.replace(lfu_placed, hash, placed);
            self.compact_places_if_stale();
        } else {
            self.held += 1;
            self.lfu_used += num_embeds;
            self.encoded[1] += num_embeds;
            self.compact_evictions_if_stale();
            while self.lfu_used > self.capacity {
                let Some((_, place, victim)) = self.places.pop() else { break };
                self.evict_lfu(victim, place);
            }
            self.places.push(placed);
        }
        self.acquisitions += 1;
        if self.acquisitions == SHADOW_HALF_LIFE {
            self.acquisitions = 0;
            self.encoded = self.encoded.map(|encoded| encoded / 2);
        }
    }

    /// Whether the LFU shadow encoded less lately, by more than a near tie.
    #[inline]
    pub(crate) fn lfu_leads(&self) -> bool {
        self.encoded[1] + self.encoded[1] / SHADOW_NEAR_TIE < self.encoded[0]
    }

    /// (LRU, LFU): what each would have encoded lately.
    #[cfg(test)]
    fn encoded(&self) -> [u64; 2] {
        self.encoded
    }

    /// Evicts the LRU shadow's least recently placed item.
    fn evict_lru(&mut self) {
        while let Some((placed, hash)) = self.lru_order.pop_front() {
            if let EntryRef::Occupied(mut found) = self.items.entry_ref(&hash) {
                let item = found.get_mut();
                if item.lru_placed == placed {
                    item.lru_placed = 0;
                    self.lru_len -= 1;
                    self.lru_used -= item.lru_embeds;
                    if item.count == 0 {
                        found.remove();
                    }
                    return;
                }
            }
        }
    }

    /// Evicts `victim` from the LFU shadow if `place` is its live place,
    /// remembering its count.
    fn evict_lfu(&mut self, victim: u64, place: u64) {
        let Some(item) = self.items.get_mut(&victim) else { return };
        if !item.held || item.place != place {
            return;
        }
        self.sequence += 1;
        item.held = false;
        item.place = self.sequence;
        self.lfu_used -= item.num_embeds;
        self.held -= 1;
        self.remembered += 1;
        self.evictions.push_back((self.sequence, victim));
        if self.remembered > FREQUENCY_MEMORY {
            self.forget_oldest();
        }
    }

    /// Forgets the count of the item the LFU shadow evicted longest ago and still remembers.
    fn forget_oldest(&mut self) {
        while let Some((evicted, hash)) = self.evictions.pop_front() {
            if let EntryRef::Occupied(mut found) = self.items.entry_ref(&hash) {
                if found.get().remembered_since(evicted) {
                    self.remembered -= 1;
                    if found.get().lru_placed == 0 {
                        found.remove();
                    } else {
                        found.get_mut().count = 0;
                    }
                    return;
                }
            }
        }
    }

    /// Drops the LRU shadow's stale placings once they outnumber the live ones.
    fn compact_lru_if_stale(&mut self) {
        if stale_outnumber_live(self.lru_order.len(), self.lru_len) {
            let items = &self.items;
            self.lru_order.retain(|(placed, hash)| items.get(hash).is_some_and(|item| item.lru_placed == *placed));
        }
    }

    /// Keeps only the LFU shadow's live places once stale ones outnumber them.
    fn compact_places_if_stale(&mut self) {
        if stale_outnumber_live(self.places.len(), self.held) {
            let items = &self.items;
            self.places.retain(|(_, place, hash)| items.get(hash).is_some_and(|item| item.held && item.place == *place));
        }
    }

    /// Drops the evictions of items held again or forgotten once they outnumber the remembered ones.
    fn compact_evictions_if_stale(&mut self) {
        if stale_outnumber_live(self.evictions.len(), self.remembered) {
            let items = &self.items;
            self.evictions.retain(|(evicted, hash)| items.get(hash).is_some_and(|item| item.remembered_since(*evicted)));
        }
    }
}

#[cfg(test)]
mod tests {
    use super::{Places, Shadows};

    #[test]
    fn places_pop_lowest_first_whatever_order_they_come_in() {
        // Interleaved rising sequences (new and reused items) and scattered ranks: the run and the heap.
        let mut places = Places::default();
        let mut pushed = Vec::new();
        for seq in 0..300u64 {
            let rank = match seq % 3 {
                0 => 1,
                1 => 50 + i64::try_from(seq / 30).unwrap(),
                _ => i64::try_from((seq * 7919) % 97).unwrap(),
            };
            places.push((rank, seq, seq));
            pushed.push((rank, seq, seq));
        }
        pushed.sort_unstable();
        let popped: Vec<_> = std::iter::from_fn(|| places.pop()).collect();
        assert_eq!(popped, pushed);
    }

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
    fn a_near_tie_goes_to_lru() {
        let mut shadows = Shadows::default();
        for (lru, lfu, leads) in [(1000, 1000, false), (1000, 997, false), (1000, 996, true), (0, 0, false), (1, 0, true)] {
            shadows.encoded = [lru, lfu];
            assert_eq!(shadows.lfu_leads(), leads, "LRU {lru}, LFU {lfu}");
        }
        // 1/256 of the LFU count: 25,600 needs a lead of more than 100.
        shadows.encoded = [25_700, 25_600];
        assert!(!shadows.lfu_leads());
        shadows.encoded = [25_701, 25_600];
        assert!(shadows.lfu_leads());
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
