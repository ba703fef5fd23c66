//! Per-request records: what a manager has read of each request object, so
//! that later calls, per-call or step-level, need not read it again.
//!
//! One [`RequestRecord`] per request object, holding the object so that its
//! identity (the map key) cannot be reused while the record lives. It keeps
//! the request's id (read once, hashed once) with the core's handle for it,
//! and an [`InputRecord`] per input: what was read of `mm_features[i]`
//! (identifier, modality, position, `is_embed`; `get_num_encoder_embeds(i)`
//! for the per-call methods) and the core's handle for its entry. A call that
//! finds a valid handle names the request and item to the core without
//! hashing or comparing a string.
//!
//! The per-call methods index the `mm_features` list they last read (vLLM
//! extends a request's list in place, never replaces it once scheduled),
//! check `mm_features[i]` by identity on every call and read a new or
//! replaced item afresh, and the attribute itself only for an index past
//! the list; the step-level methods read positions the
//! first time they see an item and the rest when a step first needs it (see
//! `step`). A vLLM request never changes these once it has them.
//!
//! Records go with `free(request)` (vLLM frees every request that finishes,
//! is aborted or is preempted) and `reset()`. They are only a cache of reads,
//! so a caller that never frees is bounded by [`MAX_RECORDS`]: past it, the
//! oldest record goes (and its request is read afresh if it comes again).
//! Explicit frees cost nothing extra per call, where a weak reference per
//! request (so a dropped request's record went by itself) costs a callback
//! object per request and an identity check on every call.

use std::collections::VecDeque;

use hashbrown::HashMap;
use pyo3::gc::{PyTraverseError, PyVisit};
use pyo3::prelude::*;
use pyo3::types::{PyList, PySet};

use crate::cache::{hash_key, Handle, Key, KeyArg};
use crate::step::{Item, Items, StepError};

/// The most request objects a manager keeps records of.
pub(crate) const MAX_RECORDS: usize = 4096;

/// What was read of one input.
#[derive(Default)]
pub(crate) struct InputRecord {
    /// The `mm_features[i]` object the per-call reads were made from.
    pub(crate) feature: Option<Py<PyAny>>,
    /// `feature.identifier` with its hash.
    pub(crate) identifier: Option<(Key, u64)>,
    /// The item's modality tag (see `modality`).
    pub(crate) modality: Option<u8>,
    /// `request.get_num_encoder_embeds(i)`, as the per-call methods read it.
    pub(crate) num_embeds: Option<u64>,
    /// `(offset, length)` of the item's placeholder, for the step-level methods.
    pub(crate) position: Option<(u64, u64)>,
    /// The full item, once a step needed it.
    pub(crate) item: Option<Item>,
    /// The core's handle for the item's entry, when it was last cached.
    pub(crate) handle: Option<Handle>,
}

impl InputRecord {
    /// The identifier as the core takes it: hashed, with its last handle.
    pub(crate) fn key(&self) -> Option<KeyArg<'_>> {
        self.identifier.as_ref().map(|(key, hash)| KeyArg::hashed(key, *hash).at(self.handle))
    }
}

/// A `get_cached_input_ids` answer and the holdings it was made from,
/// named by the request's handle and their count of changes (see
/// `EncoderCache::held_inputs`): comparing two numbers tells whether the
/// request still holds the same inputs.
pub(crate) struct HeldAnswer {
    pub(crate) request: Handle,
    pub(crate) changes: u64,
    pub(crate) set: Py<PySet>,
}

/// Everything a manager keeps of one request object.
pub(crate) struct RequestRecord {
    request: Py<PyAny>,
    id: Key,
    id_hash: u64,
    /// The core's handle for the request, while it holds inputs.
    pub(crate) handle: Option<Handle>,
    pub(crate) inputs: Vec<InputRecord>,
    /// Whether the record has its place in [`Records`]' age order.
    aged: bool,
    /// The last `get_cached_input_ids` answer, handed out again while the
    /// request's holdings stay the same.
    pub(crate) held_ids: Option<Box<HeldAnswer>>,
    /// The `request.mm_features` list the per-call methods last read items
    /// from, which they index again instead of reading the attribute.
    pub(crate) features: Option<Py<PyList>>,
}

impl RequestRecord {
    pub(crate) fn new(request: &Bound<'_, PyAny>, id: &str) -> Self {
        let id = Key::from(id);
        Self {
            request: request.clone().unbind(),
            id_hash: hash_key(&id),
            id,
            handle: None,
            inputs: Vec::new(),
            aged: false,
            held_ids: None,
            features: None,
        }
    }

    /// Records `features` (`request.mm_features` as just read, if a list) for later calls to index.
    #[inline]
    pub(crate) fn keep_features(&mut self, features: Option<&Bound<'_, PyList>>) {
        match features {
            Some(list) if !self.features.as_ref().is_some_and(|kept| list.is(kept)) => self.features = Some(list.clone().unbind()),
            Some(_) => {}
            None => self.features = None,
        }
    }

    /// `mm_features[input_id]` of the recorded `mm_features` list, if it has that many items.
    #[inline]
    pub(crate) fn recorded_feature<'py>(&self, py: Python<'py>, input_id: usize) -> Option<Bound<'py, PyAny>> {
        // Indexing a list runs no Python code, so the manager may stay
        // borrowed. Past the end, the IndexError it raises is dropped: the
        // caller reads `request.mm_features` afresh (rare), and the common
        // case makes one call into Python fewer than checking the length.
        self.features.as_ref()?.bind(py).get_item(input_id).ok()
    }

    /// The recorded `mm_features` list.
    pub(crate) fn recorded_features<'py>(&self, py: Python<'py>) -> Option<Bound<'py, PyList>> {
        self.features.as_ref().map(|list| list.bind(py).clone())
    }

    /// Notes the core's handles for the request and for input `input_id`.
    #[inline]
    pub(crate) fn set_handles(&mut self, input_id: usize, request: Option<Handle>, item: Option<Handle>) {
        self.handle = request;
        if let Some(input) = self.inputs.get_mut(input_id) {
            input.handle = item;
        }
    }

    /// The request id as the core takes it: hashed, with its last handle.
    pub(crate) fn id(&self) -> KeyArg<'_> {
        KeyArg::hashed(&self.id, self.id_hash).at(self.handle)
    }

    /// The record of input `input_id` if it was read from `feature`.
    pub(crate) fn input(&self, input_id: usize, feature: &Bound<'_, PyAny>) -> Option<&InputRecord> {
        self.inputs.get(input_id).filter(|input| input.feature.as_ref().is_some_and(|f| f.is(feature)))
    }

    /// The record of input `input_id` as read from `feature`: emptied first
    /// if it was read from another object.
    pub(crate) fn input_mut(&mut self, input_id: usize, feature: &Bound<'_, PyAny>) -> &mut InputRecord {
        self.grow(input_id + 1);
        let input = &mut self.inputs[input_id];
        if !input.feature.as_ref().is_some_and(|f| f.is(feature)) {
            if input.feature.is_some() || input.position.is_some() {
                *input = InputRecord::default();
            }
            self.inputs[input_id].feature = Some(feature.clone().unbind());
        }
        &mut self.inputs[input_id]
    }

    /// Room for the records of a request with `num_items` inputs, made
    /// once, so that reading a long request item by item does not regrow
    /// (and copy) its records at every doubling.
    #[inline]
    pub(crate) fn reserve_inputs(&mut self, num_items: usize) {
        if self.inputs.capacity() < num_items {
            self.inputs.reserve_exact(num_items - self.inputs.len());
        }
    }

    /// At least `len` input records.
    pub(crate) fn grow(&mut self, len: usize) {
        if self.inputs.len() < len {
            self.inputs.resize_with(len, InputRecord::default);
        }
    }

    /// Forgets every input (the request's items were replaced).
    pub(crate) fn forget_inputs(&mut self) {
        self.inputs.clear();
    }
}

/// A request's inputs as the step functions see them: the positions and
/// the full items read so far.
pub(crate) struct StepItems<'a> {
    pub(crate) inputs: &'a [InputRecord],
}

impl Items for StepItems<'_> {
    fn num_items(&self) -> usize {
        self.inputs.len()
    }

    fn position(&self, input_id: usize) -> Option<(u64, u64)> {
        self.inputs.get(input_id).and_then(|input| input.position)
    }

    fn item(&self, input_id: usize) -> Result<&Item, StepError> {
        match self.inputs.get(input_id) {
            Some(InputRecord { item: Some(item), .. }) => Ok(item),
            Some(_) => Err(StepError::NotRead { input_id }),
            None => Err(StepError::InputOutOfRange { input_id, num_items: self.inputs.len() }),
        }
    }
}

/// The records of every request a manager has seen, by request object.
/// Records sit in slots, found by the request's address through a map, and
/// the slot a mutable call last used is kept: vLLM makes its calls for one
/// request's items one after another, so most calls find their record there
/// by comparing one address, with no hashing.
#[derive(Default)]
pub struct Records {
    /// Request object's address -> the slot of its record.
    by_request: HashMap<usize, u32>,
    /// The records by slot; `None` in a free slot.
    slots: Vec<Option<RequestRecord>>,
    /// The free slots.
    free: Vec<u32>,
    /// The slot a mutable call last found or filled (a guess: checked by address).
    recent: u32,
    /// Record keys, oldest first (some of records gone since).
    age: VecDeque<usize>,
    /// Records that [`Self::put`] pushed out past [`MAX_RECORDS`], for the
    /// caller to drop once the manager is no longer borrowed
    /// ([`Self::take_displaced`]): the objects they hold may run Python code as they go.
    displaced: Vec<RequestRecord>,
}

/// The map key: the object's address, which the record's hold on it keeps unique.
fn address(request: &Bound<'_, PyAny>) -> usize {
    request.as_ptr() as usize
}

impl Records {
    /// The slot of the record of the object at `key`: the recent slot if
    /// its record is that object's, else by the map.
    #[inline]
    fn slot_of(&self, key: usize) -> Option<u32> {
        let recent = self.slots.get(self.recent as usize).and_then(Option::as_ref);
        if recent.is_some_and(|record| record.request.as_ptr() as usize == key) {
            return Some(self.recent);
        }
        self.by_request.get(&key).copied()
    }

    #[inline]
    pub(crate) fn get(&self, request: &Bound<'_, PyAny>) -> Option<&RequestRecord> {
        let slot = self.slot_of(address(request))?;
        self.slots.get(slot as usize)?.as_ref()
    }

    #[inline]
    pub(crate) fn get_mut(&mut self, request: &Bound<'_, PyAny>) -> Option<&mut RequestRecord> {
        let slot = self.slot_of(address(request))?;
        self.recent = slot;
        self.slots.get_mut(slot as usize)?.as_mut()
    }

    /// The record of `request`, created with id `id` as needed.
    pub(crate) fn entry(&mut self, request: &Bound<'_, PyAny>, id: &str) -> &mut RequestRecord {
        match self.slot_of(address(request)) {
            Some(slot) => {
                self.recent = slot;
                match &mut self.slots[slot as usize] {
                    Some(record) => record,
                    None => unreachable!("a mapped slot holds a record"),
                }
            }
            None => self.put(request, RequestRecord::new(request, id)),
        }
    }

    /// Makes room for one more record: past [`MAX_RECORDS`], the oldest goes.
    fn make_room(&mut self) {
        while self.by_request.len() >= MAX_RECORDS {
            let Some(oldest) = self.age.pop_front() else { break };
            if let Some(record) = self.remove(oldest) {
                self.displaced.push(record);
            }
        }
        if self.age.len() > 2 * MAX_RECORDS {
            let live = &self.by_request;
            self.age.retain(|key| live.contains_key(key));
        }
    }

    /// Takes the record of the object at `key` out of its slot, which is freed.
    fn remove(&mut self, key: usize) -> Option<RequestRecord> {
        let slot = self.by_request.remove(&key)?;
        self.free.push(slot);
        self.slots.get_mut(slot as usize)?.take()
    }

    /// The record of `request`, taken out for a call to work on.
    pub(crate) fn take(&mut self, request: &Bound<'_, PyAny>) -> Option<RequestRecord> {
        self.remove(address(request))
    }

    /// Gives back a record taken out with [`Self::take`], or adds a new one;
    /// returns it in its place (one map insertion).
    pub(crate) fn put(&mut self, request: &Bound<'_, PyAny>, mut record: RequestRecord) -> &mut RequestRecord {
        let key = address(request);
        self.make_room();
        if !record.aged {
            record.aged = true;
            self.age.push_back(key);
        }
        let slot = self.free.pop().unwrap_or_else(|| {
            self.slots.push(None);
            // Below MAX_RECORDS: make_room keeps the live records under it, and a slot is added only with none free.
            #[allow(clippy::cast_possible_truncation)]
            let slot = (self.slots.len() - 1) as u32;
            slot
        });
        if let Some(displaced) = self.by_request.insert(key, slot) {
            // The address had a record already: its slot goes back.
            if let Some(record) = self.slots[displaced as usize].take() {
                self.displaced.push(record);
            }
            self.free.push(displaced);
        }
        self.recent = slot;
        self.slots[slot as usize].insert(record)
    }

    /// Takes `request`'s record out for good; the caller drops it (with the
    /// manager not borrowed: the objects it holds may run Python code as they go).
    pub(crate) fn forget(&mut self, request: &Bound<'_, PyAny>) -> Option<RequestRecord> {
        let record = self.remove(address(request));
        self.compact_when_sparse();
        record
    }

    /// Renumbers the records into as few slots once most slots are free.
    fn compact_when_sparse(&mut self) {
        if self.slots.len() <= 64 || self.by_request.len() * 4 >= self.slots.len() {
            return;
        }
        let mut slots = Vec::with_capacity(self.by_request.len() * 2);
        for slot in self.by_request.values_mut() {
            let record = self.slots.get_mut(*slot as usize).and_then(Option::take);
            // Fewer than MAX_RECORDS.
            #[allow(clippy::cast_possible_truncation)]
            let renumbered = slots.len() as u32;
            *slot = renumbered;
            slots.push(record);
        }
        self.slots = slots;
        self.free.clear();
        self.free.shrink_to_fit();
        crate::cache::shrink_when_sparse(&mut self.by_request);
    }

    /// The records pushed out since the last call, for the caller to drop
    /// with the manager not borrowed (usually none: no allocation then).
    #[inline]
    pub(crate) fn take_displaced(&mut self) -> Vec<RequestRecord> {
        std::mem::take(&mut self.displaced)
    }

    pub(crate) fn clear(&mut self) {
        *self = Self::default();
    }

    /// The Python objects the records hold, for the garbage collector.
    pub(crate) fn traverse(&self, visit: &PyVisit<'_>) -> Result<(), PyTraverseError> {
        for record in self.slots.iter().flatten().chain(&self.displaced) {
            visit.call(&record.request)?;
            if let Some(answer) = record.held_ids.as_deref() {
                visit.call(&answer.set)?;
            }
            if let Some(features) = &record.features {
                visit.call(features)?;
            }
            for input in &record.inputs {
                if let Some(feature) = &input.feature {
                    visit.call(feature)?;
                }
            }
        }
        Ok(())
    }
}
