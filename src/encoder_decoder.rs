//! Encoder-decoder models (Whisper-style) use the manager for scheduling only:
//! nothing is shared between requests, the encoder output lives until the
//! decoder has consumed it, and frees reach the workers one step late.
//!
//! Unlike vLLM 0.33, each allocated input is freed once: vLLM adds an input's
//! size back on every `free_encoder_input`, and its scheduler frees every
//! input of a decoding request on every step, so its free-slot count climbs
//! past `cache_size` (vLLM issue #55733). Here the cache knows which inputs
//! each request holds, and a free of an input it does not hold changes nothing.

use std::collections::BTreeMap;

use hashbrown::HashMap;

use crate::cache::state::{InvariantViolation, SLOTS_ACCOUNTED};
use crate::cache::{shrink_when_sparse, CacheError, Key, KeyArg};

/// The whole state of an [`EncoderDecoderCache`] as plain data.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct EncoderDecoderState {
    pub cache_size: u64,
    pub num_free_slots: u64,
    /// Request id -> input id -> embeddings, for every input allocated and not yet freed.
    pub held: BTreeMap<String, BTreeMap<usize, u64>>,
    pub allocated: Vec<String>,
    pub to_free: Vec<String>,
}

impl EncoderDecoderState {
    /// The one rule: the free slots and the held inputs' sizes add up to `cache_size`.
    pub fn check(&self) -> Result<(), InvariantViolation> {
        let held: u128 = self.held.values().flat_map(BTreeMap::values).map(|&n| u128::from(n)).sum();
        if held + u128::from(self.num_free_slots) != u128::from(self.cache_size) {
            return Err(InvariantViolation {
                rule: SLOTS_ACCOUNTED,
                detail: format!("{} free + {held} held != cache_size {}", self.num_free_slots, self.cache_size),
            });
        }
        Ok(())
    }
}

/// vLLM 0.33's encoder-decoder bookkeeping, with each input freed once.
#[derive(Debug, Clone)]
pub struct EncoderDecoderCache {
    cache_size: u64,
    num_free_slots: u64,
    /// Each request's allocated inputs that are not freed yet, with their sizes.
    held: HashMap<Key, BTreeMap<usize, u64>>,
    /// Allocated since the last `take_freed`.
    allocated: Vec<Key>,
    /// Handed to the workers by the next `take_freed`.
    to_free: Vec<Key>,
}

impl EncoderDecoderCache {
    pub fn new(cache_size: u64) -> Self {
        Self { cache_size, num_free_slots: cache_size, held: HashMap::new(), allocated: Vec::new(), to_free: Vec::new() }
    }

    pub fn cache_size(&self) -> u64 {
        self.cache_size
    }

    pub fn num_free_slots(&self) -> u64 {
        self.num_free_slots
    }

    pub fn allocated(&self) -> &[Key] {
        &self.allocated
    }

    pub fn to_free(&self) -> &[Key] {
        &self.to_free
    }

    /// The input ids `request_id` holds, ascending.
    pub fn held_inputs<'a>(&self, request_id: impl Into<KeyArg<'a>>) -> impl Iterator<Item = usize> + '_ {
        self.held.get(request_id.into().as_str()).into_iter().flat_map(BTreeMap::keys).copied()
    }

    pub fn snapshot(&self) -> EncoderDecoderState {
        let strings = |keys: &[Key]| keys.iter().map(ToString::to_string).collect();
        EncoderDecoderState {
            cache_size: self.cache_size,
            num_free_slots: self.num_free_slots,
            held: self.held.iter().map(|(request, inputs)| (request.to_string(), inputs.clone())).collect(),
            allocated: strings(&self.allocated),
            to_free: strings(&self.to_free),
        }
    }

    pub fn check_invariants(&self) -> Result<(), InvariantViolation> {
        self.snapshot().check()
    }

    /// A cache in `state`, or the rule it breaks.
    pub fn restore(state: &EncoderDecoderState) -> Result<Self, InvariantViolation> {
        state.check()?;
        let keys = |items: &[String]| items.iter().map(|s| Key::from(s.as_str())).collect();
        Ok(Self {
            cache_size: state.cache_size,
            num_free_slots: state.num_free_slots,
            held: state
                .held
                .iter()
                .filter(|(_, inputs)| !inputs.is_empty())
                .map(|(request, inputs)| (Key::from(request.as_str()), inputs.clone()))
                .collect(),
            allocated: keys(&state.allocated),
            to_free: keys(&state.to_free),
        })
    }

    pub fn reset(&mut self) {
        self.num_free_slots = self.cache_size;
        self.held.clear();
        self.allocated.clear();
        self.to_free.clear();
    }

    /// Changes the capacity; refused, changing nothing, below what the held inputs take.
    pub fn resize(&mut self, cache_size: u64) -> Result<(), CacheError> {
        let used = self.cache_size - self.num_free_slots;
        if cache_size < used {
            return Err(CacheError::ReferencedExceedSize { cache_size, referenced: used });
        }
        self.num_free_slots = cache_size - used;
        self.cache_size = cache_size;
        Ok(())
    }

    pub fn can_allocate(&self, num_embeds: u64, encoder_compute_budget: i64, num_embeds_to_schedule: i64) -> bool {
        let num_embeds = i128::from(num_embeds);
        num_embeds <= i128::from(encoder_compute_budget)
            && num_embeds + i128::from(num_embeds_to_schedule) <= i128::from(self.num_free_slots)
    }

    /// Reserves `num_embeds` for input `input_id` of `request_id`. Refused,
    /// changing nothing, for an input the request already holds or without room.
    pub fn allocate<'a>(
        &mut self,
        request_id: impl Into<KeyArg<'a>>,
        input_id: usize,
        identifier: Key,
        num_embeds: u64,
    ) -> Result<(), CacheError> {
        let request_id = request_id.into();
        if num_embeds > self.num_free_slots {
            return Err(CacheError::InsufficientSpace {
                identifier: identifier.to_string(),
                needed: num_embeds,
                free: self.num_free_slots,
                freeable: self.num_free_slots,
            });
        }
        if self.held.get(request_id.as_str()).is_some_and(|inputs| inputs.contains_key(&input_id)) {
            return Err(CacheError::InputAllocated { request_id: request_id.as_str().to_owned(), input_id });
        }
        self.held.entry_ref(request_id.as_str()).or_default().insert(input_id, num_embeds);
        self.num_free_slots -= num_embeds;
        self.allocated.push(identifier);
        Ok(())
    }

    /// Gives back the slots of one held input; false (and nothing changes) if
    /// the request does not hold it, such as an input freed already.
    pub fn free_encoder_input<'a>(&mut self, request_id: impl Into<KeyArg<'a>>, input_id: usize) -> bool {
        let request_id = request_id.into();
        let Some(inputs) = self.held.get_mut(request_id.as_str()) else {
            return false;
        };
        let Some(num_embeds) = inputs.remove(&input_id) else {
            return false;
        };
        if inputs.is_empty() {
            self.held.remove(request_id.as_str());
            shrink_when_sparse(&mut self.held);
        }
        self.num_free_slots += num_embeds;
        true
    }

    /// Gives back the slots of every input the request holds.
    pub fn free<'a>(&mut self, request_id: impl Into<KeyArg<'a>>) {
        if let Some(inputs) = self.held.remove(request_id.into().as_str()) {
            shrink_when_sparse(&mut self.held);
            self.num_free_slots += inputs.values().sum::<u64>();
        }
    }

    /// The workers free an encoder output only after the step that consumed it
    /// ran, so this step's allocations are reported one call later.
    pub fn take_freed(&mut self) -> Vec<Key> {
        let allocated = std::mem::take(&mut self.allocated);
        std::mem::replace(&mut self.to_free, allocated)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn an_input_is_freed_once_however_often_it_is_freed() {
        let mut cache = EncoderDecoderCache::new(100);
        cache.allocate("r", 0, Key::from("audio"), 60).unwrap();
        assert!(cache.free_encoder_input("r", 0));
        for _ in 0..5 {
            assert!(!cache.free_encoder_input("r", 0), "a decode step frees the input again");
        }
        cache.free("r");
        assert_eq!(cache.num_free_slots(), 100);
        assert_eq!(cache.check_invariants(), Ok(()));
    }

    #[test]
    fn refused_allocations_and_resizes_change_nothing() {
        let mut cache = EncoderDecoderCache::new(100);
        cache.allocate("r", 0, Key::from("a"), 60).unwrap();
        let before = cache.snapshot();
        assert!(matches!(cache.allocate("s", 0, Key::from("b"), 50), Err(CacheError::InsufficientSpace { .. })));
        assert!(matches!(cache.allocate("r", 0, Key::from("a"), 10), Err(CacheError::InputAllocated { .. })));
        assert!(matches!(cache.resize(59), Err(CacheError::ReferencedExceedSize { .. })));
        assert_eq!(cache.snapshot(), before);
        cache.resize(60).unwrap();
        assert_eq!((cache.cache_size(), cache.num_free_slots()), (60, 0));
    }

    #[test]
    fn restore_refuses_a_count_that_does_not_add_up() {
        let mut cache = EncoderDecoderCache::new(100);
        cache.allocate("r", 1, Key::from("a"), 30).unwrap();
        let mut state = cache.snapshot();
        assert_eq!(EncoderDecoderCache::restore(&state).unwrap().snapshot(), state);
        state.num_free_slots = 100;
        assert_eq!(EncoderDecoderCache::restore(&state).unwrap_err().rule, SLOTS_ACCOUNTED);
    }
}
