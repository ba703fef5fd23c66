//! `EncoderCacheManager`: vLLM 0.33's Python API over [`EncoderCache`].

use pyo3::exceptions::PyValueError;
use pyo3::gc::{PyTraverseError, PyVisit};
use pyo3::intern;
use pyo3::prelude::*;
use pyo3::sync::PyOnceLock;
use pyo3::types::{PyDict, PyList, PySet, PyString, PyTuple, PyType};

use super::calls::{free_request, with_input, with_recorded_key, with_request_id, Needs};
use super::events::PyEventBatch;
use super::methods::manager_methods;
use super::modality;
use super::records::{HeldAnswer, RequestRecord};
use super::request::{count, features, identifier, identifier_of, input_index, request_id, span_of};
use super::shared::ManagerState;
use super::state::{cache_state_from_dict, cache_state_to_dict};
use crate::cache::{Counters, EncoderCache, Key, Policy, DEFAULT_MAX_PENDING};

/// The encoder cache of a multimodal model, with vLLM 0.33's API: which items
/// (by content hash) are cached, which requests reference them, which
/// unreferenced entries may be evicted, and which evictions the workers must
/// hear about. `cache_size` is counted in encoder embeddings; `policy` (one of
/// `encoder_cache.POLICIES`) chooses which unreferenced entry goes first, and
/// the default, "vllm", makes exactly vLLM 0.33's choices.
#[pyclass(module = "encoder_cache._core", name = "EncoderCacheManager", subclass)]
pub struct PyEncoderCacheManager {
    state: ManagerState<EncoderCache>,
}

impl PyEncoderCacheManager {
    fn dump<'py>(cache: &EncoderCache, py: Python<'py>) -> PyResult<Bound<'py, PyDict>> {
        cache_state_to_dict(py, &cache.snapshot(), &cache.policy_snapshot())
    }

    fn load(state: &Bound<'_, PyAny>) -> PyResult<EncoderCache> {
        let (state, policy) = cache_state_from_dict(state)?;
        EncoderCache::restore_with(&state, &policy).map_err(|v| super::errors::inconsistent_state(&v))
    }
}

manager_methods!(PyEncoderCacheManager, EncoderCache {
    #[new]
    #[pyo3(signature = (cache_size, *, policy = "vllm"))]
    fn new(cache_size: &Bound<'_, PyAny>, policy: &str) -> PyResult<Self> {
        let cache_size = count(cache_size, "cache_size")?;
        let policy = Policy::from_name(policy).ok_or_else(|| {
            PyValueError::new_err(format!("policy must be one of {} or {}, got {policy:?}", Policy::NAMES.join(", "), Policy::AUTO))
        })?;
        Ok(Self { state: ManagerState::new(EncoderCache::with_policy(cache_size, policy)) })
    }

    /// The eviction policy's name, one of `encoder_cache.POLICIES`.
    #[getter]
    fn policy(slf: &Bound<'_, Self>) -> PyResult<&'static str> {
        Ok(slf.try_borrow()?.cache.policy().name())
    }

    /// Record that `request`, waiting to be scheduled, will need its items:
    /// until `unmark_waiting(request)`, an unreferenced entry it needs is
    /// evicted only after every unreferenced entry no waiting request needs.
    ///
    /// `num_computed_tokens` is where the request will start: the tokens its
    /// cached KV prefix covers. An item whose placeholder ends there or
    /// before is never looked up, so it is not marked.
    ///
    /// Marks apply to items not cached yet too. Raises ValueError, changing
    /// nothing, if the request is marked already or `num_computed_tokens` is
    /// negative.
    #[pyo3(signature = (request, num_computed_tokens = 0))]
    fn mark_waiting(slf: &Bound<'_, Self>, request: &Bound<'_, PyAny>, num_computed_tokens: i64) -> PyResult<()> {
        let start = u64::try_from(num_computed_tokens)
            .map_err(|_| PyValueError::new_err(format!("num_computed_tokens must be >= 0, got {num_computed_tokens}")))?;
        let id = request_id(request)?;
        let py = slf.py();
        let mut identifiers = Vec::new();
        for feature in features(request)?.try_iter()? {
            let feature = feature?;
            if start > 0 {
                let (offset, length) = span_of(&feature.getattr(intern!(py, "mm_position"))?)?;
                if offset.saturating_add(length) <= start {
                    continue; // inside the cached prefix
                }
            }
            identifiers.push(Key::from(identifier_of(&feature)?.to_str()?));
        }
        Ok(slf.try_borrow_mut()?.cache.mark_waiting(id.to_str()?, identifiers)?)
    }

    /// Drop `request`'s waiting mark (it was scheduled, aborted or finished).
    /// Raises ValueError, changing nothing, if it has none.
    fn unmark_waiting(slf: &Bound<'_, Self>, request: &Bound<'_, PyAny>) -> PyResult<()> {
        Ok(with_request_id(slf, request, |cache: &mut EncoderCache, id| cache.unmark_waiting(id))??)
    }

    /// Return the counters since construction or `reset_stats()`, and the cache's fill.
    ///
    /// Keys: `hits`, `misses`, `hit_embeds`, `miss_embeds` (one hit or miss
    /// per item a request acquires: a hit takes a cached entry, a miss
    /// allocates one to encode), `evictions`, `evicted_embeds`, `reencodes`
    /// and `reencode_embeds` (misses on items this manager evicted earlier),
    /// `entries`, `used_embeds`, `freeable_embeds`, and `by_modality`: the
    /// counters per `mm_features[i].modality` ("unknown" without one).
    fn stats<'py>(slf: &Bound<'py, Self>) -> PyResult<Bound<'py, PyDict>> {
        let (py, mut state) = (slf.py(), slf.try_borrow_mut()?);
        let counts = state.cache.stats();
        let cache = &state.cache;
        let names = counter_names(py);
        let counters = |values: &Counters| -> PyResult<Bound<'py, PyDict>> {
            let dict = PyDict::new(py);
            for (name, (_, n)) in names.iter().zip(values.named()) {
                dict.set_item(name.bind(py), n)?;
            }
            Ok(dict)
        };
        let report = counters(&counts.total)?;
        report.set_item(intern!(py, "entries"), cache.num_entries())?;
        report.set_item(intern!(py, "used_embeds"), cache.used_embeds())?;
        report.set_item(intern!(py, "freeable_embeds"), cache.freeable_embeds())?;
        let by_modality = PyDict::new(py);
        for (tag, values) in (0u8..).zip(&counts.by_modality) {
            if !values.is_zero() {
                by_modality.set_item(modality::name(tag), counters(values)?)?;
            }
        }
        report.set_item(intern!(py, "by_modality"), by_modality)?;
        Ok(report)
    }

    /// Zero the counters `stats()` reports; the cache's contents stay.
    fn reset_stats(slf: &Bound<'_, Self>) -> PyResult<()> {
        slf.try_borrow_mut()?.cache.reset_stats();
        Ok(())
    }

    /// Return True if the item at `input_id` is cached, and record that the
    /// request uses it there (taking the entry off the eviction list if it was
    /// unreferenced); False if it is not cached.
    ///
    /// Raises IndexError for an input the request does not have, and
    /// ValueError if the request already holds this input as another item.
    fn check_and_update_cache(slf: &Bound<'_, Self>, request: &Bound<'_, PyAny>, input_id: i64) -> PyResult<bool> {
        let input_id = input_index(input_id)?;
        with_input(slf, request, input_id, Needs::HIT, |cache, input| {
            Ok(cache.check_and_update_cache(input.request_id()?, input_id, input.identifier()?)?)
        })
    }

    /// Return the embedding count cached for the item at `input_id`, or None if it is not cached.
    fn get_cached_num_encoder_embeds(slf: &Bound<'_, Self>, request: &Bound<'_, PyAny>, input_id: i64) -> PyResult<Option<u64>> {
        let input_id = input_index(input_id)?;
        if let Some(answer) = with_recorded_key(slf, request, input_id, |cache, key| cache.cached_num_embeds(key))? {
            return Ok(answer);
        }
        read_cached_num_embeds(slf, request, input_id)
    }

    /// Return whether the item at `input_id` fits this step: within
    /// `encoder_compute_budget`, and in the cache beside the
    /// `num_embeds_to_schedule` embeddings the step already promised.
    ///
    /// Evicts unreferenced entries in the policy's order when that makes
    /// room; evicts nothing when even that would not. As in vLLM, the budget
    /// and count are compared as given: a negative budget fits nothing, a
    /// negative count adds room.
    fn can_allocate(
        slf: &Bound<'_, Self>,
        request: &Bound<'_, PyAny>,
        input_id: i64,
        encoder_compute_budget: i64,
        num_embeds_to_schedule: i64,
    ) -> PyResult<bool> {
        with_input(slf, request, input_index(input_id)?, Needs::SIZE, |cache, input| {
            Ok(cache.can_allocate(input.num_embeds()?, encoder_compute_budget, num_embeds_to_schedule))
        })
    }

    /// Reserve cache space for the item at `input_id`, about to be encoded,
    /// referenced by the request.
    ///
    /// Raises ValueError, changing nothing, if the item is already cached, if
    /// there is no room (call `can_allocate` first), or if the request holds
    /// this input as another item.
    fn allocate(slf: &Bound<'_, Self>, request: &Bound<'_, PyAny>, input_id: i64) -> PyResult<()> {
        let input_id = input_index(input_id)?;
        with_input(slf, request, input_id, Needs::ALL, |cache, input| {
            Ok(cache.allocate_tagged(input.request_id()?, input_id, input.identifier()?, input.num_embeds()?, input.modality()?)?)
        })
        .map(drop)
    }

    /// Return the input ids the request holds in the cache.
    ///
    /// As with vLLM's live set, the set is the manager's: copy it before
    /// changing it. Unlike vLLM's, it never changes after it is handed out:
    /// while the request holds the same inputs every call returns the same
    /// set, and a change to the holdings makes a new one.
    // A caller's change to the shared set that alters its size is caught,
    // and the set is built afresh.
    fn get_cached_input_ids<'py>(slf: &Bound<'py, Self>, request: &Bound<'py, PyAny>) -> PyResult<Bound<'py, PySet>> {
        let py = slf.py();
        {
            let mut guard = slf.try_borrow_mut()?;
            let state: &mut ManagerState<EncoderCache> = &mut guard;
            if let Some(record) = state.records.get_mut(request) {
                return held_ids_set(py, &state.cache, record);
            }
        }
        first_held_ids_set(slf, request)
    }

    /// Drop the request's hold on one input. The request's reference to the
    /// item goes with its last held occurrence; an entry left unreferenced
    /// becomes evictable but stays cached until room is needed.
    ///
    /// Freeing an input the request does not hold (freed already, or never
    /// cached) changes nothing, as in vLLM; an input id the request does not
    /// have raises IndexError.
    fn free_encoder_input(slf: &Bound<'_, Self>, request: &Bound<'_, PyAny>, input_id: i64) -> PyResult<()> {
        let input_id = input_index(input_id)?;
        if !with_request_id(slf, request, |cache: &mut EncoderCache, id| cache.free_encoder_input(id, input_id))? {
            // Nothing to release, but an input the request does not have is still an error.
            identifier(request, input_id)?;
        }
        Ok(())
    }

    /// Drop every hold the request has (it finished, was aborted or was
    /// preempted), and forget what was read of it. Freeing a request the
    /// manager does not know, or one freed already, changes nothing.
    fn free(slf: &Bound<'_, Self>, request: &Bound<'_, PyAny>) -> PyResult<()> {
        free_request(slf, request, |cache: &mut EncoderCache, id| cache.free(id))
    }

    /// Slots that are free or held by unreferenced (evictable) entries.
    #[getter]
    fn num_freeable_slots(slf: &Bound<'_, Self>) -> PyResult<u64> {
        Ok(slf.try_borrow()?.cache.num_freeable_slots())
    }

    /// A snapshot: identifier -> set of the request ids referencing it.
    #[getter]
    fn cached<'py>(slf: &Bound<'py, Self>) -> PyResult<Bound<'py, PyDict>> {
        let (py, state) = (slf.py(), slf.try_borrow()?);
        let dict = PyDict::new(py);
        crate::with_policy_cache!(&state.cache, c => {
            for (key, _, referrers) in c.entries() {
                dict.set_item(&**key, PySet::new(py, referrers.map(|r| &**r))?)?;
            }
        });
        Ok(dict)
    }

    /// A snapshot: identifier -> embeddings cached.
    #[getter]
    fn num_embeds_by_hash<'py>(slf: &Bound<'py, Self>) -> PyResult<Bound<'py, PyDict>> {
        let (py, state) = (slf.py(), slf.try_borrow()?);
        let dict = PyDict::new(py);
        crate::with_policy_cache!(&state.cache, c => {
            for (key, num_embeds, _) in c.entries() {
                dict.set_item(&**key, num_embeds)?;
            }
        });
        Ok(dict)
    }

    /// A snapshot: unreferenced identifier -> embeddings, next eviction first.
    #[getter]
    fn freeable<'py>(slf: &Bound<'py, Self>) -> PyResult<Bound<'py, PyDict>> {
        let (py, state) = (slf.py(), slf.try_borrow()?);
        let dict = PyDict::new(py);
        for (key, n) in state.cache.freeable() {
            dict.set_item(&**key, n)?;
        }
        Ok(dict)
    }

    /// A snapshot: request id -> set of the input ids it holds.
    #[getter]
    fn request_cached_ids<'py>(slf: &Bound<'py, Self>) -> PyResult<Bound<'py, PyDict>> {
        let (py, state) = (slf.py(), slf.try_borrow()?);
        let dict = PyDict::new(py);
        crate::with_policy_cache!(&state.cache, c => {
            for (request, inputs) in c.requests() {
                dict.set_item(&**request, PySet::new(py, inputs.map(|(input_id, _)| input_id))?)?;
            }
        });
        Ok(dict)
    }

    /// A snapshot: request id -> identifier -> how many of the request's held inputs hold it.
    #[getter]
    fn request_hash_refs<'py>(slf: &Bound<'py, Self>) -> PyResult<Bound<'py, PyDict>> {
        let (py, state) = (slf.py(), slf.try_borrow()?);
        let dict = PyDict::new(py);
        crate::with_policy_cache!(&state.cache, c => {
            for (request, inputs) in c.requests() {
                let counts = PyDict::new(py);
                for (_, item) in inputs {
                    let n: u64 = counts.get_item(&**item)?.map_or(Ok(0), |n| n.extract())?;
                    counts.set_item(&**item, n + 1)?;
                }
                dict.set_item(&**request, counts)?;
            }
        });
        Ok(dict)
    }

    /// A snapshot: identifiers evicted since the last `get_freed_mm_hashes()`, in eviction order.
    #[getter]
    fn freed<'py>(slf: &Bound<'py, Self>) -> PyResult<Bound<'py, PyList>> {
        let (py, state) = (slf.py(), slf.try_borrow()?);
        PyList::new(py, state.cache.freed().into_iter().map(|k| &**k))
    }

    /// Start recording cache events for `take_step_events()`: each
    /// allocation, each `get_freed_mm_hashes()` report, each `reset()`.
    ///
    /// Recording costs nothing while off (the default). At most
    /// `max_pending` identifiers (default 65,536) wait for a drain; past that the pending
    /// events are dropped and the next drain reports a clear and every
    /// cached item instead. Enabling again changes only the bound. Not part
    /// of `snapshot()`: a restored manager records nothing until enabled.
    #[pyo3(signature = (max_pending = None))]
    fn enable_events(slf: &Bound<'_, Self>, max_pending: Option<&Bound<'_, PyAny>>) -> PyResult<()> {
        let max_pending = match max_pending {
            Some(n) => usize::try_from(count(n, "max_pending")?).unwrap_or(usize::MAX),
            None => DEFAULT_MAX_PENDING,
        };
        slf.try_borrow_mut()?.cache.enable_events(max_pending);
        Ok(())
    }

    /// Return the cache events since the last call as `(cleared, removed,
    /// stored)`, and empty the log.
    ///
    /// Applied in order to the items known after the previous call, they
    /// give the cached items now: `cleared`, forget them all (the cache was
    /// reset, or the log overflowed); `removed`, the identifiers
    /// `get_freed_mm_hashes()` reported, in order; `stored`, the items
    /// allocated since and still cached, as `(identifier, embeds, modality)`
    /// in the order of their first allocation. Call it right after
    /// `get_freed_mm_hashes()`. Raises ValueError if events are off.
    fn take_step_events<'py>(slf: &Bound<'py, Self>) -> PyResult<Bound<'py, PyTuple>> {
        let events = slf.try_borrow_mut()?.cache.take_events();
        let events = events.ok_or_else(|| PyValueError::new_err("cache events are off: call enable_events() first"))?;
        super::events::step_events(slf.py(), &events)
    }

    /// Drain the cache events as `take_step_events()` does, as one
    /// `EventBatch`, or None if nothing was stored, removed or cleared.
    ///
    /// The batch keeps the events in Rust: `EventBatch.encode()` writes the
    /// message payload without a Python object per event. Raises ValueError
    /// if events are off.
    fn take_event_batch(slf: &Bound<'_, Self>) -> PyResult<Option<PyEventBatch>> {
        let events = slf.try_borrow_mut()?.cache.take_events();
        let events = events.ok_or_else(|| PyValueError::new_err("cache events are off: call enable_events() first"))?;
        Ok((!events.is_empty()).then_some(PyEventBatch { events }))
    }

    /// Return every cached item as `(identifier, embeds, modality)`, sorted by identifier.
    fn cached_items<'py>(slf: &Bound<'py, Self>) -> PyResult<Bound<'py, PyList>> {
        let items = slf.try_borrow()?.cache.cached_items();
        super::events::item_list(slf.py(), &items)
    }

    fn __repr__(slf: &Bound<'_, Self>) -> PyResult<String> {
        let state = slf.try_borrow()?;
        Ok(format!(
            "EncoderCacheManager(cache_size={}, policy={:?}, num_free_slots={}, num_freeable_slots={}, entries={}, requests={})",
            state.cache.cache_size(),
            state.cache.policy().name(),
            state.cache.num_free_slots(),
            state.cache.num_freeable_slots(),
            state.cache.num_entries(),
            state.cache.num_requests(),
        ))
    }
});

/// The counters' names as Python strings, made once: `stats()` is a few
/// dict insertions, not a string built and hashed per key.
fn counter_names(py: Python<'_>) -> &'static [Py<PyString>; 8] {
    static NAMES: PyOnceLock<[Py<PyString>; 8]> = PyOnceLock::new();
    NAMES.get_or_init(py, || Counters::default().named().map(|(name, _)| PyString::intern(py, name).unbind()))
}

/// `get_cached_num_encoder_embeds` for an item its request's record does
/// not know yet. Out of line: inlined, its reads made the common case save
/// every register and set up a large frame on each call.
#[inline(never)]
fn read_cached_num_embeds(
    manager: &Bound<'_, PyEncoderCacheManager>,
    request: &Bound<'_, PyAny>,
    input_id: usize,
) -> PyResult<Option<u64>> {
    with_input(manager, request, input_id, Needs::IDENTIFIER, |cache, input| Ok(cache.cached_num_embeds(input.identifier()?)))
}

/// `get_cached_input_ids` for a request seen for the first time, which gets
/// its record here: vLLM asks this of every running request on every step,
/// also of one that never looked up an item (its items all in its cached KV
/// prefix). Out of line, as `read_cached_num_embeds` is.
#[inline(never)]
fn first_held_ids_set<'py>(manager: &Bound<'py, PyEncoderCacheManager>, request: &Bound<'py, PyAny>) -> PyResult<Bound<'py, PySet>> {
    let id = request_id(request)?; // may run Python code: read with the manager not borrowed
    let (set, displaced) = {
        let mut guard = manager.try_borrow_mut()?;
        let state: &mut ManagerState<EncoderCache> = &mut guard;
        let record = state.records.entry(request, id.to_str()?);
        let set = held_ids_set(manager.py(), &state.cache, record);
        (set, state.records.take_displaced())
    };
    drop(displaced); // with the manager not borrowed
    set
}

/// `get_cached_input_ids`' answer for the request `record` describes: the
/// set the record keeps while the holdings it was made for stay the same
/// (and the caller has not changed its size), else a set made and kept.
/// Built under the borrow: a set of ints runs no Python code.
fn held_ids_set<'py>(py: Python<'py>, cache: &EncoderCache, record: &mut RequestRecord) -> PyResult<Bound<'py, PySet>> {
    let Some((request, held)) = cache.held_inputs(record.id()) else {
        return PySet::empty(py);
    };
    let changes = held.changes();
    if let Some(answer) = record.held_ids.as_deref() {
        let set = answer.set.bind(py);
        if answer.request == request && answer.changes == changes && set.len() == held.len() {
            return Ok(set.clone());
        }
    }
    let set = PySet::new(py, held.positions())?;
    let answer = HeldAnswer { request, changes, set: set.clone().unbind() };
    match record.held_ids.as_deref_mut() {
        Some(kept) => *kept = answer,
        None => record.held_ids = Some(Box::new(answer)),
    }
    Ok(set)
}
