//! The buffer protocol: `np.asarray(a)` and `memoryview(a)` view the host copy zero-copy.
//!
//! The view holds its own shared reference to the host buffer (in `Py_buffer.internal`),
//! so the memory stays valid even if the array swaps buffers or is dropped.

use std::ffi::{CStr, c_int, c_void};
use std::sync::Arc;

use pyo3::exceptions::PyBufferError;
use pyo3::ffi;
use pyo3::prelude::*;

use memarray_core::{DType, HostBuffer};

use crate::array::PyMemArray;
use crate::errors::IntoPyResult;

/// struct-module format for each dtype; bfloat16 has none.
fn format(d: DType) -> Option<&'static CStr> {
    Some(match d {
        DType::Bool => c"?",
        DType::I8 => c"b",
        DType::I16 => c"h",
        DType::I32 => c"i",
        DType::I64 => c"q",
        DType::U8 => c"B",
        DType::U16 => c"H",
        DType::U32 => c"I",
        DType::U64 => c"Q",
        DType::F16 => c"e",
        DType::F32 => c"f",
        DType::F64 => c"d",
        DType::Complex64 => c"Zf",
        DType::Complex128 => c"Zd",
        DType::BF16 => return None,
    })
}

/// What a view owns until released: shape and strides storage and the buffer.
struct ViewState {
    dims: Vec<ffi::Py_ssize_t>,
    _buffer: Arc<HostBuffer>,
}

/// Fills `view` for `slf`.
///
/// # Safety
/// 1. `view` is the `Py_buffer` CPython passed to `bf_getbuffer`.
pub unsafe fn get_buffer(
    slf: Bound<'_, PyMemArray>,
    view: *mut ffi::Py_buffer,
    flags: c_int,
) -> PyResult<()> {
    if view.is_null() {
        return Err(PyBufferError::new_err("null Py_buffer"));
    }
    let py = slf.py();
    let (buffer, dtype, shape) = slf
        .get()
        .with(py, |raw| {
            raw.host_export(None)
                .map(|b| (b, raw.dtype(), raw.shape().to_vec()))
        })
        .py()?;
    let fmt = format(dtype).ok_or_else(|| {
        PyBufferError::new_err(
            "bfloat16 has no buffer-protocol format; export it with DLPack (torch.from_dlpack)",
        )
    })?;
    // The data is C-ordered: a Fortran-contiguous request is served only where the two
    // coincide (at most one extent above 1), as PEP 3118 and NumPy require.
    if flags & ffi::PyBUF_F_CONTIGUOUS == ffi::PyBUF_F_CONTIGUOUS
        && shape.iter().filter(|&&d| d > 1).count() > 1
        && !shape.contains(&0)
    {
        return Err(PyBufferError::new_err(format!(
            "the MemArray of shape {shape:?} is C-contiguous, not Fortran-contiguous"
        )));
    }
    let ndim = shape.len();
    let itemsize = dtype.size() as ffi::Py_ssize_t;
    let mut dims: Vec<ffi::Py_ssize_t> = shape.iter().map(|&d| d as _).collect();
    dims.extend(
        memarray_core::shape::c_strides(&shape)
            .iter()
            .map(|&s| s as ffi::Py_ssize_t * itemsize),
    );
    let mut state = Box::new(ViewState {
        dims,
        _buffer: buffer.clone(),
    });
    // SAFETY: view is valid (item 1); the pointers stored stay valid until
    // release_buffer frees `state`, and obj gets a new strong reference.
    unsafe {
        (*view).buf = buffer.as_mut_ptr().cast::<c_void>();
        (*view).len = buffer.len() as ffi::Py_ssize_t;
        (*view).readonly = 0;
        (*view).itemsize = itemsize;
        (*view).format = if flags & ffi::PyBUF_FORMAT != 0 {
            fmt.as_ptr().cast_mut()
        } else {
            std::ptr::null_mut()
        };
        (*view).ndim = ndim as c_int;
        let p = state.dims.as_mut_ptr();
        // Shape and strides only where asked for (C-contiguous data may omit them).
        let want_shape = ndim > 0 && flags & ffi::PyBUF_ND == ffi::PyBUF_ND;
        let want_strides = ndim > 0 && flags & ffi::PyBUF_STRIDES == ffi::PyBUF_STRIDES;
        (*view).shape = if want_shape { p } else { std::ptr::null_mut() };
        (*view).strides = if want_strides {
            p.add(ndim)
        } else {
            std::ptr::null_mut()
        };
        (*view).suboffsets = std::ptr::null_mut();
        (*view).internal = Box::into_raw(state).cast();
        (*view).obj = slf.clone().into_any().into_ptr();
    }
    Ok(())
}

/// Frees what [`get_buffer`] stored in `view`.
///
/// # Safety
/// 1. `view` was filled by [`get_buffer`] and is released once.
pub unsafe fn release_buffer(view: *mut ffi::Py_buffer) {
    // SAFETY: internal holds the Box<ViewState> leaked by get_buffer (item 1).
    unsafe {
        let state = (*view).internal.cast::<ViewState>();
        if !state.is_null() {
            drop(Box::from_raw(state));
            (*view).internal = std::ptr::null_mut();
        }
    }
}

// The buffer protocol of MemArray.
#[pymethods]
impl PyMemArray {
    // SAFETY (buffer protocol): see crate::buffer for the invariants.
    unsafe fn __getbuffer__(
        slf: Bound<'_, Self>,
        view: *mut pyo3::ffi::Py_buffer,
        flags: std::os::raw::c_int,
    ) -> PyResult<()> {
        // SAFETY: forwarded from CPython's buffer protocol call.
        unsafe { crate::buffer::get_buffer(slf, view, flags) }
    }

    unsafe fn __releasebuffer__(&self, view: *mut pyo3::ffi::Py_buffer) {
        // SAFETY: forwarded from CPython; view was filled by get_buffer.
        unsafe { crate::buffer::release_buffer(view) }
    }
}
