//! The PyO3 layer: `encoder_cache._core`. Everything here adapts Python objects
//! to the pure-Rust core; no bookkeeping decisions are made in this module.
//!
//! Modules, each using only those listed before it:
//! - `errors`: core errors as Python exceptions;
//! - `modality`: modality names as the core's tags;
//! - `known_types`: vLLM's and our request and placeholder classes, recognised;
//! - `request`: reading vLLM-shaped requests (and `is_embed` masks), with clear errors;
//! - `state`: state dumps as plain Python data and back;
//! - `events`: the core's cache events as Python data, and `EventBatch`;
//! - `records`: what a manager has read of each request object, with the core's handles;
//! - `step_hook`: a Python callable run at the end of each step, when due;
//! - `shared`: a manager's state and how it is borrowed;
//! - `calls`, `step`: the per-call and the step-level methods' reads;
//! - `methods`: the methods both manager classes share, written once;
//! - `manager`, `encoder_decoder`: the two manager classes;
//! - `hooks` (cargo feature `test-hooks`, off in the release wheel): `_CallFloor`
//!   and `_panic_for_test`, for benchmarks and tests;
//! - `host_tier`: the host tier's block cache (uses none of the above).

/// Every Rust allocation of the extension (keys, records, the core's tables)
/// goes to mimalloc: small blocks allocated and freed by the thousand each
/// step cost fewer instructions there than in glibc's malloc.
#[global_allocator]
static ALLOCATOR: mimalloc::MiMalloc = mimalloc::MiMalloc;

mod calls;
mod encoder_decoder;
mod errors;
mod events;
#[cfg(feature = "test-hooks")]
mod hooks;
mod host_tier;
mod known_types;
mod manager;
mod methods;
mod modality;
mod records;
mod request;
mod shared;
mod state;
mod step;
mod step_hook;

use pyo3::prelude::*;
use pyo3::types::{PyList, PyTuple};

use crate::cache::Key;

/// Identifiers as a Python list of str, in the given order.
pub(crate) fn key_list<'py>(py: Python<'py>, keys: &[Key]) -> PyResult<Bound<'py, PyList>> {
    PyList::new(py, keys.iter().map(|k| &**k))
}

// gil_used: the managers rely on the GIL to serialise their callers.
#[pymodule(gil_used = true)]
fn _core(m: &Bound<'_, PyModule>) -> PyResult<()> {
    m.add_class::<manager::PyEncoderCacheManager>()?;
    m.add_class::<encoder_decoder::PyEncoderDecoderCacheManager>()?;
    m.add_class::<events::PyEventBatch>()?;
    m.add_class::<host_tier::PyHostBlockCache>()?;
    m.add_class::<host_tier::PyHostCacheEntry>()?;
    m.add("HOST_POLICIES", PyTuple::new(m.py(), host_tier::policy_names())?)?;
    #[cfg(feature = "test-hooks")]
    hooks::add(m)?;
    m.add("POLICIES", PyTuple::new(m.py(), crate::cache::Policy::NAMES)?)?;
    Ok(())
}
