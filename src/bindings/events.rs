//! The core's cache events as Python data: `(cleared, removed, stored)`,
//! `stored` and `cached_items()` as `(identifier, embeds, modality)` tuples.

use pyo3::prelude::*;
use pyo3::types::{PyList, PyString, PyTuple};

use super::modality;
use crate::cache::{Key, StepEvents};

/// `items` as a list of `(identifier, embeds, modality)`; each modality's
/// name is made once per call.
pub(crate) fn item_list<'py>(py: Python<'py>, items: &[(Key, u64, u8)]) -> PyResult<Bound<'py, PyList>> {
    let mut names: Vec<Option<Bound<'py, PyString>>> = vec![None; 256];
    let list = PyList::empty(py);
    for (key, num_embeds, tag) in items {
        let name = names[usize::from(*tag)].get_or_insert_with(|| PyString::new(py, &modality::name(*tag))).clone();
        list.append(PyTuple::new(py, [PyString::new(py, key).into_any(), num_embeds.into_pyobject(py)?.into_any(), name.into_any()])?)?;
    }
    Ok(list)
}

/// One drain of the event log as `(cleared, removed, stored)`.
pub(crate) fn step_events<'py>(py: Python<'py>, events: &StepEvents) -> PyResult<Bound<'py, PyTuple>> {
    let removed = super::key_list(py, &events.removed)?;
    let stored = item_list(py, &events.stored)?;
    PyTuple::new(py, [pyo3::types::PyBool::new(py, events.cleared).to_owned().into_any(), removed.into_any(), stored.into_any()])
}
