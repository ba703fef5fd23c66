//! [`HostBlockCache`]: a fixed pool of blocks, and the entries (by content
//! hash) that own them.
//!
//! Block allocation is vLLM 0.33's `EmbeddingCache`'s: the free blocks are a
//! stack (initially `0..num_blocks`, so block 0 is handed out last), an
//! allocation pops what it needs from the top and keeps it in ascending
//! order, and an evicted or discarded entry's blocks are pushed back in its
//! ascending order. An allocation fails, evicting nothing, when the free and
//! evictable blocks together are too few; otherwise it evicts in the
//! policy's order until the free blocks suffice.
//!
//! Each entry carries a payload of the caller's (the Python bindings keep the
//! entry object they hand out there), made once when the entry is allocated.

use hashbrown::HashMap;

use super::order::{EvictionOrder, HostPolicy, Place, HOST_S3FIFO_MAX_CREDIT};

/// The pin count of an entry whose bytes are not written yet.
const NOT_READY: i64 = -1;

/// Why an operation was refused. A refused operation changes nothing.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum HostCacheError {
    /// No entry has this key.
    UnknownKey { key: String },
    /// `alloc` for a key that has an entry already.
    Duplicate { key: String },
    /// `alloc` of more blocks than the whole pool.
    TooLarge { key: String, requested: usize, capacity: usize },
    /// `mark_ready` of an entry that is ready (or pinned) already.
    AlreadyReady { key: String },
    /// `pin` of an entry that is not ready.
    NotReady { key: String },
    /// `unpin` of an entry that is not pinned.
    NotPinned { key: String },
    /// `discard` of an entry that is ready or pinned (those leave by eviction).
    NotDiscardable { key: String },
}

impl std::fmt::Display for HostCacheError {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self {
            Self::UnknownKey { key } => write!(f, "{key:?}"),
            Self::Duplicate { key } => write!(f, "host cache: {key:?} has an entry already; alloc is for new keys only"),
            Self::TooLarge { key, requested, capacity } => {
                write!(f, "host cache: {key:?} needs {requested} blocks but the cache has {capacity}")
            }
            Self::AlreadyReady { key } => write!(f, "host cache: mark_ready of {key:?}, which is ready already"),
            Self::NotReady { key } => write!(f, "host cache: pin of {key:?}, which is not ready"),
            Self::NotPinned { key } => write!(f, "host cache: unpin of {key:?}, which is not pinned"),
            Self::NotDiscardable { key } => {
                write!(f, "host cache: discard of {key:?}, which is ready or pinned (only a not-ready entry can be discarded)")
            }
        }
    }
}

impl std::error::Error for HostCacheError {}

/// Counters since the cache was built.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct HostStats {
    /// Entries allocated.
    pub allocs: u64,
    /// `alloc` calls refused for want of space (nothing evicted).
    pub alloc_failures: u64,
    /// Pins of ready entries (each a load, or a read by a peer).
    pub pins: u64,
    pub evictions: u64,
    pub evicted_blocks: u64,
    pub discards: u64,
}

/// One entry, as [`HostBlockCache::entry`] shows it.
#[derive(Debug)]
pub struct HostEntry<'a, T> {
    pub key: &'a str,
    /// Ascending.
    pub blocks: &'a [u32],
    /// -1 while not ready; then the number of pins held.
    pub pins: i64,
    /// The allocation and every pin since.
    pub frequency: u32,
    pub payload: &'a T,
}

#[derive(Debug)]
struct Slot<T> {
    key: Box<str>,
    blocks: Box<[u32]>,
    /// Embeddings the entry holds (GDSF's cost), given at allocation.
    rows: u64,
    pins: i64,
    frequency: u32,
    /// The stamp of the entry's place while it is evictable, else 0.
    stamp: u64,
    lane: u8,
    /// S3-FIFO's passes left in the main lane.
    credit: u32,
    payload: T,
}

/// The host tier's blocks and entries. Not thread-safe by itself: the Python
/// bindings serialise callers with the GIL.
#[derive(Debug)]
pub struct HostBlockCache<T> {
    num_blocks: usize,
    /// A stack: the top (last) block is handed out first.
    free: Vec<u32>,
    index: HashMap<Box<str>, u32>,
    slots: Vec<Option<Slot<T>>>,
    vacant: Vec<u32>,
    evictable_blocks: usize,
    evictable_entries: usize,
    order: EvictionOrder,
    next_stamp: u64,
    stats: HostStats,
}

impl<T> HostBlockCache<T> {
    /// A cache of `num_blocks` free blocks, or None when `num_blocks` is
    /// beyond `u32::MAX` or its free stack cannot be allocated.
    pub fn try_new(num_blocks: usize, policy: HostPolicy) -> Option<Self> {
        let top = u32::try_from(num_blocks).ok()?;
        let mut free = Vec::new();
        free.try_reserve_exact(num_blocks).ok()?;
        free.extend(0..top);
        Some(Self {
            num_blocks,
            free,
            index: HashMap::new(),
            slots: Vec::new(),
            vacant: Vec::new(),
            evictable_blocks: 0,
            evictable_entries: 0,
            order: EvictionOrder::new(policy),
            next_stamp: 1,
            stats: HostStats::default(),
        })
    }

    pub fn policy(&self) -> HostPolicy {
        self.order.policy()
    }

    pub fn num_blocks(&self) -> usize {
        self.num_blocks
    }

    /// The free blocks, bottom of the stack first (the last is handed out next).
    pub fn free_blocks(&self) -> &[u32] {
        &self.free
    }

    /// Blocks that evictions could free now.
    pub fn evictable_blocks(&self) -> usize {
        self.evictable_blocks
    }

    pub fn len(&self) -> usize {
        self.index.len()
    }

    pub fn is_empty(&self) -> bool {
        self.index.is_empty()
    }

    pub fn stats(&self) -> HostStats {
        self.stats
    }

    /// GDSF's clock (0 under the other policies).
    pub fn clock(&self) -> f64 {
        self.order.clock()
    }

    /// Whether any entry is not ready or pinned (a save or load in flight).
    pub fn has_held_entries(&self) -> bool {
        self.index.len() != self.evictable_entries
    }

    fn slot(&self, key: &str) -> Option<&Slot<T>> {
        let &slot = self.index.get(key)?;
        self.slots[slot as usize].as_ref()
    }

    fn slot_id(&self, key: &str) -> Result<u32, HostCacheError> {
        self.index.get(key).copied().ok_or_else(|| HostCacheError::UnknownKey { key: key.to_owned() })
    }

    fn slot_mut(&mut self, slot: u32) -> &mut Slot<T> {
        self.slots[slot as usize].as_mut().expect("the index names only occupied slots")
    }

    fn view(slot: &Slot<T>) -> HostEntry<'_, T> {
        HostEntry { key: &slot.key, blocks: &slot.blocks, pins: slot.pins, frequency: slot.frequency, payload: &slot.payload }
    }

    /// The entry for `key`, in any state.
    pub fn entry(&self, key: &str) -> Option<HostEntry<'_, T>> {
        self.slot(key).map(Self::view)
    }

    /// Every entry, in no particular order.
    pub fn entries(&self) -> impl Iterator<Item = HostEntry<'_, T>> {
        self.slots.iter().flatten().map(Self::view)
    }

    /// Allocates `n_blocks` blocks for a new, not-ready entry of `rows`
    /// embeddings, evicting as needed; `make` builds its payload from its
    /// blocks. `Ok(None)`, changing nothing, when the free and evictable
    /// blocks together are too few. If `make` fails, the evictions stand but
    /// the blocks go back and no entry is made.
    pub fn alloc<E>(
        &mut self,
        key: &str,
        n_blocks: usize,
        rows: u64,
        make: impl FnOnce(&[u32]) -> Result<T, E>,
    ) -> Result<Option<HostEntry<'_, T>>, AllocError<E>> {
        if self.index.contains_key(key) {
            return Err(HostCacheError::Duplicate { key: key.to_owned() }.into());
        }
        if n_blocks > self.num_blocks {
            return Err(HostCacheError::TooLarge { key: key.to_owned(), requested: n_blocks, capacity: self.num_blocks }.into());
        }
        if self.free.len() + self.evictable_blocks < n_blocks {
            self.stats.alloc_failures += 1;
            return Ok(None);
        }
        self.evict_until(n_blocks);
        let taken = self.free.split_off(self.free.len() - n_blocks);
        let mut blocks: Box<[u32]> = taken.as_slice().into();
        blocks.sort_unstable();
        let payload = match make(&blocks) {
            Ok(payload) => payload,
            Err(err) => {
                self.free.extend(taken);
                return Err(AllocError::Payload(err));
            }
        };
        let entry = Slot { key: key.into(), blocks, rows, pins: NOT_READY, frequency: 1, stamp: 0, lane: 0, credit: 0, payload };
        let slot = if let Some(slot) = self.vacant.pop() {
            self.slots[slot as usize] = Some(entry);
            slot
        } else {
            // The slots never outnumber the blocks' u32 range in practice; a
            // vector of 2^32 entries would not fit in memory first.
            #[allow(clippy::cast_possible_truncation)]
            let slot = self.slots.len() as u32;
            self.slots.push(Some(entry));
            slot
        };
        self.index.insert(key.into(), slot);
        self.stats.allocs += 1;
        Ok(self.slots[slot as usize].as_ref().map(Self::view))
    }

    /// Marks `key`'s bytes as written: the entry becomes ready and evictable.
    pub fn mark_ready(&mut self, key: &str) -> Result<HostEntry<'_, T>, HostCacheError> {
        let slot = self.slot_id(key)?;
        if self.slot_mut(slot).pins != NOT_READY {
            return Err(HostCacheError::AlreadyReady { key: key.to_owned() });
        }
        self.slot_mut(slot).pins = 0;
        self.make_evictable(slot);
        Ok(self.view_of(slot))
    }

    /// Pins a ready entry (one more load reads it; it cannot be evicted).
    pub fn pin(&mut self, key: &str) -> Result<HostEntry<'_, T>, HostCacheError> {
        let slot = self.slot_id(key)?;
        if self.slot_mut(slot).pins == NOT_READY {
            return Err(HostCacheError::NotReady { key: key.to_owned() });
        }
        self.pin_slot(slot);
        Ok(self.view_of(slot))
    }

    /// Pins `key` if it has a ready entry; returns its entry either way (a
    /// not-ready one unpinned), None if it has none.
    pub fn pin_if_ready(&mut self, key: &str) -> Option<HostEntry<'_, T>> {
        let &slot = self.index.get(key)?;
        if self.slot_mut(slot).pins != NOT_READY {
            self.pin_slot(slot);
        }
        Some(self.view_of(slot))
    }

    /// Releases one pin; the entry becomes evictable when none is left.
    pub fn unpin(&mut self, key: &str) -> Result<HostEntry<'_, T>, HostCacheError> {
        let slot = self.slot_id(key)?;
        let entry = self.slot_mut(slot);
        if entry.pins <= 0 {
            return Err(HostCacheError::NotPinned { key: key.to_owned() });
        }
        entry.pins -= 1;
        if entry.pins == 0 {
            self.make_evictable(slot);
        }
        Ok(self.view_of(slot))
    }

    /// Drops a not-ready entry (its write failed); its blocks go back.
    pub fn discard(&mut self, key: &str) -> Result<(), HostCacheError> {
        let slot = self.slot_id(key)?;
        if self.slot_mut(slot).pins != NOT_READY {
            return Err(HostCacheError::NotDiscardable { key: key.to_owned() });
        }
        self.remove(slot);
        self.stats.discards += 1;
        Ok(())
    }

    /// The keys of the evictable entries, lane by lane in the order their
    /// places come up (for FIFO, the eviction order).
    pub fn eviction_order(&self) -> Vec<&str> {
        self.order
            .places()
            .into_iter()
            .filter(|place| self.is_live(place))
            .filter_map(|place| self.slots[place.slot as usize].as_ref())
            .map(|slot| &*slot.key)
            .collect()
    }

    fn view_of(&self, slot: u32) -> HostEntry<'_, T> {
        Self::view(self.slots[slot as usize].as_ref().expect("the index names only occupied slots"))
    }

    fn is_live(&self, place: &Place) -> bool {
        self.slots.get(place.slot as usize).and_then(Option::as_ref).is_some_and(|slot| slot.stamp == place.stamp)
    }

    fn pin_slot(&mut self, slot: u32) {
        let entry = self.slot_mut(slot);
        let was_evictable = entry.pins == 0;
        let (lane, blocks) = (entry.lane, entry.blocks.len());
        entry.pins += 1;
        entry.frequency = entry.frequency.saturating_add(1);
        entry.stamp = 0;
        if was_evictable {
            self.evictable_blocks -= blocks;
            self.evictable_entries -= 1;
            self.order.taken_back(lane);
            self.compact();
        }
        self.stats.pins += 1;
    }

    fn make_evictable(&mut self, slot: u32) {
        let stamp = self.next_stamp;
        self.next_stamp += 1;
        let entry = self.slots[slot as usize].as_ref().expect("the index names only occupied slots");
        let (frequency, rows, blocks) = (entry.frequency, entry.rows, entry.blocks.len());
        let lane = self.order.lane_for(frequency);
        let priority = self.order.priority(frequency, HostPolicy::gdsf_cost_per_block(rows, blocks));
        let entry = self.slot_mut(slot);
        entry.stamp = stamp;
        entry.lane = lane;
        entry.credit = (frequency - 1).min(HOST_S3FIFO_MAX_CREDIT);
        self.order.push(lane, Place { stamp, slot, priority });
        self.evictable_blocks += blocks;
        self.evictable_entries += 1;
    }

    /// Evicts in the policy's order until `n_blocks` blocks are free. The
    /// caller has checked that the evictable blocks suffice.
    fn evict_until(&mut self, n_blocks: usize) {
        while self.free.len() < n_blocks {
            let Some((lane, place)) = self.order.pop() else {
                debug_assert!(false, "alloc checked that the evictable blocks suffice");
                return;
            };
            if !self.is_live(&place) {
                self.order.skipped(lane);
                continue;
            }
            self.order.removed(lane, place.priority);
            let rotates = self.order.rotates(lane);
            let entry = self.slots[place.slot as usize].as_mut().expect("live places name occupied slots");
            if rotates && entry.credit > 0 {
                // CLOCK: one pass spent, back of the main lane.
                entry.credit -= 1;
                let stamp = self.next_stamp;
                self.next_stamp += 1;
                entry.stamp = stamp;
                self.order.push(lane, Place { stamp, ..place });
                continue;
            }
            let blocks = entry.blocks.len();
            self.evictable_blocks -= blocks;
            self.evictable_entries -= 1;
            self.stats.evictions += 1;
            self.stats.evicted_blocks += blocks as u64;
            self.remove(place.slot);
        }
    }

    fn remove(&mut self, slot: u32) {
        let entry = self.slots[slot as usize].take().expect("the index names only occupied slots");
        self.index.remove(&entry.key);
        self.free.extend_from_slice(&entry.blocks);
        self.vacant.push(slot);
    }

    fn compact(&mut self) {
        let lanes: Vec<u8> = self.order.lanes_to_compact().collect();
        for lane in lanes {
            let slots = &self.slots;
            self.order
                .compact(lane, |place| slots.get(place.slot as usize).and_then(Option::as_ref).is_some_and(|s| s.stamp == place.stamp));
        }
    }

    /// Checks the bookkeeping's own rules; the first broken one, described.
    pub fn check_invariants(&self) -> Result<(), String> {
        let mut owner = vec![false; self.num_blocks];
        let mut mark = |block: u32, what: &str| -> Result<(), String> {
            let seen = owner.get_mut(block as usize).ok_or_else(|| format!("{what} holds block {block}, beyond the pool"))?;
            if *seen {
                return Err(format!("block {block} is held twice ({what})"));
            }
            *seen = true;
            Ok(())
        };
        for &block in &self.free {
            mark(block, "the free stack")?;
        }
        let (mut evictable_blocks, mut evictable_entries) = (0, 0);
        for entry in self.slots.iter().flatten() {
            if self.index.get(&entry.key).map(|&s| self.slots[s as usize].as_ref().map(|e| &e.key)) != Some(Some(&entry.key)) {
                return Err(format!("entry {:?} is not indexed", entry.key));
            }
            if entry.blocks.windows(2).any(|w| w[0] >= w[1]) {
                return Err(format!("entry {:?}'s blocks are not ascending", entry.key));
            }
            for &block in &entry.blocks {
                mark(block, &entry.key)?;
            }
            if (entry.pins == 0) != (entry.stamp != 0) {
                return Err(format!("entry {:?} has pins {} and stamp {}", entry.key, entry.pins, entry.stamp));
            }
            if entry.pins == 0 {
                evictable_blocks += entry.blocks.len();
                evictable_entries += 1;
            }
        }
        if owner.iter().any(|held| !held) {
            return Err("a block is neither free nor held".into());
        }
        if self.index.len() != self.slots.iter().flatten().count() {
            return Err("the index and the slots disagree".into());
        }
        if (evictable_blocks, evictable_entries) != (self.evictable_blocks, self.evictable_entries) {
            return Err(format!(
                "evictable blocks/entries counted {}/{} but tracked {}/{}",
                evictable_blocks, evictable_entries, self.evictable_blocks, self.evictable_entries
            ));
        }
        let live: usize = self.order.places().iter().filter(|place| self.is_live(place)).count();
        let counted: usize = self.order.counts().iter().map(|(live, _)| live).sum();
        if live != evictable_entries || counted != evictable_entries {
            return Err(format!("{evictable_entries} evictable entries but {live} live places ({counted} counted)"));
        }
        Ok(())
    }
}

/// `alloc`'s error: a refusal, or the payload's own.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum AllocError<E> {
    Refused(HostCacheError),
    Payload(E),
}

impl<E> From<HostCacheError> for AllocError<E> {
    fn from(err: HostCacheError) -> Self {
        Self::Refused(err)
    }
}
