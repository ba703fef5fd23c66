//! What the cache did: hits, misses, evictions and re-encodes, overall and
//! per modality, and the memory of evicted items that re-encodes are
//! recognised by.
//!
//! Counted at one stage, once per (request, input) acquisition: a hit is a
//! `check_and_update_cache` that adds a reference for an input the request did
//! not hold yet, a miss is a successful `allocate`. Re-checking a held input
//! counts nothing. A re-encode is a miss on an item this cache evicted earlier
//! (among its [`EVICTED_MEMORY`] most recent evictions). Re-encodes are
//! counted when the ghosts apply what they collected (see [`Ghosts`]); every
//! read and reset of the counters applies it first, so a report is exact.

use super::ghosts::{GhostMap, Window};

/// How many evicted items the cache remembers to recognise re-encodes: the
/// most recent evictions (an item leaves when allocated again).
pub const EVICTED_MEMORY: usize = 1 << 16;

/// One set of counters.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct Counters {
    pub hits: u64,
    pub misses: u64,
    pub hit_embeds: u64,
    pub miss_embeds: u64,
    pub evictions: u64,
    pub evicted_embeds: u64,
    pub reencodes: u64,
    pub reencode_embeds: u64,
}

impl Counters {
    /// The counters by name, in `encoder_cache.reference.STAT_COUNTERS` order.
    pub fn named(&self) -> [(&'static str, u64); 8] {
        [
            ("hits", self.hits),
            ("misses", self.misses),
            ("hit_embeds", self.hit_embeds),
            ("miss_embeds", self.miss_embeds),
            ("evictions", self.evictions),
            ("evicted_embeds", self.evicted_embeds),
            ("reencodes", self.reencodes),
            ("reencode_embeds", self.reencode_embeds),
        ]
    }

    pub fn is_zero(&self) -> bool {
        *self == Self::default()
    }

    fn add(&mut self, other: &Counters) {
        for (mine, theirs) in self.fields_mut().into_iter().zip(other.named()) {
            *mine += theirs.1;
        }
    }

    fn fields_mut(&mut self) -> [&mut u64; 8] {
        [
            &mut self.hits,
            &mut self.misses,
            &mut self.hit_embeds,
            &mut self.miss_embeds,
            &mut self.evictions,
            &mut self.evicted_embeds,
            &mut self.reencodes,
            &mut self.reencode_embeds,
        ]
    }
}

/// A report of the counters since the cache was built or reset.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct CacheStats {
    pub total: Counters,
    /// By modality tag (the `modality` given at allocation; 0 = unknown), up
    /// to the largest tag counted. A tag below it may have all-zero counters.
    pub by_modality: Vec<Counters>,
}

/// The live counters: one set per modality tag, in a fixed array, so counting
/// is a plain increment.
#[derive(Debug, Clone)]
pub(crate) struct Tally {
    by_modality: Box<[Counters; 256]>,
}

impl Default for Tally {
    fn default() -> Self {
        Self { by_modality: Box::new([Counters::default(); 256]) }
    }
}

impl Tally {
    #[inline]
    pub(crate) fn hit(&mut self, modality: u8, embeds: u64) {
        let c = &mut self.by_modality[usize::from(modality)];
        c.hits += 1;
        c.hit_embeds += embeds;
    }

    #[inline]
    pub(crate) fn miss(&mut self, modality: u8, embeds: u64) {
        let c = &mut self.by_modality[usize::from(modality)];
        c.misses += 1;
        c.miss_embeds += embeds;
    }

    #[inline]
    pub(crate) fn eviction(&mut self, modality: u8, embeds: u64) {
        let c = &mut self.by_modality[usize::from(modality)];
        c.evictions += 1;
        c.evicted_embeds += embeds;
    }

    #[inline]
    pub(crate) fn reencode(&mut self, modality: u8, embeds: u64) {
        let c = &mut self.by_modality[usize::from(modality)];
        c.reencodes += 1;
        c.reencode_embeds += embeds;
    }

    pub(crate) fn report(&self) -> CacheStats {
        // Each `_embeds` counter moves with its count, so four fields tell
        // whether a modality's counters are all zero.
        let counted = |c: &Counters| c.hits | c.misses | c.evictions | c.reencodes != 0;
        let last = self.by_modality.iter().rposition(counted).map_or(0, |i| i + 1);
        let by_modality = self.by_modality[..last].to_vec();
        let mut total = Counters::default();
        for counters in &by_modality {
            total.add(counters);
        }
        CacheStats { total, by_modality }
    }
}

/// How many evictions and allocations [`Ghosts`] collects before applying them.
const GHOST_BATCH: usize = 64;

/// An eviction or allocation the ghosts have yet to apply.
#[derive(Debug, Clone, Copy)]
enum GhostEvent {
    /// The item, and how often it was acquired (for a frequency window).
    Evicted(u64, u32),
    Allocated {
        hash: u64,
        modality: u8,
        embeds: u64,
    },
}

/// Ghosts: the 64-bit hashes of the most recently evicted items, oldest
/// forgotten first, so a miss can be recognised as a re-encode without
/// keeping the identifiers.
///
/// The memory is large (up to [`EVICTED_MEMORY`] hashes, a few MiB) and each
/// item lands at a random place in it, so an update is a cache miss. The
/// evictions and allocations are therefore collected, in order, and applied
/// [`GHOST_BATCH`] at a time (and whenever the counters are read or reset),
/// in one loop whose updates are independent, so that their misses overlap.
/// Applied in order, they count what updating at once would.
///
/// With a [`FrequencyWindow`](super::frequency_memory::FrequencyWindow)
/// (`lfu-ghost`, `duel`) the ghosts also keep
/// each item's count of acquisitions, and the window on their newest is the
/// policy's frequency memory: an allocation the window's filter cannot
/// answer applies what was collected and takes the item back at once.
#[derive(Debug, Clone)]
pub(crate) struct Ghosts<W = ()> {
    hashes: GhostMap<u32, EVICTED_MEMORY, W>,
    pending: Vec<GhostEvent>,
}

impl<W: Window> Default for Ghosts<W> {
    fn default() -> Self {
        Self { hashes: GhostMap::default(), pending: Vec::new() }
    }
}

impl<W: Window> Ghosts<W> {
    /// Remembers an evicted item acquired `count` times.
    #[inline]
    pub(crate) fn evicted(&mut self, hash: u64, count: u32, tally: &mut Tally) {
        self.hashes.window_mut().noted(hash);
        self.push(GhostEvent::Evicted(hash, count), tally);
    }

    /// Notes an allocation: a re-encode, counted in `tally`, if the item is remembered.
    #[inline]
    pub(crate) fn allocated(&mut self, hash: u64, modality: u8, embeds: u64, tally: &mut Tally) {
        self.push(GhostEvent::Allocated { hash, modality, embeds }, tally);
    }

    /// Notes an allocation as [`Self::allocated`] does, and returns the count
    /// the window remembers for the item (0 if none), which it forgets.
    /// Without a window (`()`, whose filter rules out every item) this is
    /// [`Self::allocated`] and 0.
    #[inline]
    pub(crate) fn allocated_counted(&mut self, hash: u64, modality: u8, embeds: u64, tally: &mut Tally) -> u32 {
        if !self.hashes.window().may_hold(hash) {
            self.allocated(hash, modality, embeds, tally);
            return 0;
        }
        self.apply(tally);
        let Some((count, in_window)) = self.hashes.take_windowed(hash) else { return 0 };
        tally.reencode(modality, embeds);
        if in_window {
            count
        } else {
            0
        }
    }

    /// The cache now holds `cache_size` embeddings; what was collected is
    /// applied first, so the window's new bound holds from the next eviction on.
    pub(crate) fn sized(&mut self, cache_size: u64, tally: &mut Tally) {
        self.apply(tally);
        self.hashes.window_mut().sized(cache_size);
    }

    #[inline]
    fn push(&mut self, event: GhostEvent, tally: &mut Tally) {
        self.pending.push(event);
        if self.pending.len() >= GHOST_BATCH {
            self.apply(tally);
        }
    }

    /// Applies what was collected, in order, counting re-encodes in `tally`.
    /// Kept out of line: it runs once a batch, and inlined it would crowd
    /// the allocation and eviction paths that call it.
    #[inline(never)]
    pub(crate) fn apply(&mut self, tally: &mut Tally) {
        let Self { hashes, pending } = self;
        for event in pending.drain(..) {
            match event {
                GhostEvent::Evicted(hash, count) => {
                    hashes.insert(hash, count);
                }
                GhostEvent::Allocated { hash, modality, embeds } => {
                    if hashes.take(hash).is_some() {
                        tally.reencode(modality, embeds);
                    }
                }
            }
        }
        hashes.refresh_window();
    }

    /// Whether `hash` is remembered now (what was collected applied first, counted in `tally`).
    #[cfg(test)]
    pub(crate) fn remembers(&mut self, hash: u64, tally: &mut Tally) -> bool {
        self.apply(tally);
        self.hashes.contains(hash)
    }
}
