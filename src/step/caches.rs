//! [`StepCache`]: the cache operations a step uses, and how each cache
//! serves them: a policy's cache directly, the run-time policy choice through
//! one `match` per operation, and the encoder-decoder cache by its own rules.

use crate::cache::{CacheError, EncoderCache, EvictionPolicy, HeldInputs, Key, KeyArg, PolicyCache};
use crate::encoder_decoder::EncoderDecoderCache;

use super::{allocate_inputs, free_inputs_before, try_schedule, Item, Items, Scheduled, StepArgs, StepError};

/// The cache operations a step uses, with each manager's rules.
pub trait StepCache {
    /// Encoder-decoder rules: every item is encoded before the first decoder
    /// token (so all are in the window until then and none after), nothing is
    /// shared between requests, and no item is ever split or rolled back for
    /// chunking.
    const ENCODER_DECODER: bool;
    fn cached_num_embeds(&self, item: &Item) -> Option<u64>;
    fn check_and_update_cache(&mut self, request_id: KeyArg<'_>, input_id: usize, item: &Item) -> Result<bool, CacheError>;
    fn can_allocate(&mut self, num_embeds: u64, encoder_compute_budget: i64, num_embeds_to_schedule: i64) -> bool;
    fn allocate(&mut self, request_id: KeyArg<'_>, input_id: usize, item: &Item) -> Result<(), CacheError>;
    /// The request's held inputs, in no particular order.
    fn held_inputs(&self, request_id: KeyArg<'_>, num_items: usize) -> impl Iterator<Item = usize> + '_;
    /// Frees the request's `input_ids`: all of them, or none on an error.
    fn free_inputs<I: Items + ?Sized>(&mut self, request_id: KeyArg<'_>, items: &I, input_ids: &[usize]) -> Result<(), StepError>;

    /// [`try_schedule`] on this cache.
    fn schedule<I: Items + ?Sized, E: From<StepError>>(
        &mut self,
        request_id: KeyArg<'_>,
        items: &I,
        args: StepArgs,
        has_remote_item: &mut dyn FnMut(&Key) -> Result<bool, E>,
    ) -> Result<Scheduled, E>
    where
        Self: Sized,
    {
        try_schedule(self, request_id, items, args, has_remote_item)
    }

    /// [`allocate_inputs`] on this cache.
    fn allocate_all<I: Items + ?Sized>(
        &mut self,
        request_id: KeyArg<'_>,
        items: &I,
        input_ids: &[usize],
        repeated: &[usize],
    ) -> Result<(), StepError>
    where
        Self: Sized,
    {
        allocate_inputs(self, request_id, items, input_ids, repeated)
    }

    /// [`free_inputs_before`] on this cache.
    fn free_before<I: Items + ?Sized>(
        &mut self,
        request_id: KeyArg<'_>,
        items: &I,
        position: i64,
        decoder_started: bool,
    ) -> Result<Vec<usize>, StepError>
    where
        Self: Sized,
    {
        free_inputs_before(self, request_id, items, position, decoder_started)
    }
}

impl<P: EvictionPolicy> StepCache for PolicyCache<P> {
    const ENCODER_DECODER: bool = false;

    #[inline]
    fn cached_num_embeds(&self, item: &Item) -> Option<u64> {
        PolicyCache::cached_num_embeds(self, item.key())
    }

    #[inline]
    fn check_and_update_cache(&mut self, request_id: KeyArg<'_>, input_id: usize, item: &Item) -> Result<bool, CacheError> {
        PolicyCache::check_and_update_cache(self, request_id, input_id, item.key())
    }

    #[inline]
    fn can_allocate(&mut self, num_embeds: u64, encoder_compute_budget: i64, num_embeds_to_schedule: i64) -> bool {
        PolicyCache::can_allocate(self, num_embeds, encoder_compute_budget, num_embeds_to_schedule)
    }

    #[inline]
    fn allocate(&mut self, request_id: KeyArg<'_>, input_id: usize, item: &Item) -> Result<(), CacheError> {
        PolicyCache::allocate_tagged(self, request_id, input_id, item.key(), item.num_embeds, item.modality).map(drop)
    }

    fn held_inputs(&self, request_id: KeyArg<'_>, _num_items: usize) -> impl Iterator<Item = usize> + '_ {
        self.cached_input_ids(request_id).into_iter().flat_map(HeldInputs::positions)
    }

    /// By position alone: no item record is needed.
    fn free_inputs<I: Items + ?Sized>(&mut self, request_id: KeyArg<'_>, _items: &I, input_ids: &[usize]) -> Result<(), StepError> {
        for &input_id in input_ids {
            self.free_encoder_input(request_id, input_id);
        }
        Ok(())
    }
}

/// Through the run-time policy choice, one `match` per operation (for tests
/// and occasional callers; the bindings match once per call instead).
impl StepCache for EncoderCache {
    const ENCODER_DECODER: bool = false;

    fn cached_num_embeds(&self, item: &Item) -> Option<u64> {
        crate::with_policy_cache!(self, c => StepCache::cached_num_embeds(c, item))
    }

    fn check_and_update_cache(&mut self, request_id: KeyArg<'_>, input_id: usize, item: &Item) -> Result<bool, CacheError> {
        crate::with_policy_cache!(self, c => StepCache::check_and_update_cache(c, request_id, input_id, item))
    }

    fn can_allocate(&mut self, num_embeds: u64, encoder_compute_budget: i64, num_embeds_to_schedule: i64) -> bool {
        EncoderCache::can_allocate(self, num_embeds, encoder_compute_budget, num_embeds_to_schedule)
    }

    fn allocate(&mut self, request_id: KeyArg<'_>, input_id: usize, item: &Item) -> Result<(), CacheError> {
        crate::with_policy_cache!(self, c => StepCache::allocate(c, request_id, input_id, item))
    }

    fn held_inputs(&self, request_id: KeyArg<'_>, _num_items: usize) -> impl Iterator<Item = usize> + '_ {
        self.cached_input_ids(request_id).into_iter().flat_map(HeldInputs::positions)
    }

    fn free_inputs<I: Items + ?Sized>(&mut self, request_id: KeyArg<'_>, _items: &I, input_ids: &[usize]) -> Result<(), StepError> {
        for &input_id in input_ids {
            self.free_encoder_input(request_id, input_id);
        }
        Ok(())
    }

    fn schedule<I: Items + ?Sized, E: From<StepError>>(
        &mut self,
        request_id: KeyArg<'_>,
        items: &I,
        args: StepArgs,
        has_remote_item: &mut dyn FnMut(&Key) -> Result<bool, E>,
    ) -> Result<Scheduled, E> {
        crate::with_policy_cache!(self, c => try_schedule(c, request_id, items, args, has_remote_item))
    }

    fn allocate_all<I: Items + ?Sized>(
        &mut self,
        request_id: KeyArg<'_>,
        items: &I,
        input_ids: &[usize],
        repeated: &[usize],
    ) -> Result<(), StepError> {
        crate::with_policy_cache!(self, c => allocate_inputs(c, request_id, items, input_ids, repeated))
    }

    fn free_before<I: Items + ?Sized>(
        &mut self,
        request_id: KeyArg<'_>,
        items: &I,
        position: i64,
        decoder_started: bool,
    ) -> Result<Vec<usize>, StepError> {
        crate::with_policy_cache!(self, c => free_inputs_before(c, request_id, items, position, decoder_started))
    }
}

impl StepCache for EncoderDecoderCache {
    const ENCODER_DECODER: bool = true;

    fn cached_num_embeds(&self, _item: &Item) -> Option<u64> {
        None
    }

    fn check_and_update_cache(&mut self, _request_id: KeyArg<'_>, _input_id: usize, _item: &Item) -> Result<bool, CacheError> {
        Ok(false)
    }

    fn can_allocate(&mut self, num_embeds: u64, encoder_compute_budget: i64, num_embeds_to_schedule: i64) -> bool {
        EncoderDecoderCache::can_allocate(self, num_embeds, encoder_compute_budget, num_embeds_to_schedule)
    }

    fn allocate(&mut self, request_id: KeyArg<'_>, input_id: usize, item: &Item) -> Result<(), CacheError> {
        EncoderDecoderCache::allocate(self, request_id, input_id, item.identifier.clone(), item.num_embeds)
    }

    /// The inputs allocated and not freed yet.
    fn held_inputs(&self, request_id: KeyArg<'_>, _num_items: usize) -> impl Iterator<Item = usize> + '_ {
        EncoderDecoderCache::held_inputs(self, request_id)
    }

    /// By position alone: the cache knows each held input's size.
    fn free_inputs<I: Items + ?Sized>(&mut self, request_id: KeyArg<'_>, _items: &I, input_ids: &[usize]) -> Result<(), StepError> {
        for &input_id in input_ids {
            self.free_encoder_input(request_id, input_id);
        }
        Ok(())
    }
}
