//! What both manager classes are made of: their state (a core cache and the
//! per-request records), borrowing it through PyO3's own borrow checking, and
//! what the binding layer needs of either core cache ([`ManagedCache`]).

use std::ops::{Deref, DerefMut};

use pyo3::prelude::*;
use pyo3::pyclass::boolean_struct::False;
use pyo3::types::PyDict;
use pyo3::PyClass;

use super::errors::invariant_error;
use super::records::Records;
use super::state::{cache_state_from_dict, cache_state_to_dict, encoder_decoder_state_from_dict, encoder_decoder_state_to_dict};
use crate::cache::{CacheError, EncoderCache, Key};
use crate::encoder_decoder::EncoderDecoderCache;
use crate::step::StepCache;

/// What a manager class keeps: its cache, and the records of what it has
/// read of requests, which the per-call and the step-level methods share.
pub(crate) struct ManagerState<C> {
    pub(crate) cache: C,
    pub(crate) records: Records,
}

impl<C> ManagerState<C> {
    pub(crate) fn new(cache: C) -> Self {
        Self { cache, records: Records::default() }
    }
}

/// A manager class: a pyclass around a [`ManagerState`].
pub(crate) trait Manager: PyClass<Frozen = False> {
    type Cache: ManagedCache;
    fn state(&self) -> &ManagerState<Self::Cache>;
    fn state_mut(&mut self) -> &mut ManagerState<Self::Cache>;
}

/// A shared borrow of a manager's state. A call that finds the state
/// borrowed (a request's method calling back into the manager mid-call) gets
/// PyO3's RuntimeError.
pub(crate) struct StateRef<'py, M: Manager>(PyRef<'py, M>);

impl<M: Manager> Deref for StateRef<'_, M> {
    type Target = ManagerState<M::Cache>;

    fn deref(&self) -> &Self::Target {
        self.0.state()
    }
}

/// An exclusive borrow of a manager's state.
pub(crate) struct StateMut<'py, M: Manager>(PyRefMut<'py, M>);

impl<M: Manager> Deref for StateMut<'_, M> {
    type Target = ManagerState<M::Cache>;

    fn deref(&self) -> &Self::Target {
        self.0.state()
    }
}

impl<M: Manager> DerefMut for StateMut<'_, M> {
    fn deref_mut(&mut self) -> &mut Self::Target {
        self.0.state_mut()
    }
}

/// The state of `manager`, to read.
pub(crate) fn read<'py, M: Manager>(manager: &Bound<'py, M>) -> PyResult<StateRef<'py, M>> {
    Ok(StateRef(manager.try_borrow()?))
}

/// The state of `manager`, to change.
pub(crate) fn write<'py, M: Manager>(manager: &Bound<'py, M>) -> PyResult<StateMut<'py, M>> {
    Ok(StateMut(manager.try_borrow_mut()?))
}

/// What the binding layer needs of a core cache beyond the step-level
/// operations: sizes, resizing, reports, and state dumps.
pub(crate) trait ManagedCache: StepCache + Send + Sync + Sized {
    fn cache_size(&self) -> u64;
    /// Signed: vLLM's encoder-decoder count is.
    fn free_slots(&self) -> i128;
    fn resize(&mut self, cache_size: u64) -> Result<(), CacheError>;
    fn reset(&mut self);
    fn take_freed(&mut self) -> Vec<Key>;
    fn check(&self) -> PyResult<()>;
    fn to_dict<'py>(&self, py: Python<'py>) -> PyResult<Bound<'py, PyDict>>;
    fn from_dict(state: &Bound<'_, PyAny>) -> PyResult<Self>;
}

impl ManagedCache for EncoderCache {
    fn cache_size(&self) -> u64 {
        EncoderCache::cache_size(self)
    }

    fn free_slots(&self) -> i128 {
        self.num_free_slots().into()
    }

    fn resize(&mut self, cache_size: u64) -> Result<(), CacheError> {
        EncoderCache::resize(self, cache_size)
    }

    fn reset(&mut self) {
        EncoderCache::reset(self);
    }

    fn take_freed(&mut self) -> Vec<Key> {
        EncoderCache::take_freed(self)
    }

    fn check(&self) -> PyResult<()> {
        self.check_invariants().map_err(|v| invariant_error(&v))
    }

    fn to_dict<'py>(&self, py: Python<'py>) -> PyResult<Bound<'py, PyDict>> {
        cache_state_to_dict(py, &self.snapshot(), &self.policy_snapshot())
    }

    fn from_dict(state: &Bound<'_, PyAny>) -> PyResult<Self> {
        let (state, policy) = cache_state_from_dict(state)?;
        EncoderCache::restore_with(&state, &policy).map_err(|v| super::errors::inconsistent_state(&v))
    }
}

impl ManagedCache for EncoderDecoderCache {
    fn cache_size(&self) -> u64 {
        EncoderDecoderCache::cache_size(self)
    }

    fn free_slots(&self) -> i128 {
        self.num_free_slots().into()
    }

    fn resize(&mut self, cache_size: u64) -> Result<(), CacheError> {
        EncoderDecoderCache::resize(self, cache_size)
    }

    fn reset(&mut self) {
        EncoderDecoderCache::reset(self);
    }

    fn take_freed(&mut self) -> Vec<Key> {
        EncoderDecoderCache::take_freed(self)
    }

    fn check(&self) -> PyResult<()> {
        self.check_invariants().map_err(|v| invariant_error(&v))
    }

    fn to_dict<'py>(&self, py: Python<'py>) -> PyResult<Bound<'py, PyDict>> {
        encoder_decoder_state_to_dict(py, &self.snapshot())
    }

    fn from_dict(state: &Bound<'_, PyAny>) -> PyResult<Self> {
        EncoderDecoderCache::restore(&encoder_decoder_state_from_dict(state)?).map_err(|v| super::errors::inconsistent_state(&v))
    }
}
