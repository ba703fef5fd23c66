//! The Python methods both manager classes have, each written once here:
//! [`manager_methods!`] puts them, with a class's own methods, into that
//! class's `#[pymethods]` block (PyO3 takes one block per class). A class
//! derefs to its `ManagerState`, and both core caches have the methods used
//! here under the same names; each class gives its own `dump` and `load` of
//! the state.

/// The methods both manager classes share, then the class's own `$($own)*`,
/// as the class's one `#[pymethods]` block; `$cache` is the class's core cache.
macro_rules! manager_methods {
    ($class:ty, $cache:ty { $($own:tt)* }) => {
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
                cls.call1((cache_size,))
            }

            /// Forget every entry, request and pending report, keeping the capacity
            /// (vLLM calls this when the model's weights change).
            fn reset(slf: &Bound<'_, Self>) -> PyResult<()> {
                let records = {
                    let mut state = slf.try_borrow_mut()?;
                    state.cache.reset();
                    std::mem::take(&mut state.records)
                };
                drop(records); // with the manager not borrowed: the objects it kept may call back
                Ok(())
            }

            /// Return the identifiers whose cached outputs the workers must now drop,
            /// and clear the report.
            fn get_freed_mm_hashes<'py>(slf: &Bound<'py, Self>) -> PyResult<Bound<'py, PyList>> {
                let (freed, hook) = {
                    let mut state = slf.try_borrow_mut()?;
                    let hook = state.step_hook.as_mut().and_then(|hook| hook.take_due(slf.py()));
                    (state.cache.take_freed(), hook)
                };
                let freed = $crate::bindings::key_list(slf.py(), &freed)?;
                if let Some(hook) = hook {
                    let wait = $crate::bindings::step_hook::run(&hook, slf.as_any());
                    if let Some(set) = slf.try_borrow_mut()?.step_hook.as_mut() {
                        set.ran(&hook, wait.as_ref().ok().copied().flatten());
                    }
                    wait?;
                }
                Ok(freed)
            }

            /// Run `hook(manager)` at the end of `get_freed_mm_hashes()`, which the
            /// scheduler calls once per step. The hook returns how many seconds it
            /// can wait before it runs again (None: it runs at the next step), and
            /// steps until then do not call it. `None` removes the hook. An
            /// exception the hook raises is reported through `sys.unraisablehook`,
            /// the step's identifiers are returned all the same, and the hook runs
            /// again at the next step.
            fn set_step_hook(slf: &Bound<'_, Self>, hook: Option<&Bound<'_, PyAny>>) -> PyResult<()> {
                let hook = hook.map($crate::bindings::step_hook::StepHook::new).transpose()?;
                let old = std::mem::replace(&mut slf.try_borrow_mut()?.step_hook, hook);
                drop(old); // with the manager not borrowed: its finaliser may call back
                Ok(())
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
                Ok(slf.try_borrow()?.cache.cache_size())
            }

            #[setter]
            fn set_cache_size(slf: &Bound<'_, Self>, value: Option<&Bound<'_, PyAny>>) -> PyResult<()> {
                let value = value.ok_or_else(|| pyo3::exceptions::PyValueError::new_err("cache_size cannot be deleted"))?;
                let cache_size = $crate::bindings::request::count(value, "cache_size")?;
                Ok(slf.try_borrow_mut()?.cache.resize(cache_size)?)
            }

            /// Slots not taken by any entry.
            #[getter]
            fn num_free_slots(slf: &Bound<'_, Self>) -> PyResult<u64> {
                Ok(slf.try_borrow()?.cache.num_free_slots())
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
                $crate::bindings::step::try_schedule_encoder_inputs::<$cache, _>(slf, request, args, has_remote_item, on_mismatch)
            }

            /// Allocate the inputs `try_schedule_encoder_inputs` returned to encode,
            /// then take the hit for each of `duplicate_input_ids`.
            fn allocate_encoder_inputs(
                slf: &Bound<'_, Self>,
                request: &Bound<'_, PyAny>,
                input_ids: Vec<i64>,
                duplicate_input_ids: Vec<i64>,
            ) -> PyResult<()> {
                $crate::bindings::step::allocate_encoder_inputs::<$cache, _>(slf, request, input_ids, duplicate_input_ids)
            }

            /// Free the held inputs whose placeholders end at or before `position`
            /// and return their ids, ascending (vLLM's `_free_encoder_inputs`).
            fn free_encoder_inputs_before(slf: &Bound<'_, Self>, request: &Bound<'_, PyAny>, position: i64) -> PyResult<Vec<usize>> {
                $crate::bindings::step::free_encoder_inputs_before::<$cache, _>(slf, request, position)
            }

            /// Raise `encoder_cache.InvariantError` naming the first broken bookkeeping rule.
            fn check_invariants(slf: &Bound<'_, Self>) -> PyResult<()> {
                slf.try_borrow()?.cache.check_invariants().map_err(|v| $crate::bindings::errors::invariant_error(&v))
            }

            /// Return the whole state as plain, JSON-serialisable data; `restore` takes it back.
            fn snapshot<'py>(slf: &Bound<'py, Self>) -> PyResult<Bound<'py, PyDict>> {
                Self::dump(&slf.try_borrow()?.cache, slf.py())
            }

            /// Build a manager in the state `snapshot()` returned.
            ///
            /// Raises TypeError or ValueError for a malformed dump, and ValueError
            /// for one that breaks a bookkeeping rule.
            #[classmethod]
            fn restore<'py>(cls: &Bound<'py, PyType>, state: &Bound<'py, PyAny>) -> PyResult<Bound<'py, PyAny>> {
                let cache = Self::load(state)?;
                // Built as `cls(cache_size)`, so subclasses construct themselves, then given the cache.
                let manager = cls.call1((cache.cache_size(),))?;
                // Records made meanwhile (by a subclass's `__init__`) name the
                // replaced cache's handles: they go, dropped once unborrowed.
                let records = {
                    let mut state = manager.cast::<Self>()?.try_borrow_mut()?;
                    state.cache = cache;
                    std::mem::take(&mut state.records)
                };
                drop(records);
                Ok(manager)
            }

            fn __traverse__(&self, visit: PyVisit<'_>) -> Result<(), PyTraverseError> {
                if let Some(hook) = &self.step_hook {
                    hook.traverse(&visit)?;
                }
                self.records.traverse(&visit)
            }

            fn __clear__(&mut self) {
                self.records.clear();
                self.step_hook = None;
            }

            $($own)*
        }

        impl std::ops::Deref for $class {
            type Target = $crate::bindings::shared::ManagerState<$cache>;

            fn deref(&self) -> &Self::Target {
                &self.state
            }
        }

        impl std::ops::DerefMut for $class {
            fn deref_mut(&mut self) -> &mut Self::Target {
                &mut self.state
            }
        }
    };
}

pub(crate) use manager_methods;
