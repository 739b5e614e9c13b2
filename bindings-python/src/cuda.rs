//! `memarray.cuda`: availability, streams, events, and the CUDA Array Interface both ways
//! (its import parses the dict into a `ForeignTensor` for memarray-cuda's one import,
//! which DLPack tensors take too).

use crate::fork::Detach;

use pyo3::exceptions::{PyBufferError, PyTypeError, PyValueError};
use pyo3::intern;
use pyo3::prelude::*;
use pyo3::sync::PyOnceLock;
use pyo3::types::{PyDict, PyString, PyTuple};

use memarray_core::{DType, ForeignTensor, Location, Place};
use memarray_cuda::StreamRef;

use crate::array::PyMemArray;
use crate::convert;
use crate::device::device_of;
use crate::errors::IntoPyResult;
use crate::stream::{PyEvent, PyStream};

/// Whether a CUDA driver and at least one device are usable.
#[pyfunction]
fn is_available() -> bool {
    memarray_cuda::is_available()
}

/// Why CUDA is unusable, or None when it is usable.
#[pyfunction]
fn unavailable_reason() -> Option<String> {
    match memarray_cuda::device_count() {
        Ok(n) if n > 0 => None,
        Ok(_) => Some("the driver reports no CUDA device".into()),
        Err(e) => Some(e.to_string()),
    }
}

/// Number of CUDA devices (CudaUnavailableError without a driver).
#[pyfunction]
fn device_count() -> PyResult<u32> {
    memarray_cuda::device_count().py()
}

/// The calling thread's current CUDA device: CUDA's current context on this thread, which
/// `set_device`, `with memarray.cuda.device(n):`, `torch.cuda.set_device(n)` and CuPy's
/// `Device(n).use()` all set, so they agree; when none was set, the process default
/// (`set_default_device`; 0, as torch answers, unless changed). `"cuda"` and an unset
/// device in creation functions (`zeros(..., device="cuda")`, `MemArray(...)`) mean this
/// device.
#[pyfunction]
fn current_device() -> PyResult<u32> {
    Ok(memarray_cuda::current_device()
        .py()?
        .unwrap_or_else(memarray_cuda::default_device))
}

/// Makes `device` (an int N or "cuda:N") the device of every thread of this process that
/// has not chosen one (no current context): what a worker process serving one GPU of
/// several sets once, so its task threads' `"cuda"` is that GPU. Threads that set a device
/// keep theirs. ValueError for a device that does not exist.
#[pyfunction]
fn set_default_device(device: &Bound<'_, PyAny>) -> PyResult<()> {
    let id = cuda_ordinal(device, "set_default_device")?;
    memarray_cuda::set_default_device(id).py()
}

/// Raises the first error memarray could not report where it happened (a driver call that
/// failed while an array, buffer, event or module was dropped or freed), naming where and
/// how many others there were, and forgets them; returns None when there was none.
/// memarray also warns (`RuntimeWarning`) at its next call after such an error.
#[pyfunction]
fn check_errors() -> PyResult<()> {
    memarray_cuda::parked::check().py()
}

/// Parks an error as a failing free would (tests of the warning and `check_errors`).
#[pyfunction]
fn _park_for_test() {
    memarray_cuda::parked::park(
        "a test's injected free",
        memarray_cuda::CudaError::InvalidArgument {
            what: "test",
            detail: "injected".into(),
        },
    );
}

/// The device of threads that have not chosen one (`set_default_device`; 0 unless set).
#[pyfunction]
fn default_device() -> u32 {
    memarray_cuda::default_device()
}

/// The ordinal of a CUDA device argument (an int N or "cuda:N"); ValueError for the host.
fn cuda_ordinal(device: &Bound<'_, PyAny>, verb: &str) -> PyResult<u32> {
    match crate::device::parse_device(Some(device))? {
        Location::Device(id) => Ok(id),
        Location::Host => Err(PyValueError::new_err(format!(
            "{verb} takes a CUDA device (an int N or \"cuda:N\"), not the host"
        ))),
    }
}

/// Makes `device` (an int N or "cuda:N") the calling thread's current CUDA device (its
/// primary context current, as `cudaSetDevice` does). ValueError for a device that does
/// not exist, TypeError for a host device.
#[pyfunction]
fn set_device(device: &Bound<'_, PyAny>) -> PyResult<()> {
    let id = cuda_ordinal(device, "set_device")?;
    memarray_cuda::Device::get(id).py()?.make_current().py()
}

/// The device of the context current on the calling thread, None when none is.
#[pyfunction]
fn _current_context_device() -> PyResult<Option<u32>> {
    memarray_cuda::current_device().py()
}

/// Leaves no CUDA context current on the calling thread (what `with device(n):` restores
/// when none was current before it).
#[pyfunction]
fn _clear_device() -> PyResult<()> {
    memarray_cuda::device::clear_current().py()
}

/// Blocks until all work on `device_id` (default 0) is done.
#[pyfunction]
#[pyo3(signature = (device_id=None))]
fn synchronize(py: Python<'_>, device_id: Option<&Bound<'_, PyAny>>) -> PyResult<()> {
    let d = device_of(device_id)?;
    py.detach_section(|| d.synchronize()).py()
}

static TYPESTRS: PyOnceLock<Vec<Py<PyString>>> = PyOnceLock::new();

/// Whether CUDA Array Interface imports order after the producer's stream
/// (`MEMARRAY_CUDA_ARRAY_INTERFACE_SYNC`, a switch: an off word turns it off; any value
/// not understood is a ValueError naming the variable, checked at import).
pub(crate) fn cai_sync() -> PyResult<bool> {
    let v = memarray_cuda::env::switch("MEMARRAY_CUDA_ARRAY_INTERFACE_SYNC")
        .map_err(|e| PyValueError::new_err(e.to_string()))?;
    Ok(v.unwrap_or(true))
}

/// The CUDA Array Interface v3 dict of device-resident data. Keys and typestrs are
/// interned: this is on the hot path of every CuPy / Numba / torch.as_tensor call.
pub fn cuda_array_interface<'py>(
    py: Python<'py>,
    arr: &PyMemArray,
) -> PyResult<Bound<'py, PyDict>> {
    // Nothing here blocks the host: the array is read without releasing the GIL unless
    // another thread is in a call on it.
    if arr.peek(py, |raw| raw.is_spilled()) {
        // Spilled: back to the device first (a copy; may spill others).
        arr.with_detached(py, |raw| raw.restore(None, false, None))
            .py()?;
    }
    let (buf, dtype, shape, stream) = arr.peek(py, |raw| -> PyResult<_> {
        let Location::Device(_) = raw.location() else {
            return Err(pyo3::exceptions::PyAttributeError::new_err(
                "__cuda_array_interface__ exists only while the data is on a CUDA device; \
                 call move_memory(memarray.dlpack.kDLCUDA) first",
            ));
        };
        let buf = raw.device_buffer(None).py()?;
        let stream = raw.pending_stream().py()?.map(|s| s.raw());
        Ok((buf, raw.dtype(), raw.shape().to_vec(), stream))
    })?;
    let ptr = buf.device_ptr();
    {
        let mut pins = arr.cai_pins.lock().unwrap_or_else(|e| e.into_inner());
        if !pins.iter().any(|p| std::sync::Arc::ptr_eq(p, &buf)) {
            pins.push(buf);
        }
    }
    let typestrs = TYPESTRS.get_or_init(py, || {
        DType::ALL
            .iter()
            .map(|d| PyString::intern(py, d.typestr()).unbind())
            .collect()
    });
    let typestr = typestrs
        .get(dtype.index())
        .ok_or_else(|| PyTypeError::new_err(format!("no typestr for dtype {dtype}")))?;
    let d = PyDict::new(py);
    d.set_item(intern!(py, "version"), 3)?;
    d.set_item(intern!(py, "shape"), PyTuple::new(py, shape)?)?;
    d.set_item(intern!(py, "typestr"), typestr.bind(py))?;
    d.set_item(intern!(py, "data"), (ptr, false))?;
    d.set_item(intern!(py, "strides"), py.None())?;
    // The stream of pending work (never 0), or None when nothing is pending.
    d.set_item(intern!(py, "stream"), stream)?;
    Ok(d)
}

/// The staged-copy settings for pageable host memory, per direction (`"to_device"`,
/// `"to_host"`): `threads` (host threads per copy), `chunk_bytes` (pinned slot size),
/// `direct_below` (smaller copies go straight to the driver), `lane_min` (fewest bytes
/// a thread is given: short copies use fewer threads) and `short_below` (smaller copies
/// take the short path: threads only copy host memory, one thread issues the DMA).
#[pyfunction]
fn staging_config(py: Python<'_>) -> PyResult<Bound<'_, PyDict>> {
    let out = PyDict::new(py);
    for (name, dir) in DIRECTIONS {
        let c = memarray_cuda::copy::staged::config(dir).py()?;
        let d = PyDict::new(py);
        d.set_item("threads", c.threads)?;
        d.set_item("chunk_bytes", c.chunk_bytes)?;
        d.set_item("direct_below", c.direct_below)?;
        d.set_item("lane_min", c.lane_min)?;
        d.set_item("short_below", c.short_below)?;
        out.set_item(name, d)?;
    }
    Ok(out)
}

/// How often host buffers that were to be pinned (staging slots, `move_many`'s packing
/// buffer, automatic host copies, spill copies) came from pageable memory because pinning
/// failed (the system's limit or `MEMARRAY_PINNED_LIMIT`'s): `{"count": ..., "bytes": ...}`
/// since the process started. Needs no device.
#[pyfunction]
fn pinned_fallbacks(py: Python<'_>) -> PyResult<Bound<'_, PyDict>> {
    let f = memarray_cuda::resource::pinned_fallbacks();
    let d = PyDict::new(py);
    d.set_item("count", f.count)?;
    d.set_item("bytes", f.bytes)?;
    Ok(d)
}

/// `device_id`'s (default 0) engine for many small copies on the device (packing many
/// arrays into one allocation): `{"kernel_max": bytes or None, "source":
/// "measured" | "env" | "default" | "no kernel", "trial": [(bytes, kernel_us, driver_us),
/// ...]}`. The limit is measured on first use per device (a few milliseconds) unless
/// `MEMARRAY_COPY_KERNEL_MAX` or `MEMARRAY_COPY_KERNEL=0` decide it.
#[pyfunction]
#[pyo3(signature = (device_id=None))]
fn copy_engine<'py>(
    py: Python<'py>,
    device_id: Option<&Bound<'py, PyAny>>,
) -> PyResult<Bound<'py, PyDict>> {
    use memarray_cuda::copy::many::{LimitSource, tuning};
    let d = device_of(device_id)?;
    let t = py.detach_section(|| tuning(&d)).py()?;
    let out = PyDict::new(py);
    out.set_item("kernel_max", t.kernel_max)?;
    out.set_item(
        "source",
        match t.source {
            LimitSource::Measured => "measured",
            LimitSource::Env => "env",
            LimitSource::Default => "default",
            LimitSource::NoKernel => "no kernel",
        },
    )?;
    out.set_item("trial", t.trial)?;
    Ok(out)
}

const DIRECTIONS: [(&str, memarray_cuda::copy::staged::Direction); 2] = [
    (
        "to_device",
        memarray_cuda::copy::staged::Direction::ToDevice,
    ),
    ("to_host", memarray_cuda::copy::staged::Direction::ToHost),
];

/// Changes the staged-copy settings of `direction` ("to_device", "to_host" or "both", the
/// default);
/// those not given stay. Out-of-range values raise ValueError and change nothing.
#[pyfunction]
#[pyo3(signature = (direction=None, threads=None, chunk_bytes=None, direct_below=None, lane_min=None, short_below=None))]
fn set_staging_config(
    direction: Option<&Bound<'_, PyAny>>,
    threads: Option<&Bound<'_, PyAny>>,
    chunk_bytes: Option<&Bound<'_, PyAny>>,
    direct_below: Option<&Bound<'_, PyAny>>,
    lane_min: Option<&Bound<'_, PyAny>>,
    short_below: Option<&Bound<'_, PyAny>>,
) -> PyResult<()> {
    use memarray_cuda::copy::staged::{Direction, StagingConfig, config, set_config};
    let direction = match direction.filter(|d| !d.is_none()) {
        Some(d) => convert::text(d, "direction")?,
        None => "both".into(),
    };
    let threads: Option<usize> = convert::opt_int(threads, "threads")?;
    let chunk_bytes: Option<usize> = convert::opt_int(chunk_bytes, "chunk_bytes")?;
    let direct_below: Option<usize> = convert::opt_int(direct_below, "direct_below")?;
    let lane_min: Option<usize> = convert::opt_int(lane_min, "lane_min")?;
    let short_below: Option<usize> = convert::opt_int(short_below, "short_below")?;
    let dirs: &[Direction] = match direction.as_str() {
        "to_device" => &[Direction::ToDevice],
        "to_host" => &[Direction::ToHost],
        "both" => &[Direction::ToDevice, Direction::ToHost],
        other => {
            return Err(PyValueError::new_err(format!(
                "direction must be 'to_device', 'to_host' or 'both', not {other:?}"
            )));
        }
    };
    // Check every direction's new settings before changing any.
    let mut new = Vec::new();
    for &d in dirs {
        let c = config(d).unwrap_or(StagingConfig::default_for(d));
        new.push((
            d,
            StagingConfig {
                threads: threads.unwrap_or(c.threads),
                chunk_bytes: chunk_bytes.unwrap_or(c.chunk_bytes),
                direct_below: direct_below.unwrap_or(c.direct_below),
                lane_min: lane_min.unwrap_or(c.lane_min),
                short_below: short_below.unwrap_or(c.short_below),
            },
        ));
    }
    for &(d, c) in &new {
        // Refuses out-of-range values; the first direction is only set if valid, and
        // both share the same checks, so a refusal changes nothing.
        set_config(d, c).py()?;
    }
    Ok(())
}

/// Imports an object exposing `__cuda_array_interface__` (Numba, CuPy, torch): shared
/// zero-copy where the layout allows, copied otherwise (`copy` as in `from_dlpack`).
/// Raises BufferError for a layout memarray cannot address (negative or overlapping
/// strides, a misaligned pointer) or memory the driver does not know.
#[pyfunction]
#[pyo3(signature = (obj, copy=None))]
pub fn from_cuda_array_interface(
    obj: &Bound<'_, PyAny>,
    copy: Option<bool>,
) -> PyResult<PyMemArray> {
    let iface = obj.getattr("__cuda_array_interface__")?;
    let iface = iface
        .cast::<PyDict>()
        .map_err(|_| PyTypeError::new_err("__cuda_array_interface__ must be a dict"))?;
    let get = |k: &str| -> PyResult<Bound<'_, PyAny>> {
        iface
            .get_item(k)?
            .ok_or_else(|| PyValueError::new_err(format!("__cuda_array_interface__ lacks {k:?}")))
    };
    let version: i64 = convert::int(&get("version")?, "__cuda_array_interface__ version")?;
    if !(0..=3).contains(&version) {
        return Err(PyBufferError::new_err(format!(
            "unsupported CUDA Array Interface version {version}"
        )));
    }
    let shape: Vec<usize> = get("shape")?
        .extract::<Vec<i64>>()
        .ok()
        .and_then(|v| v.into_iter().map(|d| usize::try_from(d).ok()).collect())
        .ok_or_else(|| {
            PyBufferError::new_err(
                "__cuda_array_interface__ shape must be a tuple of ints in 0..2**63",
            )
        })?;
    if shape.len() > memarray_core::MAX_NDIM {
        return Err(PyBufferError::new_err(format!(
            "ndim {} exceeds the maximum of {}",
            shape.len(),
            memarray_core::MAX_NDIM
        )));
    }
    let typestr: String = convert::text(&get("typestr")?, "__cuda_array_interface__ typestr")?;
    let dtype = DType::ALL
        .into_iter()
        .find(|d| {
            d.typestr() == typestr || (typestr.starts_with('=') && d.typestr()[1..] == typestr[1..])
        })
        .ok_or_else(|| {
            PyTypeError::new_err(format!(
                "unsupported typestr {typestr:?}; supported dtypes: {}",
                DType::supported_names()
            ))
        })?;
    let (addr, read_only): (usize, bool) = get("data")?.extract().map_err(|_| {
        PyBufferError::new_err(
            "__cuda_array_interface__ data must be (address, read_only) with an address in \
             0..2**64",
        )
    })?;
    let size = dtype.size() as i64;
    let strides: Vec<i64> = match iface.get_item("strides")? {
        Some(s) if !s.is_none() => s
            .extract::<Vec<i64>>()
            .map_err(|_| {
                PyBufferError::new_err(
                    "__cuda_array_interface__ strides must be a tuple of ints in -2**63..2**63",
                )
            })?
            .into_iter()
            .map(|b| {
                if b % size != 0 {
                    Err(PyBufferError::new_err(format!(
                        "stride {b} is not a multiple of the item size {size}"
                    )))
                } else {
                    Ok(b / size)
                }
            })
            .collect::<PyResult<_>>()?,
        _ => memarray_core::shape::c_strides(&shape),
    };
    if strides.len() != shape.len() {
        return Err(PyBufferError::new_err(format!(
            "__cuda_array_interface__ has {} strides for {} dimensions",
            strides.len(),
            shape.len()
        )));
    }
    if iface.get_item("mask")?.is_some_and(|m| !m.is_none()) {
        return Err(PyBufferError::new_err(
            "masked CUDA arrays are not supported",
        ));
    }
    let device = memarray_cuda::device_of_pointer(addr as u64).py()?;
    // Work the producer has queued on its stream must precede ours: the array starts
    // with an event recorded there as its pending work (unless disabled).
    let mut producer = None;
    let sync = cai_sync()?;
    if sync && let Some(s) = iface.get_item("stream")?.filter(|s| !s.is_none()) {
        let h: usize = convert::int(&s, "__cuda_array_interface__ stream")?;
        if h == 0 {
            return Err(PyBufferError::new_err(
                "CUDA Array Interface stream 0 is disallowed by the interface (v3)",
            ));
        }
        // SAFETY: the producer names a live stream of its own.
        producer = Some(unsafe { StreamRef::from_raw(h) }.py()?);
    }
    // The layout passes the one check DLPack tensors pass (memarray-core's): aligned,
    // strides non-negative and not overlapping, the span inside the address space.
    // SAFETY: the producer promises (the interface) that `addr` holds this layout on its
    // device while the object lives, which `Keep` holds.
    let t = unsafe {
        ForeignTensor::new(
            Place::Device(device.id()),
            addr as u64,
            0,
            dtype,
            shape,
            strides,
            read_only,
            Box::new(Keep(obj.clone().unbind())),
        )
    }
    .py()?;
    crate::foreign::import(obj.py(), t, copy, producer).map(Into::into)
}

/// Holds a Python producer alive; dropping it without the GIL defers the decref to pyo3.
struct Keep(#[allow(dead_code)] Py<PyAny>);

pub fn register(m: &Bound<'_, PyModule>) -> PyResult<()> {
    let py = m.py();
    let cuda = PyModule::new(py, "cuda")?;
    cuda.add_class::<PyStream>()?;
    cuda.add_class::<PyEvent>()?;
    cuda.add_function(wrap_pyfunction!(is_available, &cuda)?)?;
    cuda.add_function(wrap_pyfunction!(unavailable_reason, &cuda)?)?;
    cuda.add_function(wrap_pyfunction!(device_count, &cuda)?)?;
    cuda.add_function(wrap_pyfunction!(current_device, &cuda)?)?;
    cuda.add_function(wrap_pyfunction!(set_default_device, &cuda)?)?;
    cuda.add_function(wrap_pyfunction!(default_device, &cuda)?)?;
    cuda.add_function(wrap_pyfunction!(check_errors, &cuda)?)?;
    cuda.add_function(wrap_pyfunction!(_park_for_test, &cuda)?)?;
    cuda.add_function(wrap_pyfunction!(set_device, &cuda)?)?;
    cuda.add_function(wrap_pyfunction!(_clear_device, &cuda)?)?;
    cuda.add_function(wrap_pyfunction!(_current_context_device, &cuda)?)?;
    cuda.add_function(wrap_pyfunction!(synchronize, &cuda)?)?;
    cuda.add_function(wrap_pyfunction!(from_cuda_array_interface, &cuda)?)?;
    cuda.add_function(wrap_pyfunction!(staging_config, &cuda)?)?;
    cuda.add_function(wrap_pyfunction!(set_staging_config, &cuda)?)?;
    cuda.add_function(wrap_pyfunction!(pinned_fallbacks, &cuda)?)?;
    cuda.add_function(wrap_pyfunction!(copy_engine, &cuda)?)?;
    crate::launch::register(&cuda)?;
    m.add_submodule(&cuda)?;
    Ok(())
}

// The CUDA Array Interface of MemArray.
#[pymethods]
impl PyMemArray {
    /// The CUDA Array Interface (v3) of device-resident data; AttributeError while the data
    /// is on the host. `stream` names the stream of pending work (None when there is none).
    #[getter]
    fn __cuda_array_interface__<'py>(
        &self,
        py: Python<'py>,
    ) -> PyResult<Bound<'py, pyo3::types::PyDict>> {
        crate::cuda::cuda_array_interface(py, self)
    }
}
