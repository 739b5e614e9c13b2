//! What a NumPy user expects of any array object: `repr` with the
//! data, `len`, iteration, truth value, conversion to Python scalars, and equality. Its
//! own `#[pymethods]` block (pyo3's `multiple-pymethods`), so the class file stays small.

use pyo3::exceptions::{PyTypeError, PyValueError};
use pyo3::prelude::*;
use pyo3::types::PyTuple;

use memarray_core::{DType, Location};

use crate::array::PyMemArray;
use crate::device::device_name;

/// Elements a `repr` shows in full; larger host arrays are summarised as NumPy does.
const REPR_FULL: usize = 1000;

#[pymethods]
impl PyMemArray {
    /// `MemArray([[0., 1.], [2., 3.]], dtype=float64, device=cpu)` for host data (NumPy's
    /// formatting, summarised past 1,000 elements); device data is not copied for a repr:
    /// `MemArray(shape=(2, 2), dtype=float64, device=cuda:0, nbytes=32)`. The facts that
    /// differ from plain host memory follow: the host kind (`pinned`, `managed`),
    /// `spilled`, `locked`, `pending work` (recorded on a stream, not waited for yet).
    fn __repr__(slf: &Bound<'_, Self>) -> PyResult<String> {
        let py = slf.py();
        let this = slf.get();
        let (shape, dtype, loc, nbytes, kind, spilled, pending) = this.peek(py, |raw| {
            (
                raw.shape().to_vec(),
                raw.dtype(),
                raw.location(),
                raw.nbytes(),
                raw.host_kind(),
                raw.is_spilled(),
                raw.has_pending_work(),
            )
        });
        let mut facts = String::new();
        if kind != memarray_cuda::array::HostKind::Pageable {
            facts += &format!(", {}", crate::convert::host_kind_name(kind));
        }
        if spilled {
            facts += ", spilled";
        }
        if this.shared.is_locked() {
            facts += ", locked";
        }
        if pending {
            facts += ", pending work";
        }
        let locked = facts.as_str();
        let shape_text = PyTuple::new(py, &shape)?.repr()?.to_string();
        let summary = || {
            format!(
                "MemArray(shape={shape_text}, dtype={dtype}, device={}, nbytes={nbytes}{locked})",
                device_name(loc)
            )
        };
        if loc != Location::Host || this.shared.is_locked() || dtype == DType::BF16 {
            return Ok(summary());
        }
        // A zero-copy view through the buffer protocol; anything in the way (a lock taken
        // meanwhile) falls back to the summary, never an exception from repr.
        let text = (|| -> PyResult<String> {
            let np = py.import("numpy")?;
            let view = np.getattr("asarray")?.call1((slf,))?;
            let kwargs = pyo3::types::PyDict::new(py);
            kwargs.set_item("separator", ", ")?;
            kwargs.set_item("prefix", "MemArray(")?;
            kwargs.set_item("threshold", REPR_FULL)?;
            np.getattr("array2string")?
                .call((view,), Some(&kwargs))?
                .extract()
        })();
        Ok(match text {
            Ok(t) => format!("MemArray({t}, dtype={dtype}, device=cpu{locked})"),
            Err(_) => summary(),
        })
    }

    /// Whether work recorded on a stream for this array (a copy, a kernel, a consumer's
    /// recorded stream) has not been waited for yet (it may have finished meanwhile): a
    /// host access would first wait for it.
    #[getter]
    fn pending_work(&self, py: Python<'_>) -> bool {
        self.peek(py, |raw| raw.has_pending_work())
    }

    /// The notebook's view (Jupyter calls it for a cell's value): a table of the facts
    /// (shape, dtype, device, where the data is now, bytes, lock, pending work) and the
    /// values as NumPy elides them. Never syncs the device beyond what `str` does.
    fn _repr_html_(slf: &Bound<'_, Self>) -> PyResult<String> {
        slf.py()
            .import("memarray._html")?
            .call_method1("array_html", (slf,))?
            .extract()
    }

    /// `str(a)` is NumPy's `str` of the data (`[[0. 1.]\n [2. 3.]]`, summarised past 1,000
    /// elements): host data is viewed, device data of up to 1,000 elements copied; a
    /// larger device array or a locked one gives the `repr` summary.
    fn __str__(slf: &Bound<'_, Self>) -> PyResult<String> {
        let py = slf.py();
        let this = slf.get();
        let (n, dtype, loc) = this.peek(py, |raw| (raw.len(), raw.dtype(), raw.location()));
        let text = (|| -> PyResult<Option<String>> {
            if this.shared.is_locked() {
                return Ok(None);
            }
            let data = if loc == Location::Host && dtype != DType::BF16 {
                py.import("numpy")?.getattr("asarray")?.call1((slf,))?
            } else if n <= REPR_FULL as u64 {
                slf.call_method0("to_numpy")?
            } else {
                return Ok(None);
            };
            Ok(Some(data.str()?.to_string()))
        })();
        match text {
            Ok(Some(t)) => Ok(t),
            _ => Self::__repr__(slf),
        }
    }

    /// `len(a)` is the first extent; a 0-d array has no length (TypeError, as NumPy).
    fn __len__(&self, py: Python<'_>) -> PyResult<usize> {
        self.peek(py, |raw| raw.shape().first().copied())
            .ok_or_else(|| PyTypeError::new_err("len() of unsized object (a 0-d MemArray)"))
    }

    /// Iterating a 1-d array yields its elements as Python scalars (one consistent
    /// snapshot); a 0-d array is not iterable, and for 2 or more dimensions, where NumPy
    /// yields row views that a MemArray cannot give, iteration is a TypeError saying how.
    fn __iter__<'py>(slf: &Bound<'py, Self>) -> PyResult<Bound<'py, PyAny>> {
        let py = slf.py();
        let (_, shape) = slf.get().layout(py);
        match shape.len() {
            0 => Err(PyTypeError::new_err("iteration over a 0-d MemArray")),
            1 => {
                let list = slf
                    .get()
                    .to_numpy_with(py, None, None)?
                    .call_method0("tolist")?;
                list.try_iter().map(Bound::into_any)
            }
            n => Err(PyTypeError::new_err(format!(
                "a {n}-d MemArray cannot be iterated row by row (it has no views); iterate \
                 np.asarray(a) (host data, zero-copy) or a.to_numpy() (a copy)"
            ))),
        }
    }

    /// The truth value of a one-element array; ValueError for any other size, as NumPy.
    fn __bool__(&self, py: Python<'_>) -> PyResult<bool> {
        self.scalar(py, "truth value")?.is_truthy()
    }

    /// `float(a)` of a one-element array.
    fn __float__(&self, py: Python<'_>) -> PyResult<f64> {
        self.scalar(py, "float")?.extract::<f64>().map_err(|_| {
            PyTypeError::new_err("a complex MemArray cannot be converted to float; use complex(a)")
        })
    }

    /// `int(a)` of a one-element array (floats truncate, as NumPy).
    fn __int__(&self, py: Python<'_>) -> PyResult<Py<PyAny>> {
        let v = self.scalar(py, "int")?;
        let int = py.get_type::<pyo3::types::PyInt>();
        Ok(int.call1((v,))?.unbind())
    }

    /// `complex(a)` of a one-element array.
    fn __complex__(&self, py: Python<'_>) -> PyResult<Py<PyAny>> {
        let v = self.scalar(py, "complex")?;
        let complex = py.get_type::<pyo3::types::PyComplex>();
        Ok(complex.call1((v,))?.unbind())
    }

    /// `operator.index(a)` of a 0-d integer (or bool) array, as NumPy: other arrays raise
    /// TypeError.
    fn __index__(&self, py: Python<'_>) -> PyResult<Py<PyAny>> {
        let (dtype, shape) = self.layout(py);
        // DLPack code 0 is signed and 1 unsigned integers; bool is not an index (NumPy:
        // TypeError for a 0-d bool array, as for True in a[np.array(True)]'s sense).
        let integer = matches!(dtype.dlpack().0, 0 | 1);
        if !shape.is_empty() || !integer {
            return Err(PyTypeError::new_err(
                "only integer scalar arrays (0-d, integer dtype) can be converted to an index",
            ));
        }
        let v = self.get_item(py, &PyTuple::empty(py).into_any(), None)?;
        Ok(py.get_type::<pyo3::types::PyInt>().call1((v,))?.unbind())
    }
}

impl PyMemArray {
    /// The only element of a one-element array, for a conversion named `what`.
    fn scalar<'py>(&self, py: Python<'py>, what: &str) -> PyResult<Bound<'py, PyAny>> {
        let (_, shape) = self.layout(py);
        let size: usize = shape.iter().product();
        if size != 1 {
            return Err(PyValueError::new_err(format!(
                "the {what} of a MemArray with {size} elements is ambiguous: only \
                 one-element arrays convert (use a.to_numpy().any() / .all() for truth)"
            )));
        }
        let zeros = PyTuple::new(py, vec![0usize; shape.len()])?;
        Ok(self.get_item(py, zeros.as_any(), None)?.into_bound(py))
    }
}
