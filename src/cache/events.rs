//! [`EventLog`]: what the cache stored, dropped and cleared since the last
//! drain, for a publisher that tells routers about it.
//!
//! Off unless a caller enables it (`PolicyCache::enable_events`): the cache
//! then holds `None` and every recording point is one check of it. On, the
//! cache records, in order:
//!
//! - at each allocation, the item's name and hash (its size and modality are
//!   read from the entry when the log is drained);
//! - at each `take_freed`, exactly the names it returns;
//! - at `reset`, that the cache was cleared, discarding what was pending.
//!
//! Evictions record nothing themselves: the workers hear of them through
//! `take_freed`, and so do subscribers. A log nobody drains stays bounded:
//! past `max_pending` pending names it drops them and is marked overflowed,
//! and its next drain reports a clear followed by every cached entry.

use hashbrown::HashSet;

use super::core::PolicyCache;
use super::keys::{Key, KeyArg};
use super::policies::EvictionPolicy;

/// Pending names a log keeps by default before it overflows.
pub const DEFAULT_MAX_PENDING: usize = 1 << 16;

/// What the cache recorded since the last drain (see the module doc).
#[derive(Debug, Clone)]
pub(crate) struct EventLog {
    max_pending: usize,
    pub(crate) cleared: bool,
    pub(crate) overflowed: bool,
    pub(crate) removed: Vec<Key>,
    /// Allocations: the item's name and hash.
    pub(crate) stored: Vec<(Key, u64)>,
}

/// One drain of the log: applied in order (clear, remove, store) to the
/// previous drain's view, it gives the cache's entries now.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct StepEvents {
    /// The cache was reset (or the log overflowed) since the last drain:
    /// forget every entry first.
    pub cleared: bool,
    /// The names `take_freed` returned since the last drain, in order.
    pub removed: Vec<Key>,
    /// The entries allocated since the last drain and cached now, in the
    /// order of their first allocation: name, embeddings, modality tag.
    pub stored: Vec<(Key, u64, u8)>,
}

impl StepEvents {
    pub fn is_empty(&self) -> bool {
        !self.cleared && self.removed.is_empty() && self.stored.is_empty()
    }
}

impl EventLog {
    pub(crate) fn new(max_pending: usize) -> Self {
        Self { max_pending, cleared: false, overflowed: false, removed: Vec::new(), stored: Vec::new() }
    }

    pub(crate) fn set_max_pending(&mut self, max_pending: usize) {
        self.max_pending = max_pending;
        self.check_bound();
    }

    #[inline]
    pub(crate) fn record_stored(&mut self, key: &Key, hash: u64) {
        if !self.overflowed {
            self.stored.push((key.clone(), hash));
            self.check_bound();
        }
    }

    pub(crate) fn record_removed(&mut self, keys: &[Key]) {
        if !self.overflowed && !keys.is_empty() {
            self.removed.extend_from_slice(keys);
            self.check_bound();
        }
    }

    /// The cache was reset: what is pending no longer matters.
    pub(crate) fn record_cleared(&mut self) {
        self.cleared = true;
        self.overflowed = false;
        self.removed = Vec::new();
        self.stored = Vec::new();
    }

    /// Empties the log: `(overflowed, cleared, removed, stored)`.
    pub(crate) fn drain(&mut self) -> (bool, bool, Vec<Key>, Vec<(Key, u64)>) {
        let overflowed = std::mem::take(&mut self.overflowed);
        let cleared = std::mem::take(&mut self.cleared);
        (overflowed, cleared, std::mem::take(&mut self.removed), std::mem::take(&mut self.stored))
    }

    fn check_bound(&mut self) {
        if self.removed.len() + self.stored.len() > self.max_pending {
            self.overflowed = true;
            self.removed = Vec::new();
            self.stored = Vec::new();
        }
    }
}

impl<P: EvictionPolicy> PolicyCache<P> {
    /// Start recording events (see the module doc), keeping at most
    /// `max_pending` names before the log overflows; enabled already, only
    /// the bound changes.
    pub fn enable_events(&mut self, max_pending: usize) {
        match &mut self.events {
            Some(log) => log.set_max_pending(max_pending),
            None => self.events = Some(Box::new(EventLog::new(max_pending))),
        }
    }

    pub fn events_enabled(&self) -> bool {
        self.events.is_some()
    }

    /// Drain the event log: what happened since the last drain, or `None`
    /// with events off. O(events), or O(entries) after an overflow.
    pub fn take_events(&mut self) -> Option<StepEvents> {
        let (overflowed, cleared, removed, pending) = self.events.as_deref_mut()?.drain();
        if overflowed {
            return Some(StepEvents { cleared: true, removed: Vec::new(), stored: self.cached_items() });
        }
        let entries = &self.entries;
        let mut seen: HashSet<u32> = HashSet::with_capacity(pending.len());
        let stored = pending
            .into_iter()
            .filter_map(|(key, hash)| {
                // Evicted since (and reported in `removed`), or stored twice: left out.
                let e = entries.find_hashed(&KeyArg::from(&key), hash)?;
                let entry = entries.get(e);
                seen.insert(e).then_some((key, entry.num_embeds, entry.modality))
            })
            .collect();
        Some(StepEvents { cleared, removed, stored })
    }

    /// Every cached entry: name, embeddings, modality tag, sorted by name.
    pub fn cached_items(&self) -> Vec<(Key, u64, u8)> {
        let mut items: Vec<(Key, u64, u8)> = self.entries.iter().map(|(_, e)| (e.key.clone(), e.num_embeds, e.modality)).collect();
        items.sort_unstable_by(|a, b| a.0.cmp(&b.0));
        items
    }
}
