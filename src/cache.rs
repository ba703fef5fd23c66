//! The encoder-cache bookkeeping: which items are cached, who references them,
//! what may be evicted, and which evictions the workers still have to hear about.
//!
//! Pure Rust, no Python types: a Rust scheduler can use it directly, and the
//! PyO3 layer in `bindings` is a thin adapter over it.
//!
//! References are counted per request *and* per occurrence: a request that holds
//! the same item at several input positions (an image re-sent in every turn of
//! a chat) keeps its reference until its last cached occurrence is freed.
//!
//! Which unreferenced entry goes first is the [`Policy`]'s choice (vLLM's
//! release order by default; `policy`), with entries that a waiting request
//! will need (`mark_waiting`) kept until the others are gone. The cache can be
//! resized, and counts hits, misses, evictions and re-encodes (`stats`).
//! docs/policies.md describes the policies and what they save.

use std::hash::{Hash, Hasher};
use std::sync::Arc;

use hashbrown::hash_map::EntryRef;
use hashbrown::{Equivalent, HashMap, HashSet};

mod inputs;
mod policy;
#[cfg(test)]
mod policy_tests;
pub mod state;
mod stats;
pub use inputs::HeldInputs;
use policy::Order;
pub use policy::{Policy, GDSF_COST_SCALE, S3FIFO_MAX_CREDIT};
pub use state::{CacheState, EntryPolicyState, EntryState, InvariantViolation, PolicyState, RequestState};
pub use stats::{CacheStats, Counters, EVICTED_MEMORY};
use stats::{Event, Evicted};

/// An item identifier (vLLM's `mm_hash`) or a request id, shared between maps.
pub type Key = Arc<str>;

/// A request id or identifier as the core's methods take it: a `&str`, or a
/// [`Key`] the caller already holds. A held key is compared by pointer before
/// its text (no `memcmp` when it is the core's own), and is shared rather than
/// copied when the core keeps it.
#[derive(Clone, Copy, Debug)]
pub struct KeyArg<'a> {
    text: &'a str,
    held: Option<&'a Key>,
}

impl<'a> From<&'a str> for KeyArg<'a> {
    fn from(text: &'a str) -> Self {
        Self { text, held: None }
    }
}

impl<'a> From<&'a String> for KeyArg<'a> {
    fn from(text: &'a String) -> Self {
        Self { text, held: None }
    }
}

impl<'a> From<&'a Key> for KeyArg<'a> {
    fn from(key: &'a Key) -> Self {
        Self { text: key, held: Some(key) }
    }
}

impl KeyArg<'_> {
    pub fn as_str(&self) -> &str {
        self.text
    }

    fn names(&self, key: &Key) -> bool {
        self.held.is_some_and(|held| Arc::ptr_eq(held, key)) || self.text == &**key
    }
}

/// Hashes as the text, as a [`Key`] does, so either finds the other in a map.
impl Hash for KeyArg<'_> {
    fn hash<H: Hasher>(&self, state: &mut H) {
        self.text.hash(state);
    }
}

impl Equivalent<Key> for KeyArg<'_> {
    fn equivalent(&self, key: &Key) -> bool {
        self.names(key)
    }
}

impl From<&KeyArg<'_>> for Key {
    fn from(arg: &KeyArg<'_>) -> Key {
        arg.held.cloned().unwrap_or_else(|| Key::from(arg.text))
    }
}

/// Why an operation was refused. A refused operation changes nothing.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum CacheError {
    /// `allocate` for an item that is already cached: the scheduler must take
    /// the cache hit (`check_and_update_cache`) instead of reserving space twice.
    AlreadyCached { identifier: String },
    /// `allocate` without the room `can_allocate` would have made.
    InsufficientSpace { identifier: String, needed: u64, free: u64, freeable: u64 },
    /// A cached item was offered with a different embedding count.
    EmbedCountMismatch { identifier: String, cached: u64, requested: u64 },
    /// The request already holds this input position as another item (its
    /// `mm_features` changed under a held input). Counting the new item there
    /// would leave a reference that no free could ever release.
    InputHeld { request_id: String, input_id: usize, held: String, given: String },
    /// `resize` below what the referenced entries (or held inputs) alone take.
    ReferencedExceedSize { cache_size: u64, referenced: u64 },
    /// An encoder-decoder `allocate` for an input the request holds already.
    InputAllocated { request_id: String, input_id: usize },
    /// `mark_waiting` for a request already marked.
    AlreadyWaiting { request_id: String },
    /// `unmark_waiting` for a request not marked.
    NotWaiting { request_id: String },
}

impl std::fmt::Display for CacheError {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self {
            Self::AlreadyCached { identifier } => {
                write!(f, "item {identifier:?} is already cached; take the hit with check_and_update_cache instead of allocating it again")
            }
            Self::InsufficientSpace { identifier, needed, free, freeable } => write!(
                f,
                "cannot allocate {needed} embeddings for item {identifier:?}: {free} slots free, \
                 {freeable} reclaimable; call can_allocate first so it can evict"
            ),
            Self::EmbedCountMismatch { identifier, cached, requested } => {
                write!(f, "item {identifier:?} is cached with {cached} embeddings but the request gives {requested}")
            }
            Self::InputHeld { request_id, input_id, held, given } => write!(
                f,
                "request '{request_id}' already holds input {input_id} as item '{held}', not '{given}'; \
                 free that input before reusing its id"
            ),
            Self::ReferencedExceedSize { cache_size, referenced } => write!(
                f,
                "cannot resize the cache to {cache_size} embeddings: entries in use take {referenced}; \
                 free requests first or choose a size of at least {referenced}"
            ),
            Self::InputAllocated { request_id, input_id } => {
                write!(f, "request '{request_id}' already holds input {input_id}; free it before allocating it again")
            }
            Self::AlreadyWaiting { request_id } => write!(f, "request '{request_id}' is already marked waiting"),
            Self::NotWaiting { request_id } => write!(f, "request '{request_id}' is not marked waiting"),
        }
    }
}

impl std::error::Error for CacheError {}

/// Gives memory back after a burst: a map keeps its largest size otherwise.
/// Shrinking at a quarter full to half full keeps it O(1) per removal.
pub(crate) fn shrink_when_sparse<K: std::hash::Hash + Eq, V>(map: &mut HashMap<K, V>) {
    if map.capacity() > 64 && map.len() * 4 < map.capacity() {
        map.shrink_to(map.len() * 2);
    }
}

/// A cached item: its size, the requests that reference it, and what the
/// eviction policy keeps about it.
#[derive(Debug, Clone, PartialEq)]
pub struct Entry {
    pub num_embeds: u64,
    pub referrers: Referrers,
    /// While unreferenced, the stamp of its place in the eviction order; 0
    /// while referenced.
    pub released: u64,
    /// Acquisitions since allocation: the allocation and every counted hit.
    pub frequency: u32,
    /// While unreferenced: GDSF's priority, or S3-FIFO's hit credit in a main
    /// lane; otherwise 0.
    pub rank: f64,
    /// The modality tag given at allocation (0 = unknown).
    pub modality: u8,
    /// While unreferenced, the policy lane holding its place.
    lane: u8,
}

impl Entry {
    fn new(num_embeds: u64, referrers: Referrers, modality: u8) -> Self {
        Self { num_embeds, referrers, released: 0, frequency: 1, rank: 0.0, modality, lane: 0 }
    }
}

/// The requests referencing an entry. Most entries have at most one, kept
/// inline, so an entry costs no allocation of its own; an item shared by
/// several requests (one image in many chats) moves to a boxed set, which
/// keeps the enum, and so every entry, small. Always in the
/// smallest variant that fits, so equal sets compare equal.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub enum Referrers {
    #[default]
    None,
    One(Key),
    Many(Box<HashSet<Key>>),
}

impl Referrers {
    pub fn is_empty(&self) -> bool {
        matches!(self, Self::None)
    }

    pub fn len(&self) -> usize {
        match self {
            Self::None => 0,
            Self::One(_) => 1,
            Self::Many(set) => set.len(),
        }
    }

    pub fn contains<'a>(&self, request_id: impl Into<KeyArg<'a>>) -> bool {
        let request_id = request_id.into();
        match self {
            Self::None => false,
            Self::One(key) => request_id.names(key),
            Self::Many(set) => set.contains(&request_id),
        }
    }

    pub fn iter(&self) -> impl Iterator<Item = &Key> {
        let (one, many) = match self {
            Self::None => (None, None),
            Self::One(key) => (Some(key), None),
            Self::Many(set) => (None, Some(set.iter())),
        };
        one.into_iter().chain(many.into_iter().flatten())
    }

    /// Add `request`; false if it was already there.
    pub fn insert(&mut self, request: Key) -> bool {
        match self {
            Self::None => *self = Self::One(request),
            Self::One(key) if *key == request => return false,
            Self::One(key) => *self = Self::Many(Box::new(HashSet::from_iter([key.clone(), request]))),
            Self::Many(set) => return set.insert(request),
        }
        true
    }

    /// Remove `request_id`; false if it was not there.
    pub fn remove<'a>(&mut self, request_id: impl Into<KeyArg<'a>>) -> bool {
        let request_id = request_id.into();
        match self {
            Self::None => false,
            Self::One(key) => {
                let found = request_id.names(key);
                if found {
                    *self = Self::None;
                }
                found
            }
            Self::Many(set) => {
                let found = set.remove(&request_id);
                let last = if set.len() == 1 { set.drain().next() } else { None };
                if let Some(key) = last {
                    *self = Self::One(key);
                }
                found
            }
        }
    }
}

impl FromIterator<Key> for Referrers {
    fn from_iter<I: IntoIterator<Item = Key>>(keys: I) -> Self {
        let mut referrers = Self::None;
        for key in keys {
            referrers.insert(key);
        }
        referrers
    }
}

/// What one request holds: each cached input position with its item, and how
/// many of those positions hold each item (the occurrence count that decides
/// when the request's reference is released).
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct RequestRefs {
    pub inputs: HeldInputs,
    /// Occurrences beyond the first, for items held at several inputs (an
    /// image re-sent in a chat). Most items are held once and need no count:
    /// the entry's referrers already say that the request holds it.
    pub repeats: HashMap<Key, u32>,
}

impl RequestRefs {
    /// How many inputs hold each item the request holds (or counts: a count
    /// left for an item no input holds is a broken invariant, which
    /// [`EncoderCache::check_invariants`] reports through this).
    pub fn occurrences(&self) -> HashMap<&Key, u32> {
        let mut counts: HashMap<&Key, u32> = HashMap::with_capacity(self.inputs.len());
        for item in self.inputs.items().chain(self.repeats.keys()) {
            counts.entry(item).or_insert_with(|| 1 + self.repeats.get(item).copied().unwrap_or(0));
        }
        counts
    }
}

/// The encoder-cache manager's state, with vLLM 0.33's semantics, an
/// eviction [`Policy`], lookahead marks and counters.
#[derive(Debug, Clone)]
pub struct EncoderCache {
    cache_size: u64,
    num_free_slots: u64,
    num_freeable_slots: u64,
    entries: HashMap<Key, Entry>,
    /// Unreferenced entries, in the policy's lanes.
    order: Order,
    /// The last stamp given to a place in `order`.
    last_stamp: u64,
    /// GDSF's clock: the highest priority evicted so far.
    clock: f64,
    requests: HashMap<Key, RequestRefs>,
    /// Evicted since the last `take_freed`, in eviction order.
    freed: Vec<Key>,
    /// Lookahead: waiting request -> its distinct identifiers, and how many
    /// waiting requests need each identifier.
    waiting: HashMap<Key, Vec<Key>>,
    waiting_count: HashMap<Key, u32>,
    stats: CacheStats,
    evicted: Evicted,
}

impl EncoderCache {
    /// A cache under vLLM's eviction rule.
    pub fn new(cache_size: u64) -> Self {
        Self::with_policy(cache_size, Policy::Vllm)
    }

    pub fn with_policy(cache_size: u64, policy: Policy) -> Self {
        Self {
            cache_size,
            num_free_slots: cache_size,
            num_freeable_slots: cache_size,
            entries: HashMap::new(),
            order: Order::new(policy),
            last_stamp: 0,
            clock: 0.0,
            requests: HashMap::new(),
            freed: Vec::new(),
            waiting: HashMap::new(),
            waiting_count: HashMap::new(),
            stats: CacheStats::default(),
            evicted: Evicted::default(),
        }
    }

    pub fn policy(&self) -> Policy {
        self.order.policy
    }

    pub fn cache_size(&self) -> u64 {
        self.cache_size
    }

    /// The counters since the cache was built or [`Self::reset_stats`].
    pub fn stats(&self) -> &CacheStats {
        &self.stats
    }

    /// Zeroes the counters; the contents stay.
    pub fn reset_stats(&mut self) {
        self.stats = CacheStats::default();
    }

    /// Embeddings held by cached entries.
    pub fn used_embeds(&self) -> u64 {
        self.cache_size - self.num_free_slots
    }

    /// Embeddings held by unreferenced (evictable) entries.
    pub fn freeable_embeds(&self) -> u64 {
        self.num_freeable_slots - self.num_free_slots
    }

    /// GDSF's clock (0 under other policies).
    pub fn clock(&self) -> f64 {
        self.clock
    }

    /// The waiting requests' lookahead marks: request -> its distinct identifiers.
    pub fn waiting(&self) -> &HashMap<Key, Vec<Key>> {
        &self.waiting
    }

    /// Resize to `cache_size` embeddings. Growing adds free slots; shrinking
    /// evicts unreferenced entries under the policy (into the freed list)
    /// until the cached entries fit. Refused, changing nothing, when the
    /// referenced entries alone exceed `cache_size`.
    pub fn resize(&mut self, cache_size: u64) -> Result<(), CacheError> {
        let referenced = self.cache_size - self.num_freeable_slots;
        if referenced > cache_size {
            return Err(CacheError::ReferencedExceedSize { cache_size, referenced });
        }
        while self.used_embeds() > cache_size {
            if !self.evict_one() {
                break;
            }
        }
        let (used, freeable) = (self.used_embeds(), self.freeable_embeds());
        self.cache_size = cache_size;
        self.num_free_slots = cache_size - used;
        self.num_freeable_slots = self.num_free_slots + freeable;
        Ok(())
    }

    /// Record that waiting `request_id` will need `identifiers` (duplicates
    /// count once): until [`Self::unmark_waiting`], an unreferenced entry a
    /// waiting request needs is evicted only after every one no waiting
    /// request needs. Identifiers not cached yet count once they are.
    /// O(identifiers). An error, changing nothing, if already marked.
    pub fn mark_waiting<'a>(
        &mut self,
        request_id: impl Into<KeyArg<'a>>,
        identifiers: impl IntoIterator<Item = Key>,
    ) -> Result<(), CacheError> {
        let request_id = request_id.into();
        if self.waiting.contains_key(&request_id) {
            return Err(CacheError::AlreadyWaiting { request_id: request_id.as_str().to_owned() });
        }
        let mut distinct: Vec<Key> = Vec::new();
        let mut seen: HashSet<Key> = HashSet::new();
        for identifier in identifiers {
            if seen.insert(identifier.clone()) {
                distinct.push(identifier);
            }
        }
        for identifier in &distinct {
            let count = self.waiting_count.entry(identifier.clone()).or_insert(0);
            *count += 1;
            if *count == 1 {
                self.move_tier(identifier, 1);
            }
        }
        self.waiting.insert(Key::from(&request_id), distinct);
        self.compact_lanes();
        Ok(())
    }

    /// Drop `request_id`'s lookahead mark; an error, changing nothing, if it has none.
    pub fn unmark_waiting<'a>(&mut self, request_id: impl Into<KeyArg<'a>>) -> Result<(), CacheError> {
        let request_id = request_id.into();
        let Some(identifiers) = self.waiting.remove(&request_id) else {
            return Err(CacheError::NotWaiting { request_id: request_id.as_str().to_owned() });
        };
        shrink_when_sparse(&mut self.waiting);
        for identifier in &identifiers {
            if let EntryRef::Occupied(mut count) = self.waiting_count.entry_ref(&KeyArg::from(identifier)) {
                *count.get_mut() -= 1;
                if *count.get() == 0 {
                    count.remove();
                    self.move_tier(identifier, 0);
                }
            }
        }
        shrink_when_sparse(&mut self.waiting_count);
        self.compact_lanes();
        Ok(())
    }

    /// Moves an unreferenced entry of the other tier to `tier`, as a release now.
    fn move_tier(&mut self, identifier: &Key, tier: usize) {
        let Some((key, entry)) = self.entries.get_key_value_mut(identifier) else {
            return;
        };
        if !entry.referrers.is_empty() || self.order.tier_of_lane(usize::from(entry.lane)) == tier {
            return;
        }
        Self::take_back(&mut self.order, entry);
        Self::place(&mut self.order, &mut self.last_stamp, self.clock, key.clone(), entry, tier, None);
    }

    /// Puts an unreferenced entry in `tier`'s lanes, as the policy orders it
    /// (with `restored`, the rank a snapshot kept, where the policy has one).
    fn place(order: &mut Order, last_stamp: &mut u64, clock: f64, key: Key, entry: &mut Entry, tier: usize, restored: Option<f64>) {
        *last_stamp += 1;
        let lane = order.lane_for(tier, entry.frequency);
        entry.released = *last_stamp;
        entry.lane = u8::try_from(lane).expect("at most four lanes");
        entry.rank = match order.policy {
            Policy::Gdsf => restored.unwrap_or_else(|| clock + f64::from(entry.frequency) * Policy::gdsf_value(entry.num_embeds)),
            Policy::S3Fifo if order.rotates(lane) => restored.unwrap_or_else(|| f64::from((entry.frequency - 1).min(S3FIFO_MAX_CREDIT))),
            Policy::Vllm | Policy::S3Fifo => 0.0,
        };
        order.lanes[lane].push(*last_stamp, key, entry.rank);
    }

    /// Takes an unreferenced entry out of its lane (its place goes stale).
    fn take_back(order: &mut Order, entry: &mut Entry) {
        order.lanes[usize::from(entry.lane)].taken_back();
        entry.released = 0;
        entry.rank = 0.0;
    }

    /// Drops stale places from lanes where they outnumber the live ones.
    fn compact_lanes(&mut self) {
        let entries = &self.entries;
        for lane in &mut self.order.lanes {
            if lane.needs_compacting() {
                lane.compact(|stamp, key| entries.get(key).is_some_and(|e| e.released == stamp));
            }
        }
    }

    /// Evicts the policy's next victim: tier 0 first, then tier 1. False if
    /// nothing is evictable.
    fn evict_one(&mut self) -> bool {
        let Some(lane) = self.order.victim_lane() else {
            return false;
        };
        loop {
            let Some((stamp, key)) = self.order.lanes[lane].pop() else {
                return false; // unreachable: the lane has a live place
            };
            let EntryRef::Occupied(mut slot) = self.entries.entry_ref(&KeyArg::from(&key)) else {
                self.order.lanes[lane].skipped();
                continue;
            };
            let entry = slot.get_mut();
            if entry.released != stamp {
                self.order.lanes[lane].skipped();
                continue;
            }
            if self.order.rotates(lane) && entry.rank > 0.0 {
                // S3-FIFO's main lane: spend one hit credit, go round again.
                entry.rank -= 1.0;
                self.last_stamp += 1;
                entry.released = self.last_stamp;
                let rank = entry.rank;
                self.order.lanes[lane].removed();
                self.order.lanes[lane].push(self.last_stamp, key, rank);
                continue;
            }
            self.order.lanes[lane].removed();
            let entry = slot.remove();
            if self.order.policy == Policy::Gdsf {
                self.clock = self.clock.max(entry.rank);
            }
            self.num_free_slots += entry.num_embeds;
            self.stats.count(Event::Eviction, entry.modality, entry.num_embeds);
            self.evicted.insert(key.clone());
            self.freed.push(key);
            return true;
        }
    }

    pub fn num_free_slots(&self) -> u64 {
        self.num_free_slots
    }

    pub fn num_freeable_slots(&self) -> u64 {
        self.num_freeable_slots
    }

    pub fn entries(&self) -> &HashMap<Key, Entry> {
        &self.entries
    }

    /// The unreferenced entries with their sizes, in the policy's order:
    /// tier 0 (no waiting request needs them) before tier 1, and within a tier
    /// the eviction order (under S3-FIFO, the small lane before the main one).
    pub fn freeable(&self) -> impl Iterator<Item = (&Key, u64)> {
        let live: Vec<(&Key, u64)> = self
            .order
            .lanes
            .iter()
            .flat_map(|lane| lane.places())
            .filter_map(|(stamp, key)| {
                let entry = self.entries.get(key)?;
                (entry.released == stamp).then_some((key, entry.num_embeds))
            })
            .collect();
        live.into_iter()
    }

    pub fn requests(&self) -> &HashMap<Key, RequestRefs> {
        &self.requests
    }

    pub fn freed(&self) -> &[Key] {
        &self.freed
    }

    /// Forget everything (vLLM calls this when model weights change).
    /// Lookahead marks and the memory of evicted items go too; the counters stay.
    pub fn reset(&mut self) {
        self.entries.clear();
        self.order.clear();
        self.last_stamp = 0;
        self.clock = 0.0;
        self.requests.clear();
        self.freed.clear();
        self.waiting.clear();
        self.waiting_count.clear();
        self.evicted.clear();
        self.num_free_slots = self.cache_size;
        self.num_freeable_slots = self.cache_size;
    }

    /// The embedding count stored for `identifier`, if it is cached.
    pub fn cached_num_embeds<'a>(&self, identifier: impl Into<KeyArg<'a>>) -> Option<u64> {
        self.entries.get(&identifier.into()).map(|e| e.num_embeds)
    }

    /// If `identifier` is cached, record that `request_id` uses it at
    /// `input_id` (taking it off the eviction list if it was unreferenced) and
    /// return true: a hit, counted in [`Self::stats`]. An input the request
    /// already holds is a hit that changes and counts nothing, or an error if
    /// it is held as another item.
    pub fn check_and_update_cache<'a>(
        &mut self,
        request_id: impl Into<KeyArg<'a>>,
        input_id: usize,
        identifier: impl Into<KeyArg<'a>>,
    ) -> Result<bool, CacheError> {
        let (request_id, identifier) = (request_id.into(), identifier.into());
        if Self::check_input(self.requests.get(&request_id), request_id, input_id, identifier)? {
            return Ok(true);
        }
        let Some((key, entry)) = self.entries.get_key_value_mut(&identifier) else {
            return Ok(false);
        };
        let taken_back = entry.referrers.is_empty();
        if taken_back {
            Self::take_back(&mut self.order, entry);
            self.num_freeable_slots -= entry.num_embeds;
        }
        entry.frequency = entry.frequency.saturating_add(1);
        self.stats.count(Event::Hit, entry.modality, entry.num_embeds);
        let (request_key, refs) = Self::request_refs(&mut self.requests, request_id);
        let first = entry.referrers.insert(request_key);
        Self::add_occurrence(refs, input_id, key.clone(), first);
        if taken_back && self.order.lanes[usize::from(entry.lane)].needs_compacting() {
            self.compact_lanes();
        }
        Ok(true)
    }

    /// Whether `request_id` already holds `input_id` as `identifier`; an error
    /// if it holds it as another item.
    fn check_input(
        held: Option<&RequestRefs>,
        request_id: KeyArg<'_>,
        input_id: usize,
        identifier: KeyArg<'_>,
    ) -> Result<bool, CacheError> {
        match held.and_then(|r| r.inputs.get(input_id)) {
            None => Ok(false),
            Some(held) if identifier.names(held) => Ok(true),
            Some(held) => Err(CacheError::InputHeld {
                request_id: request_id.as_str().to_owned(),
                input_id,
                held: held.to_string(),
                given: identifier.as_str().to_owned(),
            }),
        }
    }

    /// Whether an item of `num_embeds` fits in the compute budget and, with
    /// `num_embeds_to_schedule` already promised this step, in the cache.
    /// Evicts unreferenced entries, in the policy's order, when that makes room.
    pub fn can_allocate(&mut self, num_embeds: u64, encoder_compute_budget: i64, num_embeds_to_schedule: i64) -> bool {
        let num_embeds = i128::from(num_embeds);
        if num_embeds > i128::from(encoder_compute_budget) {
            return false;
        }
        let needed = num_embeds + i128::from(num_embeds_to_schedule);
        if needed <= i128::from(self.num_free_slots) {
            return true;
        }
        if needed > i128::from(self.num_freeable_slots) {
            return false;
        }
        // Eviction is bookkeeping only: workers drop the tensors when the
        // scheduler output carries `take_freed`.
        while needed > i128::from(self.num_free_slots) {
            if !self.evict_one() {
                break;
            }
        }
        true
    }

    /// Reserve space for a newly encoded item, referenced by `request_id` at
    /// `input_id`: a miss, counted in [`Self::stats`] under modality 0
    /// (unknown). On error nothing changes. A [`Key`] the caller already has
    /// is shared rather than copied.
    pub fn allocate<'a>(
        &mut self,
        request_id: impl Into<KeyArg<'a>>,
        input_id: usize,
        identifier: impl Into<Key>,
        num_embeds: u64,
    ) -> Result<(), CacheError> {
        self.allocate_tagged(request_id, input_id, identifier, num_embeds, 0)
    }

    /// [`Self::allocate`] for an item of modality tag `modality` (the caller's
    /// numbering; 0 = unknown), which its hits, eviction and re-encode are
    /// counted under.
    pub fn allocate_tagged<'a>(
        &mut self,
        request_id: impl Into<KeyArg<'a>>,
        input_id: usize,
        identifier: impl Into<Key>,
        num_embeds: u64,
        modality: u8,
    ) -> Result<(), CacheError> {
        let request_id = request_id.into();
        let slot = match self.entries.entry(identifier.into()) {
            hashbrown::hash_map::Entry::Vacant(slot) => slot,
            hashbrown::hash_map::Entry::Occupied(cached) => {
                let identifier = cached.key().to_string();
                return Err(match cached.get().num_embeds {
                    n if n != num_embeds => CacheError::EmbedCountMismatch { identifier, cached: n, requested: num_embeds },
                    _ => CacheError::AlreadyCached { identifier },
                });
            }
        };
        if num_embeds > self.num_free_slots {
            return Err(CacheError::InsufficientSpace {
                identifier: slot.key().to_string(),
                needed: num_embeds,
                free: self.num_free_slots,
                freeable: self.num_freeable_slots,
            });
        }
        let held = match self.requests.entry_ref(&request_id) {
            EntryRef::Occupied(held) => {
                // A held input is an error here: it is held as another item, since this one is not cached.
                Self::check_input(Some(held.get()), request_id, input_id, KeyArg::from(slot.key()))?;
                held
            }
            EntryRef::Vacant(new) => new.insert_entry(RequestRefs::default()),
        };
        let request_key = held.key().clone();
        Self::add_occurrence(held.into_mut(), input_id, slot.key().clone(), true);
        let reencode = self.evicted.remove(KeyArg::from(slot.key()));
        slot.insert(Entry::new(num_embeds, Referrers::One(request_key), modality));
        self.num_free_slots -= num_embeds;
        self.num_freeable_slots -= num_embeds;
        self.stats.count(Event::Miss, modality, num_embeds);
        if reencode {
            self.stats.count(Event::Reencode, modality, num_embeds);
        }
        Ok(())
    }

    /// The input positions `request_id` holds cached.
    pub fn cached_input_ids<'a>(&self, request_id: impl Into<KeyArg<'a>>) -> Option<&HeldInputs> {
        self.requests.get(&request_id.into()).map(|r| &r.inputs)
    }

    /// Whether `request_id` holds `input_id` cached.
    pub fn holds_input<'a>(&self, request_id: impl Into<KeyArg<'a>>, input_id: usize) -> bool {
        self.requests.get(&request_id.into()).is_some_and(|r| r.inputs.contains(input_id))
    }

    /// Drop the request's hold on one input position; false if it held none
    /// there. The request's reference to the item goes only with its last
    /// occurrence; an entry left with no referrer becomes evictable, but stays
    /// until space is needed.
    pub fn free_encoder_input<'a>(&mut self, request_id: impl Into<KeyArg<'a>>, input_id: usize) -> bool {
        let request_id = request_id.into();
        let Some(refs) = self.requests.get_mut(&request_id) else {
            return false;
        };
        let Some(identifier) = refs.inputs.remove(input_id) else {
            return false;
        };
        let last_occurrence = Self::drop_occurrence(&mut refs.repeats, &identifier);
        if refs.inputs.is_empty() {
            self.requests.remove(&request_id);
            shrink_when_sparse(&mut self.requests);
        }
        if last_occurrence {
            self.release(request_id, &identifier);
        }
        true
    }

    /// Drop every hold `request_id` has (a finished, aborted or preempted
    /// request). Positions are walked in ascending order, so entries become
    /// evictable in the order of their last occurrence.
    pub fn free<'a>(&mut self, request_id: impl Into<KeyArg<'a>>) {
        let request_id = request_id.into();
        let Some(RequestRefs { inputs, mut repeats, .. }) = self.requests.remove(&request_id) else {
            return;
        };
        shrink_when_sparse(&mut self.requests);
        for identifier in inputs.into_items() {
            if Self::drop_occurrence(&mut repeats, &identifier) {
                self.release(request_id, &identifier);
            }
        }
    }

    /// Evictions since the last call, minus items allocated again meanwhile
    /// (an entry evicted early in a step can come back later in the same step,
    /// and the workers must keep its tensor).
    pub fn take_freed(&mut self) -> Vec<Key> {
        let entries = &self.entries;
        let mut freed = std::mem::take(&mut self.freed);
        freed.retain(|k| !entries.contains_key(k));
        freed
    }

    fn release(&mut self, request_id: KeyArg<'_>, identifier: &Key) {
        let Some((key, entry)) = self.entries.get_key_value_mut(identifier) else {
            return;
        };
        if entry.referrers.remove(request_id) && entry.referrers.is_empty() {
            let tier = usize::from(self.waiting_count.contains_key(key));
            Self::place(&mut self.order, &mut self.last_stamp, self.clock, key.clone(), entry, tier, None);
            self.num_freeable_slots += entry.num_embeds;
        }
    }

    /// Count one occurrence of `identifier` off; true when it was the last.
    fn drop_occurrence(repeats: &mut HashMap<Key, u32>, identifier: &Key) -> bool {
        if repeats.is_empty() {
            return true; // the common case, without hashing the identifier
        }
        match repeats.entry_ref(&KeyArg::from(identifier)) {
            EntryRef::Occupied(mut count) if *count.get() > 1 => {
                *count.get_mut() -= 1;
                false
            }
            EntryRef::Occupied(count) => {
                count.remove();
                false
            }
            EntryRef::Vacant(_) => true,
        }
    }

    /// The request's holdings and its shared id, created on first use.
    fn request_refs<'a>(requests: &'a mut HashMap<Key, RequestRefs>, request_id: KeyArg<'_>) -> (Key, &'a mut RequestRefs) {
        let entry = match requests.entry_ref(&request_id) {
            EntryRef::Occupied(entry) => entry,
            EntryRef::Vacant(entry) => entry.insert_entry(RequestRefs::default()),
        };
        (entry.key().clone(), entry.into_mut())
    }

    /// Records `identifier` at `input_id`; `first` when the request held no
    /// other occurrence of it.
    fn add_occurrence(refs: &mut RequestRefs, input_id: usize, identifier: Key, first: bool) {
        let repeat = (!first).then(|| identifier.clone());
        if refs.inputs.insert_vacant(input_id, identifier) {
            if let Some(identifier) = repeat {
                *refs.repeats.entry(identifier).or_insert(0) += 1;
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn freeable(cache: &EncoderCache) -> Vec<(&str, u64)> {
        cache.freeable().map(|(k, n)| (&**k, n)).collect()
    }

    #[test]
    fn a_repeated_item_is_held_until_its_last_occurrence_is_freed() {
        let mut cache = EncoderCache::new(8);
        cache.allocate("r1", 0, "imgA", 4).unwrap();
        assert_eq!(cache.check_and_update_cache("r1", 1, "imgA"), Ok(true));
        cache.free_encoder_input("r1", 0);
        assert_eq!(cache.num_freeable_slots(), 4);
        assert!(!cache.can_allocate(8, 1_000_000, 0), "imgA is still needed and must not be evicted");
        cache.free_encoder_input("r1", 1);
        assert_eq!(freeable(&cache), vec![("imgA", 4)]);
        assert!(cache.requests().is_empty());
    }

    #[test]
    fn a_held_key_is_shared_when_stored_and_found_by_text_or_by_pointer() {
        let mut cache = EncoderCache::new(8);
        let (request, item): (Key, Key) = (Key::from("r"), Key::from("imgA"));
        cache.allocate(&request, 0, item.clone(), 4).unwrap();
        let (stored_request, _) = cache.requests().get_key_value("r").unwrap();
        let (stored_item, entry) = cache.entries().get_key_value("imgA").unwrap();
        assert!(Arc::ptr_eq(stored_request, &request) && Arc::ptr_eq(stored_item, &item));
        assert!(Arc::ptr_eq(entry.referrers.iter().next().unwrap(), &request));
        // Another key with the same text, and plain text, name the same request and item.
        assert_eq!(cache.check_and_update_cache(&Key::from("r"), 0, "imgA"), Ok(true));
        assert_eq!(cache.cached_num_embeds(&Key::from("imgA")), Some(4));
        assert!(entry_referenced_by(&cache, "imgA", "r"));
        cache.free(&Key::from("r"));
        assert!(cache.requests().is_empty() && !entry_referenced_by(&cache, "imgA", "r"));
    }

    fn entry_referenced_by(cache: &EncoderCache, item: &str, request: &str) -> bool {
        cache.entries().get(item).is_some_and(|entry| entry.referrers.contains(request))
    }

    #[test]
    fn eviction_takes_the_oldest_release_first_and_stops_when_there_is_room() {
        let mut cache = EncoderCache::new(12);
        for (request, item) in [("r0", "a"), ("r1", "b"), ("r2", "c")] {
            cache.allocate(request, 0, item, 4).unwrap();
        }
        for request in ["r1", "r0", "r2"] {
            cache.free(request);
        }
        assert!(cache.can_allocate(6, 100, 0));
        assert_eq!(cache.freed().iter().map(|k| &**k).collect::<Vec<_>>(), ["b", "a"]);
        assert_eq!(freeable(&cache), vec![("c", 4)]);
        assert_eq!((cache.num_free_slots(), cache.num_freeable_slots()), (8, 12));
    }

    #[test]
    fn an_item_evicted_and_allocated_again_is_not_reported_freed() {
        let mut cache = EncoderCache::new(8);
        cache.allocate("r1", 0, "a", 4).unwrap();
        cache.allocate("r2", 0, "b", 4).unwrap();
        cache.free("r1");
        cache.free("r2");
        assert!(cache.can_allocate(4, 100, 4));
        cache.allocate("r3", 0, "a", 4).unwrap();
        assert_eq!(cache.take_freed().iter().map(|k| &**k).collect::<Vec<_>>(), ["b"]);
        assert!(cache.take_freed().is_empty());
    }

    #[test]
    fn entries_taken_back_and_released_again_keep_the_order_and_a_bounded_queue() {
        let mut cache = EncoderCache::new(3);
        for (input, item) in ["a", "b", "c"].into_iter().enumerate() {
            cache.allocate("r", input, item, 1).unwrap();
        }
        cache.free("r");
        for _ in 0..1000 {
            assert_eq!(cache.check_and_update_cache("s", 0, "a"), Ok(true));
            cache.free("s");
        }
        assert_eq!(freeable(&cache), vec![("b", 1), ("c", 1), ("a", 1)]);
        assert!(cache.order.lanes[0].len() < 200, "stale places are dropped");
        assert!(cache.can_allocate(2, 10, 0));
        assert_eq!(cache.take_freed().iter().map(|k| &**k).collect::<Vec<_>>(), ["b", "c"]);
        assert_eq!(freeable(&cache), vec![("a", 1)]);
        assert_eq!(cache.check_invariants(), Ok(()));
    }

    #[test]
    fn refused_allocations_change_nothing() {
        let mut cache = EncoderCache::new(8);
        cache.allocate("r1", 0, "a", 4).unwrap();
        let before = format!("{cache:?}");
        assert_eq!(
            cache.allocate("r2", 0, "a", 5),
            Err(CacheError::EmbedCountMismatch { identifier: "a".into(), cached: 4, requested: 5 })
        );
        assert_eq!(cache.allocate("r2", 0, "a", 4), Err(CacheError::AlreadyCached { identifier: "a".into() }));
        assert!(matches!(cache.allocate("r2", 0, "b", 5), Err(CacheError::InsufficientSpace { needed: 5, free: 4, .. })));
        assert_eq!(format!("{cache:?}"), before);
    }

    #[test]
    fn free_releases_items_in_the_order_of_their_last_occurrence() {
        let mut cache = EncoderCache::new(30);
        cache.allocate("r1", 2, "b", 5).unwrap();
        cache.allocate("r1", 0, "c", 3).unwrap();
        cache.allocate("r1", 1, "a", 4).unwrap();
        assert_eq!(cache.check_and_update_cache("r1", 3, "a"), Ok(true));
        cache.free("r1");
        assert_eq!(freeable(&cache), vec![("c", 3), ("b", 5), ("a", 4)]);
        assert_eq!(cache.num_freeable_slots(), 30);
    }

    #[test]
    fn budgets_outside_i64_arithmetic_do_not_overflow() {
        let mut cache = EncoderCache::new(u64::MAX);
        assert!(!cache.can_allocate(u64::MAX, i64::MAX, i64::MAX));
        assert!(!cache.can_allocate(1, i64::MIN, 0));
        assert!(cache.can_allocate(1, 1, i64::MIN));
    }

    #[test]
    fn resize_grows_shrinks_by_evicting_and_refuses_below_the_entries_in_use() {
        let mut cache = EncoderCache::new(12);
        cache.allocate("r1", 0, "a", 4).unwrap();
        cache.allocate("r2", 0, "b", 4).unwrap();
        cache.free("r1");
        let before = format!("{cache:?}");
        assert_eq!(cache.resize(3), Err(CacheError::ReferencedExceedSize { cache_size: 3, referenced: 4 }));
        assert_eq!(format!("{cache:?}"), before, "a refused resize changes nothing");
        cache.resize(6).unwrap();
        assert_eq!(cache.take_freed().iter().map(|k| &**k).collect::<Vec<_>>(), ["a"]);
        assert_eq!((cache.cache_size(), cache.num_free_slots(), cache.num_freeable_slots()), (6, 2, 2));
        cache.resize(20).unwrap();
        assert_eq!((cache.num_free_slots(), cache.num_freeable_slots()), (16, 16));
        assert_eq!(cache.check_invariants(), Ok(()));
    }

    #[test]
    fn reset_returns_to_a_new_cache() {
        let mut cache = EncoderCache::new(10);
        cache.allocate("r1", 0, "a", 4).unwrap();
        cache.free("r1");
        assert!(cache.can_allocate(10, 10, 0));
        cache.reset();
        assert_eq!(cache.stats().total.evictions, 1, "reset keeps the counters");
        cache.reset_stats();
        assert_eq!(format!("{cache:?}"), format!("{:?}", EncoderCache::new(10)));
    }

    #[test]
    fn referrers_stay_in_their_smallest_form() {
        let key = |s: &str| -> Key { Arc::from(s) };
        let mut referrers = Referrers::default();
        assert!(referrers.insert(key("a")));
        assert!(!referrers.insert(key("a")));
        assert!(referrers.insert(key("b")));
        assert!(referrers.insert(key("c")));
        assert_eq!((referrers.len(), referrers.contains("b"), referrers.contains("z")), (3, true, false));
        assert!(referrers.remove("a") && referrers.remove("c"));
        assert_eq!(referrers, Referrers::One(key("b")), "back inline with one left");
        assert!(!referrers.remove("a"));
        assert!(referrers.remove("b") && referrers.is_empty());
        let collected: Referrers = ["x", "y", "x"].map(key).into_iter().collect();
        assert_eq!(collected.iter().count(), 2);
    }
}
