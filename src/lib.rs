//! Encoder-cache bookkeeping for multimodal LLM schedulers.
//!
//! - [`cache`]: the shared encoder cache (vLLM's `EncoderCacheManager`).
//! - [`encoder_decoder`]: the scheduling-only variant for encoder-decoder models.
//! - [`step`]: a scheduler step for one request (vLLM's per-item loop) in one call.
//! - `bindings` (feature `python`): the PyO3 layer behind `encoder_cache._core`.

pub mod cache;
pub mod encoder_decoder;
pub mod step;

#[cfg(feature = "python")]
mod bindings;

pub use cache::{
    CacheError, CacheState, EncoderCache, Entry, EntryState, HeldInputs, InvariantViolation, Key, KeyArg, Referrers, RequestRefs,
    RequestState,
};
pub use encoder_decoder::{EncoderDecoderCache, EncoderDecoderState};
pub use step::{Item, Mismatch, Scheduled, StepArgs, StepCache, StepError};
