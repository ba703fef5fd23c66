//! Encoder-decoder models (Whisper-style) use the manager for scheduling only:
//! nothing is shared between requests, the encoder output lives until the
//! decoder has consumed it, and frees reach the workers one step late.

use crate::cache::Key;

/// The whole state of an [`EncoderDecoderCache`] as plain data. Any values
/// are consistent: vLLM's encoder-decoder bookkeeping has no invariant to keep.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct EncoderDecoderState {
    pub cache_size: u64,
    pub num_free_slots: i128,
    pub allocated: Vec<String>,
    pub to_free: Vec<String>,
}

/// vLLM 0.33's encoder-decoder bookkeeping, kept quirk for quirk: frees are not
/// checked against allocations, so `num_free_slots` is signed, and i128 so that
/// no sequence of u64-sized frees or allocations a scheduler could make overflows it.
#[derive(Debug, Clone)]
pub struct EncoderDecoderCache {
    cache_size: u64,
    num_free_slots: i128,
    /// Allocated since the last `take_freed`.
    allocated: Vec<Key>,
    /// Handed to the workers by the next `take_freed`.
    to_free: Vec<Key>,
}

impl EncoderDecoderCache {
    pub fn new(cache_size: u64) -> Self {
        Self { cache_size, num_free_slots: i128::from(cache_size), allocated: Vec::new(), to_free: Vec::new() }
    }

    pub fn cache_size(&self) -> u64 {
        self.cache_size
    }

    pub fn num_free_slots(&self) -> i128 {
        self.num_free_slots
    }

    pub fn allocated(&self) -> &[Key] {
        &self.allocated
    }

    pub fn to_free(&self) -> &[Key] {
        &self.to_free
    }

    pub fn snapshot(&self) -> EncoderDecoderState {
        let strings = |keys: &[Key]| keys.iter().map(|k| k.to_string()).collect();
        EncoderDecoderState {
            cache_size: self.cache_size,
            num_free_slots: self.num_free_slots,
            allocated: strings(&self.allocated),
            to_free: strings(&self.to_free),
        }
    }

    pub fn restore(state: &EncoderDecoderState) -> Self {
        let keys = |items: &[String]| items.iter().map(|s| Key::from(s.as_str())).collect();
        Self {
            cache_size: state.cache_size,
            num_free_slots: state.num_free_slots,
            allocated: keys(&state.allocated),
            to_free: keys(&state.to_free),
        }
    }

    pub fn reset(&mut self) {
        self.num_free_slots = i128::from(self.cache_size);
        self.allocated.clear();
        self.to_free.clear();
    }

    pub fn can_allocate(&self, num_embeds: u64, encoder_compute_budget: i64, num_embeds_to_schedule: i64) -> bool {
        let num_embeds = i128::from(num_embeds);
        num_embeds <= i128::from(encoder_compute_budget) && num_embeds + i128::from(num_embeds_to_schedule) <= self.num_free_slots
    }

    pub fn allocate(&mut self, identifier: Key, num_embeds: u64) {
        self.num_free_slots -= i128::from(num_embeds);
        self.allocated.push(identifier);
    }

    pub fn free_encoder_input(&mut self, num_embeds: u64) {
        self.num_free_slots += i128::from(num_embeds);
    }

    /// The workers free an encoder output only after the step that consumed it
    /// ran, so this step's allocations are reported one call later.
    pub fn take_freed(&mut self) -> Vec<Key> {
        let allocated = std::mem::take(&mut self.allocated);
        std::mem::replace(&mut self.to_free, allocated)
    }
}
