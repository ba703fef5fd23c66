//! One scheduler step for one request: which of its multimodal items to encode,
//! which to load from a remote cache, which hits to take, and when to stop
//! short; then the allocations and frees that go with it.
//!
//! vLLM 0.33's scheduler runs this as a Python loop calling the manager once
//! per item (`_try_schedule_encoder_inputs`, `_allocate_encoder_inputs`,
//! `_free_encoder_inputs`). Here it is one call over the request's [`Items`]:
//! every item's placeholder position, and the full [`Item`] record of the items
//! a call works on ([`window`] for a step, the given ids for an allocation, the
//! inputs to free), so a caller can read the rest from the request only when
//! first needed. A step costs a few hash look-ups per item and no interpreter
//! round trips.

use std::ops::Range;

use hashbrown::HashTable;

use crate::cache::{hash_key, CacheError, Key, KeyArg};

mod caches;
pub use caches::StepCache;

/// One multimodal item of a request, as a step needs it.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Item {
    pub identifier: Key,
    /// The identifier's [`hash_key`], computed once with the record.
    pub hash: u64,
    /// First placeholder token of the item in the request's token sequence.
    pub offset: u64,
    /// Placeholder tokens of the item.
    pub length: u64,
    /// Embeddings the encoder produces for the item.
    pub num_embeds: u64,
    /// The item's modality tag for the cache's counters (0 = unknown; see
    /// [`Item::with_modality`]).
    pub modality: u8,
    /// Running count of the placeholder tokens that take an embedding (the
    /// cumulative sum of `is_embed`), or `None` when all of them do.
    embeds_cumsum: Option<Box<[u64]>>,
}

impl Item {
    /// `is_embed`, when given, marks the placeholder tokens that take an
    /// embedding; the other tokens (breaks, text) are not stored in the cache.
    pub fn new(identifier: Key, offset: u64, length: u64, num_embeds: u64, is_embed: Option<&[bool]>) -> Self {
        let embeds_cumsum = is_embed.map(|mask| {
            let mut cumsum = Vec::with_capacity(mask.len());
            let mut n = 0u64;
            for &embed in mask {
                n += u64::from(embed);
                cumsum.push(n);
            }
            cumsum.into_boxed_slice()
        });
        Self { hash: hash_key(&identifier), identifier, offset, length, num_embeds, modality: 0, embeds_cumsum }
    }

    /// The identifier as the cache takes it: hashed already.
    pub fn key(&self) -> KeyArg<'_> {
        KeyArg::hashed(&self.identifier, self.hash)
    }

    /// The item with modality tag `modality` (the caller's numbering; 0 = unknown).
    #[must_use]
    pub fn with_modality(mut self, modality: u8) -> Self {
        self.modality = modality;
        self
    }

    /// The embeddings `(first, last)` covered by placeholder tokens
    /// `[start, end)` of the item (`PlaceholderRange.get_embeds_indices_in_range`);
    /// `None` when the mask has no entry for a bound, where vLLM's lookup fails.
    fn embeds_in_range(&self, start: i128, end: i128) -> Option<(i128, i128)> {
        let Some(cumsum) = &self.embeds_cumsum else {
            return Some((start, end));
        };
        let before = |idx: i128| -> Option<i128> {
            if idx <= 0 {
                return (idx == 0).then_some(0);
            }
            let pos = usize::try_from(idx - 1).ok()?;
            cumsum.get(pos).map(|&n| i128::from(n))
        };
        Some((before(start)?, before(end)?))
    }
}

/// A request's items as the step functions see them: the placeholder position
/// of every item, and the full record of those the caller has read.
pub trait Items {
    fn num_items(&self) -> usize;
    /// `(offset, length)` of the item's placeholder; `None` past the last item.
    fn position(&self, input_id: usize) -> Option<(u64, u64)>;
    /// The item's full record: [`StepError::InputOutOfRange`] past the last
    /// item, [`StepError::NotRead`] when the caller has not read it.
    fn item(&self, input_id: usize) -> Result<&Item, StepError>;
}

/// Fully read items.
impl Items for [Item] {
    fn num_items(&self) -> usize {
        self.len()
    }

    fn position(&self, input_id: usize) -> Option<(u64, u64)> {
        self.get(input_id).map(|item| (item.offset, item.length))
    }

    fn item(&self, input_id: usize) -> Result<&Item, StepError> {
        self.get(input_id).ok_or(StepError::InputOutOfRange { input_id, num_items: self.len() })
    }
}

/// The arguments of one step, as vLLM's scheduler passes them.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub struct StepArgs {
    pub num_computed_tokens: i64,
    pub num_new_tokens: i64,
    pub encoder_compute_budget: i64,
    /// Tokens a drafter (EAGLE) reads ahead of `num_computed_tokens`.
    pub shift_computed_tokens: i64,
    /// Never schedule part of an item's placeholder.
    pub disable_chunked_mm_input: bool,
}

/// An identifier whose embedding count disagrees with the cache or with an
/// earlier item of the same step (a reused client-provided UUID): the request
/// gets nothing this step.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Mismatch {
    pub input_id: usize,
    pub identifier: Key,
    pub cached: u64,
    pub requested: u64,
}

/// What a step decided, in vLLM's order and meaning.
#[derive(Debug, Clone, PartialEq, Eq, Default)]
pub struct Scheduled {
    /// Items to encode this step.
    pub to_encode: Vec<usize>,
    /// Tokens to schedule, cut short before an item that cannot be encoded.
    pub num_new_tokens: i64,
    /// Compute budget left.
    pub encoder_compute_budget: i64,
    /// Items the remote cache holds: space reserved, no compute.
    pub from_remote: Vec<usize>,
    /// Items whose identifier an earlier item of this step already schedules.
    pub repeated: Vec<usize>,
    /// Set when the step was rejected; the lists are then empty and
    /// `num_new_tokens` is 0.
    pub mismatch: Option<Mismatch>,
}

/// Input the step cannot work with. Nothing is changed by the call that
/// returns it, except where noted.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum StepError {
    /// An encoder-decoder item must sit at position 0: the encoder runs before
    /// the first decoder token.
    EncoderDecoderOffset { input_id: usize, offset: u64 },
    /// The `is_embed` mask has no entry for a bound of the scheduled range
    /// (items out of order). Hits taken earlier in the step stay taken.
    EmbedRange { input_id: usize, start: i128, end: i128, length: u64 },
    /// An input id the request does not have.
    InputOutOfRange { input_id: usize, num_items: usize },
    /// An allocation the cache refused. Earlier inputs of the call stay allocated.
    Cache(CacheError),
    /// A bug of the caller: it did not read an item the call needs (see
    /// [`Items`]). Detected before anything is changed.
    NotRead { input_id: usize },
}

impl std::fmt::Display for StepError {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self {
            Self::EncoderDecoderOffset { input_id, offset } => {
                write!(f, "encoder-decoder input {input_id} starts at token {offset}; encoder inputs must start at position 0")
            }
            Self::EmbedRange { input_id, start, end, length } => write!(
                f,
                "placeholder tokens [{start}, {end}) of input {input_id} are outside its is_embed mask of {length} \
                 entries; mm_features must be sorted by offset"
            ),
            Self::InputOutOfRange { input_id, num_items } => {
                let items = if *num_items == 1 { "item" } else { "items" };
                write!(f, "input_id {input_id} is out of range: the request has {num_items} multimodal {items}")
            }
            Self::Cache(err) => err.fmt(f),
            Self::NotRead { input_id } => {
                write!(f, "internal error: multimodal item {input_id} was used before it was read")
            }
        }
    }
}

impl std::error::Error for StepError {}

impl From<CacheError> for StepError {
    fn from(err: CacheError) -> Self {
        Self::Cache(err)
    }
}

/// Python's `bisect.bisect_left` over `key(input_id)` for the first `len`
/// items, midpoint for midpoint, so the window matches vLLM's even where items
/// overlap and their ends are not sorted.
fn bisect_left<E>(len: usize, x: i128, mut key: impl FnMut(usize) -> Result<u64, E>) -> Result<usize, E> {
    let (mut lo, mut hi) = (0, len);
    while lo < hi {
        let mid = usize::midpoint(lo, hi);
        if i128::from(key(mid)?) < x {
            lo = mid + 1;
        } else {
            hi = mid;
        }
    }
    Ok(lo)
}

/// The items a step with `args` looks at (vLLM's `get_mm_features_in_window`):
/// from the first that ends after the computed tokens (from the first of all
/// with encoder-decoder rules) to the last that starts before the window's
/// end. Only these need full records. Empty when the step schedules no tokens.
pub fn window<I: Items + ?Sized>(items: &I, args: StepArgs, encoder_decoder: bool) -> Range<usize> {
    // Only ids below `len` are looked up, so the positions are there.
    let position = |input_id| Ok::<_, std::convert::Infallible>(items.position(input_id).unwrap_or_default());
    match window_by(items.num_items(), args, encoder_decoder, position) {
        Ok(window) => window,
        Err(never) => match never {},
    }
}

/// [`window`] over `len` items whose positions `position(input_id)` gives as
/// the bisections ask for them: about `2 log2(len)` of them, so a caller can
/// read positions lazily, as vLLM's bisections over `mm_features` do.
pub fn window_by<E>(
    len: usize,
    args: StepArgs,
    encoder_decoder: bool,
    mut position: impl FnMut(usize) -> Result<(u64, u64), E>,
) -> Result<Range<usize>, E> {
    if args.num_new_tokens == 0 || len == 0 {
        return Ok(0..0);
    }
    let computed = i128::from(args.num_computed_tokens);
    let window_end = computed + i128::from(args.num_new_tokens) + i128::from(args.shift_computed_tokens);
    let lo = if encoder_decoder { 0 } else { bisect_left(len, computed + 1, |i| position(i).map(|(offset, length)| offset + length))? };
    let hi = bisect_left(len, window_end, |i| position(i).map(|(offset, _)| offset))?;
    Ok(lo..hi.max(lo))
}

/// vLLM's `_try_schedule_encoder_inputs` for the request's `items` (sorted by
/// offset). Hits are taken and evictions made as the loop goes, so they stand
/// even when the step is cut short or rejected, as in vLLM.
/// `has_remote_item(identifier)` says whether a remote cache holds an item.
pub fn try_schedule<'a, C: StepCache, I: Items + ?Sized, E: From<StepError>>(
    cache: &mut C,
    request_id: impl Into<KeyArg<'a>>,
    items: &I,
    args: StepArgs,
    has_remote_item: &mut dyn FnMut(&Key) -> Result<bool, E>,
) -> Result<Scheduled, E> {
    let request_id = request_id.into();
    let mut out =
        Scheduled { num_new_tokens: args.num_new_tokens, encoder_compute_budget: args.encoder_compute_budget, ..Scheduled::default() };
    let computed = i128::from(args.num_computed_tokens);
    let shift = i128::from(args.shift_computed_tokens);
    let window_end = computed + i128::from(args.num_new_tokens) + shift;
    // Identifiers this step schedules, with their sizes (allocates only on a miss).
    let mut scheduled: HashTable<&Item> = HashTable::new();
    let mut embeds_to_schedule: u64 = 0;

    let window = window(items, args, C::ENCODER_DECODER);
    let window_end_id = window.end;
    for input_id in window {
        let item = items.item(input_id)?;
        let start = i128::from(item.offset);
        let length = i128::from(item.length);
        if C::ENCODER_DECODER && computed > 0 {
            if item.offset != 0 {
                return Err(StepError::EncoderDecoderOffset { input_id, offset: item.offset }.into());
            }
            continue; // encoded before the first decoder token
        }
        if args.disable_chunked_mm_input
            && !C::ENCODER_DECODER
            && computed <= start
            && computed + i128::from(out.num_new_tokens) < start + length
        {
            // Never split an item: stop before it, the drafter's read-ahead included.
            out.num_new_tokens = clamp_tokens(start - (computed + shift)).max(0);
            break;
        }
        if !C::ENCODER_DECODER {
            let known = scheduled.find(item.hash, |other| other.identifier == item.identifier).map(|other| other.num_embeds);
            let reference = known.or_else(|| cache.cached_num_embeds(item));
            if let Some(cached) = reference.filter(|&n| n != item.num_embeds) {
                let mismatch = Mismatch { input_id, identifier: item.identifier.clone(), cached, requested: item.num_embeds };
                return Ok(Scheduled {
                    num_new_tokens: 0,
                    encoder_compute_budget: out.encoder_compute_budget,
                    mismatch: Some(mismatch),
                    ..Scheduled::default()
                });
            }
            if known.is_some() {
                out.repeated.push(input_id);
                continue;
            }
            if cache.check_and_update_cache(request_id, input_id, item).map_err(StepError::from)? {
                continue;
            }
        }
        let to_schedule = i64::try_from(embeds_to_schedule).unwrap_or(i64::MAX);
        if !cache.can_allocate(item.num_embeds, out.encoder_compute_budget, to_schedule) {
            // Encode an item whole or not at all: schedule the tokens before it, if any.
            out.num_new_tokens = if computed < start { out.num_new_tokens.min(clamp_tokens(start - computed)) } else { 0 };
            break;
        }
        let first = (computed - start).max(0);
        let last = length.min(window_end - start);
        let (embeds_first, embeds_last) =
            item.embeds_in_range(first, last).ok_or(StepError::EmbedRange { input_id, start: first, end: last, length: item.length })?;
        if embeds_first == embeds_last {
            continue; // only break or text tokens of the item fall in this step
        }
        if scheduled.is_empty() {
            scheduled.reserve(window_end_id - input_id, |other| other.hash); // no regrowth, and no allocation for a step of hits
        }
        scheduled.insert_unique(item.hash, item, |other| other.hash);
        embeds_to_schedule = embeds_to_schedule.saturating_add(item.num_embeds);
        if has_remote_item(&item.identifier)? {
            out.from_remote.push(input_id);
            continue;
        }
        // can_allocate checked num_embeds <= budget, so this cannot underflow.
        out.encoder_compute_budget -= i64::try_from(item.num_embeds).unwrap_or(i64::MAX);
        out.to_encode.push(input_id);
    }
    Ok(out)
}

/// A token count derived from `i64` inputs, back in `i64`.
fn clamp_tokens(n: i128) -> i64 {
    i64::try_from(n).unwrap_or(if n < 0 { i64::MIN } else { i64::MAX })
}

/// The records of `input_ids`, all or an error.
fn records<'a, I: Items + ?Sized>(items: &'a I, input_ids: &[usize]) -> Result<Vec<&'a Item>, StepError> {
    input_ids.iter().map(|&input_id| items.item(input_id)).collect()
}

/// vLLM's `_allocate_encoder_inputs`: allocate each of `input_ids`, then take
/// the hit for each of `repeated` (items repeated within the step). Ids are
/// checked first; an allocation the cache refuses stops the call there.
pub fn allocate_inputs<'a, C: StepCache, I: Items + ?Sized>(
    cache: &mut C,
    request_id: impl Into<KeyArg<'a>>,
    items: &I,
    input_ids: &[usize],
    repeated: &[usize],
) -> Result<(), StepError> {
    let request_id = request_id.into();
    let (to_allocate, to_hit) = (records(items, input_ids)?, records(items, repeated)?);
    for (&input_id, item) in input_ids.iter().zip(to_allocate) {
        cache.allocate(request_id, input_id, item)?;
    }
    for (&input_id, item) in repeated.iter().zip(to_hit) {
        cache.check_and_update_cache(request_id, input_id, item)?;
    }
    Ok(())
}

/// The held inputs [`free_inputs_before`] frees, ascending: those whose
/// placeholder ends at or before `position`, or with encoder-decoder rules all
/// of them once `decoder_started` (the request has computed a token).
pub fn inputs_to_free<'a, C: StepCache, I: Items + ?Sized>(
    cache: &C,
    request_id: impl Into<KeyArg<'a>>,
    items: &I,
    position: i64,
    decoder_started: bool,
) -> Result<Vec<usize>, StepError> {
    let request_id = request_id.into();
    let all = C::ENCODER_DECODER && decoder_started;
    let num_items = items.num_items();
    let mut done = Vec::new();
    for input_id in cache.held_inputs(request_id, num_items) {
        if input_id >= num_items {
            return Err(StepError::InputOutOfRange { input_id, num_items });
        }
        if all {
            done.push(input_id);
            continue;
        }
        let (offset, length) = items.position(input_id).ok_or(StepError::NotRead { input_id })?;
        if i128::from(offset) + i128::from(length) <= i128::from(position) {
            done.push(input_id);
        }
    }
    done.sort_unstable();
    Ok(done)
}

/// vLLM's `_free_encoder_inputs`: free [`inputs_to_free`] and return them.
pub fn free_inputs_before<'a, C: StepCache, I: Items + ?Sized>(
    cache: &mut C,
    request_id: impl Into<KeyArg<'a>>,
    items: &I,
    position: i64,
    decoder_started: bool,
) -> Result<Vec<usize>, StepError> {
    let request_id = request_id.into();
    let done = inputs_to_free(cache, request_id, items, position, decoder_started)?;
    cache.free_inputs(request_id, items, &done)?;
    Ok(done)
}

#[cfg(test)]
#[path = "step_tests.rs"]
mod tests;
