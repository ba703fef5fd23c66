//! `EncoderDecoderCacheManager`: vLLM 0.33's scheduling-only manager for
//! encoder-decoder models, over [`EncoderDecoderCache`].

use std::sync::Arc;

use pyo3::gc::{PyTraverseError, PyVisit};
use pyo3::intern;
use pyo3::prelude::*;
use pyo3::types::{PyDict, PyList, PySet, PyTuple, PyType};

use super::cell::StateCell;
use super::key_list;
use super::request::{count, identifier, input_index, num_embeds, num_features};
use super::state::{encoder_decoder_state_from_dict, encoder_decoder_state_to_dict};
use super::step::{self, read, write, ManagerState, StepManager};
use crate::encoder_decoder::EncoderDecoderCache;
use crate::step::StepArgs;

#[pyclass(module = "encoder_cache._core", name = "EncoderDecoderCacheManager", subclass, frozen)]
pub struct PyEncoderDecoderCacheManager {
    state: StateCell<ManagerState<EncoderDecoderCache>>,
}

impl StepManager for PyEncoderDecoderCacheManager {
    type Cache = EncoderDecoderCache;

    fn cell(&self) -> &StateCell<ManagerState<EncoderDecoderCache>> {
        &self.state
    }
}

#[pymethods]
impl PyEncoderDecoderCacheManager {
    #[new]
    fn new(cache_size: &Bound<'_, PyAny>) -> PyResult<Self> {
        Ok(Self { state: ManagerState::new(EncoderDecoderCache::new(count(cache_size, "cache_size")?)) })
    }

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

    /// Nothing is shared between requests, so there is never a hit.
    fn check_and_update_cache(&self, request: &Bound<'_, PyAny>, input_id: i64) -> PyResult<bool> {
        let _ = (request, input_id);
        Ok(false)
    }

    /// Nothing is shared between requests, so nothing is ever cached.
    fn get_cached_num_encoder_embeds(&self, request: &Bound<'_, PyAny>, input_id: i64) -> Option<u64> {
        let _ = (request, input_id);
        None
    }

    fn can_allocate(
        slf: &Bound<'_, Self>,
        request: &Bound<'_, PyAny>,
        input_id: i64,
        encoder_compute_budget: i64,
        num_embeds_to_schedule: i64,
    ) -> PyResult<bool> {
        let n = num_embeds(request, input_index(input_id)?)?;
        let fits = read(slf)?.cache.can_allocate(n, encoder_compute_budget, num_embeds_to_schedule);
        Ok(fits)
    }

    fn allocate(slf: &Bound<'_, Self>, request: &Bound<'_, PyAny>, input_id: i64) -> PyResult<()> {
        let input_id = input_index(input_id)?;
        let n = num_embeds(request, input_id)?;
        let item: Arc<str> = Arc::from(identifier(request, input_id)?.to_str()?);
        write(slf)?.cache.allocate(item, n);
        Ok(())
    }

    /// Every item of the request counts as held until the decoder starts.
    fn get_cached_input_ids<'py>(slf: &Bound<'py, Self>, request: &Bound<'py, PyAny>) -> PyResult<Bound<'py, PySet>> {
        PySet::new(slf.py(), 0..num_features(request)?)
    }

    fn free_encoder_input(slf: &Bound<'_, Self>, request: &Bound<'_, PyAny>, input_id: i64) -> PyResult<()> {
        let n = num_embeds(request, input_index(input_id)?)?;
        write(slf)?.cache.free_encoder_input(n);
        Ok(())
    }

    fn free(slf: &Bound<'_, Self>, request: &Bound<'_, PyAny>) -> PyResult<()> {
        let sizes = (0..num_features(request)?).map(|i| num_embeds(request, i)).collect::<PyResult<Vec<u64>>>()?;
        let mut this = write(slf)?;
        for n in sizes {
            this.cache.free_encoder_input(n);
        }
        this.records.forget(request);
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
    fn num_free_slots(slf: &Bound<'_, Self>) -> PyResult<i128> {
        Ok(read(slf)?.cache.num_free_slots())
    }

    /// Snapshot: identifiers allocated since the last `get_freed_mm_hashes()`.
    #[getter]
    fn allocated<'py>(slf: &Bound<'py, Self>) -> PyResult<Bound<'py, PyList>> {
        let (py, state) = (slf.py(), read(slf)?);
        key_list(py, state.cache.allocated())
    }

    /// Snapshot: identifiers the next `get_freed_mm_hashes()` returns.
    #[getter]
    fn to_free<'py>(slf: &Bound<'py, Self>) -> PyResult<Bound<'py, PyList>> {
        let (py, state) = (slf.py(), read(slf)?);
        key_list(py, state.cache.to_free())
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
        let decoder_started = request.getattr(intern!(request.py(), "num_computed_tokens"))?.extract::<i64>()? > 0;
        step::with_request(slf, request, |req| {
            // Frees by size: read the sizes first, with the manager not borrowed.
            let to_free = req.to_free(&read(slf)?.cache, position, decoder_started)?;
            req.load(to_free)?;
            req.free_before(&mut write(slf)?.cache, position, decoder_started)
        })
    }

    fn __traverse__(&self, visit: PyVisit<'_>) -> Result<(), PyTraverseError> {
        step::traverse(self, &visit)
    }

    fn __clear__(slf: &Bound<'_, Self>) {
        step::clear(slf);
    }

    fn __repr__(slf: &Bound<'_, Self>) -> PyResult<String> {
        let state = read(slf)?;
        Ok(format!("EncoderDecoderCacheManager(cache_size={}, num_free_slots={})", state.cache.cache_size(), state.cache.num_free_slots()))
    }

    // Reliability: invariant check and state dump/restore (see src/bindings/state.rs).

    /// Never raises: vLLM's encoder-decoder bookkeeping has no rule beyond its
    /// types (frees are not matched against allocations, so the free-slot count
    /// may leave [0, cache_size]). Here so both managers have the same API.
    fn check_invariants(&self) {}

    /// The whole state as a plain dict (`json.dumps`-able); `restore` takes it back.
    fn snapshot<'py>(slf: &Bound<'py, Self>) -> PyResult<Bound<'py, PyDict>> {
        let (py, state) = (slf.py(), read(slf)?);
        encoder_decoder_state_to_dict(py, &state.cache.snapshot())
    }

    /// A manager in the state `snapshot()` gave.
    #[classmethod]
    fn restore<'py>(cls: &Bound<'py, PyType>, state: &Bound<'py, PyAny>) -> PyResult<Bound<'py, PyAny>> {
        let state = encoder_decoder_state_from_dict(state)?;
        let manager = cls.call1((state.cache_size,))?;
        write(manager.cast::<Self>()?)?.cache = EncoderDecoderCache::restore(&state);
        Ok(manager)
    }
}
