//! What both manager classes are made of: a core cache and the records of
//! what was read of each request, borrowed through PyO3's own borrow
//! checking. A manager class derefs to its [`ManagerState`], so the code
//! both classes share is written once, over the state.

use std::ops::DerefMut;

use pyo3::prelude::*;
use pyo3::pyclass::boolean_struct::False;
use pyo3::PyClass;

use super::records::Records;
use super::step_hook::StepHook;

/// What a manager class keeps: its cache, the records of what it has read
/// of requests, which the per-call and the step-level methods share, and
/// what runs at the end of each step.
pub struct ManagerState<C> {
    pub(crate) cache: C,
    pub(crate) records: Records,
    pub(crate) step_hook: Option<StepHook>,
}

impl<C> ManagerState<C> {
    pub(crate) fn new(cache: C) -> Self {
        Self { cache, records: Records::default(), step_hook: None }
    }
}

/// The state of `manager`, to change. A call that finds it borrowed (a
/// request's method calling back into the manager mid-call) gets PyO3's
/// RuntimeError.
#[inline]
pub(crate) fn write<'py, C, M>(manager: &Bound<'py, M>) -> PyResult<PyRefMut<'py, M>>
where
    M: PyClass<Frozen = False> + DerefMut<Target = ManagerState<C>>,
{
    Ok(manager.try_borrow_mut()?)
}
