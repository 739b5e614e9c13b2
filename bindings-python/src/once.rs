//! Once-cells filled by Python code, fork-safe (see `fork.rs`).

use pyo3::prelude::*;
use pyo3::sync::PyOnceLock;

/// The cell's value, computing it with `f` outside the cell when empty (two threads may
/// both compute; the first to store wins). A once-cell held "being initialised" while its
/// initialiser runs Python code would be inherited in that state by a child forked
/// meanwhile, and the child's first use would wait for ever.
pub fn once<'a, T>(
    cell: &'a PyOnceLock<T>,
    py: Python<'_>,
    f: impl FnOnce() -> PyResult<T>,
) -> PyResult<&'a T> {
    if let Some(v) = cell.get(py) {
        return Ok(v);
    }
    let v = f()?;
    // Another thread may have set it meanwhile: its value is as good, and is kept.
    let _ = cell.set(py, v);
    Ok(cell.get(py).expect("set above or by another thread"))
}
