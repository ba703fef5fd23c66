//! Encoder-decoder models (Whisper-style) use the manager for scheduling only:
//! nothing is shared between requests, the encoder output lives until the
//! decoder has consumed it, and frees reach the workers one step late.

use crate::cache::Key;

/// vLLM 0.33's encoder-decoder bookkeeping, kept quirk for quirk: frees are not
/// checked against allocations, so `num_free_slots` is signed.
#[derive(Debug, Clone)]
pub struct EncoderDecoderCache {
    cache_size: u64,
    num_free_slots: i64,
    /// Allocated since the last `take_freed`.
    allocated: Vec<Key>,
    /// Handed to the workers by the next `take_freed`.
    to_free: Vec<Key>,
}

impl EncoderDecoderCache {
    pub fn new(cache_size: u64) -> Self {
        Self { cache_size, num_free_slots: cache_size as i64, allocated: Vec::new(), to_free: Vec::new() }
    }

    pub fn cache_size(&self) -> u64 {
        self.cache_size
    }

    pub fn num_free_slots(&self) -> i64 {
        self.num_free_slots
    }

    pub fn allocated(&self) -> &[Key] {
        &self.allocated
    }

    pub fn to_free(&self) -> &[Key] {
        &self.to_free
    }

    pub fn reset(&mut self) {
        self.num_free_slots = self.cache_size as i64;
        self.allocated.clear();
        self.to_free.clear();
    }

    pub fn can_allocate(&self, num_embeds: u64, encoder_compute_budget: i64, num_embeds_to_schedule: i64) -> bool {
        let num_embeds = i128::from(num_embeds);
        num_embeds <= i128::from(encoder_compute_budget)
            && num_embeds + i128::from(num_embeds_to_schedule) <= i128::from(self.num_free_slots)
    }

    pub fn allocate(&mut self, identifier: Key, num_embeds: u64) {
        self.num_free_slots -= num_embeds as i64;
        self.allocated.push(identifier);
    }

    pub fn free_encoder_input(&mut self, num_embeds: u64) {
        self.num_free_slots += num_embeds as i64;
    }

    /// The workers free an encoder output only after the step that consumed it
    /// ran, so this step's allocations are reported one call later.
    pub fn take_freed(&mut self) -> Vec<Key> {
        let allocated = std::mem::take(&mut self.allocated);
        std::mem::replace(&mut self.to_free, allocated)
    }
}
