//! Maps Rust errors to Python exceptions through their [`ErrorKind`] (the classification
//! the C status codes use too), with the few finer spellings Python keeps.

use std::sync::atomic::{AtomicU64, Ordering};

use pyo3::exceptions::{
    PyBufferError, PyIndexError, PyMemoryError, PyOSError, PyRuntimeError, PyTypeError,
    PyValueError,
};
use pyo3::prelude::*;

use memarray_core::{CoreError, ErrorKind};
use memarray_cuda::{ArrayError, CudaError};
use memarray_dlpack::DlpackError;

pyo3::create_exception!(
    memarray,
    LockError,
    PyRuntimeError,
    "The array is locked by another holder (a `with a.get_dlpack(...)` block)."
);
pyo3::create_exception!(
    memarray,
    CudaUnavailableError,
    PyRuntimeError,
    "No usable CUDA driver or device on this machine."
);

pyo3::create_exception!(
    memarray,
    CaptureError,
    PyRuntimeError,
    "Work that a CUDA graph cannot replay was asked for on a stream being captured (a \
     pageable or staged host copy, a host wait; nothing was enqueued and the capture is \
     still valid), or a graph was launched after an array it uses moved (nothing was \
     launched)."
);

pyo3::create_exception!(
    memarray,
    OutOfMemoryError,
    PyMemoryError,
    "An allocation through memarray ran out of memory (a MemoryError). `report` says who \
     holds what: the bytes asked for, per library what it holds through memarray, \
     memarray's cache, what the driver says is used outside memarray, what relief and \
     spilling tried, the top allocation sites where a Tracking keeps stacks, and what to do \
     (`str(e.report)`, `e.report.to_dict()`, its HTML in a notebook)."
);

/// An [`OutOfMemoryError`] carrying its `report` (built by `memarray._oom`; an error
/// building it leaves `report` None, never another exception).
fn out_of_memory(msg: String) -> PyErr {
    let err = OutOfMemoryError::new_err(msg.clone());
    Python::try_attach(|py| {
        let report = py
            .import("memarray._oom")
            .and_then(|m| m.call_method1("report", (msg,)))
            .map(Bound::unbind)
            .unwrap_or_else(|_| py.None());
        let _ = err.value(py).setattr("report", report);
    });
    err
}

/// The Python exception of each [`ErrorKind`], the one classification the C status
/// codes map from too.
fn exception(kind: ErrorKind, msg: String) -> PyErr {
    match kind {
        ErrorKind::OutOfRange => PyIndexError::new_err(msg),
        ErrorKind::InvalidArgument => PyValueError::new_err(msg),
        ErrorKind::Dtype => PyTypeError::new_err(msg),
        ErrorKind::Locked => LockError::new_err(msg),
        ErrorKind::OutOfMemory => out_of_memory(msg),
        ErrorKind::Unavailable => CudaUnavailableError::new_err(msg),
        ErrorKind::Io => PyOSError::new_err(msg),
        _ => PyRuntimeError::new_err(msg),
    }
}

/// The name of the built-in Python exception of each [`ErrorKind`], for callers that
/// report errors as names without the GIL (the DLPack exchange API's allocator hands the
/// consumer a type name). memarray's own classes are named by their built-in base
/// (`LockError`, `CudaUnavailableError`: `RuntimeError`), which any consumer can raise.
pub fn builtin_exception_name(kind: ErrorKind) -> &'static str {
    match kind {
        ErrorKind::OutOfRange => "IndexError",
        ErrorKind::InvalidArgument => "ValueError",
        ErrorKind::Dtype => "TypeError",
        ErrorKind::OutOfMemory => "MemoryError",
        ErrorKind::Io => "OSError",
        _ => "RuntimeError",
    }
}

/// Converts a core error to its Python exception.
pub fn core_err(e: CoreError) -> PyErr {
    let msg = e.to_string();
    match e {
        // OSError(errno, message, path) is the subclass for the errno, as `open` raises
        // (FileNotFoundError for ENOENT).
        CoreError::Io {
            errno: Some(errno),
            path,
            ..
        } => PyOSError::new_err((errno, msg, path)),
        // A tensor whose layout memarray cannot address: the buffer protocols' exception.
        CoreError::Layout(_) => PyBufferError::new_err(msg),
        // In Python a lock is held by a block (`with a.get_dlpack(...)`, `with
        // a.device_view()`): the fix is the view it gave, or leaving it.
        CoreError::Locked {
            requested: None, ..
        } => LockError::new_err(format!(
            "{msg}: the array is held by a `with a.get_dlpack(...)` or `with a.device_view()` \
             block; inside it use the view that block gave, or leave the block first"
        )),
        e => exception(e.kind(), msg),
    }
}

/// The name of `obj`'s type, for error messages.
pub fn type_name(obj: &Bound<'_, PyAny>) -> String {
    obj.get_type()
        .name()
        .map(|n| n.to_string())
        .unwrap_or_default()
}

/// Converts a CUDA-layer error to its Python exception: its kind's, except that host
/// access to device data is a `BufferError` saying how to get the data, a foreign tensor
/// that cannot be imported as asked is a `BufferError`, and asking for device data or a
/// spill the array cannot give is a `ValueError`.
pub fn cuda_err(e: CudaError) -> PyErr {
    let msg = e.to_string();
    match e {
        CudaError::Core(c) => core_err(c),
        CudaError::Array(ArrayError::NotOnDevice { .. } | ArrayError::NotSpillable { .. }) => {
            PyValueError::new_err(msg)
        }
        CudaError::Array(ArrayError::NotShareable { .. } | ArrayError::ForeignMemory { .. }) => {
            PyBufferError::new_err(msg)
        }
        CudaError::Array(ArrayError::NotOnHost { location }) => PyBufferError::new_err(format!(
            "the data is on {location}; call move_memory(memarray.dlpack.kDLCPU) first, or \
             use to_numpy() for a copy"
        )),
        CudaError::Captured { .. } | CudaError::GraphArrayMoved { .. } => {
            CaptureError::new_err(msg)
        }
        e => exception(e.kind(), msg),
    }
}

/// Converts an NCCL error: a missing library or a failed call is RuntimeError (the
/// guide's distributed section), a CUDA-layer error maps as it always does.
pub fn nccl_err(e: memarray_cuda::nccl::NcclError) -> PyErr {
    use memarray_cuda::nccl::NcclError;
    match e {
        NcclError::Cuda(c) => cuda_err(c),
        other => exception(other.kind(), other.to_string()),
    }
}

/// Converts a DLPack error: a malformed or unusable tensor is a `BufferError` (the
/// buffer protocols' exception), other kinds map as everywhere.
pub fn dlpack_err(e: DlpackError) -> PyErr {
    match e {
        DlpackError::Core(c) => core_err(c),
        other => match other.kind() {
            ErrorKind::InvalidArgument => PyBufferError::new_err(other.to_string()),
            kind => exception(kind, other.to_string()),
        },
    }
}

/// `?`-friendly conversions.
pub trait IntoPyResult<T> {
    /// Maps the error to its Python exception.
    fn py(self) -> PyResult<T>;
}

impl<T> IntoPyResult<T> for Result<T, CoreError> {
    fn py(self) -> PyResult<T> {
        self.map_err(core_err)
    }
}
impl<T> IntoPyResult<T> for Result<T, memarray_cuda::nccl::NcclError> {
    fn py(self) -> PyResult<T> {
        self.map_err(nccl_err)
    }
}
impl<T> IntoPyResult<T> for Result<T, CudaError> {
    fn py(self) -> PyResult<T> {
        warn_parked();
        self.map_err(cuda_err)
    }
}

/// The parked-error count the last warning covered.
static WARNED: AtomicU64 = AtomicU64::new(0);

/// Warns (`RuntimeWarning`) about errors parked since the last warning: driver calls that
/// failed in a drop or a free path (`memarray_cuda::parked`), which
/// `memarray.cuda.check_errors()` raises. One atomic load when there is nothing new; only
/// on a thread that holds the GIL (never waits for it).
pub(crate) fn warn_parked() {
    let count = memarray_cuda::parked::parked_count();
    if count == WARNED.load(Ordering::Relaxed) {
        return;
    }
    if !crate::gil::held() {
        return; // the next call with the GIL warns
    }
    let before = WARNED.swap(count, Ordering::Relaxed);
    if before == count {
        return;
    }
    Python::attach(|py| {
        let kept = memarray_cuda::parked::kept();
        let shown: Vec<String> = kept.iter().take(3).map(|p| p.to_string()).collect();
        let msg = format!(
            "memarray: {} error(s) could not be reported where they happened (in a drop or a \
             free): {}{}; memarray.cuda.check_errors() raises the first",
            count - before,
            shown.join("; "),
            if kept.len() > shown.len() {
                "; ..."
            } else {
                ""
            }
        );
        // Under a filter that makes warnings errors, the warning comes back as an error
        // this mapping cannot raise: the errors stay kept for check_errors(), which does.
        let _ = PyErr::warn(
            py,
            &py.get_type::<pyo3::exceptions::PyRuntimeWarning>(),
            &std::ffi::CString::new(msg).unwrap_or_default(),
            1,
        );
    });
}
impl<T> IntoPyResult<T> for Result<T, DlpackError> {
    fn py(self) -> PyResult<T> {
        self.map_err(dlpack_err)
    }
}
