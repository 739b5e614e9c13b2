//! Byte ranges of an array, wherever its data lives: `_read_range` / `_write_range` over
//! `RawArray::read_range` / `write_range` (memarray-cuda's `array/host_access.rs`), for the
//! package's own chunked pipelines (`memarray.mpi` copies device data through two bounce
//! buffers with them; a spilled array is read and written in its host copy).

use pyo3::exceptions::PyValueError;
use pyo3::prelude::*;

use memarray_cuda::array::RawArray;

use crate::array::PyMemArray;
use crate::errors::IntoPyResult;

impl PyMemArray {
    /// Runs `f(raw, offset, addr, len)` with the GIL released over the C-contiguous buffer
    /// of `obj` (writable when `writable`), held for the call; ValueError for a bad offset
    /// or buffer, and a buffer that shares memory with the array is refused.
    fn with_range(
        &self,
        py: Python<'_>,
        offset: &Bound<'_, PyAny>,
        obj: &Bound<'_, PyAny>,
        writable: bool,
        f: impl FnOnce(&mut RawArray, usize, usize, usize) -> memarray_cuda::Result<()> + Send,
    ) -> PyResult<()> {
        let offset: usize = crate::convert::int(offset, "offset")?;
        let held = crate::held::HeldBuffer::get(obj, writable).ok_or_else(|| {
            PyValueError::new_err(if writable {
                "out must be a writable C-contiguous buffer"
            } else {
                "src must be a C-contiguous buffer"
            })
        })?;
        let (addr, n) = (held.addr(), held.len());
        self.with_detached(py, |raw| {
            if raw.host_overlaps(addr, n) {
                return Err(memarray_cuda::CudaError::InvalidArgument {
                    what: "a byte range copy",
                    detail: "the buffer shares memory with the array".into(),
                });
            }
            f(raw, offset, addr, n)
        })
        .py()
    }
}

#[pymethods]
impl PyMemArray {
    /// Copies the array's bytes `[offset, offset + len(out))` into `out` (any writable
    /// C-contiguous buffer), wherever the data lives; the GIL is released for the copy.
    /// Pieces of a device array through one reused host buffer (memarray.mpi's chunked
    /// staging). ValueError for a range past the end or an unusable buffer.
    fn _read_range(
        &self,
        py: Python<'_>,
        offset: &Bound<'_, PyAny>,
        out: &Bound<'_, PyAny>,
    ) -> PyResult<()> {
        self.with_range(py, offset, out, true, |raw, offset, addr, n| {
            // SAFETY: `with_range` holds the exporter's `n` writable bytes at `addr` alive
            // and unmoved for this call; they are not the array's (checked there).
            let bytes = unsafe { std::slice::from_raw_parts_mut(addr as *mut u8, n) };
            raw.read_range(offset, bytes, None)
        })
    }

    /// Writes the bytes of `src` (any C-contiguous buffer) at `[offset, offset + len(src))`
    /// of the array, wherever the data lives; the GIL is released for the copy.
    fn _write_range(
        &self,
        py: Python<'_>,
        offset: &Bound<'_, PyAny>,
        src: &Bound<'_, PyAny>,
    ) -> PyResult<()> {
        self.with_range(py, offset, src, false, |raw, offset, addr, n| {
            // SAFETY: as above, `n` readable bytes at `addr`, read before this returns.
            let bytes = unsafe { std::slice::from_raw_parts(addr as *const u8, n) };
            raw.write_range(offset, bytes, None)
        })
    }
}
