//! [`PolicyCache`]: the encoder-cache manager's state and operations under
//! one eviction policy, with vLLM 0.33's semantics, lookahead marks and
//! counters.
//!
//! References are counted per request *and* per occurrence: a request that
//! holds the same item at several input positions (an image re-sent in every
//! turn of a chat) keeps its reference until its last cached occurrence is
//! freed. Entries and requests live in slab tables and refer to each other by
//! slot; an item or request is hashed at most once per call, not at all when
//! the caller passes a still-valid [`Handle`].

use hashbrown::{HashMap, HashSet};

use super::entries::{Entry, Referrers};
use super::errors::CacheError;
use super::events::EventLog;
use super::keys::{Handle, Holding, Key, KeyArg};
use super::policies::{Entries, EvictionPolicy, Policy};
use super::requests::{HeldInputs, RequestRefs};
use super::stats::{CacheStats, Ghosts, Tally};
use super::table::Table;

/// Gives memory back after a burst: a map keeps its largest size otherwise.
/// Shrinking at a quarter full to half full keeps it O(1) per removal.
pub(crate) fn shrink_when_sparse<K: std::hash::Hash + Eq, V>(map: &mut HashMap<K, V>) {
    if map.capacity() > 64 && map.len() * 4 < map.capacity() {
        map.shrink_to(map.len() * 2);
    }
}

/// Evictions the freed list keeps room for between steps.
const FREED_ROOM: usize = 1024;

/// The encoder cache under eviction policy `P`.
#[derive(Debug, Clone)]
pub struct PolicyCache<P: EvictionPolicy> {
    pub(crate) cache_size: u64,
    pub(crate) num_free_slots: u64,
    pub(crate) num_freeable_slots: u64,
    pub(crate) entries: Entries<P>,
    pub(crate) requests: Table<RequestRefs>,
    /// The unreferenced entries, in the policy's order.
    pub(crate) policy: P,
    /// Evicted since the last `take_freed`, in eviction order, with their hashes.
    pub(crate) freed: Vec<(Key, u64)>,
    /// Lookahead: waiting request -> its distinct identifiers, and how many
    /// waiting requests need each identifier.
    pub(crate) waiting: HashMap<Key, Vec<Key>>,
    pub(crate) waiting_count: HashMap<Key, u32>,
    pub(crate) tally: Tally,
    pub(crate) ghosts: Ghosts<P::Window>,
    /// Off (`None`) unless enabled: see `events`.
    pub(crate) events: Option<Box<EventLog>>,
}

impl<P: EvictionPolicy> PolicyCache<P> {
    pub fn new(cache_size: u64) -> Self {
        let mut policy = P::default();
        policy.sized(cache_size);
        let mut ghosts = Ghosts::default();
        ghosts.sized(cache_size, &mut Tally::default());
        Self {
            cache_size,
            num_free_slots: cache_size,
            num_freeable_slots: cache_size,
            entries: Table::default(),
            requests: Table::default(),
            policy,
            freed: Vec::new(),
            waiting: HashMap::new(),
            waiting_count: HashMap::new(),
            tally: Tally::default(),
            ghosts,
            events: None,
        }
    }

    pub fn policy(&self) -> Policy {
        P::POLICY
    }

    pub fn cache_size(&self) -> u64 {
        self.cache_size
    }

    pub fn num_free_slots(&self) -> u64 {
        self.num_free_slots
    }

    pub fn num_freeable_slots(&self) -> u64 {
        self.num_freeable_slots
    }

    /// The counters since the cache was built or [`Self::reset_stats`].
    pub fn stats(&mut self) -> CacheStats {
        self.ghosts.apply(&mut self.tally);
        self.tally.report()
    }

    /// Zeroes the counters; the contents stay.
    pub fn reset_stats(&mut self) {
        self.ghosts.apply(&mut self.tally);
        self.tally = Tally::default();
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
        self.policy.clock()
    }

    /// The waiting requests' lookahead marks: request -> its distinct identifiers.
    pub fn waiting(&self) -> &HashMap<Key, Vec<Key>> {
        &self.waiting
    }

    pub fn num_entries(&self) -> usize {
        self.entries.len()
    }

    pub fn num_requests(&self) -> usize {
        self.requests.len()
    }

    /// Every cached item with its size and the ids of the requests referencing it.
    pub fn entries(&self) -> impl Iterator<Item = (&Key, u64, impl Iterator<Item = &Key>)> {
        let requests = &self.requests;
        self.entries.iter().map(move |(_, e)| (&e.key, e.num_embeds, e.referrers.iter().map(move |r| &requests.get(r).id)))
    }

    /// The cached entry of `identifier`.
    pub fn entry<'a>(&self, identifier: impl Into<KeyArg<'a>>) -> Option<&Entry<P::Meta>> {
        self.entries.find_value(&identifier.into())
    }

    /// Every request holding inputs, with the positions it holds and each one's item.
    pub fn requests(&self) -> impl Iterator<Item = (&Key, impl Iterator<Item = (usize, &Key)>)> {
        let entries = &self.entries;
        self.requests.iter().map(move |(_, r)| (&r.id, r.inputs.iter().map(move |(i, e)| (i, &entries.get(e).key))))
    }

    /// The unreferenced entries with their sizes, in the policy's order:
    /// tier 0 (no waiting request needs them) before tier 1, and within a tier
    /// the eviction order (under S3-FIFO, the small lane before the main one).
    pub fn freeable(&self) -> impl Iterator<Item = (&Key, u64)> {
        let entries = &self.entries;
        self.policy.order(entries).into_iter().map(move |e| {
            let entry = entries.get(e);
            (&entry.key, entry.num_embeds)
        })
    }

    /// Evicted since the last [`Self::take_freed`], in eviction order.
    pub fn freed(&self) -> impl Iterator<Item = &Key> {
        self.freed.iter().map(|(key, _)| key)
    }

    /// The handle `identifier` is cached under, for later calls to name it by.
    pub fn item_handle<'a>(&self, identifier: impl Into<KeyArg<'a>>) -> Option<Handle> {
        self.entries.find(&identifier.into()).map(|e| self.entries.handle(e))
    }

    /// The handle `request_id` holds its inputs under, for later calls to name it by.
    pub fn request_handle<'a>(&self, request_id: impl Into<KeyArg<'a>>) -> Option<Handle> {
        self.requests.find(&request_id.into()).map(|r| self.requests.handle(r))
    }

    /// The handles `request_id` and `identifier` go by now, for later calls
    /// to name them by (a name's own handle is kept while it stays valid).
    #[inline]
    pub fn handles(&self, request_id: &KeyArg<'_>, identifier: Option<&KeyArg<'_>>) -> (Option<Handle>, Option<Handle>) {
        let request = match request_id.handle() {
            Some(handle) if self.requests.is_live(handle) => Some(handle),
            _ => self.request_handle(*request_id),
        };
        let item = identifier.and_then(|identifier| match identifier.handle() {
            Some(handle) if self.entries.is_live(handle) => Some(handle),
            _ => self.item_handle(*identifier),
        });
        (request, item)
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
        self.policy.sized(cache_size);
        self.ghosts.sized(cache_size, &mut self.tally);
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
        if self.waiting.contains_key(request_id.as_str()) {
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
        self.waiting.insert(request_id.to_key(), distinct);
        Ok(())
    }

    /// Drop `request_id`'s lookahead mark; an error, changing nothing, if it has none.
    pub fn unmark_waiting<'a>(&mut self, request_id: impl Into<KeyArg<'a>>) -> Result<(), CacheError> {
        let request_id = request_id.into();
        let Some(identifiers) = self.waiting.remove(request_id.as_str()) else {
            return Err(CacheError::NotWaiting { request_id: request_id.as_str().to_owned() });
        };
        shrink_when_sparse(&mut self.waiting);
        for identifier in &identifiers {
            if let Some(count) = self.waiting_count.get_mut(identifier) {
                *count -= 1;
                if *count == 0 {
                    self.waiting_count.remove(identifier);
                    self.move_tier(identifier, 0);
                }
            }
        }
        shrink_when_sparse(&mut self.waiting_count);
        Ok(())
    }

    /// The lookahead tier of an item: 1 while a waiting request needs it.
    #[inline]
    fn tier_of(waiting_count: &HashMap<Key, u32>, key: &Key) -> usize {
        usize::from(!waiting_count.is_empty() && waiting_count.contains_key(key))
    }

    /// Moves an unreferenced entry of the other tier to `tier`, as a release now.
    fn move_tier(&mut self, identifier: &Key, tier: usize) {
        let Some(e) = self.entries.find(&KeyArg::from(identifier)) else {
            return;
        };
        let entry = self.entries.get(e);
        if entry.is_referenced() || P::tier_of_lane(entry.lane) == tier {
            return;
        }
        self.policy.take_back(&mut self.entries, e);
        self.policy.release(&mut self.entries, e, tier, None);
    }

    /// Evicts the policy's next victim: tier 0 first, then tier 1. False if
    /// nothing is evictable.
    fn evict_one(&mut self) -> bool {
        let Some(e) = self.policy.evict(&mut self.entries) else {
            return false;
        };
        let entry = self.entries.remove(e);
        self.num_free_slots += entry.num_embeds;
        self.tally.eviction(entry.modality, entry.num_embeds);
        self.ghosts.evicted(entry.hash, P::frequency(&entry.meta), &mut self.tally);
        self.policy.evicted(entry.hash, &entry.meta, entry.num_embeds);
        self.freed.push((entry.key, entry.hash));
        true
    }

    /// Forget everything (vLLM calls this when model weights change).
    /// Lookahead marks and the memory of evicted items go too; the counters
    /// and the event log stay, the log recording that the cache was cleared.
    pub fn reset(&mut self) {
        self.ghosts.apply(&mut self.tally);
        let tally = std::mem::take(&mut self.tally);
        let mut events = self.events.take();
        if let Some(log) = events.as_deref_mut() {
            log.record_cleared();
        }
        *self = Self { tally, events, ..Self::new(self.cache_size) };
    }

    /// The embedding count stored for `identifier`, if it is cached.
    #[inline]
    pub fn cached_num_embeds<'a>(&self, identifier: impl Into<KeyArg<'a>>) -> Option<u64> {
        self.entries.find_value(&identifier.into()).map(|entry| entry.num_embeds)
    }

    /// The embedding count of the entry `identifier`'s handle names, if the
    /// handle is still valid: [`Self::cached_num_embeds`] without the look-up
    /// by name, small enough to inline.
    #[inline]
    pub(crate) fn num_embeds_by_handle(&self, identifier: &KeyArg<'_>) -> Option<u64> {
        self.entries.by_handle(identifier).map(|(_, entry)| entry.num_embeds)
    }

    /// If `identifier` is cached, record that `request_id` uses it at
    /// `input_id` (taking it off the eviction list if it was unreferenced) and
    /// return true: a hit, counted in [`Self::stats`]. An input the request
    /// already holds is a hit that changes and counts nothing, or an error if
    /// it is held as another item.
    #[inline]
    pub fn check_and_update_cache<'a>(
        &mut self,
        request_id: impl Into<KeyArg<'a>>,
        input_id: usize,
        identifier: impl Into<KeyArg<'a>>,
    ) -> Result<bool, CacheError> {
        let (request_id, identifier) = (request_id.into(), identifier.into());
        let request = self.requests.find(&request_id);
        if self.holds(request, request_id, input_id, identifier)? {
            return Ok(true);
        }
        let Some(e) = self.entries.find(&identifier) else {
            return Ok(false);
        };
        let entry = self.entries.get_mut(e);
        let (num_embeds, modality, hash) = (entry.num_embeds, entry.modality, entry.hash);
        self.policy.on_hit(&mut entry.meta, hash, num_embeds);
        if !entry.is_referenced() {
            self.policy.take_back(&mut self.entries, e);
            self.num_freeable_slots -= num_embeds;
        }
        self.tally.hit(modality, num_embeds);
        let r = request.unwrap_or_else(|| self.requests.insert(RequestRefs::new(request_id.to_key(), request_id.hash())));
        let first = self.entries.get_mut(e).referrers.insert(r);
        Self::add_occurrence(self.requests.get_mut(r), input_id, e, first);
        Ok(true)
    }

    /// Whether `request` already holds `input_id` as `identifier`; an error
    /// if it holds it as another item.
    #[inline]
    fn holds(&self, request: Option<u32>, request_id: KeyArg<'_>, input_id: usize, identifier: KeyArg<'_>) -> Result<bool, CacheError> {
        let Some(held) = request.and_then(|r| self.requests.get(r).inputs.get(input_id)) else {
            return Ok(false);
        };
        let entry = self.entries.get(held);
        let same = (identifier.handle() == Some(self.entries.handle(held)) && identifier.hash() == entry.hash)
            || (identifier.hash() == entry.hash && identifier.names(&entry.key));
        if same {
            return Ok(true);
        }
        Err(CacheError::InputHeld {
            request_id: request_id.as_str().to_owned(),
            input_id,
            held: entry.key.to_string(),
            given: identifier.as_str().to_owned(),
        })
    }

    /// Whether an item of `num_embeds` fits in the compute budget and, with
    /// `num_embeds_to_schedule` already promised this step, in the cache.
    /// Evicts unreferenced entries, in the policy's order, when that makes room.
    #[inline]
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
    /// (unknown). On error nothing changes.
    pub fn allocate<'a>(
        &mut self,
        request_id: impl Into<KeyArg<'a>>,
        input_id: usize,
        identifier: impl Into<KeyArg<'a>>,
        num_embeds: u64,
    ) -> Result<(), CacheError> {
        self.allocate_tagged(request_id, input_id, identifier, num_embeds, 0).map(drop)
    }

    /// [`Self::allocate`] for an item of modality tag `modality` (the caller's
    /// numbering; 0 = unknown), which its hits, eviction and re-encode are
    /// counted under. Returns the handles the request and the item now go by.
    #[inline]
    pub fn allocate_tagged<'a>(
        &mut self,
        request_id: impl Into<KeyArg<'a>>,
        input_id: usize,
        identifier: impl Into<KeyArg<'a>>,
        num_embeds: u64,
        modality: u8,
    ) -> Result<Holding, CacheError> {
        let (request_id, identifier) = (request_id.into(), identifier.into());
        let hash = identifier.hash();
        if let Some(e) = self.entries.find_hashed(&identifier, hash) {
            let entry = self.entries.get(e);
            let identifier = entry.key.to_string();
            return Err(match entry.num_embeds {
                n if n != num_embeds => CacheError::EmbedCountMismatch { identifier, cached: n, requested: num_embeds },
                _ => CacheError::AlreadyCached { identifier },
            });
        }
        if num_embeds > self.num_free_slots {
            return Err(CacheError::InsufficientSpace {
                identifier: identifier.as_str().to_owned(),
                needed: num_embeds,
                free: self.num_free_slots,
                freeable: self.num_freeable_slots,
            });
        }
        let request = self.requests.find(&request_id);
        // A held input is an error here: it is held as another item, since this one is not cached.
        self.holds(request, request_id, input_id, identifier)?;
        let r = request.unwrap_or_else(|| self.requests.insert(RequestRefs::new(request_id.to_key(), request_id.hash())));
        let mut entry = Entry::new(identifier.to_key(), hash, num_embeds, Referrers::One(r), modality);
        let remembered = self.ghosts.allocated_counted(hash, modality, num_embeds, &mut self.tally);
        entry.meta = self.policy.admit(hash, num_embeds, remembered);
        let e = self.entries.insert(entry);
        Self::add_occurrence(self.requests.get_mut(r), input_id, e, true);
        self.num_free_slots -= num_embeds;
        self.num_freeable_slots -= num_embeds;
        self.tally.miss(modality, num_embeds);
        if let Some(log) = self.events.as_deref_mut() {
            log.record_stored(&self.entries.get(e).key, hash);
        }
        Ok(Holding { request: self.requests.handle(r), item: self.entries.handle(e) })
    }

    /// The input positions `request_id` holds cached.
    pub fn cached_input_ids<'a>(&self, request_id: impl Into<KeyArg<'a>>) -> Option<&HeldInputs> {
        self.requests.find_value(&request_id.into()).map(|request| &request.inputs)
    }

    /// [`Self::cached_input_ids`] with the request's handle. The handle and
    /// [`HeldInputs::changes`] together name one state of one request's
    /// holdings: a request that lets go of all its inputs leaves the table,
    /// and a request added later (the same id too) gets another handle.
    #[inline]
    pub fn held_inputs<'a>(&self, request_id: impl Into<KeyArg<'a>>) -> Option<(Handle, &HeldInputs)> {
        let r = self.requests.find(&request_id.into())?;
        Some((self.requests.handle(r), &self.requests.get(r).inputs))
    }

    /// Whether `request_id` holds `input_id` cached.
    pub fn holds_input<'a>(&self, request_id: impl Into<KeyArg<'a>>, input_id: usize) -> bool {
        self.cached_input_ids(request_id).is_some_and(|inputs| inputs.contains(input_id))
    }

    /// Drop the request's hold on one input position; false if it held none
    /// there. The request's reference to the item goes only with its last
    /// occurrence; an entry left with no referrer becomes evictable, but stays
    /// until space is needed.
    #[inline]
    pub fn free_encoder_input<'a>(&mut self, request_id: impl Into<KeyArg<'a>>, input_id: usize) -> bool {
        let Some(r) = self.requests.find(&request_id.into()) else {
            return false;
        };
        let refs = self.requests.get_mut(r);
        let Some(e) = refs.inputs.remove(input_id) else {
            return false;
        };
        let last_occurrence = Self::drop_occurrence(&mut refs.repeats, e);
        let emptied = refs.inputs.is_empty();
        if last_occurrence {
            self.release(r, e);
        }
        if emptied {
            self.requests.remove(r);
        }
        true
    }

    /// Drop every hold `request_id` has (a finished, aborted or preempted
    /// request). Positions are walked in ascending order, so entries become
    /// evictable in the order of their last occurrence.
    pub fn free<'a>(&mut self, request_id: impl Into<KeyArg<'a>>) {
        let Some(r) = self.requests.find(&request_id.into()) else {
            return;
        };
        let RequestRefs { inputs, mut repeats, .. } = self.requests.remove(r);
        for e in inputs.into_items() {
            if Self::drop_occurrence(&mut repeats, e) {
                self.release(r, e);
            }
        }
    }

    /// Evictions since the last call, minus items allocated again meanwhile
    /// (an entry evicted early in a step can come back later in the same step,
    /// and the workers must keep its tensor).
    pub fn take_freed(&mut self) -> Vec<Key> {
        // Drained, not taken: the list keeps its room for the next step's evictions.
        let entries = &self.entries;
        let mut freed = Vec::with_capacity(self.freed.len());
        freed.extend(
            self.freed.drain(..).filter(|(key, hash)| entries.find_hashed(&KeyArg::from(key), *hash).is_none()).map(|(key, _)| key),
        );
        // Room past a large burst (a resize) is given back.
        self.freed.shrink_to(FREED_ROOM);
        if let Some(log) = self.events.as_deref_mut() {
            log.record_removed(&freed);
        }
        freed
    }

    /// Request slot `r` lets go of entry `e`; an entry left unreferenced
    /// joins the eviction order.
    #[inline]
    fn release(&mut self, r: u32, e: u32) {
        let Some(entry) = self.entries.try_get_mut(e) else {
            return;
        };
        if entry.referrers.remove(r) && entry.referrers.is_empty() {
            let num_embeds = entry.num_embeds;
            let tier = Self::tier_of(&self.waiting_count, &entry.key);
            self.policy.release(&mut self.entries, e, tier, None);
            self.num_freeable_slots += num_embeds;
        }
    }

    /// Count one occurrence of entry `e` off; true when it was the last.
    #[inline]
    fn drop_occurrence(repeats: &mut HashMap<u32, u32>, e: u32) -> bool {
        if repeats.is_empty() {
            return true; // the common case
        }
        match repeats.get_mut(&e) {
            Some(count) if *count > 1 => {
                *count -= 1;
                false
            }
            Some(_) => {
                repeats.remove(&e);
                false
            }
            None => true,
        }
    }

    /// Records entry `e` at `input_id`; `first` when the request held no
    /// other occurrence of it.
    #[inline]
    fn add_occurrence(refs: &mut RequestRefs, input_id: usize, e: u32, first: bool) {
        if refs.inputs.insert_vacant(input_id, e) && !first {
            *refs.repeats.entry(e).or_insert(0) += 1;
        }
    }
}
