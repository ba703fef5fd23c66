//! The host-memory tier: bookkeeping for encoder outputs offloaded to host
//! memory (the shared region of vLLM 0.33's `ECCPUConnector`).
//!
//! The region is a fixed pool of equal-sized blocks; each cached item (by
//! content hash) owns some of them. An entry is *not ready* while its bytes
//! are being written, *ready* once they are, and *pinned* while loads read it;
//! only ready, unpinned entries can be evicted, and only when an allocation
//! needs their blocks.
//!
//! - [`block_cache`]: [`HostBlockCache`], the blocks, the entries and their states;
//! - [`order`]: [`HostPolicy`] and the order evictable entries leave in.
//!
//! With [`HostPolicy::Fifo`] every decision (which allocation fails, which
//! blocks an entry gets, which entries are evicted, the order of the free
//! blocks) is vLLM 0.33's `EmbeddingCache`'s. docs/vllm.md describes the
//! policies and how the connector uses this cache.

pub mod block_cache;
pub mod order;
#[cfg(test)]
mod tests;

pub use block_cache::{AllocError, HostBlockCache, HostCacheError, HostEntry, HostStats};
pub use order::{HostPolicy, HOST_GDSF_COST_SCALE, HOST_S3FIFO_MAX_CREDIT};
