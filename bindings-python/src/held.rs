//! [`HeldBuffer`]: a PEP 3118 view of a Python object held for the length of a call (the
//! NumPy fast paths and Numba's `mempin` read addresses through it).

use pyo3::prelude::*;

/// A C-contiguous buffer view of an object (PEP 3118), held until dropped: its address
/// and size, in a fraction of the time `__array_interface__` takes. While held, NumPy
/// refuses to resize or free the memory.
pub(crate) struct HeldBuffer<'py> {
    view: Box<pyo3::ffi::Py_buffer>,
    _py: Python<'py>,
}

impl<'py> HeldBuffer<'py> {
    /// The view, or `None` (no error left set) when `obj` cannot give a C-contiguous
    /// one (writable, with `writable`): a non-buffer object, a read-only or strided array,
    /// or a dtype the buffer protocol cannot describe (bfloat16).
    pub(crate) fn get(obj: &Bound<'py, PyAny>, writable: bool) -> Option<Self> {
        let mut flags = pyo3::ffi::PyBUF_C_CONTIGUOUS;
        if writable {
            flags |= pyo3::ffi::PyBUF_WRITABLE;
        }
        let mut view: Box<pyo3::ffi::Py_buffer> = Box::new(pyo3::ffi::Py_buffer::new());
        // SAFETY: obj is live and the GIL is held; on failure the view is untouched and
        // the raised error is cleared below.
        let rc = unsafe { pyo3::ffi::PyObject_GetBuffer(obj.as_ptr(), &mut *view, flags) };
        if rc != 0 {
            let _ = PyErr::take(obj.py());
            return None;
        }
        Some(HeldBuffer {
            view,
            _py: obj.py(),
        })
    }

    /// The first byte.
    pub(crate) fn addr(&self) -> usize {
        self.view.buf as usize
    }

    /// Bytes in the view.
    pub(crate) fn len(&self) -> usize {
        self.view.len.max(0) as usize
    }
}

impl Drop for HeldBuffer<'_> {
    fn drop(&mut self) {
        // SAFETY: the view was filled by PyObject_GetBuffer and is released once; the GIL
        // is held ('py).
        unsafe { pyo3::ffi::PyBuffer_Release(&mut *self.view) };
    }
}
