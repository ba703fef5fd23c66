//! Reading vLLM-shaped requests: `request.request_id`, `request.mm_features[i].identifier`
//! and `request.get_num_encoder_embeds(i)`, duck-typed, with clear errors.
//!
//! Every read happens before the manager's state is borrowed, so a request whose
//! methods raise (or call back into the manager) leaves the state untouched.

use pyo3::exceptions::{PyAttributeError, PyIndexError, PyTypeError, PyValueError};
use pyo3::intern;
use pyo3::prelude::*;
use pyo3::types::{PyList, PyString};

pub(crate) fn type_name(obj: &Bound<'_, PyAny>) -> String {
    obj.get_type().name().map_or_else(|_| "?".to_owned(), |n| n.to_string())
}

pub(crate) fn expect_str<'py>(obj: Bound<'py, PyAny>, what: &str) -> PyResult<Bound<'py, PyString>> {
    match obj.cast_into::<PyString>() {
        Ok(s) => Ok(s),
        Err(e) => Err(PyTypeError::new_err(format!("{what} must be str, not {}", type_name(e.into_inner().as_any())))),
    }
}

/// What a request must look like, for errors about one that does not.
const REQUEST_SHAPE: &str =
    "a request with `request_id`, `mm_features` and `get_num_encoder_embeds` (vLLM's Request, or encoder_cache.Request)";

/// `request.<name>`; a request without the attribute is a TypeError that says what a request is.
fn request_attr<'py>(request: &Bound<'py, PyAny>, name: &Bound<'py, PyString>) -> PyResult<Bound<'py, PyAny>> {
    request.getattr(name).map_err(|err| {
        if !err.is_instance_of::<PyAttributeError>(request.py()) {
            return err;
        }
        let shaped = PyTypeError::new_err(format!("expected {REQUEST_SHAPE}, got {} without `{name}`", type_name(request)));
        shaped.set_cause(request.py(), Some(err));
        shaped
    })
}

pub(crate) fn request_id<'py>(request: &Bound<'py, PyAny>) -> PyResult<Bound<'py, PyString>> {
    expect_str(request_attr(request, intern!(request.py(), "request_id"))?, "request.request_id")
}

/// `request.mm_features`.
pub(crate) fn features<'py>(request: &Bound<'py, PyAny>) -> PyResult<Bound<'py, PyAny>> {
    request_attr(request, intern!(request.py(), "mm_features"))
}

/// `input_id` as an index: negative ids are refused rather than counted from the end.
pub(crate) fn input_index(input_id: i64) -> PyResult<usize> {
    usize::try_from(input_id).map_err(|_| PyIndexError::new_err(format!("input_id must be >= 0, got {input_id}")))
}

pub(crate) fn feature<'py>(request: &Bound<'py, PyAny>, input_id: usize) -> PyResult<Bound<'py, PyAny>> {
    Ok(feature_and_list(request, input_id)?.0)
}

/// `request.mm_features[input_id]`, with `mm_features` itself when it is a list.
pub(crate) fn feature_and_list<'py>(
    request: &Bound<'py, PyAny>,
    input_id: usize,
) -> PyResult<(Bound<'py, PyAny>, Option<Bound<'py, PyList>>)> {
    let features = features(request)?;
    match features.cast_into::<PyList>() {
        Ok(list) => {
            let num_items = list.len();
            if input_id >= num_items {
                return Err(out_of_range(input_id, num_items));
            }
            Ok((list.get_item(input_id)?, Some(list)))
        }
        Err(err) => Ok((err.into_inner().get_item(input_id)?, None)),
    }
}

/// An input id past the request's items.
pub(crate) fn out_of_range(input_id: usize, num_items: usize) -> PyErr {
    PyIndexError::new_err(crate::step::StepError::InputOutOfRange { input_id, num_items }.to_string())
}

pub(crate) fn identifier<'py>(request: &Bound<'py, PyAny>, input_id: usize) -> PyResult<Bound<'py, PyString>> {
    identifier_of(&feature(request, input_id)?)
}

/// `feature.identifier`, for a feature already taken from `mm_features`.
pub(crate) fn identifier_of<'py>(feature: &Bound<'py, PyAny>) -> PyResult<Bound<'py, PyString>> {
    expect_str(feature.getattr(intern!(feature.py(), "identifier"))?, "mm_features[i].identifier")
}

/// `feature.modality` as a tag (see `modality`): "unknown" when the feature
/// has none or it is not a str, as the pure-Python manager reads it.
pub(crate) fn modality_of(feature: &Bound<'_, PyAny>) -> PyResult<u8> {
    match feature.getattr(intern!(feature.py(), "modality")) {
        Ok(value) => value.cast::<PyString>().map_or(Ok(0), super::modality::tag_of),
        Err(err) if err.is_instance_of::<PyAttributeError>(feature.py()) => Ok(0),
        Err(err) => Err(err),
    }
}

/// A count of embeddings or slots: a non-negative int.
pub(crate) fn count(value: &Bound<'_, PyAny>, what: &str) -> PyResult<u64> {
    if value.is_instance_of::<pyo3::types::PyBool>() {
        return Err(PyTypeError::new_err(format!("{what} must be int, not bool")));
    }
    let Ok(n) = value.extract::<i64>() else {
        if !value.is_instance_of::<pyo3::types::PyInt>() {
            return Err(PyTypeError::new_err(format!("{what} must be int, not {}", type_name(value))));
        }
        let bound = if value.lt(0)? { ">= 0" } else { "< 2**63" };
        return Err(PyValueError::new_err(format!("{what} must be {bound}, got {value}")));
    };
    u64::try_from(n).map_err(|_| PyValueError::new_err(format!("{what} must be >= 0, got {n}")))
}

/// `(offset, length)` of a placeholder (`mm_features[i].mm_position`).
pub(crate) fn span_of(position: &Bound<'_, PyAny>) -> PyResult<(u64, u64)> {
    let py = position.py();
    let offset = count(&position.getattr(intern!(py, "offset"))?, "mm_position.offset")?;
    let length = count(&position.getattr(intern!(py, "length"))?, "mm_position.length")?;
    Ok((offset, length))
}

pub(crate) fn num_embeds(request: &Bound<'_, PyAny>, input_id: usize) -> PyResult<u64> {
    let n = request_attr(request, intern!(request.py(), "get_num_encoder_embeds"))?.call1((input_id,))?;
    count(&n, "request.get_num_encoder_embeds()")
}

/// `request.get_num_encoder_embeds(input_id)` for `feature`, which is
/// `request.mm_features[input_id]`: the placeholder's length, read without
/// calling into Python, when the request's and the placeholder's classes are
/// vLLM's or ours (whose methods return exactly that for a placeholder without
/// an `is_embed` mask); otherwise the request is asked.
pub(crate) fn num_embeds_of(request: &Bound<'_, PyAny>, input_id: usize, feature: &Bound<'_, PyAny>) -> PyResult<u64> {
    match unmasked_length(request, feature) {
        Some(length) => Ok(length),
        None => num_embeds(request, input_id),
    }
}

/// The length of `feature.mm_position` when the answer of
/// `get_num_encoder_embeds` is known to be it; None to ask the request.
fn unmasked_length(request: &Bound<'_, PyAny>, feature: &Bound<'_, PyAny>) -> Option<u64> {
    if !super::known_types::is_known(request) {
        return None;
    }
    known_unmasked_length(feature)
}

/// The length of `feature.mm_position` when it is a known placeholder class
/// without a mask, for a request of a known class (see `known_types`).
pub(crate) fn known_unmasked_length(feature: &Bound<'_, PyAny>) -> Option<u64> {
    let py = feature.py();
    let position = feature.getattr(intern!(py, "mm_position")).ok()?;
    if !super::known_types::is_known(&position) || !position.getattr(intern!(py, "is_embed")).ok()?.is_none() {
        return None;
    }
    count(&position.getattr(intern!(py, "length")).ok()?, "mm_position.length").ok()
}

/// Masks of up to this many entries that are torch tensors are read with
/// `tolist()`, longer ones through their numpy view. Alone and warm, the
/// numpy route is the cheaper one from about 48 entries on
/// (`benches/bench_masks.py`). Inside vLLM's real step the first sight of a
/// request runs once or twice between long stretches of Python and finds the
/// numpy route's code cold: there, on `chat-4-turns` (masks of 48 to 128
/// entries), the encoder methods spend 1.3 to 2.1 µs a step less reading the
/// 96- and 128-entry masks with `tolist()` than through numpy (three pairs
/// of runs), and on masks of 192 to 384 entries `tolist()` costs 1 to 3 µs a
/// step more.
const SHORT_TENSOR_MASK: u64 = 128;

/// An `mm_position.is_embed` mask of a placeholder of `length` tokens, or
/// None without one. Read as bytes in one call where the mask allows it
/// (one byte per entry, non-zero where true): a short torch tensor through
/// `bytes(tolist())`, a longer one through `numpy().tobytes()`, an array
/// through `tobytes()`, a list or tuple of bools or small ints through
/// `bytes()`. Anything else, or a mask whose entries are not one byte each
/// (an int64 tensor, floats, `None`), is read entry by entry, each entry's
/// truth as Python sees it.
pub(crate) fn read_mask(is_embed: &Bound<'_, PyAny>, length: u64) -> PyResult<Option<Vec<bool>>> {
    if is_embed.is_none() {
        return Ok(None);
    }
    let py = is_embed.py();
    let short_tensor = length <= SHORT_TENSOR_MASK && is_embed.hasattr(intern!(py, "numpy"))?;
    let listed = if short_tensor { Some(is_embed.call_method0(intern!(py, "tolist"))?) } else { None };
    let mask = match mask_bytes(listed.as_ref().unwrap_or(is_embed))? {
        Some(bytes) if bytes.as_bytes().len() as u64 == length => bytes.as_bytes().iter().map(|&b| b != 0).collect(),
        _ => match listed {
            Some(values) => truths(&values)?,
            None => match is_embed.getattr_opt(intern!(py, "tolist"))? {
                Some(tolist) => truths(&tolist.call0()?)?,
                None => truths(is_embed)?,
            },
        },
    };
    if mask.len() as u64 != length {
        return Err(PyValueError::new_err(format!("mm_position.is_embed has {} entries for a placeholder of length {length}", mask.len())));
    }
    Ok(Some(mask))
}

/// Each entry's truth: `True` and `False` by identity (a tensor's `tolist()`
/// gives those), anything else as Python sees it.
fn truths(values: &Bound<'_, PyAny>) -> PyResult<Vec<bool>> {
    let py = values.py();
    let (yes, no) = (pyo3::types::PyBool::new(py, true), pyo3::types::PyBool::new(py, false));
    let truth = |value: Bound<'_, PyAny>| {
        if value.is(&*yes) {
            Ok(true)
        } else if value.is(&*no) {
            Ok(false)
        } else {
            value.is_truthy()
        }
    };
    if let Ok(list) = values.cast::<PyList>() {
        return list.iter().map(truth).collect();
    }
    values.try_iter()?.map(|v| truth(v?)).collect()
}

/// The mask's bytes in one call, where its type allows: None to read it entry by entry.
fn mask_bytes<'py>(is_embed: &Bound<'py, PyAny>) -> PyResult<Option<Bound<'py, pyo3::types::PyBytes>>> {
    let py = is_embed.py();
    let bytes = if is_embed.is_instance_of::<PyList>() || is_embed.is_instance_of::<pyo3::types::PyTuple>() {
        py.get_type::<pyo3::types::PyBytes>().call1((is_embed,))
    } else if let Some(numpy) = is_embed.getattr_opt(intern!(py, "numpy"))? {
        // A torch tensor: its numpy view (CPU tensors only; others are read entry by entry).
        numpy.call0().and_then(|array| array.call_method0(intern!(py, "tobytes")))
    } else if let Some(tobytes) = is_embed.getattr_opt(intern!(py, "tobytes"))? {
        tobytes.call0()
    } else {
        return Ok(None);
    };
    match bytes {
        Ok(bytes) => Ok(bytes.cast_into::<pyo3::types::PyBytes>().ok()),
        // Entries that are not byte-sized ints (floats, None, 256), or a tensor off the CPU.
        Err(err) if err.is_instance_of::<pyo3::exceptions::PyException>(py) => Ok(None),
        Err(err) => Err(err),
    }
}
