//! Hooks for benchmarks and tests, built only with the cargo feature
//! `test-hooks` (`make build` turns it on; the release wheel does not):
//!
//! - `_panic_for_test()` panics on purpose, so a test can prove that a Rust
//!   panic surfaces as a Python exception (pyo3's PanicException, the release
//!   profile keeps panic = "unwind") instead of aborting the interpreter;
//! - `_CallFloor`, a benchmark aid. Its methods have the manager's names and
//!   argument lists and change nothing, so timing them shows what a manager
//!   call costs before the manager does any work.
//!
//! `_CallFloor` comes in two forms:
//! - `_CallFloor()`: the methods do nothing; the cost of crossing from Python
//!   into a PyO3 method at all;
//! - `_CallFloor(reads=True)`: each method also reads from the request what
//!   vLLM's manager reads on every call (`request_id`,
//!   `mm_features[i].identifier`, `get_num_encoder_embeds(i)`). The
//!   pure-Python manager pays these on every call, so they bound what a
//!   manager that reads as vLLM's does can gain over it; the Rust manager
//!   reads them once per request and per item (see `records`), and so can
//!   come in under them.

use pyo3::prelude::*;

use super::request::{identifier, input_index, num_embeds, request_id};

#[pyclass(module = "encoder_cache._core", name = "_CallFloor", frozen)]
pub struct CallFloor {
    reads: bool,
}

#[pymethods]
impl CallFloor {
    #[new]
    #[pyo3(signature = (*, reads=false))]
    fn new(reads: bool) -> Self {
        Self { reads }
    }

    fn check_and_update_cache(&self, request: &Bound<'_, PyAny>, input_id: i64) -> PyResult<bool> {
        if self.reads {
            identifier(request, input_index(input_id)?)?;
            request_id(request)?;
        }
        Ok(false)
    }

    fn can_allocate(
        &self,
        request: &Bound<'_, PyAny>,
        input_id: i64,
        encoder_compute_budget: i64,
        num_embeds_to_schedule: i64,
    ) -> PyResult<bool> {
        let _ = (encoder_compute_budget, num_embeds_to_schedule);
        if self.reads {
            num_embeds(request, input_index(input_id)?)?;
        }
        Ok(false)
    }

    fn get_cached_num_encoder_embeds(&self, request: &Bound<'_, PyAny>, input_id: i64) -> PyResult<Option<u64>> {
        if self.reads {
            identifier(request, input_index(input_id)?)?;
        }
        Ok(None)
    }

    fn get_cached_input_ids(&self, request: &Bound<'_, PyAny>) -> PyResult<()> {
        self.free(request)
    }

    fn allocate(&self, request: &Bound<'_, PyAny>, input_id: i64) -> PyResult<()> {
        if self.reads {
            let input_id = input_index(input_id)?;
            identifier(request, input_id)?;
            request_id(request)?;
            num_embeds(request, input_id)?;
        }
        Ok(())
    }

    fn free_encoder_input(&self, request: &Bound<'_, PyAny>, input_id: i64) -> PyResult<()> {
        input_index(input_id)?;
        self.free(request)
    }

    /// Reads `request_id` only, like `free`, `free_encoder_input` and `get_cached_input_ids`.
    fn free(&self, request: &Bound<'_, PyAny>) -> PyResult<()> {
        if self.reads {
            request_id(request)?;
        }
        Ok(())
    }
}

#[pyfunction]
fn _panic_for_test() {
    panic!("deliberate panic from encoder_cache._core._panic_for_test");
}

/// Adds the hooks to the module.
pub(crate) fn add(m: &Bound<'_, PyModule>) -> PyResult<()> {
    m.add_class::<CallFloor>()?;
    m.add_function(wrap_pyfunction!(_panic_for_test, m)?)
}
