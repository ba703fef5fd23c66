//! The PyO3 layer: `encoder_cache._core`. Everything here adapts Python objects
//! to the pure-Rust core; no bookkeeping decisions are made in this module.

mod encoder_decoder;
mod manager;
mod request;
mod step;

use pyo3::prelude::*;

#[pymodule]
fn _core(m: &Bound<'_, PyModule>) -> PyResult<()> {
    m.add_class::<manager::PyEncoderCacheManager>()?;
    m.add_class::<encoder_decoder::PyEncoderDecoderCacheManager>()?;
    Ok(())
}
