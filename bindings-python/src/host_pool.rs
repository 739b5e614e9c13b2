//! Host memory for the NumPy arrays memarray makes: `to_numpy()` of
//! 1 MiB and more takes a block from a caching pool of pageable memory instead of
//! `np.empty`. A block that was used before is already faulted in, so the copy into it
//! runs at the speed of a copy into an existing array (a fresh `np.empty` array's pages
//! fault in as the copy writes them: half the speed at 1 GiB on an H100 host). The NumPy
//! array owns its block through its base object (a [`HostBytes`]), which returns the
//! block to the pool when the array is collected. Fresh blocks of 2 MiB and more use
//! transparent huge pages where the kernel allows them (`HostResource` asks).
//!
//! `MEMARRAY_NUMPY_POOL` sets how many free bytes the pool keeps (a size such as `2GiB`,
//! the default; `0` turns the pool off: `np.empty` as before). `memarray.resources.
//! release_numpy_pool()` hands the cached blocks back to the system.

use crate::fork::Detach;
use std::ffi::{CStr, c_int, c_void};
use std::sync::{Arc, OnceLock};

use pyo3::exceptions::PyBufferError;
use pyo3::ffi;
use pyo3::prelude::*;

use memarray_core::{HostBuffer, HostResource, MemoryResource};
use memarray_cuda::resource::CachingPool;

/// Arrays from this size up come from the pool; smaller ones from `np.empty` (the
/// allocator's heap reuses their pages anyway).
pub const POOL_MIN_BYTES: usize = 1 << 20;

/// The pool's cap on cached (free) bytes when `MEMARRAY_NUMPY_POOL` is unset.
const DEFAULT_CACHE_BYTES: u64 = 2 << 30;

static POOL: OnceLock<Option<Arc<CachingPool>>> = OnceLock::new();

/// The pool, or None when `MEMARRAY_NUMPY_POOL=0` (or unparsable: then `import memarray`
/// has already said so; see [`check_env`]).
pub fn pool() -> Option<&'static Arc<CachingPool>> {
    POOL.get_or_init(|| {
        let cap = match memarray_cuda::env::bytes(POOL_ENV) {
            Ok(Some(v)) => v,
            Ok(None) => DEFAULT_CACHE_BYTES,
            // Refused at import (check_env): unreachable unless the value changed since.
            Err(_) => return None,
        };
        (cap > 0).then(|| {
            // Huge pages from 2 MiB up: HostResource asks for them.
            let upstream: Arc<dyn MemoryResource> = Arc::new(HostResource);
            Arc::new(CachingPool::host(
                upstream,
                usize::try_from(cap).unwrap_or(usize::MAX),
            ))
        })
    })
    .as_ref()
}

/// Checks `MEMARRAY_NUMPY_POOL` at import, so a bad value is an error naming it.
pub fn check_env() -> PyResult<()> {
    memarray_cuda::env::bytes(POOL_ENV)
        .map_err(|e| pyo3::exceptions::PyValueError::new_err(e.to_string()))?;
    Ok(())
}

const POOL_ENV: &str = "MEMARRAY_NUMPY_POOL";

/// A block of `nbytes` from the pool (contents unspecified), or None without a pool.
pub fn block(nbytes: usize) -> PyResult<Option<HostBytes>> {
    let Some(p) = pool() else {
        return Ok(None);
    };
    let resource: Arc<dyn MemoryResource> = p.clone();
    // SAFETY: the caller fills every byte before NumPy code can read them (to_numpy
    // copies the whole array in; on failure the block is dropped unseen).
    let buffer =
        unsafe { HostBuffer::uninit_in(nbytes, resource) }.map_err(crate::errors::core_err)?;
    Ok(Some(HostBytes::writable(buffer)))
}

/// The resource of host blocks Python code is handed (NumPy arrays, pickle snapshots): the
/// pool, or plain host memory without one.
pub fn resource() -> Arc<dyn MemoryResource> {
    match pool() {
        Some(p) => p.clone(),
        None => Arc::new(HostResource),
    }
}

/// Host memory handed to Python as a 1-d buffer of bytes, the one class for it: a
/// writable block a NumPy array from `to_numpy()` uses as its buffer (its base: back to
/// the pool when the array is collected), or read-only bytes shared with a snapshot (a
/// pickle's out-of-band payload).
#[pyclass(module = "memarray._memarray", frozen)]
pub struct HostBytes {
    buffer: Arc<HostBuffer>,
    readonly: bool,
}

impl HostBytes {
    /// A writable block that owns `buffer`.
    pub(crate) fn writable(buffer: HostBuffer) -> Self {
        Self {
            buffer: Arc::new(buffer),
            readonly: false,
        }
    }

    /// Read-only bytes of a shared buffer.
    pub(crate) fn read_only(buffer: Arc<HostBuffer>) -> Self {
        Self {
            buffer,
            readonly: true,
        }
    }
}

#[pymethods]
impl HostBytes {
    fn __len__(&self) -> usize {
        self.buffer.len()
    }

    /// A C-contiguous, 1-d buffer of unsigned bytes (read-only for shared bytes).
    unsafe fn __getbuffer__(
        slf: Bound<'_, Self>,
        view: *mut ffi::Py_buffer,
        flags: c_int,
    ) -> PyResult<()> {
        let this = slf.get();
        let (ptr, len, readonly) = (this.buffer.as_mut_ptr(), this.buffer.len(), this.readonly);
        // SAFETY: CPython's view; the buffer lives as long as `slf`, which the view holds.
        unsafe { fill_bytes_view(view, flags, slf.into_any(), ptr, len, readonly) }
    }

    unsafe fn __releasebuffer__(&self, _view: *mut ffi::Py_buffer) {}
}

/// Fills `view` as a C-contiguous, 1-d buffer of `len` unsigned bytes at `ptr`, owned
/// by `owner` (a strong reference the view keeps until CPython releases it); a writable
/// request on a `readonly` buffer is refused.
///
/// # Safety
/// `view` is null or the `Py_buffer` CPython passed to `__getbuffer__`; `ptr` holds
/// `len` bytes (writable unless `readonly`) for as long as `owner` lives.
pub(crate) unsafe fn fill_bytes_view(
    view: *mut ffi::Py_buffer,
    flags: c_int,
    owner: Bound<'_, PyAny>,
    ptr: *mut u8,
    len: usize,
    readonly: bool,
) -> PyResult<()> {
    if view.is_null() {
        return Err(PyBufferError::new_err("null Py_buffer"));
    }
    if readonly && flags & ffi::PyBUF_WRITABLE == ffi::PyBUF_WRITABLE {
        return Err(PyBufferError::new_err("the bytes are read-only"));
    }
    const FORMAT: &CStr = c"B";
    // SAFETY: view is CPython's (caller's contract); ndim 1: `shape` and `strides` point
    // at the view's own `len` and `itemsize` fields; `obj` keeps `owner` and so `ptr`.
    unsafe {
        (*view).buf = ptr.cast::<c_void>();
        (*view).len = len as ffi::Py_ssize_t;
        (*view).readonly = c_int::from(readonly);
        (*view).itemsize = 1;
        (*view).format = if flags & ffi::PyBUF_FORMAT != 0 {
            FORMAT.as_ptr().cast_mut()
        } else {
            std::ptr::null_mut()
        };
        (*view).ndim = 1;
        (*view).shape = if flags & ffi::PyBUF_ND == ffi::PyBUF_ND {
            &raw mut (*view).len
        } else {
            std::ptr::null_mut()
        };
        (*view).strides = if flags & ffi::PyBUF_STRIDES == ffi::PyBUF_STRIDES {
            &raw mut (*view).itemsize
        } else {
            std::ptr::null_mut()
        };
        (*view).suboffsets = std::ptr::null_mut();
        (*view).internal = std::ptr::null_mut();
        (*view).obj = owner.into_ptr();
    }
    Ok(())
}

/// Hands the NumPy block pool's cached blocks back to the system; returns the bytes
/// released (0 without a pool).
#[pyfunction]
pub fn release_numpy_pool(py: Python<'_>) -> u64 {
    match pool() {
        Some(p) => py.detach_section(|| p.release_cached()) as u64,
        None => 0,
    }
}

/// The NumPy block pool's bytes cached (free, faulted in) and used, and its hits and
/// misses, or None without a pool.
#[pyfunction]
pub fn numpy_pool_statistics(py: Python<'_>) -> PyResult<Option<Bound<'_, pyo3::types::PyDict>>> {
    let Some(p) = pool() else {
        return Ok(None);
    };
    let s = p.statistics();
    let d = pyo3::types::PyDict::new(py);
    d.set_item("cached_bytes", s.cached_bytes)?;
    d.set_item("used_bytes", s.used_bytes)?;
    d.set_item("hits", s.hits)?;
    d.set_item("misses", s.misses)?;
    Ok(Some(d))
}
