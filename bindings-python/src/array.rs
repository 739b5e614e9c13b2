//! `memarray.MemArray`: the Python face of [`RawArray`] (any dtype, ndim 0..=32).

use pyo3::exceptions::{PyIndexError, PyTypeError, PyValueError};
use pyo3::prelude::*;
use pyo3::types::{PyInt, PySlice, PyTuple};

use std::mem::ManuallyDrop;
use std::sync::{Arc, Mutex};

use memarray_core::{DType, Location, LockToken, MAX_NDIM};
use memarray_cuda::array::{HostKind, RawArray, SharedArray};

use crate::convert;
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

// Frozen: methods take `&self`; the array's state is a `SharedArray` (a mutex of its
// own), so calls from any number of threads are serialised and never meet pyo3's borrow
// flag. The GIL is never held while waiting for that mutex, and never held during a
// copy, a wait for device work, or an allocation (see `Self::with`).
/// MemArray(shape, dtype=None, device_id=0, host_memory="auto", host_resource=None,
///          device_resource=None)
///
/// A typed N-d array whose data lives on the host, on a CUDA device, or both: `shape` is
/// an int or a tuple of ints, `dtype` anything NumPy accepts (default float64). A new
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
/// memory takes milliseconds (cuMemFreeHost of 256 MiB: about 40 ms), as does waiting for
/// queued device work, and other threads should run meanwhile.
const DETACHED_DROP_BYTES: usize = 1 << 20;

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
        let finalizing = IS_FINALIZING
            .get_or_try_init(py, || -> PyResult<_> {
                Ok(py.import("sys")?.getattr("is_finalizing")?.unbind())
            })
            .and_then(|f| f.bind(py).call0()?.extract::<bool>())
            .unwrap_or(true);
        if finalizing {
            drop(value);
        } else {
            py.detach(move || drop(value));
        }
        if let Some(e) = in_flight {
            e.restore(py);
        }
    });
}

impl PyMemArray {
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

/// The states of several arrays, each locked once, in address order: two calls locking
/// overlapping sets cannot deadlock. Take it with the GIL released.
pub(crate) struct Locked<'a> {
    keys: Vec<usize>,
    guards: Vec<std::sync::MutexGuard<'a, RawArray>>,
}

impl<'a> Locked<'a> {
    pub(crate) fn new(arrays: &[&'a PyMemArray]) -> Self {
        let mut sorted: Vec<&'a PyMemArray> = arrays.to_vec();
        sorted.sort_by_key(|a| key(a));
        sorted.dedup_by_key(|a| key(a));
        Self {
            keys: sorted.iter().map(|a| key(a)).collect(),
            guards: sorted.iter().map(|a| a.shared.state()).collect(),
        }
    }

    /// Each distinct array's state, in address order.
    pub(crate) fn all_mut(&mut self) -> Vec<&mut RawArray> {
        self.guards.iter_mut().map(|g| &mut **g).collect()
    }

    /// The state of `a` (one of the arrays locked).
    pub(crate) fn get(&self, a: &PyMemArray) -> Option<&RawArray> {
        let i = self.keys.binary_search(&key(a)).ok()?;
        Some(&*self.guards[i])
    }

    /// The states of two distinct arrays locked here.
    pub(crate) fn pair_mut(
        &mut self,
        a: &PyMemArray,
        b: &PyMemArray,
    ) -> Option<(&mut RawArray, &mut RawArray)> {
        let i = self.keys.binary_search(&key(a)).ok()?;
        let j = self.keys.binary_search(&key(b)).ok()?;
        let (lo, hi) = (i.min(j), i.max(j));
        if lo == hi {
            return None;
        }
        let (left, right) = self.guards.split_at_mut(hi);
        let (x, y) = (&mut *left[lo], &mut *right[0]);
        Some(if i < j { (x, y) } else { (y, x) })
    }
}

fn key(a: &PyMemArray) -> usize {
    a as *const PyMemArray as usize
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
        py.detach(|| f(&mut self.shared.state()))
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

    /// Runs an element access `f`: with the GIL held only for host data with nothing
    /// pending (a device element is a synchronous copy).
    fn with_element<R: Send>(
        &self,
        py: Python<'_>,
        f: impl FnOnce(&mut RawArray) -> R + Send,
    ) -> R {
        self.with_if(
            py,
            |raw| raw.location() == Location::Host && !raw.has_pending_work(),
            f,
        )
    }

    /// Runs `f` (copies, waits, allocations) on the array with the GIL released.
    pub(crate) fn with_detached<R: Send>(
        &self,
        py: Python<'_>,
        f: impl FnOnce(&mut RawArray) -> R + Send,
    ) -> R {
        py.detach(|| f(&mut self.shared.state()))
    }

    /// dtype and shape, read together.
    pub(crate) fn layout(&self, py: Python<'_>) -> (DType, Vec<usize>) {
        self.peek(py, |raw| (raw.dtype(), raw.shape().to_vec()))
    }
}

pub(crate) fn parse_shape(shape: &Bound<'_, PyAny>) -> PyResult<Vec<usize>> {
    let items: Vec<Bound<'_, PyAny>> =
        if shape.is_instance_of::<PyInt>() || shape.hasattr("__index__")? {
            vec![shape.clone()]
        } else {
            let it = shape.try_iter().map_err(|_| {
                PyTypeError::new_err(format!(
                    "shape must be an int or a sequence of ints, not {}",
                    crate::errors::type_name(shape)
                ))
            })?;
            let mut items = Vec::new();
            for d in it {
                items.push(d?);
                // Bounded: an endless iterator is refused, not followed forever.
                if items.len() > 1024 {
                    break;
                }
            }
            items
        };
    if items.len() > MAX_NDIM {
        let n = items.len();
        let n = if n > 1024 {
            "> 1024".to_string()
        } else {
            n.to_string()
        };
        return Err(PyValueError::new_err(format!(
            "ndim {n} exceeds the maximum of {MAX_NDIM}"
        )));
    }
    let dims: Vec<i64> = items
        .iter()
        .map(|d| convert::int(d, "shape entry"))
        .collect::<PyResult<_>>()?;
    dims.iter()
        .map(|&d| {
            usize::try_from(d).map_err(|_| {
                PyValueError::new_err(format!("negative dimension {d} in shape {dims:?}"))
            })
        })
        .collect()
}

/// The `host_memory` argument (`None` is "auto").
pub(crate) fn host_kind_arg(arg: Option<&Bound<'_, PyAny>>) -> PyResult<Option<HostKind>> {
    match arg.filter(|a| !a.is_none()) {
        Some(a) => parse_host_kind(&convert::text(a, "host_memory")?),
        None => Ok(None),
    }
}

pub(crate) fn parse_host_kind(s: &str) -> PyResult<Option<HostKind>> {
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
    if items.iter().any(|i| i.is_instance_of::<PySlice>()) {
        return Err(PyTypeError::new_err(
            "MemArray indexing takes integers only; use np.asarray(a)[...] to slice",
        ));
    }
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
            // A raising `__index__` propagates its own error; an integer too wide even for
            // i128 is out of bounds like any other.
            let oob = |i: &dyn std::fmt::Display| {
                PyIndexError::new_err(format!(
                    "index {i} is out of bounds for axis {axis} with size {d}"
                ))
            };
            let as_int = convert::to_int(item, "index")?;
            let Ok(i) = as_int.extract::<i128>() else {
                return Err(oob(&as_int.repr()?));
            };
            let j = if i < 0 { i + d as i128 } else { i };
            if j < 0 || j >= d as i128 {
                return Err(oob(&i));
            }
            Ok(j as u64)
        })
        .collect()
}

impl PyMemArray {
    /// A NumPy copy of the current data, read with `token`. The NumPy array is made
    /// first (Python), then filled with the GIL released; a swap in between that changed
    /// the dtype or shape makes it start over.
    pub(crate) fn to_numpy_with<'py>(
        &self,
        py: Python<'py>,
        token: Option<LockToken>,
        out: Option<&Bound<'py, PyAny>>,
    ) -> PyResult<Bound<'py, PyAny>> {
        let np = py.import("numpy")?;
        loop {
            let (dtype, shape) = self.layout(py);
            // For `out`, everything is read from a plain ndarray view of it: a subclass's
            // own `shape`, `dtype` or `flags` may lie (issue 13, item 3).
            let dest = match out {
                Some(o) => check_out_array(py, o, dtype, &shape)?,
                None => np
                    .getattr("empty")?
                    .call1((PyTuple::new(py, &shape)?, numpy_dtype(py, dtype)?))?,
            };
            // Held across the copy: NumPy cannot resize or free the memory meanwhile.
            let (held, addr) = numpy_view(&dest, true, dtype, &shape)?;
            if held.is_none() && out.is_some() {
                // No writable C-contiguous view (or a dtype views cannot describe): say
                // which, or go on with the `__array_interface__` address.
                check_out_flags(&dest)?;
            }
            let has_out = out.is_some();
            let done = self.with_detached(py, |raw| {
                if raw.dtype() != dtype || raw.shape() != shape {
                    return None;
                }
                if has_out && raw.host_overlaps(addr, raw.nbytes()) {
                    return Some(Err(memarray_cuda::CudaError::BadSetting {
                        what: "to_numpy(out=...)",
                        detail: "out shares memory with the array".into(),
                    }));
                }
                // SAFETY: `dest` is a C-contiguous, writeable array of this dtype and
                // shape (nbytes bytes at addr): a fresh one no other code has seen, or the
                // caller's `out`, checked above and held alive by the caller; its bytes
                // are written as NumPy's own copyto would.
                let bytes =
                    unsafe { std::slice::from_raw_parts_mut(addr as *mut u8, raw.nbytes()) };
                Some(raw.read_all(bytes, token))
            });
            if let Some(r) = done {
                r.py()?;
                return Ok(out.cloned().unwrap_or(dest));
            }
        }
    }

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

    pub(crate) fn get_item(
        &self,
        py: Python<'_>,
        key: &Bound<'_, PyAny>,
        token: Option<LockToken>,
    ) -> PyResult<Py<PyAny>> {
        let (_, shape) = self.layout(py);
        let idx = parse_index(&shape, key)?;
        let read = |raw: &mut RawArray| {
            let dtype = raw.dtype();
            let mut buf = [0u8; 16];
            raw.read_element(&idx, &mut buf[..dtype.size()], token)
                .map(|()| (dtype, buf))
        };
        let (dtype, buf) = self.with_element(py, read).py()?;
        Ok(bytes_to_py(py, dtype, &buf[..dtype.size()])?.unbind())
    }

    pub(crate) fn set_item(
        &self,
        py: Python<'_>,
        key: &Bound<'_, PyAny>,
        value: &Bound<'_, PyAny>,
        token: Option<LockToken>,
    ) -> PyResult<()> {
        loop {
            let (dtype, shape) = self.layout(py);
            let idx = parse_index(&shape, key)?;
            let bytes = py_to_bytes(value, dtype)?;
            let write = |raw: &mut RawArray| {
                if raw.dtype() != dtype {
                    return None; // swapped meanwhile: convert the value again
                }
                Some(raw.write_element(&idx, &bytes, token))
            };
            let done = self.with_element(py, write);
            if let Some(r) = done {
                return r.py();
            }
        }
    }
}

/// A move's destination as parsed from Python, resolved against the array's state
/// (its default device) under the array's mutex.
#[derive(Clone, Copy, Debug)]
pub(crate) enum Target {
    /// The host.
    Host,
    /// A CUDA device; `None` is the array's default device.
    Cuda(Option<u32>),
    /// Where the data is now.
    Current,
}

impl Target {
    /// A device as `zeros(device=...)` spells it; plain "cuda" is the array's own device.
    pub(crate) fn from_device(obj: &Bound<'_, PyAny>) -> PyResult<Self> {
        if obj.is_instance_of::<pyo3::types::PyString>() {
            let s = convert::text(obj, "device")?;
            if matches!(s.trim().to_ascii_lowercase().as_str(), "cuda" | "gpu") {
                return Ok(Target::Cuda(None));
            }
        }
        Ok(match crate::born::parse_device(Some(obj))? {
            Location::Host => Target::Host,
            Location::Device(id) => Target::Cuda(Some(id)),
        })
    }

    /// Parses Python's `device_type` and optional `device_id` arguments.
    pub(crate) fn parse_args(
        device_type: &Bound<'_, PyAny>,
        device_id: Option<&Bound<'_, PyAny>>,
    ) -> PyResult<Self> {
        Self::parse(
            convert::int(device_type, "device_type")?,
            convert::opt_int(device_id, "device_id")?,
        )
    }

    /// Parses a DLPack device type and optional id.
    pub(crate) fn parse(device_type: i64, device_id: Option<i64>) -> PyResult<Self> {
        match device_type {
            KDLCPU => Ok(Target::Host),
            KDLCUDA => match device_id {
                None => Ok(Target::Cuda(None)),
                Some(id) => u32::try_from(id)
                    .map(|id| Target::Cuda(Some(id)))
                    .map_err(|_| PyValueError::new_err(format!("invalid device_id {id}"))),
            },
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

    /// The location this target names for `raw`.
    pub(crate) fn resolve(self, raw: &RawArray) -> PyResult<Location> {
        Ok(match self {
            Target::Host => Location::Host,
            Target::Cuda(id) => Location::Device(id.unwrap_or(raw.device_id())),
            Target::Current => raw.location(),
        })
    }
}

/// `(device_type, device_id)` of a location, as `__dlpack_device__` gives it.
pub(crate) fn location_tuple(loc: Location) -> (i64, i64) {
    match loc {
        Location::Host => (KDLCPU, 0),
        Location::Device(id) => (KDLCUDA, id as i64),
    }
}

#[pymethods]
impl PyMemArray {
    /// MemArray(shape, dtype=None, device_id=0, host_memory="auto", host_resource=None,
    ///          device_resource=None)
    ///
    /// A zero-filled array on the host. `dtype` is anything NumPy accepts (default
    /// float64); `device_id` is the CUDA device it moves to; `host_memory` picks the host
    /// buffer kind: "pageable", "pinned", "managed", or "auto" (pinned from 16 MiB up
    /// when a CUDA device is present, else pageable; measured in docs/python-guide.md).
    /// `host_resource` / `device_resource` (`memarray.resources`) give this array its own
    /// sources for its host buffer and its device buffers.
    #[new]
    #[pyo3(signature = (shape, dtype=None, device_id=None, host_memory=None, host_resource=None, device_resource=None))]
    fn new(
        py: Python<'_>,
        shape: &Bound<'_, PyAny>,
        dtype: Option<&Bound<'_, PyAny>>,
        device_id: Option<&Bound<'_, PyAny>>,
        host_memory: Option<&Bound<'_, PyAny>>,
        host_resource: Option<&Bound<'_, PyAny>>,
        device_resource: Option<&Bound<'_, PyAny>>,
    ) -> PyResult<Self> {
        let shape = parse_shape(shape)?;
        let dtype = parse_dtype(dtype)?;
        let device_id: u32 = convert::opt_int(device_id, "device_id")?.unwrap_or(0);
        let kind = host_kind_arg(host_memory)?;
        let host = crate::resources::resource_arg(host_resource)?;
        let device = crate::resources::resource_arg(device_resource)?;
        let raw = py
            .detach(|| -> memarray_cuda::Result<RawArray> {
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

    fn __getitem__(&self, py: Python<'_>, key: &Bound<'_, PyAny>) -> PyResult<Py<PyAny>> {
        self.get_item(py, key, None)
    }

    /// Elements cannot be deleted (an array's size is fixed): ValueError, as NumPy.
    fn __delitem__(&self, _key: &Bound<'_, PyAny>) -> PyResult<()> {
        Err(PyValueError::new_err("cannot delete array elements"))
    }

    fn __setitem__(
        &self,
        py: Python<'_>,
        key: &Bound<'_, PyAny>,
        value: &Bound<'_, PyAny>,
    ) -> PyResult<()> {
        self.set_item(py, key, value, None)
    }

    /// move_memory(device_type, device_id=None, stream=None, async_copy=False)
    ///
    /// Copies the current data to `device_type`: a DLPack device code
    /// (memarray.dlpack.kDLCPU or kDLCUDA, with `device_id`), or a device as `zeros` and
    /// `asarray` spell it ("cpu", "cuda" (the array's `device_id`), "cuda:N", a
    /// `(device_type, id)` pair, a torch.device). The copy runs on `stream`: None (the array's last stream on that device, else the legacy default), an
    /// int handle (0 = the legacy default stream, as in the seed), or a stream object
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
        let target = if device_type.is_instance_of::<PyInt>() || device_type.hasattr("__index__")? {
            Target::parse_args(device_type, device_id)?
        } else {
            Target::from_device(device_type)?
        };
        self.move_to(py, target, stream, !async_copy, None)
    }

    /// Overwrites the array with `array` (any layout; cast to this dtype as NumPy's
    /// astype does). The shape must match exactly; on any error the array is unchanged.
    /// The copy runs with the GIL released.
    fn read_numpy_array(&self, py: Python<'_>, array: &Bound<'_, PyAny>) -> PyResult<()> {
        self.peek(py, |raw| raw.check(None)).py()?;
        let np = py.import("numpy")?;
        let src = np.getattr("asarray")?.call1((array,))?;
        let src_shape: Vec<usize> = src.getattr("shape")?.extract()?;
        loop {
            let (dtype, shape) = self.layout(py);
            if src_shape != shape {
                return Err(PyValueError::new_err(format!(
                    "shape mismatch: MemArray has shape {shape:?}, the array has shape \
                     {src_shape:?}"
                )));
            }
            let mut c = np
                .getattr("ascontiguousarray")?
                .call1((&src, numpy_dtype(py, dtype)?))?;
            loop {
                let (_held, addr) = numpy_view(&c, false, dtype, &shape)?;
                let done = self.with_detached(py, |raw| {
                    if raw.dtype() != dtype || raw.shape() != shape {
                        return Overlap::Changed; // swapped meanwhile: convert again
                    }
                    if raw.location() == Location::Host && raw.host_overlaps(addr, raw.nbytes()) {
                        // The same bytes (`np.asarray(a)`): nothing to copy, no aliasing
                        // slices. Other overlapping ranges (a view shifted within this
                        // array's memory) are copied apart first (issue 13, item 6).
                        return match raw.host_addr() == Some(addr) {
                            true => Overlap::Done(raw.check(None)),
                            false => Overlap::Partial,
                        };
                    }
                    // SAFETY: `c` is a C-contiguous NumPy array of this dtype and shape, so
                    // it holds exactly nbytes bytes at addr, alive while `c` is (held above).
                    let bytes =
                        unsafe { std::slice::from_raw_parts(addr as *const u8, raw.nbytes()) };
                    Overlap::Done(raw.write_all(bytes, None))
                });
                match done {
                    Overlap::Done(r) => return r.py(),
                    Overlap::Changed => break,
                    Overlap::Partial => c = c.call_method0("copy")?,
                }
            }
        }
    }

    /// A NumPy copy of the current data (read from the device when it is there), made
    /// with the GIL released.
    #[pyo3(signature = (out=None))]
    fn to_numpy<'py>(
        &self,
        py: Python<'py>,
        out: Option<&Bound<'py, PyAny>>,
    ) -> PyResult<Bound<'py, PyAny>> {
        self.to_numpy_with(py, None, out)
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
        let this = slf.get();
        let (loc, dt) = this
            .peek(py, |raw| {
                raw.check(None).map(|()| (raw.location(), raw.dtype()))
            })
            .py()?;
        if let Location::Device(id) = loc {
            if copy == Some(false) {
                return Err(PyValueError::new_err(format!(
                    "the data is on cuda:{id}: a NumPy view would need a copy (copy=False)"
                )));
            }
            return Err(PyTypeError::new_err(format!(
                "the data is on cuda:{id}; call move_memory(memarray.dlpack.kDLCPU) or \
                 to_numpy() to copy it to the host explicitly"
            )));
        }
        // NumPy 2's protocol: copy=False must return a view or raise ValueError; a dtype
        // other than the array's is a conversion, which is a copy (issue 13, item 13).
        let np = py.import("numpy")?;
        let want = match dtype.filter(|d| !d.is_none()) {
            Some(d) => {
                if d.is_instance_of::<pyo3::types::PyString>() {
                    convert::text(d, "dtype")?;
                }
                Some(np.getattr("dtype")?.call1((d,))?)
            }
            None => None,
        };
        let own = numpy_dtype(py, dt)?;
        let converts = match &want {
            Some(w) => !w.eq(&own)?,
            None => false,
        };
        if copy == Some(false) && converts {
            return Err(PyValueError::new_err(format!(
                "a {} view of this {} array would need a copy (copy=False); pass copy=None",
                want.map(|w| w.to_string()).unwrap_or_default(),
                dt.name()
            )));
        }
        let out = if dt == DType::BF16 {
            if copy == Some(false) {
                return Err(PyValueError::new_err(
                    "bfloat16 arrays have no zero-copy NumPy view; pass copy=None or True",
                ));
            }
            this.to_numpy(py, None)?
        } else {
            let mv = pyo3::types::PyMemoryView::from(slf.as_any())?;
            let view = np.getattr("asarray")?.call1((mv,))?;
            if copy == Some(true) && !converts {
                view.call_method0("copy")?
            } else {
                view
            }
        };
        match want.filter(|_| converts) {
            Some(w) => out.call_method1("astype", (w,)),
            None => Ok(out),
        }
    }

    /// add_index_tuple(stream=None)
    ///
    /// Adds the sum of each element's indices to it: on the GPU (moving the data there)
    /// when CUDA is available, on the host otherwise.
    #[pyo3(signature = (stream=None))]
    fn add_index_tuple(&self, py: Python<'_>, stream: Option<&Bound<'_, PyAny>>) -> PyResult<()> {
        let stream = parse_move_stream(stream)?;
        self.with_detached(py, |raw| {
            if memarray_cuda::is_available() || matches!(raw.location(), Location::Device(_)) {
                raw.add_index_tuple_device(stream, None)
            } else {
                raw.add_index_tuple_host(None)
            }
        })
        .py()
    }

    /// record_stream(stream)
    ///
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

    /// A deep copy (new buffers, same location, unlocked), made with the GIL released.
    fn copy(&self, py: Python<'_>) -> PyResult<Self> {
        Ok(Self::from(
            self.with_detached(py, |raw| raw.try_clone(None)).py()?,
        ))
    }

    fn __copy__(&self, py: Python<'_>) -> PyResult<Self> {
        self.copy(py)
    }

    fn __deepcopy__(&self, py: Python<'_>, _memo: &Bound<'_, PyAny>) -> PyResult<Self> {
        self.copy(py)
    }

    /// Swaps contents with `other` without copying; both must be unlocked.
    fn swap(&self, py: Python<'_>, other: &Bound<'_, Self>) -> PyResult<()> {
        let other = other.get();
        py.detach(|| self.shared.swap(&other.shared)).py()
    }

    /// get_dlpack(device_type=None, device_id=None, stream=None)
    ///
    /// Moves the data to `device_type` (default: where it is) and returns a context manager
    /// that locks the array for its block and exports it with `__dlpack__`. Entering
    /// moves the data there again if another thread moved it in between.
    #[pyo3(signature = (device_type=None, device_id=None, stream=None))]
    fn get_dlpack(
        slf: Bound<'_, Self>,
        device_type: Option<&Bound<'_, PyAny>>,
        device_id: Option<&Bound<'_, PyAny>>,
        stream: Option<&Bound<'_, PyAny>>,
    ) -> PyResult<crate::dlpack::DLPackContext> {
        let py = slf.py();
        let target = match device_type.filter(|d| !d.is_none()) {
            None => Target::Current,
            Some(dt) => Target::parse_args(dt, device_id)?,
        };
        let this = slf.get();
        // Pin the target down now (the default device is read once, here).
        let target = match this.peek(py, |raw| target.resolve(raw))? {
            Location::Host => Target::Host,
            Location::Device(id) => Target::Cuda(Some(id)),
        };
        this.move_to(py, target, stream, true, None)?;
        Ok(crate::dlpack::DLPackContext::new(slf.unbind(), target))
    }

    /// __dlpack__(*, stream=None, max_version=None, dl_device=None, copy=None)
    #[pyo3(signature = (*, stream=None, max_version=None, dl_device=None, copy=None))]
    fn __dlpack__<'py>(
        &self,
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

    /// DLPack 1.3's C exchange table (a capsule named "dlpack_exchange_api"): consumers
    /// that know it skip the Python `__dlpack__` call.
    #[classattr]
    fn __dlpack_c_exchange_api__(py: Python<'_>) -> PyResult<Py<PyAny>> {
        crate::exchange::capsule(py)
    }

    /// (device_type, device_id) of the current data: (kDLCPU, 0) or (kDLCUDA, id).
    fn __dlpack_device__(&self, py: Python<'_>) -> (i64, i64) {
        self.location_tuple(py)
    }

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

    /// save(path)
    ///
    /// Writes the current data to `path` as a `.npy` file that `numpy.load` reads (read
    /// back from the device in pieces when it is there). GIL released.
    fn save(&self, py: Python<'_>, path: &Bound<'_, PyAny>) -> PyResult<()> {
        let path = convert::path(path, "path")?;
        self.with_detached(py, |raw| raw.save_npy(&path, None)).py()
    }

    /// Pickle support (protocol 5 hands the host data out of band, uncopied).
    fn __reduce_ex__<'py>(
        &self,
        py: Python<'py>,
        protocol: &Bound<'py, PyAny>,
    ) -> PyResult<Bound<'py, PyAny>> {
        crate::pickle::reduce(py, self, convert::int(protocol, "protocol")?)
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

/// "cpu" or "cuda:N".
pub(crate) fn device_name(loc: Location) -> String {
    match loc {
        Location::Host => "cpu".into(),
        Location::Device(id) => format!("cuda:{id}"),
    }
}

/// The Python name of a host memory kind.
pub(crate) fn host_kind_name(kind: HostKind) -> &'static str {
    match kind {
        HostKind::Pageable => "pageable",
        HostKind::Pinned => "pinned",
        HostKind::Managed => "managed",
    }
}

/// What `read_numpy_array` found when it went to copy.
enum Overlap {
    /// Copied (or the source is the array itself).
    Done(memarray_cuda::Result<()>),
    /// The array's dtype or shape changed meanwhile.
    Changed,
    /// The source overlaps the array's memory without being it: copy it apart first.
    Partial,
}

/// Every dtype name, for error messages and the Python `SUPPORTED_DTYPES` constant.
pub fn supported_dtype_names() -> Vec<&'static str> {
    DType::ALL.iter().map(|d| d.name()).collect()
}

/// A held C-contiguous view of the NumPy array `a` (of `dtype` and `shape`) and its data
/// address; the address from `__array_interface__` (no view) where the buffer protocol
/// cannot describe the dtype (bfloat16).
fn numpy_view<'py>(
    a: &Bound<'py, PyAny>,
    writable: bool,
    dtype: DType,
    shape: &[usize],
) -> PyResult<(Option<crate::HeldBuffer<'py>>, usize)> {
    let held = crate::HeldBuffer::get(a, writable);
    let addr = match &held {
        Some(b) => b.addr(),
        None => crate::numpy_data_ptr(a)?,
    };
    let want = shape.iter().product::<usize>() * dtype.size();
    if let Some(b) = &held
        && b.len() != want
    {
        return Err(PyValueError::new_err(format!(
            "the NumPy buffer holds {} bytes, not the {want} its shape and dtype need",
            b.len()
        )));
    }
    Ok((held, addr))
}

/// `out` for `to_numpy(out=...)` as a plain `numpy.ndarray` view of its memory (so no
/// subclass property is consulted), checked to be of exactly this dtype and shape (a
/// ValueError or TypeError naming what differs otherwise); writability and contiguity
/// come with its buffer view ([`check_out_flags`] where there is none).
fn check_out_array<'py>(
    py: Python<'py>,
    out: &Bound<'py, PyAny>,
    dtype: DType,
    shape: &[usize],
) -> PyResult<Bound<'py, PyAny>> {
    static NDARRAY: pyo3::sync::PyOnceLock<Py<pyo3::types::PyType>> = pyo3::sync::PyOnceLock::new();
    let ndarray = NDARRAY.get_or_try_init(py, || -> PyResult<_> {
        Ok(py
            .import("numpy")?
            .getattr("ndarray")?
            .cast_into::<pyo3::types::PyType>()?
            .unbind())
    })?;
    let ndarray = ndarray.bind(py);
    if !out.is_instance(ndarray)? {
        return Err(PyTypeError::new_err(format!(
            "out must be a numpy.ndarray, not {}",
            out.get_type().name()?
        )));
    }
    // ndarray.view itself (not an override) with the base type: the real memory, shape,
    // dtype and flags.
    let out = &ndarray.getattr("view")?.call1((out, ndarray))?;
    let want = numpy_dtype(py, dtype)?;
    let got = out.getattr(pyo3::intern!(py, "dtype"))?;
    if !got.eq(&want)? {
        return Err(PyValueError::new_err(format!(
            "out has dtype {got}, the array {want}"
        )));
    }
    let got_shape: Vec<usize> = out.getattr(pyo3::intern!(py, "shape"))?.extract()?;
    if got_shape != shape {
        return Err(PyValueError::new_err(format!(
            "out has shape {got_shape:?}, the array {shape:?}"
        )));
    }
    Ok(out.clone())
}

/// Why `out` cannot be written as one C-contiguous block, if it cannot.
fn check_out_flags(out: &Bound<'_, PyAny>) -> PyResult<()> {
    let flags = out.getattr("flags")?;
    if !flags.getattr("c_contiguous")?.extract::<bool>()? {
        return Err(PyValueError::new_err("out must be C-contiguous"));
    }
    if !flags.getattr("writeable")?.extract::<bool>()? {
        return Err(PyValueError::new_err("out is read-only"));
    }
    Ok(())
}
