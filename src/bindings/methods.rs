//! The Python methods both manager classes have, written once:
//! [`manager_methods!`] puts them, with a class's own methods, into that
//! class's `#[pymethods]` block (PyO3 takes one block per class), and every
//! shared method is one generic function below.

use pyo3::exceptions::PyValueError;
use pyo3::prelude::*;
use pyo3::types::{PyDict, PyList, PyType};

use super::key_list;
use super::request::count;
use super::shared::{read, write, ManagedCache, Manager};

/// `cls(cache_size)`: vLLM's factory hook builds the class it is called on.
pub(crate) fn create_manager<'py>(cls: &Bound<'py, PyType>, cache_size: &Bound<'py, PyAny>) -> PyResult<Bound<'py, PyAny>> {
    cls.call1((cache_size,))
}

pub(crate) fn reset<M: Manager>(slf: &Bound<'_, M>) -> PyResult<()> {
    let mut state = write(slf)?;
    state.cache.reset();
    state.records.clear();
    Ok(())
}

pub(crate) fn get_freed_mm_hashes<'py, M: Manager>(slf: &Bound<'py, M>) -> PyResult<Bound<'py, PyList>> {
    let freed = write(slf)?.cache.take_freed();
    key_list(slf.py(), &freed)
}

pub(crate) fn cache_size<M: Manager>(slf: &Bound<'_, M>) -> PyResult<u64> {
    Ok(read(slf)?.cache.cache_size())
}

pub(crate) fn set_cache_size<M: Manager>(slf: &Bound<'_, M>, value: Option<&Bound<'_, PyAny>>) -> PyResult<()> {
    let value = value.ok_or_else(|| PyValueError::new_err("cache_size cannot be deleted"))?;
    let cache_size = count(value, "cache_size")?;
    Ok(write(slf)?.cache.resize(cache_size)?)
}

pub(crate) fn num_free_slots<M: Manager>(slf: &Bound<'_, M>) -> PyResult<i128> {
    Ok(read(slf)?.cache.free_slots())
}

pub(crate) fn check_invariants<M: Manager>(slf: &Bound<'_, M>) -> PyResult<()> {
    read(slf)?.cache.check()
}

pub(crate) fn snapshot<'py, M: Manager>(slf: &Bound<'py, M>) -> PyResult<Bound<'py, PyDict>> {
    read(slf)?.cache.to_dict(slf.py())
}

/// A manager of class `cls` in `state`: built as `cls(cache_size)`, so
/// subclasses construct themselves, then given the restored cache.
pub(crate) fn restore<'py, M: Manager>(cls: &Bound<'py, PyType>, state: &Bound<'py, PyAny>) -> PyResult<Bound<'py, PyAny>> {
    let cache = M::Cache::from_dict(state)?;
    let manager = cls.call1((cache.cache_size(),))?;
    write(manager.cast::<M>()?)?.cache = cache;
    Ok(manager)
}

/// The methods both manager classes share, then the class's own `$($own)*`,
/// as the class's one `#[pymethods]` block.
macro_rules! manager_methods {
    ($class:ty { $($own:tt)* }) => {
        #[pymethods]
        impl $class {
            /// Build a manager of this class holding `cache_size` embeddings.
            ///
            /// vLLM's factory hook (`EncoderCacheManagerConfig.encoder_cache_manager_cls`);
            /// `vllm_config` is accepted and unused. Subclasses construct themselves.
            #[classmethod]
            #[pyo3(signature = (*, cache_size, vllm_config=None))]
            fn create_manager<'py>(
                cls: &Bound<'py, PyType>,
                cache_size: &Bound<'py, PyAny>,
                vllm_config: Option<&Bound<'py, PyAny>>,
            ) -> PyResult<Bound<'py, PyAny>> {
                let _ = vllm_config;
                $crate::bindings::methods::create_manager(cls, cache_size)
            }

            /// Forget every entry, request and pending report, keeping the capacity
            /// (vLLM calls this when the model's weights change).
            fn reset(slf: &Bound<'_, Self>) -> PyResult<()> {
                $crate::bindings::methods::reset(slf)
            }

            /// Return the identifiers whose cached outputs the workers must now drop,
            /// and clear the report.
            fn get_freed_mm_hashes<'py>(slf: &Bound<'py, Self>) -> PyResult<Bound<'py, PyList>> {
                $crate::bindings::methods::get_freed_mm_hashes(slf)
            }

            /// Return None: no metadata travels to the workers.
            fn get_manager_metadata(&self) -> Option<Py<PyAny>> {
                None
            }

            /// The capacity, in encoder embeddings. Assigning resizes the cache:
            /// growing adds free slots; shrinking evicts unreferenced entries and
            /// raises ValueError, changing nothing, when the entries in use would not fit.
            #[getter]
            fn cache_size(slf: &Bound<'_, Self>) -> PyResult<u64> {
                $crate::bindings::methods::cache_size(slf)
            }

            #[setter]
            fn set_cache_size(slf: &Bound<'_, Self>, value: Option<&Bound<'_, PyAny>>) -> PyResult<()> {
                $crate::bindings::methods::set_cache_size(slf, value)
            }

            /// Slots not taken by any entry.
            #[getter]
            fn num_free_slots(slf: &Bound<'_, Self>) -> PyResult<i128> {
                $crate::bindings::methods::num_free_slots(slf)
            }

            /// Schedule a request's encoder inputs for one step, as vLLM's scheduler loop does.
            ///
            /// Walks the items whose placeholders overlap the tokens
            /// `[num_computed_tokens, num_computed_tokens + num_new_tokens)`, taking
            /// cache hits, making room and budgeting the rest.
            /// Returns `(to_encode, num_new_tokens, encoder_compute_budget,
            /// from_remote, repeated)`: the input ids to encode, the possibly reduced
            /// token count and budget, the ids `has_remote_item(identifier)` says a
            /// remote encoder cache holds, and the ids repeated within the step.
            /// An item whose size disagrees with the cache is reported to
            /// `on_mismatch(request, input_id, identifier, cached, requested)` and
            /// nothing is scheduled. Raises IndexError or ValueError on bad input,
            /// changing nothing.
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
                let args = $crate::step::StepArgs {
                    num_computed_tokens,
                    num_new_tokens,
                    encoder_compute_budget,
                    shift_computed_tokens,
                    disable_chunked_mm_input,
                };
                $crate::bindings::step::try_schedule_encoder_inputs(slf, request, args, has_remote_item, on_mismatch)
            }

            /// Allocate the inputs `try_schedule_encoder_inputs` returned to encode,
            /// then take the hit for each of `duplicate_input_ids`.
            fn allocate_encoder_inputs(
                slf: &Bound<'_, Self>,
                request: &Bound<'_, PyAny>,
                input_ids: Vec<i64>,
                duplicate_input_ids: Vec<i64>,
            ) -> PyResult<()> {
                $crate::bindings::step::allocate_encoder_inputs(slf, request, input_ids, duplicate_input_ids)
            }

            /// Free the held inputs whose placeholders end at or before `position`
            /// and return their ids, ascending (vLLM's `_free_encoder_inputs`).
            fn free_encoder_inputs_before(slf: &Bound<'_, Self>, request: &Bound<'_, PyAny>, position: i64) -> PyResult<Vec<usize>> {
                $crate::bindings::step::free_encoder_inputs_before(slf, request, position)
            }

            /// Raise `encoder_cache.InvariantError` naming the first broken bookkeeping rule.
            fn check_invariants(slf: &Bound<'_, Self>) -> PyResult<()> {
                $crate::bindings::methods::check_invariants(slf)
            }

            /// Return the whole state as plain, JSON-serialisable data; `restore` takes it back.
            fn snapshot<'py>(slf: &Bound<'py, Self>) -> PyResult<Bound<'py, PyDict>> {
                $crate::bindings::methods::snapshot(slf)
            }

            /// Build a manager in the state `snapshot()` returned.
            ///
            /// Raises TypeError or ValueError for a malformed dump, and ValueError
            /// for one that breaks a bookkeeping rule.
            #[classmethod]
            fn restore<'py>(cls: &Bound<'py, PyType>, state: &Bound<'py, PyAny>) -> PyResult<Bound<'py, PyAny>> {
                $crate::bindings::methods::restore::<Self>(cls, state)
            }

            fn __traverse__(&self, visit: PyVisit<'_>) -> Result<(), PyTraverseError> {
                $crate::bindings::shared::Manager::state(self).records.traverse(&visit)
            }

            fn __clear__(&mut self) {
                $crate::bindings::shared::Manager::state_mut(self).records.clear();
            }

            $($own)*
        }
    };
}

pub(crate) use manager_methods;
