//! Per-request records: what the manager has read of a request, so that later
//! calls need not read it again, and the set `get_cached_input_ids` returned.
//!
//! Records belong to one request object, held so that its identity (the map
//! key) cannot be reused while they live. They go with `free(request)` and
//! `reset()`, and those of requests that nobody but the records still holds
//! are dropped as the map grows, so a caller that never calls `free(request)`
//! does not make them pile up.
//!
//! What is read once per request object: `request_id`. Once per item object
//! (`mm_features[i]`, checked by identity on every call, so a replaced item is
//! read afresh): `identifier` and `request.get_num_encoder_embeds(i)` for the
//! per-call methods (vLLM's `check_and_update_cache`, `can_allocate`,
//! `allocate`); the step-level methods keep their own [`Slot`]s (see `step`).
//! A vLLM request never changes these once it has them.

use hashbrown::hash_map::Entry;
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
    id: Key,
    /// The step-level methods' records (see `step`).
    slots: Vec<Slot>,
    /// The per-call methods' records, by input id.
    calls: Vec<Option<CallItem>>,
    /// The set `get_cached_input_ids` returned last (see [`ItemRecords::input_set`]).
    input_set: Option<Py<PySet>>,
}

/// A request id or an item identifier: from the records, or read in this call.
pub(crate) enum Name<'py> {
    Known(Key),
    Read(Bound<'py, PyString>),
}

impl Name<'_> {
    pub(crate) fn as_str(&self) -> PyResult<&str> {
        match self {
            Self::Known(key) => Ok(key),
            Self::Read(id) => id.to_str(),
        }
    }

    fn key(&self) -> PyResult<Key> {
        match self {
            Self::Known(key) => Ok(key.clone()),
            Self::Read(id) => Ok(Key::from(id.to_str()?)),
        }
    }
}

/// Records fewer than this are never swept.
const MIN_SWEEP: usize = 1024;

/// Per-request records, by request object.
pub(crate) struct ItemRecords {
    by_request: HashMap<usize, Known>,
    /// The size at which the map is next swept of requests only it holds.
    sweep_at: usize,
}

impl Default for ItemRecords {
    fn default() -> Self {
        Self { by_request: HashMap::new(), sweep_at: MIN_SWEEP }
    }
}

/// The map key: the object's address, which the records' hold on it keeps unique.
fn address(request: &Bound<'_, PyAny>) -> usize {
    request.as_ptr() as usize
}

impl ItemRecords {
    fn get(&self, request: &Bound<'_, PyAny>) -> Option<&Known> {
        self.by_request.get(&address(request))
    }

    /// The records of `request`, created as needed with the id `id` gives.
    fn entry(&mut self, request: &Bound<'_, PyAny>, id: &Name<'_>) -> PyResult<&mut Known> {
        if self.by_request.len() >= self.sweep_at {
            self.sweep();
        }
        Ok(match self.by_request.entry(address(request)) {
            Entry::Occupied(entry) => entry.into_mut(),
            Entry::Vacant(entry) => entry.insert(Known {
                request: request.clone().unbind(),
                id: id.key()?,
                slots: Vec::new(),
                calls: Vec::new(),
                input_set: None,
            }),
        })
    }

    /// Drops the records of requests no one else references any more; the
    /// next sweep waits until the map has doubled, so sweeping is O(1) per record.
    fn sweep(&mut self) {
        // SAFETY: the records hold each request, so the pointer is live.
        self.by_request.retain(|_, known| unsafe { ffi::Py_REFCNT(known.request.as_ptr()) } > 1);
        shrink_when_sparse(&mut self.by_request);
        self.sweep_at = (2 * self.by_request.len()).max(MIN_SWEEP);
    }

    /// The step-level records of `request` and its id if known, taken out for
    /// a call to update (and give back with [`Self::keep_slots`]).
    pub(crate) fn take_slots(&mut self, request: &Bound<'_, PyAny>) -> (Option<Key>, Vec<Slot>) {
        match self.by_request.get_mut(&address(request)) {
            Some(known) => (Some(known.id.clone()), std::mem::take(&mut known.slots)),
            None => (None, Vec::new()),
        }
    }

    pub(crate) fn keep_slots(&mut self, request: &Bound<'_, PyAny>, id: &Name<'_>, slots: Vec<Slot>) -> PyResult<()> {
        self.entry(request, id)?.slots = slots;
        Ok(())
    }

    /// The set of `inputs` (the request's held input ids) for
    /// `get_cached_input_ids`, as good as a new one. The set built by an
    /// earlier call is handed out again if no one else holds it any more and
    /// it still equals `inputs` (its holder may have changed it before letting
    /// go); otherwise a new one is built, and kept for the next call.
    pub(crate) fn input_set<'py>(
        &mut self,
        request: &Bound<'py, PyAny>,
        id: &Name<'py>,
        inputs: &HashMap<usize, Key>,
    ) -> PyResult<Bound<'py, PySet>> {
        let py = request.py();
        let known = self.entry(request, id)?;
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

    pub(crate) fn forget(&mut self, request: &Bound<'_, PyAny>) {
        self.by_request.remove(&address(request));
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

/// `request.request_id`, from the records if they know the request.
pub(crate) fn id_of<'py, M: StepManager>(manager: &Bound<'py, M>, request: &Bound<'py, PyAny>) -> PyResult<Name<'py>> {
    if let Some(known) = manager.try_borrow()?.records().get(request) {
        return Ok(Name::Known(known.id.clone()));
    }
    Ok(Name::Read(request_id(request)?))
}

/// What was read of an item, outside the records: see [`recorded`].
struct SeenItem<'py> {
    feature: Bound<'py, PyAny>,
    identifier: Option<Key>,
    num_embeds: Option<u64>,
}

/// What the records know of `request`: its id, and what was read of input
/// `input_id` with the item object it was read from. The manager is borrowed
/// only to look.
fn recorded<'py, M: StepManager>(
    manager: &Bound<'py, M>,
    request: &Bound<'py, PyAny>,
    input_id: usize,
) -> PyResult<(Option<Key>, Option<SeenItem<'py>>)> {
    let py = request.py();
    let manager = manager.try_borrow()?;
    let Some(known) = manager.records().get(request) else {
        return Ok((None, None));
    };
    let item = known.calls.get(input_id).and_then(Option::as_ref);
    let item = item.map(|item| SeenItem {
        feature: item.feature.bind(py).clone(),
        identifier: item.identifier.clone(),
        num_embeds: item.num_embeds,
    });
    Ok((Some(known.id.clone()), item))
}

/// `mm_features[i].identifier`, from the records while `mm_features[i]` is
/// the item they read it from.
pub(crate) fn identifier_at<'py, M: StepManager>(
    manager: &Bound<'py, M>,
    request: &Bound<'py, PyAny>,
    input_id: usize,
) -> PyResult<Name<'py>> {
    let (_, known_item) = recorded(manager, request, input_id)?;
    let feature = feature(request, input_id)?;
    match known_item {
        Some(SeenItem { feature: seen, identifier: Some(identifier), .. }) if seen.is(&feature) => Ok(Name::Known(identifier)),
        _ => Ok(Name::Read(identifier_of(&feature)?)),
    }
}

/// One input of a request as a per-call method sees it: `mm_features[i]` is
/// read on every call; the rest comes from the records, or is read when first
/// asked for and kept by [`CallInput::remember`].
pub(crate) struct CallInput<'py> {
    request: Bound<'py, PyAny>,
    id: Name<'py>,
    input_id: usize,
    feature: Bound<'py, PyAny>,
    identifier: Option<Key>,
    num_embeds: Option<u64>,
    fresh: bool,
}

impl<'py> CallInput<'py> {
    /// Reads `mm_features[input_id]`, and `request_id` if the records do not
    /// know it, raising what the plain reads raise (the identifier's error
    /// before the request id's).
    pub(crate) fn read<M: StepManager>(manager: &Bound<'py, M>, request: &Bound<'py, PyAny>, input_id: usize) -> PyResult<Self> {
        let (known_id, known_item) = recorded(manager, request, input_id)?;
        let feature = feature(request, input_id)?;
        let id = match known_id {
            Some(key) => Name::Known(key),
            None => match request_id(request) {
                Ok(id) => Name::Read(id),
                Err(err) => {
                    identifier_of(&feature)?;
                    return Err(err);
                }
            },
        };
        let (identifier, num_embeds) = match known_item {
            Some(item) if item.feature.is(&feature) => (item.identifier, item.num_embeds),
            _ => (None, None),
        };
        Ok(Self { request: request.clone(), id, input_id, feature, identifier, num_embeds, fresh: false })
    }

    pub(crate) fn request_id(&self) -> PyResult<&str> {
        self.id.as_str()
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
        let known = records.entry(&self.request, &self.id)?;
        if known.calls.len() <= self.input_id {
            known.calls.resize_with(self.input_id + 1, || None);
        }
        // What this call knew of the item came from the record for this very
        // feature: that record is filled in (its reference to the feature is
        // kept, not dropped and taken again); a record of another is replaced.
        match &mut known.calls[self.input_id] {
            Some(item) if item.feature.is(&self.feature) => {
                item.identifier = self.identifier;
                item.num_embeds = self.num_embeds;
            }
            slot => {
                *slot = Some(CallItem { feature: self.feature.unbind(), identifier: self.identifier, num_embeds: self.num_embeds })
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
