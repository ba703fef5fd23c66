//! Fast entries for the per-item methods vLLM's scheduler calls.
//!
//! PyO3's generated method parses its arguments generically (keywords,
//! defaults, conversions) and enters through a trampoline that keeps the
//! thread's attach count in a thread-local. For a call whose work takes under
//! 100 ns that is about 12 ns more (callgrind: 100 to 150 instructions). The
//! scheduler calls these methods once per item per step, positionally, with
//! plain ints, so each gets a `METH_FASTCALL` entry that takes that shape
//! itself and passes any other (keywords, another argument count, a
//! non-`int` or out-of-range number) to PyO3's own method, kept aside: every
//! error and conversion stays PyO3's, and both paths run the same Rust
//! function. The entry keeps the method's name, docstring and signature.
//!
//! An entry does not raise PyO3's attach count, so PyO3 would release a `Py`
//! dropped inside one only at its next entry. The records, which drop the
//! references they hold to requests and items, release them at once (see
//! `Held` in `records`); only a stray value, such as an exception a read
//! swallowed, waits for PyO3.

use std::panic::{catch_unwind, AssertUnwindSafe};
use std::ptr::null_mut;

use pyo3::exceptions::PyTypeError;
use pyo3::ffi;
use pyo3::panic::PanicException;
use pyo3::prelude::*;
use pyo3::sync::PyOnceLock;
use pyo3::types::PyType;
use pyo3::{Borrowed, IntoPyObjectExt};

type Entry = unsafe extern "C" fn(*mut ffi::PyObject, *const *mut ffi::PyObject, ffi::Py_ssize_t, *mut ffi::PyObject) -> *mut ffi::PyObject;

/// A method's fast entry, and PyO3's method for every call the entry passes on.
pub(crate) struct FastMethod {
    name: &'static str,
    entry: Entry,
    pyo3_method: PyOnceLock<Py<PyAny>>,
}

impl FastMethod {
    pub(crate) const fn new(name: &'static str, entry: Entry) -> Self {
        Self { name, entry, pyo3_method: PyOnceLock::new() }
    }
}

/// Replaces each method of `cls` named in `methods` by its fast entry.
pub(crate) fn install(cls: &Bound<'_, PyType>, methods: &[&'static FastMethod]) -> PyResult<()> {
    let py = cls.py();
    for method in methods {
        let pyo3_method = cls.getattr(method.name)?;
        // SAFETY: reading the type of a live object.
        if unsafe { ffi::Py_TYPE(pyo3_method.as_ptr()) } != &raw mut ffi::PyMethodDescr_Type {
            return Err(PyTypeError::new_err(format!("{} is not a method descriptor", method.name)));
        }
        // SAFETY: a method descriptor; its definition is PyO3's, static, and
        // lives as long as the class. The new definition must live as long
        // too, so it is leaked: once per method, when the module is loaded.
        let entry = unsafe {
            let def = &*(*pyo3_method.as_ptr().cast::<ffi::PyMethodDescrObject>()).d_method;
            let fast = Box::leak(Box::new(ffi::PyMethodDef {
                ml_name: def.ml_name,
                ml_meth: ffi::PyMethodDefPointer { PyCFunctionFastWithKeywords: method.entry },
                ml_flags: ffi::METH_FASTCALL | ffi::METH_KEYWORDS,
                ml_doc: def.ml_doc,
            }));
            Bound::from_owned_ptr_or_err(py, ffi::PyDescr_NewMethod(cls.as_ptr().cast(), fast))?
        };
        method.pyo3_method.get_or_init(py, || pyo3_method.unbind());
        cls.setattr(method.name, entry)?;
    }
    Ok(())
}

/// Declares `$method`'s fast entry for the pyclass `$class`, a static of the
/// same name: a call of a request, then `$ints` ints, runs `$body` (see [`run`]).
macro_rules! fast_method {
    ($class:ty, $method:ident, $ints:literal, |$slf:ident, $request:ident, $args:pat_param| $body:expr) => {
        static $method: $crate::bindings::fast::FastMethod = $crate::bindings::fast::FastMethod::new(stringify!($method), {
            unsafe extern "C" fn entry(
                slf: *mut pyo3::ffi::PyObject,
                args: *const *mut pyo3::ffi::PyObject,
                nargs: pyo3::ffi::Py_ssize_t,
                kwnames: *mut pyo3::ffi::PyObject,
            ) -> *mut pyo3::ffi::PyObject {
                // SAFETY: CPython's method descriptor for `$class` calls this.
                unsafe {
                    $crate::bindings::fast::run::<$class, $ints, _>(&$method, slf, args, nargs, kwnames, |$slf, $request, $args| $body)
                }
            }
            entry
        });
    };
}
pub(crate) use fast_method;

/// Runs `body` for a call of a request and `INTS` exact ints, positionally;
/// passes any other call to PyO3's method. For use in an [`Entry`] only.
///
/// # Safety
/// The arguments are an `Entry`'s, from CPython's method descriptor for the
/// class `M` (so `slf` is an `M`), with the thread attached.
pub(crate) unsafe fn run<'py, M: pyo3::PyClass, const INTS: usize, R: IntoPyObject<'py>>(
    method: &FastMethod,
    slf: *mut ffi::PyObject,
    args: *const *mut ffi::PyObject,
    nargs: ffi::Py_ssize_t,
    kwnames: *mut ffi::PyObject,
    body: impl FnOnce(&Bound<'py, M>, &Bound<'py, PyAny>, [i64; INTS]) -> PyResult<R>,
) -> *mut ffi::PyObject {
    // SAFETY: CPython calls the entry with the thread attached.
    let py = unsafe { Python::assume_attached() };
    let ints = if kwnames.is_null() && nargs == INTS as ffi::Py_ssize_t + 1 {
        // SAFETY: `args` holds `nargs` live objects.
        unsafe { exact_ints::<INTS>(args.add(1)) }
    } else {
        None
    };
    let Some(ints) = ints else {
        // SAFETY: as this function's.
        return unsafe { call_pyo3(py, method, slf, args, nargs, kwnames) };
    };
    let result = catch_unwind(AssertUnwindSafe(|| {
        // SAFETY: `slf` is an `M` (the descriptor checked it) and `args[0]` a
        // live object, both borrowed for this call.
        let (slf, request) = unsafe { (Borrowed::from_ptr(py, slf).cast_unchecked::<M>(), Borrowed::from_ptr(py, *args)) };
        body(&slf, &request, ints)?.into_bound_py_any(py).map(Bound::into_ptr)
    }));
    let err = match result {
        Ok(Ok(out)) => return out,
        Ok(Err(err)) => err,
        Err(panic) => {
            let message = panic.downcast_ref::<&str>().map(|s| s.to_string()).or_else(|| panic.downcast_ref::<String>().cloned());
            PanicException::new_err(message.unwrap_or_else(|| "panic in a fast entry".to_owned()))
        }
    };
    err.restore(py);
    null_mut()
}

/// The `N` objects at `args` as i64, if each is an exact `int` in range.
///
/// # Safety
/// `args` points to `N` live objects.
unsafe fn exact_ints<const N: usize>(args: *const *mut ffi::PyObject) -> Option<[i64; N]> {
    let mut ints = [0; N];
    for (i, int) in ints.iter_mut().enumerate() {
        // SAFETY: as this function's; the error of an out-of-range int is
        // cleared, and PyO3's method raises its own.
        unsafe {
            let arg = *args.add(i);
            if ffi::PyLong_CheckExact(arg) == 0 {
                return None;
            }
            // `PyLong_AsLong`, not `PyLong_AsLongLong`: CPython 3.11 reads an int
            // over 2**30 with a loop there, and through a byte array here. A C
            // long narrower than 64 bits (Windows) only sends more ints to PyO3.
            #[allow(clippy::useless_conversion)]
            let value = i64::from(ffi::PyLong_AsLong(arg));
            if value == -1 && !ffi::PyErr_Occurred().is_null() {
                ffi::PyErr_Clear();
                return None;
            }
            *int = value;
        }
    }
    Some(ints)
}

/// Calls PyO3's method with the entry's arguments, `slf` first.
///
/// # Safety
/// As [`run`]'s.
unsafe fn call_pyo3(
    py: Python<'_>,
    method: &FastMethod,
    slf: *mut ffi::PyObject,
    args: *const *mut ffi::PyObject,
    nargs: ffi::Py_ssize_t,
    kwnames: *mut ffi::PyObject,
) -> *mut ffi::PyObject {
    let Some(pyo3_method) = method.pyo3_method.get(py) else {
        PyTypeError::new_err(format!("{} was called before it was installed", method.name)).restore(py);
        return null_mut();
    };
    // SAFETY: `args` holds `nargs` positional objects, then one per name in `kwnames`.
    unsafe {
        let num_keywords = if kwnames.is_null() { 0 } else { ffi::PyTuple_GET_SIZE(kwnames) };
        let len = (nargs + num_keywords) as usize;
        let given = if len == 0 { &[][..] } else { std::slice::from_raw_parts(args, len) };
        let with_slf: Vec<*mut ffi::PyObject> = std::iter::once(slf).chain(given.iter().copied()).collect();
        ffi::PyObject_Vectorcall(pyo3_method.as_ptr(), with_slf.as_ptr(), (nargs + 1) as usize, kwnames)
    }
}
