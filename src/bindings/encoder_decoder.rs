//! `EncoderDecoderCacheManager`: vLLM 0.33's scheduling-only manager for
//! encoder-decoder models, over [`EncoderDecoderCache`].

use pyo3::gc::{PyTraverseError, PyVisit};
use pyo3::prelude::*;
use pyo3::types::{PyDict, PyList, PySet, PyTuple, PyType};

use super::calls::{free_request, with_request_id};
use super::key_list;
use super::methods::manager_methods;
use super::request::{count, identifier, input_index, num_embeds};
use super::shared::ManagerState;
use super::state::{encoder_decoder_state_from_dict, encoder_decoder_state_to_dict};
use crate::cache::Key;
use crate::encoder_decoder::EncoderDecoderCache;

/// The encoder-output budget of an encoder-decoder model (Whisper-style),
/// with vLLM 0.33's API: nothing is shared between requests, an input's slots
/// are held until the decoder has consumed it, and each allocation is
/// reported to the workers one `get_freed_mm_hashes()` late. Each held input
/// is freed once, however often it is freed.
#[pyclass(module = "encoder_cache._core", name = "EncoderDecoderCacheManager", subclass)]
pub struct PyEncoderDecoderCacheManager {
    state: ManagerState<EncoderDecoderCache>,
}

impl PyEncoderDecoderCacheManager {
    fn dump<'py>(cache: &EncoderDecoderCache, py: Python<'py>) -> PyResult<Bound<'py, PyDict>> {
        encoder_decoder_state_to_dict(py, &cache.snapshot())
    }

    fn load(state: &Bound<'_, PyAny>) -> PyResult<EncoderDecoderCache> {
        EncoderDecoderCache::restore(&encoder_decoder_state_from_dict(state)?).map_err(|v| super::errors::inconsistent_state(&v))
    }
}

manager_methods!(PyEncoderDecoderCacheManager, EncoderDecoderCache {
    #[new]
    fn new(cache_size: &Bound<'_, PyAny>) -> PyResult<Self> {
        Ok(Self { state: ManagerState::new(EncoderDecoderCache::new(count(cache_size, "cache_size")?)) })
    }

    /// Return False: nothing is shared between requests, so there is never a hit.
    #[allow(clippy::unused_self)] // a method, as on EncoderCacheManager
    fn check_and_update_cache(&self, request: &Bound<'_, PyAny>, input_id: i64) -> bool {
        let _ = (request, input_id);
        false
    }

    /// Return None: nothing is shared between requests, so nothing is ever cached.
    #[allow(clippy::unused_self)] // a method, as on EncoderCacheManager
    fn get_cached_num_encoder_embeds(&self, request: &Bound<'_, PyAny>, input_id: i64) -> Option<u64> {
        let _ = (request, input_id);
        None
    }

    /// Return whether the item at `input_id` fits this step: within
    /// `encoder_compute_budget`, and in the free slots beside the
    /// `num_embeds_to_schedule` embeddings the step already promised.
    fn can_allocate(
        slf: &Bound<'_, Self>,
        request: &Bound<'_, PyAny>,
        input_id: i64,
        encoder_compute_budget: i64,
        num_embeds_to_schedule: i64,
    ) -> PyResult<bool> {
        let n = num_embeds(request, input_index(input_id)?)?;
        let fits = slf.try_borrow()?.cache.can_allocate(n, encoder_compute_budget, num_embeds_to_schedule);
        Ok(fits)
    }

    /// Reserve the slots of the item at `input_id` for the request.
    ///
    /// Raises ValueError, changing nothing, without room or for an input the
    /// request holds already.
    fn allocate(slf: &Bound<'_, Self>, request: &Bound<'_, PyAny>, input_id: i64) -> PyResult<()> {
        let input_id = input_index(input_id)?;
        let n = num_embeds(request, input_id)?;
        let item = Key::from(identifier(request, input_id)?.to_str()?);
        with_request_id(slf, request, |cache: &mut EncoderDecoderCache, id| cache.allocate(id, input_id, item, n))??;
        Ok(())
    }

    /// Return the input ids the request holds (allocated and not freed yet), as a new set.
    fn get_cached_input_ids<'py>(slf: &Bound<'py, Self>, request: &Bound<'py, PyAny>) -> PyResult<Bound<'py, PySet>> {
        let held = with_request_id(slf, request, |cache: &mut EncoderDecoderCache, id| cache.held_inputs(id).collect::<Vec<_>>())?;
        PySet::new(slf.py(), held)
    }

    /// Give back the slots of one held input. Freeing an input the request
    /// does not hold (freed already, or never allocated) changes nothing;
    /// vLLM 0.33 adds its size back on every call.
    fn free_encoder_input(slf: &Bound<'_, Self>, request: &Bound<'_, PyAny>, input_id: i64) -> PyResult<()> {
        let input_id = input_index(input_id)?;
        if !with_request_id(slf, request, |cache: &mut EncoderDecoderCache, id| cache.free_encoder_input(id, input_id))? {
            // Nothing to give back, but an input the request does not have is still an error.
            identifier(request, input_id)?;
        }
        Ok(())
    }

    /// Give back the slots of every input the request holds, and forget what
    /// was read of it. Changes nothing for a request that holds none.
    fn free(slf: &Bound<'_, Self>, request: &Bound<'_, PyAny>) -> PyResult<()> {
        free_request(slf, request, |cache: &mut EncoderDecoderCache, id| cache.free(id))
    }

    /// A snapshot: identifiers allocated since the last `get_freed_mm_hashes()`.
    #[getter]
    fn allocated<'py>(slf: &Bound<'py, Self>) -> PyResult<Bound<'py, PyList>> {
        let (py, state) = (slf.py(), slf.try_borrow()?);
        key_list(py, state.cache.allocated())
    }

    /// A snapshot: identifiers the next `get_freed_mm_hashes()` returns.
    #[getter]
    fn to_free<'py>(slf: &Bound<'py, Self>) -> PyResult<Bound<'py, PyList>> {
        let (py, state) = (slf.py(), slf.try_borrow()?);
        key_list(py, state.cache.to_free())
    }

    fn __repr__(slf: &Bound<'_, Self>) -> PyResult<String> {
        let state = slf.try_borrow()?;
        Ok(format!(
            "EncoderDecoderCacheManager(cache_size={}, num_free_slots={})",
            state.cache.cache_size(),
            state.cache.num_free_slots()
        ))
    }
});
