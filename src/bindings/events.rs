//! The core's cache events as Python data: `(cleared, removed, stored)`,
//! `stored` and `cached_items()` as `(identifier, embeds, modality)` tuples,
//! and [`PyEventBatch`], one drain kept in Rust until it is encoded.

use pyo3::prelude::*;
use pyo3::types::{PyBytes, PyDict, PyList, PyString, PyTuple};

use super::modality;
use crate::cache::{Key, StepEvents};
use crate::event_wire::{self, CLEARED, REMOVED, STORED};

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

/// The cache events of one step (`EncoderCacheManager.take_event_batch()`),
/// held as Rust data: `encode` writes the message payload without making a
/// Python object per event, so a publisher's thread can do it while the
/// scheduler's thread only hands the batch over.
#[pyclass(module = "encoder_cache._core", name = "EventBatch", frozen)]
pub struct PyEventBatch {
    pub(crate) events: StepEvents,
}

#[pymethods]
impl PyEventBatch {
    /// Whether the cache was cleared (reset, or its log overflowed) first.
    #[getter]
    fn cleared(&self) -> bool {
        self.events.cleared
    }

    /// The identifiers `get_freed_mm_hashes()` reported, in order.
    #[getter]
    fn removed<'py>(&self, py: Python<'py>) -> PyResult<Bound<'py, PyList>> {
        super::key_list(py, &self.events.removed)
    }

    /// The items stored and still cached, as `(identifier, embeds, modality)`.
    #[getter]
    fn stored<'py>(&self, py: Python<'py>) -> PyResult<Bound<'py, PyList>> {
        item_list(py, &self.events.stored)
    }

    /// The event maps, in order: `EncoderCacheCleared` if cleared, one
    /// `EncoderCacheRemoved` with the removed identifiers, one
    /// `EncoderCacheStored` per stored item (see `encoder_cache.events.wire`).
    #[pyo3(signature = (medium = "GPU"))]
    fn events<'py>(&self, py: Python<'py>, medium: &str) -> PyResult<Bound<'py, PyList>> {
        let list = PyList::empty(py);
        if self.events.cleared {
            let event = PyDict::new(py);
            event.set_item("type", CLEARED)?;
            list.append(event)?;
        }
        if !self.events.removed.is_empty() {
            let event = PyDict::new(py);
            event.set_item("type", REMOVED)?;
            event.set_item("hashes", self.removed(py)?)?;
            event.set_item("medium", medium)?;
            list.append(event)?;
        }
        for (key, num_embeds, tag) in &self.events.stored {
            let event = PyDict::new(py);
            event.set_item("type", STORED)?;
            event.set_item("hash", &**key)?;
            event.set_item("embeds", num_embeds)?;
            event.set_item("modality", modality::name(*tag))?;
            event.set_item("medium", medium)?;
            list.append(event)?;
        }
        Ok(list)
    }

    /// The message payload: msgpack of `[timestamp, self.events(medium), engine]`,
    /// the same bytes `msgpack.packb(..., use_bin_type=True)` makes of it.
    #[pyo3(signature = (timestamp, engine, medium = "GPU"))]
    fn encode<'py>(&self, py: Python<'py>, timestamp: f64, engine: i64, medium: &str) -> Bound<'py, PyBytes> {
        PyBytes::new(py, &event_wire::encode_payload(&self.events, timestamp, engine, medium, modality::name))
    }

    /// The number of event maps.
    fn __len__(&self) -> usize {
        event_wire::event_count(&self.events)
    }

    fn __repr__(&self) -> String {
        format!(
            "EventBatch(cleared={}, removed={}, stored={})",
            if self.events.cleared { "True" } else { "False" },
            self.events.removed.len(),
            self.events.stored.len()
        )
    }
}
