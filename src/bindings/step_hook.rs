//! [`StepHook`]: a Python callable that a manager runs at the end of
//! `get_freed_mm_hashes()`, which vLLM's scheduler calls once per step. The
//! hook returns how many seconds it can wait before it runs again, and until
//! then a step pays for one clock read instead of a call into Python. What
//! reports once per step (the log line, the Prometheus metrics, a per-step
//! event publisher) is set here by `encoder_cache.observed`.

use std::time::{Duration, Instant};

use pyo3::exceptions::{PyException, PyTypeError, PyValueError};
use pyo3::gc::{PyTraverseError, PyVisit};
use pyo3::prelude::*;
use pyo3::types::{PyBool, PyFloat, PyInt};

pub(crate) struct StepHook {
    hook: Py<PyAny>,
    /// When the hook runs next: `None` for the next step.
    due: Option<Instant>,
    /// The hook is running: a `get_freed_mm_hashes()` it makes does not run it again.
    running: bool,
}

impl StepHook {
    pub(crate) fn new(hook: &Bound<'_, PyAny>) -> PyResult<Self> {
        if !hook.is_callable() {
            return Err(PyTypeError::new_err(format!("hook must be callable, not {}", super::request::type_name(hook))));
        }
        Ok(Self { hook: hook.clone().unbind(), due: None, running: false })
    }

    /// The hook, if it is due at this step; it is then running until [`Self::ran`].
    #[inline]
    pub(crate) fn take_due(&mut self, py: Python<'_>) -> Option<Py<PyAny>> {
        if self.running || self.due.is_some_and(|due| Instant::now() < due) {
            return None;
        }
        self.running = true;
        Some(self.hook.clone_ref(py))
    }

    /// After `hook` ran: it runs next `wait` from now (`None`: at the next step).
    pub(crate) fn ran(&mut self, hook: &Py<PyAny>, wait: Option<Duration>) {
        if self.hook.is(hook) {
            self.running = false;
            self.due = wait.map(|wait| Instant::now() + wait);
        }
    }

    pub(crate) fn traverse(&self, visit: &PyVisit<'_>) -> Result<(), PyTraverseError> {
        visit.call(&self.hook)
    }
}

/// Runs a due `hook` with `manager`; returns how long it can wait before it
/// runs again (`None`: the next step). The step's freed identifiers must
/// reach the workers whatever the hook does, so an ordinary exception it
/// raises, or a wait that is not a number of seconds, is reported through
/// `sys.unraisablehook` rather than raised, and the hook runs again at the
/// next step; anything else (KeyboardInterrupt, SystemExit) goes through.
pub(crate) fn run(hook: &Py<PyAny>, manager: &Bound<'_, PyAny>) -> PyResult<Option<Duration>> {
    let py = manager.py();
    let wait = hook.bind(py).call1((manager,)).and_then(|wait| wait_of(&wait));
    match wait {
        Ok(wait) => Ok(wait),
        Err(err) if err.is_instance_of::<PyException>(py) => {
            err.write_unraisable(py, Some(hook.bind(py)));
            Ok(None)
        }
        Err(err) => Err(err),
    }
}

/// What a hook returned as a wait: None, or an int or float of seconds, finite and >= 0.
fn wait_of(wait: &Bound<'_, PyAny>) -> PyResult<Option<Duration>> {
    if wait.is_none() {
        return Ok(None);
    }
    let number = wait.is_instance_of::<PyFloat>() || (wait.is_instance_of::<PyInt>() && !wait.is_instance_of::<PyBool>());
    let seconds = if number { wait.extract::<f64>().ok() } else { None };
    match seconds.and_then(|seconds| Duration::try_from_secs_f64(seconds).ok()) {
        Some(wait) => Ok(Some(wait)),
        None => Err(PyValueError::new_err(format!("a step hook returns seconds >= 0 or None, got {}", wait.repr()?))),
    }
}
