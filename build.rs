//! With the PyO3 layer on, exposes PyO3's cfgs (`Py_GIL_DISABLED` for a
//! free-threaded interpreter) to `src/bindings/cell.rs`.

fn main() {
    #[cfg(feature = "python")]
    pyo3_build_config::use_pyo3_cfgs();
}
