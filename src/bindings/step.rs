//! The step-level methods (`try_schedule_encoder_inputs`,
//! `allocate_encoder_inputs`, `free_encoder_inputs_before`): vLLM's per-item
//! scheduler loops as one call per request per step, over what the request's
//! record knows of its items.
//!
//! What is read from Python, and when:
//! - every call: `len(request.mm_features)`;
//! - `request.request_id`, once per request object (see `records`);
//! - an item's position (`mm_position.offset` and `.length`), once, when a
//!   call first needs it: the bisections that find a step's window read
//!   about `2 log2(n)` positions of a request's `n` items, as vLLM's do; the
//!   items in the window, those named in `allocate_encoder_inputs` and the
//!   held ones `free_encoder_inputs_before` looks at are read as well;
//! - the rest of an item (`identifier`, `modality`, `mm_position.is_embed`,
//!   whose true entries are its embeddings, as vLLM's `get_num_embeds()`
//!   counts them), once, when a call first needs it: the item is in the
//!   window of `try_schedule_encoder_inputs` ([`step::window`]) or is named
//!   in `allocate_encoder_inputs`. Items a request never schedules, such as
//!   those its prefix-cache hit already covers, are never read, and
//!   `get_num_embeds()` (a torch cumsum in vLLM for a masked item) is never
//!   called.

use std::ops::{DerefMut, Range};
use std::sync::Arc;

use pyo3::intern;
use pyo3::prelude::*;
use pyo3::pyclass::boolean_struct::False;
use pyo3::types::{PyList, PyTuple};
use pyo3::PyClass;

use super::records::{RequestRecord, StepItems};
use super::request::{expect_str, features, input_index, modality_of, read_mask, request_id, span_of};
use super::shared::{write, ManagerState};
use crate::cache::Key;
use crate::step::{self, Item, Scheduled, StepArgs, StepCache};

/// Runs `work` on the record of `request`, sized to its items (positions are
/// read as `work` needs them), taken out of the manager for the call (so the request's own code, run by
/// the reads, finds the manager usable) and given back afterwards, whatever
/// `work` returned.
fn with_record<'py, C, M, T>(
    manager: &Bound<'py, M>,
    request: &Bound<'py, PyAny>,
    work: impl FnOnce(&mut RequestRecord, &Bound<'py, PyAny>) -> PyResult<T>,
) -> PyResult<T>
where
    M: PyClass<Frozen = False> + DerefMut<Target = ManagerState<C>>,
{
    let taken = write(manager)?.records.take(request);
    let mut record = match taken {
        Some(record) => record,
        None => RequestRecord::new(request, request_id(request)?.to_str()?),
    };
    let out = sized_features(&mut record, request).and_then(|features| work(&mut record, &features));
    // A manager still borrowed (a failed re-entrant call) keeps no record: records are only a cache.
    let displaced = match write(manager) {
        Ok(mut state) => {
            state.records.put(request, record);
            state.records.take_displaced()
        }
        Err(_) => Vec::new(),
    };
    drop(displaced); // with the manager not borrowed
    out
}

/// `request.mm_features`, with the record sized to its items (a record with
/// more items than the request has now is started over).
fn sized_features<'py>(record: &mut RequestRecord, request: &Bound<'py, PyAny>) -> PyResult<Bound<'py, PyAny>> {
    let features = features(request)?;
    let num_items = features.len()?;
    if record.inputs.len() > num_items {
        record.forget_inputs(); // items were removed: start over
    }
    record.grow(num_items);
    Ok(features)
}

/// The position of input `input_id`, read from `mm_features` the first time.
fn position_of(record: &mut RequestRecord, features: &Bound<'_, PyAny>, input_id: usize) -> PyResult<(u64, u64)> {
    match record.inputs[input_id].position {
        Some(position) => Ok(position),
        None => read_position(record, features, input_id).map(|(_, _, offset, length)| (offset, length)),
    }
}

/// Reads input `input_id`'s position into the record: the feature, its
/// `mm_position` object, offset and length.
fn read_position<'py>(
    record: &mut RequestRecord,
    features: &Bound<'py, PyAny>,
    input_id: usize,
) -> PyResult<(Bound<'py, PyAny>, Bound<'py, PyAny>, u64, u64)> {
    let py = features.py();
    let feature = features.get_item(input_id)?;
    let position = feature.getattr(intern!(py, "mm_position"))?;
    let (offset, length) = span_of(&position)?;
    let input = &mut record.inputs[input_id];
    if !input.feature.as_ref().is_some_and(|f| f.is(&feature)) {
        *input = super::records::InputRecord { feature: Some(feature.clone().unbind()), ..Default::default() };
    }
    input.position = Some((offset, length));
    Ok((feature, position, offset, length))
}

/// The step's window (see [`step::window`]), reading the positions its bisections visit.
fn read_window(record: &mut RequestRecord, features: &Bound<'_, PyAny>, args: StepArgs, encoder_decoder: bool) -> PyResult<Range<usize>> {
    let len = record.inputs.len();
    step::window_by(len, args, encoder_decoder, |input_id| position_of(record, features, input_id))
}

/// Reads the full items of `input_ids` not read yet. Ids past the last item
/// are left for the step functions to report.
fn load(record: &mut RequestRecord, features: &Bound<'_, PyAny>, input_ids: impl IntoIterator<Item = usize>) -> PyResult<()> {
    for input_id in input_ids {
        if input_id >= record.inputs.len() || record.inputs[input_id].item.is_some() {
            continue; // read already (an id may come twice)
        }
        let py = features.py();
        // A position read here comes with its objects, which the item's reads use again.
        let (feature, position, offset, length) = match (record.inputs[input_id].position, &record.inputs[input_id].feature) {
            (Some((offset, length)), Some(feature)) => {
                let feature = feature.bind(py).clone();
                let position = feature.getattr(intern!(py, "mm_position"))?;
                (feature, position, offset, length)
            }
            _ => read_position(record, features, input_id)?,
        };
        let item = read_item(&feature, &position, offset, length)?;
        let input = &mut record.inputs[input_id];
        if input.identifier.is_none() {
            input.identifier = Some((item.identifier.clone(), item.hash));
        }
        input.modality = Some(item.modality);
        input.item = Some(item);
    }
    Ok(())
}

/// An item's full record, at the position read before: the feature's
/// `identifier` and `modality`, and the `is_embed` mask of its `position`
/// (`feature.mm_position`).
fn read_item(feature: &Bound<'_, PyAny>, position: &Bound<'_, PyAny>, offset: u64, length: u64) -> PyResult<Item> {
    let py = feature.py();
    let identifier = expect_str(feature.getattr(intern!(py, "identifier"))?, "mm_features[i].identifier")?;
    let mask = read_mask(&position.getattr(intern!(py, "is_embed"))?, length)?;
    // vLLM's get_num_embeds(): the placeholder's length, or its mask's true entries. Counted here
    // from the mask already read, where vLLM's method runs a torch cumsum per item.
    let num_embeds = mask.as_ref().map_or(length, |mask| mask.iter().filter(|&&embed| embed).count() as u64);
    let item = Item::new(Arc::from(identifier.to_str()?), offset, length, num_embeds, mask.as_deref());
    Ok(item.with_modality(modality_of(feature)?))
}

/// Most steps return empty lists; `PyList::empty` costs half of `PyList::new`.
fn list(py: Python<'_>, ids: Vec<usize>) -> PyResult<Bound<'_, PyList>> {
    if ids.is_empty() {
        return Ok(PyList::empty(py));
    }
    PyList::new(py, ids)
}

/// `try_schedule_encoder_inputs` of either manager class.
pub(crate) fn try_schedule_encoder_inputs<'py, C, M>(
    manager: &Bound<'py, M>,
    request: &Bound<'py, PyAny>,
    args: StepArgs,
    has_remote_item: Option<&Bound<'py, PyAny>>,
    on_mismatch: Option<&Bound<'py, PyAny>>,
) -> PyResult<Bound<'py, PyTuple>>
where
    C: StepCache,
    M: PyClass<Frozen = False> + DerefMut<Target = ManagerState<C>>,
{
    let out = match scheduled_in_place(manager, request, args, has_remote_item)? {
        Some(out) => out,
        None => scheduled_with_reads(manager, request, args, has_remote_item)?,
    };
    if let (Some(m), Some(callback)) = (&out.mismatch, on_mismatch) {
        callback.call1((request, m.input_id, &*m.identifier, m.cached, m.requested))?;
    }
    let py = request.py();
    (list(py, out.to_encode)?, out.num_new_tokens, out.encoder_compute_budget, list(py, out.from_remote)?, list(py, out.repeated)?)
        .into_pyobject(py)
}

/// The step when it needs nothing read from Python but `len(mm_features)`:
/// the record knows every item's position and the window's full items, and
/// there is no remote cache to ask. Then the record is used where it is,
/// under one borrow. None when something must be read.
fn scheduled_in_place<'py, C, M>(
    manager: &Bound<'py, M>,
    request: &Bound<'py, PyAny>,
    args: StepArgs,
    has_remote_item: Option<&Bound<'py, PyAny>>,
) -> PyResult<Option<Scheduled>>
where
    C: StepCache,
    M: PyClass<Frozen = False> + DerefMut<Target = ManagerState<C>>,
{
    if has_remote_item.is_some() {
        return Ok(None);
    }
    let num_items = match features(request).and_then(|features| features.len()) {
        Ok(num_items) => num_items,
        // Reported by the reads in their order (the request id's error first).
        Err(err) if err.is_instance_of::<pyo3::exceptions::PyException>(request.py()) => return Ok(None),
        Err(err) => return Err(err),
    };
    let mut guard = write(manager)?;
    let state: &mut ManagerState<C> = &mut guard;
    let Some(record) = state.records.get_mut(request) else {
        return Ok(None);
    };
    if record.inputs.len() != num_items {
        return Ok(None);
    }
    let known = |input_id: usize| record.inputs[input_id].position.ok_or(());
    let Ok(window) = step::window_by(num_items, args, C::ENCODER_DECODER, known) else {
        return Ok(None); // a position to read
    };
    if !record.inputs[window].iter().all(|input| input.item.is_some()) {
        return Ok(None);
    }
    let items = StepItems { inputs: &record.inputs };
    let mut no_remote = |_: &Key| Ok::<bool, PyErr>(false);
    C::schedule(&mut state.cache, record.id(), &items, args, &mut no_remote).map(Some)
}

/// The step with what is missing of the request read first (see [`with_record`]).
fn scheduled_with_reads<'py, C, M>(
    manager: &Bound<'py, M>,
    request: &Bound<'py, PyAny>,
    args: StepArgs,
    has_remote_item: Option<&Bound<'py, PyAny>>,
) -> PyResult<Scheduled>
where
    C: StepCache,
    M: PyClass<Frozen = False> + DerefMut<Target = ManagerState<C>>,
{
    with_record(manager, request, |record, features| {
        let window = read_window(record, features, args, C::ENCODER_DECODER)?;
        load(record, features, window)?;
        let mut remote = |identifier: &Key| match has_remote_item {
            Some(callback) => callback.call1((&**identifier,))?.is_truthy(),
            None => Ok(false),
        };
        let items = StepItems { inputs: &record.inputs };
        C::schedule(&mut write(manager)?.cache, record.id(), &items, args, &mut remote)
    })
}

/// `allocate_encoder_inputs` of either manager class.
pub(crate) fn allocate_encoder_inputs<C, M>(
    manager: &Bound<'_, M>,
    request: &Bound<'_, PyAny>,
    input_ids: Vec<i64>,
    duplicate_input_ids: Vec<i64>,
) -> PyResult<()>
where
    C: StepCache,
    M: PyClass<Frozen = False> + DerefMut<Target = ManagerState<C>>,
{
    let index = |ids: Vec<i64>| ids.into_iter().map(input_index).collect::<PyResult<Vec<usize>>>();
    let (input_ids, repeated) = (index(input_ids)?, index(duplicate_input_ids)?);
    with_record(manager, request, |record, features| {
        load(record, features, input_ids.iter().chain(&repeated).copied())?;
        let items = StepItems { inputs: &record.inputs };
        Ok(C::allocate_all(&mut write(manager)?.cache, record.id(), &items, &input_ids, &repeated)?)
    })
}

/// `free_encoder_inputs_before` of either manager class. Under
/// encoder-decoder rules every held input goes once the request has computed
/// a token (`request.num_computed_tokens > 0`).
pub(crate) fn free_encoder_inputs_before<C, M>(manager: &Bound<'_, M>, request: &Bound<'_, PyAny>, position: i64) -> PyResult<Vec<usize>>
where
    C: StepCache,
    M: PyClass<Frozen = False> + DerefMut<Target = ManagerState<C>>,
{
    let decoder_started = C::ENCODER_DECODER && request.getattr(intern!(request.py(), "num_computed_tokens"))?.extract::<i64>()? > 0;
    with_record(manager, request, |record, features| {
        if !decoder_started {
            // Inputs held through the per-call methods may have no position read yet.
            let unread: Vec<usize> = {
                let state = write(manager)?;
                let inputs = &record.inputs;
                state
                    .cache
                    .held_inputs(record.id(), inputs.len())
                    .filter(|&i| inputs.get(i).is_some_and(|input| input.position.is_none()))
                    .collect()
            };
            for input_id in unread {
                position_of(record, features, input_id)?;
            }
        }
        let items = StepItems { inputs: &record.inputs };
        Ok(C::free_before(&mut write(manager)?.cache, record.id(), &items, position, decoder_started)?)
    })
}
