//! `memarray.from_dlpack`, the one DLPack import entry point, and DLPack's C exchange API
//! (`__dlpack_c_exchange_api__`, DLPack 1.3) both ways. Above `dlpack` (capsules), which
//! it falls back to.
//!
//! - **Consumer**: `memarray.from_dlpack(obj)` looks up the API on `type(obj)` (the 16
//!   most recent types cached), takes the tensor through
//!   `managed_tensor_from_py_object_no_sync` and orders CUDA data after the producer's
//!   `current_work_stream` (no Python `__dlpack__` call, no producer-side sync).
//! - **Producer**: `MemArray.__dlpack_c_exchange_api__` is a capsule named
//!   `"dlpack_exchange_api"` over one static table. memarray's current work stream is the
//!   legacy default stream (reported as NULL): an export makes it wait for the array's
//!   pending work (stream-wait-event, no host block), as `__dlpack__(stream=None)` does.
//!   `dltensor_from_py_object_no_sync` is not offered (NULL): an owning export costs
//!   little more.

use std::ffi::{CStr, CString, c_char, c_int, c_void};
use std::ptr::NonNull;
use std::sync::{Mutex, PoisonError};

use pyo3::exceptions::{PyBufferError, PyTypeError, PyValueError};
use pyo3::prelude::*;
use pyo3::types::{PyType, PyWeakrefMethods, PyWeakrefReference};
use pyo3::{PyErr, ffi};

use memarray_core::{DType, Location, RawStream};
use memarray_cuda::StreamRef;
use memarray_cuda::array::{Fill, RawArray};
use memarray_dlpack::ffi::{
    DLDeviceType, DLManagedTensorVersioned, DLPackExchangeAPI, DLPackExchangeAPIHeader,
    DLPackVersion, DLTensor,
};
use memarray_dlpack::{ImportedTensor, export_versioned};

use crate::array::PyMemArray;
use crate::device::Target;
use crate::errors::IntoPyResult;

/// The capsule name the protocol fixes.
pub const CAPSULE_NAME: &CStr = c"dlpack_exchange_api";

/// The address of a producer's table, checked (major version 1, required entries set).
#[derive(Clone, Copy)]
pub struct Api(&'static DLPackExchangeAPI);

/// Types seen by `from_dlpack` most recently, first first: a weak reference to the type,
/// its address, and its table, or `None` for types without one. Weak: a
/// class made at run time goes when its program lets go of it; an entry whose type is gone
/// never matches (the address may be reused) and is dropped when seen. Bounded: a
/// program making producer classes on the fly must not slow each lookup down.
type Cache = Vec<(Py<PyWeakrefReference>, usize, Option<Api>)>;

/// Most types cached; a miss costs one attribute lookup.
const CACHE_TYPES: usize = 16;

static CACHE: Mutex<Cache> = Mutex::new(Vec::new());

// SAFETY: the table is static (the protocol requires it to live for the process) and
// only read; its function pointers are thread-agnostic C functions.
unsafe impl Send for Api {}
// SAFETY: as above.
unsafe impl Sync for Api {}

/// The exchange table of `type(obj)`, if it offers a usable one.
pub fn api_of(obj: &Bound<'_, PyAny>) -> PyResult<Option<Api>> {
    let py = obj.py();
    let ty = obj.get_type();
    let key = ty.as_ptr() as usize;
    let alive = |w: &Py<PyWeakrefReference>| {
        w.bind(py)
            .upgrade()
            .is_some_and(|t| t.as_ptr() as usize == key)
    };
    let stale = {
        let mut cache = CACHE.lock().unwrap_or_else(PoisonError::into_inner);
        if let Some(i) = cache.iter().position(|(w, a, _)| *a == key && alive(w)) {
            cache[..=i].rotate_right(1);
            return Ok(cache[0].2);
        }
        // Entries of this address are of a type that is gone.
        let (dead, keep): (Cache, Cache) = std::mem::take(&mut *cache)
            .into_iter()
            .partition(|(_, a, _)| *a == key);
        *cache = keep;
        dead
    };
    drop(stale);
    let api = lookup(&ty)?;
    let weak = PyWeakrefReference::new(&ty)?.unbind();
    let evicted = {
        let mut cache = CACHE.lock().unwrap_or_else(PoisonError::into_inner);
        if cache.iter().any(|(w, a, _)| *a == key && alive(w)) {
            None
        } else {
            cache.insert(0, (weak, key, api));
            (cache.len() > CACHE_TYPES).then(|| cache.pop())
        }
    };
    // Dropped after the lock (releasing a reference may run Python code).
    drop(evicted);
    Ok(api)
}

/// How many tables a `prev_api` chain is followed through (one per major version since
/// 1; far more than will ever exist).
const MAX_CHAIN: usize = 64;

fn lookup(ty: &Bound<'_, PyType>) -> PyResult<Option<Api>> {
    let Ok(attr) = ty.getattr("__dlpack_c_exchange_api__") else {
        return Ok(None);
    };
    let raw = attr.as_ptr();
    // Only a capsule of the protocol's name is trusted (never a bare integer address).
    // SAFETY: IsValid checks type and name without raising; GetPointer then succeeds.
    let p = unsafe {
        if ffi::PyCapsule_IsValid(raw, CAPSULE_NAME.as_ptr()) == 1 {
            ffi::PyCapsule_GetPointer(raw, CAPSULE_NAME.as_ptr())
        } else {
            std::ptr::null_mut()
        }
    };
    let Some(mut header) = NonNull::new(p.cast::<DLPackExchangeAPIHeader>()) else {
        return Ok(None);
    };
    // A newer major version may chain to an older table we understand. The walk is
    // bounded: a table that chains to itself (or in a circle) would otherwise loop for ever
    // holding the GIL; without a major-1 table in reach, the Python protocol is used.
    let mut found = false;
    for _ in 0..MAX_CHAIN {
        // SAFETY: the producer promises a live, static table (header first).
        let h = unsafe { header.as_ref() };
        if h.version.major == 1 {
            found = true;
            break;
        }
        match NonNull::new(h.prev_api) {
            Some(prev) => header = prev,
            None => return Ok(None),
        }
    }
    if !found {
        return Ok(None);
    }
    // SAFETY: a major-1 header starts a full DLPackExchangeAPI table.
    let api: &'static DLPackExchangeAPI = unsafe { &*header.as_ptr().cast() };
    if api.managed_tensor_from_py_object_no_sync.is_none() || api.current_work_stream.is_none() {
        return Ok(None);
    }
    Ok(Some(Api(api)))
}

/// Takes `obj`'s tensor through the table, with the stream its producer's work is on.
pub fn take(api: Api, obj: &Bound<'_, PyAny>) -> PyResult<(ImportedTensor, StreamRef)> {
    let from_py = api
        .0
        .managed_tensor_from_py_object_no_sync
        .ok_or_else(|| PyTypeError::new_err("exchange API without from_py_object"))?;
    let mut out: *mut DLManagedTensorVersioned = std::ptr::null_mut();
    // SAFETY: the GIL is held (`obj` is bound); `obj` is live and of the type the table
    // came from.
    let rc = unsafe { from_py(obj.as_ptr().cast(), &mut out) };
    if rc != 0 {
        return Err(PyErr::take(obj.py()).unwrap_or_else(|| {
            PyBufferError::new_err("the producer's exchange API failed without an exception")
        }));
    }
    let p = NonNull::new(out)
        .ok_or_else(|| PyBufferError::new_err("the producer's exchange API returned no tensor"))?;
    // The producer is native code memarray has just called through its own table: its
    // answer is trusted as its code is (no `msync` mapping checks of the struct, shape,
    // strides and data, which cost a microsecond a call; forged capsules, the hostile
    // case, come through `__dlpack__` and are checked). Every other check runs.
    // SAFETY: an owning tensor handed over by the producer; ownership passes here; its
    // pointers are mapped (the producer's contract, trusted as above).
    let t = unsafe { ImportedTensor::from_versioned_trusted(p) }.py()?;
    let dev = t.device();
    let mut stream = StreamRef::legacy();
    if dev.kind == memarray_dlpack::DeviceType::Cuda {
        let current = api
            .0
            .current_work_stream
            .ok_or_else(|| PyTypeError::new_err("exchange API without current_work_stream"))?;
        let mut s: *mut c_void = std::ptr::null_mut();
        // SAFETY: GIL held; out pointer valid.
        let rc = unsafe { current(DLDeviceType::kDLCUDA, dev.id, &mut s) };
        if rc != 0 {
            return Err(PyErr::take(obj.py()).unwrap_or_else(|| {
                PyBufferError::new_err("the producer's current_work_stream failed")
            }));
        }
        if !s.is_null() {
            // SAFETY: the producer's current stream is live for this call (trusted as
            // above: no plausibility system call); memarray records its ordering event
            // on it at once and keeps no handle.
            stream = StreamRef::from_raw_stream(unsafe { RawStream::from_raw(s as usize) }).py()?;
        }
    }
    Ok((t, stream))
}

// ---- producer ----

struct Table(DLPackExchangeAPI);
// SAFETY: the table is immutable; `prev_api` is null.
unsafe impl Sync for Table {}

static TABLE: Table = Table(DLPackExchangeAPI {
    header: DLPackExchangeAPIHeader {
        version: DLPackVersion { major: 1, minor: 3 },
        prev_api: std::ptr::null_mut(),
    },
    managed_tensor_allocator: Some(allocator),
    managed_tensor_from_py_object_no_sync: Some(from_py_object),
    managed_tensor_to_py_object_no_sync: Some(to_py_object),
    dltensor_from_py_object_no_sync: None,
    current_work_stream: Some(current_work_stream),
});

/// The capsule for `MemArray.__dlpack_c_exchange_api__`.
pub fn capsule(py: Python<'_>) -> PyResult<Py<PyAny>> {
    let p = (&raw const TABLE.0).cast_mut().cast::<c_void>();
    // SAFETY: the table is static; the capsule has no destructor and a 'static name.
    let cap = unsafe { ffi::PyCapsule_New(p, CAPSULE_NAME.as_ptr(), None) };
    if cap.is_null() {
        return Err(PyErr::fetch(py));
    }
    // SAFETY: a new, owned reference.
    Ok(unsafe { Bound::from_owned_ptr(py, cap) }.unbind())
}

/// Runs `f` with the GIL (the protocol's callers hold it; attaching is then a no-op),
/// turning an error into a set Python exception and -1, and a panic into a
/// RuntimeError.
fn guarded(f: impl FnOnce(Python<'_>) -> PyResult<()>) -> c_int {
    Python::attach(
        |py| match std::panic::catch_unwind(std::panic::AssertUnwindSafe(|| f(py))) {
            Ok(Ok(())) => 0,
            Ok(Err(e)) => {
                e.restore(py);
                -1
            }
            Err(_) => {
                pyo3::exceptions::PyRuntimeError::new_err(
                    "memarray: panic in the DLPack exchange API",
                )
                .restore(py);
                -1
            }
        },
    )
}

unsafe extern "C" fn from_py_object(
    obj: *mut c_void,
    out: *mut *mut DLManagedTensorVersioned,
) -> c_int {
    guarded(|py| {
        if obj.is_null() || out.is_null() {
            return Err(PyValueError::new_err("null argument"));
        }
        // SAFETY: the caller passes a live object (the protocol), borrowed for the call.
        let any = unsafe { Bound::from_borrowed_ptr(py, obj.cast()) };
        let arr = any
            .cast::<PyMemArray>()
            .map_err(|_| PyTypeError::new_err("not a memarray.MemArray"))?;
        let (spec, owner) = super::export_spec(py, arr.get(), None, None, Target::Current, None)?;
        let p = export_versioned(spec, owner).py()?;
        // SAFETY: out is valid for one write (checked non-null).
        unsafe { *out = p.as_ptr() };
        Ok(())
    })
}

unsafe extern "C" fn to_py_object(
    tensor: *mut DLManagedTensorVersioned,
    out: *mut *mut c_void,
) -> c_int {
    guarded(|py| {
        let p = NonNull::new(tensor).ok_or_else(|| PyValueError::new_err("null tensor"))?;
        if out.is_null() {
            return Err(PyValueError::new_err("null out pointer"));
        }
        // SAFETY: the protocol hands over ownership of a live tensor ("stolen").
        let t = unsafe { ImportedTensor::from_versioned(p) }.py()?;
        let raw = crate::foreign::import(py, t.into_foreign(), None, Some(StreamRef::legacy()))?;
        let obj = Bound::new(py, PyMemArray::from(raw))?;
        // SAFETY: out is valid for one write; the new reference passes to the caller.
        unsafe { *out = obj.into_ptr().cast() };
        Ok(())
    })
}

unsafe extern "C" fn current_work_stream(
    _device_type: DLDeviceType::Type,
    _device_id: i32,
    out: *mut *mut c_void,
) -> c_int {
    if out.is_null() {
        return guarded(|_| Err(PyValueError::new_err("null out pointer")));
    }
    // memarray's default work stream is the legacy default stream: NULL, as CUDA spells
    // it in a stream argument.
    // SAFETY: out is valid for one write (checked non-null).
    unsafe { *out = std::ptr::null_mut() };
    0
}

type SetError = Option<unsafe extern "C" fn(*mut c_void, *const c_char, *const c_char)>;

unsafe extern "C" fn allocator(
    prototype: *mut DLTensor,
    out: *mut *mut DLManagedTensorVersioned,
    error_ctx: *mut c_void,
    set_error: SetError,
) -> c_int {
    let fail = |kind: &str, msg: String| {
        if let Some(f) = set_error {
            let (k, m) = (
                CString::new(kind).unwrap_or_default(),
                CString::new(msg).unwrap_or_default(),
            );
            // SAFETY: the caller's error callback with its own context, and C strings
            // alive for the call.
            unsafe { f(error_ctx, k.as_ptr(), m.as_ptr()) };
        }
        -1
    };
    let made = std::panic::catch_unwind(
        || -> Result<NonNull<DLManagedTensorVersioned>, (String, String)> {
            if prototype.is_null() || out.is_null() {
                return Err(("ValueError".into(), "null argument".into()));
            }
            // SAFETY: the caller's prototype, read for its dtype, ndim, shape and device.
            let proto = unsafe { &*prototype };
            let d = proto.dtype;
            let dtype = DType::from_dlpack(d.code, d.bits, d.lanes).map_err(|_| {
                (
                    "ValueError".to_string(),
                    format!(
                        "unsupported dtype (code {}, bits {}, lanes {})",
                        d.code, d.bits, d.lanes
                    ),
                )
            })?;
            // ndim is checked before the shape is read: a forged ndim must not make the
            // allocator read past the caller's shape array.
            let ndim = match usize::try_from(proto.ndim) {
                Ok(n) if n <= memarray_core::MAX_NDIM => n,
                _ => {
                    return Err((
                        "ValueError".to_string(),
                        format!(
                            "ndim {} is outside 0..={}",
                            proto.ndim,
                            memarray_core::MAX_NDIM
                        ),
                    ));
                }
            };
            let shape: Vec<usize> = if ndim == 0 {
                Vec::new()
            } else if proto.shape.is_null() {
                return Err(("ValueError".into(), "null shape".into()));
            } else {
                // SAFETY: the prototype's shape holds ndim entries (at most MAX_NDIM).
                unsafe { std::slice::from_raw_parts(proto.shape, ndim) }
                    .iter()
                    .map(|&d| {
                        usize::try_from(d)
                            .map_err(|_| ("ValueError".to_string(), format!("dimension {d}")))
                    })
                    .collect::<Result<_, _>>()?
            };
            let location = match proto.device.device_type {
                DLDeviceType::kDLCPU => Location::Host,
                DLDeviceType::kDLCUDA => {
                    Location::Device(u32::try_from(proto.device.device_id).map_err(|_| {
                        ("ValueError".to_string(), "negative device id".to_string())
                    })?)
                }
                other => return Err(("ValueError".into(), format!("device type {other}"))),
            };
            // Failures are named by their kind, as every other entry point raises them (a
            // shape too large is a ValueError, no CUDA a RuntimeError, only an
            // out-of-memory a MemoryError).
            let named = |e: memarray_cuda::CudaError| {
                (
                    crate::errors::builtin_exception_name(e.kind()).to_string(),
                    e.to_string(),
                )
            };
            let mut raw =
                RawArray::born_with(dtype, &shape, location, Fill::Unset, None, None, None)
                    .map_err(named)?;
            let buf = raw
                .export_buffer(None, false, memarray_cuda::array::Consumer::NoSync)
                .map_err(named)?;
            let (spec, owner) = memarray_dlpack::ExportSpec::from_buffer(buf);
            // The owner keeps the array (and so its memory) until the consumer deletes.
            let owner: Box<dyn std::any::Any + Send> = Box::new((raw, owner));
            export_versioned(spec, owner).map_err(|e| ("RuntimeError".to_string(), e.to_string()))
        },
    );
    match made {
        Ok(Ok(p)) => {
            // SAFETY: out checked non-null above.
            unsafe { *out = p.as_ptr() };
            0
        }
        Ok(Err((kind, msg))) => fail(&kind, msg),
        Err(_) => fail("RuntimeError", "panic in the memarray allocator".into()),
    }
}

// ---- the import entry point and the class's table ----

/// The exchange API skips the producer's `__dlpack__`, and with it torch's refusal of a
/// tensor that requires grad ("use tensor.detach()"): a writable alias of it would change
/// a leaf behind autograd. Refused the same way here unless the import copies. A MemArray
/// has no autograd and is not asked (a missing attribute is a raised and caught
/// AttributeError, half the cost of such an import).
fn refuse_autograd_leaf(obj: &Bound<'_, PyAny>, copy: Option<bool>) -> PyResult<()> {
    if copy == Some(true) || obj.is_instance_of::<PyMemArray>() {
        return Ok(());
    }
    let grad = obj
        .getattr_opt(pyo3::intern!(obj.py(), "requires_grad"))?
        .is_some_and(|g| g.is_truthy().unwrap_or(false));
    if grad {
        return Err(pyo3::exceptions::PyBufferError::new_err(
            "this tensor requires grad: memarray will not share it writable behind autograd; \
             pass t.detach() to share its memory, or copy=True for a copy",
        ));
    }
    Ok(())
}

/// Imports a DLPack producer (or capsule) as a MemArray. `copy=None` shares memory when it
/// can and copies otherwise; `copy=True` always copies; `copy=False` never copies and
/// raises BufferError when sharing is impossible (read-only or non-contiguous data, a torch tensor that
/// requires grad).
#[pyfunction]
#[pyo3(signature = (obj, copy=None))]
pub fn from_dlpack(
    py: Python<'_>,
    obj: &Bound<'_, PyAny>,
    copy: Option<bool>,
) -> PyResult<PyMemArray> {
    // NumPy arrays, the commonest producer: shared as they are where they can be, else
    // their fields or capsule, trusted (no mapping checks).
    if let Some(n) = super::take_numpy(obj, copy != Some(true))? {
        return n.import(py, copy).map(Into::into);
    }
    // The C exchange API (DLPack 1.3) where the producer's type offers one: no Python
    // `__dlpack__` call; the producer's current work stream orders its work.
    if let Some(api) = api_of(obj)? {
        refuse_autograd_leaf(obj, copy)?;
        let (t, producer) = take(api, obj)?;
        return crate::foreign::import(py, t.into_foreign(), copy, Some(producer)).map(Into::into);
    }
    let cap = super::request_capsule(obj)?;
    let t = super::take_capsule(&cap)?;
    crate::foreign::import(py, t.into_foreign(), copy, Some(StreamRef::legacy())).map(Into::into)
}

#[pymethods]
impl PyMemArray {
    /// DLPack 1.3's C exchange table (a capsule named "dlpack_exchange_api"): consumers
    /// that know it skip the Python `__dlpack__` call.
    #[classattr]
    fn __dlpack_c_exchange_api__(py: Python<'_>) -> PyResult<Py<PyAny>> {
        capsule(py)
    }
}
