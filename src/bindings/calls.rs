//! How a per-call method of `EncoderCacheManager` (vLLM's
//! `check_and_update_cache`, `can_allocate`, `allocate`,
//! `get_cached_num_encoder_embeds`, the frees) gets what it needs of its
//! request: from the request's record when it has it, else read from the
//! request and recorded (see `records`).
//!
//! `mm_features[i]` is taken from the `mm_features` list the record kept
//! and compared by identity with the object the record was read from. When
//! the record knows everything, as on every call after an item's first, the
//! call borrows the state once, reads nothing from Python, and hands the core
//! hashed names with handles: no string is hashed or copied. At an item's
//! first sight, or for a replaced item, the call reads what is missing of
//! the item from the kept list; without a record, or for an index past the
//! kept list, it reads `request.mm_features[i]` afresh. A read that may run
//! Python code happens with the state not borrowed (so a read that calls
//! back into the manager finds it usable); the call records it and borrows
//! again. An item of a request the record knows, both of known classes (see
//! `known_types`), is read at once under the one borrow: its facts are plain
//! fields, unless a size must come from the request (a masked item).

use std::ops::DerefMut;

use pyo3::exceptions::{PyException, PyRuntimeError};
use pyo3::prelude::*;
use pyo3::pyclass::boolean_struct::False;
use pyo3::types::PyString;
use pyo3::PyClass;

use super::known_types::is_known;
use super::manager::PyEncoderCacheManager;
use super::records::RequestRecord;
use super::request::{feature_and_list, identifier_of, known_unmasked_length, modality_of, num_embeds, num_embeds_of, request_id};
use super::shared::{write, ManagerState};
use crate::cache::{hash_key, EncoderCache, Holding, Key, KeyArg};

/// When a per-call method reads `request.request_id`.
#[derive(Clone, Copy, PartialEq, Eq)]
enum IdRead {
    /// Never: the record has it already, or a read changed the records and the call reads for itself.
    Never,
    /// Only to keep records: a request without a readable id is served all the same.
    ForRecords,
    /// The method needs it.
    Always,
}

/// What a per-call method reads of its request besides `mm_features[i]`,
/// which it reads on every call.
#[derive(Clone, Copy)]
#[allow(clippy::struct_excessive_bools)] // one flag per thing read, as the constants below spell out
pub(crate) struct Needs {
    request_id: IdRead,
    identifier: bool,
    num_embeds: bool,
    modality: bool,
    /// The call may cache the item or hold it for the request: note the core's
    /// handles after it, unless its answer says it did neither (see [`Answer`]).
    changes: bool,
    /// At an item's first sight, read every fact of an item of known classes
    /// (see `CallReads::read`), not only what this call needs.
    read_all: bool,
}

impl Needs {
    /// `check_and_update_cache`.
    pub(crate) const HIT: Self =
        Self { request_id: IdRead::Always, identifier: true, num_embeds: false, modality: false, changes: true, read_all: true };
    /// `can_allocate`: vLLM reads the size alone.
    pub(crate) const SIZE: Self =
        Self { request_id: IdRead::ForRecords, identifier: false, num_embeds: true, modality: false, changes: false, read_all: true };
    /// `allocate`: the modality too, which the item's statistics are counted under.
    pub(crate) const ALL: Self =
        Self { request_id: IdRead::Always, identifier: true, num_embeds: true, modality: true, changes: true, read_all: true };
    /// `get_cached_num_encoder_embeds`: vLLM's scheduler calls it first on
    /// each item, so its reads are recorded for the hit check that follows.
    /// It reads the identifier alone: most items it is asked about are hits,
    /// which need nothing more, and a miss's `can_allocate` reads the rest.
    pub(crate) const IDENTIFIER: Self =
        Self { request_id: IdRead::ForRecords, identifier: true, num_embeds: false, modality: false, changes: false, read_all: false };
}

/// One input as a per-call method sees it: what its [`Needs`] asked for.
pub(crate) struct Input<'a> {
    request_id: Option<KeyArg<'a>>,
    identifier: Option<KeyArg<'a>>,
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

    pub(crate) fn identifier(&self) -> PyResult<KeyArg<'a>> {
        self.identifier.ok_or_else(|| not_read("identifier"))
    }

    pub(crate) fn num_embeds(&self) -> PyResult<u64> {
        self.num_embeds.ok_or_else(|| not_read("get_num_encoder_embeds"))
    }

    pub(crate) fn modality(&self) -> PyResult<u8> {
        self.modality.ok_or_else(|| not_read("modality"))
    }

    /// Input `input_id` as `record` knows it, read from `feature`.
    #[inline]
    fn recorded(record: &'a RequestRecord, input_id: usize, feature: &Bound<'_, PyAny>) -> Self {
        let input = record.input(input_id, feature);
        Input {
            request_id: Some(record.id()),
            identifier: input.and_then(super::records::InputRecord::key),
            num_embeds: input.and_then(|input| input.num_embeds),
            modality: input.and_then(|input| input.modality),
        }
    }

    /// What of `needs` is left to read: the request id only if it is not here.
    fn lacking(&self, needs: Needs) -> Needs {
        Needs {
            request_id: if self.request_id.is_some() { IdRead::Never } else { needs.request_id },
            identifier: needs.identifier && self.identifier.is_none(),
            num_embeds: needs.num_embeds && self.num_embeds.is_none(),
            modality: needs.modality && self.modality.is_none(),
            changes: needs.changes,
            read_all: needs.read_all,
        }
    }

    #[inline]
    fn has(&self, needs: Needs) -> bool {
        (needs.request_id != IdRead::Always || self.request_id.is_some())
            && (!needs.identifier || self.identifier.is_some())
            && (!needs.num_embeds || self.num_embeds.is_some())
            && (!needs.modality || self.modality.is_some())
    }
}

/// `feature.identifier` as the core takes it: copied into a [`Key`], with its hash.
fn hashed_identifier(feature: &Bound<'_, PyAny>) -> PyResult<(Key, u64)> {
    let key = Key::from(identifier_of(feature)?.to_str()?);
    let hash = hash_key(&key);
    Ok((key, hash))
}

/// What a call read from the request itself, because the record did not have it.
#[derive(Default)]
struct CallReads<'py> {
    request_id: Option<Bound<'py, PyString>>,
    identifier: Option<(Key, u64)>,
    num_embeds: Option<u64>,
    modality: Option<u8>,
}

impl<'py> CallReads<'py> {
    /// Reads what `needs` asks for, in vLLM's order (the identifier's error
    /// comes before the request id's).
    ///
    /// A request and item of vLLM's or our own classes (see `known_types`)
    /// have every fact of the item read at its first sight by a call whose
    /// needs say `read_all`, as plain attribute reads that run no Python
    /// code: the item's later calls find them recorded.
    fn read(request: &Bound<'py, PyAny>, input_id: usize, feature: &Bound<'py, PyAny>, needs: Needs) -> PyResult<Self> {
        let mut reads = Self::default();
        let eager = needs.read_all && (needs.identifier || needs.num_embeds || needs.modality) && is_known(request) && is_known(feature);
        if eager {
            reads.identifier = Some(hashed_identifier(feature)?);
            reads.modality = Some(modality_of(feature)?);
            reads.num_embeds = known_unmasked_length(feature);
        }
        if needs.identifier && reads.identifier.is_none() {
            reads.identifier = Some(hashed_identifier(feature)?);
        }
        reads.request_id = match needs.request_id {
            IdRead::Never => None,
            IdRead::ForRecords => match request_id(request) {
                Ok(id) => Some(id),
                // Swallowed only as an ordinary error: an interrupt still goes through.
                Err(err) if err.is_instance_of::<PyException>(request.py()) => None,
                Err(err) => return Err(err),
            },
            IdRead::Always => Some(request_id(request)?),
        };
        if needs.num_embeds && reads.num_embeds.is_none() {
            // A masked item of known classes, or classes not known: as the request answers.
            reads.num_embeds = Some(if eager { num_embeds(request, input_id)? } else { num_embeds_of(request, input_id, feature)? });
        }
        if needs.modality && reads.modality.is_none() {
            reads.modality = Some(modality_of(feature)?);
        }
        Ok(reads)
    }

    /// What [`CallReads::read`] would read, read while the manager stays
    /// borrowed; only when none of the reads can run Python code: the request
    /// and item are of known classes (see `known_types`), the request id is
    /// not needed, and a size, if needed, is the unmasked placeholder's
    /// length. None when a read might run Python code, for `read` to make
    /// with the manager not borrowed.
    fn read_fields(request: &Bound<'py, PyAny>, feature: &Bound<'py, PyAny>, needs: Needs) -> Option<PyResult<Self>> {
        let wanted = needs.identifier || needs.num_embeds || needs.modality;
        if !wanted || needs.request_id != IdRead::Never || !is_known(request) || !is_known(feature) {
            return None;
        }
        let mut reads = Self::default();
        if needs.read_all || needs.num_embeds {
            reads.num_embeds = known_unmasked_length(feature);
            if needs.num_embeds && reads.num_embeds.is_none() {
                return None; // masked, or not a known placeholder: the request is asked
            }
        }
        let mut read = || -> PyResult<Self> {
            if needs.read_all || needs.identifier {
                reads.identifier = Some(hashed_identifier(feature)?);
            }
            if needs.read_all || needs.modality {
                reads.modality = Some(modality_of(feature)?);
            }
            Ok(std::mem::take(&mut reads))
        };
        Some(read())
    }

    fn input(&self) -> PyResult<Input<'_>> {
        let request_id = self.request_id.as_ref().map(|id| id.to_str().map(KeyArg::from)).transpose()?;
        let identifier = self.identifier.as_ref().map(|(key, hash)| KeyArg::hashed(key, *hash));
        Ok(Input { request_id, identifier, num_embeds: self.num_embeds, modality: self.modality })
    }

    /// Moves what this call read into `record` for input `input_id`, keeping what it had.
    fn keep(self, record: &mut RequestRecord, input_id: usize, feature: &Bound<'py, PyAny>) {
        let input = record.input_mut(input_id, feature);
        if input.identifier.is_none() {
            input.identifier = self.identifier;
        }
        input.num_embeds = input.num_embeds.or(self.num_embeds);
        input.modality = input.modality.or(self.modality);
    }
}

/// What a per-call method's answer says of the call.
pub(crate) trait Answer {
    /// False when the call cannot have cached the item or made the request hold it.
    fn may_have_changed(&self) -> bool {
        true
    }

    /// The handles the call left the request and the item under, when it says.
    fn holding(&self) -> Option<Holding> {
        None
    }
}

/// `allocate`: the core says the handles it gave.
impl Answer for Holding {
    fn holding(&self) -> Option<Holding> {
        Some(*self)
    }
}

/// `check_and_update_cache`: a miss changes nothing.
impl Answer for bool {
    fn may_have_changed(&self) -> bool {
        *self
    }
}

impl Answer for () {}

impl Answer for Option<u64> {}

/// After a call that may have cached the item or made the request hold it:
/// the core's current handles for both, asked in one call (a handle still
/// valid is found by itself, without hashing).
#[inline]
fn note_handles(cache: &EncoderCache, record: &mut RequestRecord, input_id: usize) {
    let (request, item) = cache.handles(&record.id(), record.inputs.get(input_id).and_then(super::records::InputRecord::key).as_ref());
    record.set_handles(input_id, request, item);
}

/// Runs `op` with input `input_id` as `record` knows it from `feature` when
/// the record has what `needs` asks, noting the core's handles after a call
/// that may have changed them; otherwise gives `op` back, with what is lacking.
#[inline]
fn run_recorded<R: Answer, F: FnOnce(&mut EncoderCache, &Input<'_>) -> PyResult<R>>(
    cache: &mut EncoderCache,
    record: &mut RequestRecord,
    input_id: usize,
    feature: &Bound<'_, PyAny>,
    needs: Needs,
    op: F,
) -> Result<PyResult<R>, (F, Needs)> {
    let input = Input::recorded(record, input_id, feature);
    if !input.has(needs) {
        return Err((op, input.lacking(needs)));
    }
    let out = op(cache, &input);
    if needs.changes {
        match out.as_ref().map(|answer| (answer.holding(), answer.may_have_changed())) {
            Ok((Some(holding), _)) => record.set_handles(input_id, Some(holding.request), Some(holding.item)),
            Ok((None, true)) => note_handles(cache, record, input_id),
            _ => {}
        }
    }
    Ok(out)
}

/// After [`run_recorded`] found the record lacking: reads what it lacks with
/// the state still borrowed, when no read can run Python code (see
/// [`CallReads::read_fields`]), records it and runs `op`; otherwise gives
/// `op` back, with what is lacking.
#[inline]
#[allow(clippy::too_many_arguments)] // run_recorded's arguments, and the request and what is lacking
fn run_read_fields<R: Answer, F: FnOnce(&mut EncoderCache, &Input<'_>) -> PyResult<R>>(
    cache: &mut EncoderCache,
    record: &mut RequestRecord,
    request: &Bound<'_, PyAny>,
    input_id: usize,
    feature: &Bound<'_, PyAny>,
    needs: Needs,
    lacking: Needs,
    op: F,
) -> Result<PyResult<R>, (F, Needs)> {
    match CallReads::read_fields(request, feature, lacking) {
        None => Err((op, lacking)),
        Some(Err(err)) => Ok(Err(err)),
        Some(Ok(reads)) => {
            reads.keep(record, input_id, feature);
            run_recorded(cache, record, input_id, feature, needs, op)
        }
    }
}

/// `op` on the item key input `input_id` of `request` is recorded under, when
/// the request's record was read from the very `mm_features[i]` object that
/// is there now and knows the item's identifier (with its handle, if cached);
/// None otherwise, for [`with_input`] to read what is missing. For read-only
/// calls (`get_cached_num_encoder_embeds`): one shared borrow, nothing read
/// from Python but the list item, and no record changed.
#[inline]
pub(crate) fn with_recorded_key<R>(
    manager: &Bound<'_, PyEncoderCacheManager>,
    request: &Bound<'_, PyAny>,
    input_id: usize,
    op: impl FnOnce(&EncoderCache, KeyArg<'_>) -> R,
) -> PyResult<Option<R>> {
    let guard = manager.try_borrow()?;
    let state: &ManagerState<EncoderCache> = &guard;
    let Some(record) = state.records.get(request) else { return Ok(None) };
    let Some(feature) = record.recorded_feature(request.py(), input_id) else { return Ok(None) };
    Ok(record.input(input_id, &feature).and_then(super::records::InputRecord::key).map(|key| op(&state.cache, key)))
}

/// Runs `op` on the manager's cache with input `input_id` of `request`, as
/// `needs` asks (see the module's doc).
pub(crate) fn with_input<'py, R: Answer>(
    manager: &Bound<'py, PyEncoderCacheManager>,
    request: &Bound<'py, PyAny>,
    input_id: usize,
    needs: Needs,
    mut op: impl FnOnce(&mut EncoderCache, &Input<'_>) -> PyResult<R>,
) -> PyResult<R> {
    let py = request.py();
    // The item from the request's recorded `mm_features` list: when the
    // record was read from that very object and has what this call needs,
    // nothing is read from Python at all; when it lacks something (the
    // item's first sight, a replaced item), only that is read.
    let recorded = {
        let mut guard = manager.try_borrow_mut()?;
        let state: &mut ManagerState<EncoderCache> = &mut guard;
        match state.records.get_mut(request) {
            Some(record) => match record.recorded_feature(py, input_id) {
                Some(feature) => match run_recorded(&mut state.cache, record, input_id, &feature, needs, op)
                    .or_else(|(back, lacking)| run_read_fields(&mut state.cache, record, request, input_id, &feature, needs, lacking, back))
                {
                    Ok(out) => return out,
                    Err((back, lacking)) => {
                        op = back;
                        record.recorded_features(py).map(|list| (feature, list, lacking))
                    }
                },
                None => None,
            },
            None => None,
        }
    };
    let (feature, list, lacking) = if let Some((feature, list, lacking)) = recorded {
        (feature, Some(list), lacking)
    } else {
        // No record, or an index past the recorded list: `request.mm_features` read afresh.
        let (feature, list) = match feature_and_list(request, input_id) {
            Ok(read) => read,
            // vLLM's `can_allocate` reads the size alone, which a request may give without the item.
            Err(err) if !needs.identifier && err.is_instance_of::<PyException>(py) => {
                let reads = CallReads { num_embeds: Some(num_embeds(request, input_id)?), ..CallReads::default() };
                return op(&mut manager.try_borrow_mut()?.cache, &reads.input()?);
            }
            Err(err) => return Err(err),
        };
        let mut guard = manager.try_borrow_mut()?;
        let state: &mut ManagerState<EncoderCache> = &mut guard;
        let lacking = match state.records.get_mut(request) {
            Some(record) => {
                record.keep_features(list.as_ref());
                match run_recorded(&mut state.cache, record, input_id, &feature, needs, op) {
                    Ok(out) => return out,
                    Err((back, lacking)) => {
                        op = back;
                        lacking
                    }
                }
            }
            None => needs,
        };
        (feature, list, lacking)
    };
    let num_items = list.as_ref().map_or(0, PyListMethods::len);
    let reads = CallReads::read(request, input_id, &feature, lacking)?;
    // Ok: the call's result; Err: `op` back, the reads not kept.
    let (ran, displaced) = {
        let mut guard = manager.try_borrow_mut()?;
        let state: &mut ManagerState<EncoderCache> = &mut guard;
        let record = match &reads.request_id {
            Some(id) => Some(state.records.entry(request, id.to_str()?)),
            None => state.records.get_mut(request),
        };
        let ran = match record {
            Some(record) => {
                record.reserve_inputs(num_items);
                record.keep_features(list.as_ref());
                reads.keep(record, input_id, &feature);
                run_recorded(&mut state.cache, record, input_id, &feature, needs, op).map_err(|(back, _)| back)
            }
            // No record to keep the reads in: the request id could not be read.
            None if needs.request_id != IdRead::Always => return op(&mut state.cache, &reads.input()?),
            None => Err(op),
        };
        (ran, state.records.take_displaced())
    };
    drop(displaced); // with the manager not borrowed: the records pushed out may hold the last references
    match ran {
        Ok(out) => return out,
        Err(back) => op = back,
    }
    // The record could not keep it all: a read called back into the manager
    // and changed the records. Read everything for this call alone.
    let needs = Needs { request_id: if needs.request_id == IdRead::Always { IdRead::Always } else { IdRead::Never }, ..needs };
    let reads = CallReads::read(request, input_id, &feature, needs)?;
    op(&mut manager.try_borrow_mut()?.cache, &reads.input()?)
}

/// Runs `op` on the manager's cache with `request.request_id`: from the
/// record if there is one (one borrow, nothing copied or hashed), else read first.
pub(crate) fn with_request_id<'py, C, M, R>(
    manager: &Bound<'py, M>,
    request: &Bound<'py, PyAny>,
    op: impl FnOnce(&mut C, KeyArg<'_>) -> R,
) -> PyResult<R>
where
    M: PyClass<Frozen = False> + DerefMut<Target = ManagerState<C>>,
{
    {
        let mut guard = write(manager)?;
        let state: &mut ManagerState<C> = &mut guard;
        if let Some(record) = state.records.get(request) {
            return Ok(op(&mut state.cache, record.id()));
        }
    }
    let id = request_id(request)?;
    Ok(op(&mut write(manager)?.cache, KeyArg::from(id.to_str()?)))
}

/// `free(request)`: runs `free` on the manager's cache with the request's id
/// and forgets its record, under one borrow when there is a record (the id
/// is then neither read nor hashed). The record is dropped after the borrow.
pub(crate) fn free_request<'py, C, M, R>(
    manager: &Bound<'py, M>,
    request: &Bound<'py, PyAny>,
    free: impl Fn(&mut C, KeyArg<'_>) -> R,
) -> PyResult<()>
where
    M: PyClass<Frozen = False> + DerefMut<Target = ManagerState<C>>,
{
    let record = {
        let mut guard = write(manager)?;
        let state: &mut ManagerState<C> = &mut guard;
        let record = state.records.forget(request);
        if let Some(record) = &record {
            free(&mut state.cache, record.id());
        }
        record
    };
    if record.is_none() {
        with_request_id(manager, request, |cache: &mut C, id| free(cache, id))?;
    }
    drop(record);
    Ok(())
}
