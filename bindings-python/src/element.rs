//! Element access: `a[i, j]` read and write, one element at a time, wherever the data is
//! (a device element is a small synchronous copy after pending work).

use pyo3::exceptions::{PyIndexError, PyTypeError, PyValueError};
use pyo3::prelude::*;
use pyo3::types::{PyInt, PySlice, PyTuple};

use memarray_core::{Location, LockToken};
use memarray_cuda::array::RawArray;

use crate::array::PyMemArray;
use crate::convert;
use crate::dtype::{bytes_to_py, py_to_bytes};
use crate::errors::IntoPyResult;

impl PyMemArray {
    /// Runs an element access `f`: with the GIL held only for host data with nothing
    /// pending (a device element is a synchronous copy).
    fn with_element<R: Send>(
        &self,
        py: Python<'_>,
        f: impl FnOnce(&mut RawArray) -> R + Send,
    ) -> R {
        self.with_if(
            py,
            |raw| raw.location() == Location::Host && !raw.has_pending_work(),
            f,
        )
    }

    pub(crate) fn get_item(
        &self,
        py: Python<'_>,
        key: &Bound<'_, PyAny>,
        token: Option<LockToken>,
    ) -> PyResult<Py<PyAny>> {
        let (_, shape) = self.layout(py);
        let idx = parse_index(&shape, key)?;
        let read = |raw: &mut RawArray| {
            let dtype = raw.dtype();
            let mut buf = [0u8; 16];
            raw.read_element(&idx, &mut buf[..dtype.size()], token)
                .map(|()| (dtype, buf))
        };
        let (dtype, buf) = self.with_element(py, read).py()?;
        Ok(bytes_to_py(py, dtype, &buf[..dtype.size()])?.unbind())
    }

    pub(crate) fn set_item(
        &self,
        py: Python<'_>,
        key: &Bound<'_, PyAny>,
        value: &Bound<'_, PyAny>,
        token: Option<LockToken>,
    ) -> PyResult<()> {
        loop {
            let (dtype, shape) = self.layout(py);
            let idx = parse_index(&shape, key)?;
            let bytes = py_to_bytes(value, dtype)?;
            let write = |raw: &mut RawArray| {
                if raw.dtype() != dtype {
                    return None; // swapped meanwhile: convert the value again
                }
                Some(raw.write_element(&idx, &bytes, token))
            };
            let done = self.with_element(py, write);
            if let Some(r) = done {
                return r.py();
            }
        }
    }
}

#[pymethods]
impl PyMemArray {
    fn __getitem__(&self, py: Python<'_>, key: &Bound<'_, PyAny>) -> PyResult<Py<PyAny>> {
        self.get_item(py, key, None)
    }

    /// Elements cannot be deleted (an array's size is fixed): ValueError, as NumPy.
    fn __delitem__(&self, _key: &Bound<'_, PyAny>) -> PyResult<()> {
        Err(PyValueError::new_err("cannot delete array elements"))
    }

    fn __setitem__(
        &self,
        py: Python<'_>,
        key: &Bound<'_, PyAny>,
        value: &Bound<'_, PyAny>,
    ) -> PyResult<()> {
        self.set_item(py, key, value, None)
    }
}

/// Python index (int or tuple of ints, negatives counting from the end) to a bounds-checked
/// multi-index.
fn parse_index(shape: &[usize], key: &Bound<'_, PyAny>) -> PyResult<Vec<u64>> {
    let items: Vec<Bound<'_, PyAny>> = if let Ok(t) = key.cast::<PyTuple>() {
        t.iter().collect()
    } else {
        vec![key.clone()]
    };
    if items.iter().any(|i| i.is_instance_of::<PySlice>()) {
        return Err(PyTypeError::new_err(
            "MemArray indexing takes integers only; use np.asarray(a)[...] to slice",
        ));
    }
    if items.len() != shape.len() {
        return Err(PyIndexError::new_err(format!(
            "MemArray has {} dimensions but {} indices were given; index single elements \
             with a[i, j, ...] (use np.asarray(a) for slicing)",
            shape.len(),
            items.len()
        )));
    }
    items
        .iter()
        .zip(shape)
        .enumerate()
        .map(|(axis, (item, &d))| {
            if item.is_instance_of::<PySlice>() {
                return Err(PyTypeError::new_err(
                    "MemArray indexing takes integers only; use np.asarray(a)[...] to slice",
                ));
            }
            if !item.is_instance_of::<PyInt>() && !item.hasattr("__index__")? {
                return Err(PyTypeError::new_err(format!(
                    "indices must be integers, not {}",
                    item.get_type().name()?
                )));
            }
            // A raising `__index__` propagates its own error; an integer too wide even for
            // i128 is out of bounds like any other.
            let oob = |i: &dyn std::fmt::Display| {
                PyIndexError::new_err(format!(
                    "index {i} is out of bounds for axis {axis} with size {d}"
                ))
            };
            let as_int = convert::to_int(item, "index")?;
            let Ok(i) = as_int.extract::<i128>() else {
                return Err(oob(&as_int.repr()?));
            };
            let j = if i < 0 { i + d as i128 } else { i };
            if j < 0 || j >= d as i128 {
                return Err(oob(&i));
            }
            Ok(j as u64)
        })
        .collect()
}
