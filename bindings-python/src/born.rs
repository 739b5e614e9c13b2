//! `memarray.empty`, `zeros`, `full`: arrays born where they are used (issue 7), over
//! `RawArray::{empty_on, zeros_on, full_on}`. A device-born array has no host buffer
//! until its first move to the host; `zeros` there is a memset.

use pyo3::exceptions::{PyTypeError, PyValueError};
use pyo3::prelude::*;

use memarray_core::Location;
use memarray_cuda::array::{Fill, RawArray};

use crate::array::{KDLCPU, KDLCUDA, PyMemArray, host_kind_arg, parse_shape};
use crate::dtype::{parse_dtype, py_to_bytes};
use crate::errors::IntoPyResult;
use crate::stream::parse_move_stream;

/// Parses a `device=` argument: "cpu", "cuda", "cuda:N", an int N (cuda:N), a DLPack
/// `(device_type, id)` pair, or an object with `type` and `index` (torch.device).
pub(crate) fn parse_device(obj: Option<&Bound<'_, PyAny>>) -> PyResult<Location> {
    let Some(obj) = obj.filter(|o| !o.is_none()) else {
        return Ok(Location::Host);
    };
    let cuda = |id: i64| {
        u32::try_from(id)
            .map(Location::Device)
            .map_err(|_| PyValueError::new_err(format!("invalid CUDA device index {id}")))
    };
    if obj.is_instance_of::<pyo3::types::PyString>() {
        let s = crate::convert::text(obj, "device")?
            .trim()
            .to_ascii_lowercase();
        return match s.as_str() {
            "cpu" | "host" => Ok(Location::Host),
            "cuda" | "gpu" => Ok(Location::Device(0)),
            _ => match s.strip_prefix("cuda:").map(str::parse::<i64>) {
                Some(Ok(id)) => cuda(id),
                _ => Err(PyValueError::new_err(format!(
                    "unknown device {s:?}; use \"cpu\", \"cuda\", \"cuda:N\", an int N or \
                     (kDLCPU, 0) / (kDLCUDA, N)"
                ))),
            },
        };
    }
    if obj.is_instance_of::<pyo3::types::PyBool>() {
        return Err(PyTypeError::new_err("device must not be a bool"));
    }
    if obj.is_instance_of::<pyo3::types::PyInt>() || obj.hasattr("__index__")? {
        return Ok(Location::Device(crate::convert::int(obj, "device")?));
    }
    if let Ok(pair) = obj.cast::<pyo3::types::PyTuple>()
        && pair.len() == 2
    {
        let ty: i64 = crate::convert::int(&pair.get_item(0)?, "device type")?;
        let id: i64 = crate::convert::int(&pair.get_item(1)?, "device id")?;
        return match ty {
            KDLCPU => Ok(Location::Host),
            KDLCUDA => cuda(id),
            other => Err(PyValueError::new_err(format!(
                "unsupported DLPack device type {other}; memarray arrays live on kDLCPU (1) \
                 or kDLCUDA (2)"
            ))),
        };
    }
    if let (Ok(ty), Ok(index)) = (obj.getattr("type"), obj.getattr("index")) {
        let ty: String = crate::convert::text(&ty, "device.type")?;
        let index = crate::convert::opt_int::<i64>(Some(&index), "device.index")?;
        return match (ty.as_str(), index) {
            ("cpu", _) => Ok(Location::Host),
            ("cuda", id) => cuda(id.unwrap_or(0)),
            (other, _) => Err(PyValueError::new_err(format!(
                "unsupported device type {other:?}"
            ))),
        };
    }
    Err(PyTypeError::new_err(format!(
        "device must be a str, an int, a (device_type, id) pair or a torch.device, not {}",
        obj.get_type().name()?
    )))
}

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
        .detach(|| {
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

/// empty(shape, dtype=None, device="cpu", host_memory=None, stream=None, resource=None)
///
/// A new array on `device` only, contents unspecified on a device (zeros on the host).
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

/// zeros(shape, dtype=None, device="cpu", host_memory=None, stream=None, resource=None)
///
/// A zero-filled array on `device` only (a memset on a device, on `stream`).
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

/// full(shape, fill_value, dtype=None, device="cpu", host_memory=None, stream=None,
///      resource=None)
///
/// An array of `fill_value` (converted to `dtype` as element assignment converts) on
/// `device` only, filled there.
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

/// _device_pair(device) -> (device_type, device_id)
/// --
///
/// A `device=` argument ("cpu", "cuda", "cuda:N", an int, a DLPack pair, a torch.device)
/// as the DLPack pair it names, parsed as `empty(device=...)` parses it.
#[pyfunction]
pub fn _device_pair(device: Option<&Bound<'_, PyAny>>) -> PyResult<(i64, i64)> {
    Ok(crate::array::location_tuple(parse_device(device)?))
}

/// load(path, device="cpu", host_memory=None)
///
/// Reads a `.npy` file into a new array on `device` (read from the file straight there).
/// OSError for a missing, unreadable, in-use or non-regular file (or one that shrinks
/// while read), ValueError for a bad or short one.
#[pyfunction]
#[pyo3(signature = (path, device=None, host_memory=None))]
pub fn load(
    py: Python<'_>,
    path: &Bound<'_, PyAny>,
    device: Option<&Bound<'_, PyAny>>,
    host_memory: Option<&Bound<'_, PyAny>>,
) -> PyResult<PyMemArray> {
    let location = parse_device(device)?;
    let kind = host_kind_arg(host_memory)?;
    let path = crate::convert::path(path, "path")?;
    let raw = py
        .detach(|| RawArray::load_npy(&path, location, kind))
        .py()?;
    Ok(raw.into())
}
