//! [`Shadows`]: two caches that hold no data, only item hashes and sizes,
//! fed every acquisition the real cache sees, each evicting by its own rule:
//! vLLM's (least recently used) and `lfu-ghost`'s (least frequently used,
//! weighted by cost per size). Each counts the embeddings it would have had
//! to encode; the `duel` policy evicts in the order of whichever counted
//! fewer lately.
//!
//! A shadow cache sees every item acquired once per (request, input), as the
//! real cache counts hits and misses, but holds no references: an item is
//! never pinned there. The counts are halved every [`SHADOW_HALF_LIFE`]
//! acquisitions, so the recent traffic decides.
//!
//! The LFU shadow ranks an item by the count `lfu-ghost`'s bookkeeping in
//! the real cache gives it at its latest acquisition: acquisitions counted
//! while the item is cached, and resumed from the real cache's frequency
//! memory after an eviction. It keeps no counts or memory of its own.
//!
//! Both shadows keep the items they hold in one slab of nodes, found by hash
//! through one map, so an acquisition looks its item up once and everything
//! after that goes by slot. The LRU shadow is a list linked through the
//! nodes (O(1) to move or unlink); the LFU one keeps its order as two rising
//! runs and a heap of places naming slots, whose stale places (the item
//! moved, left, or its slot was reused: every place carries a sequence
//! number no other place has) are skipped. The Python twin
//! (`encoder_cache.reference.shadows`) keeps the same two caches apart, by
//! identifier, and decides the same.

use std::cmp::Reverse;
use std::collections::{BinaryHeap, VecDeque};

use super::entries::NIL;
use super::ghosts::{stale_outnumber_live, HashKeyed};
use super::lanes::{rank_of, run_to_join};
use super::policies::Policy;

/// Acquisitions after which both shadows' counts of encoded embeddings are halved.
pub const SHADOW_HALF_LIFE: u32 = 4096;

/// The LFU shadow leads only once it encoded less by more than this fraction
/// (1 / `SHADOW_NEAR_TIE`) of its own count; closer counts are a tie, which
/// goes to vLLM's order. A lead that small is noise, and following it lets
/// the real cache drift from what the LFU shadow measured.
pub const SHADOW_NEAR_TIE: u64 = 256;

/// What the shadows know of one item. Its node lives while either shadow
/// holds the item.
#[derive(Debug, Clone, Copy)]
struct Node {
    hash: u64,
    /// In the LRU shadow: its neighbours there, older and newer ([`NIL`] at the ends).
    lru_links: [u32; 2],
    /// Held by the LRU shadow.
    in_lru: bool,
    /// Held by the LFU shadow.
    held: bool,
    /// Its size as the LRU shadow last saw it.
    lru_embeds: u64,
    /// Its size as the LFU shadow admitted it.
    num_embeds: u64,
    /// While held by the LFU shadow: the sequence number of its live place.
    place: u64,
}

impl Node {
    fn new(hash: u64) -> Self {
        Self { hash, lru_links: [NIL, NIL], in_lru: false, held: false, lru_embeds: 0, num_embeds: 0, place: 0 }
    }
}

/// A place in the LFU shadow's order: (rank, sequence, slot), lowest first.
/// Sequences are unique, so the slot never decides the order.
type Place = (i64, u64, u32);

/// The LFU shadow's places, lowest first: two runs of places, each pushed in
/// rising order, and a heap of the rest. Items admitted once, of one size,
/// come in rising order (one rank, rising sequence numbers), as do the places
/// of items hit about equally often; with two runs, both of these interleaved
/// stay out of the heap. Places go stale when their item moves or leaves;
/// they are skipped.
#[derive(Debug, Clone, Default)]
struct Places {
    runs: [VecDeque<Place>; 2],
    heap: BinaryHeap<Reverse<Place>>,
}

impl Places {
    /// Moves the live place `(_, placed, slot)` to `place`, which is later
    /// in the order: in a run's last slot if it is there (the run stays
    /// rising), else as a new place, the old one left stale.
    fn replace(&mut self, placed: u64, slot: u32, place: Place) {
        for run in &mut self.runs {
            if let Some(last) = run.back_mut() {
                if (last.1, last.2) == (placed, slot) {
                    *last = place;
                    return;
                }
            }
        }
        self.push(place);
    }

    /// Appends `place` to the run whose last place is the highest at or
    /// below it, else to an empty run, else to the heap.
    fn push(&mut self, place: Place) {
        match run_to_join([self.runs[0].back().copied(), self.runs[1].back().copied()], place) {
            Some(run) => self.runs[run].push_back(place),
            None => self.heap.push(Reverse(place)),
        }
    }

    fn pop(&mut self) -> Option<Place> {
        let mut lowest = self.heap.peek().map(|&Reverse(place)| (place, None));
        for (run, places) in self.runs.iter().enumerate() {
            if let Some(&first) = places.front() {
                if lowest.is_none_or(|(low, _)| first < low) {
                    lowest = Some((first, Some(run)));
                }
            }
        }
        match lowest? {
            (_, Some(run)) => self.runs[run].pop_front(),
            (_, None) => self.heap.pop().map(|Reverse(place)| place),
        }
    }

    fn len(&self) -> usize {
        self.runs[0].len() + self.runs[1].len() + self.heap.len()
    }

    fn retain(&mut self, mut live: impl FnMut(&Place) -> bool) {
        for run in &mut self.runs {
            run.retain(&mut live);
        }
        self.heap.retain(|Reverse(place)| live(place));
    }
}

fn rank(count: u32, num_embeds: u64) -> i64 {
    rank_of(f64::from(count) * Policy::gdsf_value(num_embeds))
}

/// The two shadow caches and what each would have encoded lately.
#[derive(Debug, Clone)]
pub(crate) struct Shadows {
    /// Item hash -> its node's slot.
    slots: HashKeyed<u32>,
    nodes: Vec<Node>,
    /// Slots of `nodes` free for reuse.
    free: Vec<u32>,
    capacity: u64,
    /// Numbers every placing in the LFU shadow.
    sequence: u64,
    /// The LRU shadow's least and most recently placed items.
    lru_ends: [u32; 2],
    lru_len: usize,
    lru_used: u64,
    /// The LFU shadow's order; a place is live while its item is held there with that sequence.
    places: Places,
    held: usize,
    lfu_used: u64,
    /// Embeddings each would have encoded (LRU, LFU), halved every [`SHADOW_HALF_LIFE`] acquisitions.
    encoded: [u64; 2],
    acquisitions: u32,
}

impl Default for Shadows {
    fn default() -> Self {
        Self {
            slots: HashKeyed::default(),
            nodes: Vec::new(),
            free: Vec::new(),
            capacity: 0,
            sequence: 0,
            lru_ends: [NIL, NIL],
            lru_len: 0,
            lru_used: 0,
            places: Places::default(),
            held: 0,
            lfu_used: 0,
            encoded: [0, 0],
            acquisitions: 0,
        }
    }
}

impl Shadows {
    /// Both shadows now hold up to `capacity` embeddings (from their next miss on).
    pub(crate) fn resize(&mut self, capacity: u64) {
        self.capacity = capacity;
    }

    /// The item `hash` of `num_embeds` was acquired (a hit or an allocation),
    /// and `lfu-ghost` now counts it `count` times.
    pub(crate) fn acquire(&mut self, hash: u64, num_embeds: u64, count: u32) {
        let slot = self.slot_of(hash);
        self.acquire_lru(slot, num_embeds);
        self.acquire_lfu(slot, num_embeds, count);
        self.acquisitions += 1;
        if self.acquisitions == SHADOW_HALF_LIFE {
            self.acquisitions = 0;
            self.encoded = self.encoded.map(|encoded| encoded / 2);
        }
    }

    /// The slot of `hash`'s node, made if it has none.
    #[inline]
    fn slot_of(&mut self, hash: u64) -> u32 {
        let (nodes, free) = (&mut self.nodes, &mut self.free);
        *self.slots.entry(hash).or_insert_with(|| {
            if let Some(slot) = free.pop() {
                nodes[slot as usize] = Node::new(hash);
                slot
            } else {
                nodes.push(Node::new(hash));
                u32::try_from(nodes.len() - 1).unwrap_or(NIL)
            }
        })
    }

    /// The LRU shadow's part: the item becomes the most recently placed.
    #[inline]
    fn acquire_lru(&mut self, slot: u32, num_embeds: u64) {
        let node = &mut self.nodes[slot as usize];
        let recency_hit = node.in_lru;
        node.lru_embeds = num_embeds;
        if recency_hit {
            if self.lru_ends[1] != slot {
                self.lru_unlink(slot);
                self.lru_push(slot);
            }
            return;
        }
        self.lru_push(slot);
        self.lru_len += 1;
        self.lru_used += num_embeds;
        self.encoded[0] += num_embeds;
        while self.lru_used > self.capacity && self.lru_len > 1 {
            self.evict_lru();
        }
    }

    /// The LFU shadow's part: the item is placed by `count` (moved on a hit;
    /// on a miss admitted, the lowest evicted to make room).
    #[inline]
    fn acquire_lfu(&mut self, slot: u32, num_embeds: u64, count: u32) {
        self.sequence += 1;
        let now = self.sequence;
        let node = &mut self.nodes[slot as usize];
        let frequency_hit = node.held;
        let lfu_placed = node.place;
        if !frequency_hit {
            node.held = true;
            node.num_embeds = num_embeds;
        }
        node.place = now;
        let placed = (rank(count, node.num_embeds), now, slot);
        if frequency_hit {
            self.places.replace(lfu_placed, slot, placed);
            self.compact_places_if_stale();
            return;
        }
        self.held += 1;
        self.lfu_used += num_embeds;
        self.encoded[1] += num_embeds;
        while self.lfu_used > self.capacity {
            let Some((_, place, victim)) = self.places.pop() else { break };
            self.evict_lfu(victim, place);
        }
        self.places.push(placed);
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

    /// Appends `slot` as the most recently placed.
    #[inline]
    fn lru_push(&mut self, slot: u32) {
        let newest = self.lru_ends[1];
        let node = &mut self.nodes[slot as usize];
        node.in_lru = true;
        node.lru_links = [newest, NIL];
        if newest == NIL {
            self.lru_ends[0] = slot;
        } else {
            self.nodes[newest as usize].lru_links[1] = slot;
        }
        self.lru_ends[1] = slot;
    }

    /// Takes `slot` out of the LRU list.
    #[inline]
    fn lru_unlink(&mut self, slot: u32) {
        let node = &mut self.nodes[slot as usize];
        let [older, newer] = std::mem::replace(&mut node.lru_links, [NIL, NIL]);
        node.in_lru = false;
        if older == NIL {
            self.lru_ends[0] = newer;
        } else {
            self.nodes[older as usize].lru_links[1] = newer;
        }
        if newer == NIL {
            self.lru_ends[1] = older;
        } else {
            self.nodes[newer as usize].lru_links[0] = older;
        }
    }

    /// Evicts the LRU shadow's least recently placed item.
    fn evict_lru(&mut self) {
        let slot = self.lru_ends[0];
        if slot == NIL {
            return;
        }
        self.lru_unlink(slot);
        self.lru_len -= 1;
        let node = self.nodes[slot as usize];
        self.lru_used -= node.lru_embeds;
        if !node.held {
            self.release(slot);
        }
    }

    /// Evicts `victim` from the LFU shadow if `place` is its live place.
    fn evict_lfu(&mut self, victim: u32, place: u64) {
        let node = &mut self.nodes[victim as usize];
        if !node.held || node.place != place {
            return;
        }
        node.held = false;
        let in_lru = node.in_lru;
        self.lfu_used -= node.num_embeds;
        self.held -= 1;
        if !in_lru {
            self.release(victim);
        }
    }

    /// Frees the node at `slot`, which neither shadow holds.
    fn release(&mut self, slot: u32) {
        let hash = self.nodes[slot as usize].hash;
        self.slots.remove(&hash);
        // A freed node is not held, so the places naming its slot are stale,
        // and a later item there gets new sequence numbers.
        self.free.push(slot);
    }

    /// Keeps only the LFU shadow's live places once stale ones outnumber them.
    fn compact_places_if_stale(&mut self) {
        if stale_outnumber_live(self.places.len(), self.held) {
            let nodes = &self.nodes;
            self.places.retain(|&(_, place, slot)| {
                let node = &nodes[slot as usize];
                node.held && node.place == place
            });
        }
    }
}

#[cfg(test)]
mod tests {
    use std::collections::HashMap;

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
            let slot = u32::try_from(seq % 7).unwrap();
            places.push((rank, seq, slot));
            pushed.push((rank, seq, slot));
        }
        pushed.sort_unstable();
        let popped: Vec<_> = std::iter::from_fn(|| places.pop()).collect();
        assert_eq!(popped, pushed);
    }

    /// Feeds `shadows` as `duel` does, with each item's count of acquisitions
    /// (none forgotten: the test's items stay within a frequency memory).
    fn acquire(shadows: &mut Shadows, counts: &mut HashMap<u64, u32>, hash: u64, num_embeds: u64) {
        let count = counts.entry(hash).or_default();
        *count += 1;
        shadows.acquire(hash, num_embeds, *count);
    }

    #[test]
    fn a_scan_favours_lfu_and_a_moving_working_set_favours_lru() {
        // One hot item acquired between one-off items: LRU keeps losing it, LFU keeps it.
        let (mut shadows, mut counts) = (Shadows::default(), HashMap::new());
        shadows.resize(20);
        for k in 0..200 {
            acquire(&mut shadows, &mut counts, 1, 10);
            acquire(&mut shadows, &mut counts, 1000 + k, 10);
            acquire(&mut shadows, &mut counts, 5000 + k, 10);
        }
        assert!(shadows.lfu_leads(), "{:?}", shadows.encoded());

        // Items used a few times in a row, then never again: LFU holds on to the old counts.
        let (mut shadows, mut counts) = (Shadows::default(), HashMap::new());
        shadows.resize(30);
        for k in 0..200u64 {
            for _ in 0..3 {
                acquire(&mut shadows, &mut counts, k, 10);
                acquire(&mut shadows, &mut counts, k + 1, 10);
            }
        }
        assert!(!shadows.lfu_leads(), "{:?}", shadows.encoded());
    }

    #[test]
    fn the_lfu_shadow_ranks_by_the_count_it_is_given() {
        // Room for two: the third item pushes out the lowest count in the
        // LFU shadow (item 2) and the oldest in the LRU one (item 1).
        let mut shadows = Shadows::default();
        shadows.resize(20);
        shadows.acquire(1, 10, 5);
        shadows.acquire(2, 10, 1);
        shadows.acquire(3, 10, 1);
        shadows.acquire(1, 10, 6);
        assert_eq!(shadows.encoded(), [40, 30], "item 1 is a hit only in the LFU shadow");
        assert!(shadows.lfu_leads());
        shadows.acquire(2, 10, 2);
        assert_eq!(shadows.encoded(), [50, 40], "item 2: a miss in both");
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
            shadows.acquire(k, 10, 1);
        }
        assert_eq!(shadows.encoded(), [u64::from(super::SHADOW_HALF_LIFE) * 10 / 2; 2]);
    }
}
