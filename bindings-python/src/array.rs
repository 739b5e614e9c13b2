//! `memarray.MemArray`: the Python face of [`RawArray`] (any dtype, ndim 0..=32).

use pyo3::exceptions::{PyIndexError, PyTypeError, PyValueError};
use pyo3::prelude::*;
use pyo3::types::{PyInt, PySlice, PyTuple};

use memarray_core::{DType, Location, LockToken, MAX_NDIM};
use memarray_cuda::array::{HostKind, RawArray};

use crate::dtype::{bytes_to_py, numpy_dtype, parse_dtype, py_to_bytes};
use crate::errors::IntoPyResult;
use crate::stream::parse_move_stream;

/// DLPack device type codes memarray uses.
pub const KDLCPU: i64 = 1;
/// CUDA device memory.
pub const KDLCUDA: i64 = 2;
/// Pinned host memory.
pub const KDLCUDAHOST: i64 = 3;
/// Managed memory.
pub const KDLCUDAMANAGED: i64 = 13;

/// A typed N-d array mirrored between host and CUDA device memory.
#[pyclass(name = "MemArray", module = "memarray")]
pub struct PyMemArray {
    pub(crate) raw: RawArray,
    /// Device buffers whose address `__cuda_array_interface__` handed out. The interface
    /// has no owner field: consumers keep this object alive, and it keeps those buffers
    /// (even after a swap or a peer move) so no exported address is ever freed early.
    pub(crate) cai_pins: std::sync::Mutex<Vec<std::sync::Arc<memarray_cuda::DeviceBuffer>>>,
}

impl From<RawArray> for PyMemArray {
    fn from(raw: RawArray) -> Self {
        Self {
            raw,
            cai_pins: Default::default(),
        }
    }
}

fn parse_shape(shape: &Bound<'_, PyAny>) -> PyResult<Vec<usize>> {
    let dims: Vec<i64> = if let Ok(n) = shape.extract::<i64>() {
        vec![n]
    } else {
        shape
            .try_iter()
            .map_err(|_| PyTypeError::new_err("shape must be an int or a sequence of ints"))?
            .map(|d| {
                d?.extract::<i64>()
                    .map_err(|_| PyTypeError::new_err("shape entries must be ints"))
            })
            .collect::<PyResult<_>>()?
    };
    if dims.len() > MAX_NDIM {
        return Err(PyValueError::new_err(format!(
            "ndim {} exceeds the maximum of {MAX_NDIM}",
            dims.len()
        )));
    }
    dims.iter()
        .map(|&d| {
            usize::try_from(d).map_err(|_| {
                PyValueError::new_err(format!("negative dimension {d} in shape {dims:?}"))
            })
        })
        .collect()
}

fn parse_host_kind(s: &str) -> PyResult<Option<HostKind>> {
    match s {
        "auto" => Ok(None),
        "pageable" => Ok(Some(HostKind::Pageable)),
        "pinned" => Ok(Some(HostKind::Pinned)),
        "managed" => Ok(Some(HostKind::Managed)),
        other => Err(PyValueError::new_err(format!(
            "host_memory must be 'auto', 'pageable', 'pinned' or 'managed', not {other:?}"
        ))),
    }
}

/// Python index (int or tuple of ints, negatives counting from the end) to a bounds-checked
/// multi-index.
fn parse_index(shape: &[usize], key: &Bound<'_, PyAny>) -> PyResult<Vec<u64>> {
    let items: Vec<Bound<'_, PyAny>> = if let Ok(t) = key.cast::<PyTuple>() {
        t.iter().collect()
    } else {
        vec![key.clone()]
    };
    if items.len() != shape.len() {
        return Err(PyIndexError::new_err(format!(
            "MemArray has {} dimensions but {} indices were given; index single elements \
             with a[i, j, ...] (use np.asarray(a) for slicing)",
            shape.len(),
            items.len()
        )));
    }
    items
        .iter()
        .zip(shape)
        .enumerate()
        .map(|(axis, (item, &d))| {
            if item.is_instance_of::<PySlice>() {
                return Err(PyTypeError::new_err(
                    "MemArray indexing takes integers only; use np.asarray(a)[...] to slice",
                ));
            }
            if !item.is_instance_of::<PyInt>() && !item.hasattr("__index__")? {
                return Err(PyTypeError::new_err(format!(
                    "indices must be integers, not {}",
                    item.get_type().name()?
                )));
            }
            let i: i64 = item.extract().map_err(|_| {
                PyIndexError::new_err(format!(
                    "index {} is out of bounds for axis {axis} with size {d}",
                    item.repr().map(|r| r.to_string()).unwrap_or_default()
                ))
            })?;
            let j = if i < 0 { i + d as i64 } else { i };
            if j < 0 || j >= d as i64 {
                return Err(PyIndexError::new_err(format!(
                    "index {i} is out of bounds for axis {axis} with size {d}"
                )));
            }
            Ok(j as u64)
        })
        .collect()
}

impl PyMemArray {
    pub(crate) fn to_numpy_with<'py>(
        &self,
        py: Python<'py>,
        token: Option<LockToken>,
    ) -> PyResult<Bound<'py, PyAny>> {
        let np = py.import("numpy")?;
        let dt = numpy_dtype(py, self.raw.dtype())?;
        let out = np
            .getattr("empty")?
            .call1((PyTuple::new(py, self.raw.shape())?, dt))?;
        let ptr = crate::numpy_data_ptr(&out)?;
        // SAFETY: `out` is a fresh C-contiguous array of nbytes bytes that nothing else sees.
        let bytes = unsafe { std::slice::from_raw_parts_mut(ptr as *mut u8, self.raw.nbytes()) };
        self.raw.read_all(bytes, token).py()?;
        Ok(out)
    }

    pub(crate) fn location_tuple(&self) -> (i64, i64) {
        match self.raw.location() {
            Location::Host => (KDLCPU, 0),
            Location::Device(id) => (KDLCUDA, id as i64),
        }
    }

    /// Resolves a DLPack device type and id into a location.
    pub(crate) fn target(&self, device_type: i64, device_id: Option<i64>) -> PyResult<Location> {
        match device_type {
            KDLCPU => Ok(Location::Host),
            KDLCUDA => {
                let id = device_id.unwrap_or(self.raw.device_id() as i64);
                let id = u32::try_from(id)
                    .map_err(|_| PyValueError::new_err(format!("invalid device_id {id}")))?;
                Ok(Location::Device(id))
            }
            KDLCUDAHOST | KDLCUDAMANAGED => Err(PyValueError::new_err(
                "kDLCUDAHost and kDLCUDAManaged are host memory kinds, chosen at construction \
                 with MemArray(..., host_memory='pinned' or 'managed'); move with kDLCPU",
            )),
            other => Err(PyValueError::new_err(format!(
                "unsupported device type {other}; memarray moves data to kDLCPU (1) or \
                 kDLCUDA (2)"
            ))),
        }
    }

    pub(crate) fn move_to(
        &mut self,
        py: Python<'_>,
        target: Location,
        stream: Option<&Bound<'_, PyAny>>,
        sync: bool,
        token: Option<LockToken>,
    ) -> PyResult<()> {
        let stream = parse_move_stream(stream)?;
        let raw = &mut self.raw;
        py.detach(|| raw.move_memory(target, stream, sync, token))
            .py()
    }

    pub(crate) fn get_item(
        &self,
        py: Python<'_>,
        key: &Bound<'_, PyAny>,
        token: Option<LockToken>,
    ) -> PyResult<Py<PyAny>> {
        let idx = parse_index(self.raw.shape(), key)?;
        let mut buf = [0u8; 16];
        let out = &mut buf[..self.raw.dtype().size()];
        self.raw.read_element(&idx, out, token).py()?;
        Ok(bytes_to_py(py, self.raw.dtype(), out)?.unbind())
    }

    pub(crate) fn set_item(
        &mut self,
        key: &Bound<'_, PyAny>,
        value: &Bound<'_, PyAny>,
        token: Option<LockToken>,
    ) -> PyResult<()> {
        let idx = parse_index(self.raw.shape(), key)?;
        let bytes = py_to_bytes(value, self.raw.dtype())?;
        self.raw.write_element(&idx, &bytes, token).py()
    }
}

#[pymethods]
impl PyMemArray {
    /// MemArray(shape, dtype=None, device_id=0, host_memory="auto")
    ///
    /// A zero-filled array on the host. `dtype` is anything NumPy accepts (default
    /// float64); `device_id` is the CUDA device it moves to; `host_memory` picks the host
    /// buffer kind: "pageable", "pinned", "managed", or "auto" (pinned from 16 MiB up
    /// when a CUDA device is present, else pageable; measured in docs/python-guide.md).
    #[new]
    #[pyo3(signature = (shape, dtype=None, device_id=0, host_memory="auto"))]
    fn new(
        shape: &Bound<'_, PyAny>,
        dtype: Option<&Bound<'_, PyAny>>,
        device_id: i64,
        host_memory: &str,
    ) -> PyResult<Self> {
        let shape = parse_shape(shape)?;
        let dtype = parse_dtype(dtype)?;
        let device_id = u32::try_from(device_id)
            .map_err(|_| PyValueError::new_err(format!("invalid device_id {device_id}")))?;
        let kind = parse_host_kind(host_memory)?;
        let raw = match kind {
            Some(kind) => RawArray::zeros_in(dtype, &shape, device_id, kind),
            None => RawArray::zeros(dtype, &shape, device_id),
        }
        .py()?;
        Ok(raw.into())
    }

    /// The shape, a tuple of ints.
    #[getter]
    fn shape<'py>(&self, py: Python<'py>) -> PyResult<Bound<'py, PyTuple>> {
        PyTuple::new(py, self.raw.shape())
    }

    /// The element type, a NumPy dtype.
    #[getter]
    fn dtype<'py>(&self, py: Python<'py>) -> PyResult<Bound<'py, PyAny>> {
        numpy_dtype(py, self.raw.dtype())
    }

    /// Number of dimensions.
    #[getter]
    fn ndim(&self) -> usize {
        self.raw.ndim()
    }

    /// Number of elements.
    #[getter]
    fn size(&self) -> u64 {
        self.raw.len()
    }

    /// Size in bytes.
    #[getter]
    fn nbytes(&self) -> usize {
        self.raw.nbytes()
    }

    /// Where the current data lives: "cpu" or "cuda:N".
    #[getter]
    fn device(&self) -> String {
        match self.raw.location() {
            Location::Host => "cpu".into(),
            Location::Device(id) => format!("cuda:{id}"),
        }
    }

    /// Whether the current data is on a CUDA device.
    #[getter]
    fn on_device(&self) -> bool {
        matches!(self.raw.location(), Location::Device(_))
    }

    /// The CUDA device the array moves to.
    #[getter]
    fn device_id(&self) -> u32 {
        self.raw.device_id()
    }

    /// Whether a `get_dlpack` block holds the array's lock.
    #[getter]
    fn locked(&self) -> bool {
        self.raw.is_locked()
    }

    /// The host buffer kind: "pageable", "pinned" or "managed".
    #[getter]
    fn host_memory(&self) -> &'static str {
        match self.raw.host_kind() {
            HostKind::Pageable => "pageable",
            HostKind::Pinned => "pinned",
            HostKind::Managed => "managed",
        }
    }

    fn __repr__(&self) -> String {
        format!(
            "MemArray(shape={:?}, dtype={}, device={}, device_id={}{})",
            self.raw.shape(),
            self.raw.dtype(),
            self.device(),
            self.raw.device_id(),
            if self.raw.is_locked() { ", locked" } else { "" }
        )
    }

    fn __len__(&self) -> PyResult<usize> {
        self.raw
            .shape()
            .first()
            .copied()
            .ok_or_else(|| PyTypeError::new_err("len() of a 0-d MemArray"))
    }

    fn __getitem__(&self, py: Python<'_>, key: &Bound<'_, PyAny>) -> PyResult<Py<PyAny>> {
        self.get_item(py, key, None)
    }

    fn __setitem__(&mut self, key: &Bound<'_, PyAny>, value: &Bound<'_, PyAny>) -> PyResult<()> {
        self.set_item(key, value, None)
    }

    /// move_memory(device_type, device_id=None, stream=None, async_copy=False)
    ///
    /// Copies the current data to `device_type` (memarray.dlpack.kDLCPU or kDLCUDA) on
    /// `stream`: None (the array's last stream on that device, else the legacy default), an
    /// int handle (0 = the legacy default stream, as in the seed), or a stream object
    /// (memarray.cuda.Stream, torch.cuda.Stream, cupy.cuda.Stream). Returns at once if the
    /// data is already there. With `async_copy=False` the call waits for the copy.
    #[pyo3(signature = (device_type, device_id=None, stream=None, async_copy=false))]
    fn move_memory(
        &mut self,
        py: Python<'_>,
        device_type: i64,
        device_id: Option<i64>,
        stream: Option<&Bound<'_, PyAny>>,
        async_copy: bool,
    ) -> PyResult<()> {
        let target = self.target(device_type, device_id)?;
        self.move_to(py, target, stream, !async_copy, None)
    }

    /// Overwrites the array with `array` (any layout; cast to this dtype as NumPy's
    /// astype does). The shape must match exactly; on any error the array is unchanged.
    fn read_numpy_array(&mut self, py: Python<'_>, array: &Bound<'_, PyAny>) -> PyResult<()> {
        self.raw.check(None).py()?;
        let np = py.import("numpy")?;
        let src = np.getattr("asarray")?.call1((array,))?;
        let src_shape: Vec<usize> = src.getattr("shape")?.extract()?;
        if src_shape != self.raw.shape() {
            return Err(PyValueError::new_err(format!(
                "shape mismatch: MemArray has shape {:?}, the array has shape {:?}",
                self.raw.shape(),
                src_shape
            )));
        }
        let dt = numpy_dtype(py, self.raw.dtype())?;
        let c = np.getattr("ascontiguousarray")?.call1((src, dt))?;
        let ptr = crate::numpy_data_ptr(&c)?;
        // SAFETY: `c` is a C-contiguous NumPy array of this dtype and shape, so it holds
        // exactly nbytes bytes at ptr, alive while `c` is.
        let bytes = unsafe { std::slice::from_raw_parts(ptr as *const u8, self.raw.nbytes()) };
        self.raw.write_all(bytes, None).py()
    }

    /// A NumPy copy of the current data (read from the device when it is there).
    fn to_numpy<'py>(&self, py: Python<'py>) -> PyResult<Bound<'py, PyAny>> {
        self.to_numpy_with(py, None)
    }

    /// `np.asarray(a)` falls back here when the buffer protocol cannot serve (bfloat16, a
    /// lock held elsewhere, data on a device): a copy for bfloat16 host data, otherwise the
    /// reason as an exception, never a silent object array.
    #[pyo3(signature = (dtype=None, copy=None))]
    fn __array__<'py>(
        slf: &Bound<'py, Self>,
        dtype: Option<&Bound<'py, PyAny>>,
        copy: Option<bool>,
    ) -> PyResult<Bound<'py, PyAny>> {
        let py = slf.py();
        let this = slf.borrow();
        this.raw.check(None).py()?;
        if let Location::Device(id) = this.raw.location() {
            return Err(PyTypeError::new_err(format!(
                "the data is on cuda:{id}; call move_memory(memarray.dlpack.kDLCPU) or \
                 to_numpy() to copy it to the host explicitly"
            )));
        }
        let out = if this.raw.dtype() == DType::BF16 {
            if copy == Some(false) {
                return Err(PyValueError::new_err(
                    "bfloat16 arrays have no zero-copy NumPy view; pass copy=None or True",
                ));
            }
            this.to_numpy(py)?
        } else {
            drop(this);
            let mv = pyo3::types::PyMemoryView::from(slf.as_any())?;
            py.import("numpy")?.getattr("asarray")?.call1((mv,))?
        };
        match dtype.filter(|d| !d.is_none()) {
            Some(d) => out.call_method1("astype", (d,)),
            None => Ok(out),
        }
    }

    /// add_index_tuple(stream=None)
    ///
    /// Adds the sum of each element's indices to it: on the GPU (moving the data there)
    /// when CUDA is available, on the host otherwise.
    #[pyo3(signature = (stream=None))]
    fn add_index_tuple(
        &mut self,
        py: Python<'_>,
        stream: Option<&Bound<'_, PyAny>>,
    ) -> PyResult<()> {
        let stream = parse_move_stream(stream)?;
        let raw = &mut self.raw;
        py.detach(|| {
            if memarray_cuda::is_available() || matches!(raw.location(), Location::Device(_)) {
                raw.add_index_tuple_device(stream, None)
            } else {
                raw.add_index_tuple_host(None)
            }
        })
        .py()
    }

    /// Blocks until all work enqueued on this array has finished.
    fn synchronize(&self, py: Python<'_>) -> PyResult<()> {
        let raw = &self.raw;
        py.detach(|| raw.synchronize(None)).py()
    }

    /// A deep copy (new buffers, same location, unlocked).
    fn copy(&self) -> PyResult<Self> {
        Ok(Self::from(self.raw.try_clone(None).py()?))
    }

    fn __copy__(&self) -> PyResult<Self> {
        self.copy()
    }

    fn __deepcopy__(&self, _memo: &Bound<'_, PyAny>) -> PyResult<Self> {
        self.copy()
    }

    /// Swaps contents with `other` without copying; both must be unlocked.
    fn swap(&mut self, other: &mut Self) -> PyResult<()> {
        self.raw.swap(&mut other.raw).py()
    }

    /// get_dlpack(device_type=None, device_id=None, stream=None)
    ///
    /// Moves the data to `device_type` (default: where it is) and returns a context manager
    /// that locks the array for its block and exports it with `__dlpack__`.
    #[pyo3(signature = (device_type=None, device_id=None, stream=None))]
    fn get_dlpack(
        slf: Bound<'_, Self>,
        device_type: Option<i64>,
        device_id: Option<i64>,
        stream: Option<&Bound<'_, PyAny>>,
    ) -> PyResult<crate::dlpack::DLPackContext> {
        {
            let mut this = slf.borrow_mut();
            let dt = device_type.unwrap_or(this.location_tuple().0);
            let target = this.target(dt, device_id)?;
            this.move_to(slf.py(), target, stream, true, None)?;
        }
        Ok(crate::dlpack::DLPackContext::new(slf.unbind()))
    }

    /// __dlpack__(*, stream=None, max_version=None, dl_device=None, copy=None)
    #[pyo3(signature = (*, stream=None, max_version=None, dl_device=None, copy=None))]
    fn __dlpack__<'py>(
        &mut self,
        py: Python<'py>,
        stream: Option<&Bound<'py, PyAny>>,
        max_version: Option<&Bound<'py, PyAny>>,
        dl_device: Option<&Bound<'py, PyAny>>,
        copy: Option<bool>,
    ) -> PyResult<Bound<'py, PyAny>> {
        crate::dlpack::export(py, self, None, stream, max_version, dl_device, copy)
    }

    /// The CUDA Array Interface (v3) of device-resident data; AttributeError while the data
    /// is on the host. `stream` names the stream of pending work (None when there is none).
    #[getter]
    fn __cuda_array_interface__<'py>(
        &self,
        py: Python<'py>,
    ) -> PyResult<Bound<'py, pyo3::types::PyDict>> {
        crate::cuda::cuda_array_interface(py, self)
    }

    /// (device_type, device_id) of the current data: (kDLCPU, 0) or (kDLCUDA, id).
    fn __dlpack_device__(&self) -> (i64, i64) {
        self.location_tuple()
    }

    // SAFETY (buffer protocol): see crate::buffer for the invariants.
    unsafe fn __getbuffer__(
        slf: Bound<'_, Self>,
        view: *mut pyo3::ffi::Py_buffer,
        flags: std::os::raw::c_int,
    ) -> PyResult<()> {
        // SAFETY: forwarded from CPython's buffer protocol call.
        unsafe { crate::buffer::get_buffer(slf, view, flags) }
    }

    unsafe fn __releasebuffer__(&self, view: *mut pyo3::ffi::Py_buffer) {
        // SAFETY: forwarded from CPython; view was filled by get_buffer.
        unsafe { crate::buffer::release_buffer(view) }
    }
}

/// Every dtype name, for error messages and the Python `SUPPORTED_DTYPES` constant.
pub fn supported_dtype_names() -> Vec<&'static str> {
    DType::ALL.iter().map(|d| d.name()).collect()
}
