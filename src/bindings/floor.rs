//! `_CallFloor`: a benchmark aid, not part of the API. Its methods have the
//! manager's names and argument lists and do nothing, so timing them gives the
//! cost of crossing from Python into a PyO3 method at all: the floor under
//! which no manager call can go. Driven through a whole request's calls, it
//! bounds what any per-call manager can gain over the pure-Python one.

use pyo3::prelude::*;

#[pyclass(module = "encoder_cache._core", name = "_CallFloor", frozen)]
pub struct CallFloor;

#[pymethods]
impl CallFloor {
    #[new]
    fn new() -> Self {
        Self
    }

    fn check_and_update_cache(&self, request: &Bound<'_, PyAny>, input_id: i64) -> bool {
        let _ = (request, input_id);
        false
    }

    fn can_allocate(
        &self,
        request: &Bound<'_, PyAny>,
        input_id: i64,
        encoder_compute_budget: i64,
        num_embeds_to_schedule: i64,
    ) -> bool {
        let _ = (request, input_id, encoder_compute_budget, num_embeds_to_schedule);
        false
    }

    fn get_cached_num_encoder_embeds(&self, request: &Bound<'_, PyAny>, input_id: i64) -> Option<u64> {
        let _ = (request, input_id);
        None
    }

    fn get_cached_input_ids(&self, request: &Bound<'_, PyAny>) {
        let _ = request;
    }

    fn allocate(&self, request: &Bound<'_, PyAny>, input_id: i64) {
        let _ = (request, input_id);
    }

    fn free_encoder_input(&self, request: &Bound<'_, PyAny>, input_id: i64) {
        let _ = (request, input_id);
    }

    fn free(&self, request: &Bound<'_, PyAny>) {
        let _ = request;
    }
}
