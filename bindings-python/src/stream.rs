//! Python stream arguments to [`StreamRef`]s.
//!
//! Accepted: an int handle (`torch.cuda.current_stream().cuda_stream`, CuPy's `ptr`), a
//! `memarray.cuda.Stream`, any object with the CUDA stream protocol `__cuda_stream__`
//! (returns `(version, handle)`: `cuda.core` streams, newer CuPy), or a torch / CuPy
//! stream object (its `cuda_stream` / `ptr`).

use pyo3::exceptions::{PyBufferError, PyTypeError, PyValueError};
use pyo3::prelude::*;

use memarray_core::Location;
use memarray_cuda::StreamRef;
use memarray_cuda::array::Consumer;

use crate::cuda::PyStream;
use crate::errors::IntoPyResult;

fn handle_of(obj: &Bound<'_, PyAny>) -> PyResult<i64> {
    if let Ok(s) = obj.cast::<PyStream>() {
        return Ok(s.get().stream.raw() as i64);
    }
    if obj.is_instance_of::<pyo3::types::PyInt>() {
        return crate::convert::int(obj, "stream");
    }
    if obj.hasattr("__cuda_stream__")? {
        return stream_protocol(obj);
    }
    for attr in ["cuda_stream", "ptr"] {
        if let Ok(h) = obj.getattr(attr).and_then(|h| h.extract::<i64>()) {
            return Ok(h);
        }
    }
    Err(PyTypeError::new_err(format!(
        "stream must be an int handle or a stream object (memarray.cuda.Stream, \
         torch.cuda.Stream, cupy.cuda.Stream, or any object with __cuda_stream__), not {}",
        obj.get_type().name()?
    )))
}

/// The CUDA stream protocol: `obj.__cuda_stream__()` returns `(version, handle)`, version 0
/// the only one defined. A non-tuple or non-int is a TypeError, another version or a
/// negative handle a ValueError.
fn stream_protocol(obj: &Bound<'_, PyAny>) -> PyResult<i64> {
    let got = obj.call_method0("__cuda_stream__")?;
    let (version, handle): (Bound<'_, PyAny>, Bound<'_, PyAny>) = got.extract().map_err(|_| {
        PyTypeError::new_err(format!(
            "__cuda_stream__() must return a (version, handle) tuple of ints, not {}",
            got.repr().map(|r| r.to_string()).unwrap_or_default()
        ))
    })?;
    let as_int = |v: &Bound<'_, PyAny>, what: &str| -> PyResult<i128> {
        if !v.is_instance_of::<pyo3::types::PyInt>() {
            return Err(PyTypeError::new_err(format!(
                "__cuda_stream__() {what} must be an int, not {}",
                v.get_type().name()?
            )));
        }
        v.extract::<i128>()
            .map_err(|_| PyValueError::new_err(format!("__cuda_stream__() {what} is out of range")))
    };
    let version = as_int(&version, "version")?;
    let handle = as_int(&handle, "handle")?;
    if version != 0 {
        return Err(PyValueError::new_err(format!(
            "unsupported __cuda_stream__ protocol version {version}; memarray understands \
             version 0"
        )));
    }
    i64::try_from(handle)
        .ok()
        .filter(|&h| h >= 0)
        .ok_or_else(|| PyValueError::new_err(format!("invalid __cuda_stream__ handle {handle}")))
}

fn from_handle(h: i64) -> PyResult<StreamRef> {
    let h = usize::try_from(h)
        .map_err(|_| PyValueError::new_err(format!("invalid stream handle {h}")))?;
    // SAFETY: a handle from Python is the caller's promise that the stream is live (as
    // with torch.cuda.ExternalStream); 1 and 2 are the default streams.
    unsafe { StreamRef::from_raw(h) }.py()
}

/// The `stream` argument of `move_memory` / `add_index_tuple`: None keeps the array's
/// choice; 0 means the legacy default stream, as in the seed.
pub fn parse_move_stream(obj: Option<&Bound<'_, PyAny>>) -> PyResult<Option<StreamRef>> {
    let Some(obj) = obj.filter(|o| !o.is_none()) else {
        return Ok(None);
    };
    match handle_of(obj)? {
        0 => Ok(Some(StreamRef::legacy())),
        h => from_handle(h).map(Some),
    }
}

/// The `stream` argument of `__dlpack__` (Array API semantics), checked before anything
/// moves: None, -1 (no synchronization) or a handle > 0; 0 is refused as ambiguous.
pub fn parse_dlpack_stream(obj: Option<&Bound<'_, PyAny>>) -> PyResult<Option<i64>> {
    let Some(o) = obj.filter(|o| !o.is_none()) else {
        return Ok(None);
    };
    let h: i64 = crate::convert::int(o, "stream")?;
    match h {
        0 => Err(PyValueError::new_err(
            "stream=0 is ambiguous and refused by the DLPack protocol; pass 1 (legacy \
             default), 2 (per-thread default) or a stream handle",
        )),
        h if h < -1 => Err(PyValueError::new_err(format!("invalid stream handle {h}"))),
        h => Ok(Some(h)),
    }
}

/// How the consumer of data at `at` synchronises, from a parsed `__dlpack__` stream: None
/// is the legacy default stream for device data and a host wait for host data; host data
/// takes no stream handle.
pub fn consumer_for(h: Option<i64>, at: Location) -> PyResult<Consumer> {
    match (at, h) {
        (_, Some(-1)) => Ok(Consumer::NoSync),
        (Location::Host, None) => Ok(Consumer::Host),
        (Location::Host, Some(h)) => Err(PyBufferError::new_err(format!(
            "stream {h} given for host data; __dlpack__ of CPU data takes stream=None or -1"
        ))),
        (Location::Device(_), None) => Ok(Consumer::Stream(StreamRef::legacy())),
        (Location::Device(_), Some(h)) => from_handle(h).map(Consumer::Stream),
    }
}
