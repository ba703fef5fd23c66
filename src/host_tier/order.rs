//! Which evictable entry of the host tier goes first.
//!
//! Evictable entries sit in *lanes* of places `(stamp, slot)`. An entry keeps
//! the stamp of its current place (0 while it is not evictable), so pinning it
//! only clears the stamp: the place goes stale and is skipped when it comes
//! up, and a lane drops its stale places once they outnumber the live ones.
//! Stamps are never reused, so a place cannot name a later entry of the same
//! slot.
//!
//! - [`HostPolicy::Fifo`]: one FIFO lane, in the order entries became
//!   evictable (marked ready, or unpinned for the last time): vLLM 0.33's
//!   `EmbeddingCache`.
//! - [`HostPolicy::Gdsf`]: one min-heap lane on (priority, stamp).
//! - [`HostPolicy::S3Fifo`]: a *small* FIFO lane (entries never loaded since
//!   they were saved) evicted before a *main* lane (entries loaded at least
//!   once), main a CLOCK.

use std::cmp::Ordering;
use std::collections::{BinaryHeap, VecDeque};

/// GDSF's encoder-cost model, as the device cache's: encoding `n` embeddings
/// costs `n + n² / HOST_GDSF_COST_SCALE`.
pub const HOST_GDSF_COST_SCALE: f64 = 8192.0;

/// S3-FIFO: the most loads a main-lane entry is credited with (each buys one
/// more pass before eviction).
pub const HOST_S3FIFO_MAX_CREDIT: u32 = 3;

/// Stale places below this many are left for the evictions to skip.
const MIN_COMPACT: usize = 64;

/// An eviction policy of the host tier, chosen when the cache is built.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq, Hash)]
pub enum HostPolicy {
    /// vLLM 0.33's rule: evict the entry that became evictable longest ago.
    #[default]
    Fifo,
    /// GreedyDual-Size-Frequency with aging: evict the lowest
    /// `clock + frequency * cost / blocks`, fixed when the entry becomes
    /// evictable; the clock rises to each victim's priority. O(log n).
    Gdsf,
    /// After S3-FIFO: entries never loaded are evicted before loaded ones,
    /// which age out CLOCK-style. O(1) amortised.
    S3Fifo,
}

impl HostPolicy {
    /// Every policy's name, the default first.
    pub const NAMES: &'static [&'static str] = &["fifo", "gdsf", "s3fifo"];
    pub const ALL: [HostPolicy; 3] = [HostPolicy::Fifo, HostPolicy::Gdsf, HostPolicy::S3Fifo];

    pub fn from_name(name: &str) -> Option<HostPolicy> {
        Self::ALL.into_iter().find(|p| p.name() == name)
    }

    pub fn name(self) -> &'static str {
        match self {
            Self::Fifo => "fifo",
            Self::Gdsf => "gdsf",
            Self::S3Fifo => "s3fifo",
        }
    }

    /// GDSF's value of keeping an entry of `rows` embeddings in `blocks`
    /// blocks: its encoding cost per block (an entry of no blocks counts as one).
    pub fn gdsf_cost_per_block(rows: u64, blocks: usize) -> f64 {
        // Integer to float conversions round as Python's int / float does for these sizes.
        #[allow(clippy::cast_precision_loss)]
        let (n, size) = (rows as f64, blocks.max(1) as f64);
        (n + n * n / HOST_GDSF_COST_SCALE) / size
    }
}

impl std::fmt::Display for HostPolicy {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(self.name())
    }
}

/// A place in a lane: the entry in `slot` when it holds `stamp`.
#[derive(Debug, Clone, Copy)]
pub struct Place {
    pub stamp: u64,
    pub slot: u32,
    /// GDSF's priority (0 for the FIFO lanes).
    pub priority: f64,
}

impl PartialEq for Place {
    fn eq(&self, other: &Self) -> bool {
        self.cmp(other) == Ordering::Equal
    }
}

impl Eq for Place {}

impl PartialOrd for Place {
    fn partial_cmp(&self, other: &Self) -> Option<Ordering> {
        Some(self.cmp(other))
    }
}

impl Ord for Place {
    /// Reversed, so that `BinaryHeap` (a max-heap) pops the lowest priority,
    /// then the oldest stamp, first.
    fn cmp(&self, other: &Self) -> Ordering {
        other.priority.total_cmp(&self.priority).then(other.stamp.cmp(&self.stamp))
    }
}

#[derive(Debug, Clone)]
enum Places {
    Fifo(VecDeque<Place>),
    Heap(BinaryHeap<Place>),
}

/// One ordered lane of evictable entries.
#[derive(Debug, Clone)]
struct Lane {
    places: Places,
    live: usize,
    stale: usize,
}

impl Lane {
    fn new(heap: bool) -> Self {
        let places = if heap { Places::Heap(BinaryHeap::new()) } else { Places::Fifo(VecDeque::new()) };
        Self { places, live: 0, stale: 0 }
    }

    fn pop(&mut self) -> Option<Place> {
        match &mut self.places {
            Places::Fifo(places) => places.pop_front(),
            Places::Heap(places) => places.pop(),
        }
    }

    fn push(&mut self, place: Place) {
        match &mut self.places {
            Places::Fifo(places) => places.push_back(place),
            Places::Heap(places) => places.push(place),
        }
        self.live += 1;
    }

    /// Every place, stale ones included, in the order they would come up.
    fn ordered(&self) -> Vec<Place> {
        match &self.places {
            Places::Fifo(places) => places.iter().copied().collect(),
            Places::Heap(places) => {
                let mut sorted: Vec<Place> = places.iter().copied().collect();
                sorted.sort_by(|a, b| b.cmp(a));
                sorted
            }
        }
    }

    fn retain(&mut self, live: impl Fn(&Place) -> bool) {
        match &mut self.places {
            Places::Fifo(places) => places.retain(|p| live(p)),
            Places::Heap(places) => places.retain(|p| live(p)),
        }
        self.stale = 0;
    }
}

/// The lanes of one policy, and GDSF's clock.
#[derive(Debug, Clone)]
pub struct EvictionOrder {
    policy: HostPolicy,
    lanes: Vec<Lane>,
    clock: f64,
}

impl EvictionOrder {
    pub fn new(policy: HostPolicy) -> Self {
        let lanes = match policy {
            HostPolicy::Fifo => vec![Lane::new(false)],
            HostPolicy::Gdsf => vec![Lane::new(true)],
            HostPolicy::S3Fifo => vec![Lane::new(false), Lane::new(false)],
        };
        Self { policy, lanes, clock: 0.0 }
    }

    pub fn policy(&self) -> HostPolicy {
        self.policy
    }

    /// GDSF's clock: the highest victim priority so far (0 for the other policies).
    pub fn clock(&self) -> f64 {
        self.clock
    }

    /// The lane an entry saved and then loaded `frequency - 1` times goes to.
    pub fn lane_for(&self, frequency: u32) -> u8 {
        u8::from(self.policy == HostPolicy::S3Fifo && frequency > 1)
    }

    /// The priority an entry becoming evictable now gets (GDSF only).
    pub fn priority(&self, frequency: u32, cost_per_block: f64) -> f64 {
        if self.policy == HostPolicy::Gdsf {
            self.clock + f64::from(frequency) * cost_per_block
        } else {
            0.0
        }
    }

    pub fn push(&mut self, lane: u8, place: Place) {
        self.lanes[usize::from(lane)].push(place);
    }

    /// The next place of the lane victims come from (small before main), live
    /// or stale, with its lane; None when no entry is evictable.
    pub fn pop(&mut self) -> Option<(u8, Place)> {
        let lane = self.lanes.iter().position(|lane| lane.live > 0)?;
        let place = self.lanes[lane].pop()?;
        // At most two lanes.
        #[allow(clippy::cast_possible_truncation)]
        Some((lane as u8, place))
    }

    /// The place [`Self::pop`] returned was stale.
    pub fn skipped(&mut self, lane: u8) {
        self.lanes[usize::from(lane)].stale -= 1;
    }

    /// The place [`Self::pop`] returned was live, and its entry left the lane.
    pub fn removed(&mut self, lane: u8, priority: f64) {
        self.lanes[usize::from(lane)].live -= 1;
        if self.policy == HostPolicy::Gdsf && priority > self.clock {
            self.clock = priority;
        }
    }

    /// Whether live victims of `lane` with credit left go round again (S3-FIFO's main lane).
    pub fn rotates(&self, lane: u8) -> bool {
        self.policy == HostPolicy::S3Fifo && lane == 1
    }

    /// An entry of `lane` stopped being evictable: its place goes stale.
    pub fn taken_back(&mut self, lane: u8) {
        let lane = &mut self.lanes[usize::from(lane)];
        lane.live -= 1;
        lane.stale += 1;
    }

    /// Lanes whose stale places outnumber their live ones (and some).
    pub fn lanes_to_compact(&self) -> impl Iterator<Item = u8> + '_ {
        self.lanes.iter().enumerate().filter(|(_, lane)| lane.stale > MIN_COMPACT && lane.stale > lane.live).map(|(lane, _)| {
            // At most two lanes.
            #[allow(clippy::cast_possible_truncation)]
            let lane = lane as u8;
            lane
        })
    }

    /// Keeps only `lane`'s places that `live` accepts.
    pub fn compact(&mut self, lane: u8, live: impl Fn(&Place) -> bool) {
        self.lanes[usize::from(lane)].retain(live);
    }

    /// Every place of every lane, stale ones included, lane by lane in the
    /// order victims are looked for.
    pub fn places(&self) -> Vec<Place> {
        self.lanes.iter().flat_map(Lane::ordered).collect()
    }

    /// Live and stale place counts of each lane.
    pub fn counts(&self) -> Vec<(usize, usize)> {
        self.lanes.iter().map(|lane| (lane.live, lane.stale)).collect()
    }
}
