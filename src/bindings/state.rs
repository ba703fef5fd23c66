//! State dumps as plain Python data (dicts, lists, str, int: `json.dumps`-able)
//! and back, with the same shape as `encoder_cache.reference` produces, so a
//! dump of either implementation restores into the other.
//!
//! Shape of an `EncoderCacheManager` dump:
//! `{"cache_size": int, "num_free_slots": int, "num_freeable_slots": int,
//!   "entries": {item: {"num_embeds": int, "referrers": [request_id, ...]}},
//!   "freeable": [[item, num_embeds], ...],   # next eviction first
//!   "requests": {request_id: {"inputs": [[input_id, item], ...], "occurrences": {item: int}}},
//!   "freed": [item, ...]}`
//! and of an `EncoderDecoderCacheManager` dump:
//! `{"cache_size": int, "num_free_slots": int, "held": {request_id: [[input_id, num_embeds], ...]},
//!   "allocated": [item, ...], "to_free": [item, ...]}`.

use pyo3::exceptions::{PyTypeError, PyValueError};
use pyo3::prelude::*;
use pyo3::types::{PyDict, PyList, PyString};
use pyo3::IntoPyObjectExt;

use super::request::count;
use crate::cache::{CacheState, EntryState, RequestState};
use crate::encoder_decoder::EncoderDecoderState;

const CACHE_KEYS: [&str; 7] = ["cache_size", "num_free_slots", "num_freeable_slots", "entries", "freeable", "requests", "freed"];
const ENCODER_DECODER_KEYS: [&str; 5] = ["cache_size", "num_free_slots", "held", "allocated", "to_free"];

pub(crate) fn cache_state_to_dict<'py>(py: Python<'py>, state: &CacheState) -> PyResult<Bound<'py, PyDict>> {
    let entries = PyDict::new(py);
    for (item, entry) in &state.entries {
        let e = PyDict::new(py);
        e.set_item("num_embeds", entry.num_embeds)?;
        e.set_item("referrers", PyList::new(py, &entry.referrers)?)?;
        entries.set_item(item, e)?;
    }
    let requests = PyDict::new(py);
    for (request, held) in &state.requests {
        let r = PyDict::new(py);
        let inputs = held.inputs.iter().map(|(i, item)| pair(py, *i, item)).collect::<PyResult<Vec<_>>>()?;
        r.set_item("inputs", inputs)?;
        r.set_item("occurrences", held.occurrences.clone())?;
        requests.set_item(request, r)?;
    }
    let dict = PyDict::new(py);
    dict.set_item("cache_size", state.cache_size)?;
    dict.set_item("num_free_slots", state.num_free_slots)?;
    dict.set_item("num_freeable_slots", state.num_freeable_slots)?;
    dict.set_item("entries", entries)?;
    let freeable = state.freeable.iter().map(|(item, n)| pair(py, item, *n)).collect::<PyResult<Vec<_>>>()?;
    dict.set_item("freeable", freeable)?;
    dict.set_item("requests", requests)?;
    dict.set_item("freed", &state.freed)?;
    Ok(dict)
}

pub(crate) fn cache_state_from_dict(state: &Bound<'_, PyAny>) -> PyResult<CacheState> {
    let [cache_size, num_free_slots, num_freeable_slots, entries_, freeable_, requests_, freed] = fields(state, &CACHE_KEYS, "state")?;
    let mut entries = std::collections::BTreeMap::new();
    for (item, entry) in items(&entries_, "state['entries']")? {
        let [num_embeds, referrers] = fields(&entry, &["num_embeds", "referrers"], "an entry")?;
        let referrers = strings(&referrers, "an entry's referrers")?;
        let num_embeds = count(&num_embeds, "an entry's num_embeds")?;
        entries.insert(string(&item, "an item")?, EntryState { num_embeds, referrers: referrers.into_iter().collect() });
    }
    let mut freeable = Vec::new();
    for pair in list(&freeable_, "state['freeable']")? {
        let (item, n) = two(&pair, "a freeable [item, num_embeds] pair")?;
        freeable.push((string(&item, "a freeable item")?, count(&n, "a freeable size")?));
    }
    let mut requests = std::collections::BTreeMap::new();
    for (request, held) in items(&requests_, "state['requests']")? {
        let [inputs, occurrences] = fields(&held, &["inputs", "occurrences"], "a request")?;
        let mut refs = RequestState::default();
        for pair in list(&inputs, "a request's inputs")? {
            let (input_id, item) = two(&pair, "an [input_id, item] pair")?;
            refs.inputs.insert(index(&input_id, "an input id")?, string(&item, "a held item")?);
        }
        for (item, n) in items(&occurrences, "a request's occurrences")? {
            let n = u32::try_from(count(&n, "an occurrence count")?)
                .map_err(|_| PyValueError::new_err("an occurrence count must fit in 32 bits"))?;
            refs.occurrences.insert(string(&item, "a counted item")?, n);
        }
        requests.insert(string(&request, "a request id")?, refs);
    }
    Ok(CacheState {
        cache_size: count(&cache_size, "state['cache_size']")?,
        num_free_slots: count(&num_free_slots, "state['num_free_slots']")?,
        num_freeable_slots: count(&num_freeable_slots, "state['num_freeable_slots']")?,
        entries,
        freeable,
        requests,
        freed: strings(&freed, "state['freed']")?,
    })
}

pub(crate) fn encoder_decoder_state_to_dict<'py>(py: Python<'py>, state: &EncoderDecoderState) -> PyResult<Bound<'py, PyDict>> {
    let held = PyDict::new(py);
    for (request, inputs) in &state.held {
        let inputs = inputs.iter().map(|(i, n)| pair(py, *i, *n)).collect::<PyResult<Vec<_>>>()?;
        held.set_item(request, inputs)?;
    }
    let dict = PyDict::new(py);
    dict.set_item("cache_size", state.cache_size)?;
    dict.set_item("num_free_slots", state.num_free_slots)?;
    dict.set_item("held", held)?;
    dict.set_item("allocated", &state.allocated)?;
    dict.set_item("to_free", &state.to_free)?;
    Ok(dict)
}

pub(crate) fn encoder_decoder_state_from_dict(state: &Bound<'_, PyAny>) -> PyResult<EncoderDecoderState> {
    let [cache_size, num_free_slots, held_, allocated, to_free] = fields(state, &ENCODER_DECODER_KEYS, "state")?;
    let mut held = std::collections::BTreeMap::new();
    for (request, inputs_) in items(&held_, "state['held']")? {
        let mut inputs = std::collections::BTreeMap::new();
        for pair in list(&inputs_, "a request's held inputs")? {
            let (input_id, n) = two(&pair, "an [input_id, num_embeds] pair")?;
            inputs.insert(index(&input_id, "an input id")?, count(&n, "a held size")?);
        }
        held.insert(string(&request, "a request id")?, inputs);
    }
    Ok(EncoderDecoderState {
        cache_size: count(&cache_size, "state['cache_size']")?,
        num_free_slots: count(&num_free_slots, "state['num_free_slots']")?,
        held,
        allocated: strings(&allocated, "state['allocated']")?,
        to_free: strings(&to_free, "state['to_free']")?,
    })
}

/// `[a, b]`: pairs are lists, as `json.loads` gives them back.
fn pair<'py>(py: Python<'py>, a: impl IntoPyObject<'py>, b: impl IntoPyObject<'py>) -> PyResult<Bound<'py, PyList>> {
    PyList::new(py, [a.into_bound_py_any(py)?, b.into_bound_py_any(py)?])
}

/// The values of `obj`, a dict with exactly `keys`, in that order: a dump of
/// the other manager kind, or a truncated one, is refused by name.
fn fields<'py, const N: usize>(obj: &Bound<'py, PyAny>, keys: &[&str; N], what: &str) -> PyResult<[Bound<'py, PyAny>; N]> {
    let dict = obj.cast::<PyDict>().map_err(|_| PyTypeError::new_err(format!("{what} must be a dict")))?;
    if dict.len() != N {
        return Err(PyValueError::new_err(format!("{what} must have exactly the keys {keys:?}")));
    }
    let mut values = Vec::with_capacity(N);
    for key in keys {
        match dict.get_item(key)? {
            Some(value) => values.push(value),
            None => return Err(PyValueError::new_err(format!("{what} has no '{key}' key"))),
        }
    }
    Ok(values.try_into().unwrap_or_else(|_| unreachable!("one value per key")))
}

fn items<'py>(obj: &Bound<'py, PyAny>, what: &str) -> PyResult<Vec<(Bound<'py, PyAny>, Bound<'py, PyAny>)>> {
    let dict = obj.cast::<PyDict>().map_err(|_| PyTypeError::new_err(format!("{what} must be a dict")))?;
    Ok(dict.iter().collect())
}

/// A list or tuple's items (copied, so nothing can change them while we read).
fn list<'py>(obj: &Bound<'py, PyAny>, what: &str) -> PyResult<Vec<Bound<'py, PyAny>>> {
    if obj.is_instance_of::<PyList>() || obj.is_instance_of::<pyo3::types::PyTuple>() {
        return obj.try_iter()?.collect();
    }
    Err(PyTypeError::new_err(format!("{what} must be a list")))
}

fn two<'py>(obj: &Bound<'py, PyAny>, what: &str) -> PyResult<(Bound<'py, PyAny>, Bound<'py, PyAny>)> {
    match <[Bound<'py, PyAny>; 2]>::try_from(list(obj, what)?) {
        Ok([a, b]) => Ok((a, b)),
        Err(_) => Err(PyValueError::new_err(format!("{what} must have two elements"))),
    }
}

fn string(obj: &Bound<'_, PyAny>, what: &str) -> PyResult<String> {
    match obj.cast::<PyString>() {
        Ok(s) => Ok(s.to_str()?.to_owned()),
        Err(_) => Err(PyTypeError::new_err(format!("{what} must be str"))),
    }
}

fn strings(obj: &Bound<'_, PyAny>, what: &str) -> PyResult<Vec<String>> {
    list(obj, what)?.iter().map(|s| string(s, what)).collect()
}

fn index(obj: &Bound<'_, PyAny>, what: &str) -> PyResult<usize> {
    usize::try_from(count(obj, what)?).map_err(|_| PyValueError::new_err(format!("{what} is too large")))
}
