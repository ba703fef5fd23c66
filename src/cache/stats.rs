//! What the cache did: hits, misses, evictions and re-encodes, overall and
//! per modality.
//!
//! Counted at one stage, once per (request, input) acquisition: a hit is a
//! `check_and_update_cache` that adds a reference for an input the request did
//! not hold yet, a miss is a successful `allocate`. Re-checking a held input
//! counts nothing. A re-encode is a miss on an item this cache evicted earlier
//! (among its [`EVICTED_MEMORY`] most recent evictions).

use std::collections::VecDeque;

use hashbrown::HashMap;

use super::{Key, KeyArg};

/// How many evicted identifiers the cache remembers to recognise re-encodes:
/// the most recent evictions (an identifier leaves when allocated again).
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
}

/// The cache's counters since it was built or [`super::EncoderCache::reset_stats`].
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct CacheStats {
    pub total: Counters,
    /// By modality tag (the `modality` given at allocation; 0 = unknown). A
    /// tag below the largest one seen may have all-zero counters.
    pub by_modality: Vec<Counters>,
}

#[derive(Clone, Copy)]
pub(super) enum Event {
    Hit,
    Miss,
    Eviction,
    Reencode,
}

impl CacheStats {
    pub(super) fn count(&mut self, event: Event, modality: u8, embeds: u64) {
        let index = usize::from(modality);
        if self.by_modality.len() <= index {
            self.by_modality.resize(index + 1, Counters::default());
        }
        for counters in [&mut self.total, &mut self.by_modality[index]] {
            let (count, sum) = match event {
                Event::Hit => (&mut counters.hits, &mut counters.hit_embeds),
                Event::Miss => (&mut counters.misses, &mut counters.miss_embeds),
                Event::Eviction => (&mut counters.evictions, &mut counters.evicted_embeds),
                Event::Reencode => (&mut counters.reencodes, &mut counters.reencode_embeds),
            };
            *count += 1;
            *sum += embeds;
        }
    }
}

/// The most recently evicted identifiers, oldest forgotten first.
#[derive(Debug, Clone, Default)]
pub(super) struct Evicted {
    stamps: HashMap<Key, u64>,
    order: VecDeque<(u64, Key)>,
    last_stamp: u64,
}

impl Evicted {
    pub(super) fn insert(&mut self, key: Key) {
        self.last_stamp += 1;
        self.stamps.insert(key.clone(), self.last_stamp);
        self.order.push_back((self.last_stamp, key));
        while self.stamps.len() > EVICTED_MEMORY {
            let Some((stamp, key)) = self.order.pop_front() else { break };
            if self.stamps.get(&key) == Some(&stamp) {
                self.stamps.remove(&key);
            }
        }
        if self.order.len() > 2 * EVICTED_MEMORY.max(self.stamps.len()) {
            let stamps = &self.stamps;
            self.order.retain(|(stamp, key)| stamps.get(key) == Some(stamp));
        }
    }

    /// Forgets `key`; true if it was remembered.
    pub(super) fn remove(&mut self, key: KeyArg<'_>) -> bool {
        if self.stamps.is_empty() {
            return false;
        }
        self.stamps.remove(&key).is_some()
    }

    pub(super) fn clear(&mut self) {
        *self = Self::default();
    }
}
