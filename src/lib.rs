//! Encoder-cache bookkeeping for multimodal LLM schedulers.
//!
//! - [`cache`]: the shared encoder cache (vLLM's `EncoderCacheManager`).
//! - [`encoder_decoder`]: the scheduling-only variant for encoder-decoder models.
//! - `bindings` (feature `python`): the PyO3 layer behind `encoder_cache._core`.

pub mod cache;
pub mod encoder_decoder;

#[cfg(feature = "python")]
mod bindings;

pub use cache::{CacheError, EncoderCache, Entry, Key, Referrers, RequestRefs};
pub use encoder_decoder::EncoderDecoderCache;
