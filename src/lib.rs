//! Encoder-cache bookkeeping for multimodal LLM schedulers.
//!
//! - [`cache`]: the shared encoder cache (vLLM's `EncoderCacheManager`), with its
//!   eviction policies, waiting marks and statistics.
//! - [`encoder_decoder`]: the scheduling-only variant for encoder-decoder models.
//! - [`step`]: a scheduler step for one request (vLLM's per-item loop) in one call.
//! - [`event_wire`]: a drain of the cache's event log as an event message's msgpack payload.
//! - [`host_tier`]: the block cache of the host-memory tier (vLLM's `ECCPUConnector`).
//! - `bindings` (feature `python`): the PyO3 layer behind `encoder_cache._core`.

pub mod cache;
pub mod encoder_decoder;
pub mod event_wire;
pub mod host_tier;
pub mod step;

#[cfg(feature = "python")]
mod bindings;
#[cfg(test)]
mod test_rng;

pub use cache::{
    CacheError, CacheState, CacheStats, Counters, EncoderCache, Entry, EntryPolicyState, EntryState, EvictionPolicy, Handle, HeldInputs,
    InvariantViolation, Key, KeyArg, Policy, PolicyCache, PolicyState, RequestState, EVICTED_MEMORY, GDSF_COST_SCALE, S3FIFO_MAX_CREDIT,
};
pub use encoder_decoder::{EncoderDecoderCache, EncoderDecoderState};
pub use step::{Item, Mismatch, Scheduled, StepArgs, StepCache, StepError};
