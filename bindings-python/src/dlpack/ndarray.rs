//! An exact `numpy.ndarray` read through its C struct, as NumPy's own C API macros
//! (`PyArray_DATA`, `PyArray_DIMS`, `PyArray_DESCR`) read it: no `__dlpack__` call and
//! no capsule, about half of a small `from_dlpack`'s cost. The fields read here have had
//! the same layout in every NumPy release since 1.7, 2.x included. The dtype is NumPy's
//! own builtin dtype object, known by identity ([`crate::dtype::numpy_dtype_of`]).
//! Anything else (a dtype memarray does not store, a foreign byte order, strides that
//! are not whole elements) is left to the `__dlpack__` path, which keeps NumPy's rules.

use std::ffi::{c_char, c_int};
use std::ptr::NonNull;

use pyo3::ffi;
use pyo3::prelude::*;

use memarray_core::{DType, ForeignTensor, HostBuffer, MAX_NDIM, MemoryKind, Place};
use memarray_cuda::array::RawArray;

use crate::errors::IntoPyResult;

/// The head of NumPy's `PyArrayObject_fields`.
#[repr(C)]
struct ArrayFields {
    ob_base: ffi::PyObject,
    data: *mut c_char,
    nd: c_int,
    dimensions: *const isize,
    strides: *const isize,
    base: *mut ffi::PyObject,
    descr: *mut ffi::PyObject,
    flags: c_int,
}

/// `NPY_ARRAY_WRITEABLE`.
const WRITEABLE: c_int = 0x0400;

/// The layout of an exact ndarray, read from its fields: data, dtype, shape and strides
/// in elements, writability. `None` where the `__dlpack__` path must decide.
pub(crate) struct Layout {
    data: *mut c_char,
    dtype: DType,
    ndim: usize,
    shape: [i64; MAX_NDIM],
    strides: [i64; MAX_NDIM],
    read_only: bool,
}

/// The layout of `obj`, an exact `numpy.ndarray` (the caller checked its type).
pub(crate) fn layout(obj: &Bound<'_, PyAny>) -> PyResult<Option<Layout>> {
    // SAFETY: `obj` is an exact ndarray (callers), whose object starts with these fields;
    // they stay valid while we hold the GIL and a reference.
    let a = unsafe { &*obj.as_ptr().cast::<ArrayFields>() };
    // SAFETY: every ndarray holds a reference to its live dtype object.
    let descr = unsafe { pyo3::Borrowed::from_ptr(obj.py(), a.descr) };
    let Some(dtype) = crate::dtype::numpy_dtype_of(&descr)? else {
        return Ok(None);
    };
    let Some(ndim) = usize::try_from(a.nd).ok().filter(|&n| n <= MAX_NDIM) else {
        return Ok(None);
    };
    let mut out = Layout {
        data: a.data,
        dtype,
        ndim,
        shape: [0; MAX_NDIM],
        strides: [0; MAX_NDIM],
        read_only: a.flags & WRITEABLE == 0,
    };
    let item = dtype.size() as isize;
    for i in 0..ndim {
        // SAFETY: an ndarray's dimensions and strides hold nd entries.
        let (extent, stride) = unsafe { (*a.dimensions.add(i), *a.strides.add(i)) };
        if stride % item != 0 {
            return Ok(None);
        }
        out.shape[i] = extent as i64;
        out.strides[i] = (stride / item) as i64;
    }
    Ok(Some(out))
}

/// The tensor of `obj`, an exact `numpy.ndarray` of layout `l`, owning a reference to it.
///
/// # Errors
/// The layout's checks (misaligned data, negative or overlapping strides), as the
/// `__dlpack__` path raises them.
pub(crate) fn view(obj: &Bound<'_, PyAny>, l: &Layout) -> PyResult<ForeignTensor> {
    let mut shape = Vec::with_capacity(l.ndim);
    for (dim, &extent) in l.shape[..l.ndim].iter().enumerate() {
        let Ok(e) = usize::try_from(extent) else {
            // NumPy never makes one; the capsule path's error, should it.
            return Err(memarray_dlpack::DlpackError::NegativeShape {
                dim,
                extent,
                shape: l.shape[..l.ndim].to_vec(),
            })
            .py();
        };
        shape.push(e);
    }
    // SAFETY: NumPy's data spans its layout and lives while the array does, which the
    // owner keeps.
    unsafe {
        ForeignTensor::new(
            Place::Host,
            l.data as u64,
            0,
            l.dtype,
            shape,
            l.strides[..l.ndim].to_vec(),
            l.read_only,
            Box::new(obj.clone().unbind()),
        )
    }
    .py()
}

/// An array sharing the memory of `obj`, an exact `numpy.ndarray` of layout `l`, when it
/// can be shared as it is: writable, C-contiguous, non-empty and element-aligned. The
/// array owns a reference to `obj`. `None` for anything else: the tensor path decides (a
/// copy, or its error). This is `from_dlpack(x)`'s whole path for the common case: no
/// tensor, no checks it would only repeat.
pub(crate) fn share(obj: &Bound<'_, PyAny>, l: &Layout) -> Option<RawArray> {
    if l.read_only || !(l.data as usize).is_multiple_of(l.dtype.align()) {
        return None;
    }
    let mut shape = [0usize; MAX_NDIM];
    for (s, &e) in shape.iter_mut().zip(&l.shape[..l.ndim]) {
        *s = usize::try_from(e).ok().filter(|&e| e > 0)?;
    }
    let shape = &shape[..l.ndim];
    if !memarray_core::shape::is_c_contiguous(shape, &l.strides[..l.ndim]) {
        return None;
    }
    let nbytes = memarray_core::shape::checked_nbytes(shape, l.dtype.size()).ok()?;
    let ptr = NonNull::new(l.data.cast::<u8>())?;
    // SAFETY: NumPy's C-contiguous data is `nbytes` readable and writable bytes at `ptr`
    // (checked writable above), alive while the array is, which the owner keeps; NumPy
    // frees it only when the array goes.
    let host = unsafe {
        HostBuffer::from_foreign(
            ptr,
            nbytes,
            MemoryKind::Host,
            Box::new(obj.clone().unbind()),
        )
    };
    RawArray::from_host_buffer(l.dtype, shape, host, 0).ok()
}
