//! State dumps as plain Python data (dicts, lists, str, int: `json.dumps`-able)
//! and back, with the same shape as `encoder_cache.reference` produces, so a
//! dump of either implementation restores into the other.
//!
//! Shape of an `EncoderCacheManager` dump:
//! `{"cache_size": int, "num_free_slots": int, "num_freeable_slots": int,
//!   "entries": {item: {"num_embeds": int, "referrers": [request_id, ...],
//!                      "frequency": int, "rank": float}},
//!   "freeable": [[item, num_embeds], ...],   # next eviction first
//!   "requests": {request_id: {"inputs": [[input_id, item], ...], "occurrences": {item: int}}},
//!   "freed": [item, ...],
//!   "policy": str, "clock": float, "waiting": {request_id: [item, ...]}}`
//! where the policy's keys (top level and per entry) appear only where they
//! differ from a fresh "vllm" manager's (so a "vllm" dump has vLLM 0.33's
//! shape), and a dump without them restores under "vllm" with no waiting
//! marks. Modalities are metrics, not state: restored entries count as "unknown".
//! and of an `EncoderDecoderCacheManager` dump:
//! `{"cache_size": int, "num_free_slots": int, "held": {request_id: [[input_id, num_embeds], ...]},
//!   "allocated": [item, ...], "to_free": [item, ...]}`.

use pyo3::exceptions::{PyTypeError, PyValueError};
use pyo3::prelude::*;
use pyo3::types::{PyDict, PyList, PyString};
use pyo3::IntoPyObjectExt;

use super::request::count;
use crate::cache::{CacheState, EntryPolicyState, EntryState, Policy, PolicyState, RequestState};
use crate::encoder_decoder::EncoderDecoderState;

const CACHE_KEYS: [&str; 7] = ["cache_size", "num_free_slots", "num_freeable_slots", "entries", "freeable", "requests", "freed"];
const POLICY_KEYS: [&str; 3] = ["policy", "clock", "waiting"];
const ENTRY_KEYS: [&str; 2] = ["num_embeds", "referrers"];
const ENTRY_POLICY_KEYS: [&str; 2] = ["frequency", "rank"];
const ENCODER_DECODER_KEYS: [&str; 5] = ["cache_size", "num_free_slots", "held", "allocated", "to_free"];

pub(crate) fn cache_state_to_dict<'py>(py: Python<'py>, state: &CacheState, policy: &PolicyState) -> PyResult<Bound<'py, PyDict>> {
    let entries = PyDict::new(py);
    for (item, entry) in &state.entries {
        let e = PyDict::new(py);
        e.set_item("num_embeds", entry.num_embeds)?;
        e.set_item("referrers", PyList::new(py, &entry.referrers)?)?;
        let extra = policy.entries.get(item).copied().unwrap_or_default();
        if policy.policy != Policy::Vllm && extra.frequency != 1 {
            e.set_item("frequency", extra.frequency)?;
        }
        if extra.rank != 0.0 {
            e.set_item("rank", extra.rank)?;
        }
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
    if policy.policy != Policy::Vllm {
        dict.set_item("policy", policy.policy.name())?;
    }
    if policy.clock != 0.0 {
        dict.set_item("clock", policy.clock)?;
    }
    if !policy.waiting.is_empty() {
        let waiting = PyDict::new(py);
        for (request, items) in &policy.waiting {
            waiting.set_item(request, items)?;
        }
        dict.set_item("waiting", waiting)?;
    }
    Ok(dict)
}

pub(crate) fn cache_state_from_dict(state: &Bound<'_, PyAny>) -> PyResult<(CacheState, PolicyState)> {
    let ([cache_size, num_free_slots, num_freeable_slots, entries_, freeable_, requests_, freed], [policy_, clock, waiting_]) =
        fields_and_optional(state, &CACHE_KEYS, &POLICY_KEYS, "state")?;
    let mut policy = PolicyState::default();
    if let Some(name) = policy_ {
        let name = string(&name, "state['policy']")?;
        policy.policy = Policy::from_name(&name).ok_or_else(|| {
            PyValueError::new_err(format!("unknown policy '{name}' in state['policy']; the policies are {}", Policy::NAMES.join(", ")))
        })?;
    }
    if let Some(clock) = clock {
        policy.clock = float(&clock, "state['clock']")?;
    }
    if let Some(waiting) = waiting_ {
        for (request, marked) in items(&waiting, "state['waiting']")? {
            let marked = strings(&marked, "a waiting request's items")?;
            if marked.iter().collect::<std::collections::BTreeSet<_>>().len() != marked.len() {
                return Err(PyValueError::new_err("a waiting request's items must be distinct"));
            }
            policy.waiting.insert(string(&request, "a waiting request id")?, marked);
        }
    }
    let mut entries = std::collections::BTreeMap::new();
    for (item, entry) in items(&entries_, "state['entries']")? {
        let ([num_embeds, referrers], [frequency, rank]) = fields_and_optional(&entry, &ENTRY_KEYS, &ENTRY_POLICY_KEYS, "an entry")?;
        let referrers = strings(&referrers, "an entry's referrers")?;
        let num_embeds = count(&num_embeds, "an entry's num_embeds")?;
        let item = string(&item, "an item")?;
        let mut extra = EntryPolicyState::default();
        if let Some(frequency) = frequency {
            extra.frequency = u32::try_from(count(&frequency, "an entry's frequency")?)
                .map_err(|_| PyValueError::new_err("an entry's frequency must fit in 32 bits"))?;
        }
        if let Some(rank) = rank {
            extra.rank = float(&rank, "an entry's rank")?;
        }
        policy.entries.insert(item.clone(), extra);
        entries.insert(item, EntryState { num_embeds, referrers: referrers.into_iter().collect() });
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
    let state = CacheState {
        cache_size: count(&cache_size, "state['cache_size']")?,
        num_free_slots: count(&num_free_slots, "state['num_free_slots']")?,
        num_freeable_slots: count(&num_freeable_slots, "state['num_freeable_slots']")?,
        entries,
        freeable,
        requests,
        freed: strings(&freed, "state['freed']")?,
    };
    Ok((state, policy))
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
    Ok(fields_and_optional(obj, keys, &[], what)?.0)
}

/// The values of `obj`, a dict with every one of `keys` and any of
/// `optional` (None where left out), and no other key.
#[allow(clippy::type_complexity)]
fn fields_and_optional<'py, const N: usize, const M: usize>(
    obj: &Bound<'py, PyAny>,
    keys: &[&str; N],
    optional: &[&str; M],
    what: &str,
) -> PyResult<([Bound<'py, PyAny>; N], [Option<Bound<'py, PyAny>>; M])> {
    let dict = obj.cast::<PyDict>().map_err(|_| PyTypeError::new_err(format!("{what} must be a dict")))?;
    let mut required = Vec::with_capacity(N);
    for key in keys {
        match dict.get_item(key)? {
            Some(value) => required.push(value),
            None => return Err(PyValueError::new_err(format!("{what} has no '{key}' key"))),
        }
    }
    let mut present = 0;
    let mut extra = Vec::with_capacity(M);
    for key in optional {
        let value = dict.get_item(key)?;
        present += usize::from(value.is_some());
        extra.push(value);
    }
    if dict.len() != N + present {
        let optionally = if M == 0 { String::new() } else { format!(", and optionally {optional:?}") };
        return Err(PyValueError::new_err(format!("{what} must have exactly the keys {keys:?}{optionally}")));
    }
    let required = required.try_into().unwrap_or_else(|_| unreachable!("one value per key"));
    let extra = extra.try_into().unwrap_or_else(|_| unreachable!("one value per key"));
    Ok((required, extra))
}

/// A finite float >= 0 (an int is taken too).
fn float(obj: &Bound<'_, PyAny>, what: &str) -> PyResult<f64> {
    if obj.is_instance_of::<pyo3::types::PyBool>()
        || !(obj.is_instance_of::<pyo3::types::PyFloat>() || obj.is_instance_of::<pyo3::types::PyInt>())
    {
        return Err(PyTypeError::new_err(format!("{what} must be float")));
    }
    let value: f64 = obj.extract()?;
    if !(0.0..f64::INFINITY).contains(&value) {
        return Err(PyValueError::new_err(format!("{what} must be finite and >= 0, got {value}")));
    }
    Ok(value)
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
