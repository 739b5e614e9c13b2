//! Python's copy protocol for MemArray (`a.copy()`, `copy.copy`, `copy.deepcopy`) and
//! `swap`: new buffers, or the contents exchanged, with the GIL released. Its own
//! `#[pymethods]` block.

use pyo3::prelude::*;

use crate::array::PyMemArray;
use crate::errors::IntoPyResult;
use crate::fork::Detach;

#[pymethods]
impl PyMemArray {
    /// A deep copy (new buffers, same location, unlocked), made with the GIL released.
    fn copy(&self, py: Python<'_>) -> PyResult<Self> {
        Ok(Self::from(
            self.with_detached(py, |raw| raw.try_clone(None)).py()?,
        ))
    }

    fn __copy__(&self, py: Python<'_>) -> PyResult<Self> {
        self.copy(py)
    }

    fn __deepcopy__(&self, py: Python<'_>, _memo: &Bound<'_, PyAny>) -> PyResult<Self> {
        self.copy(py)
    }

    /// Swaps contents with `other` without copying; both must be unlocked.
    fn swap(&self, py: Python<'_>, other: &Bound<'_, Self>) -> PyResult<()> {
        let other = other.get();
        py.detach_section(|| self.shared.swap(&other.shared)).py()
    }
}
