//! `memarray.IpcHandle`, `MemArray.ipc_handle()`, `memarray.from_ipc_handle(h)`: device
//! arrays shared between processes (over `memarray_cuda::ipc`). Handles pickle (the 157
//! serialised bytes plus dtype and shape), so they travel through `multiprocessing`.

use crate::fork::Detach;
use pyo3::prelude::*;
use pyo3::types::{PyBytes, PyTuple};

use memarray_core::DType;
use memarray_cuda::array::RawArray;
use memarray_cuda::ipc::IpcHandle;

use crate::array::PyMemArray;
use crate::errors::IntoPyResult;

/// A device array's memory as another process opens it (`memarray.from_ipc_handle`).
#[pyclass(name = "IpcHandle", module = "memarray", frozen)]
pub struct PyIpcHandle {
    pub(crate) handle: IpcHandle,
    pub(crate) dtype: DType,
    pub(crate) shape: Vec<usize>,
}

#[pymethods]
impl PyIpcHandle {
    /// Bytes of the shared array.
    #[getter]
    fn nbytes(&self) -> u64 {
        self.handle.nbytes
    }

    /// The device ordinal (in the exporting process).
    #[getter]
    fn device_id(&self) -> u32 {
        self.handle.device_id
    }

    /// The exporting process's id.
    #[getter]
    fn pid(&self) -> u32 {
        self.handle.pid
    }

    /// The shape, a tuple of ints.
    #[getter]
    fn shape<'py>(&self, py: Python<'py>) -> PyResult<Bound<'py, PyTuple>> {
        PyTuple::new(py, &self.shape)
    }

    /// The dtype name.
    #[getter]
    fn dtype(&self) -> &'static str {
        self.dtype.name()
    }

    fn __reduce__<'py>(&self, py: Python<'py>) -> PyResult<Bound<'py, PyAny>> {
        let rebuild = py.import("memarray._pickle")?.getattr("ipc_handle")?;
        let args = (
            PyBytes::new(py, &self.handle.to_bytes()),
            self.dtype.name(),
            PyTuple::new(py, &self.shape)?,
        );
        Ok(PyTuple::new(py, [rebuild, args.into_pyobject(py)?.into_any()])?.into_any())
    }

    fn __repr__(&self) -> String {
        format!(
            "memarray.IpcHandle(shape={:?}, dtype={}, device_id={}, pid={})",
            self.shape, self.dtype, self.handle.device_id, self.handle.pid
        )
    }
}

/// Rebuilds a pickled handle.
#[pyfunction]
pub fn _ipc_handle_from_bytes(
    data: &[u8],
    dtype: &str,
    shape: Vec<usize>,
) -> PyResult<PyIpcHandle> {
    Ok(PyIpcHandle {
        handle: IpcHandle::from_bytes(data).py()?,
        dtype: DType::from_name(dtype).py()?,
        shape,
    })
}

/// A MemArray over the device memory another process shared with `a.ipc_handle()`, without
/// a copy. The first open of a handle maps it; later opens reuse the mapping. `device`:
/// this process's ordinal of the exporter's GPU, where the two processes number their
/// devices differently (`CUDA_VISIBLE_DEVICES`); default the handle's ordinal.
#[pyfunction]
#[pyo3(signature = (handle, device=None))]
pub fn from_ipc_handle(
    py: Python<'_>,
    handle: &PyIpcHandle,
    device: Option<&Bound<'_, PyAny>>,
) -> PyResult<PyMemArray> {
    let (mut h, dtype, shape) = (handle.handle, handle.dtype, handle.shape.clone());
    if let Some(id) = crate::convert::opt_int::<u32>(device, "device")? {
        h.device_id = id;
    }
    let raw = py
        .detach_section(|| RawArray::from_ipc_handle(&h, dtype, &shape))
        .py()?;
    Ok(raw.into())
}

// IPC export of MemArray.
#[pymethods]
impl PyMemArray {
    /// A handle another process opens with `memarray.from_ipc_handle` to share this
    /// array's device memory (picklable). The data must be on a device. Queued work is not
    /// waited for: the handle carries an event recorded after it, which the importer's
    /// work waits on. Keep this array alive, on the device and unwritten while others use
    /// it.
    fn ipc_handle(&self, py: Python<'_>) -> PyResult<crate::ipc::PyIpcHandle> {
        // Records an event; never blocks the host.
        let (handle, dtype, shape) = self
            .peek(py, |raw| {
                raw.ipc_handle(None)
                    .map(|h| (h, raw.dtype(), raw.shape().to_vec()))
            })
            .py()?;
        Ok(crate::ipc::PyIpcHandle {
            handle,
            dtype,
            shape,
        })
    }
}
