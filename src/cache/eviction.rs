//! The eviction order: unreferenced entries, oldest release first.
//!
//! A queue of places `(stamp, item)`, where the entry itself keeps the stamp of
//! its current release (0 while it is referenced). Taking an entry back only
//! clears its stamp: its place goes stale and is skipped when it comes up. So
//! releasing, taking back and evicting cost no hashing and no allocation of
//! their own, where a linked hash map pays both on every release and every
//! take-back. Stale places are dropped once they outnumber the live ones.

use std::collections::VecDeque;

use super::{Entry, Key};

/// Stale places below this many are left for the evictions to skip.
const MIN_COMPACT: usize = 64;

#[derive(Debug, Clone, Default)]
pub(super) struct EvictionQueue {
    places: VecDeque<(u64, Key)>,
    last_stamp: u64,
    stale: usize,
}

impl EvictionQueue {
    /// Queues `entry` (just released) last, stamping it.
    pub(super) fn push(&mut self, key: Key, entry: &mut Entry) {
        self.last_stamp += 1;
        entry.released = self.last_stamp;
        self.places.push_back((self.last_stamp, key));
    }

    /// Takes `entry` (about to be referenced again) out of the order.
    pub(super) fn take_back(&mut self, entry: &mut Entry) {
        entry.released = 0;
        self.stale += 1;
    }

    /// The oldest place, live or stale; [`Self::skipped`] if it was stale.
    pub(super) fn pop(&mut self) -> Option<(u64, Key)> {
        self.places.pop_front()
    }

    pub(super) fn skipped(&mut self) {
        self.stale -= 1;
    }

    /// Whether the stale places are worth dropping now.
    pub(super) fn needs_compacting(&self) -> bool {
        self.stale > MIN_COMPACT && 2 * self.stale > self.places.len()
    }

    /// Keeps only the places `live` says are current.
    pub(super) fn compact(&mut self, live: impl Fn(u64, &Key) -> bool) {
        self.places.retain(|(stamp, key)| live(*stamp, key));
        self.stale = 0;
    }

    /// Every place, oldest first, stale ones included.
    pub(super) fn places(&self) -> impl Iterator<Item = &(u64, Key)> {
        self.places.iter()
    }

    pub(super) fn clear(&mut self) {
        *self = Self::default();
    }
}
