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
//!
//! A per-call method that finds what it needs here runs the core operation on
//! references into the records, under one borrow of the state, copying no key
//! ([`with_input`], [`with_request_id`]); on an item's first sight it reads
//! what is missing with the state not borrowed, records it, and borrows again.

use std::mem::ManuallyDrop;
use std::ops::Deref;

use hashbrown::hash_map::Entry;
use hashbrown::HashMap;
use pyo3::exceptions::{PyException, PyRuntimeError};
use pyo3::ffi;
use pyo3::gc::{PyTraverseError, PyVisit};
use pyo3::prelude::*;
use pyo3::types::{PySet, PyString};

use super::request::{feature, identifier_of, num_embeds, request_id};
use super::step::{write, ManagerState, Slot, StepManager};
use crate::cache::{shrink_when_sparse, EncoderCache, HeldInputs, Key, KeyArg};

/// A reference the records hold, released with a plain `Py_DECREF`. The
/// records are dropped only with the thread attached (in a call, in
/// `__clear__`, or with the manager), but a `Py` dropped in a fast entry (see
/// `fast`), which PyO3 does not count as attached, would be released only at
/// PyO3's next entry, and requests swept from the records would stay alive
/// until then.
struct Held<T>(ManuallyDrop<Py<T>>);

impl<T> Held<T> {
    fn new(object: &Bound<'_, T>) -> Self {
        Self(ManuallyDrop::new(object.clone().unbind()))
    }
}

impl<T> Deref for Held<T> {
    type Target = Py<T>;

    fn deref(&self) -> &Py<T> {
        &self.0
    }
}

impl<T> Drop for Held<T> {
    fn drop(&mut self) {
        // SAFETY: the thread is attached (see above), and the reference is ours.
        unsafe { ffi::Py_DECREF(self.0.as_ptr()) }
    }
}

/// One item as the per-call methods read it, valid while `mm_features[i]` is `feature`.
struct CallItem {
    feature: Held<PyAny>,
    identifier: Option<Key>,
    num_embeds: Option<u64>,
}

struct Known {
    request: Held<PyAny>,
    id: Key,
    /// The step-level methods' records (see `step`).
    slots: Vec<Slot>,
    /// The per-call methods' records, by input id.
    calls: Vec<Option<CallItem>>,
    /// The set `get_cached_input_ids` returned last (see [`Known::input_set`]).
    input_set: Option<Held<PySet>>,
}

impl Known {
    /// `held` (the request's held input ids) as a set for
    /// `get_cached_input_ids`, as good as a new one. The set built by an
    /// earlier call is handed out again if no one else holds it any more and
    /// it still equals `held` (its holder may have changed it before letting
    /// go); otherwise a new one is built, and kept for the next call.
    fn input_set<'py>(&mut self, py: Python<'py>, held: Option<&HeldInputs>) -> PyResult<Bound<'py, PySet>> {
        let Some(held) = held else {
            return PySet::empty(py);
        };
        if let Some(kept) = &self.input_set {
            let kept = kept.bind(py);
            // SAFETY: the records hold the set, so the pointer is live.
            let unshared = unsafe { ffi::Py_REFCNT(kept.as_ptr()) } == 1;
            if unshared && equals(kept, held) {
                return Ok(kept.clone());
            }
        }
        let set = PySet::new(py, held.positions())?;
        self.input_set = Some(Held::new(&set));
        Ok(set)
    }
}

/// A request id or an item identifier: from the records, or read in this call.
pub(crate) enum Name<'py> {
    Known(Key),
    Read(Bound<'py, PyString>),
}

impl Name<'_> {
    /// For the core: a known key is shared and compared by pointer.
    pub(crate) fn arg(&self) -> PyResult<KeyArg<'_>> {
        match self {
            Self::Known(key) => Ok(KeyArg::from(key)),
            Self::Read(id) => Ok(KeyArg::from(id.to_str()?)),
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
            Entry::Vacant(entry) => {
                entry.insert(Known { request: Held::new(request), id: id.key()?, slots: Vec::new(), calls: Vec::new(), input_set: None })
            }
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

    pub(crate) fn forget(&mut self, request: &Bound<'_, PyAny>) {
        self.by_request.remove(&address(request));
        shrink_when_sparse(&mut self.by_request);
    }

    pub(crate) fn clear(&mut self) {
        self.by_request.clear();
    }

    pub(crate) fn traverse(&self, visit: &PyVisit<'_>) -> Result<(), PyTraverseError> {
        for known in self.by_request.values() {
            visit.call(&*known.request)?;
            for item in known.calls.iter().flatten() {
                visit.call(&*item.feature)?;
            }
            if let Some(set) = &known.input_set {
                visit.call(&**set)?;
            }
        }
        Ok(())
    }
}

/// `get_cached_input_ids`: the input ids the cache holds for
/// `request.request_id` (from the records if they know the request, else
/// read first), as a set (see [`Known::input_set`]).
pub(crate) fn cached_input_set<'py, M: StepManager<Cache = EncoderCache>>(
    manager: &Bound<'py, M>,
    request: &Bound<'py, PyAny>,
) -> PyResult<Bound<'py, PySet>> {
    let py = request.py();
    {
        let mut state = write(manager)?;
        let ManagerState { cache, records } = &mut *state;
        if let Some(known) = records.by_request.get_mut(&address(request)) {
            let inputs = cache.cached_input_ids(&known.id);
            return known.input_set(py, inputs);
        }
    }
    let id = request_id(request)?;
    let mut state = write(manager)?;
    let ManagerState { cache, records } = &mut *state;
    match cache.cached_input_ids(id.to_str()?) {
        Some(inputs) => records.entry(request, &Name::Read(id))?.input_set(py, Some(inputs)),
        None => PySet::empty(py),
    }
}

/// Runs `op` on the manager's cache with `request.request_id`: from the
/// records if they know the request (one borrow, nothing copied), else read first.
pub(crate) fn with_request_id<'py, M: StepManager, R>(
    manager: &Bound<'py, M>,
    request: &Bound<'py, PyAny>,
    op: impl FnOnce(&mut M::Cache, KeyArg<'_>) -> R,
) -> PyResult<R> {
    {
        let mut state = write(manager)?;
        let ManagerState { cache, records } = &mut *state;
        if let Some(known) = records.get(request) {
            return Ok(op(cache, KeyArg::from(&known.id)));
        }
    }
    let id = request_id(request)?;
    Ok(op(&mut write(manager)?.cache, KeyArg::from(id.to_str()?)))
}

/// When a per-call method reads `request.request_id`.
#[derive(Clone, Copy, PartialEq, Eq)]
enum IdRead {
    /// Never: the method keeps records only of requests they already know.
    Never,
    /// Only to keep records: a request without a readable id is served all the same.
    ForRecords,
    /// The method needs it.
    Always,
}

/// What a per-call method reads of its request besides `mm_features[i]`,
/// which it reads on every call.
#[derive(Clone, Copy)]
pub(crate) struct Needs {
    request_id: IdRead,
    identifier: bool,
    num_embeds: bool,
}

impl Needs {
    /// `check_and_update_cache`.
    pub(crate) const HIT: Self = Self { request_id: IdRead::Always, identifier: true, num_embeds: false };
    /// `can_allocate`: vLLM reads the size alone.
    pub(crate) const SIZE: Self = Self { request_id: IdRead::ForRecords, identifier: false, num_embeds: true };
    /// `allocate`.
    pub(crate) const ALL: Self = Self { request_id: IdRead::Always, identifier: true, num_embeds: true };
    /// `get_cached_num_encoder_embeds`.
    pub(crate) const IDENTIFIER: Self = Self { request_id: IdRead::Never, identifier: true, num_embeds: false };
}

/// One input as a per-call method sees it: what its [`Needs`] asked for,
/// borrowed from the records (or from this call's reads, when the records
/// could not keep them).
pub(crate) struct CallInput<'a> {
    request_id: Option<KeyArg<'a>>,
    identifier: Option<&'a Key>,
    num_embeds: Option<u64>,
}

/// Asking for what the method's `Needs` left out: a bug, reported rather than panicked on.
fn not_read(what: &str) -> PyErr {
    PyRuntimeError::new_err(format!("internal error: {what} was not read for this call"))
}

impl<'a> CallInput<'a> {
    pub(crate) fn request_id(&self) -> PyResult<KeyArg<'a>> {
        self.request_id.ok_or_else(|| not_read("request_id"))
    }

    pub(crate) fn identifier(&self) -> PyResult<&'a Key> {
        self.identifier.ok_or_else(|| not_read("identifier"))
    }

    pub(crate) fn num_embeds(&self) -> PyResult<u64> {
        self.num_embeds.ok_or_else(|| not_read("get_num_encoder_embeds"))
    }

    fn has(&self, needs: Needs) -> bool {
        (needs.request_id != IdRead::Always || self.request_id.is_some())
            && (!needs.identifier || self.identifier.is_some())
            && (!needs.num_embeds || self.num_embeds.is_some())
    }

    /// What of `needs` is left to read: the request id only if it is not here.
    fn lacking(&self, needs: Needs) -> Needs {
        Needs {
            request_id: if self.request_id.is_some() { IdRead::Never } else { needs.request_id },
            identifier: needs.identifier && self.identifier.is_none(),
            num_embeds: needs.num_embeds && self.num_embeds.is_none(),
        }
    }
}

/// What a call read because the records did not have it.
#[derive(Default)]
struct Fresh<'py> {
    request_id: Option<Bound<'py, PyString>>,
    identifier: Option<Key>,
    num_embeds: Option<u64>,
}

impl<'py> Fresh<'py> {
    /// Reads what `needs` asks for and this call does not have yet, in
    /// vLLM's order (the identifier's error comes before the request id's).
    fn read(&mut self, request: &Bound<'py, PyAny>, input_id: usize, feature: &Bound<'py, PyAny>, needs: Needs) -> PyResult<()> {
        if needs.identifier && self.identifier.is_none() {
            self.identifier = Some(Key::from(identifier_of(feature)?.to_str()?));
        }
        if self.request_id.is_none() {
            match needs.request_id {
                IdRead::Never => {}
                IdRead::ForRecords => {
                    self.request_id = match request_id(request) {
                        Ok(id) => Some(id),
                        // Swallowed only as an ordinary error: an interrupt still goes through.
                        Err(err) if err.is_instance_of::<PyException>(request.py()) => None,
                        Err(err) => return Err(err),
                    }
                }
                IdRead::Always => self.request_id = Some(request_id(request)?),
            }
        }
        if needs.num_embeds && self.num_embeds.is_none() {
            self.num_embeds = Some(num_embeds(request, input_id)?);
        }
        Ok(())
    }

    fn input(&self) -> PyResult<CallInput<'_>> {
        let request_id = self.request_id.as_ref().map(|id| id.to_str().map(KeyArg::from)).transpose()?;
        Ok(CallInput { request_id, identifier: self.identifier.as_ref(), num_embeds: self.num_embeds })
    }
}

impl Known {
    /// What these records hold for input `input_id`, as read from `feature`.
    fn call_input(&self, input_id: usize, feature: &Bound<'_, PyAny>) -> CallInput<'_> {
        let item = self.calls.get(input_id).and_then(Option::as_ref).filter(|item| item.feature.is(feature));
        CallInput {
            request_id: Some(KeyArg::from(&self.id)),
            identifier: item.and_then(|item| item.identifier.as_ref()),
            num_embeds: item.and_then(|item| item.num_embeds),
        }
    }
}

impl ItemRecords {
    /// What the records hold for input `input_id` of `request`, as read from `feature`.
    fn call_input(&self, request: &Bound<'_, PyAny>, input_id: usize, feature: &Bound<'_, PyAny>) -> CallInput<'_> {
        match self.get(request) {
            Some(known) => known.call_input(input_id, feature),
            None => CallInput { request_id: None, identifier: None, num_embeds: None },
        }
    }

    /// Keeps what a call read of input `input_id` (from `feature`) and gives
    /// back what the records now hold for it; None if they cannot place the
    /// request (not known, and its id unread).
    fn remember(
        &mut self,
        request: &Bound<'_, PyAny>,
        input_id: usize,
        feature: &Bound<'_, PyAny>,
        fresh: &mut Fresh<'_>,
    ) -> PyResult<Option<CallInput<'_>>> {
        let known = match &fresh.request_id {
            Some(id) => self.entry(request, &Name::Read(id.clone()))?,
            None => match self.by_request.get_mut(&address(request)) {
                Some(known) => known,
                None => return Ok(None),
            },
        };
        if known.calls.len() <= input_id {
            known.calls.resize_with(input_id + 1, || None);
        }
        let slot = &mut known.calls[input_id];
        // A record of another item object is replaced; one of this object is filled in.
        if !matches!(slot, Some(item) if item.feature.is(feature)) {
            *slot = None;
        }
        let item = slot.get_or_insert_with(|| CallItem { feature: Held::new(feature), identifier: None, num_embeds: None });
        // Moved, not copied: a call that finds its records incomplete afterwards reads again.
        item.identifier = item.identifier.take().or_else(|| fresh.identifier.take());
        item.num_embeds = item.num_embeds.or(fresh.num_embeds);
        Ok(Some(known.call_input(input_id, feature)))
    }
}

/// Runs `op` on the manager's cache with input `input_id` of `request`, as
/// `needs` asks: `mm_features[input_id]` is read on every call; the rest
/// comes from the records while that is the item they were read from, and
/// is otherwise read (with the state not borrowed, so a read that calls back
/// into the manager finds it usable) and recorded. When the records know
/// everything, as on every call after an item's first, the call borrows the
/// state once and copies nothing.
pub(crate) fn with_input<'py, M: StepManager, R>(
    manager: &Bound<'py, M>,
    request: &Bound<'py, PyAny>,
    input_id: usize,
    needs: Needs,
    op: impl FnOnce(&mut M::Cache, CallInput<'_>) -> PyResult<R>,
) -> PyResult<R> {
    let mut fresh = Fresh::default();
    let feature = match feature(request, input_id) {
        Ok(feature) => feature,
        // vLLM's `can_allocate` reads the size alone, which a request may give without the item.
        Err(err) if !needs.identifier && err.is_instance_of::<PyException>(request.py()) => {
            fresh.num_embeds = Some(num_embeds(request, input_id)?);
            return op(&mut write(manager)?.cache, fresh.input()?);
        }
        Err(err) => return Err(err),
    };
    let lacking = {
        let mut state = write(manager)?;
        let ManagerState { cache, records } = &mut *state;
        let known = records.call_input(request, input_id, &feature);
        if known.has(needs) {
            return op(cache, known);
        }
        known.lacking(needs)
    };
    fresh.read(request, input_id, &feature, lacking)?;
    {
        let mut state = write(manager)?;
        let ManagerState { cache, records } = &mut *state;
        if let Some(known) = records.remember(request, input_id, &feature, &mut fresh)? {
            if known.has(needs) {
                return op(cache, known);
            }
        }
    }
    // The records could not keep it all: the request id could not be read,
    // or a read called back into the manager and changed them.
    let needs = Needs { request_id: if needs.request_id == IdRead::Always { IdRead::Always } else { IdRead::Never }, ..needs };
    fresh.read(request, input_id, &feature, needs)?;
    op(&mut write(manager)?.cache, fresh.input()?)
}

/// Whether `set` holds exactly the ids of `inputs`, read straight from its
/// hash table: the public API would build an int and hash it for each id.
fn equals(set: &Bound<'_, PySet>, inputs: &HeldInputs) -> bool {
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
                && usize::try_from(slot.hash).is_ok_and(|id| inputs.contains(id))
                && ffi::PyLong_AsSsize_t(slot.key) == slot.hash
        })
    }
}
