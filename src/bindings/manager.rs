//! `EncoderCacheManager`: vLLM 0.33's Python API over [`EncoderCache`].

use pyo3::exceptions::PyValueError;
use pyo3::gc::{PyTraverseError, PyVisit};
use pyo3::prelude::*;
use pyo3::types::{PyDict, PyList, PySet, PyTuple, PyType};

use super::cell::StateCell;
use super::fast::{self, fast_method};
use super::key_list;
use super::records::{cached_input_set, with_input, with_request_id, Needs};
use super::request::{count, identifier, input_index};
use super::state::{cache_state_from_dict, cache_state_to_dict, invariant_error};
use super::step::{self, read, write, ManagerState, StepManager};
use crate::cache::{CacheError, EncoderCache};
use crate::step::StepArgs;

#[pyclass(module = "encoder_cache._core", name = "EncoderCacheManager", subclass, frozen)]
pub struct PyEncoderCacheManager {
    state: StateCell<ManagerState<EncoderCache>>,
}

impl From<CacheError> for PyErr {
    fn from(err: CacheError) -> PyErr {
        PyValueError::new_err(err.to_string())
    }
}

impl StepManager for PyEncoderCacheManager {
    type Cache = EncoderCache;

    fn cell(&self) -> &StateCell<ManagerState<EncoderCache>> {
        &self.state
    }
}

#[pymethods]
impl PyEncoderCacheManager {
    #[new]
    fn new(cache_size: &Bound<'_, PyAny>) -> PyResult<Self> {
        Ok(Self { state: ManagerState::new(EncoderCache::new(count(cache_size, "cache_size")?)) })
    }

    /// vLLM's factory hook: `cls(cache_size)`, so subclasses construct themselves.
    #[classmethod]
    #[pyo3(signature = (*, cache_size, vllm_config=None))]
    fn create_manager<'py>(
        cls: &Bound<'py, PyType>,
        cache_size: &Bound<'py, PyAny>,
        vllm_config: Option<&Bound<'py, PyAny>>,
    ) -> PyResult<Bound<'py, PyAny>> {
        let _ = vllm_config;
        cls.call1((cache_size,))
    }

    fn reset(slf: &Bound<'_, Self>) -> PyResult<()> {
        let mut state = write(slf)?;
        state.cache.reset();
        state.records.clear();
        Ok(())
    }

    fn check_and_update_cache(slf: &Bound<'_, Self>, request: &Bound<'_, PyAny>, input_id: i64) -> PyResult<bool> {
        let input_id = input_index(input_id)?;
        with_input(slf, request, input_id, Needs::HIT, |cache, input| {
            Ok(cache.check_and_update_cache(input.request_id()?, input_id, input.identifier()?)?)
        })
    }

    fn get_cached_num_encoder_embeds(slf: &Bound<'_, Self>, request: &Bound<'_, PyAny>, input_id: i64) -> PyResult<Option<u64>> {
        with_input(slf, request, input_index(input_id)?, Needs::IDENTIFIER, |cache, input| Ok(cache.cached_num_embeds(input.identifier()?)))
    }

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

    fn allocate(slf: &Bound<'_, Self>, request: &Bound<'_, PyAny>, input_id: i64) -> PyResult<()> {
        let input_id = input_index(input_id)?;
        with_input(slf, request, input_id, Needs::ALL, |cache, input| {
            Ok(cache.allocate(input.request_id()?, input_id, input.identifier()?.clone(), input.num_embeds()?)?)
        })
    }

    fn get_cached_input_ids<'py>(slf: &Bound<'py, Self>, request: &Bound<'py, PyAny>) -> PyResult<Bound<'py, PySet>> {
        cached_input_set(slf, request)
    }

    fn free_encoder_input(slf: &Bound<'_, Self>, request: &Bound<'_, PyAny>, input_id: i64) -> PyResult<()> {
        let input_id = input_index(input_id)?;
        if !with_request_id(slf, request, |cache, id| cache.free_encoder_input(id, input_id))? {
            // Nothing to release, but an input the request does not have is still an error.
            identifier(request, input_id)?;
        }
        Ok(())
    }

    fn free(slf: &Bound<'_, Self>, request: &Bound<'_, PyAny>) -> PyResult<()> {
        with_request_id(slf, request, |cache, id| cache.free(id))?;
        write(slf)?.records.forget(request);
        Ok(())
    }

    fn get_freed_mm_hashes<'py>(slf: &Bound<'py, Self>) -> PyResult<Bound<'py, PyList>> {
        let freed = write(slf)?.cache.take_freed();
        key_list(slf.py(), &freed)
    }

    fn get_manager_metadata(&self) -> Option<Py<PyAny>> {
        None
    }

    #[getter]
    fn cache_size(slf: &Bound<'_, Self>) -> PyResult<u64> {
        Ok(read(slf)?.cache.cache_size())
    }

    #[getter]
    fn num_free_slots(slf: &Bound<'_, Self>) -> PyResult<u64> {
        Ok(read(slf)?.cache.num_free_slots())
    }

    #[getter]
    fn num_freeable_slots(slf: &Bound<'_, Self>) -> PyResult<u64> {
        Ok(read(slf)?.cache.num_freeable_slots())
    }

    /// Snapshot: identifier -> set of request ids referencing it.
    #[getter]
    fn cached<'py>(slf: &Bound<'py, Self>) -> PyResult<Bound<'py, PyDict>> {
        let (py, state) = (slf.py(), read(slf)?);
        let dict = PyDict::new(py);
        for (key, entry) in state.cache.entries() {
            dict.set_item(&**key, PySet::new(py, entry.referrers.iter().map(|r| &**r))?)?;
        }
        Ok(dict)
    }

    /// Snapshot: identifier -> embeddings stored.
    #[getter]
    fn num_embeds_by_hash<'py>(slf: &Bound<'py, Self>) -> PyResult<Bound<'py, PyDict>> {
        let (py, state) = (slf.py(), read(slf)?);
        let dict = PyDict::new(py);
        for (key, entry) in state.cache.entries() {
            dict.set_item(&**key, entry.num_embeds)?;
        }
        Ok(dict)
    }

    /// Snapshot: unreferenced identifier -> embeddings, oldest release first.
    #[getter]
    fn freeable<'py>(slf: &Bound<'py, Self>) -> PyResult<Bound<'py, PyDict>> {
        let (py, state) = (slf.py(), read(slf)?);
        let dict = PyDict::new(py);
        for (key, n) in state.cache.freeable() {
            dict.set_item(&**key, n)?;
        }
        Ok(dict)
    }

    /// Snapshot: request id -> set of cached input ids.
    #[getter]
    fn request_cached_ids<'py>(slf: &Bound<'py, Self>) -> PyResult<Bound<'py, PyDict>> {
        let (py, state) = (slf.py(), read(slf)?);
        let dict = PyDict::new(py);
        for (req, refs) in state.cache.requests() {
            dict.set_item(&**req, PySet::new(py, refs.inputs.positions())?)?;
        }
        Ok(dict)
    }

    /// Snapshot: request id -> identifier -> number of that request's cached inputs holding it.
    #[getter]
    fn request_hash_refs<'py>(slf: &Bound<'py, Self>) -> PyResult<Bound<'py, PyDict>> {
        let (py, state) = (slf.py(), read(slf)?);
        let dict = PyDict::new(py);
        for (req, refs) in state.cache.requests() {
            let counts = PyDict::new(py);
            for (key, n) in refs.occurrences() {
                counts.set_item(&**key, n)?;
            }
            dict.set_item(&**req, counts)?;
        }
        Ok(dict)
    }

    /// Snapshot: identifiers evicted since the last `get_freed_mm_hashes()`.
    #[getter]
    fn freed<'py>(slf: &Bound<'py, Self>) -> PyResult<Bound<'py, PyList>> {
        let (py, state) = (slf.py(), read(slf)?);
        key_list(py, state.cache.freed())
    }

    // Step-level API: vLLM's per-item scheduler loops as one call per request
    // per step, over item records read from the request when first needed (see `step`).

    #[pyo3(signature = (
        request, num_computed_tokens, num_new_tokens, encoder_compute_budget, shift_computed_tokens=0,
        *, disable_chunked_mm_input=false, has_remote_item=None, on_mismatch=None,
    ))]
    #[allow(clippy::too_many_arguments)]
    fn try_schedule_encoder_inputs<'py>(
        slf: &Bound<'py, Self>,
        request: &Bound<'py, PyAny>,
        num_computed_tokens: i64,
        num_new_tokens: i64,
        encoder_compute_budget: i64,
        shift_computed_tokens: i64,
        disable_chunked_mm_input: bool,
        has_remote_item: Option<&Bound<'py, PyAny>>,
        on_mismatch: Option<&Bound<'py, PyAny>>,
    ) -> PyResult<Bound<'py, PyTuple>> {
        let args =
            StepArgs { num_computed_tokens, num_new_tokens, encoder_compute_budget, shift_computed_tokens, disable_chunked_mm_input };
        step::try_schedule_encoder_inputs(slf, request, args, has_remote_item, on_mismatch)
    }

    fn allocate_encoder_inputs(
        slf: &Bound<'_, Self>,
        request: &Bound<'_, PyAny>,
        input_ids: Vec<i64>,
        duplicate_input_ids: Vec<i64>,
    ) -> PyResult<()> {
        step::allocate_encoder_inputs(slf, request, input_ids, duplicate_input_ids)
    }

    fn free_encoder_inputs_before(slf: &Bound<'_, Self>, request: &Bound<'_, PyAny>, position: i64) -> PyResult<Vec<usize>> {
        step::with_request(slf, request, |req| req.free_before(&mut write(slf)?.cache, position, false))
    }

    fn __traverse__(&self, visit: PyVisit<'_>) -> Result<(), PyTraverseError> {
        step::traverse(self, &visit)
    }

    fn __clear__(slf: &Bound<'_, Self>) {
        step::clear(slf);
    }

    fn __repr__(slf: &Bound<'_, Self>) -> PyResult<String> {
        let state = read(slf)?;
        Ok(format!(
            "EncoderCacheManager(cache_size={}, num_free_slots={}, num_freeable_slots={}, entries={}, requests={})",
            state.cache.cache_size(),
            state.cache.num_free_slots(),
            state.cache.num_freeable_slots(),
            state.cache.entries().len(),
            state.cache.requests().len(),
        ))
    }

    // Reliability: invariant check and state dump/restore (see src/bindings/state.rs).

    /// Raise `encoder_cache.InvariantError` naming the first broken bookkeeping rule.
    fn check_invariants(slf: &Bound<'_, Self>) -> PyResult<()> {
        read(slf)?.cache.check_invariants().map_err(invariant_error)
    }

    /// The whole state as a plain dict (`json.dumps`-able); `restore` takes it back.
    fn snapshot<'py>(slf: &Bound<'py, Self>) -> PyResult<Bound<'py, PyDict>> {
        let (py, state) = (slf.py(), read(slf)?);
        cache_state_to_dict(py, &state.cache.snapshot())
    }

    /// A manager in the state `snapshot()` gave; ValueError if it breaks an invariant.
    #[classmethod]
    fn restore<'py>(cls: &Bound<'py, PyType>, state: &Bound<'py, PyAny>) -> PyResult<Bound<'py, PyAny>> {
        let state = cache_state_from_dict(state)?;
        let cache = EncoderCache::restore(&state).map_err(|v| PyValueError::new_err(format!("inconsistent state: {v}")))?;
        let manager = cls.call1((state.cache_size,))?;
        write(manager.cast::<Self>()?)?.cache = cache;
        Ok(manager)
    }
}

#[allow(non_upper_case_globals)]
mod fast_methods {
    use super::*;

    fast_method!(PyEncoderCacheManager, check_and_update_cache, 1, |slf, request, [input_id]| {
        PyEncoderCacheManager::check_and_update_cache(slf, request, input_id)
    });
    fast_method!(PyEncoderCacheManager, can_allocate, 3, |slf, request, [input_id, budget, scheduled]| {
        PyEncoderCacheManager::can_allocate(slf, request, input_id, budget, scheduled)
    });
    // PyO3 returns `()` as None, where `IntoPyObject` would make it an empty tuple.
    fast_method!(PyEncoderCacheManager, allocate, 1, |slf, request, [input_id]| {
        PyEncoderCacheManager::allocate(slf, request, input_id).map(|()| slf.py().None())
    });
    fast_method!(PyEncoderCacheManager, get_cached_num_encoder_embeds, 1, |slf, request, [input_id]| {
        PyEncoderCacheManager::get_cached_num_encoder_embeds(slf, request, input_id)
    });
    fast_method!(PyEncoderCacheManager, get_cached_input_ids, 0, |slf, request, []| PyEncoderCacheManager::get_cached_input_ids(
        slf, request
    ));
    fast_method!(PyEncoderCacheManager, free_encoder_input, 1, |slf, request, [input_id]| {
        PyEncoderCacheManager::free_encoder_input(slf, request, input_id).map(|()| slf.py().None())
    });
    fast_method!(PyEncoderCacheManager, free, 0, |slf, request, []| PyEncoderCacheManager::free(slf, request).map(|()| slf.py().None()));

    /// The methods vLLM's scheduler calls per item, and per request.
    pub(crate) const ALL: [&fast::FastMethod; 7] = [
        &check_and_update_cache,
        &can_allocate,
        &allocate,
        &get_cached_num_encoder_embeds,
        &get_cached_input_ids,
        &free_encoder_input,
        &free,
    ];
}

/// Gives the class its fast entries; once, when the module is loaded.
pub(crate) fn install_fast_methods(cls: &Bound<'_, PyType>) -> PyResult<()> {
    fast::install(cls, &fast_methods::ALL)
}
