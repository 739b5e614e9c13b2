//! `memarray.empty`, `zeros`, `full`: arrays born where they are used, over
//! `RawArray::{empty_on, zeros_on, full_on}`. A device-born array has no host buffer
//! until its first move to the host; `zeros` there is a memset.

use crate::fork::Detach;
use pyo3::prelude::*;

use std::sync::Arc;
use std::sync::atomic::{AtomicU64, Ordering};

use memarray_core::Location;
use memarray_cuda::array::{Fill, RawArray};

use crate::array::PyMemArray;
use crate::convert::{host_kind_arg, parse_shape};
use crate::device::parse_device;
use crate::dtype::{parse_dtype, py_to_bytes};
use crate::errors::IntoPyResult;
use crate::stream::parse_move_stream;

struct Args {
    resource: Option<std::sync::Arc<dyn memarray_core::MemoryResource>>,
    shape: Vec<usize>,
    dtype: memarray_core::DType,
    location: Location,
    host_kind: Option<memarray_cuda::HostKind>,
    stream: Option<memarray_cuda::StreamRef>,
}

fn args(
    shape: &Bound<'_, PyAny>,
    dtype: Option<&Bound<'_, PyAny>>,
    device: Option<&Bound<'_, PyAny>>,
    host_memory: Option<&Bound<'_, PyAny>>,
    stream: Option<&Bound<'_, PyAny>>,
    resource: Option<&Bound<'_, PyAny>>,
) -> PyResult<Args> {
    Ok(Args {
        resource: crate::resources::resource_arg(resource)?,
        shape: parse_shape(shape)?,
        dtype: parse_dtype(dtype)?,
        location: parse_device(device)?,
        host_kind: host_kind_arg(host_memory)?,
        stream: parse_move_stream(stream)?,
    })
}

/// The new array, made with the GIL released.
fn born(py: Python<'_>, a: Args, fill: Fill<'_>) -> PyResult<PyMemArray> {
    let raw = py
        .detach_section(|| {
            RawArray::born_with(
                a.dtype,
                &a.shape,
                a.location,
                fill,
                a.host_kind,
                a.resource,
                a.stream,
            )
        })
        .py()?;
    Ok(raw.into())
}

/// A new array on `device` only ("cpu" when None, "cuda", "cuda:N", an int, a DLPack
/// pair, a torch.device), contents unspecified on a device (zeros on the host).
/// `resource` (`memarray.resources`) gives the array its own memory source.
#[pyfunction]
#[pyo3(signature = (shape, dtype=None, device=None, host_memory=None, stream=None, resource=None))]
pub fn empty(
    py: Python<'_>,
    shape: &Bound<'_, PyAny>,
    dtype: Option<&Bound<'_, PyAny>>,
    device: Option<&Bound<'_, PyAny>>,
    host_memory: Option<&Bound<'_, PyAny>>,
    stream: Option<&Bound<'_, PyAny>>,
    resource: Option<&Bound<'_, PyAny>>,
) -> PyResult<PyMemArray> {
    born(
        py,
        args(shape, dtype, device, host_memory, stream, resource)?,
        Fill::Unset,
    )
}

/// A zero-filled array on `device` only (None: the host; a memset on a device, on
/// `stream`).
#[pyfunction]
#[pyo3(signature = (shape, dtype=None, device=None, host_memory=None, stream=None, resource=None))]
pub fn zeros(
    py: Python<'_>,
    shape: &Bound<'_, PyAny>,
    dtype: Option<&Bound<'_, PyAny>>,
    device: Option<&Bound<'_, PyAny>>,
    host_memory: Option<&Bound<'_, PyAny>>,
    stream: Option<&Bound<'_, PyAny>>,
    resource: Option<&Bound<'_, PyAny>>,
) -> PyResult<PyMemArray> {
    born(
        py,
        args(shape, dtype, device, host_memory, stream, resource)?,
        Fill::Zeros,
    )
}

/// An array of `fill_value` (converted to `dtype` as element assignment converts) on
/// `device` only (None: the host), filled there.
#[pyfunction]
#[allow(clippy::too_many_arguments)] // Python keyword arguments, as NumPy's full has
#[pyo3(signature = (shape, fill_value, dtype=None, device=None, host_memory=None, stream=None, resource=None))]
pub fn full(
    py: Python<'_>,
    shape: &Bound<'_, PyAny>,
    fill_value: &Bound<'_, PyAny>,
    dtype: Option<&Bound<'_, PyAny>>,
    device: Option<&Bound<'_, PyAny>>,
    host_memory: Option<&Bound<'_, PyAny>>,
    stream: Option<&Bound<'_, PyAny>>,
    resource: Option<&Bound<'_, PyAny>>,
) -> PyResult<PyMemArray> {
    let a = args(shape, dtype, device, host_memory, stream, resource)?;
    let value = py_to_bytes(fill_value, a.dtype)?;
    born(py, a, Fill::Value(&value))
}

/// Reads a `.npy` file into a new array on `device` (None: the host), read from the file
/// straight there.
/// OSError for a missing, unreadable, in-use or non-regular file (or one that shrinks
/// while read), ValueError for a bad or short one.
#[pyfunction]
#[pyo3(signature = (path, device=None, host_memory=None, _progress=None))]
pub fn load(
    py: Python<'_>,
    path: &Bound<'_, PyAny>,
    device: Option<&Bound<'_, PyAny>>,
    host_memory: Option<&Bound<'_, PyAny>>,
    _progress: Option<&Bound<'_, Progress>>,
) -> PyResult<PyMemArray> {
    let location = parse_device(device)?;
    let kind = host_kind_arg(host_memory)?;
    let path = crate::convert::path(path, "path")?;
    let done = Progress::counter(_progress);
    let raw = py
        .detach_section(|| RawArray::load_npy_counted(&path, location, kind, &done))
        .py()?;
    Ok(raw.into())
}

/// A byte counter a long `.npy` load or save advances while it runs, read from another
/// thread by memarray's progress bars (`memarray._progress`).
#[pyclass(frozen, name = "_Progress", module = "memarray")]
pub struct Progress(Arc<AtomicU64>);

impl Progress {
    /// The counter of `p`, or a fresh one that nobody reads.
    pub(crate) fn counter(p: Option<&Bound<'_, Progress>>) -> Arc<AtomicU64> {
        p.map_or_else(|| Arc::new(AtomicU64::new(0)), |p| p.get().0.clone())
    }
}

#[pymethods]
impl Progress {
    #[new]
    fn new() -> Self {
        Progress(Arc::new(AtomicU64::new(0)))
    }

    /// Bytes done so far.
    #[getter]
    fn done(&self) -> u64 {
        self.0.load(Ordering::Relaxed)
    }
}

// `.npy` save (load is above).
#[pymethods]
impl PyMemArray {
    /// Writes the current data to `path` as a `.npy` file that `numpy.load` reads (read
    /// back from the device in pieces when it is there); as `numpy.save`, `.npy` is
    /// appended to a path that does not end with it. GIL released.
    #[pyo3(signature = (path, _progress=None), text_signature = "($self, path)")]
    fn save(
        slf: &Bound<'_, Self>,
        path: &Bound<'_, PyAny>,
        _progress: Option<&Bound<'_, Progress>>,
    ) -> PyResult<()> {
        let py = slf.py();
        if _progress.is_none() {
            // A long save in an interactive session gets a bar: memarray._progress runs
            // this method again, with a counter, in a thread of its own.
            let nbytes = slf.get().peek(py, |raw| raw.nbytes());
            let helper = py.import("memarray._progress")?;
            if helper.call_method1("wanted", (nbytes,))?.is_truthy()? {
                helper.call_method1("save", (slf, path))?;
                return Ok(());
            }
        }
        let this = slf.get();
        let mut path = crate::convert::path(path, "path")?;
        // As `np.save`: `.npy` is appended to a name that does not end with it.
        if !path.as_os_str().as_encoded_bytes().ends_with(b".npy") {
            path.as_mut_os_string().push(".npy");
        }
        let done = Progress::counter(_progress);
        this.with_detached(py, |raw| raw.save_npy_counted(&path, None, &done))
            .py()
    }
}
