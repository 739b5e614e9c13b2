//! An exact `numpy.ndarray` read through its C struct, as NumPy's own C API macros
//! (`PyArray_DATA`, `PyArray_DIMS`, `PyArray_DESCR`) read it: no `__dlpack__` call and
//! no capsule, about half of a small `from_dlpack`'s cost. The fields read here have had
//! the same layout in every NumPy release since 1.7, 2.x included. Anything unusual
//! (a dtype memarray does not store, a foreign byte order, strides that are not whole
//! elements) is left to the `__dlpack__` path, which keeps NumPy's own rules.

use std::ffi::{c_char, c_int, c_long, c_void};
use std::ptr::NonNull;

use pyo3::ffi;
use pyo3::prelude::*;

use memarray_core::{DType, HostBuffer, MAX_NDIM, MemoryKind};
use memarray_cuda::array::RawArray;
use memarray_dlpack::ImportedTensor;

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
    descr: *const DescrHead,
    flags: c_int,
}

/// The head of NumPy's `PyArray_Descr` (the same in 1.x and 2.x up to `type_num`).
#[repr(C)]
struct DescrHead {
    ob_base: ffi::PyObject,
    typeobj: *mut ffi::PyTypeObject,
    kind: c_char,
    type_: c_char,
    byteorder: c_char,
    flags: c_char,
    type_num: c_int,
}

/// `NPY_ARRAY_WRITEABLE`.
const WRITEABLE: c_int = 0x0400;

/// The dtype of a builtin NumPy type number, checked against its kind character; `None`
/// for the rest (long double, objects, strings, user dtypes such as bfloat16).
fn dtype_of(type_num: c_int, kind: u8) -> Option<DType> {
    let (long, ulong) = if size_of::<c_long>() == 8 {
        (DType::I64, DType::U64)
    } else {
        (DType::I32, DType::U32)
    };
    let (dtype, expected_kind) = match type_num {
        0 => (DType::Bool, b'b'),
        1 => (DType::I8, b'i'),
        2 => (DType::U8, b'u'),
        3 => (DType::I16, b'i'),
        4 => (DType::U16, b'u'),
        5 => (DType::I32, b'i'),
        6 => (DType::U32, b'u'),
        7 => (long, b'i'),
        8 => (ulong, b'u'),
        9 => (DType::I64, b'i'),
        10 => (DType::U64, b'u'),
        11 => (DType::F32, b'f'),
        12 => (DType::F64, b'f'),
        14 => (DType::Complex64, b'c'),
        15 => (DType::Complex128, b'c'),
        23 => (DType::F16, b'f'),
        _ => return None,
    };
    (kind == expected_kind).then_some(dtype)
}

/// The layout of an exact ndarray, read from its fields: data, dtype, shape and strides
/// in elements, writability. `None` where the `__dlpack__` path must decide.
struct Layout {
    data: *mut c_char,
    dtype: DType,
    ndim: usize,
    shape: [i64; MAX_NDIM],
    strides: [i64; MAX_NDIM],
    read_only: bool,
}

fn layout(obj: &Bound<'_, PyAny>) -> Option<Layout> {
    // SAFETY: `obj` is an exact ndarray (callers), whose object starts with these fields;
    // they stay valid while we hold the GIL and a reference.
    let a = unsafe { &*obj.as_ptr().cast::<ArrayFields>() };
    // SAFETY: every ndarray has a descr.
    let d = unsafe { &*a.descr };
    let dtype = dtype_of(d.type_num, d.kind as u8)?;
    let native = if cfg!(target_endian = "little") {
        b'<'
    } else {
        b'>'
    };
    if !matches!(d.byteorder as u8, b'=' | b'|') && d.byteorder as u8 != native {
        return None;
    }
    let ndim = usize::try_from(a.nd).ok().filter(|&n| n <= MAX_NDIM)?;
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
            return None;
        }
        out.shape[i] = extent as i64;
        out.strides[i] = (stride / item) as i64;
    }
    Some(out)
}

/// The tensor of `obj`, an exact `numpy.ndarray` (the caller checked its type), read from
/// its fields and owning a reference to it; `None` when the `__dlpack__` path must decide.
///
/// # Errors
/// The import's own checks (misaligned data, negative or overlapping strides), as the
/// `__dlpack__` path raises them.
pub(crate) fn view(obj: &Bound<'_, PyAny>) -> PyResult<Option<ImportedTensor>> {
    let Some(l) = layout(obj) else {
        return Ok(None);
    };
    let owner: Box<dyn std::any::Any + Send> = Box::new(obj.clone().unbind());
    // SAFETY: shape and strides of equal length; NumPy's data spans its layout and lives
    // while the array does, which `owner` keeps.
    unsafe {
        ImportedTensor::from_host_view(
            l.data.cast::<c_void>(),
            l.dtype,
            &l.shape[..l.ndim],
            &l.strides[..l.ndim],
            l.read_only,
            owner,
        )
    }
    .py()
    .map(Some)
}

/// A MemArray sharing the memory of `obj`, an exact `numpy.ndarray` (the caller checked
/// its type), when it can be shared as it is: writable, C-contiguous, non-empty and
/// element-aligned, of a dtype memarray stores. The array owns a reference to `obj`.
/// `None` for anything else: the tensor path decides (a copy, or its error). This is
/// `from_dlpack(x)`'s whole path for the common case: no tensor, no checks it would
/// only repeat.
pub(crate) fn share(obj: &Bound<'_, PyAny>) -> Option<RawArray> {
    let l = layout(obj)?;
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
