//! Verbs users bring from torch, CuPy and NumPy that a MemArray does not have (`a.cuda()`,
//! `a.numpy()`, `a.T`, `a + 1`, `a.sum()`): each is an error naming memarray's verb or the
//! zero-copy route to a library that computes, instead of a bare `AttributeError` /
//! `TypeError`. Its own `#[pymethods]` block; `__getattr__` runs only after normal lookup
//! failed, so it costs nothing on any real attribute.

use std::collections::HashSet;

use pyo3::exceptions::{PyAttributeError, PyTypeError};
use pyo3::prelude::*;
use pyo3::sync::PyOnceLock;

use crate::array::PyMemArray;

/// Where to compute: a MemArray stores and moves data; libraries compute on it zero-copy.
const COMPUTE: &str = "a MemArray stores and moves data and has no arithmetic, comparisons, \
    views or reductions: compute on it zero-copy with torch.from_dlpack(a), cupy.asarray(a) or \
    jax.dlpack.from_dlpack(a) (device data), or np.asarray(a) (host data)";

/// The names MemArray's class has (its methods and properties, and `object`'s).
static CLASS_NAMES: PyOnceLock<HashSet<String>> = PyOnceLock::new();

/// The hint for a familiar name, if it is one.
fn hint(name: &str) -> Option<&'static str> {
    Some(match name {
        "cuda" => {
            "a MemArray moves in place: a.move_memory(\"cuda\") (or a.to_device(\"cuda\") \
                   for a new array on the device)"
        }
        "cpu" => {
            "a.move_memory(\"cpu\") moves the data to the host in place; a.to_numpy() \
                  gives a NumPy copy, np.asarray(a) a zero-copy view of host data"
        }
        "to" => {
            "a.to_device(device) returns the data on another device (the Array API's \
                 verb); a.move_memory(device) moves it in place"
        }
        "numpy" | "get" | "asnumpy" | "tolist" => {
            "a.to_numpy() gives a NumPy copy from any device; np.asarray(a) is a zero-copy \
             view of host data"
        }
        "item" => "a[i, j] reads one element; float(a) / int(a) convert a one-element array",
        "T" | "mT" | "transpose" | "reshape" | "view" | "flatten" | "ravel" | "astype"
        | "squeeze" | "sum" | "mean" | "max" | "min" | "std" | "var" | "prod" | "any" | "all"
        | "argmax" | "argmin" | "dot" | "matmul" | "cumsum" | "clip" | "round" | "abs"
        | "fill_" | "zero_" | "copy_" => COMPUTE,
        "fill" => {
            "memarray.full(shape, value, dtype, device=...) makes a filled array; to fill \
             this one, a.read_numpy_array(np.full(a.shape, value)) (any device)"
        }
        _ => return None,
    })
}

#[pymethods]
impl PyMemArray {
    /// The attribute `name`, which normal lookup did not find: for the verbs of torch,
    /// CuPy and NumPy, an AttributeError naming memarray's.
    fn __getattr__(slf: &Bound<'_, Self>, name: &str) -> PyResult<Py<PyAny>> {
        // A property of the class that raised AttributeError (`__cuda_array_interface__`
        // of host data) brought Python here: its own error, which says why, is raised
        // again. The class's names are read once: asking the class for a name it lacks
        // raises and catches an AttributeError, which doubled the cost of every probe
        // (`hasattr(a, "requires_grad")`).
        let own = crate::once::once(&CLASS_NAMES, slf.py(), || {
            slf.get_type()
                .dir()?
                .iter()
                .map(|n| n.extract::<String>())
                .collect()
        })?;
        if own.contains(name) {
            return slf
                .get_type()
                .getattr(name)?
                .call_method1("__get__", (slf, slf.get_type()))
                .map(Bound::unbind);
        }
        Err(match hint(name) {
            Some(h) => PyAttributeError::new_err(format!(
                "'MemArray' object has no attribute '{name}': {h}"
            )),
            None => {
                PyAttributeError::new_err(format!("'MemArray' object has no attribute '{name}'"))
            }
        })
    }

    // Ordering comparisons get the compute hint; `==` and `!=` are identity, as before
    // (pyo3 answers NotImplemented for them). Defining any comparison drops the inherited
    // hash, so identity hashing is restated: MemArrays stay usable as dict keys.
    fn __lt__(&self, _other: &Bound<'_, PyAny>) -> PyResult<Py<PyAny>> {
        Err(PyTypeError::new_err(COMPUTE))
    }

    fn __le__(&self, _other: &Bound<'_, PyAny>) -> PyResult<Py<PyAny>> {
        Err(PyTypeError::new_err(COMPUTE))
    }

    fn __gt__(&self, _other: &Bound<'_, PyAny>) -> PyResult<Py<PyAny>> {
        Err(PyTypeError::new_err(COMPUTE))
    }

    fn __ge__(&self, _other: &Bound<'_, PyAny>) -> PyResult<Py<PyAny>> {
        Err(PyTypeError::new_err(COMPUTE))
    }

    fn __hash__(slf: &Bound<'_, Self>) -> isize {
        // CPython's `object.__hash__`: the address rotated by 4 bits (never -1).
        let p = slf.as_ptr() as usize;
        match p.rotate_right(4) as isize {
            -1 => -2,
            h => h,
        }
    }

    fn __neg__(&self) -> PyResult<Py<PyAny>> {
        Err(PyTypeError::new_err(COMPUTE))
    }

    fn __add__(&self, _other: &Bound<'_, PyAny>) -> PyResult<Py<PyAny>> {
        Err(PyTypeError::new_err(COMPUTE))
    }

    fn __radd__(&self, _other: &Bound<'_, PyAny>) -> PyResult<Py<PyAny>> {
        Err(PyTypeError::new_err(COMPUTE))
    }

    fn __sub__(&self, _other: &Bound<'_, PyAny>) -> PyResult<Py<PyAny>> {
        Err(PyTypeError::new_err(COMPUTE))
    }

    fn __rsub__(&self, _other: &Bound<'_, PyAny>) -> PyResult<Py<PyAny>> {
        Err(PyTypeError::new_err(COMPUTE))
    }

    fn __mul__(&self, _other: &Bound<'_, PyAny>) -> PyResult<Py<PyAny>> {
        Err(PyTypeError::new_err(COMPUTE))
    }

    fn __rmul__(&self, _other: &Bound<'_, PyAny>) -> PyResult<Py<PyAny>> {
        Err(PyTypeError::new_err(COMPUTE))
    }

    fn __truediv__(&self, _other: &Bound<'_, PyAny>) -> PyResult<Py<PyAny>> {
        Err(PyTypeError::new_err(COMPUTE))
    }

    fn __rtruediv__(&self, _other: &Bound<'_, PyAny>) -> PyResult<Py<PyAny>> {
        Err(PyTypeError::new_err(COMPUTE))
    }

    fn __floordiv__(&self, _other: &Bound<'_, PyAny>) -> PyResult<Py<PyAny>> {
        Err(PyTypeError::new_err(COMPUTE))
    }

    fn __rfloordiv__(&self, _other: &Bound<'_, PyAny>) -> PyResult<Py<PyAny>> {
        Err(PyTypeError::new_err(COMPUTE))
    }

    fn __matmul__(&self, _other: &Bound<'_, PyAny>) -> PyResult<Py<PyAny>> {
        Err(PyTypeError::new_err(COMPUTE))
    }

    fn __rmatmul__(&self, _other: &Bound<'_, PyAny>) -> PyResult<Py<PyAny>> {
        Err(PyTypeError::new_err(COMPUTE))
    }
}
