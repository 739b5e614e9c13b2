//! NumPy in and out: `read_numpy_array`, `to_numpy` (with `out=`), `__array__`. Copies run
//! with the GIL released; NumPy arrays passed in are read through a plain `ndarray` view,
//! never through a subclass's own properties.
//!
//! And the NumPy fast path of imports ([`layout`], [`share`], [`view`]): an exact
//! `numpy.ndarray` read through its C struct, as NumPy's own C API macros
//! (`PyArray_DATA`, `PyArray_DIMS`, `PyArray_DESCR`) read it: no `__dlpack__` call and
//! no capsule, about half of a small `from_dlpack`'s cost. The fields read here have had
//! the same layout in every NumPy release since 1.7, 2.x included. The dtype is NumPy's
//! own builtin dtype object, known by identity ([`crate::dtype::numpy_dtype_of`]).
//! Anything else (a dtype memarray does not store, a foreign byte order, strides that
//! are not whole elements) is left to the `__dlpack__` path, which keeps NumPy's rules.
//! `dlpack::take_numpy` (`from_dlpack`, `move_many`, `asarray`) is its caller.

use std::ffi::{c_char, c_int};
use std::ptr::NonNull;

use pyo3::exceptions::{PyTypeError, PyValueError};
use pyo3::ffi;
use pyo3::prelude::*;
use pyo3::types::PyTuple;

use memarray_core::{
    DType, ForeignTensor, HostBuffer, Location, LockToken, MAX_NDIM, MemoryKind, Place,
};
use memarray_cuda::array::RawArray;

use crate::array::PyMemArray;
use crate::convert;
use crate::dtype::numpy_dtype;
use crate::errors::IntoPyResult;

impl PyMemArray {
    /// A NumPy copy of the current data, read with `token`. The NumPy array is made
    /// first (Python), then filled with the GIL released; a swap in between that changed
    /// the dtype or shape makes it start over.
    pub(crate) fn to_numpy_with<'py>(
        &self,
        py: Python<'py>,
        token: Option<LockToken>,
        out: Option<&Bound<'py, PyAny>>,
    ) -> PyResult<Bound<'py, PyAny>> {
        let np = py.import("numpy")?;
        loop {
            let (dtype, shape) = self.layout(py);
            // For `out`, everything is read from a plain ndarray view of it: a subclass's
            // own `shape`, `dtype` or `flags` may lie.
            let nbytes = shape.iter().product::<usize>() * dtype.size();
            let dest = match out {
                Some(o) => check_out_array(py, o, dtype, &shape)?,
                // 1 MiB and up: a block from the pool of faulted-in host memory, owned by
                // the NumPy array (its base), returned to the pool when it is collected.
                None if nbytes >= crate::host_pool::POOL_MIN_BYTES
                    && let Some(block) = crate::host_pool::block(nbytes)? =>
                {
                    np.getattr("frombuffer")?
                        .call1((Bound::new(py, block)?, numpy_dtype(py, dtype)?))?
                        .call_method1("reshape", (PyTuple::new(py, &shape)?,))?
                }
                None => np
                    .getattr("empty")?
                    .call1((PyTuple::new(py, &shape)?, numpy_dtype(py, dtype)?))?,
            };
            // Held across the copy: NumPy cannot resize or free the memory meanwhile.
            let (held, addr) = numpy_view(&dest, true, dtype, &shape)?;
            if held.is_none() && out.is_some() {
                // No writable C-contiguous view (or a dtype views cannot describe): say
                // which, or go on with the `__array_interface__` address.
                check_out_flags(&dest)?;
            }
            let has_out = out.is_some();
            let done = self.with_detached(py, |raw| {
                if raw.dtype() != dtype || raw.shape() != shape {
                    return None;
                }
                if has_out && raw.host_overlaps(addr, raw.nbytes()) {
                    return Some(Err(memarray_cuda::CudaError::InvalidArgument {
                        what: "to_numpy(out=...)",
                        detail: "out shares memory with the array".into(),
                    }));
                }
                // SAFETY: `dest` is a C-contiguous, writeable array of this dtype and
                // shape (nbytes bytes at addr): a fresh one no other code has seen, or the
                // caller's `out`, checked above and held alive by the caller; its bytes
                // are written as NumPy's own copyto would.
                let bytes =
                    unsafe { std::slice::from_raw_parts_mut(addr as *mut u8, raw.nbytes()) };
                Some(raw.read_all(bytes, token))
            });
            if let Some(r) = done {
                r.py()?;
                return Ok(out.cloned().unwrap_or(dest));
            }
        }
    }
}

#[pymethods]
impl PyMemArray {
    /// Overwrites the array with `array` (any layout; cast to this dtype as NumPy's
    /// astype does). The shape must match exactly; on any error the array is unchanged.
    /// The copy runs with the GIL released.
    fn read_numpy_array(&self, py: Python<'_>, array: &Bound<'_, PyAny>) -> PyResult<()> {
        self.peek(py, |raw| raw.check(None)).py()?;
        let np = py.import("numpy")?;
        let src = np.getattr("asarray")?.call1((array,))?;
        let src_shape: Vec<usize> = src.getattr("shape")?.extract()?;
        loop {
            let (dtype, shape) = self.layout(py);
            if src_shape != shape {
                return Err(PyValueError::new_err(format!(
                    "shape mismatch: MemArray has shape {shape:?}, the array has shape \
                     {src_shape:?}"
                )));
            }
            let mut c = np
                .getattr("ascontiguousarray")?
                .call1((&src, numpy_dtype(py, dtype)?))?;
            loop {
                let (_held, addr) = numpy_view(&c, false, dtype, &shape)?;
                let done = self.with_detached(py, |raw| {
                    if raw.dtype() != dtype || raw.shape() != shape {
                        return Overlap::Changed; // swapped meanwhile: convert again
                    }
                    if raw.location() == Location::Host && raw.host_overlaps(addr, raw.nbytes()) {
                        // The same bytes (`np.asarray(a)`): nothing to copy, no aliasing
                        // slices. Other overlapping ranges (a view shifted within this
                        // array's memory) are copied apart first.
                        return match raw.host_addr() == Some(addr) {
                            true => Overlap::Done(raw.check(None)),
                            false => Overlap::Partial,
                        };
                    }
                    // SAFETY: `c` is a C-contiguous NumPy array of this dtype and shape, so
                    // it holds exactly nbytes bytes at addr, alive while `c` is (held above).
                    let bytes =
                        unsafe { std::slice::from_raw_parts(addr as *const u8, raw.nbytes()) };
                    Overlap::Done(raw.write_all(bytes, None))
                });
                match done {
                    Overlap::Done(r) => return r.py(),
                    Overlap::Changed => break,
                    Overlap::Partial => c = c.call_method0("copy")?,
                }
            }
        }
    }

    /// A NumPy copy of the current data (read from the device when it is there), made
    /// with the GIL released.
    #[pyo3(signature = (out=None))]
    fn to_numpy<'py>(
        &self,
        py: Python<'py>,
        out: Option<&Bound<'py, PyAny>>,
    ) -> PyResult<Bound<'py, PyAny>> {
        self.to_numpy_with(py, None, out)
    }

    /// `np.asarray(a)` falls back here when the buffer protocol cannot serve (bfloat16, a
    /// lock held elsewhere, data on a device): a copy for bfloat16 host data, otherwise the
    /// reason as an exception, never a silent object array.
    #[pyo3(signature = (dtype=None, copy=None))]
    fn __array__<'py>(
        slf: &Bound<'py, Self>,
        dtype: Option<&Bound<'py, PyAny>>,
        copy: Option<bool>,
    ) -> PyResult<Bound<'py, PyAny>> {
        let py = slf.py();
        let this = slf.get();
        let (loc, dt) = this
            .peek(py, |raw| {
                raw.check(None).map(|()| (raw.location(), raw.dtype()))
            })
            .py()?;
        if let Location::Device(id) = loc {
            if copy == Some(false) {
                return Err(PyValueError::new_err(format!(
                    "the data is on cuda:{id}: a NumPy view would need a copy (copy=False)"
                )));
            }
            return Err(PyTypeError::new_err(format!(
                "the data is on cuda:{id}; call move_memory(memarray.dlpack.kDLCPU) or \
                 to_numpy() to copy it to the host explicitly"
            )));
        }
        // NumPy 2's protocol: copy=False must return a view or raise ValueError; a dtype
        // other than the array's is a conversion, which is a copy.
        let np = py.import("numpy")?;
        let want = match dtype.filter(|d| !d.is_none()) {
            Some(d) => {
                if d.is_instance_of::<pyo3::types::PyString>() {
                    convert::text(d, "dtype")?;
                }
                Some(np.getattr("dtype")?.call1((d,))?)
            }
            None => None,
        };
        let own = numpy_dtype(py, dt)?;
        let converts = match &want {
            Some(w) => !w.eq(&own)?,
            None => false,
        };
        if copy == Some(false) && converts {
            return Err(PyValueError::new_err(format!(
                "a {} view of this {} array would need a copy (copy=False); pass copy=None",
                want.map(|w| w.to_string()).unwrap_or_default(),
                dt.name()
            )));
        }
        let out = if dt == DType::BF16 {
            if copy == Some(false) {
                return Err(PyValueError::new_err(
                    "bfloat16 arrays have no zero-copy NumPy view; pass copy=None or True",
                ));
            }
            this.to_numpy(py, None)?
        } else {
            let mv = pyo3::types::PyMemoryView::from(slf.as_any())?;
            let view = np.getattr("asarray")?.call1((mv,))?;
            if copy == Some(true) && !converts {
                view.call_method0("copy")?
            } else {
                view
            }
        };
        match want.filter(|_| converts) {
            Some(w) => out.call_method1("astype", (w,)),
            None => Ok(out),
        }
    }
}

/// What `read_numpy_array` found when it went to copy.
enum Overlap {
    /// Copied (or the source is the array itself).
    Done(memarray_cuda::Result<()>),
    /// The array's dtype or shape changed meanwhile.
    Changed,
    /// The source overlaps the array's memory without being it: copy it apart first.
    Partial,
}

/// A held C-contiguous view of the NumPy array `a` (of `dtype` and `shape`) and its data
/// address; the address from `__array_interface__` (no view) where the buffer protocol
/// cannot describe the dtype (bfloat16).
fn numpy_view<'py>(
    a: &Bound<'py, PyAny>,
    writable: bool,
    dtype: DType,
    shape: &[usize],
) -> PyResult<(Option<crate::held::HeldBuffer<'py>>, usize)> {
    let held = crate::held::HeldBuffer::get(a, writable);
    let addr = match &held {
        Some(b) => b.addr(),
        None => crate::numpy_data_ptr(a)?,
    };
    let want = shape.iter().product::<usize>() * dtype.size();
    if let Some(b) = &held
        && b.len() != want
    {
        return Err(PyValueError::new_err(format!(
            "the NumPy buffer holds {} bytes, not the {want} its shape and dtype need",
            b.len()
        )));
    }
    Ok((held, addr))
}

/// `out` for `to_numpy(out=...)` as a plain `numpy.ndarray` view of its memory (so no
/// subclass property is consulted), checked to be of exactly this dtype and shape (a
/// ValueError or TypeError naming what differs otherwise); writability and contiguity
/// come with its buffer view ([`check_out_flags`] where there is none).
fn check_out_array<'py>(
    py: Python<'py>,
    out: &Bound<'py, PyAny>,
    dtype: DType,
    shape: &[usize],
) -> PyResult<Bound<'py, PyAny>> {
    let ndarray = crate::dtype::ndarray_type(py)?;
    if !out.is_instance(ndarray)? {
        return Err(PyTypeError::new_err(format!(
            "out must be a numpy.ndarray, not {}",
            out.get_type().name()?
        )));
    }
    // ndarray.view itself (not an override) with the base type: the real memory, shape,
    // dtype and flags.
    let out = &ndarray.getattr("view")?.call1((out, ndarray))?;
    let want = numpy_dtype(py, dtype)?;
    let got = out.getattr(pyo3::intern!(py, "dtype"))?;
    if !got.eq(&want)? {
        return Err(PyValueError::new_err(format!(
            "out has dtype {got}, the array {want}"
        )));
    }
    let got_shape: Vec<usize> = out.getattr(pyo3::intern!(py, "shape"))?.extract()?;
    if got_shape != shape {
        return Err(PyValueError::new_err(format!(
            "out has shape {got_shape:?}, the array {shape:?}"
        )));
    }
    Ok(out.clone())
}

/// Why `out` cannot be written as one C-contiguous block, if it cannot.
fn check_out_flags(out: &Bound<'_, PyAny>) -> PyResult<()> {
    let flags = out.getattr("flags")?;
    if !flags.getattr("c_contiguous")?.extract::<bool>()? {
        return Err(PyValueError::new_err("out must be C-contiguous"));
    }
    if !flags.getattr("writeable")?.extract::<bool>()? {
        return Err(PyValueError::new_err("out is read-only"));
    }
    Ok(())
}

// ---- the NumPy fast path of imports ----

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
