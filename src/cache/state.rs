//! The cache's whole state as plain data, the invariants it must satisfy, and
//! restoring a cache from such a state.
//!
//! [`EncoderCache::check_invariants`] checks a snapshot, so the rules are
//! written once, over sorted maps: with several violations the one reported is
//! always the same, and `encoder_cache.reference` reports it in the same words.
//! A child module of `cache` so that `restore` can build the private fields.

use std::collections::{BTreeMap, BTreeSet};
use std::sync::Arc;

use hashbrown::HashMap;

use super::{EncoderCache, Entry, Key, Order, Policy, Referrers, RequestRefs, S3FIFO_MAX_CREDIT};

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

/// The whole state of an [`EncoderCache`], for debugging dumps and restore.
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
    /// GDSF's clock (0 under other policies).
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
        let mut previous: Option<(u8, f64)> = None;
        for ((item, _), &tier) in self.freeable.iter().zip(&tiers) {
            let EntryPolicyState { frequency, rank, .. } = meta(item);
            match policy.policy {
                Policy::Vllm if rank != 0.0 => {
                    return broken(POLICY_ORDERED, format!("item '{item}' has rank {rank:?} under vllm"));
                }
                Policy::Vllm => {}
                Policy::Gdsf => {
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

impl EncoderCache {
    /// The policy's part of the state, beside [`Self::snapshot`].
    pub fn policy_snapshot(&self) -> PolicyState {
        PolicyState {
            policy: self.order.policy,
            clock: self.clock,
            entries: self
                .entries
                .iter()
                .map(|(k, e)| (k.to_string(), EntryPolicyState { frequency: e.frequency, rank: e.rank, modality: e.modality }))
                .collect(),
            waiting: self.waiting.iter().map(|(r, items)| (r.to_string(), items.iter().map(ToString::to_string).collect())).collect(),
        }
    }

    /// The whole state as plain, sorted data.
    pub fn snapshot(&self) -> CacheState {
        CacheState {
            cache_size: self.cache_size,
            num_free_slots: self.num_free_slots,
            num_freeable_slots: self.num_freeable_slots,
            entries: self
                .entries
                .iter()
                .map(|(k, e)| {
                    let referrers = e.referrers.iter().map(ToString::to_string).collect();
                    (k.to_string(), EntryState { num_embeds: e.num_embeds, referrers })
                })
                .collect(),
            freeable: self.freeable().map(|(k, n)| (k.to_string(), n)).collect(),
            requests: self
                .requests
                .iter()
                .map(|(r, refs)| {
                    let inputs = refs.inputs.iter().map(|(i, k)| (i, k.to_string())).collect();
                    let occurrences = refs.occurrences().into_iter().map(|(k, n)| (k.to_string(), n)).collect();
                    (r.to_string(), RequestState { inputs, occurrences })
                })
                .collect(),
            freed: self.freed.iter().map(ToString::to_string).collect(),
        }
    }

    /// The first broken invariant, if any (see [`CacheState::check_with`]).
    pub fn check_invariants(&self) -> Result<(), InvariantViolation> {
        self.snapshot().check_with(&self.policy_snapshot())?;
        let tier_of = |key: &Key| usize::from(self.waiting_count.contains_key(key));
        for (key, entry) in &self.entries {
            if entry.referrers.is_empty() && self.order.tier_of_lane(usize::from(entry.lane)) != tier_of(key) {
                return broken(TIERS_ORDERED, format!("item '{key}' is in the wrong lookahead tier"));
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

    /// A `vllm` cache without marks in exactly `state`, which must satisfy
    /// every invariant.
    pub fn restore(state: &CacheState) -> Result<Self, InvariantViolation> {
        Self::restore_with(state, &PolicyState::default())
    }

    /// A cache in exactly `state` and `policy`, which must satisfy every invariant.
    pub fn restore_with(state: &CacheState, policy: &PolicyState) -> Result<Self, InvariantViolation> {
        // Share one allocation per item and per request id, as the live cache does.
        fn intern<'a>(keys: &mut HashMap<&'a str, Key>, s: &'a str) -> Key {
            keys.entry(s).or_insert_with(|| Arc::from(s)).clone()
        }
        state.check_with(policy)?;
        if let Some(item) = policy.entries.keys().find(|item| !state.entries.contains_key(*item)) {
            let detail = format!("policy data for item '{item}', which is not cached");
            return Err(InvariantViolation { rule: POLICY_ORDERED, detail });
        }
        let mut keys = HashMap::new();
        let mut key = |s| intern(&mut keys, s);
        let mut entries: HashMap<Key, Entry> = state
            .entries
            .iter()
            .map(|(item, e)| {
                let referrers: Referrers = e.referrers.iter().map(|r| key(r)).collect();
                let meta = policy.entries.get(item).copied().unwrap_or_default();
                let mut entry = Entry::new(e.num_embeds, referrers, meta.modality);
                entry.frequency = meta.frequency;
                (key(item), entry)
            })
            .collect();
        let waiting: HashMap<Key, Vec<Key>> =
            policy.waiting.iter().map(|(request, items)| (key(request), items.iter().map(|item| key(item)).collect())).collect();
        let mut waiting_count: HashMap<Key, u32> = HashMap::new();
        for item in waiting.values().flatten() {
            *waiting_count.entry(item.clone()).or_insert(0) += 1;
        }
        let mut order = Order::new(policy.policy);
        let mut last_stamp = 0;
        for (item, _) in &state.freeable {
            let Some((item, entry)) = entries.get_key_value_mut(item.as_str()) else {
                let detail = format!("freeable item '{item}' is not cached");
                return Err(InvariantViolation { rule: FREEABLE_UNREFERENCED, detail });
            };
            let tier = usize::from(waiting_count.contains_key(item));
            let rank = policy.entries.get(item.as_ref()).map(|m| m.rank);
            EncoderCache::place(&mut order, &mut last_stamp, policy.clock, item.clone(), entry, tier, rank);
        }
        let requests = state
            .requests
            .iter()
            .map(|(request, held)| {
                let inputs = held.inputs.iter().map(|(i, item)| (*i, key(item))).collect();
                let repeats = held.occurrences.iter().filter(|(_, n)| **n > 1).map(|(item, n)| (key(item), n - 1)).collect();
                (key(request), RequestRefs { inputs, repeats })
            })
            .collect();
        let freed = state.freed.iter().map(|item| key(item)).collect();
        Ok(Self {
            cache_size: state.cache_size,
            num_free_slots: state.num_free_slots,
            num_freeable_slots: state.num_freeable_slots,
            entries,
            order,
            last_stamp,
            clock: policy.clock,
            requests,
            freed,
            waiting,
            waiting_count,
            stats: super::CacheStats::default(),
            evicted: super::Evicted::default(),
        })
    }
}
