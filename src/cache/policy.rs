//! Eviction policies: which unreferenced entry goes first when an allocation
//! needs room.
//!
//! Every policy orders the evictable entries of each lookahead *tier* (tier 0:
//! no waiting request needs them; tier 1: some waiting request does, evicted
//! only when tier 0 is empty) in *lanes* of places `(stamp, item)`. An entry
//! keeps the stamp of its current place (0 while it is referenced), so taking
//! it back only clears its stamp: the place goes stale and is skipped when it
//! comes up, and stale places are dropped once they outnumber the live ones.
//! Releasing, taking back and evicting cost no hashing of their own.
//!
//! - [`Policy::Vllm`]: one FIFO lane per tier, oldest release first (vLLM 0.33).
//! - [`Policy::Gdsf`]: one min-heap lane per tier on (priority, stamp).
//! - [`Policy::S3Fifo`]: two FIFO lanes per tier, *small* (entries acquired
//!   once) evicted before *main* (entries hit since allocation), main a CLOCK.
//!
//! `encoder_cache.policies` in the Python twin makes the same decisions with
//! the same arithmetic; docs/policies.md describes each policy.

use std::cmp::Ordering;
use std::collections::{BinaryHeap, VecDeque};

use super::Key;

/// An eviction policy, chosen when the cache is built.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq, Hash)]
pub enum Policy {
    /// vLLM 0.33's rule: evict the unreferenced entry released longest ago.
    #[default]
    Vllm,
    /// GreedyDual-Size-Frequency with aging: evict the lowest
    /// `clock + frequency * cost / size`, fixed at release, where encoding `n`
    /// embeddings costs `n + n² / GDSF_COST_SCALE`; the clock rises to each
    /// victim's priority. O(log n).
    Gdsf,
    /// Scan-resistant, after S3-FIFO: entries acquired once are evicted before
    /// entries hit since their allocation, which age out CLOCK-style. O(1) amortised.
    S3Fifo,
}

/// GDSF's encoder-cost model: encoding `n` embeddings costs `n + n² / C`
/// (linear work plus attention quadratic in the item's patches), so its cost
/// per embedding is `1 + n / C`.
pub const GDSF_COST_SCALE: f64 = 8192.0;

/// S3-FIFO: the most hits an entry of the main lane is credited with (each
/// buys one more pass before eviction).
pub const S3FIFO_MAX_CREDIT: u32 = 3;

impl Policy {
    /// Every policy's name, the default first.
    pub const NAMES: &'static [&'static str] = &["vllm", "gdsf", "s3fifo"];
    pub const ALL: [Policy; 3] = [Policy::Vllm, Policy::Gdsf, Policy::S3Fifo];

    pub fn from_name(name: &str) -> Option<Policy> {
        Self::ALL.into_iter().find(|p| p.name() == name)
    }

    pub fn name(self) -> &'static str {
        match self {
            Self::Vllm => "vllm",
            Self::Gdsf => "gdsf",
            Self::S3Fifo => "s3fifo",
        }
    }

    /// Lanes per tier.
    pub(super) fn lanes_per_tier(self) -> usize {
        match self {
            Self::Vllm | Self::Gdsf => 1,
            Self::S3Fifo => 2,
        }
    }

    /// GDSF's cost per embedding of an item of `num_embeds`.
    pub fn gdsf_value(num_embeds: u64) -> f64 {
        // u64 -> f64 rounds as Python's int / float does for the sizes a cache holds.
        #[allow(clippy::cast_precision_loss)]
        let n = num_embeds as f64;
        1.0 + n / GDSF_COST_SCALE
    }
}

impl std::fmt::Display for Policy {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(self.name())
    }
}

/// A place in a heap lane: the lowest priority first, then the oldest stamp.
#[derive(Debug, Clone)]
struct HeapPlace {
    priority: f64,
    stamp: u64,
    key: Key,
}

impl PartialEq for HeapPlace {
    fn eq(&self, other: &Self) -> bool {
        self.cmp(other) == Ordering::Equal
    }
}

impl Eq for HeapPlace {}

impl PartialOrd for HeapPlace {
    fn partial_cmp(&self, other: &Self) -> Option<Ordering> {
        Some(self.cmp(other))
    }
}

impl Ord for HeapPlace {
    /// Reversed, so that `BinaryHeap` (a max-heap) pops the lowest first.
    fn cmp(&self, other: &Self) -> Ordering {
        other.priority.total_cmp(&self.priority).then(other.stamp.cmp(&self.stamp))
    }
}

#[derive(Debug, Clone)]
enum Places {
    Fifo(VecDeque<(u64, Key)>),
    Heap(BinaryHeap<HeapPlace>),
}

/// Stale places below this many are left for the evictions to skip.
const MIN_COMPACT: usize = 64;

/// One ordered lane of evictable entries.
#[derive(Debug, Clone)]
pub(super) struct Lane {
    places: Places,
    live: usize,
    stale: usize,
}

impl Lane {
    fn new(heap: bool) -> Self {
        let places = if heap { Places::Heap(BinaryHeap::new()) } else { Places::Fifo(VecDeque::new()) };
        Self { places, live: 0, stale: 0 }
    }

    pub(super) fn live(&self) -> usize {
        self.live
    }

    pub(super) fn push(&mut self, stamp: u64, key: Key, priority: f64) {
        match &mut self.places {
            Places::Fifo(places) => places.push_back((stamp, key)),
            Places::Heap(places) => places.push(HeapPlace { priority, stamp, key }),
        }
        self.live += 1;
    }

    /// The next place, live or stale; [`Self::skipped`] if it was stale,
    /// [`Self::removed`] if its entry leaves the lane.
    pub(super) fn pop(&mut self) -> Option<(u64, Key)> {
        match &mut self.places {
            Places::Fifo(places) => places.pop_front(),
            Places::Heap(places) => places.pop().map(|p| (p.stamp, p.key)),
        }
    }

    pub(super) fn skipped(&mut self) {
        self.stale -= 1;
    }

    pub(super) fn removed(&mut self) {
        self.live -= 1;
    }

    /// An entry of this lane was taken out of it: its place goes stale.
    pub(super) fn taken_back(&mut self) {
        self.live -= 1;
        self.stale += 1;
    }

    pub(super) fn needs_compacting(&self) -> bool {
        self.stale > MIN_COMPACT && self.stale > self.live
    }

    /// Keeps only the places `live` says are current.
    pub(super) fn compact(&mut self, live: impl Fn(u64, &Key) -> bool) {
        match &mut self.places {
            Places::Fifo(places) => places.retain(|(stamp, key)| live(*stamp, key)),
            Places::Heap(places) => places.retain(|p| live(p.stamp, &p.key)),
        }
        self.stale = 0;
    }

    /// Every place (stale ones included) in the lane's order: FIFO order, or
    /// (priority, stamp) order for a heap.
    pub(super) fn places(&self) -> Vec<(u64, &Key)> {
        match &self.places {
            Places::Fifo(places) => places.iter().map(|(stamp, key)| (*stamp, key)).collect(),
            Places::Heap(places) => {
                let mut sorted: Vec<&HeapPlace> = places.iter().collect();
                sorted.sort_by(|a, b| b.cmp(a));
                sorted.into_iter().map(|p| (p.stamp, &p.key)).collect()
            }
        }
    }

    /// How many places the lane holds, stale ones included.
    #[cfg(test)]
    pub(super) fn len(&self) -> usize {
        match &self.places {
            Places::Fifo(places) => places.len(),
            Places::Heap(places) => places.len(),
        }
    }
}

/// The lanes of both tiers for one policy: lane `tier * lanes_per_tier + k`.
#[derive(Debug, Clone)]
pub(super) struct Order {
    pub(super) policy: Policy,
    pub(super) lanes: Vec<Lane>,
}

impl Order {
    pub(super) fn new(policy: Policy) -> Self {
        let lanes = (0..2 * policy.lanes_per_tier()).map(|_| Lane::new(policy == Policy::Gdsf)).collect();
        Self { policy, lanes }
    }

    pub(super) fn clear(&mut self) {
        *self = Self::new(self.policy);
    }

    /// The lane an entry released into `tier` with `frequency` goes to.
    pub(super) fn lane_for(&self, tier: usize, frequency: u32) -> usize {
        match self.policy {
            Policy::Vllm | Policy::Gdsf => tier,
            Policy::S3Fifo => 2 * tier + usize::from(frequency > 1),
        }
    }

    pub(super) fn tier_of_lane(&self, lane: usize) -> usize {
        lane / self.policy.lanes_per_tier()
    }

    /// The lane to take the next victim from, if any entry is evictable:
    /// tier 0 before tier 1; under S3-FIFO, small before main.
    pub(super) fn victim_lane(&self) -> Option<usize> {
        (0..self.lanes.len()).find(|&lane| self.lanes[lane].live() > 0)
    }

    /// Whether victims of `lane` with credit left go round again (S3-FIFO's main lanes).
    pub(super) fn rotates(&self, lane: usize) -> bool {
        self.policy == Policy::S3Fifo && lane % 2 == 1
    }
}
