//! [`StateCell`]: a manager's mutable state inside a frozen pyclass.
//!
//! A mutable pyclass is borrowed through PyO3's flag, which is atomic so that
//! it also serves free-threaded Python: every borrow and its release are
//! locked instructions. The per-call API borrows once or twice per call, and
//! callgrind and perf showed those locked instructions, with the `Arc` counts
//! they sat beside, taking a third of the time spent in Rust. With the GIL,
//! calls into a manager are already serialised, so the flag here is read and
//! written with plain loads and stores; a free-threaded build (`Py_GIL_DISABLED`)
//! keeps a compare-and-swap. A borrow still in use when a call re-enters (a
//! request's method or a `__del__` calling back into the manager) is refused
//! with RuntimeError, as PyO3's check refuses it.

use std::cell::UnsafeCell;
use std::ops::{Deref, DerefMut};
use std::sync::atomic::{AtomicIsize, Ordering};

use pyo3::exceptions::PyRuntimeError;
use pyo3::gc::PyVisit;
use pyo3::prelude::*;

/// No borrow; `> 0` counts shared borrows.
const UNUSED: isize = 0;
const EXCLUSIVE: isize = -1;

pub(crate) struct StateCell<T> {
    flag: AtomicIsize,
    value: UnsafeCell<T>,
}

// SAFETY: the value is reached only through a borrow, which needs the GIL
// (a `Python` token, or a `PyVisit` during garbage collection) and is
// granted by the flag; with the GIL, the flag's check and update run with no
// other thread in between, and without it (free-threaded builds) they are
// one compare-and-swap. `T: Send` because a borrow may be taken on any thread.
unsafe impl<T: Send> Sync for StateCell<T> {}

impl<T> StateCell<T> {
    pub(crate) fn new(value: T) -> Self {
        Self { flag: AtomicIsize::new(UNUSED), value: UnsafeCell::new(value) }
    }

    /// Moves the flag from `from` (checked by `allowed`) to `to`.
    fn acquire(&self, allowed: impl Fn(isize) -> bool, to: impl Fn(isize) -> isize) -> bool {
        #[cfg(not(Py_GIL_DISABLED))]
        {
            let from = self.flag.load(Ordering::Relaxed);
            if !allowed(from) {
                return false;
            }
            self.flag.store(to(from), Ordering::Relaxed);
            true
        }
        #[cfg(Py_GIL_DISABLED)]
        {
            self.flag.fetch_update(Ordering::Acquire, Ordering::Relaxed, |from| allowed(from).then(|| to(from))).is_ok()
        }
    }

    fn release(&self, change: isize) {
        #[cfg(not(Py_GIL_DISABLED))]
        self.flag.store(self.flag.load(Ordering::Relaxed) - change, Ordering::Relaxed);
        #[cfg(Py_GIL_DISABLED)]
        self.flag.fetch_sub(change, Ordering::Release);
    }

    fn shared(&self) -> Option<StateRef<'_, T>> {
        // Lazily: a guard made for a refused borrow would release it when dropped.
        self.acquire(|flag| flag >= UNUSED, |flag| flag + 1).then(|| StateRef { cell: self })
    }

    /// The state to read; RuntimeError while it is borrowed to change.
    pub(crate) fn borrow(&self, _py: Python<'_>) -> PyResult<StateRef<'_, T>> {
        self.shared().ok_or_else(|| PyRuntimeError::new_err("the manager is already mutably borrowed (a re-entrant call)"))
    }

    /// The state to change; RuntimeError while it is borrowed at all.
    pub(crate) fn borrow_mut(&self, _py: Python<'_>) -> PyResult<StateMut<'_, T>> {
        if self.acquire(|flag| flag == UNUSED, |_| EXCLUSIVE) {
            return Ok(StateMut { cell: self });
        }
        Err(PyRuntimeError::new_err("the manager is already borrowed (a re-entrant call)"))
    }

    /// The state for the garbage collector's visit, unless a call is changing it.
    pub(crate) fn borrow_to_visit(&self, _visit: &PyVisit<'_>) -> Option<StateRef<'_, T>> {
        self.shared()
    }
}

pub(crate) struct StateRef<'a, T> {
    cell: &'a StateCell<T>,
}

impl<T> Deref for StateRef<'_, T> {
    type Target = T;

    fn deref(&self) -> &T {
        // SAFETY: a shared borrow is held, so no `StateMut` exists.
        unsafe { &*self.cell.value.get() }
    }
}

impl<T> Drop for StateRef<'_, T> {
    fn drop(&mut self) {
        self.cell.release(1);
    }
}

pub(crate) struct StateMut<'a, T> {
    cell: &'a StateCell<T>,
}

impl<T> Deref for StateMut<'_, T> {
    type Target = T;

    fn deref(&self) -> &T {
        // SAFETY: the exclusive borrow is held.
        unsafe { &*self.cell.value.get() }
    }
}

impl<T> DerefMut for StateMut<'_, T> {
    fn deref_mut(&mut self) -> &mut T {
        // SAFETY: the exclusive borrow is held.
        unsafe { &mut *self.cell.value.get() }
    }
}

impl<T> Drop for StateMut<'_, T> {
    fn drop(&mut self) {
        self.cell.release(EXCLUSIVE);
    }
}
