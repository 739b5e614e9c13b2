//! Python stream arguments to [`StreamRef`]s.
//!
//! Accepted: an int handle (`torch.cuda.current_stream().cuda_stream`, CuPy's `ptr`), a
//! `memarray.cuda.Stream`, or a torch / CuPy stream object (its `cuda_stream` / `ptr`).

use pyo3::exceptions::{PyBufferError, PyTypeError, PyValueError};
use pyo3::prelude::*;

use memarray_core::Location;
use memarray_cuda::StreamRef;
use memarray_cuda::array::Consumer;

use crate::cuda::PyStream;
use crate::errors::IntoPyResult;

fn handle_of(obj: &Bound<'_, PyAny>) -> PyResult<i64> {
    if let Ok(s) = obj.cast::<PyStream>() {
        return Ok(s.borrow().stream.raw() as i64);
    }
    if let Ok(h) = obj.extract::<i64>() {
        return Ok(h);
    }
    for attr in ["cuda_stream", "ptr"] {
        if let Ok(h) = obj.getattr(attr).and_then(|h| h.extract::<i64>()) {
            return Ok(h);
        }
    }
    Err(PyTypeError::new_err(format!(
        "stream must be an int handle or a stream object (memarray.cuda.Stream, \
         torch.cuda.Stream, cupy.cuda.Stream), not {}",
        obj.get_type().name()?
    )))
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
    let h = o.extract::<i64>().map_err(|_| {
        PyTypeError::new_err(format!(
            "__dlpack__ stream must be None or an int, not {}",
            o.get_type()
                .name()
                .map(|n| n.to_string())
                .unwrap_or_default()
        ))
    })?;
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
