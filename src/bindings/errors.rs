//! The one place where the core's errors become Python exceptions.

use pyo3::exceptions::{PyIndexError, PyRuntimeError, PyValueError};
use pyo3::prelude::*;

use crate::cache::{CacheError, InvariantViolation};
use crate::step::StepError;

pyo3::import_exception!(encoder_cache.invariants, InvariantError);

/// A refused operation: the caller's request does not fit the cache's state.
impl From<CacheError> for PyErr {
    fn from(err: CacheError) -> PyErr {
        PyValueError::new_err(err.to_string())
    }
}

impl From<StepError> for PyErr {
    fn from(err: StepError) -> PyErr {
        match err {
            StepError::EmbedRange { .. } | StepError::InputOutOfRange { .. } => PyIndexError::new_err(err.to_string()),
            StepError::EncoderDecoderOffset { .. } | StepError::Cache(_) => PyValueError::new_err(err.to_string()),
            StepError::NotRead { .. } => PyRuntimeError::new_err(err.to_string()),
        }
    }
}

/// `check_invariants()`'s error: `encoder_cache.InvariantError` naming the rule.
pub(crate) fn invariant_error(violation: &InvariantViolation) -> PyErr {
    InvariantError::new_err(violation.to_string())
}

/// `restore()`'s error for a dump that breaks a rule.
pub(crate) fn inconsistent_state(violation: &InvariantViolation) -> PyErr {
    PyValueError::new_err(format!("inconsistent state: {violation}"))
}
