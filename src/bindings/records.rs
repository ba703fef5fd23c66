//! Per-request records: what a manager has read of a request, so that later
//! calls need not read it again.
//!
//! One [`RequestRecord`] per request object, holding the object so that its
//! identity (the map key) cannot be reused while the record lives. It keeps
//! the request's id, read once per request object, and what was read of its
//! items:
//! - for the per-call methods (`check_and_update_cache`, `can_allocate`,
//!   `allocate`, ...), an [`InputRecord`] per input: the item's `identifier`
//!   and `request.get_num_encoder_embeds(i)`, valid while `mm_features[i]`
//!   is the object they were read from (checked by identity on every call, so
//!   a replaced item is read afresh; see `calls`);
//! - for the step-level methods, a [`Slot`] per item: its position from the
//!   first sight, the rest once a step needs it (see `step`).
//!
//! A vLLM request never changes these once it has them. Records go with
//! `free(request)` and `reset()`; those of requests that nobody but the
//! records still holds are swept as the map grows, so a caller that never
//! calls `free(request)` does not make them pile up.

use hashbrown::hash_map::Entry;
use hashbrown::HashMap;
use pyo3::gc::{PyTraverseError, PyVisit};
use pyo3::intern;
use pyo3::prelude::*;
use pyo3::types::{PyList, PyString};

use crate::cache::{shrink_when_sparse, Key, KeyArg};
use crate::step::{Item, Items, StepError};

/// A request id: from the request's record, or read from the request in this call.
pub(crate) enum RequestId<'py> {
    Recorded(Key),
    Read(Bound<'py, PyString>),
}

impl RequestId<'_> {
    /// For the core: a recorded key is shared and compared by pointer.
    pub(crate) fn arg(&self) -> PyResult<KeyArg<'_>> {
        match self {
            Self::Recorded(key) => Ok(KeyArg::from(key)),
            Self::Read(id) => Ok(KeyArg::from(id.to_str()?)),
        }
    }

    fn key(&self) -> PyResult<Key> {
        match self {
            Self::Recorded(key) => Ok(key.clone()),
            Self::Read(id) => Ok(Key::from(id.to_str()?)),
        }
    }
}

/// What the per-call methods read of one input, valid while `mm_features[i]` is `feature`.
pub(crate) struct InputRecord {
    pub(crate) feature: Py<PyAny>,
    pub(crate) identifier: Option<Key>,
    /// `request.get_num_encoder_embeds(i)`.
    pub(crate) num_embeds: Option<u64>,
    /// The item's modality tag (see `modality`).
    pub(crate) modality: Option<u8>,
}

/// What the step-level methods know of an item: its position from the first
/// sight, the rest once read.
pub(crate) enum Slot {
    Position { offset: u64, length: u64 },
    Read(Box<Item>),
}

impl Items for [Slot] {
    fn num_items(&self) -> usize {
        self.len()
    }

    fn position(&self, input_id: usize) -> Option<(u64, u64)> {
        self.get(input_id).map(|slot| match slot {
            Slot::Position { offset, length } => (*offset, *length),
            Slot::Read(item) => (item.offset, item.length),
        })
    }

    fn item(&self, input_id: usize) -> Result<&Item, StepError> {
        match self.get(input_id) {
            Some(Slot::Read(item)) => Ok(item),
            Some(Slot::Position { .. }) => Err(StepError::NotRead { input_id }),
            None => Err(StepError::InputOutOfRange { input_id, num_items: self.len() }),
        }
    }
}

/// Everything a manager keeps of one request object.
pub(crate) struct RequestRecord {
    request: Py<PyAny>,
    pub(crate) id: Key,
    /// The per-call methods' records, by input id.
    pub(crate) inputs: Vec<Option<InputRecord>>,
    /// The step-level methods' records, one per item seen.
    pub(crate) slots: Vec<Slot>,
}

impl RequestRecord {
    /// The record of input `input_id` if it was read from `feature`.
    pub(crate) fn input(&self, input_id: usize, feature: &Bound<'_, PyAny>) -> Option<&InputRecord> {
        self.inputs.get(input_id).and_then(Option::as_ref).filter(|input| input.feature.is(feature))
    }

    /// The record of input `input_id` as read from `feature`: an empty one
    /// if there was none, or one of another item object.
    pub(crate) fn input_mut(&mut self, input_id: usize, feature: &Bound<'_, PyAny>) -> &mut InputRecord {
        if self.inputs.len() <= input_id {
            self.inputs.resize_with(input_id + 1, || None);
        }
        let slot = &mut self.inputs[input_id];
        if !matches!(slot, Some(input) if input.feature.is(feature)) {
            *slot = None;
        }
        slot.get_or_insert_with(|| InputRecord { feature: feature.clone().unbind(), identifier: None, num_embeds: None, modality: None })
    }
}

/// Records fewer than this are never swept.
const MIN_SWEEP: usize = 1024;

/// The records of every request a manager has seen, by request object.
pub(crate) struct Records {
    by_request: HashMap<usize, RequestRecord>,
    /// The size at which the map is next swept of requests only it holds.
    sweep_at: usize,
}

impl Default for Records {
    fn default() -> Self {
        Self { by_request: HashMap::new(), sweep_at: MIN_SWEEP }
    }
}

/// The map key: the object's address, which the record's hold on it keeps unique.
fn address(request: &Bound<'_, PyAny>) -> usize {
    request.as_ptr() as usize
}

impl Records {
    pub(crate) fn get(&self, request: &Bound<'_, PyAny>) -> Option<&RequestRecord> {
        self.by_request.get(&address(request))
    }

    pub(crate) fn get_mut(&mut self, request: &Bound<'_, PyAny>) -> Option<&mut RequestRecord> {
        self.by_request.get_mut(&address(request))
    }

    /// The record of `request`, created as needed with the id `id` gives.
    pub(crate) fn entry(&mut self, request: &Bound<'_, PyAny>, id: &RequestId<'_>) -> PyResult<&mut RequestRecord> {
        if self.by_request.len() >= self.sweep_at {
            self.sweep(request.py());
        }
        Ok(match self.by_request.entry(address(request)) {
            Entry::Occupied(entry) => entry.into_mut(),
            Entry::Vacant(entry) => {
                entry.insert(RequestRecord { request: request.clone().unbind(), id: id.key()?, inputs: Vec::new(), slots: Vec::new() })
            }
        })
    }

    /// Drops the records of requests no one else references any more; the
    /// next sweep waits until the map has doubled, so sweeping is O(1) per record.
    fn sweep(&mut self, py: Python<'_>) {
        // Counted with `sys.getrefcount`, against an object only one reference holds.
        let Ok(getrefcount) = py.import(intern!(py, "sys")).and_then(|sys| sys.getattr(intern!(py, "getrefcount"))) else {
            return;
        };
        let count = |object: &Bound<'_, PyAny>| getrefcount.call1((object,)).and_then(|n| n.extract::<isize>()).ok();
        let Some(held_once) = count(PyList::empty(py).as_any()) else {
            return;
        };
        self.by_request.retain(|_, record| count(record.request.bind(py)).is_none_or(|n| n > held_once));
        shrink_when_sparse(&mut self.by_request);
        self.sweep_at = (2 * self.by_request.len()).max(MIN_SWEEP);
    }

    /// The step-level records of `request` and its id if known, taken out for
    /// a call to update (and give back with [`Self::keep_slots`]).
    pub(crate) fn take_slots(&mut self, request: &Bound<'_, PyAny>) -> (Option<Key>, Vec<Slot>) {
        match self.get_mut(request) {
            Some(record) => (Some(record.id.clone()), std::mem::take(&mut record.slots)),
            None => (None, Vec::new()),
        }
    }

    pub(crate) fn keep_slots(&mut self, request: &Bound<'_, PyAny>, id: &RequestId<'_>, slots: Vec<Slot>) -> PyResult<()> {
        self.entry(request, id)?.slots = slots;
        Ok(())
    }

    pub(crate) fn forget(&mut self, request: &Bound<'_, PyAny>) {
        self.by_request.remove(&address(request));
        shrink_when_sparse(&mut self.by_request);
    }

    pub(crate) fn clear(&mut self) {
        self.by_request.clear();
    }

    /// The Python objects the records hold, for the garbage collector.
    pub(crate) fn traverse(&self, visit: &PyVisit<'_>) -> Result<(), PyTraverseError> {
        for record in self.by_request.values() {
            visit.call(&record.request)?;
            for input in record.inputs.iter().flatten() {
                visit.call(&input.feature)?;
            }
        }
        Ok(())
    }
}
