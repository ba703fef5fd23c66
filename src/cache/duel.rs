//! [`Duel`]: evicts in `lfu-ghost`'s order or in vLLM's, whichever of the
//! two would have encoded fewer embeddings lately on the traffic this cache
//! sees, as two shadow caches of the same size measure it (`shadows`).
//!
//! The evictable entries are always in a release-order list per lookahead
//! tier, linked by entry index here, and each release fixes the entry's
//! `lfu-ghost` key (priority and release number; its frequency memory is
//! kept too). `lfu-ghost`'s ordered lanes are filled only while they are
//! used: they are built from the list when the LFU order next evicts, and
//! emptied once they have been kept up to date through more operations
//! than they hold entries with no LFU eviction between. Keys are unique, so
//! lanes rebuilt pop in the same order as lanes kept all along, and keeping
//! them costs at most about twice what keeping them always would, while
//! vLLM's order leads it costs nothing. A snapshot lists the evictable entries
//! in release order with their `lfu-ghost` priorities, so a restore rebuilds
//! both orders; the shadows and the frequency memory are not in it.

use super::entries::{NIL, NO_LANE};
use super::frequency_memory::FrequencyWindow;
use super::policies::{Entries, EvictionPolicy, GdsfMeta, GhostLfu, Policy};
use super::shadows::Shadows;

/// A release-order list per tier over entry indices, its links kept here.
#[derive(Debug, Clone)]
struct ReleaseOrder {
    head: [u32; 2],
    tail: [u32; 2],
    /// By entry index: (previous, next, tier) while listed.
    links: Vec<(u32, u32, u8)>,
    len: usize,
}

impl Default for ReleaseOrder {
    fn default() -> Self {
        Self { head: [NIL; 2], tail: [NIL; 2], links: Vec::new(), len: 0 }
    }
}

impl ReleaseOrder {
    fn push_back(&mut self, tier: usize, index: u32) {
        let at = index as usize;
        if self.links.len() <= at {
            self.links.resize(at + 1, (NIL, NIL, 0));
        }
        let tail = self.tail[tier];
        // Tiers are 0 and 1.
        #[allow(clippy::cast_possible_truncation)]
        let lane = tier as u8;
        self.links[at] = (tail, NIL, lane);
        if tail == NIL {
            self.head[tier] = index;
        } else {
            self.links[tail as usize].1 = index;
        }
        self.tail[tier] = index;
        self.len += 1;
    }

    fn unlink(&mut self, index: u32) {
        let (previous, next, tier) = self.links[index as usize];
        let tier = usize::from(tier);
        if previous == NIL {
            self.head[tier] = next;
        } else {
            self.links[previous as usize].1 = next;
        }
        if next == NIL {
            self.tail[tier] = previous;
        } else {
            self.links[next as usize].0 = previous;
        }
        self.len -= 1;
    }

    /// The oldest release of the first non-empty tier.
    fn first(&self) -> Option<u32> {
        self.head.into_iter().find(|&head| head != NIL)
    }

    fn walk(&self) -> Vec<u32> {
        let mut out = Vec::new();
        for &head in &self.head {
            let mut at = head;
            while at != NIL {
                out.push(at);
                at = self.links[at as usize].1;
            }
        }
        out
    }
}

/// Lane operations past the entries the lanes hold, with no LFU eviction,
/// after which `lfu-ghost`'s lanes are emptied.
const IDLE_LANE_OPS: usize = 64;

/// `lfu-ghost`'s order and vLLM's, and the shadows that choose between them.
#[derive(Debug, Clone, Default)]
pub struct Duel {
    lfu: GhostLfu,
    released: ReleaseOrder,
    /// Boxed: the two shadow caches would otherwise make this the largest
    /// [`EncoderCache`](super::EncoderCache) variant by far.
    shadows: Box<Shadows>,
    /// Whether `lfu`'s lanes hold every evictable entry; else they hold none.
    lfu_placed: bool,
    /// Lane operations since the LFU order last evicted, while `lfu_placed`.
    idle_lane_ops: usize,
}

impl Duel {
    /// Counts a lane operation, emptying the lanes once they are idle.
    fn lane_op(&mut self) {
        self.idle_lane_ops += 1;
        if self.idle_lane_ops > self.released.len + IDLE_LANE_OPS {
            self.lfu.clear_places();
            self.lfu_placed = false;
        }
    }

    /// Fills `lfu-ghost`'s lanes with every evictable entry, by the keys their releases fixed.
    fn place_all(&mut self, entries: &mut Entries<Self>) {
        for tier in 0..2 {
            let mut at = self.released.head[tier];
            while at != NIL {
                self.lfu.place(entries, tier, at);
                at = self.released.links[at as usize].1;
            }
        }
        self.lfu_placed = true;
        self.idle_lane_ops = 0;
    }
}

impl EvictionPolicy for Duel {
    const POLICY: Policy = Policy::Duel;
    type Meta = GdsfMeta;
    type Window = FrequencyWindow;

    #[inline]
    fn on_hit(&mut self, meta: &mut GdsfMeta, hash: u64, num_embeds: u64) {
        self.lfu.on_hit(meta, hash, num_embeds);
        self.shadows.acquire(hash, num_embeds, GhostLfu::frequency(meta));
    }

    #[allow(private_interfaces)]
    fn release(&mut self, entries: &mut Entries<Self>, index: u32, tier: usize, restored: Option<f64>) {
        self.lfu.stamp(entries, index, restored);
        self.released.push_back(tier, index);
        if self.lfu_placed {
            self.lfu.place(entries, tier, index);
            self.lane_op();
        } else {
            // Tiers are 0 and 1.
            #[allow(clippy::cast_possible_truncation)]
            let lane = tier as u8;
            entries.get_mut(index).lane = lane;
        }
    }

    #[allow(private_interfaces)]
    fn take_back(&mut self, entries: &mut Entries<Self>, index: u32) {
        if self.lfu_placed {
            self.lfu.unplace(entries, index);
            self.lane_op();
        } else {
            entries.get_mut(index).lane = NO_LANE;
        }
        entries.get_mut(index).meta.taken_back();
        self.released.unlink(index);
    }

    #[allow(private_interfaces)]
    fn evict(&mut self, entries: &mut Entries<Self>) -> Option<u32> {
        if !self.shadows.lfu_leads() {
            let index = self.released.first()?;
            self.take_back(entries, index);
            return Some(index);
        }
        if !self.lfu_placed {
            self.place_all(entries);
        }
        self.idle_lane_ops = 0;
        let index = self.lfu.evict(entries)?;
        self.released.unlink(index);
        Some(index)
    }

    #[allow(private_interfaces)]
    fn order(&self, _entries: &Entries<Self>) -> Vec<u32> {
        self.released.walk()
    }

    fn tier_of_lane(lane: u8) -> usize {
        usize::from(lane)
    }

    fn sized(&mut self, cache_size: u64) {
        self.shadows.resize(cache_size);
    }

    fn frequency(meta: &GdsfMeta) -> u32 {
        GhostLfu::frequency(meta)
    }

    fn rank(meta: &GdsfMeta) -> f64 {
        GhostLfu::rank(meta)
    }

    fn meta_with(&mut self, frequency: u32, num_embeds: u64) -> GdsfMeta {
        self.lfu.meta_with(frequency, num_embeds)
    }

    #[inline]
    fn admit(&mut self, hash: u64, num_embeds: u64, remembered: u32) -> GdsfMeta {
        let meta = self.lfu.admit(hash, num_embeds, remembered);
        self.shadows.acquire(hash, num_embeds, GhostLfu::frequency(&meta));
        meta
    }
}
