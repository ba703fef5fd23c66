//! `EncoderCacheManager`: vLLM 0.33's Python API over [`EncoderCache`].

use pyo3::exceptions::{PyException, PyValueError};
use pyo3::gc::{PyTraverseError, PyVisit};
use pyo3::prelude::*;
use pyo3::types::{PyDict, PyList, PySet, PyTuple, PyType};

use super::key_list;
use super::records::{id_of, identifier_at, CallInput, ItemRecords};
use super::request::{count, identifier, input_index, num_embeds};
use super::state::{cache_state_from_dict, cache_state_to_dict, invariant_error};
use super::step::{self, StepManager};
use crate::cache::{CacheError, EncoderCache};
use crate::step::StepArgs;

#[pyclass(module = "encoder_cache._core", name = "EncoderCacheManager", subclass)]
pub struct PyEncoderCacheManager {
    cache: EncoderCache,
    records: ItemRecords,
}

impl From<CacheError> for PyErr {
    fn from(err: CacheError) -> PyErr {
        PyValueError::new_err(err.to_string())
    }
}

impl StepManager for PyEncoderCacheManager {
    type Cache = EncoderCache;

    fn records(&self) -> &ItemRecords {
        &self.records
    }

    fn parts(&mut self) -> (&mut EncoderCache, &mut ItemRecords) {
        (&mut self.cache, &mut self.records)
    }
}

#[pymethods]
impl PyEncoderCacheManager {
    #[new]
    fn new(cache_size: &Bound<'_, PyAny>) -> PyResult<Self> {
        Ok(Self { cache: EncoderCache::new(count(cache_size, "cache_size")?), records: ItemRecords::default() })
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

    fn reset(&mut self) {
        self.cache.reset();
        self.records.clear();
    }

    fn check_and_update_cache(slf: &Bound<'_, Self>, request: &Bound<'_, PyAny>, input_id: i64) -> PyResult<bool> {
        let input_id = input_index(input_id)?;
        let mut input = CallInput::read(slf, request, input_id)?;
        let item = input.identifier()?;
        let mut this = slf.try_borrow_mut()?;
        let hit = this.cache.check_and_update_cache(input.request_id()?, input_id, &item)?;
        input.remember(&mut this.records)?;
        Ok(hit)
    }

    fn get_cached_num_encoder_embeds(slf: &Bound<'_, Self>, request: &Bound<'_, PyAny>, input_id: i64) -> PyResult<Option<u64>> {
        let item = identifier_at(slf, request, input_index(input_id)?)?;
        let n = slf.try_borrow()?.cache.cached_num_embeds(item.as_str()?);
        Ok(n)
    }

    fn can_allocate(
        slf: &Bound<'_, Self>,
        request: &Bound<'_, PyAny>,
        input_id: i64,
        encoder_compute_budget: i64,
        num_embeds_to_schedule: i64,
    ) -> PyResult<bool> {
        let input_id = input_index(input_id)?;
        // vLLM reads only the size here: a request the records cannot place
        // (no request id, no such feature) is asked for it directly.
        let (n, input) = match CallInput::read(slf, request, input_id) {
            Ok(mut input) => (input.num_embeds()?, Some(input)),
            Err(err) if err.is_instance_of::<PyException>(slf.py()) => (num_embeds(request, input_id)?, None),
            Err(err) => return Err(err),
        };
        let mut this = slf.try_borrow_mut()?;
        let fits = this.cache.can_allocate(n, encoder_compute_budget, num_embeds_to_schedule);
        if let Some(input) = input {
            input.remember(&mut this.records)?;
        }
        Ok(fits)
    }

    fn allocate(slf: &Bound<'_, Self>, request: &Bound<'_, PyAny>, input_id: i64) -> PyResult<()> {
        let input_id = input_index(input_id)?;
        let mut input = CallInput::read(slf, request, input_id)?;
        let (item, n) = (input.identifier()?, input.num_embeds()?);
        let mut this = slf.try_borrow_mut()?;
        this.cache.allocate(input.request_id()?, input_id, item, n)?;
        input.remember(&mut this.records)
    }

    fn get_cached_input_ids<'py>(slf: &Bound<'py, Self>, request: &Bound<'py, PyAny>) -> PyResult<Bound<'py, PySet>> {
        let id = id_of(slf, request)?;
        let this = &mut *slf.try_borrow_mut()?;
        match this.cache.cached_input_ids(id.as_str()?) {
            Some(inputs) => this.records.input_set(request, &id, inputs),
            None => PySet::empty(slf.py()),
        }
    }

    fn free_encoder_input(slf: &Bound<'_, Self>, request: &Bound<'_, PyAny>, input_id: i64) -> PyResult<()> {
        let input_id = input_index(input_id)?;
        let id = id_of(slf, request)?;
        let freed = slf.try_borrow_mut()?.cache.free_encoder_input(id.as_str()?, input_id);
        if !freed {
            // Nothing to release, but an input the request does not have is still an error.
            identifier(request, input_id)?;
        }
        Ok(())
    }

    fn free(slf: &Bound<'_, Self>, request: &Bound<'_, PyAny>) -> PyResult<()> {
        let id = id_of(slf, request)?;
        let mut this = slf.try_borrow_mut()?;
        this.cache.free(id.as_str()?);
        this.records.forget(request);
        Ok(())
    }

    fn get_freed_mm_hashes<'py>(slf: &Bound<'py, Self>) -> PyResult<Bound<'py, PyList>> {
        let freed = slf.try_borrow_mut()?.cache.take_freed();
        key_list(slf.py(), &freed)
    }

    fn get_manager_metadata(&self) -> Option<Py<PyAny>> {
        None
    }

    #[getter]
    fn cache_size(&self) -> u64 {
        self.cache.cache_size()
    }

    #[getter]
    fn num_free_slots(&self) -> u64 {
        self.cache.num_free_slots()
    }

    #[getter]
    fn num_freeable_slots(&self) -> u64 {
        self.cache.num_freeable_slots()
    }

    /// Snapshot: identifier -> set of request ids referencing it.
    #[getter]
    fn cached<'py>(&self, py: Python<'py>) -> PyResult<Bound<'py, PyDict>> {
        let dict = PyDict::new(py);
        for (key, entry) in self.cache.entries() {
            dict.set_item(&**key, PySet::new(py, entry.referrers.iter().map(|r| &**r))?)?;
        }
        Ok(dict)
    }

    /// Snapshot: identifier -> embeddings stored.
    #[getter]
    fn num_embeds_by_hash<'py>(&self, py: Python<'py>) -> PyResult<Bound<'py, PyDict>> {
        let dict = PyDict::new(py);
        for (key, entry) in self.cache.entries() {
            dict.set_item(&**key, entry.num_embeds)?;
        }
        Ok(dict)
    }

    /// Snapshot: unreferenced identifier -> embeddings, oldest release first.
    #[getter]
    fn freeable<'py>(&self, py: Python<'py>) -> PyResult<Bound<'py, PyDict>> {
        let dict = PyDict::new(py);
        for (key, n) in self.cache.freeable() {
            dict.set_item(&**key, n)?;
        }
        Ok(dict)
    }

    /// Snapshot: request id -> set of cached input ids.
    #[getter]
    fn request_cached_ids<'py>(&self, py: Python<'py>) -> PyResult<Bound<'py, PyDict>> {
        let dict = PyDict::new(py);
        for (req, refs) in self.cache.requests() {
            dict.set_item(&**req, PySet::new(py, refs.inputs.keys())?)?;
        }
        Ok(dict)
    }

    /// Snapshot: request id -> identifier -> number of that request's cached inputs holding it.
    #[getter]
    fn request_hash_refs<'py>(&self, py: Python<'py>) -> PyResult<Bound<'py, PyDict>> {
        let dict = PyDict::new(py);
        for (req, refs) in self.cache.requests() {
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
    fn freed<'py>(&self, py: Python<'py>) -> PyResult<Bound<'py, PyList>> {
        key_list(py, self.cache.freed())
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
        let args = StepArgs {
            num_computed_tokens,
            num_new_tokens,
            encoder_compute_budget,
            shift_computed_tokens,
            disable_chunked_mm_input,
        };
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

    fn free_encoder_inputs_before(
        slf: &Bound<'_, Self>,
        request: &Bound<'_, PyAny>,
        position: i64,
    ) -> PyResult<Vec<usize>> {
        step::with_request(slf, request, |req| req.free_before(&mut slf.try_borrow_mut()?.cache, position, false))
    }

    fn __traverse__(&self, visit: PyVisit<'_>) -> Result<(), PyTraverseError> {
        self.records.traverse(&visit)
    }

    fn __clear__(&mut self) {
        self.records.clear();
    }

    fn __repr__(&self) -> String {
        format!(
            "EncoderCacheManager(cache_size={}, num_free_slots={}, num_freeable_slots={}, entries={}, requests={})",
            self.cache.cache_size(),
            self.cache.num_free_slots(),
            self.cache.num_freeable_slots(),
            self.cache.entries().len(),
            self.cache.requests().len(),
        )
    }

    // Reliability: invariant check and state dump/restore (see src/bindings/state.rs).

    /// Raise `encoder_cache.InvariantError` naming the first broken bookkeeping rule.
    fn check_invariants(&self) -> PyResult<()> {
        self.cache.check_invariants().map_err(invariant_error)
    }

    /// The whole state as a plain dict (`json.dumps`-able); `restore` takes it back.
    fn snapshot<'py>(&self, py: Python<'py>) -> PyResult<Bound<'py, PyDict>> {
        cache_state_to_dict(py, &self.cache.snapshot())
    }

    /// A manager in the state `snapshot()` gave; ValueError if it breaks an invariant.
    #[classmethod]
    fn restore<'py>(cls: &Bound<'py, PyType>, state: &Bound<'py, PyAny>) -> PyResult<Bound<'py, PyAny>> {
        let state = cache_state_from_dict(state)?;
        let cache = EncoderCache::restore(&state)
            .map_err(|v| PyValueError::new_err(format!("inconsistent state: {v}")))?;
        let manager = cls.call1((state.cache_size,))?;
        manager.cast::<Self>()?.try_borrow_mut()?.cache = cache;
        Ok(manager)
    }
}

