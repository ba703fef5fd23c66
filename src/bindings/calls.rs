//! How a per-call method (vLLM's `check_and_update_cache`, `can_allocate`,
//! `allocate`, `get_cached_num_encoder_embeds`, the frees) gets what it needs
//! of its request: from the request's record when it has it, else read from
//! the request and recorded (see `records`).
//!
//! `mm_features[i]` is read on every call and compared by identity with the
//! object the record was read from. When the record knows everything, as on
//! every call after an item's first, the call borrows the state once and
//! copies no key. On an item's first sight the call reads what is missing
//! with the state not borrowed (so a read that calls back into the manager
//! finds it usable), records it, and borrows again.

use pyo3::exceptions::{PyException, PyRuntimeError};
use pyo3::prelude::*;
use pyo3::types::PyString;

use super::records::{Records, RequestId, RequestRecord};
use super::request::{feature, identifier_of, modality_of, num_embeds, request_id};
use super::shared::{write, Manager, ManagerState};
use crate::cache::{Key, KeyArg};

/// When a per-call method reads `request.request_id`.
#[derive(Clone, Copy, PartialEq, Eq)]
enum IdRead {
    /// Never: the method keeps records only of requests they already know.
    Never,
    /// Only to keep records: a request without a readable id is served all the same.
    ForRecords,
    /// The method needs it.
    Always,
}

/// What a per-call method reads of its request besides `mm_features[i]`,
/// which it reads on every call.
#[derive(Clone, Copy)]
pub(crate) struct Needs {
    request_id: IdRead,
    identifier: bool,
    num_embeds: bool,
    modality: bool,
}

impl Needs {
    /// `check_and_update_cache`.
    pub(crate) const HIT: Self = Self { request_id: IdRead::Always, identifier: true, num_embeds: false, modality: false };
    /// `can_allocate`: vLLM reads the size alone.
    pub(crate) const SIZE: Self = Self { request_id: IdRead::ForRecords, identifier: false, num_embeds: true, modality: false };
    /// `allocate`: the modality too, which the item's statistics are counted under.
    pub(crate) const ALL: Self = Self { request_id: IdRead::Always, identifier: true, num_embeds: true, modality: true };
    /// `get_cached_num_encoder_embeds`.
    pub(crate) const IDENTIFIER: Self = Self { request_id: IdRead::Never, identifier: true, num_embeds: false, modality: false };
}

/// One input as a per-call method sees it: what its [`Needs`] asked for,
/// borrowed from the request's record, or from this call's own reads when
/// the record could not keep them.
pub(crate) struct Input<'a> {
    request_id: Option<KeyArg<'a>>,
    identifier: Option<&'a Key>,
    num_embeds: Option<u64>,
    modality: Option<u8>,
}

/// Asking for what the method's `Needs` left out: a bug, reported rather than panicked on.
fn not_read(what: &str) -> PyErr {
    PyRuntimeError::new_err(format!("internal error: {what} was not read for this call"))
}

impl<'a> Input<'a> {
    pub(crate) fn request_id(&self) -> PyResult<KeyArg<'a>> {
        self.request_id.ok_or_else(|| not_read("request_id"))
    }

    pub(crate) fn identifier(&self) -> PyResult<&'a Key> {
        self.identifier.ok_or_else(|| not_read("identifier"))
    }

    pub(crate) fn num_embeds(&self) -> PyResult<u64> {
        self.num_embeds.ok_or_else(|| not_read("get_num_encoder_embeds"))
    }

    pub(crate) fn modality(&self) -> PyResult<u8> {
        self.modality.ok_or_else(|| not_read("modality"))
    }

    /// Input `input_id` as `record` knows it, read from `feature`.
    fn recorded(record: Option<&'a RequestRecord>, input_id: usize, feature: &Bound<'_, PyAny>) -> Self {
        let input = record.and_then(|record| record.input(input_id, feature));
        Input {
            request_id: record.map(|record| KeyArg::from(&record.id)),
            identifier: input.and_then(|input| input.identifier.as_ref()),
            num_embeds: input.and_then(|input| input.num_embeds),
            modality: input.and_then(|input| input.modality),
        }
    }

    fn has(&self, needs: Needs) -> bool {
        (needs.request_id != IdRead::Always || self.request_id.is_some())
            && (!needs.identifier || self.identifier.is_some())
            && (!needs.num_embeds || self.num_embeds.is_some())
            && (!needs.modality || self.modality.is_some())
    }

    /// What of `needs` is left to read: the request id only if it is not here.
    fn lacking(&self, needs: Needs) -> Needs {
        Needs {
            request_id: if self.request_id.is_some() { IdRead::Never } else { needs.request_id },
            identifier: needs.identifier && self.identifier.is_none(),
            num_embeds: needs.num_embeds && self.num_embeds.is_none(),
            modality: needs.modality && self.modality.is_none(),
        }
    }
}

/// What a call read from the request itself, because the record did not have it.
#[derive(Default)]
struct CallReads<'py> {
    request_id: Option<Bound<'py, PyString>>,
    identifier: Option<Key>,
    num_embeds: Option<u64>,
    modality: Option<u8>,
}

impl<'py> CallReads<'py> {
    /// Reads what `needs` asks for and this call does not have yet, in
    /// vLLM's order (the identifier's error comes before the request id's).
    fn read(&mut self, request: &Bound<'py, PyAny>, input_id: usize, feature: &Bound<'py, PyAny>, needs: Needs) -> PyResult<()> {
        if needs.identifier && self.identifier.is_none() {
            self.identifier = Some(Key::from(identifier_of(feature)?.to_str()?));
        }
        if self.request_id.is_none() {
            match needs.request_id {
                IdRead::Never => {}
                IdRead::ForRecords => {
                    self.request_id = match request_id(request) {
                        Ok(id) => Some(id),
                        // Swallowed only as an ordinary error: an interrupt still goes through.
                        Err(err) if err.is_instance_of::<PyException>(request.py()) => None,
                        Err(err) => return Err(err),
                    }
                }
                IdRead::Always => self.request_id = Some(request_id(request)?),
            }
        }
        if needs.num_embeds && self.num_embeds.is_none() {
            self.num_embeds = Some(num_embeds(request, input_id)?);
        }
        if needs.modality && self.modality.is_none() {
            self.modality = Some(modality_of(feature)?);
        }
        Ok(())
    }

    fn input(&self) -> PyResult<Input<'_>> {
        let request_id = self.request_id.as_ref().map(|id| id.to_str().map(KeyArg::from)).transpose()?;
        Ok(Input { request_id, identifier: self.identifier.as_ref(), num_embeds: self.num_embeds, modality: self.modality })
    }

    /// Moves what this call read into `request`'s record (creating it when
    /// the id was read) and gives back what the record now holds for the
    /// input; None if the record cannot be placed (unknown request, id unread).
    fn record<'r>(
        &mut self,
        records: &'r mut Records,
        request: &Bound<'py, PyAny>,
        input_id: usize,
        feature: &Bound<'py, PyAny>,
    ) -> PyResult<Option<&'r RequestRecord>> {
        let record = match &self.request_id {
            Some(id) => records.entry(request, &RequestId::Read(id.clone()))?,
            None => match records.get_mut(request) {
                Some(record) => record,
                None => return Ok(None),
            },
        };
        let input = record.input_mut(input_id, feature);
        // Moved, not copied: a call that finds the record incomplete afterwards reads again.
        input.identifier = input.identifier.take().or_else(|| self.identifier.take());
        input.num_embeds = input.num_embeds.or(self.num_embeds);
        input.modality = input.modality.or(self.modality);
        Ok(Some(record))
    }
}

/// Runs `op` on the manager's cache with input `input_id` of `request`, as
/// `needs` asks (see the module's doc).
pub(crate) fn with_input<'py, M: Manager, R>(
    manager: &Bound<'py, M>,
    request: &Bound<'py, PyAny>,
    input_id: usize,
    needs: Needs,
    op: impl FnOnce(&mut M::Cache, Input<'_>) -> PyResult<R>,
) -> PyResult<R> {
    let mut reads = CallReads::default();
    let feature = match feature(request, input_id) {
        Ok(feature) => feature,
        // vLLM's `can_allocate` reads the size alone, which a request may give without the item.
        Err(err) if !needs.identifier && err.is_instance_of::<PyException>(request.py()) => {
            reads.num_embeds = Some(num_embeds(request, input_id)?);
            return op(&mut write(manager)?.cache, reads.input()?);
        }
        Err(err) => return Err(err),
    };
    let lacking = {
        let mut state = write(manager)?;
        let ManagerState { cache, records } = &mut *state;
        let known = Input::recorded(records.get(request), input_id, &feature);
        if known.has(needs) {
            return op(cache, known);
        }
        known.lacking(needs)
    };
    reads.read(request, input_id, &feature, lacking)?;
    {
        let mut state = write(manager)?;
        let ManagerState { cache, records } = &mut *state;
        if let Some(record) = reads.record(records, request, input_id, &feature)? {
            let known = Input::recorded(Some(record), input_id, &feature);
            if known.has(needs) {
                return op(cache, known);
            }
        }
    }
    // The record could not keep it all: the request id could not be read,
    // or a read called back into the manager and changed the records.
    let needs = Needs { request_id: if needs.request_id == IdRead::Always { IdRead::Always } else { IdRead::Never }, ..needs };
    reads.read(request, input_id, &feature, needs)?;
    op(&mut write(manager)?.cache, reads.input()?)
}

/// Runs `op` on the manager's cache with `request.request_id`: from the
/// record if there is one (one borrow, nothing copied), else read first.
pub(crate) fn with_request_id<'py, M: Manager, R>(
    manager: &Bound<'py, M>,
    request: &Bound<'py, PyAny>,
    op: impl FnOnce(&mut M::Cache, KeyArg<'_>) -> R,
) -> PyResult<R> {
    {
        let mut state = write(manager)?;
        let ManagerState { cache, records } = &mut *state;
        if let Some(record) = records.get(request) {
            return Ok(op(cache, KeyArg::from(&record.id)));
        }
    }
    let id = request_id(request)?;
    Ok(op(&mut write(manager)?.cache, KeyArg::from(id.to_str()?)))
}
