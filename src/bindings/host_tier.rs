//! `HostBlockCache` and `HostCacheEntry`: vLLM 0.33's `EmbeddingCache` API
//! over [`HostBlockCache`], the host tier's block cache.
//!
//! Each entry's Python object is made once, when the entry is allocated, and
//! kept as the core entry's payload: `get` returns the same object every time,
//! and its `ready` and `evictable` follow the entry's state as vLLM's do (an
//! object whose entry was evicted or discarded keeps its last state).

use std::sync::atomic::{AtomicI64, Ordering};

use pyo3::exceptions::{PyKeyError, PyMemoryError, PyTypeError, PyValueError};
use pyo3::prelude::*;
use pyo3::types::{PyBool, PyDict, PyInt, PyList, PyTuple};

use crate::host_tier::{AllocError, HostBlockCache, HostCacheError, HostEntry, HostPolicy};

pyo3::import_exception!(encoder_cache.invariants, InvariantError);

impl From<HostCacheError> for PyErr {
    fn from(err: HostCacheError) -> PyErr {
        match err {
            // As a dict lookup reports a missing key: the key itself.
            HostCacheError::UnknownKey { key } => PyKeyError::new_err(key),
            _ => PyValueError::new_err(err.to_string()),
        }
    }
}

/// A non-negative int argument; TypeError or ValueError naming it otherwise.
fn non_negative(value: &Bound<'_, PyAny>, what: &str) -> PyResult<u64> {
    if value.is_instance_of::<PyBool>() || !value.is_instance_of::<PyInt>() {
        return Err(PyTypeError::new_err(format!("{what} must be int, not {}", value.get_type().name()?)));
    }
    match value.extract::<i64>() {
        Ok(n) => u64::try_from(n).map_err(|_| PyValueError::new_err(format!("{what} must be >= 0, got {n}"))),
        Err(_) => Err(PyValueError::new_err(format!("{what} is out of range, got {value}"))),
    }
}

/// One entry of a `HostBlockCache`: the blocks holding an item's encoder
/// output in the host region. `block_ids` (ascending) and `shape` are fixed;
/// `ready` and `evictable` follow the entry's state.
#[pyclass(module = "encoder_cache._core", name = "HostCacheEntry", frozen)]
pub struct PyHostCacheEntry {
    block_ids: Py<PyTuple>,
    shape: Py<PyAny>,
    /// -1 while not ready, then the pins held.
    pins: AtomicI64,
}

#[pymethods]
impl PyHostCacheEntry {
    /// The entry's blocks in the host region, ascending.
    #[getter]
    fn block_ids(&self, py: Python<'_>) -> Py<PyTuple> {
        self.block_ids.clone_ref(py)
    }

    /// The encoder output's (rows, width), as given to `alloc`, or None.
    #[getter]
    fn shape(&self, py: Python<'_>) -> Py<PyAny> {
        self.shape.clone_ref(py)
    }

    /// Whether the entry's bytes are written (`mark_ready` was called).
    #[getter]
    fn ready(&self) -> bool {
        self.pins.load(Ordering::Relaxed) >= 0
    }

    /// Whether the entry is ready and unpinned, so an allocation may evict it.
    #[getter]
    fn evictable(&self) -> bool {
        self.pins.load(Ordering::Relaxed) == 0
    }

    fn __repr__(&self, py: Python<'_>) -> PyResult<String> {
        let blocks = self.block_ids.bind(py).len();
        let shape = self.shape.bind(py).repr()?;
        let state = match self.pins.load(Ordering::Relaxed) {
            -1 => "not ready".to_owned(),
            0 => "ready".to_owned(),
            n => format!("pinned x{n}"),
        };
        Ok(format!("HostCacheEntry({blocks} blocks, shape={shape}, {state})"))
    }
}

type Entry = Py<PyHostCacheEntry>;

/// The entry object of `entry`, its state brought up to date.
fn synced(py: Python<'_>, entry: &HostEntry<'_, Entry>) -> Entry {
    entry.payload.get().pins.store(entry.pins, Ordering::Relaxed);
    entry.payload.clone_ref(py)
}

/// A fixed pool of host-memory blocks holding encoder outputs by content hash,
/// with vLLM 0.33's `EmbeddingCache` API. An entry is allocated not ready,
/// becomes ready (and evictable) with `mark_ready`, and is pinned while loads
/// read it; an allocation that lacks free blocks evicts ready, unpinned entries
/// in the `policy`'s order ("fifo", the default, is vLLM's), and fails,
/// evicting nothing, when even all of those would not make room.
#[pyclass(module = "encoder_cache._core", name = "HostBlockCache")]
pub struct PyHostBlockCache {
    cache: HostBlockCache<Entry>,
}

#[pymethods]
impl PyHostBlockCache {
    #[new]
    #[pyo3(signature = (num_blocks, *, policy = "fifo"))]
    fn new(num_blocks: &Bound<'_, PyAny>, policy: &str) -> PyResult<Self> {
        let n = non_negative(num_blocks, "num_blocks")?;
        let policy = HostPolicy::from_name(policy)
            .ok_or_else(|| PyValueError::new_err(format!("policy must be one of {}, got {policy:?}", HostPolicy::NAMES.join(", "))))?;
        if n > u64::from(u32::MAX) {
            return Err(PyValueError::new_err(format!("num_blocks must be < 2**32, got {n}")));
        }
        let n = usize::try_from(n).map_err(|_| PyValueError::new_err(format!("num_blocks {n} does not fit this platform")))?;
        let cache = HostBlockCache::try_new(n, policy)
            .ok_or_else(|| PyMemoryError::new_err(format!("no memory for the free list of {n} blocks")))?;
        Ok(Self { cache })
    }

    /// The eviction policy's name, one of `encoder_cache.HOST_POLICIES`.
    #[getter]
    fn policy(&self) -> &'static str {
        self.cache.policy().name()
    }

    /// The number of blocks in the pool.
    #[getter]
    fn num_blocks(&self) -> usize {
        self.cache.num_blocks()
    }

    /// Return the entry for `key` (in any state), or None if there is none.
    fn get(&self, py: Python<'_>, key: &str) -> Option<Entry> {
        self.cache.entry(key).map(|entry| synced(py, &entry))
    }

    /// Return True if any entry is not ready or pinned (a save or a load in flight).
    fn has_held_entries(&self) -> bool {
        self.cache.has_held_entries()
    }

    /// Allocate `n_blocks` blocks for `key`, evicting as needed, and return its
    /// new entry, not ready; `shape` is the encoder output (rows, width) the
    /// blocks will hold. Return None, evicting nothing, if the free and
    /// evictable blocks together are too few.
    ///
    /// Raises ValueError, changing nothing, if `key` has an entry already or
    /// `n_blocks` exceeds the pool, and TypeError or ValueError for an
    /// `n_blocks` that is not a non-negative int or a `shape` that is not None
    /// or a tuple of two non-negative ints.
    #[pyo3(signature = (key, n_blocks, shape = None))]
    fn alloc(
        &mut self,
        py: Python<'_>,
        key: &str,
        n_blocks: &Bound<'_, PyAny>,
        shape: Option<&Bound<'_, PyAny>>,
    ) -> PyResult<Option<Entry>> {
        let n = non_negative(n_blocks, "n_blocks")?;
        let n = usize::try_from(n).unwrap_or(usize::MAX);
        let (shape, rows) = match shape {
            None => (py.None(), n as u64),
            Some(shape) => {
                let rows = shape_rows(shape)?;
                (shape.clone().unbind(), rows)
            }
        };
        let made = self.cache.alloc(key, n, rows, |blocks| -> PyResult<Entry> {
            let block_ids = PyTuple::new(py, blocks)?.unbind();
            Py::new(py, PyHostCacheEntry { block_ids, shape, pins: AtomicI64::new(-1) })
        });
        match made {
            Ok(entry) => Ok(entry.map(|entry| synced(py, &entry))),
            Err(AllocError::Refused(err)) => Err(err.into()),
            Err(AllocError::Payload(err)) => Err(err),
        }
    }

    /// Mark `key`'s entry ready: its bytes are written, and it becomes evictable.
    ///
    /// Raises KeyError if `key` has no entry, ValueError if it is ready already.
    fn mark_ready(&mut self, py: Python<'_>, key: &str) -> PyResult<()> {
        synced(py, &self.cache.mark_ready(key)?);
        Ok(())
    }

    /// Pin `key`'s ready entry: a load reads it, so it cannot be evicted until
    /// the matching `unpin`.
    ///
    /// Raises KeyError if `key` has no entry, ValueError if it is not ready.
    fn pin(&mut self, py: Python<'_>, key: &str) -> PyResult<()> {
        synced(py, &self.cache.pin(key)?);
        Ok(())
    }

    /// Pin `key` if its entry is ready, and return the entry; return a
    /// not-ready entry without pinning it, and None if `key` has no entry.
    fn pin_if_ready(&mut self, py: Python<'_>, key: &str) -> Option<Entry> {
        self.cache.pin_if_ready(key).map(|entry| synced(py, &entry))
    }

    /// Release one pin of `key`'s entry; with none left it becomes evictable.
    ///
    /// Raises KeyError if `key` has no entry, ValueError if it is not pinned.
    fn unpin(&mut self, py: Python<'_>, key: &str) -> PyResult<()> {
        synced(py, &self.cache.unpin(key)?);
        Ok(())
    }

    /// Drop `key`'s not-ready entry (its write failed); its blocks go back to
    /// the pool.
    ///
    /// Raises KeyError if `key` has no entry, ValueError if it is ready or
    /// pinned (those leave by eviction).
    fn discard(&mut self, key: &str) -> PyResult<()> {
        Ok(self.cache.discard(key)?)
    }

    /// The free blocks, in the order they are pushed back (the last is handed
    /// out first). A fresh list.
    #[getter]
    fn free_blocks<'py>(&self, py: Python<'py>) -> PyResult<Bound<'py, PyList>> {
        PyList::new(py, self.cache.free_blocks())
    }

    /// The blocks that evictions could free now (those of ready, unpinned entries).
    #[getter]
    fn evictable_blocks(&self) -> usize {
        self.cache.evictable_blocks()
    }

    /// Return the keys of the evictable entries in the order the policy looks
    /// at them: for "fifo" the eviction order; for "s3fifo" the never-loaded
    /// lane, then the loaded one (whose entries may go round before leaving);
    /// for "gdsf" by priority.
    fn eviction_order<'py>(&self, py: Python<'py>) -> PyResult<Bound<'py, PyList>> {
        PyList::new(py, self.cache.eviction_order())
    }

    /// Return the keys of every entry, in no particular order.
    fn keys<'py>(&self, py: Python<'py>) -> PyResult<Bound<'py, PyList>> {
        PyList::new(py, self.cache.entries().map(|entry| entry.key))
    }

    /// Return the counters since construction: `allocs`, `alloc_failures`
    /// (allocations refused for want of space), `pins`, `evictions`,
    /// `evicted_blocks`, `discards`; and the fill: `entries`, `free_blocks`,
    /// `evictable_blocks`.
    fn stats<'py>(&self, py: Python<'py>) -> PyResult<Bound<'py, PyDict>> {
        let stats = self.cache.stats();
        let dict = PyDict::new(py);
        for (name, n) in [
            ("allocs", stats.allocs),
            ("alloc_failures", stats.alloc_failures),
            ("pins", stats.pins),
            ("evictions", stats.evictions),
            ("evicted_blocks", stats.evicted_blocks),
            ("discards", stats.discards),
        ] {
            dict.set_item(name, n)?;
        }
        dict.set_item("entries", self.cache.len())?;
        dict.set_item("free_blocks", self.cache.free_blocks().len())?;
        dict.set_item("evictable_blocks", self.cache.evictable_blocks())?;
        Ok(dict)
    }

    /// Check the bookkeeping's rules (every block free or held by exactly one
    /// entry, the evictable counts, the eviction order); raise
    /// `encoder_cache.InvariantError` naming the first one broken.
    fn check_invariants(&self) -> PyResult<()> {
        self.cache.check_invariants().map_err(InvariantError::new_err)
    }

    fn __len__(&self) -> usize {
        self.cache.len()
    }

    fn __contains__(&self, key: &str) -> bool {
        self.cache.entry(key).is_some()
    }

    fn __repr__(&self) -> String {
        format!(
            "HostBlockCache({} blocks, policy={:?}, {} entries, {} free, {} evictable)",
            self.cache.num_blocks(),
            self.cache.policy().name(),
            self.cache.len(),
            self.cache.free_blocks().len(),
            self.cache.evictable_blocks()
        )
    }
}

/// The rows of an encoder-output `shape`: a tuple of two non-negative ints.
fn shape_rows(shape: &Bound<'_, PyAny>) -> PyResult<u64> {
    let bad = || PyValueError::new_err(format!("shape must be None or a tuple (rows, width) of ints >= 0, got {shape}"));
    let tuple = shape.cast::<PyTuple>().map_err(|_| bad())?;
    if tuple.len() != 2 {
        return Err(bad());
    }
    let rows = non_negative(&tuple.get_item(0)?, "shape[0]").map_err(|_| bad())?;
    non_negative(&tuple.get_item(1)?, "shape[1]").map_err(|_| bad())?;
    Ok(rows)
}

/// The policies' names, the default first.
pub(crate) fn policy_names() -> &'static [&'static str] {
    HostPolicy::NAMES
}
