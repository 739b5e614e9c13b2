//! Python stream arguments to [`StreamRef`]s.
//!
//! Accepted: an int handle (`torch.cuda.current_stream().cuda_stream`, CuPy's `ptr`), a
//! `memarray.cuda.Stream`, any object with the CUDA stream protocol `__cuda_stream__`
//! (returns `(version, handle)`: `cuda.core` streams, newer CuPy), or a torch / CuPy
//! stream object (its `cuda_stream` / `ptr`).

use crate::fork::Detach;
use pyo3::exceptions::{PyBufferError, PyTypeError, PyValueError};
use pyo3::prelude::*;

use memarray_core::Location;
use memarray_cuda::array::Consumer;
use memarray_cuda::{Event, Stream, StreamRef};

use crate::device::device_of;
use crate::errors::IntoPyResult;

pub(crate) fn handle_of(obj: &Bound<'_, PyAny>) -> PyResult<i64> {
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

pub(crate) fn from_handle(h: i64) -> PyResult<StreamRef> {
    let h = usize::try_from(h)
        .map_err(|_| PyValueError::new_err(format!("invalid stream handle {h}")))?;
    // SAFETY: a handle from Python is the caller's promise that the stream is live (as
    // with torch.cuda.ExternalStream); 1 and 2 are the default streams.
    unsafe { StreamRef::from_raw(h) }.py()
}

/// The `stream` argument of `move_memory` / `add_index_tuple`: None keeps the array's
/// choice; 0 means the legacy default stream, as in the original MemArray design.
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

/// An owned CUDA stream (non-blocking) on one device.
#[pyclass(name = "Stream", module = "memarray.cuda", frozen)]
pub struct PyStream {
    pub stream: Stream,
}

#[pymethods]
impl PyStream {
    #[new]
    #[pyo3(signature = (device_id=None))]
    fn new(device_id: Option<&Bound<'_, PyAny>>) -> PyResult<Self> {
        let device = device_of(device_id)?;
        Ok(Self {
            stream: Stream::new(&device).py()?,
        })
    }

    /// The raw `CUstream` handle as an int (what torch calls `cuda_stream`).
    #[getter]
    fn handle(&self) -> usize {
        self.stream.raw()
    }

    /// Alias of `handle`, as CuPy names it.
    #[getter]
    fn ptr(&self) -> usize {
        self.stream.raw()
    }

    /// Alias of `handle`, as torch names it.
    #[getter]
    fn cuda_stream(&self) -> usize {
        self.stream.raw()
    }

    /// The CUDA stream protocol: `(version, handle)`.
    fn __cuda_stream__(&self) -> (u32, usize) {
        (0, self.stream.raw())
    }

    /// Blocks until all work on the stream is done.
    fn synchronize(&self, py: Python<'_>) -> PyResult<()> {
        let s = &self.stream;
        py.detach_section(|| s.synchronize()).py()
    }

    /// Makes later work on this stream wait for `event` (no host block).
    fn wait_event(&self, event: &PyEvent) -> PyResult<()> {
        self.stream.wait(&event.event).py()
    }

    /// Records and returns a new event on this stream.
    fn record_event(&self) -> PyResult<PyEvent> {
        let event = Event::new(self.stream.device()).py()?;
        event.record(self.stream.as_ref()).py()?;
        Ok(PyEvent { event })
    }

    fn __repr__(&self) -> String {
        format!(
            "memarray.cuda.Stream(device_id={}, handle={:#x})",
            self.stream.device().id(),
            self.stream.raw()
        )
    }
}

/// A CUDA event.
#[pyclass(name = "Event", module = "memarray.cuda", frozen)]
pub struct PyEvent {
    pub event: Event,
}

#[pymethods]
impl PyEvent {
    #[new]
    #[pyo3(signature = (device_id=None, timing=false))]
    fn new(device_id: Option<&Bound<'_, PyAny>>, timing: bool) -> PyResult<Self> {
        let device = device_of(device_id)?;
        let event = if timing {
            Event::timed(&device)
        } else {
            Event::new(&device)
        }
        .py()?;
        Ok(Self { event })
    }

    /// Records the event on `stream` (int handle or Stream; default: legacy stream).
    #[pyo3(signature = (stream=None))]
    fn record(&self, stream: Option<&Bound<'_, PyAny>>) -> PyResult<()> {
        let s = crate::stream::parse_move_stream(stream)?.unwrap_or(StreamRef::legacy());
        self.event.record(s).py()
    }

    /// Blocks until the recorded work is done.
    fn synchronize(&self, py: Python<'_>) -> PyResult<()> {
        let e = &self.event;
        py.detach_section(|| e.synchronize()).py()
    }

    /// Whether the recorded work is done.
    fn query(&self) -> PyResult<bool> {
        self.event.is_complete().py()
    }

    /// Milliseconds from this event to `end` (both timed), as torch and CuPy order them:
    /// `start.elapsed_time(end)`.
    fn elapsed_time(&self, end: &PyEvent) -> PyResult<f32> {
        end.event.elapsed_ms(&self.event).py()
    }
}
