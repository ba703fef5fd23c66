//! [`EncoderCache`]: a cache whose policy is chosen at run time, as one enum
//! over the [`PolicyCache`] of each policy. Each call makes one `match` and
//! runs the chosen policy's monomorphic code; a caller with many operations
//! to make (the Python bindings, a step) matches once with
//! [`with_policy_cache!`](crate::with_policy_cache) and works on the typed
//! cache inside.

use hashbrown::HashMap;

use super::arc::Arc;
use super::core::PolicyCache;
use super::duel::Duel;
use super::errors::CacheError;
use super::events::StepEvents;
use super::keys::{Handle, Holding, Key, KeyArg};
use super::policies::{Gdsf, GhostLfu, Policy, S3Fifo, Vllm};
use super::requests::HeldInputs;
use super::state::{CacheState, InvariantViolation, PolicyState};
use super::stats::CacheStats;

/// The encoder cache under the policy chosen when it was built.
#[derive(Debug, Clone)]
pub enum EncoderCache {
    Vllm(PolicyCache<Vllm>),
    Gdsf(PolicyCache<Gdsf>),
    S3Fifo(PolicyCache<S3Fifo>),
    GhostLfu(PolicyCache<GhostLfu>),
    Arc(PolicyCache<Arc>),
    Duel(PolicyCache<Duel>),
}

/// `$body` with `$c` bound to the typed [`PolicyCache`] inside an
/// [`EncoderCache`] (`&` or `&mut`, as `$cache` is): one `match`, and the
/// body compiled once per policy.
#[macro_export]
macro_rules! with_policy_cache {
    ($cache:expr, $c:ident => $body:expr) => {
        match $cache {
            $crate::cache::EncoderCache::Vllm($c) => $body,
            $crate::cache::EncoderCache::Gdsf($c) => $body,
            $crate::cache::EncoderCache::S3Fifo($c) => $body,
            $crate::cache::EncoderCache::GhostLfu($c) => $body,
            $crate::cache::EncoderCache::Arc($c) => $body,
            $crate::cache::EncoderCache::Duel($c) => $body,
        }
    };
}

pub use with_policy_cache;

impl Default for EncoderCache {
    fn default() -> Self {
        Self::new(0)
    }
}

impl EncoderCache {
    /// A cache under vLLM's eviction rule.
    pub fn new(cache_size: u64) -> Self {
        Self::Vllm(PolicyCache::new(cache_size))
    }

    pub fn with_policy(cache_size: u64, policy: Policy) -> Self {
        match policy {
            Policy::Vllm => Self::Vllm(PolicyCache::new(cache_size)),
            Policy::Gdsf => Self::Gdsf(PolicyCache::new(cache_size)),
            Policy::S3Fifo => Self::S3Fifo(PolicyCache::new(cache_size)),
            Policy::GhostLfu => Self::GhostLfu(PolicyCache::new(cache_size)),
            Policy::Arc => Self::Arc(PolicyCache::new(cache_size)),
            Policy::Duel => Self::Duel(PolicyCache::new(cache_size)),
        }
    }

    /// A `vllm` cache without marks in exactly `state`, which must satisfy
    /// every invariant.
    pub fn restore(state: &CacheState) -> Result<Self, InvariantViolation> {
        Self::restore_with(state, &PolicyState::default())
    }

    /// A cache in exactly `state` and `policy`, which must satisfy every invariant.
    pub fn restore_with(state: &CacheState, policy: &PolicyState) -> Result<Self, InvariantViolation> {
        Ok(match policy.policy {
            Policy::Vllm => Self::Vllm(PolicyCache::restore_with(state, policy)?),
            Policy::Gdsf => Self::Gdsf(PolicyCache::restore_with(state, policy)?),
            Policy::S3Fifo => Self::S3Fifo(PolicyCache::restore_with(state, policy)?),
            Policy::GhostLfu => Self::GhostLfu(PolicyCache::restore_with(state, policy)?),
            Policy::Arc => Self::Arc(PolicyCache::restore_with(state, policy)?),
            Policy::Duel => Self::Duel(PolicyCache::restore_with(state, policy)?),
        })
    }

    pub fn policy(&self) -> Policy {
        with_policy_cache!(self, c => c.policy())
    }

    pub fn cache_size(&self) -> u64 {
        with_policy_cache!(self, c => c.cache_size())
    }

    pub fn num_free_slots(&self) -> u64 {
        with_policy_cache!(self, c => c.num_free_slots())
    }

    pub fn num_freeable_slots(&self) -> u64 {
        with_policy_cache!(self, c => c.num_freeable_slots())
    }

    pub fn stats(&mut self) -> CacheStats {
        with_policy_cache!(self, c => c.stats())
    }

    pub fn reset_stats(&mut self) {
        with_policy_cache!(self, c => c.reset_stats());
    }

    pub fn used_embeds(&self) -> u64 {
        with_policy_cache!(self, c => c.used_embeds())
    }

    pub fn freeable_embeds(&self) -> u64 {
        with_policy_cache!(self, c => c.freeable_embeds())
    }

    pub fn clock(&self) -> f64 {
        with_policy_cache!(self, c => c.clock())
    }

    pub fn waiting(&self) -> &HashMap<Key, Vec<Key>> {
        with_policy_cache!(self, c => c.waiting())
    }

    pub fn num_entries(&self) -> usize {
        with_policy_cache!(self, c => c.num_entries())
    }

    pub fn num_requests(&self) -> usize {
        with_policy_cache!(self, c => c.num_requests())
    }

    /// The unreferenced entries with their sizes, next eviction first.
    pub fn freeable(&self) -> Vec<(&Key, u64)> {
        with_policy_cache!(self, c => c.freeable().collect())
    }

    pub fn freed(&self) -> Vec<&Key> {
        with_policy_cache!(self, c => c.freed().collect())
    }

    pub fn item_handle<'a>(&self, identifier: impl Into<KeyArg<'a>>) -> Option<Handle> {
        let identifier = identifier.into();
        with_policy_cache!(self, c => c.item_handle(identifier))
    }

    pub fn request_handle<'a>(&self, request_id: impl Into<KeyArg<'a>>) -> Option<Handle> {
        let request_id = request_id.into();
        with_policy_cache!(self, c => c.request_handle(request_id))
    }

    pub fn handles(&self, request_id: &KeyArg<'_>, identifier: Option<&KeyArg<'_>>) -> (Option<Handle>, Option<Handle>) {
        with_policy_cache!(self, c => c.handles(request_id, identifier))
    }

    pub fn resize(&mut self, cache_size: u64) -> Result<(), CacheError> {
        with_policy_cache!(self, c => c.resize(cache_size))
    }

    pub fn mark_waiting<'a>(
        &mut self,
        request_id: impl Into<KeyArg<'a>>,
        identifiers: impl IntoIterator<Item = Key>,
    ) -> Result<(), CacheError> {
        let request_id = request_id.into();
        with_policy_cache!(self, c => c.mark_waiting(request_id, identifiers))
    }

    pub fn unmark_waiting<'a>(&mut self, request_id: impl Into<KeyArg<'a>>) -> Result<(), CacheError> {
        let request_id = request_id.into();
        with_policy_cache!(self, c => c.unmark_waiting(request_id))
    }

    pub fn reset(&mut self) {
        with_policy_cache!(self, c => c.reset());
    }

    /// The embedding count stored for `identifier`, if it is cached. A valid
    /// handle answers at once, with no call; anything else is looked up by name.
    #[allow(clippy::inline_always)] // a few loads per policy, which the compiler left out of line
    #[inline(always)]
    pub fn cached_num_embeds<'a>(&self, identifier: impl Into<KeyArg<'a>>) -> Option<u64> {
        let identifier = identifier.into();
        match with_policy_cache!(self, c => c.num_embeds_by_handle(&identifier)) {
            Some(num_embeds) => Some(num_embeds),
            None => self.cached_num_embeds_by_name(identifier),
        }
    }

    /// The look-up by name, once the handle (if any) was found stale.
    #[inline(never)]
    fn cached_num_embeds_by_name(&self, identifier: KeyArg<'_>) -> Option<u64> {
        let identifier = identifier.at(None);
        with_policy_cache!(self, c => c.cached_num_embeds(identifier))
    }

    pub fn check_and_update_cache<'a>(
        &mut self,
        request_id: impl Into<KeyArg<'a>>,
        input_id: usize,
        identifier: impl Into<KeyArg<'a>>,
    ) -> Result<bool, CacheError> {
        let (request_id, identifier) = (request_id.into(), identifier.into());
        with_policy_cache!(self, c => c.check_and_update_cache(request_id, input_id, identifier))
    }

    pub fn can_allocate(&mut self, num_embeds: u64, encoder_compute_budget: i64, num_embeds_to_schedule: i64) -> bool {
        with_policy_cache!(self, c => c.can_allocate(num_embeds, encoder_compute_budget, num_embeds_to_schedule))
    }

    pub fn allocate<'a>(
        &mut self,
        request_id: impl Into<KeyArg<'a>>,
        input_id: usize,
        identifier: impl Into<KeyArg<'a>>,
        num_embeds: u64,
    ) -> Result<(), CacheError> {
        self.allocate_tagged(request_id, input_id, identifier, num_embeds, 0).map(drop)
    }

    pub fn allocate_tagged<'a>(
        &mut self,
        request_id: impl Into<KeyArg<'a>>,
        input_id: usize,
        identifier: impl Into<KeyArg<'a>>,
        num_embeds: u64,
        modality: u8,
    ) -> Result<Holding, CacheError> {
        let (request_id, identifier) = (request_id.into(), identifier.into());
        with_policy_cache!(self, c => c.allocate_tagged(request_id, input_id, identifier, num_embeds, modality))
    }

    pub fn cached_input_ids<'a>(&self, request_id: impl Into<KeyArg<'a>>) -> Option<&HeldInputs> {
        let request_id = request_id.into();
        with_policy_cache!(self, c => c.cached_input_ids(request_id))
    }

    #[inline]
    pub fn held_inputs<'a>(&self, request_id: impl Into<KeyArg<'a>>) -> Option<(Handle, &HeldInputs)> {
        let request_id = request_id.into();
        with_policy_cache!(self, c => c.held_inputs(request_id))
    }

    pub fn holds_input<'a>(&self, request_id: impl Into<KeyArg<'a>>, input_id: usize) -> bool {
        let request_id = request_id.into();
        with_policy_cache!(self, c => c.holds_input(request_id, input_id))
    }

    pub fn free_encoder_input<'a>(&mut self, request_id: impl Into<KeyArg<'a>>, input_id: usize) -> bool {
        let request_id = request_id.into();
        with_policy_cache!(self, c => c.free_encoder_input(request_id, input_id))
    }

    pub fn free<'a>(&mut self, request_id: impl Into<KeyArg<'a>>) {
        let request_id = request_id.into();
        with_policy_cache!(self, c => c.free(request_id));
    }

    pub fn take_freed(&mut self) -> Vec<Key> {
        with_policy_cache!(self, c => c.take_freed())
    }

    pub fn enable_events(&mut self, max_pending: usize) {
        with_policy_cache!(self, c => c.enable_events(max_pending));
    }

    pub fn events_enabled(&self) -> bool {
        with_policy_cache!(self, c => c.events_enabled())
    }

    pub fn take_events(&mut self) -> Option<StepEvents> {
        with_policy_cache!(self, c => c.take_events())
    }

    pub fn cached_items(&self) -> Vec<(Key, u64, u8)> {
        with_policy_cache!(self, c => c.cached_items())
    }

    pub fn snapshot(&self) -> CacheState {
        with_policy_cache!(self, c => c.snapshot())
    }

    pub fn policy_snapshot(&self) -> PolicyState {
        with_policy_cache!(self, c => c.policy_snapshot())
    }

    pub fn check_invariants(&self) -> Result<(), InvariantViolation> {
        with_policy_cache!(self, c => c.check_invariants())
    }
}
