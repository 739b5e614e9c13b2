//! `memarray.MemArray`: the Python face of [`RawArray`] (any dtype, ndim 0..=32).

use crate::fork::Detach;
use pyo3::exceptions::{PyTypeError, PyValueError};
use pyo3::prelude::*;
use pyo3::types::{PyInt, PyTuple};

use std::mem::ManuallyDrop;
use std::sync::{Arc, Mutex};

use memarray_core::{DType, Location, LockToken};
use memarray_cuda::array::{RawArray, SharedArray};

use crate::convert::{self, host_kind_arg, host_kind_name, parse_shape};
use crate::device::{Target, device_name, location_tuple};
use crate::dtype::{numpy_dtype, parse_dtype};
use crate::errors::IntoPyResult;
use crate::stream::parse_move_stream;

// Frozen: methods take `&self`; the array's state is a `SharedArray` (a mutex of its
// own), so calls from any number of threads are serialised and never meet pyo3's borrow
// flag. The GIL is never held while waiting for that mutex, and never held during a
// copy, a wait for device work, or an allocation (see `Self::with`).
/// A typed N-d array whose data lives on the host, on a CUDA device, or both: `shape` is
/// an int or a tuple of ints, `dtype` anything NumPy accepts (default float64),
/// `device_id` the CUDA device it moves to (default 0), `host_memory` the host buffer's
/// kind ("auto" by default; see the constructor). A new
/// array is zero-filled on the host; `move_memory("cuda")` copies it to device
/// `device_id` asynchronously, and every later operation waits for that copy.
///
/// Elements read and write with `a[i, j]`; `np.asarray(a)` views host data without a
/// copy; `a.to_numpy()` copies from wherever the data is; DLPack (`torch.from_dlpack(a)`)
/// and the CUDA Array Interface hand device data to other libraries zero-copy.
///
/// `a == b` compares identity, not elements: an elementwise result would have to copy
/// device data implicitly. Compare `a.to_numpy() == b` (or `np.asarray(a) == b` on the
/// host) instead.
///
/// >>> import memarray
/// >>> a = memarray.MemArray((2, 3), "float32")
/// >>> a[1, 2] = 5.0
/// >>> a
/// MemArray([[0., 0., 0.],
///           [0., 0., 5.]], dtype=float32, device=cpu)
#[pyclass(name = "MemArray", module = "memarray", frozen)]
pub struct PyMemArray {
    /// Dropped in [`Drop`], with the GIL released for large arrays.
    pub(crate) shared: ManuallyDrop<SharedArray>,
    /// Device buffers whose address `__cuda_array_interface__` handed out. The interface
    /// has no owner field: consumers keep this object alive, and it keeps those buffers
    /// (even after a swap or a peer move) so no exported address is ever freed early.
    pub(crate) cai_pins: Mutex<Vec<Arc<memarray_cuda::DeviceBuffer>>>,
}

impl From<RawArray> for PyMemArray {
    fn from(raw: RawArray) -> Self {
        Self {
            shared: ManuallyDrop::new(SharedArray::new(raw)),
            cai_pins: Default::default(),
        }
    }
}

/// Arrays from this size up free their buffers with the GIL released: freeing pinned
/// memory past the pinned pool's cache takes milliseconds (cuMemFreeHost of 256 MiB:
/// about 40 ms), and other threads should run meanwhile. Smaller buffers go back to a
/// pool (or to the allocator) in about a microsecond, less than a GIL hand-off, which
/// made `memarray.empty(1 MiB, pinned)` cost 9 us a call when other threads wanted the
/// GIL (torch's: 2.7 us). Waiting for queued device work releases the GIL at any size.
const DETACHED_DROP_BYTES: usize = 64 << 20;

/// `sys.is_finalizing`, looked up once.
static IS_FINALIZING: pyo3::sync::PyOnceLock<Py<PyAny>> = pyo3::sync::PyOnceLock::new();

impl Drop for PyMemArray {
    fn drop(&mut self) {
        // SAFETY: `shared` is taken exactly once, here, and never used afterwards.
        let shared = unsafe { ManuallyDrop::take(&mut self.shared) };
        let slow = shared
            .try_state()
            .is_none_or(|raw| raw.nbytes() >= DETACHED_DROP_BYTES || raw.drop_may_wait());
        if !slow {
            return drop(shared);
        }
        drop_detached(shared);
    }
}

/// Drops `value` (whose drop may block: freeing pinned memory, waiting for device work,
/// destroying an NCCL communicator) with the GIL released, except while the interpreter
/// finalizes.
pub(crate) fn drop_detached<T: Send>(value: T) {
    Python::attach(|py| {
        // Deallocation may run while an exception is propagating: keep it intact.
        let in_flight = PyErr::take(py);
        // Releasing the GIL while the interpreter finalizes could hand it to a daemon
        // thread that is being torn down: free in place then.
        let finalizing = crate::once::once(&IS_FINALIZING, py, || -> PyResult<_> {
            Ok(py.import("sys")?.getattr("is_finalizing")?.unbind())
        })
        .and_then(|f| f.bind(py).call0()?.extract::<bool>())
        .unwrap_or(true);
        if finalizing {
            drop(value);
        } else {
            py.detach_section(move || drop(value));
        }
        if let Some(e) = in_flight {
            e.restore(py);
        }
    });
}

impl PyMemArray {
    /// A new MemArray object for `raw`, left out of Python's cycle collector. pyo3 tracks
    /// every class, so each 700 new arrays started a collection that walked them all
    /// (12% of unpacking 1,000 views), though a MemArray's traverse visits nothing: what
    /// it holds is Rust's, and the collector can find no cycle through it either way.
    pub(crate) fn untracked(py: Python<'_>, raw: RawArray) -> PyResult<Bound<'_, PyMemArray>> {
        let obj = Bound::new(py, PyMemArray::from(raw))?;
        // SAFETY: a live object of a GC type we just made, with the GIL held; its
        // deallocation untracks only what is tracked.
        unsafe { pyo3::ffi::PyObject_GC_UnTrack(obj.as_ptr().cast()) };
        Ok(obj)
    }

    /// `obj` as a MemArray, or a TypeError saying `what` takes MemArrays.
    pub(crate) fn arg<'a, 'py>(
        obj: &'a Bound<'py, PyAny>,
        what: &str,
    ) -> PyResult<&'a Bound<'py, PyMemArray>> {
        obj.cast::<PyMemArray>().map_err(|_| {
            PyTypeError::new_err(format!(
                "{what} takes MemArrays, got {}",
                crate::errors::type_name(obj)
            ))
        })
    }
}

impl PyMemArray {
    /// Runs `f` on the array with the GIL held when no other thread is in a call on it and
    /// `fast` says `f` will not block; otherwise with the GIL released, both while waiting
    /// for the array and while `f` runs.
    pub(crate) fn with_if<R: Send>(
        &self,
        py: Python<'_>,
        fast: impl FnOnce(&RawArray) -> bool,
        f: impl FnOnce(&mut RawArray) -> R + Send,
    ) -> R {
        if let Some(mut raw) = self.shared.try_state()
            && fast(&raw)
        {
            return f(&mut raw);
        }
        py.detach_section(|| f(&mut self.shared.state()))
    }

    /// Runs a short call `f` that may wait for pending device work (an export, a host
    /// read): with the GIL held when nothing is pending and no other thread is in a call.
    pub(crate) fn with<R: Send>(
        &self,
        py: Python<'_>,
        f: impl FnOnce(&mut RawArray) -> R + Send,
    ) -> R {
        self.with_if(py, |raw| !raw.has_pending_work(), f)
    }

    /// Runs `f` (metadata, or work that never blocks the host) on the array: with the GIL
    /// held unless another thread is in a call on it.
    pub(crate) fn peek<R: Send>(
        &self,
        py: Python<'_>,
        f: impl FnOnce(&mut RawArray) -> R + Send,
    ) -> R {
        self.with_if(py, |_| true, f)
    }

    /// Runs `f` (copies, waits, allocations) on the array with the GIL released.
    pub(crate) fn with_detached<R: Send>(
        &self,
        py: Python<'_>,
        f: impl FnOnce(&mut RawArray) -> R + Send,
    ) -> R {
        py.detach_section(|| f(&mut self.shared.state()))
    }

    /// dtype and shape, read together.
    pub(crate) fn layout(&self, py: Python<'_>) -> (DType, Vec<usize>) {
        self.peek(py, |raw| (raw.dtype(), raw.shape().to_vec()))
    }
}

impl PyMemArray {
    pub(crate) fn location_tuple(&self, py: Python<'_>) -> (i64, i64) {
        location_tuple(self.peek(py, |raw| raw.location()))
    }

    pub(crate) fn move_to(
        &self,
        py: Python<'_>,
        target: Target,
        stream: Option<&Bound<'_, PyAny>>,
        sync: bool,
        token: Option<LockToken>,
    ) -> PyResult<()> {
        let stream = parse_move_stream(stream)?;
        self.with_detached(py, |raw| {
            let target = target.resolve(raw)?;
            raw.move_memory(target, stream, sync, token).py()
        })
    }
}

/// The hint for data given where a shape belongs (`MemArray([1.5, 2.5])`): a list or
/// tuple with an entry that is not an integer.
fn data_for_shape(shape: &Bound<'_, PyAny>) -> Option<PyErr> {
    let items: Vec<Bound<'_, PyAny>> = shape.try_iter().ok()?.take(33).flatten().collect();
    let data = items
        .iter()
        .any(|x| !x.is_instance_of::<PyInt>() && !x.hasattr("__index__").unwrap_or(false));
    data.then(|| {
        PyTypeError::new_err(format!(
            "MemArray(shape, dtype) makes a zero-filled array of a shape of ints; {} holds \
             data: memarray.asarray(x) makes a MemArray of it",
            crate::errors::type_name(shape)
        ))
    })
}

#[pymethods]
impl PyMemArray {
    /// A zero-filled array on the host. `dtype` is anything NumPy accepts (default
    /// float64); `device_id` is the CUDA device it moves to (default: the thread's current
    /// device, `memarray.cuda.current_device()`, once CUDA is in use; 0 before, so a host
    /// array never starts CUDA); `host_memory` picks the host
    /// buffer kind: "pageable", "pinned", "managed", or "auto" (pinned from 16 MiB up
    /// when a CUDA device is present, else pageable; measured in docs/python-guide.md).
    /// `host_resource` / `device_resource` (`memarray.resources`) give this array its own
    /// sources for its host buffer and its device buffers.
    #[new]
    #[pyo3(signature = (shape, dtype=None, device_id=None, host_memory=None, host_resource=None, device_resource=None, device=None))]
    #[allow(clippy::too_many_arguments)]
    fn new(
        py: Python<'_>,
        shape: &Bound<'_, PyAny>,
        dtype: Option<&Bound<'_, PyAny>>,
        device_id: Option<&Bound<'_, PyAny>>,
        host_memory: Option<&Bound<'_, PyAny>>,
        host_resource: Option<&Bound<'_, PyAny>>,
        device_resource: Option<&Bound<'_, PyAny>>,
        device: Option<&Bound<'_, PyAny>>,
    ) -> PyResult<Self> {
        // `device=` is taken only to say where it belongs: the constructor makes a host
        // array (the seed's), the creation functions make one anywhere.
        if device.is_some() {
            return Err(PyTypeError::new_err(
                "MemArray(shape, dtype) makes a host array and has no device argument: \
                 memarray.zeros(shape, dtype, device=...) (or empty / full) makes one there; \
                 a.move_memory(device) moves an array",
            ));
        }
        // Data where a shape belongs (`MemArray(np.array([2, 3]))`) would silently become
        // a zero-filled array of that shape.
        for protocol in [
            "__array_interface__",
            "__dlpack__",
            "__cuda_array_interface__",
        ] {
            if shape.hasattr(protocol)? {
                return Err(PyTypeError::new_err(format!(
                    "MemArray(shape, dtype) makes a zero-filled array of a shape; {} is an \
                     array: memarray.asarray(x) makes a MemArray of its data",
                    crate::errors::type_name(shape)
                )));
            }
        }
        let shape = parse_shape(shape).map_err(|e| data_for_shape(shape).unwrap_or(e))?;
        let dtype = parse_dtype(dtype)?;
        let device_id: u32 = match convert::opt_int(device_id, "device_id")? {
            Some(id) => id,
            // The current device if CUDA is in use; asking would start CUDA otherwise.
            None => memarray_cuda::current_or_default(true),
        };
        let kind = host_kind_arg(host_memory)?;
        let host = crate::resources::resource_arg(host_resource)?;
        let device = crate::resources::resource_arg(device_resource)?;
        let raw = py
            .detach_section(|| -> memarray_cuda::Result<RawArray> {
                let mut raw = match (host, kind) {
                    (Some(h), _) => RawArray::zeros_with(dtype, &shape, device_id, h, None)?,
                    (None, Some(kind)) => RawArray::zeros_in(dtype, &shape, device_id, kind)?,
                    (None, None) => RawArray::zeros(dtype, &shape, device_id)?,
                };
                raw.set_device_resource(device)?;
                Ok(raw)
            })
            .py()?;
        Ok(raw.into())
    }

    /// The shape, a tuple of ints.
    #[getter]
    fn shape<'py>(&self, py: Python<'py>) -> PyResult<Bound<'py, PyTuple>> {
        PyTuple::new(py, self.layout(py).1)
    }

    /// The element type, a NumPy dtype.
    #[getter]
    fn dtype<'py>(&self, py: Python<'py>) -> PyResult<Bound<'py, PyAny>> {
        numpy_dtype(py, self.layout(py).0)
    }

    // The dtype's name ("bfloat16", "float32"): what reprs and the package's own modules
    // read, since `dtype` needs ml_dtypes for bfloat16.
    #[getter]
    fn _dtype_name(&self, py: Python<'_>) -> &'static str {
        self.layout(py).0.name()
    }

    /// Number of dimensions.
    #[getter]
    fn ndim(&self, py: Python<'_>) -> usize {
        self.peek(py, |raw| raw.ndim())
    }

    /// Number of elements.
    #[getter]
    fn size(&self, py: Python<'_>) -> u64 {
        self.peek(py, |raw| raw.len())
    }

    /// Size in bytes.
    #[getter]
    fn nbytes(&self, py: Python<'_>) -> usize {
        self.peek(py, |raw| raw.nbytes())
    }

    /// Where the current data lives: "cpu" or "cuda:N".
    #[getter]
    fn device(&self, py: Python<'_>) -> String {
        device_name(self.peek(py, |raw| raw.location()))
    }

    /// Whether the current data is on a CUDA device.
    #[getter]
    fn on_device(&self, py: Python<'_>) -> bool {
        matches!(self.peek(py, |raw| raw.location()), Location::Device(_))
    }

    /// The CUDA device the array moves to.
    #[getter]
    fn device_id(&self, py: Python<'_>) -> u32 {
        self.peek(py, |raw| raw.device_id())
    }

    /// Whether a `get_dlpack` block holds the array's lock.
    #[getter]
    fn locked(&self) -> bool {
        self.shared.is_locked()
    }

    /// The id of the lock token holding the array, or None.
    #[getter]
    fn lock_id(&self) -> Option<u64> {
        self.shared.lock_holder()
    }

    /// Whether the array has a host buffer yet (arrays born on a device get one on their
    /// first move to the host).
    #[getter]
    fn has_host_copy(&self, py: Python<'_>) -> bool {
        self.peek(py, |raw| raw.has_host_copy())
    }

    /// The host buffer kind: "pageable", "pinned" or "managed".
    #[getter]
    fn host_memory(&self, py: Python<'_>) -> &'static str {
        host_kind_name(self.peek(py, |raw| raw.host_kind()))
    }

    /// Copies the current data to `device_type`: a DLPack device code
    /// (memarray.dlpack.kDLCPU or kDLCUDA, with `device_id`), or a device as `zeros` and
    /// `asarray` spell it ("cpu", "cuda" (the array's `device_id`, or the `device_id`
    /// argument when given), "cuda:N", a `(device_type, id)` pair, a torch.device). A
    /// `device_id` that contradicts the device ("cuda:2" with 1, "cpu" with any id) is a
    /// ValueError. The copy runs on `stream`: None (the array's last stream on that device, else the legacy default), an
    /// int handle (0 = the legacy default stream, as in the original MemArray), or a stream object
    /// (memarray.cuda.Stream, torch.cuda.Stream, cupy.cuda.Stream, anything with
    /// `__cuda_stream__`). Returns at once if the data is already there. With
    /// `async_copy=False` the call waits for the copy. The GIL is released throughout.
    #[pyo3(signature = (device_type, device_id=None, stream=None, async_copy=false))]
    fn move_memory(
        &self,
        py: Python<'_>,
        device_type: &Bound<'_, PyAny>,
        device_id: Option<&Bound<'_, PyAny>>,
        stream: Option<&Bound<'_, PyAny>>,
        async_copy: bool,
    ) -> PyResult<()> {
        let target = Target::from_pair_args(device_type, device_id)?;
        self.move_to(py, target, stream, !async_copy, None)
    }

    /// The Array API's `to_device`: this array's data on `device` ("cpu", "cuda" (the
    /// current device), "cuda:N", an int N, a DLPack pair, a torch.device), as a new
    /// array; the array itself when the data is there already. This array is not moved
    /// (`move_memory` moves it in place). `stream`: as `move_memory`'s.
    #[pyo3(signature = (device, /, *, stream=None))]
    fn to_device(
        slf: &Bound<'_, Self>,
        device: &Bound<'_, PyAny>,
        stream: Option<&Bound<'_, PyAny>>,
    ) -> PyResult<Py<PyAny>> {
        let py = slf.py();
        let target = crate::device::parse_device(Some(device))?;
        // Every argument is checked before the early return, as `move_memory` checks it.
        let stream = parse_move_stream(stream)?;
        let this = slf.get();
        if this.peek(py, |raw| raw.location()) == target {
            return Ok(slf.clone().into_any().unbind());
        }
        let copy = this
            .with_detached(py, |raw| raw.copied_to(target, stream, None))
            .py()?;
        Ok(Bound::new(py, Self::from(copy))?.into_any().unbind())
    }

    /// Adds the sum of each element's indices to it: on the GPU (moving the data there)
    /// when CUDA is available, on the host otherwise.
    #[pyo3(signature = (stream=None))]
    fn add_index_tuple(&self, py: Python<'_>, stream: Option<&Bound<'_, PyAny>>) -> PyResult<()> {
        let stream = parse_move_stream(stream)?;
        self.with_detached(py, |raw| {
            if memarray_cuda::is_available() || matches!(raw.location(), Location::Device(_)) {
                memarray_seed::add_index_tuple_device(raw, stream, None)
            } else {
                memarray_seed::add_index_tuple_host(raw, None)
            }
        })
        .py()
    }

    /// Records that the work queued on `stream` so far uses this array (a consumer that
    /// wrote it through DLPack on its own stream, e.g. a torch.distributed collective):
    /// later memarray work on other streams waits for it without blocking the host, host
    /// access waits for it, and its memory is not reused before it. `stream`: a
    /// memarray.cuda.Stream, a torch or CuPy stream, an integer handle.
    fn record_stream(&self, py: Python<'_>, stream: &Bound<'_, PyAny>) -> PyResult<()> {
        let stream = parse_move_stream(Some(stream))?
            .ok_or_else(|| PyValueError::new_err("record_stream needs a stream, not None"))?;
        self.peek(py, |raw| raw.record_stream(stream, None)).py()
    }

    /// Blocks until all work enqueued on this array has finished (GIL released).
    fn synchronize(&self, py: Python<'_>) -> PyResult<()> {
        self.with_detached(py, |raw| raw.synchronize(None)).py()
    }
}

/// Every dtype name, for error messages and the Python `SUPPORTED_DTYPES` constant.
pub fn supported_dtype_names() -> Vec<&'static str> {
    DType::ALL.iter().map(|d| d.name()).collect()
}
