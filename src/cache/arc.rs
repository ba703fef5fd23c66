//! [`Arc`]: the Adaptive Replacement Cache (N. Megiddo and D. Modha, FAST
//! 2003), over embeddings instead of pages.
//!
//! Cached entries are *recent* (acquired once since allocation) or *frequent*
//! (hit since allocation, or allocated again soon after an eviction). Each
//! class keeps its unreferenced entries in release order, one list lane per
//! lookahead tier. A target `p` for the embeddings of recent entries decides
//! which class gives the victim: the recent lane while recent entries hold
//! more than `p`, else the frequent lane. Evicted items are remembered by hash
//! and size in two ghost lists, one per class. An allocation found in the
//! recent ghosts says the recent class was too small, and raises `p`. One found
//! in the frequent ghosts lowers it. Either way the item comes back frequent.
//!
//! All arithmetic is on whole embeddings, so the Python twin
//! (`encoder_cache.reference.policies.ArcPolicy`) decides the same.

use super::ghosts::{GhostMap, Inserted};
use super::lanes::ListLanes;
use super::policies::{Entries, EvictionPolicy, Policy};

/// Each ghost list remembers evicted items up to half the cache size in
/// embeddings, and at most this many items.
pub const ARC_GHOST_ITEMS: usize = 65_536;

/// What ARC keeps per entry: acquisitions since allocation, plus one if the
/// item came back from a ghost list. Frequent means more than one.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct ArcMeta {
    frequency: u32,
}

impl Default for ArcMeta {
    fn default() -> Self {
        Self { frequency: 1 }
    }
}

impl ArcMeta {
    fn frequent(self) -> bool {
        self.frequency > 1
    }
}

/// Evicted items of one class, oldest first, bounded in embeddings and items.
#[derive(Debug, Clone, Default)]
struct GhostList {
    /// Sizes in embeddings by hash.
    sizes: GhostMap<u64, ARC_GHOST_ITEMS>,
    embeds: u64,
}

impl GhostList {
    fn insert(&mut self, hash: u64, num_embeds: u64, bound: u64) {
        if let Inserted::Replaced(forgotten) | Inserted::Displaced(forgotten) = self.sizes.insert(hash, num_embeds) {
            self.embeds -= forgotten;
        }
        self.embeds += num_embeds;
        while self.embeds > bound {
            let Some((_, size)) = self.sizes.pop_oldest() else { break };
            self.embeds -= size;
        }
    }

    /// Forgets `hash`; its size if it was remembered.
    fn take(&mut self, hash: u64) -> Option<u64> {
        let size = self.sizes.take(hash)?;
        self.embeds -= size;
        Some(size)
    }
}

/// ARC: a recent and a frequent lane per tier (lane `2 * tier + frequent`),
/// the target `p`, and the two ghost lists.
#[derive(Debug, Clone, Default)]
pub struct Arc {
    lanes: ListLanes<4>,
    cache_size: u64,
    /// The target for the embeddings of recent entries.
    target: u64,
    /// Embeddings of the cached recent entries, referenced or not.
    recent_embeds: u64,
    recent_ghosts: GhostList,
    frequent_ghosts: GhostList,
}

impl Arc {
    /// The target `p`: how many embeddings recent entries may hold before
    /// they give the victim.
    pub fn target(&self) -> u64 {
        self.target
    }

    fn ghost_bound(&self) -> u64 {
        self.cache_size / 2
    }
}

impl EvictionPolicy for Arc {
    const POLICY: Policy = Policy::Arc;
    type Meta = ArcMeta;
    type Window = ();

    #[inline]
    fn on_hit(&mut self, meta: &mut ArcMeta, _hash: u64, num_embeds: u64) {
        if !meta.frequent() {
            self.recent_embeds -= num_embeds;
        }
        meta.frequency = meta.frequency.saturating_add(1);
    }

    #[allow(private_interfaces)]
    fn release(&mut self, entries: &mut Entries<Self>, index: u32, tier: usize, _restored: Option<f64>) {
        let frequent = entries.get(index).meta.frequent();
        self.lanes.push_back(entries, 2 * tier + usize::from(frequent), index);
    }

    #[allow(private_interfaces)]
    fn take_back(&mut self, entries: &mut Entries<Self>, index: u32) {
        self.lanes.unlink(entries, index);
    }

    #[allow(private_interfaces)]
    fn evict(&mut self, entries: &mut Entries<Self>) -> Option<u32> {
        let (lane, index) = self.lanes.first()?;
        let recent_lane = lane - lane % 2;
        let victim = match self.lanes.head(recent_lane + 1) {
            Some(frequent) if lane == recent_lane && self.recent_embeds <= self.target => frequent,
            _ => index,
        };
        self.lanes.unlink(entries, victim);
        Some(victim)
    }

    #[allow(private_interfaces)]
    fn order(&self, entries: &Entries<Self>) -> Vec<u32> {
        self.lanes.walk(entries)
    }

    fn tier_of_lane(lane: u8) -> usize {
        usize::from(lane / 2)
    }

    /// The target `p`, which a snapshot keeps as the clock.
    fn clock(&self) -> f64 {
        // Targets are whole embeddings up to the cache size, exact in an f64.
        #[allow(clippy::cast_precision_loss)]
        let target = self.target as f64;
        target
    }

    fn set_clock(&mut self, clock: f64) {
        // A restored target passed the invariant checks: whole, within the cache size.
        #[allow(clippy::cast_possible_truncation, clippy::cast_sign_loss)]
        let target = clock as u64;
        self.target = target;
    }

    fn sized(&mut self, cache_size: u64) {
        self.target = if self.cache_size == 0 {
            cache_size / 2
        } else {
            let scaled = u128::from(self.target) * u128::from(cache_size) / u128::from(self.cache_size);
            u64::try_from(scaled).unwrap_or(cache_size)
        };
        self.cache_size = cache_size;
    }

    fn frequency(meta: &ArcMeta) -> u32 {
        meta.frequency
    }

    fn meta_with(&mut self, frequency: u32, num_embeds: u64) -> ArcMeta {
        let meta = ArcMeta { frequency };
        if !meta.frequent() {
            self.recent_embeds += num_embeds;
        }
        meta
    }

    fn admit(&mut self, hash: u64, num_embeds: u64, _remembered: u32) -> ArcMeta {
        let from_recent = self.recent_ghosts.take(hash);
        let from_frequent = if from_recent.is_none() { self.frequent_ghosts.take(hash) } else { None };
        if from_recent.is_some() {
            let ratio = (self.frequent_ghosts.embeds / self.recent_ghosts.embeds.max(1)).max(1);
            self.target = self.target.saturating_add(num_embeds.saturating_mul(ratio)).min(self.cache_size);
        } else if from_frequent.is_some() {
            let ratio = (self.recent_ghosts.embeds / self.frequent_ghosts.embeds.max(1)).max(1);
            self.target = self.target.saturating_sub(num_embeds.saturating_mul(ratio));
        } else {
            self.recent_embeds += num_embeds;
            return ArcMeta::default();
        }
        ArcMeta { frequency: 2 }
    }

    fn evicted(&mut self, hash: u64, meta: &ArcMeta, num_embeds: u64) {
        let bound = self.ghost_bound();
        if meta.frequent() {
            self.frequent_ghosts.insert(hash, num_embeds, bound);
        } else {
            self.recent_embeds -= num_embeds;
            self.recent_ghosts.insert(hash, num_embeds, bound);
        }
    }
}
