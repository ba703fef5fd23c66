//! Per-request records: what the manager has read of a request, so that later
//! calls need not read it again, and the set `get_cached_input_ids` built last.
//!
//! Records belong to one request object under its request id. The object is
//! held, so its identity cannot be reused while the records live; another
//! object arriving under the same id starts afresh. Records go with
//! `free(request)` and `reset()`, and those of requests that nobody but the
//! records still references are dropped as the map grows, so a caller that
//! never calls `free(request)` does not make them pile up.
//!
//! The per-call methods (vLLM's `check_and_update_cache`, `can_allocate`,
//! `allocate`) read `request.request_id` and `request.mm_features[i]` on every
//! call, and an item's `identifier` and `request.get_num_encoder_embeds(i)` only
//! while `mm_features[i]` is an object not seen at that position before. A
//! vLLM request never changes an item once it is in `mm_features`; replacing
//! the item object is seen at once.

use hashbrown::hash_map::EntryRef;
use hashbrown::HashMap;
use pyo3::ffi;
use pyo3::gc::{PyTraverseError, PyVisit};
use pyo3::prelude::*;
use pyo3::types::{PySet, PyString};

use super::request::{feature, identifier_of, num_embeds, request_id};
use super::step::{Slot, StepManager};
use crate::cache::{shrink_when_sparse, Key};

/// One item as the per-call methods read it, valid while `mm_features[i]` is `feature`.
struct CallItem {
    feature: Py<PyAny>,
    identifier: Option<Key>,
    num_embeds: Option<u64>,
}

struct Known {
    request: Py<PyAny>,
    /// The step-level methods' records (see `step`).
    slots: Vec<Slot>,
    /// The per-call methods' records, by input id.
    calls: Vec<Option<CallItem>>,
    /// The set `get_cached_input_ids` returned last (see [`ItemRecords::input_set`]).
    input_set: Option<Py<PySet>>,
}

impl Known {
    fn new(request: &Bound<'_, PyAny>) -> Self {
        Self { request: request.clone().unbind(), slots: Vec::new(), calls: Vec::new(), input_set: None }
    }
}

/// Records fewer than this are never swept.
const MIN_SWEEP: usize = 1024;

/// Per-request records, by request id.
pub(crate) struct ItemRecords {
    by_request: HashMap<Key, Known>,
    /// The size at which the map is next swept of requests only it holds.
    sweep_at: usize,
}

impl Default for ItemRecords {
    fn default() -> Self {
        Self { by_request: HashMap::new(), sweep_at: MIN_SWEEP }
    }
}

impl ItemRecords {
    /// The records of `request_id`, if they belong to this very object.
    fn get(&self, request: &Bound<'_, PyAny>, request_id: &str) -> Option<&Known> {
        self.by_request.get(request_id).filter(|known| known.request.is(request))
    }

    /// The records of `request`, created (or restarted, for another object) as needed.
    fn entry(&mut self, request: &Bound<'_, PyAny>, request_id: &str) -> &mut Known {
        if self.by_request.len() >= self.sweep_at && !self.by_request.contains_key(request_id) {
            self.sweep();
        }
        let known = match self.by_request.entry_ref(request_id) {
            EntryRef::Occupied(entry) => entry.into_mut(),
            EntryRef::Vacant(entry) => entry.insert(Known::new(request)),
        };
        if !known.request.is(request) {
            *known = Known::new(request);
        }
        known
    }

    /// Drops the records of requests no one else references any more; the
    /// next sweep waits until the map has doubled, so sweeping is O(1) per record.
    fn sweep(&mut self) {
        // SAFETY: the records hold each request, so the pointer is live.
        self.by_request.retain(|_, known| unsafe { ffi::Py_REFCNT(known.request.as_ptr()) } > 1);
        shrink_when_sparse(&mut self.by_request);
        self.sweep_at = (2 * self.by_request.len()).max(MIN_SWEEP);
    }

    /// The step-level records of `request_id` if read from this very object,
    /// taken out for a call to update (and give back with [`Self::keep_slots`]).
    pub(crate) fn take_slots(&mut self, request: &Bound<'_, PyAny>, request_id: &str) -> Vec<Slot> {
        match self.by_request.get_mut(request_id) {
            Some(known) if known.request.is(request) => std::mem::take(&mut known.slots),
            _ => Vec::new(),
        }
    }

    pub(crate) fn keep_slots(&mut self, request: &Bound<'_, PyAny>, request_id: &str, slots: Vec<Slot>) {
        self.entry(request, request_id).slots = slots;
    }

    /// The set of `inputs` (the request's held input ids) for
    /// `get_cached_input_ids`, as good as a new one. The set built by an
    /// earlier call is handed out again if no one else holds it any more and
    /// it still equals `inputs` (its holder may have changed it before letting
    /// go); otherwise a new one is built, and kept for the next call.
    pub(crate) fn input_set<'py>(
        &mut self,
        request: &Bound<'py, PyAny>,
        request_id: &str,
        inputs: &HashMap<usize, Key>,
    ) -> PyResult<Bound<'py, PySet>> {
        let py = request.py();
        let known = self.entry(request, request_id);
        if let Some(kept) = &known.input_set {
            let kept = kept.bind(py);
            // SAFETY: the records hold the set, so the pointer is live.
            let unshared = unsafe { ffi::Py_REFCNT(kept.as_ptr()) } == 1;
            if unshared && equals(kept, inputs) {
                return Ok(kept.clone());
            }
        }
        let set = PySet::new(py, inputs.keys())?;
        known.input_set = Some(set.clone().unbind());
        Ok(set)
    }

    pub(crate) fn is_empty(&self) -> bool {
        self.by_request.is_empty()
    }

    pub(crate) fn forget(&mut self, request_id: &str) {
        self.by_request.remove(request_id);
        shrink_when_sparse(&mut self.by_request);
    }

    pub(crate) fn clear(&mut self) {
        self.by_request.clear();
    }

    pub(crate) fn traverse(&self, visit: &PyVisit<'_>) -> Result<(), PyTraverseError> {
        for known in self.by_request.values() {
            visit.call(&known.request)?;
            for item in known.calls.iter().flatten() {
                visit.call(&item.feature)?;
            }
            if let Some(set) = &known.input_set {
                visit.call(set)?;
            }
        }
        Ok(())
    }
}

/// One input of a request as a per-call method sees it. Only `mm_features[i]`
/// and `request_id` are read up front; the item's details come from the
/// records, or are read when first asked for and kept by [`CallInput::remember`].
pub(crate) struct CallInput<'py> {
    request: Bound<'py, PyAny>,
    request_id: Bound<'py, PyString>,
    input_id: usize,
    feature: Bound<'py, PyAny>,
    identifier: Option<Key>,
    num_embeds: Option<u64>,
    fresh: bool,
}

impl<'py> CallInput<'py> {
    /// Reads `mm_features[input_id]` and `request_id`, raising what the plain
    /// reads raise (the identifier's error before the request id's), and
    /// looks up what the manager's records (borrowed only for the look-up) know of the item.
    pub(crate) fn read<M: StepManager>(manager: &Bound<'py, M>, request: &Bound<'py, PyAny>, input_id: usize) -> PyResult<Self> {
        let feature = feature(request, input_id)?;
        let request_id = match request_id(request) {
            Ok(id) => id,
            Err(err) => {
                identifier_of(&feature)?;
                return Err(err);
            }
        };
        let mut input = Self {
            request: request.clone(),
            request_id,
            input_id,
            feature,
            identifier: None,
            num_embeds: None,
            fresh: false,
        };
        let manager = manager.try_borrow()?;
        let known = manager.records().get(request, input.request_id.to_str()?);
        if let Some(item) = known.and_then(|k| k.calls.get(input_id)).and_then(Option::as_ref) {
            if item.feature.is(&input.feature) {
                input.identifier = item.identifier.clone();
                input.num_embeds = item.num_embeds;
            }
        }
        Ok(input)
    }

    pub(crate) fn request_id(&self) -> PyResult<&str> {
        self.request_id.to_str()
    }

    /// `mm_features[i].identifier`.
    pub(crate) fn identifier(&mut self) -> PyResult<Key> {
        if let Some(key) = &self.identifier {
            return Ok(key.clone());
        }
        let key = Key::from(identifier_of(&self.feature)?.to_str()?);
        self.identifier = Some(key.clone());
        self.fresh = true;
        Ok(key)
    }

    /// `request.get_num_encoder_embeds(i)`.
    pub(crate) fn num_embeds(&mut self) -> PyResult<u64> {
        if let Some(n) = self.num_embeds {
            return Ok(n);
        }
        let n = num_embeds(&self.request, self.input_id)?;
        self.num_embeds = Some(n);
        self.fresh = true;
        Ok(n)
    }

    /// Keeps what this call read.
    pub(crate) fn remember(self, records: &mut ItemRecords) -> PyResult<()> {
        if !self.fresh {
            return Ok(());
        }
        let known = records.entry(&self.request, self.request_id.to_str()?);
        if known.calls.len() <= self.input_id {
            known.calls.resize_with(self.input_id + 1, || None);
        }
        match &mut known.calls[self.input_id] {
            Some(item) if item.feature.is(&self.feature) => {
                item.identifier = self.identifier;
                item.num_embeds = self.num_embeds;
            }
            slot => {
                *slot = Some(CallItem {
                    feature: self.feature.unbind(),
                    identifier: self.identifier,
                    num_embeds: self.num_embeds,
                })
            }
        }
        Ok(())
    }
}

/// Whether `set` holds exactly the ids of `inputs`, read straight from its
/// hash table: the public API would build an int and hash it for each id.
fn equals(set: &Bound<'_, PySet>, inputs: &HashMap<usize, Key>) -> bool {
    if set.len() != inputs.len() {
        return false;
    }
    // SAFETY: `set` is a live set (CPython layout, from pyo3-ffi), the GIL is
    // held and no Python code runs during the walk, so the table is stable.
    // Slots are empty (NULL key), removed (hash -1, which no object has), or
    // hold an object with its hash.
    unsafe {
        let set = set.as_ptr().cast::<ffi::PySetObject>();
        let table = std::slice::from_raw_parts((*set).table, (*set).mask as usize + 1);
        table.iter().filter(|slot| !slot.key.is_null() && slot.hash != -1).all(|slot| {
            // An int's hash is its value for the small ints input ids are.
            ffi::PyLong_CheckExact(slot.key) != 0
                && usize::try_from(slot.hash).is_ok_and(|id| inputs.contains_key(&id))
                && ffi::PyLong_AsSsize_t(slot.key) == slot.hash
        })
    }
}
