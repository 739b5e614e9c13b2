//! `memarray.cuda`: availability, devices, synchronisation and parked errors; the module
//! also carries streams and events (`stream.rs`), the CUDA Array Interface (`cai.rs`), the
//! copy wing's settings (`copy_settings.rs`) and users' kernels (`launch.rs`).

use pyo3::exceptions::PyValueError;
use pyo3::prelude::*;

use memarray_core::Location;

use crate::device::device_of;
use crate::errors::IntoPyResult;
use crate::fork::Detach;
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

pub fn register(m: &Bound<'_, PyModule>) -> PyResult<()> {
    let py = m.py();
    let cuda = PyModule::new(py, "cuda")?;
    cuda.add_class::<PyStream>()?;
    cuda.add_class::<PyEvent>()?;
    cuda.add_class::<crate::graph::PyCapture>()?;
    cuda.add_class::<crate::graph::PyGraph>()?;
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
    cuda.add_function(wrap_pyfunction!(
        crate::cai::from_cuda_array_interface,
        &cuda
    )?)?;
    cuda.add_function(wrap_pyfunction!(
        crate::copy_settings::staging_config,
        &cuda
    )?)?;
    cuda.add_function(wrap_pyfunction!(
        crate::copy_settings::set_staging_config,
        &cuda
    )?)?;
    cuda.add_function(wrap_pyfunction!(
        crate::copy_settings::pinned_fallbacks,
        &cuda
    )?)?;
    cuda.add_function(wrap_pyfunction!(crate::copy_settings::copy_engine, &cuda)?)?;
    crate::launch::register(&cuda)?;
    m.add_submodule(&cuda)?;
    Ok(())
}
