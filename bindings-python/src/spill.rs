//! Spilling from Python (`memarray.spill`, docs/spilling.md): the settings and counters of
//! `memarray_cuda::spill`, and the array's side: `spilled`, `prefetch` and the scoped
//! device access `device_view`.

use crate::fork::Detach;
use std::path::PathBuf;
use std::sync::{Mutex, MutexGuard};

use pyo3::exceptions::PyValueError;
use pyo3::prelude::*;
use pyo3::types::PyDict;

use memarray_core::Location;
use memarray_cuda::StreamRef;
use memarray_cuda::array::Consumer;
use memarray_cuda::spill::{self, SpillSettings};

use crate::array::PyMemArray;
use crate::convert;
use crate::errors::IntoPyResult as _;
use crate::stream::parse_move_stream;

#[pymethods]
impl PyMemArray {
    /// Whether the data is on the host for now, spilled from the array's device
    /// (`device` still names the device; the next device use brings it back).
    #[getter]
    fn spilled(&self, py: Python<'_>) -> bool {
        self.peek(py, |raw| raw.is_spilled())
    }

    /// Brings a spilled array back to its device on `stream` without waiting (other
    /// arrays may spill to make room); a no-op when it is not spilled. Work queued after
    /// it on any stream is ordered behind the copy.
    #[pyo3(signature = (stream=None))]
    fn prefetch(&self, py: Python<'_>, stream: Option<&Bound<'_, PyAny>>) -> PyResult<()> {
        let stream = parse_move_stream(stream)?;
        self.with_detached(py, |raw| raw.prefetch(stream, None))
            .py()
    }

    /// A scope in which the array stays on its device at a fixed address, for code that
    /// takes raw pointers: `with a.device_view(stream) as view:` restores a spilled array,
    /// makes `stream` (default: the legacy default stream, 0) wait for the array's pending
    /// work, and yields a view with `ptr`, `shape`, `dtype`, `nbytes`, `stream` and a
    /// `__cuda_array_interface__`. Leaving the scope records the work queued on `stream`
    /// as the array's (later operations wait for it) and lets the array spill again.
    #[pyo3(signature = (stream=None))]
    fn device_view(
        slf: &Bound<'_, Self>,
        stream: Option<&Bound<'_, PyAny>>,
    ) -> PyResult<DeviceScope> {
        let stream = parse_move_stream(stream)?.unwrap_or(StreamRef::legacy());
        Ok(DeviceScope {
            array: slf.clone().unbind(),
            stream,
            held: Mutex::new(None),
        })
    }
}

/// What an entered scope holds: the export's owner (pins the device buffer), its
/// address and the layout.
struct Held {
    _owner: Box<dyn std::any::Any + Send + Sync>,
    ptr: usize,
    shape: Vec<usize>,
    dtype: memarray_core::DType,
    nbytes: usize,
}

/// The scope `PyMemArray.device_view` returns (see there). Frozen: its state sits behind
/// a mutex of its own, so threads sharing a scope are serialised in Rust.
#[pyclass(name = "DeviceScope", module = "memarray", frozen)]
pub struct DeviceScope {
    array: Py<PyMemArray>,
    stream: StreamRef,
    held: Mutex<Option<Held>>,
}

impl DeviceScope {
    fn held(&self) -> MutexGuard<'_, Option<Held>> {
        self.held.lock().unwrap_or_else(|e| e.into_inner())
    }

    /// `f` of what the entered scope holds; ValueError outside the scope.
    fn with_held<R>(&self, f: impl FnOnce(&Held) -> R) -> PyResult<R> {
        self.held().as_ref().map(f).ok_or_else(|| {
            PyValueError::new_err(
                "the device_view scope is not entered (use it in a with statement); its \
                 pointer is valid only inside",
            )
        })
    }
}

fn already_entered() -> PyErr {
    PyValueError::new_err("the device_view scope is already entered")
}

#[pymethods]
impl DeviceScope {
    fn __enter__(slf: PyRef<'_, Self>) -> PyResult<PyRef<'_, Self>> {
        if slf.held().is_some() {
            return Err(already_entered());
        }
        let py = slf.py();
        let stream = slf.stream;
        let array = slf.array.bind(py).get();
        let held = array
            .with_detached(py, |raw| -> memarray_cuda::Result<Held> {
                if let Location::Host = raw.location() {
                    return Err(memarray_cuda::ArrayError::NotOnDevice {
                        what: "device_view",
                        expected: raw.device_id(),
                        location: Location::Host,
                    }
                    .into());
                }
                let export = raw.export_buffer(None, false, Consumer::Stream(stream))?;
                Ok(Held {
                    ptr: export.ptr as usize,
                    _owner: export.owner,
                    shape: raw.shape().to_vec(),
                    dtype: raw.dtype(),
                    nbytes: raw.nbytes(),
                })
            })
            .py()?;
        {
            let mut slot = slf.held();
            if slot.is_some() {
                // Another thread entered meanwhile: this export is let go.
                return Err(already_entered());
            }
            *slot = Some(held);
        }
        Ok(slf)
    }

    #[pyo3(signature = (*_exc))]
    fn __exit__(&self, py: Python<'_>, _exc: &Bound<'_, pyo3::types::PyTuple>) -> PyResult<bool> {
        let Some(held) = self.held().take() else {
            return Ok(false);
        };
        let stream = self.stream;
        let array = self.array.bind(py).get();
        let r = array.with_detached(py, |raw| raw.record_stream(stream, None));
        // Dropping the export records the stream's work as a use of the buffer, then lets
        // it go (spillable again).
        drop(held);
        r.py()?;
        Ok(false)
    }

    /// The device address of the data (valid inside the scope only).
    #[getter]
    fn ptr(&self) -> PyResult<usize> {
        self.with_held(|h| h.ptr)
    }

    /// The array's shape.
    #[getter]
    fn shape(&self) -> PyResult<Vec<usize>> {
        self.with_held(|h| h.shape.clone())
    }

    /// The array's dtype name.
    #[getter]
    fn dtype(&self) -> PyResult<String> {
        self.with_held(|h| h.dtype.to_string())
    }

    /// Size in bytes.
    #[getter]
    fn nbytes(&self) -> PyResult<usize> {
        self.with_held(|h| h.nbytes)
    }

    /// The stream handle the scope orders work on (1: the legacy default stream).
    #[getter]
    fn stream(&self) -> usize {
        self.stream.raw()
    }

    /// CUDA Array Interface v3 of the data on the scope's stream.
    #[getter]
    fn __cuda_array_interface__<'py>(&self, py: Python<'py>) -> PyResult<Bound<'py, PyDict>> {
        let (shape, dtype, ptr) = self.with_held(|h| (h.shape.clone(), h.dtype, h.ptr))?;
        let d = PyDict::new(py);
        d.set_item("version", 3)?;
        d.set_item("shape", pyo3::types::PyTuple::new(py, &shape)?)?;
        d.set_item("typestr", dtype.typestr())?;
        d.set_item("data", (ptr, false))?;
        d.set_item("strides", py.None())?;
        // The stream already waits on the array's work: nothing for the consumer to order.
        d.set_item("stream", py.None())?;
        Ok(d)
    }
}

fn bytes_arg(v: Option<&Bound<'_, PyAny>>, what: &str) -> PyResult<Option<u64>> {
    let Some(v) = v.filter(|v| !v.is_none()) else {
        return Ok(None);
    };
    if v.is_instance_of::<pyo3::types::PyString>() {
        let s = convert::text(v, what)?;
        return spill::parse_bytes(&s)
            .map(Some)
            .map_err(|e| PyValueError::new_err(format!("{what}: {e}")));
    }
    convert::opt_int(Some(v), what)
}

/// A byte count as spilling's budgets take it (an int >= 0 or a string such as "4GiB");
/// ValueError / TypeError naming `what` otherwise.
#[pyfunction]
fn _spill_bytes(value: &Bound<'_, PyAny>, what: &str) -> PyResult<u64> {
    bytes_arg(Some(value), what)?.ok_or_else(|| PyValueError::new_err(format!("{what} is None")))
}

/// Turns spilling on for `device` (see `memarray.spill.enable`).
#[pyfunction]
#[pyo3(signature = (device, device_budget=None, host_budget=None, file_dir=None))]
fn _spill_enable(
    py: Python<'_>,
    device: &Bound<'_, PyAny>,
    device_budget: Option<&Bound<'_, PyAny>>,
    host_budget: Option<&Bound<'_, PyAny>>,
    file_dir: Option<&Bound<'_, PyAny>>,
) -> PyResult<()> {
    let file_dir: Option<PathBuf> = match file_dir.filter(|f| !f.is_none()) {
        Some(f) => Some(convert::path(f, "file_dir")?),
        None => None,
    };
    let device: u32 = convert::int(device, "device")?;
    let settings = SpillSettings {
        device_budget: bytes_arg(device_budget, "device_budget")?,
        host_budget: bytes_arg(host_budget, "host_budget")?,
        file_dir,
    };
    py.detach_section(|| spill::enable(device, settings)).py()
}

/// Turns spilling off for `device`.
#[pyfunction]
fn _spill_disable(device: &Bound<'_, PyAny>) -> PyResult<()> {
    spill::disable(convert::int(device, "device")?);
    Ok(())
}

/// `device`'s settings as a dict, or None when spilling is off there.
#[pyfunction]
fn _spill_settings<'py>(
    py: Python<'py>,
    device: &Bound<'_, PyAny>,
) -> PyResult<Option<Bound<'py, PyDict>>> {
    let Some(s) = spill::settings(convert::int(device, "device")?) else {
        return Ok(None);
    };
    let d = PyDict::new(py);
    d.set_item("device_budget", s.device_budget)?;
    d.set_item("host_budget", s.host_budget)?;
    d.set_item("file_dir", s.file_dir)?;
    Ok(Some(d))
}

/// `device`'s counters as a dict, or None when spilling is off there.
#[pyfunction]
fn _spill_statistics<'py>(
    py: Python<'py>,
    device: &Bound<'_, PyAny>,
) -> PyResult<Option<Bound<'py, PyDict>>> {
    let Some(s) = spill::statistics(convert::int(device, "device")?) else {
        return Ok(None);
    };
    let a = s.arrays;
    let d = PyDict::new(py);
    d.set_item("spilled_arrays", a.spilled_arrays)?;
    d.set_item("spilled_bytes", a.spilled_bytes)?;
    d.set_item("restored_arrays", a.restored_arrays)?;
    d.set_item("restored_bytes", a.restored_bytes)?;
    d.set_item("current_spilled_bytes", a.current_spilled_bytes)?;
    d.set_item("resident_bytes", a.resident_bytes)?;
    d.set_item("spill_seconds", a.spill_ns as f64 * 1e-9)?;
    d.set_item("restore_seconds", a.restore_ns as f64 * 1e-9)?;
    d.set_item("skipped_busy", a.skipped_busy)?;
    d.set_item("host_bytes", s.host_bytes)?;
    d.set_item("file_bytes", s.file_bytes)?;
    Ok(Some(d))
}

/// Spills `a` now.
#[pyfunction]
fn _spill_evict(py: Python<'_>, a: &Bound<'_, PyAny>) -> PyResult<()> {
    let a = PyMemArray::arg(a, "evict")?.get();
    // Pointers handed out through __cuda_array_interface__ pin the array until allowed.
    py.detach_section(|| a.shared.evict()).py()
}

/// Forgets the CUDA Array Interface pointers `a` handed out, so it may spill; returns
/// how many were held.
#[pyfunction]
fn _spill_allow(a: &Bound<'_, PyAny>) -> PyResult<usize> {
    let a = PyMemArray::arg(a, "allow")?.get();
    let mut pins = a.cai_pins.lock().unwrap_or_else(|e| e.into_inner());
    let n = pins.len();
    pins.clear();
    Ok(n)
}

/// Applies `MEMARRAY_SPILL` and friends once; a bad value is a ValueError.
#[pyfunction]
fn _spill_from_env(py: Python<'_>) -> PyResult<()> {
    py.detach_section(spill::enable_from_env)
        .map_err(PyValueError::new_err)
}

pub fn register(m: &Bound<'_, PyModule>) -> PyResult<()> {
    m.add_class::<DeviceScope>()?;
    m.add_function(wrap_pyfunction!(_spill_enable, m)?)?;
    m.add_function(wrap_pyfunction!(_spill_bytes, m)?)?;
    m.add_function(wrap_pyfunction!(_spill_disable, m)?)?;
    m.add_function(wrap_pyfunction!(_spill_settings, m)?)?;
    m.add_function(wrap_pyfunction!(_spill_statistics, m)?)?;
    m.add_function(wrap_pyfunction!(_spill_evict, m)?)?;
    m.add_function(wrap_pyfunction!(_spill_allow, m)?)?;
    m.add_function(wrap_pyfunction!(_spill_from_env, m)?)?;
    Ok(())
}
