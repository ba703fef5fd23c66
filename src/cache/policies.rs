//! Eviction policies: which unreferenced entry goes first when an allocation
//! needs room. Each policy is a type implementing [`EvictionPolicy`], chosen
//! once when a cache is built ([`super::PolicyCache`]), so a cache runs only
//! its own policy's code; [`Policy`] names them at run time.
//!
//! Every policy orders the evictable entries of each lookahead *tier* (tier 0:
//! no waiting request needs them; tier 1: some waiting request does, evicted
//! only when tier 0 is empty) in lanes threaded through the entries (see
//! `lanes`):
//! - [`Vllm`]: one FIFO lane per tier, oldest release first (vLLM 0.33). It
//!   keeps nothing per entry and does nothing on a hit.
//! - [`Gdsf`]: one min-heap lane per tier on (priority, release order).
//! - [`S3Fifo`]: two FIFO lanes per tier, *small* (entries acquired once)
//!   evicted before *main* (entries hit since allocation), main a CLOCK.
//! - [`GhostLfu`]: [`Gdsf`]'s heap without the aging clock (least
//!   frequently used, weighted by cost per size), whose frequency survives
//!   eviction: an item allocated again starts from the count it had when
//!   evicted (its frequency memory, a [`FrequencyWindow`] on the cache's
//!   ghosts, which hands the count to [`EvictionPolicy::admit`]).
//! - [`Arc`](super::arc::Arc) (in `arc`): a recent and a frequent FIFO lane
//!   per tier, and an adaptive target choosing between them.
//! - [`Duel`](super::duel::Duel) (in `duel`): [`GhostLfu`]'s lanes and a
//!   release-order list, evicting from one or the other as shadow caches
//!   (`shadows`) say which would have encoded less lately.
//!
//! `encoder_cache.policies` in the Python twin makes the same decisions with
//! the same arithmetic; docs/policies.md describes each policy.

use std::fmt::Debug;

use super::entries::Entry;
use super::frequency_memory::FrequencyWindow;
use super::ghosts::Window;
use super::lanes::{HeapKey, HeapLanes, ListLanes};
use super::table::Table;

/// An eviction policy's name, for choosing one at run time.
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
    /// Least frequently used, weighted by cost per size (`frequency * cost /
    /// size`, no aging), whose frequency survives eviction: an item allocated
    /// again resumes the count it had when it was evicted (a bounded memory of
    /// evicted items), so a popular item evicted in a burst comes back ranked
    /// above one-off items. O(log n).
    GhostLfu,
    /// Adaptive Replacement Cache: entries acquired once and entries hit
    /// since allocation (or allocated again soon after an eviction) in two
    /// release-order lanes, the victim taken from one or the other by an
    /// adaptive target that ghost lists of evicted items move. O(1).
    Arc,
    /// `lfu-ghost`'s order or vLLM's, whichever would have encoded fewer
    /// embeddings lately, as two shadow caches fed the same acquisitions
    /// measure it. O(log n).
    Duel,
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
    pub const NAMES: &'static [&'static str] = &["vllm", "gdsf", "s3fifo", "lfu-ghost", "arc", "duel"];
    pub const ALL: [Policy; 6] = [Policy::Vllm, Policy::Gdsf, Policy::S3Fifo, Policy::GhostLfu, Policy::Arc, Policy::Duel];
    /// What the name [`AUTO`](Self::AUTO) selects: the recommended policy.
    pub const RECOMMENDED: Policy = Policy::Duel;
    /// The name of the recommended policy, whichever it is.
    pub const AUTO: &'static str = "auto";

    /// The policy named `name`; `"auto"` is [`Self::RECOMMENDED`].
    pub fn from_name(name: &str) -> Option<Policy> {
        if name == Self::AUTO {
            return Some(Self::RECOMMENDED);
        }
        Self::ALL.into_iter().find(|p| p.name() == name)
    }

    pub fn name(self) -> &'static str {
        match self {
            Self::Vllm => "vllm",
            Self::Gdsf => "gdsf",
            Self::S3Fifo => "s3fifo",
            Self::GhostLfu => "lfu-ghost",
            Self::Arc => "arc",
            Self::Duel => "duel",
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

/// The entries table of a cache under policy `P`.
pub(crate) type Entries<P> = Table<Entry<<P as EvictionPolicy>::Meta>>;

/// An eviction order over the unreferenced entries, and what it keeps per entry.
pub trait EvictionPolicy: Debug + Clone + Default + Send + Sync + 'static {
    const POLICY: Policy;
    /// What the policy keeps per entry.
    type Meta: Debug + Clone + Copy + Default + Send + Sync;
    /// What the cache's ghosts keep apart for the policy: `()`, or the
    /// frequency memory ([`FrequencyWindow`]) whose counts [`Self::admit`] gets.
    type Window: Window;

    /// A counted hit on the item `hash` of `num_embeds`.
    #[inline]
    fn on_hit(&mut self, meta: &mut Self::Meta, hash: u64, num_embeds: u64) {
        let _ = (meta, hash, num_embeds);
    }

    /// Places entry `index`, just unreferenced, in `tier` (with `restored`,
    /// the rank a snapshot kept, where the policy has one).
    #[allow(private_interfaces)]
    fn release(&mut self, entries: &mut Entries<Self>, index: u32, tier: usize, restored: Option<f64>);

    /// Takes unreferenced entry `index` out of the order (it is referenced again).
    #[allow(private_interfaces)]
    fn take_back(&mut self, entries: &mut Entries<Self>, index: u32);

    /// Takes the next victim out of the order; None if nothing is evictable.
    #[allow(private_interfaces)]
    fn evict(&mut self, entries: &mut Entries<Self>) -> Option<u32>;

    /// The unreferenced entries, next victim first.
    #[allow(private_interfaces)]
    fn order(&self, entries: &Entries<Self>) -> Vec<u32>;

    /// The tier of an unreferenced entry's lane.
    fn tier_of_lane(lane: u8) -> usize;

    /// GDSF's clock (0 under other policies).
    fn clock(&self) -> f64 {
        0.0
    }

    fn set_clock(&mut self, clock: f64) {
        let _ = clock;
    }

    /// The cache now holds `cache_size` embeddings (built or resized).
    #[inline]
    fn sized(&mut self, cache_size: u64) {
        let _ = cache_size;
    }

    /// Acquisitions since allocation, where the policy counts them (else 1).
    fn frequency(meta: &Self::Meta) -> u32 {
        let _ = meta;
        1
    }

    /// The policy's rank of an entry (0 while referenced, or without one).
    fn rank(meta: &Self::Meta) -> f64 {
        let _ = meta;
        0.0
    }

    /// Per-entry data for a restored entry of `num_embeds` acquired `frequency` times.
    fn meta_with(&mut self, frequency: u32, num_embeds: u64) -> Self::Meta;

    /// Per-entry data for the item `hash` of `num_embeds`, just allocated (a
    /// miss); `remembered` is the count its frequency memory kept since its
    /// eviction (0 without one, or if it kept none).
    #[inline]
    fn admit(&mut self, hash: u64, num_embeds: u64, remembered: u32) -> Self::Meta {
        let _ = (hash, num_embeds, remembered);
        Self::Meta::default()
    }

    /// The item `hash` of `num_embeds` was evicted with `meta`.
    #[inline]
    fn evicted(&mut self, hash: u64, meta: &Self::Meta, num_embeds: u64) {
        let _ = (hash, meta, num_embeds);
    }
}

/// vLLM 0.33's order: a FIFO lane per tier.
#[derive(Debug, Clone, Default)]
pub struct Vllm {
    lanes: ListLanes<2>,
}

impl EvictionPolicy for Vllm {
    const POLICY: Policy = Policy::Vllm;
    type Meta = ();
    type Window = ();

    #[inline]
    #[allow(private_interfaces)]
    fn release(&mut self, entries: &mut Entries<Self>, index: u32, tier: usize, _restored: Option<f64>) {
        self.lanes.push_back(entries, tier, index);
    }

    #[inline]
    #[allow(private_interfaces)]
    fn take_back(&mut self, entries: &mut Entries<Self>, index: u32) {
        self.lanes.unlink(entries, index);
    }

    #[inline]
    #[allow(private_interfaces)]
    fn evict(&mut self, entries: &mut Entries<Self>) -> Option<u32> {
        let (_, index) = self.lanes.first()?;
        self.lanes.unlink(entries, index);
        Some(index)
    }

    #[allow(private_interfaces)]
    fn order(&self, entries: &Entries<Self>) -> Vec<u32> {
        self.lanes.walk(entries)
    }

    fn tier_of_lane(lane: u8) -> usize {
        usize::from(lane)
    }

    fn meta_with(&mut self, _frequency: u32, _num_embeds: u64) -> Self::Meta {}
}

/// What GDSF keeps per entry.
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct GdsfMeta {
    frequency: u32,
    /// While unreferenced, the priority fixed at release; else 0.
    priority: f64,
    /// While unreferenced, the release's sequence number (ties go oldest first).
    released: u64,
}

impl Default for GdsfMeta {
    fn default() -> Self {
        Self { frequency: 1, priority: 0.0, released: 0 }
    }
}

impl GdsfMeta {
    fn with_frequency(frequency: u32) -> Self {
        Self { frequency, ..Self::default() }
    }

    /// Taken back (referenced again): it has no priority while referenced.
    pub(super) fn taken_back(&mut self) {
        self.priority = 0.0;
    }
}

impl HeapKey for GdsfMeta {
    fn heap_key(&self) -> (f64, u64) {
        (self.priority, self.released)
    }
}

/// GreedyDual-Size-Frequency: a min-heap lane per tier, and the clock.
#[derive(Debug, Clone, Default)]
pub struct Gdsf {
    lanes: HeapLanes<2>,
    clock: f64,
    releases: u64,
}

impl Gdsf {
    /// Fixes a released entry's key: its priority, and its place in release order.
    #[inline]
    fn stamp(&mut self, meta: &mut GdsfMeta, priority: f64) {
        self.releases += 1;
        meta.priority = priority;
        meta.released = self.releases;
    }
}

impl EvictionPolicy for Gdsf {
    const POLICY: Policy = Policy::Gdsf;
    type Meta = GdsfMeta;
    type Window = ();

    fn on_hit(&mut self, meta: &mut GdsfMeta, _hash: u64, _num_embeds: u64) {
        meta.frequency = meta.frequency.saturating_add(1);
    }

    #[allow(private_interfaces)]
    fn release(&mut self, entries: &mut Entries<Self>, index: u32, tier: usize, restored: Option<f64>) {
        let entry = entries.get_mut(index);
        let priority = restored.unwrap_or_else(|| self.clock + f64::from(entry.meta.frequency) * Policy::gdsf_value(entry.num_embeds));
        self.stamp(&mut entry.meta, priority);
        self.lanes.push(entries, tier, index);
    }

    #[allow(private_interfaces)]
    fn take_back(&mut self, entries: &mut Entries<Self>, index: u32) {
        self.lanes.remove(entries, index);
        entries.get_mut(index).meta.taken_back();
    }

    #[allow(private_interfaces)]
    fn evict(&mut self, entries: &mut Entries<Self>) -> Option<u32> {
        let index = self.lanes.first(entries)?;
        self.clock = self.clock.max(entries.get(index).meta.priority);
        self.lanes.remove(entries, index);
        Some(index)
    }

    #[allow(private_interfaces)]
    fn order(&self, entries: &Entries<Self>) -> Vec<u32> {
        self.lanes.walk(entries)
    }

    fn tier_of_lane(lane: u8) -> usize {
        usize::from(lane)
    }

    fn clock(&self) -> f64 {
        self.clock
    }

    fn set_clock(&mut self, clock: f64) {
        self.clock = clock;
    }

    fn frequency(meta: &GdsfMeta) -> u32 {
        meta.frequency
    }

    fn rank(meta: &GdsfMeta) -> f64 {
        meta.priority
    }

    fn meta_with(&mut self, frequency: u32, _num_embeds: u64) -> GdsfMeta {
        GdsfMeta { frequency, ..GdsfMeta::default() }
    }
}

/// What S3-FIFO keeps per entry.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct S3FifoMeta {
    frequency: u32,
    /// While unreferenced in a main lane, the hits left to spend; else 0.
    credit: u32,
}

impl Default for S3FifoMeta {
    fn default() -> Self {
        Self { frequency: 1, credit: 0 }
    }
}

/// S3-FIFO: per tier a *small* lane, then a *main* lane run as a CLOCK.
#[derive(Debug, Clone, Default)]
pub struct S3Fifo {
    /// Lane `2 * tier + main`.
    lanes: ListLanes<4>,
}

impl EvictionPolicy for S3Fifo {
    const POLICY: Policy = Policy::S3Fifo;
    type Meta = S3FifoMeta;
    type Window = ();

    fn on_hit(&mut self, meta: &mut S3FifoMeta, _hash: u64, _num_embeds: u64) {
        meta.frequency = meta.frequency.saturating_add(1);
    }

    #[allow(private_interfaces)]
    fn release(&mut self, entries: &mut Entries<Self>, index: u32, tier: usize, restored: Option<f64>) {
        let entry = entries.get_mut(index);
        let main = entry.meta.frequency > 1;
        entry.meta.credit = if main {
            // A restored credit passed the invariant checks: a whole number within the bound.
            #[allow(clippy::cast_possible_truncation, clippy::cast_sign_loss)]
            restored.map_or_else(|| (entry.meta.frequency - 1).min(S3FIFO_MAX_CREDIT), |rank| rank as u32)
        } else {
            0
        };
        self.lanes.push_back(entries, 2 * tier + usize::from(main), index);
    }

    #[allow(private_interfaces)]
    fn take_back(&mut self, entries: &mut Entries<Self>, index: u32) {
        self.lanes.unlink(entries, index);
        entries.get_mut(index).meta.credit = 0;
    }

    #[allow(private_interfaces)]
    fn evict(&mut self, entries: &mut Entries<Self>) -> Option<u32> {
        loop {
            let (lane, index) = self.lanes.first()?;
            self.lanes.unlink(entries, index);
            let meta = &mut entries.get_mut(index).meta;
            if lane % 2 == 1 && meta.credit > 0 {
                // A main lane: spend one hit credit, go round again.
                meta.credit -= 1;
                self.lanes.push_back(entries, lane, index);
                continue;
            }
            return Some(index);
        }
    }

    #[allow(private_interfaces)]
    fn order(&self, entries: &Entries<Self>) -> Vec<u32> {
        self.lanes.walk(entries)
    }

    fn tier_of_lane(lane: u8) -> usize {
        usize::from(lane / 2)
    }

    fn frequency(meta: &S3FifoMeta) -> u32 {
        meta.frequency
    }

    fn rank(meta: &S3FifoMeta) -> f64 {
        f64::from(meta.credit)
    }

    fn meta_with(&mut self, frequency: u32, _num_embeds: u64) -> S3FifoMeta {
        S3FifoMeta { frequency, credit: 0 }
    }
}

/// LFU whose frequency survives eviction: [`Gdsf`]'s heap and tie-breaks
/// with priority `frequency * cost / size` and no clock. An item allocated
/// again resumes the count its frequency memory (the cache's ghosts, through
/// a [`FrequencyWindow`]) kept.
#[derive(Debug, Clone, Default)]
pub struct GhostLfu {
    /// Its clock is never read: every release passes its priority.
    gdsf: Gdsf,
}

/// `lfu-ghost`'s order in parts, for [`Duel`](super::duel::Duel), which
/// keeps its lanes filled only while it evicts in that order: a release's key
/// is always fixed ([`Self::stamp`]), the lanes may be left empty.
impl GhostLfu {
    /// Fixes released entry `index`'s key, as a release does, without placing it.
    pub(super) fn stamp(&mut self, entries: &mut Table<Entry<GdsfMeta>>, index: u32, restored: Option<f64>) {
        let entry = entries.get_mut(index);
        let priority = restored.unwrap_or_else(|| f64::from(entry.meta.frequency) * Policy::gdsf_value(entry.num_embeds));
        self.gdsf.stamp(&mut entry.meta, priority);
    }

    /// Places stamped entry `index` in `tier`'s lane.
    pub(super) fn place(&mut self, entries: &mut Table<Entry<GdsfMeta>>, tier: usize, index: u32) {
        self.gdsf.lanes.push(entries, tier, index);
    }

    /// Takes placed entry `index` out of its lane.
    pub(super) fn unplace(&mut self, entries: &mut Table<Entry<GdsfMeta>>, index: u32) {
        self.gdsf.lanes.remove(entries, index);
    }

    /// Empties the lanes.
    pub(super) fn clear_places(&mut self) {
        self.gdsf.lanes.clear();
    }
}

impl EvictionPolicy for GhostLfu {
    const POLICY: Policy = Policy::GhostLfu;
    type Meta = GdsfMeta;
    type Window = FrequencyWindow;

    fn on_hit(&mut self, meta: &mut GdsfMeta, hash: u64, num_embeds: u64) {
        self.gdsf.on_hit(meta, hash, num_embeds);
    }

    #[allow(private_interfaces)]
    fn release(&mut self, entries: &mut Entries<Self>, index: u32, tier: usize, restored: Option<f64>) {
        self.stamp(entries, index, restored);
        self.place(entries, tier, index);
    }

    #[allow(private_interfaces)]
    fn take_back(&mut self, entries: &mut Entries<Self>, index: u32) {
        self.gdsf.take_back(entries, index);
    }

    #[allow(private_interfaces)]
    fn evict(&mut self, entries: &mut Entries<Self>) -> Option<u32> {
        self.gdsf.evict(entries)
    }

    #[allow(private_interfaces)]
    fn order(&self, entries: &Entries<Self>) -> Vec<u32> {
        self.gdsf.order(entries)
    }

    fn tier_of_lane(lane: u8) -> usize {
        Gdsf::tier_of_lane(lane)
    }

    fn frequency(meta: &GdsfMeta) -> u32 {
        meta.frequency
    }

    fn rank(meta: &GdsfMeta) -> f64 {
        meta.priority
    }

    fn meta_with(&mut self, frequency: u32, num_embeds: u64) -> GdsfMeta {
        self.gdsf.meta_with(frequency, num_embeds)
    }

    fn admit(&mut self, _hash: u64, _num_embeds: u64, remembered: u32) -> GdsfMeta {
        GdsfMeta::with_frequency(remembered.saturating_add(1))
    }
}
