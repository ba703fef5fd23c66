//! The PyO3 layer: `encoder_cache._core`. Everything here adapts Python objects
//! to the pure-Rust core; no bookkeeping decisions are made in this module.

mod cell;
mod encoder_decoder;
mod fast;
mod floor;
mod manager;
mod records;
mod request;
mod state;
mod step;

use pyo3::prelude::*;
use pyo3::types::PyList;

use crate::cache::Key;

/// Identifiers as a Python list of str, in the given order.
pub(crate) fn key_list<'py>(py: Python<'py>, keys: &[Key]) -> PyResult<Bound<'py, PyList>> {
    PyList::new(py, keys.iter().map(|k| &**k))
}

/// Test hook, private: panics on purpose, so a test can prove that a Rust
/// panic surfaces as a Python exception (pyo3's PanicException, the release
/// profile keeps panic = "unwind") instead of aborting the interpreter.
#[pyfunction]
fn _panic_for_test() {
    panic!("deliberate panic from encoder_cache._core._panic_for_test");
}

// gil_used: the managers rely on the GIL to serialise callers (PyO3's borrow
// flag turns a contended call into RuntimeError); a free-threaded interpreter
// re-enables the GIL on import rather than run them unserialised.
#[pymodule(gil_used = true)]
fn _core(m: &Bound<'_, PyModule>) -> PyResult<()> {
    m.add_class::<manager::PyEncoderCacheManager>()?;
    manager::install_fast_methods(&m.py().get_type::<manager::PyEncoderCacheManager>())?;
    m.add_class::<encoder_decoder::PyEncoderDecoderCacheManager>()?;
    m.add_class::<floor::CallFloor>()?;
    floor::install_fast_methods(&m.py().get_type::<floor::CallFloor>())?;
    m.add_function(wrap_pyfunction!(_panic_for_test, m)?)?;
    Ok(())
}
