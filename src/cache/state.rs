//! The cache's whole state as plain data, the invariants it must satisfy, and
//! restoring a cache from such a state.
//!
//! [`PolicyCache::check_invariants`] checks a snapshot, so the rules are
//! written once, over sorted maps: with several violations the one reported is
//! always the same, and `encoder_cache.reference` reports it in the same words.

use hashbrown::HashMap;
use std::collections::{BTreeMap, BTreeSet};

use super::core::PolicyCache;
use super::entries::{Entry, Referrers};
use super::keys::{hash_key, Key};
use super::policies::{EvictionPolicy, Policy, S3FIFO_MAX_CREDIT};
use super::requests::RequestRefs;

/// A cached item as plain data.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct EntryState {
    pub num_embeds: u64,
    pub referrers: BTreeSet<String>,
}

/// What one request holds, as plain data.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct RequestState {
    /// Input position -> item.
    pub inputs: BTreeMap<usize, String>,
    /// Item -> number of the request's inputs holding it.
    pub occurrences: BTreeMap<String, u32>,
}

/// The whole state of an encoder cache, for debugging dumps and restore.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct CacheState {
    pub cache_size: u64,
    pub num_free_slots: u64,
    pub num_freeable_slots: u64,
    pub entries: BTreeMap<String, EntryState>,
    /// Unreferenced items with their sizes, oldest release (next eviction) first.
    pub freeable: Vec<(String, u64)>,
    pub requests: BTreeMap<String, RequestState>,
    /// Evicted since the last `take_freed`, in eviction order.
    pub freed: Vec<String>,
}

/// What an entry's eviction policy keeps about it, as plain data.
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct EntryPolicyState {
    /// Acquisitions since allocation (>= 1).
    pub frequency: u32,
    /// GDSF: the priority of an unreferenced entry; S3-FIFO: the hit credit of
    /// an unreferenced entry in a main lane; otherwise 0.
    pub rank: f64,
    /// The modality tag given at allocation (0 = unknown).
    pub modality: u8,
}

impl Default for EntryPolicyState {
    fn default() -> Self {
        Self { frequency: 1, rank: 0.0, modality: 0 }
    }
}

/// The policy's part of the state, beside a [`CacheState`]: the policy, its
/// per-entry data and clock, and the lookahead marks. The default is a
/// `vllm` cache without marks, whose entries were each acquired once.
#[derive(Debug, Clone, Default, PartialEq)]
pub struct PolicyState {
    pub policy: Policy,
    /// GDSF's clock, or ARC's target `p` (0 under other policies).
    pub clock: f64,
    /// By cached item; an item left out gets the default.
    pub entries: BTreeMap<String, EntryPolicyState>,
    /// Waiting request -> its distinct identifiers, in its order.
    pub waiting: BTreeMap<String, Vec<String>>,
}

/// The rules, in the order they are checked. Their text is the message prefix.
pub const SLOTS_ACCOUNTED: &str = "free + cached sizes equal cache_size";
pub const FREEABLE_UNREFERENCED: &str = "freeable holds exactly the unreferenced entries";
pub const FREEABLE_SLOTS: &str = "freeable slots equal free slots plus freeable sizes";
pub const OCCURRENCES_MATCH: &str = "every request's occurrence counts match its cached input ids";
pub const REFERRERS_COUNTED: &str = "no request id referenced by an entry that the request no longer counts";
pub const COUNTED_REFERENCED: &str = "every item a request counts is cached and referenced by it";
pub const TIERS_ORDERED: &str = "freeable lists the entries no waiting request needs before those one needs";
pub const POLICY_ORDERED: &str = "freeable follows the policy's order within each tier";

/// A broken rule: `rule` is one of the constants above, `detail` names the culprit.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct InvariantViolation {
    pub rule: &'static str,
    pub detail: String,
}

impl std::fmt::Display for InvariantViolation {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(f, "{}: {}", self.rule, self.detail)
    }
}

impl std::error::Error for InvariantViolation {}

fn broken(rule: &'static str, detail: String) -> Result<(), InvariantViolation> {
    Err(InvariantViolation { rule, detail })
}

impl CacheState {
    /// The first broken rule, if any, for a `vllm` cache without marks (see
    /// [`Self::check_with`]).
    pub fn check(&self) -> Result<(), InvariantViolation> {
        self.check_with(&PolicyState::default())
    }

    /// The first broken rule, if any, with the policy's part of the state.
    /// Eviction order is checked only as far as the policy's structure shows
    /// it; the differential tests compare it with the reference.
    pub fn check_with(&self, policy: &PolicyState) -> Result<(), InvariantViolation> {
        self.check_slots()?;
        self.check_policy(policy)
    }

    fn check_slots(&self) -> Result<(), InvariantViolation> {
        let cached: u128 = self.entries.values().map(|e| u128::from(e.num_embeds)).sum();
        if u128::from(self.num_free_slots) + cached != u128::from(self.cache_size) {
            return broken(SLOTS_ACCOUNTED, format!("{} free + {cached} cached != {}", self.num_free_slots, self.cache_size));
        }

        let mut seen = BTreeSet::new();
        for (item, size) in &self.freeable {
            if !seen.insert(item.as_str()) {
                return broken(FREEABLE_UNREFERENCED, format!("item '{item}' is listed twice"));
            }
            let Some(entry) = self.entries.get(item) else {
                return broken(FREEABLE_UNREFERENCED, format!("freeable item '{item}' is not cached"));
            };
            if !entry.referrers.is_empty() {
                return broken(
                    FREEABLE_UNREFERENCED,
                    format!("freeable item '{item}' is referenced by {} requests", entry.referrers.len()),
                );
            }
            if *size != entry.num_embeds {
                return broken(FREEABLE_UNREFERENCED, format!("freeable item '{item}' has size {size}, cached size {}", entry.num_embeds));
            }
        }
        if let Some(item) = self.entries.iter().find(|(k, e)| e.referrers.is_empty() && !seen.contains(k.as_str())) {
            return broken(FREEABLE_UNREFERENCED, format!("unreferenced item '{}' is not freeable", item.0));
        }

        let freeable: u128 = self.freeable.iter().map(|(_, n)| u128::from(*n)).sum();
        if u128::from(self.num_freeable_slots) != u128::from(self.num_free_slots) + freeable {
            return broken(
                FREEABLE_SLOTS,
                format!("{} freeable != {} free + {freeable} freeable", self.num_freeable_slots, self.num_free_slots),
            );
        }

        for (request, held) in &self.requests {
            if held.inputs.is_empty() {
                return broken(OCCURRENCES_MATCH, format!("request '{request}' holds no inputs but is recorded"));
            }
            // Every counted item, and every item an input holds, with its holding count.
            let mut counted: BTreeMap<&str, u64> = held.occurrences.keys().map(|k| (k.as_str(), 0)).collect();
            for item in held.inputs.values() {
                *counted.entry(item.as_str()).or_insert(0) += 1;
            }
            for (item, holding) in counted {
                let claimed = held.occurrences.get(item).copied().unwrap_or(0);
                if u64::from(claimed) != holding || holding == 0 {
                    return broken(
                        OCCURRENCES_MATCH,
                        format!("request '{request}' counts item '{item}' {claimed} times but holds it at {holding} inputs"),
                    );
                }
            }
        }

        for (item, entry) in &self.entries {
            for request in &entry.referrers {
                if !self.requests.get(request).is_some_and(|r| r.occurrences.contains_key(item)) {
                    return broken(
                        REFERRERS_COUNTED,
                        format!("item '{item}' is referenced by request '{request}', which does not count it"),
                    );
                }
            }
        }

        for (request, held) in &self.requests {
            for item in held.occurrences.keys() {
                match self.entries.get(item) {
                    None => return broken(COUNTED_REFERENCED, format!("request '{request}' counts item '{item}', which is not cached")),
                    Some(entry) if !entry.referrers.contains(request) => {
                        return broken(
                            COUNTED_REFERENCED,
                            format!("request '{request}' counts item '{item}' but is not among its referrers"),
                        )
                    }
                    Some(_) => {}
                }
            }
        }
        Ok(())
    }
}

impl CacheState {
    fn check_policy(&self, policy: &PolicyState) -> Result<(), InvariantViolation> {
        let needed: BTreeSet<&str> = policy.waiting.values().flatten().map(String::as_str).collect();
        let tiers: Vec<u8> = self.freeable.iter().map(|(item, _)| u8::from(needed.contains(item.as_str()))).collect();
        let mut before = 0;
        for ((item, _), &tier) in self.freeable.iter().zip(&tiers) {
            if tier < before {
                return broken(TIERS_ORDERED, format!("item '{item}', which no waiting request needs, follows one that a request needs"));
            }
            before = tier;
        }

        let meta = |item: &str| policy.entries.get(item).copied().unwrap_or_default();
        for (item, entry) in &self.entries {
            let m = meta(item);
            if m.frequency < 1 {
                return broken(POLICY_ORDERED, format!("item '{item}' has frequency 0"));
            }
            if !entry.referrers.is_empty() && m.rank != 0.0 {
                return broken(POLICY_ORDERED, format!("referenced item '{item}' has rank {:?}", m.rank));
            }
        }
        if policy.policy == Policy::Arc {
            #[allow(clippy::cast_precision_loss)]
            let most = self.cache_size as f64;
            if !(0.0..=most).contains(&policy.clock) || policy.clock.fract() != 0.0 {
                return broken(POLICY_ORDERED, format!("arc's target {:?} is not a whole number from 0 to the cache size", policy.clock));
            }
        }
        let mut previous: Option<(u8, f64)> = None;
        for ((item, _), &tier) in self.freeable.iter().zip(&tiers) {
            let EntryPolicyState { frequency, rank, .. } = meta(item);
            match policy.policy {
                Policy::Vllm if rank != 0.0 => {
                    return broken(POLICY_ORDERED, format!("item '{item}' has rank {rank:?} under vllm"));
                }
                Policy::Vllm => {}
                Policy::Gdsf | Policy::GhostLfu => {
                    if tier == 0 && (rank < policy.clock || rank.is_nan()) {
                        return broken(
                            POLICY_ORDERED,
                            format!("item '{item}' has priority {rank:?} below the clock {:?} in tier 0", policy.clock),
                        );
                    }
                    if previous.is_some_and(|(t, r)| t == tier && rank < r) {
                        return broken(POLICY_ORDERED, format!("item '{item}' has priority {rank:?}, below the one before it"));
                    }
                    previous = Some((tier, rank));
                }
                Policy::Duel => {
                    if rank < 0.0 || rank.is_nan() {
                        return broken(POLICY_ORDERED, format!("item '{item}' has priority {rank:?} under duel"));
                    }
                }
                Policy::Arc => {
                    let frequent = frequency > 1;
                    if rank != 0.0 {
                        return broken(POLICY_ORDERED, format!("item '{item}' has rank {rank:?} under arc"));
                    }
                    if previous.is_some_and(|(t, was_frequent)| t == tier && was_frequent != 0.0) && !frequent {
                        return broken(POLICY_ORDERED, format!("item '{item}' of the recent lane follows the frequent lane"));
                    }
                    previous = Some((tier, if frequent { 1.0 } else { 0.0 }));
                }
                Policy::S3Fifo => {
                    let main = frequency > 1;
                    let most = if main { f64::from(S3FIFO_MAX_CREDIT) } else { 0.0 };
                    if !(0.0..=most).contains(&rank) || rank.fract() != 0.0 {
                        return broken(POLICY_ORDERED, format!("item '{item}' has hit credit {rank:?} with frequency {frequency}"));
                    }
                    if previous.is_some_and(|(t, was_main)| t == tier && was_main != 0.0) && !main {
                        return broken(POLICY_ORDERED, format!("item '{item}' of the small queue follows the main queue"));
                    }
                    previous = Some((tier, if main { 1.0 } else { 0.0 }));
                }
            }
        }
        Ok(())
    }
}

impl<P: EvictionPolicy> PolicyCache<P> {
    /// The policy's part of the state, beside [`Self::snapshot`].
    pub fn policy_snapshot(&self) -> PolicyState {
        PolicyState {
            policy: P::POLICY,
            clock: self.policy.clock(),
            entries: self
                .entries
                .iter()
                .map(|(_, e)| {
                    let meta = EntryPolicyState { frequency: P::frequency(&e.meta), rank: P::rank(&e.meta), modality: e.modality };
                    (e.key.to_string(), meta)
                })
                .collect(),
            waiting: self.waiting.iter().map(|(r, items)| (r.to_string(), items.iter().map(ToString::to_string).collect())).collect(),
        }
    }

    /// The whole state as plain, sorted data.
    pub fn snapshot(&self) -> CacheState {
        let name = |e: u32| self.entries.get(e).key.to_string();
        CacheState {
            cache_size: self.cache_size,
            num_free_slots: self.num_free_slots,
            num_freeable_slots: self.num_freeable_slots,
            entries: self
                .entries
                .iter()
                .map(|(_, e)| {
                    let referrers = e.referrers.iter().map(|r| self.requests.get(r).id.to_string()).collect();
                    (e.key.to_string(), EntryState { num_embeds: e.num_embeds, referrers })
                })
                .collect(),
            freeable: self.freeable().map(|(k, n)| (k.to_string(), n)).collect(),
            requests: self
                .requests
                .iter()
                .map(|(_, refs)| {
                    let inputs = refs.inputs.iter().map(|(i, e)| (i, name(e))).collect();
                    let occurrences = refs.occurrences().into_iter().map(|(e, n)| (name(e), n)).collect();
                    (refs.id.to_string(), RequestState { inputs, occurrences })
                })
                .collect(),
            freed: self.freed().map(ToString::to_string).collect(),
        }
    }

    /// The first broken invariant, if any (see [`CacheState::check_with`]).
    pub fn check_invariants(&self) -> Result<(), InvariantViolation> {
        self.snapshot().check_with(&self.policy_snapshot())?;
        for (_, entry) in self.entries.iter() {
            let tier = usize::from(self.waiting_count.contains_key(&entry.key));
            if !entry.is_referenced() && P::tier_of_lane(entry.lane) != tier {
                return broken(TIERS_ORDERED, format!("item '{}' is in the wrong lookahead tier", entry.key));
            }
        }
        let mut counts: HashMap<&Key, u32> = HashMap::new();
        for key in self.waiting.values().flatten() {
            *counts.entry(key).or_insert(0) += 1;
        }
        if counts.len() != self.waiting_count.len() || counts.iter().any(|(k, n)| self.waiting_count.get(*k) != Some(n)) {
            return broken(TIERS_ORDERED, "waiting counts do not match the marks".to_owned());
        }
        Ok(())
    }

    /// A cache in exactly `state` and `policy` (whose `policy` must be `P`'s),
    /// which must satisfy every invariant.
    pub fn restore_with(state: &CacheState, policy: &PolicyState) -> Result<Self, InvariantViolation> {
        // Share one allocation per item and per request id, as the live cache does.
        fn intern<'a>(keys: &mut HashMap<&'a str, Key>, s: &'a str) -> Key {
            keys.entry(s).or_insert_with(|| Key::from(s)).clone()
        }
        state.check_with(policy)?;
        if policy.policy != P::POLICY {
            let detail = format!("a {} state restored as {}", policy.policy, P::POLICY);
            return Err(InvariantViolation { rule: POLICY_ORDERED, detail });
        }
        if let Some(item) = policy.entries.keys().find(|item| !state.entries.contains_key(*item)) {
            let detail = format!("policy data for item '{item}', which is not cached");
            return Err(InvariantViolation { rule: POLICY_ORDERED, detail });
        }
        let mut keys = HashMap::new();
        let mut key = |s| intern(&mut keys, s);
        let mut cache = Self::new(state.cache_size);
        cache.num_free_slots = state.num_free_slots;
        cache.num_freeable_slots = state.num_freeable_slots;
        cache.policy.set_clock(policy.clock);
        let mut request_slots: HashMap<&str, u32> = HashMap::new();
        for request in state.requests.keys() {
            let id = key(request);
            let hash = hash_key(&id);
            request_slots.insert(request, cache.requests.insert(RequestRefs::new(id, hash)));
        }
        let mut entry_slots: HashMap<&str, u32> = HashMap::new();
        for (item, e) in &state.entries {
            let referrers: Referrers =
                e.referrers.iter().filter_map(|r| request_slots.get(r.as_str()).copied()).fold(Referrers::None, |mut set, r| {
                    set.insert(r);
                    set
                });
            let meta = policy.entries.get(item).copied().unwrap_or_default();
            let id = key(item);
            let hash = hash_key(&id);
            let mut entry = Entry::new(id, hash, e.num_embeds, referrers, meta.modality);
            entry.meta = cache.policy.meta_with(meta.frequency, e.num_embeds);
            entry_slots.insert(item, cache.entries.insert(entry));
        }
        for (request, held) in &state.requests {
            let refs = cache.requests.get_mut(request_slots[request.as_str()]);
            for (&input_id, item) in &held.inputs {
                refs.inputs.insert_vacant(input_id, entry_slots[item.as_str()]);
            }
            refs.repeats = held.occurrences.iter().filter(|(_, n)| **n > 1).map(|(item, n)| (entry_slots[item.as_str()], n - 1)).collect();
        }
        for (request, items) in &policy.waiting {
            cache.waiting.insert(key(request), items.iter().map(|item| key(item)).collect());
        }
        for item in cache.waiting.values().flatten() {
            *cache.waiting_count.entry(item.clone()).or_insert(0) += 1;
        }
        for (item, _) in &state.freeable {
            let e = entry_slots[item.as_str()];
            let tier = usize::from(cache.waiting_count.contains_key(item.as_str()));
            let rank = policy.entries.get(item).map(|m| m.rank);
            cache.policy.release(&mut cache.entries, e, tier, rank);
        }
        cache.freed = state.freed.iter().map(|item| (key(item), hash_key(item))).collect();
        Ok(cache)
    }
}
