//! The step-level methods (`try_schedule_encoder_inputs`,
//! `allocate_encoder_inputs`, `free_encoder_inputs_before`): vLLM's per-item
//! scheduler loops as one call per request per step, over what the request's
//! record knows of its items.
//!
//! What is read from Python, and when:
//! - every call: `len(request.mm_features)`;
//! - `request.request_id`, once per request object (see `records`);
//! - an item's position (`mm_position.offset` and `.length`), once, when the
//!   item is first seen: for all items of a request object the first time it comes,
//!   for the new items when `mm_features` grew (streaming input), and again
//!   for all after a call that failed while reading positions (which forgets
//!   the rest of the records too);
//! - the rest of an item (`identifier`, `modality`, `mm_position.is_embed`,
//!   whose true entries are its embeddings, as vLLM's `get_num_embeds()`
//!   counts them), once, when a call first needs it: the item is in
//!   the window of `try_schedule_encoder_inputs` ([`step::window`]) or is named
//!   in `allocate_encoder_inputs`. Items a request never schedules, such as
//!   those its prefix-cache hit already covers, are never read, and
//!   `get_num_embeds()` (a torch cumsum in vLLM for a masked item) is never
//!   called.

use std::sync::Arc;

use pyo3::exceptions::PyValueError;
use pyo3::intern;
use pyo3::prelude::*;
use pyo3::types::{PyList, PyTuple};

use super::records::{RequestId, Slot};
use super::request::{count, expect_str, features, input_index, modality_of, request_id};
use super::shared::{write, Manager};
use crate::cache::Key;
use crate::step::{self, Item, Scheduled, StepArgs, StepCache};

/// A request as the step-level methods see it.
pub(crate) struct StepRequest<'py> {
    request: Bound<'py, PyAny>,
    id: RequestId<'py>,
    features: Bound<'py, PyAny>,
    /// The items first seen in this call, from `first_seen` on, as
    /// `(feature, mm_position)`: reading their details needs no new look-up.
    seen: Vec<(Bound<'py, PyAny>, Bound<'py, PyAny>)>,
    first_seen: usize,
    /// The request's records, taken from the manager for the call and given
    /// back by [`with_request`]: updated in place, never copied.
    items: Vec<Slot>,
}

impl<'py> StepRequest<'py> {
    /// Reads the request id if not known and the positions of the items not
    /// yet recorded. `take_records` is called once, to take the stored records
    /// and id, and its borrow ends before any of the request's own code runs.
    fn read(request: &Bound<'py, PyAny>, take_records: impl FnOnce() -> PyResult<(Option<Key>, Vec<Slot>)>) -> PyResult<Self> {
        let (known_id, mut items) = take_records()?;
        let id = match known_id {
            Some(key) => RequestId::Recorded(key),
            None => RequestId::Read(request_id(request)?),
        };
        let features = features(request)?;
        let num_items = features.len()?;
        if items.len() > num_items {
            items.clear(); // items were removed: start over
        }
        let first_seen = items.len();
        let mut seen = Vec::with_capacity(num_items - first_seen);
        for i in first_seen..num_items {
            let feature = features.get_item(i)?;
            let position = feature.getattr(intern!(request.py(), "mm_position"))?;
            items.push(read_position(&position)?);
            seen.push((feature, position));
        }
        Ok(Self { request: request.clone(), id, features, seen, first_seen, items })
    }

    /// Reads the rest of `input_ids` not read yet. Ids past the last item are
    /// left for the step functions to report.
    pub(crate) fn load(&mut self, input_ids: impl IntoIterator<Item = usize>) -> PyResult<()> {
        for input_id in input_ids {
            // An id may come twice (in both lists of an allocation): read it once.
            let Some(&Slot::Position { offset, length }) = self.items.get(input_id) else {
                continue;
            };
            let seen = input_id.checked_sub(self.first_seen).and_then(|i| self.seen.get(i));
            let (feature, position) = if let Some((feature, position)) = seen {
                (feature.clone(), position.clone())
            } else {
                let feature = self.features.get_item(input_id)?;
                let position = feature.getattr(intern!(feature.py(), "mm_position"))?;
                (feature, position)
            };
            self.items[input_id] = Slot::Read(Box::new(read_item(&feature, &position, offset, length)?));
        }
        Ok(())
    }

    /// Reads the items a step with `args` looks at.
    pub(crate) fn load_window<C: StepCache>(&mut self, args: StepArgs) -> PyResult<()> {
        self.load(step::window(self.items.as_slice(), args, C::ENCODER_DECODER))
    }

    /// Reads the items to allocate and to take hits for, given as Python ids.
    pub(crate) fn load_inputs(&mut self, input_ids: Vec<i64>, repeated: Vec<i64>) -> PyResult<(Vec<usize>, Vec<usize>)> {
        let index = |ids: Vec<i64>| ids.into_iter().map(input_index).collect::<PyResult<Vec<usize>>>();
        let (input_ids, repeated) = (index(input_ids)?, index(repeated)?);
        self.load(input_ids.iter().chain(&repeated).copied())?;
        Ok((input_ids, repeated))
    }

    /// [`step::try_schedule`], asking `has_remote_item(identifier)` when given.
    fn try_schedule<C: StepCache>(
        &self,
        cache: &mut C,
        args: StepArgs,
        has_remote_item: Option<&Bound<'py, PyAny>>,
    ) -> PyResult<Scheduled> {
        let id = self.id.arg()?;
        let mut remote = |identifier: &Key| match has_remote_item {
            Some(callback) => callback.call1((&**identifier,))?.is_truthy(),
            None => Ok(false),
        };
        step::try_schedule(cache, id, self.items.as_slice(), args, &mut remote)
    }

    /// [`step::allocate_inputs`], for ids from [`StepRequest::load_inputs`].
    fn allocate<C: StepCache>(&self, cache: &mut C, input_ids: &[usize], repeated: &[usize]) -> PyResult<()> {
        Ok(step::allocate_inputs(cache, self.id.arg()?, self.items.as_slice(), input_ids, repeated)?)
    }

    /// [`step::free_inputs_before`].
    pub(crate) fn free_before<C: StepCache>(&self, cache: &mut C, position: i64, decoder_started: bool) -> PyResult<Vec<usize>> {
        Ok(step::free_inputs_before(cache, self.id.arg()?, self.items.as_slice(), position, decoder_started)?)
    }

    /// vLLM's step result tuple; a mismatch is reported to `on_mismatch`
    /// `(request, input_id, identifier, cached, requested)` first.
    pub(crate) fn result(&self, out: Scheduled, on_mismatch: Option<&Bound<'py, PyAny>>) -> PyResult<Bound<'py, PyTuple>> {
        if let (Some(m), Some(callback)) = (&out.mismatch, on_mismatch) {
            callback.call1((&self.request, m.input_id, &*m.identifier, m.cached, m.requested))?;
        }
        let py = self.request.py();
        (list(py, out.to_encode)?, out.num_new_tokens, out.encoder_compute_budget, list(py, out.from_remote)?, list(py, out.repeated)?)
            .into_pyobject(py)
    }
}

/// Most steps return empty lists; `PyList::empty` costs half of `PyList::new`.
fn list(py: Python<'_>, ids: Vec<usize>) -> PyResult<Bound<'_, PyList>> {
    if ids.is_empty() {
        return Ok(PyList::empty(py));
    }
    PyList::new(py, ids)
}

/// An item's placeholder position, from `mm_position.offset` and `.length`.
fn read_position(position: &Bound<'_, PyAny>) -> PyResult<Slot> {
    let py = position.py();
    let offset = count(&position.getattr(intern!(py, "offset"))?, "mm_position.offset")?;
    let length = count(&position.getattr(intern!(py, "length"))?, "mm_position.length")?;
    Ok(Slot::Position { offset, length })
}

/// An item's full record, at the position read before: the feature's
/// `identifier` and `modality`, and its `mm_position.is_embed` mask (None, a
/// sequence of bools, or anything with `.tolist()` such as a tensor).
fn read_item(feature: &Bound<'_, PyAny>, position: &Bound<'_, PyAny>, offset: u64, length: u64) -> PyResult<Item> {
    let py = feature.py();
    let identifier = expect_str(feature.getattr(intern!(py, "identifier"))?, "mm_features[i].identifier")?;
    let is_embed = position.getattr(intern!(py, "is_embed"))?;
    let mask = if is_embed.is_none() {
        None
    } else {
        let values = if is_embed.hasattr(intern!(py, "tolist"))? { is_embed.call_method0(intern!(py, "tolist"))? } else { is_embed };
        let mask = values.try_iter()?.map(|v| v?.is_truthy()).collect::<PyResult<Vec<bool>>>()?;
        if mask.len() as u64 != length {
            return Err(PyValueError::new_err(format!(
                "mm_position.is_embed has {} entries for a placeholder of length {length}",
                mask.len()
            )));
        }
        Some(mask)
    };
    // vLLM's get_num_embeds(): the placeholder's length, or its mask's true entries. Counted here
    // from the mask already read, where vLLM's method runs a torch cumsum per item.
    let num_embeds = mask.as_ref().map_or(length, |mask| mask.iter().filter(|&&embed| embed).count() as u64);
    let item = Item::new(Arc::from(identifier.to_str()?), offset, length, num_embeds, mask.as_deref());
    Ok(item.with_modality(modality_of(feature)?))
}

/// `try_schedule_encoder_inputs` of either manager class.
pub(crate) fn try_schedule_encoder_inputs<'py, M: Manager>(
    slf: &Bound<'py, M>,
    request: &Bound<'py, PyAny>,
    args: StepArgs,
    has_remote_item: Option<&Bound<'py, PyAny>>,
    on_mismatch: Option<&Bound<'py, PyAny>>,
) -> PyResult<Bound<'py, PyTuple>> {
    with_request(slf, request, |req| {
        req.load_window::<M::Cache>(args)?;
        let out = req.try_schedule(&mut write(slf)?.cache, args, has_remote_item)?;
        req.result(out, on_mismatch)
    })
}

/// `allocate_encoder_inputs` of either manager class.
pub(crate) fn allocate_encoder_inputs<M: Manager>(
    slf: &Bound<'_, M>,
    request: &Bound<'_, PyAny>,
    input_ids: Vec<i64>,
    duplicate_input_ids: Vec<i64>,
) -> PyResult<()> {
    with_request(slf, request, |req| {
        let (input_ids, repeated) = req.load_inputs(input_ids, duplicate_input_ids)?;
        req.allocate(&mut write(slf)?.cache, &input_ids, &repeated)
    })
}

/// `free_encoder_inputs_before` of either manager class. Under
/// encoder-decoder rules every held input goes once the request has computed
/// a token (`request.num_computed_tokens > 0`).
pub(crate) fn free_encoder_inputs_before<M: Manager>(
    slf: &Bound<'_, M>,
    request: &Bound<'_, PyAny>,
    position: i64,
) -> PyResult<Vec<usize>> {
    let decoder_started = M::Cache::ENCODER_DECODER && request.getattr(intern!(request.py(), "num_computed_tokens"))?.extract::<i64>()? > 0;
    with_request(slf, request, |req| req.free_before(&mut write(slf)?.cache, position, decoder_started))
}

/// Runs `work` on `request` as read by [`StepRequest::read`], over the
/// manager's records of it, and gives the records back afterwards, whatever
/// `work` returned.
fn with_request<'py, M: Manager, T>(
    slf: &Bound<'py, M>,
    request: &Bound<'py, PyAny>,
    work: impl FnOnce(&mut StepRequest<'py>) -> PyResult<T>,
) -> PyResult<T> {
    let mut req = StepRequest::read(request, || Ok(write(slf)?.records.take_slots(request)))?;
    let out = work(&mut req);
    // A manager still borrowed (a failed re-entrant call) keeps no records: they are only a cache.
    if let Ok(mut state) = write(slf) {
        // Only a cache: an id that cannot be kept (not UTF-8) failed `work` already.
        let _ = state.records.keep_slots(request, &req.id, std::mem::take(&mut req.items));
    }
    out
}
