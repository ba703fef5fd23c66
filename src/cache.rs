//! The encoder-cache bookkeeping: which items are cached, who references them,
//! what may be evicted, and which evictions the workers still have to hear about.
//!
//! Pure Rust, no Python types: a Rust scheduler can use it directly, and the
//! PyO3 layer in `bindings` is a thin adapter over it.
//!
//! By concept:
//! - `keys`: names ([`Key`], [`KeyArg`]), their 64-bit hash, and [`Handle`]s;
//! - `table`: the slab tables entries and requests live in, found by name;
//! - `entries`: a cached item and the requests referencing it;
//! - `requests`: what a request holds, input by input;
//! - `lanes`, `policies`, `arc`, `duel`: the eviction order, one type per
//!   [`Policy`]; `shadows`: the shadow caches `duel` chooses by;
//! - `stats`: counters and the ghosts of evicted items;
//! - `core`: [`PolicyCache`], the operations under one policy;
//! - `dispatch`: [`EncoderCache`], the policy chosen at run time;
//! - `events`: the optional event log of what was stored, dropped and cleared;
//! - `state`: the state as plain data, its invariants, and restoring it;
//! - `errors`: why an operation is refused.
//!
//! Which unreferenced entry goes first is the policy's choice (vLLM's release
//! order by default), with entries that a waiting request will need
//! (`mark_waiting`) kept until the others are gone. The cache can be resized,
//! and counts hits, misses, evictions and re-encodes (`stats`).
//! docs/policies.md describes the policies and what they save.

mod arc;
mod core;
mod dispatch;
mod duel;
mod entries;
mod errors;
mod events;
mod frequency_memory;
mod ghosts;
mod keys;
mod lanes;
mod policies;
#[cfg(test)]
mod policy_tests;
mod requests;
mod shadows;
pub mod state;
mod stats;
mod table;
#[cfg(test)]
mod tests;

pub(crate) use self::core::shrink_when_sparse;
pub use self::core::PolicyCache;
pub use arc::{Arc, ArcMeta, ARC_GHOST_ITEMS};
pub use dispatch::{with_policy_cache, EncoderCache};
pub use duel::Duel;
pub use entries::Entry;
pub use errors::CacheError;
pub use events::{StepEvents, DEFAULT_MAX_PENDING};
pub use frequency_memory::{frequency_memory_bound, FREQUENCY_MEMORY, FREQUENCY_MEMORY_EMBEDS, FREQUENCY_MEMORY_MAX};
pub use keys::{hash_key, Handle, Holding, Key, KeyArg};
pub use policies::{EvictionPolicy, Gdsf, GdsfMeta, GhostLfu, Policy, S3Fifo, S3FifoMeta, Vllm, GDSF_COST_SCALE, S3FIFO_MAX_CREDIT};
pub use requests::HeldInputs;
pub use shadows::{SHADOW_HALF_LIFE, SHADOW_NEAR_TIE};
pub use state::{CacheState, EntryPolicyState, EntryState, InvariantViolation, PolicyState, RequestState};
pub use stats::{CacheStats, Counters, EVICTED_MEMORY};
