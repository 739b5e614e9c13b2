//! DLPack for Python, in one module: `__dlpack__` capsules and the locked
//! `get_dlpack` context here, `memarray.from_dlpack` and DLPack 1.3's C exchange API in
//! [`exchange`] (the import entry point tries the exchange API first, capsules second).
//!
//! Capsules are named `"dltensor"` / `"dltensor_versioned"`; a consumer renames them to
//! `"used_..."`. The capsule destructor calls the tensor's deleter only while the name
//! is unchanged (never consumed). Deleters drop Rust owners only, so they need no GIL.

pub(crate) mod exchange;

use std::ffi::{CStr, c_void};
use std::ptr::NonNull;

use pyo3::exceptions::{PyBufferError, PyTypeError};
use pyo3::prelude::*;
use pyo3::{PyErr, ffi};

use std::sync::{Mutex, PoisonError};

use memarray_core::{ForeignTensor, Location, LockGuard, LockToken};
use memarray_cuda::array::RawArray;
use memarray_dlpack::ffi::{DLManagedTensor, DLManagedTensorVersioned};
use memarray_dlpack::{
    ExportSpec, ImportedTensor, call_deleter_unversioned, call_deleter_versioned,
    export_unversioned, export_versioned,
};

use crate::array::PyMemArray;
use crate::convert;
use crate::device::{KDLCPU, KDLCUDA, Target};
use crate::errors::IntoPyResult;
use crate::stream::{consumer_for, parse_dlpack_stream};

const NAME: &CStr = c"dltensor";
const NAME_VERSIONED: &CStr = c"dltensor_versioned";
const USED: &CStr = c"used_dltensor";
const USED_VERSIONED: &CStr = c"used_dltensor_versioned";

unsafe extern "C" fn destroy_unversioned(capsule: *mut ffi::PyObject) {
    // SAFETY: CPython calls this with the dying capsule; IsValid checks the name without
    // raising, and only an unconsumed capsule still owns its tensor.
    unsafe {
        if ffi::PyCapsule_IsValid(capsule, NAME.as_ptr()) == 1 {
            let p = ffi::PyCapsule_GetPointer(capsule, NAME.as_ptr());
            if let Some(p) = NonNull::new(p.cast::<DLManagedTensor>()) {
                call_deleter_unversioned(p);
            }
        }
    }
}

unsafe extern "C" fn destroy_versioned(capsule: *mut ffi::PyObject) {
    // SAFETY: as in destroy_unversioned.
    unsafe {
        if ffi::PyCapsule_IsValid(capsule, NAME_VERSIONED.as_ptr()) == 1 {
            let p = ffi::PyCapsule_GetPointer(capsule, NAME_VERSIONED.as_ptr());
            if let Some(p) = NonNull::new(p.cast::<DLManagedTensorVersioned>()) {
                call_deleter_versioned(p);
            }
        }
    }
}

/// Wraps an owning tensor pointer in a capsule; on failure the tensor is deleted.
fn capsule<'py>(
    py: Python<'py>,
    ptr: *mut c_void,
    name: &'static CStr,
    destructor: unsafe extern "C" fn(*mut ffi::PyObject),
) -> PyResult<Bound<'py, PyAny>> {
    // SAFETY: ptr is a live managed tensor whose ownership passes to the capsule; name is
    // 'static as the capsule requires.
    let cap = unsafe { ffi::PyCapsule_New(ptr, name.as_ptr(), Some(destructor)) };
    if cap.is_null() {
        let err = PyErr::fetch(py);
        // SAFETY: the capsule was not made, so we still own the tensor.
        unsafe {
            if name == NAME {
                call_deleter_unversioned(NonNull::new_unchecked(ptr.cast()));
            } else {
                call_deleter_versioned(NonNull::new_unchecked(ptr.cast()));
            }
        }
        return Err(err);
    }
    // SAFETY: cap is a new, owned reference.
    Ok(unsafe { Bound::from_owned_ptr(py, cap) })
}

/// An optional argument that is None or a pair of ints (`what` names it and its parts in
/// the TypeError).
fn int_pair(obj: Option<&Bound<'_, PyAny>>, what: &str) -> PyResult<Option<(i64, i64)>> {
    let Some(v) = obj.filter(|v| !v.is_none()) else {
        return Ok(None);
    };
    v.extract().map(Some).map_err(|_| {
        PyTypeError::new_err(format!(
            "{what} tuple of ints, not {}",
            v.repr().map(|r| r.to_string()).unwrap_or_default()
        ))
    })
}

/// Parses `max_version`: None or a (major, minor) pair of ints. Returns whether to give a
/// versioned capsule.
fn wants_versioned(max_version: Option<&Bound<'_, PyAny>>) -> PyResult<bool> {
    let pair = int_pair(max_version, "max_version must be None or a (major, minor)")?;
    Ok(pair.is_some_and(|(major, _)| major >= 1))
}

/// Parses `dl_device`: None or a (device_type, device_id) pair.
fn parse_dl_device(dl_device: Option<&Bound<'_, PyAny>>) -> PyResult<Option<Target>> {
    let what = "dl_device must be None or a (device_type, device_id)";
    let Some((ty, id)) = int_pair(dl_device, what)? else {
        return Ok(None);
    };
    match ty {
        KDLCPU | KDLCUDA => Target::parse(ty, Some(id))
            .map(Some)
            .map_err(|e| PyBufferError::new_err(e.to_string())),
        other => Err(PyBufferError::new_err(format!(
            "cannot export to DLPack device type {other}; memarray exports kDLCPU (1) and \
             kDLCUDA (2)"
        ))),
    }
}

/// `__dlpack__` for an array, with an optional lock token (the `get_dlpack` context's).
///
/// Every argument is checked before the data moves: a refused export changes nothing.
/// The move (if `dl_device` asks for one) and the export happen in one call on the array,
/// so no other thread can move the data in between.
pub fn export<'py>(
    py: Python<'py>,
    arr: &PyMemArray,
    token: Option<LockToken>,
    stream: Option<&Bound<'py, PyAny>>,
    max_version: Option<&Bound<'py, PyAny>>,
    dl_device: Option<&Bound<'py, PyAny>>,
    copy: Option<bool>,
) -> PyResult<Bound<'py, PyAny>> {
    let versioned = wants_versioned(max_version)?;
    let h = parse_dlpack_stream(stream)?;
    let target = parse_dl_device(dl_device)?.unwrap_or(Target::Current);
    let (spec, owner) = export_spec(py, arr, token, h, target, copy)?;
    if versioned {
        let p = export_versioned(spec, owner).py()?;
        capsule(py, p.as_ptr().cast(), NAME_VERSIONED, destroy_versioned)
    } else {
        let p = export_unversioned(spec, owner).py()?;
        capsule(py, p.as_ptr().cast(), NAME, destroy_unversioned)
    }
}

/// The tensor description and owner of an export (the part of `__dlpack__` before the
/// capsule): parsed stream `h`, `target` device, `copy`.
pub(crate) fn export_spec(
    py: Python<'_>,
    arr: &PyMemArray,
    token: Option<LockToken>,
    h: Option<i64>,
    target: Target,
    copy: Option<bool>,
) -> PyResult<(ExportSpec, Box<dyn std::any::Any + Send>)> {
    let export = |raw: &mut RawArray| -> PyResult<_> {
        raw.check(token).py()?;
        let target = target.resolve(raw)?;
        let consumer = consumer_for(h, target)?;
        if target != raw.location() {
            if copy == Some(false) {
                return Err(PyBufferError::new_err(format!(
                    "dl_device {target} differs from the data's location {} and copy=False \
                     forbids moving it",
                    raw.location()
                )));
            }
            raw.move_memory(target, None, false, token).py()?;
        }
        raw.export_buffer(token, copy == Some(true), consumer).py()
    };
    // A move or a copy allocates and copies, and pending work may be waited for: then
    // with the GIL released. (`dl_device` naming where the data already is, as torch
    // passes it, is no move.)
    let buf = arr.with_if(
        py,
        |raw| {
            copy != Some(true)
                && !raw.has_pending_work()
                && matches!(target.resolve(raw), Ok(l) if l == raw.location())
        },
        export,
    )?;
    Ok(ExportSpec::from_buffer(buf))
}

// Entering takes a `LockGuard`; leaving (or the context's collection) drops it.
/// The seed's locked export: `with a.get_dlpack(kDLCPU) as t: np.from_dlpack(t)`.
///
/// Entering locks the array with a fresh token; exports through the context (`t`,
/// `t[i]`, `np.from_dlpack(t)`) present it, while every other caller gets LockError.
/// Leaving releases the lock, on every exit path; so does the context being garbage
/// collected without `__exit__`. Outside a `with` block it exports like the array.
#[pyclass(module = "memarray", frozen)]
pub struct DLPackContext {
    array: Py<PyMemArray>,
    target: Target,
    guard: Mutex<Option<LockGuard>>,
}

impl DLPackContext {
    pub(crate) fn new(array: Py<PyMemArray>, target: Target) -> Self {
        Self {
            array,
            target,
            guard: Mutex::new(None),
        }
    }

    /// The guard slot. Held only for a take or a put, never across Python or a wait.
    fn slot(&self) -> std::sync::MutexGuard<'_, Option<LockGuard>> {
        self.guard.lock().unwrap_or_else(PoisonError::into_inner)
    }

    fn token(&self) -> Option<LockToken> {
        self.slot().as_ref().map(LockGuard::token)
    }
}

#[pymethods]
impl DLPackContext {
    fn __enter__(slf: Bound<'_, Self>) -> PyResult<Bound<'_, Self>> {
        let py = slf.py();
        let this = slf.get();
        if this.slot().is_some() {
            return Err(crate::errors::LockError::new_err(
                "this get_dlpack context is already entered",
            ));
        }
        let arr = this.array.get();
        let guard = arr.shared.lock_guard().py()?;
        // Another thread may have moved the data since get_dlpack: move it back under
        // our token. On any error the guard drops here and the lock is released.
        arr.move_to(py, this.target, None, true, Some(guard.token()))?;
        let mut slot = this.slot();
        if slot.is_some() {
            // Unreachable while the array lock is exclusive; refuse rather than replace.
            return Err(crate::errors::LockError::new_err(
                "this get_dlpack context is already entered",
            ));
        }
        *slot = Some(guard);
        drop(slot);
        Ok(slf)
    }

    #[pyo3(signature = (*_args))]
    fn __exit__(&self, _args: &Bound<'_, pyo3::types::PyTuple>) -> bool {
        // Dropping the guard releases the lock; taking it makes a second exit a no-op.
        let guard = self.slot().take();
        drop(guard);
        false
    }

    /// The lock id held by this context, or None outside its `with` block.
    #[getter]
    fn lock_id(&self) -> Option<u64> {
        self.token().map(LockToken::id)
    }

    /// The array this context exports.
    #[getter]
    fn array(&self, py: Python<'_>) -> Py<PyMemArray> {
        self.array.clone_ref(py)
    }

    #[pyo3(signature = (*, stream=None, max_version=None, dl_device=None, copy=None))]
    fn __dlpack__<'py>(
        &self,
        py: Python<'py>,
        stream: Option<&Bound<'py, PyAny>>,
        max_version: Option<&Bound<'py, PyAny>>,
        dl_device: Option<&Bound<'py, PyAny>>,
        copy: Option<bool>,
    ) -> PyResult<Bound<'py, PyAny>> {
        export(
            py,
            self.array.get(),
            self.token(),
            stream,
            max_version,
            dl_device,
            copy,
        )
    }

    fn __dlpack_device__(&self, py: Python<'_>) -> (i64, i64) {
        self.array.get().location_tuple(py)
    }

    /// A NumPy copy of the data, read with this context's lock.
    fn to_numpy<'py>(&self, py: Python<'py>) -> PyResult<Bound<'py, PyAny>> {
        self.array.get().to_numpy_with(py, self.token(), None)
    }

    fn __getitem__(&self, py: Python<'_>, key: &Bound<'_, PyAny>) -> PyResult<Py<PyAny>> {
        self.array.get().get_item(py, key, self.token())
    }

    fn __setitem__(
        &self,
        py: Python<'_>,
        key: &Bound<'_, PyAny>,
        value: &Bound<'_, PyAny>,
    ) -> PyResult<()> {
        self.array.get().set_item(py, key, value, self.token())
    }
}

/// Takes the tensor out of a DLPack capsule, marking it consumed.
pub(crate) fn take_capsule(cap: &Bound<'_, PyAny>) -> PyResult<ImportedTensor> {
    let raw = cap.as_ptr();
    // SAFETY: raw is a live object; the capsule API checks its type and name and sets
    // no error when IsValid fails.
    unsafe {
        if ffi::PyCapsule_IsValid(raw, NAME_VERSIONED.as_ptr()) == 1 {
            let p = ffi::PyCapsule_GetPointer(raw, NAME_VERSIONED.as_ptr());
            let p = NonNull::new(p.cast::<DLManagedTensorVersioned>())
                .ok_or_else(|| PyBufferError::new_err("DLPack capsule holds a null tensor"))?;
            if ffi::PyCapsule_SetName(raw, USED_VERSIONED.as_ptr()) != 0 {
                return Err(PyErr::fetch(cap.py()));
            }
            return ImportedTensor::from_versioned(p).py();
        }
        if ffi::PyCapsule_IsValid(raw, NAME.as_ptr()) == 1 {
            let p = ffi::PyCapsule_GetPointer(raw, NAME.as_ptr());
            let p = NonNull::new(p.cast::<DLManagedTensor>())
                .ok_or_else(|| PyBufferError::new_err("DLPack capsule holds a null tensor"))?;
            if ffi::PyCapsule_SetName(raw, USED.as_ptr()) != 0 {
                return Err(PyErr::fetch(cap.py()));
            }
            return ImportedTensor::from_unversioned(p).py();
        }
        if ffi::PyCapsule_IsValid(raw, USED.as_ptr()) == 1
            || ffi::PyCapsule_IsValid(raw, USED_VERSIONED.as_ptr()) == 1
        {
            return Err(PyBufferError::new_err(
                "this DLPack capsule was already consumed; a capsule can be imported once",
            ));
        }
    }
    Err(PyTypeError::new_err(format!(
        "expected a DLPack capsule or an object with __dlpack__, got {}",
        cap.get_type().name()?
    )))
}

/// A producer's `__dlpack_device__()`: a pair of integers, each in `i64` (a ValueError
/// naming the producer's answer otherwise, never an OverflowError; a TypeError for
/// non-integers, as for arguments). The one reading of it: `asarray` asks it too.
#[pyfunction]
#[pyo3(name = "_producer_device")]
pub(crate) fn producer_device(obj: &Bound<'_, PyAny>) -> PyResult<(i64, i64)> {
    let answer = obj.call_method0("__dlpack_device__")?;
    let (kind, id): (Bound<'_, PyAny>, Bound<'_, PyAny>) = answer.extract().map_err(|_| {
        pyo3::exceptions::PyValueError::new_err(format!(
            "the producer's __dlpack_device__() must return (device_type, device_id), not {}",
            answer.repr().map(|r| r.to_string()).unwrap_or_default()
        ))
    })?;
    Ok((
        convert::int(&kind, "the producer's __dlpack_device__() device type")?,
        convert::int(&id, "the producer's __dlpack_device__() device id")?,
    ))
}

/// Asks a producer for a capsule: versioned first, then the pre-1.0 signature.
pub(crate) fn request_capsule<'py>(obj: &Bound<'py, PyAny>) -> PyResult<Bound<'py, PyAny>> {
    let py = obj.py();
    if !obj.hasattr("__dlpack__")? {
        return Ok(obj.clone());
    }
    let (dev_type, _) = producer_device(obj)?;
    let kwargs = pyo3::types::PyDict::new(py);
    kwargs.set_item("max_version", (1, 3))?;
    if dev_type == KDLCUDA {
        // memarray's own copies run on the legacy default stream (1): the producer makes
        // it wait for pending work.
        kwargs.set_item("stream", 1)?;
    }
    match obj.call_method("__dlpack__", (), Some(&kwargs)) {
        Ok(c) => Ok(c),
        Err(e) if e.is_instance_of::<PyTypeError>(py) => {
            kwargs.del_item("max_version")?;
            obj.call_method("__dlpack__", (), Some(&kwargs))
        }
        Err(e) => Err(e),
    }
}

static MAX_VERSION_KW: pyo3::sync::PyOnceLock<Py<pyo3::types::PyDict>> =
    pyo3::sync::PyOnceLock::new();

/// An exact `numpy.ndarray` taken for import (see [`take_numpy`]).
pub(crate) enum NumpyImport {
    /// Its memory, shared as it is: the import is done.
    Shared(Box<RawArray>),
    /// Its tensor, for [`crate::foreign::import`] (a copy, a refusal, or sharing after all).
    Tensor(ForeignTensor),
}

impl NumpyImport {
    /// The array, as `from_dlpack(x, copy=copy)` makes it.
    pub(crate) fn import(self, py: Python<'_>, copy: Option<bool>) -> PyResult<RawArray> {
        match self {
            NumpyImport::Shared(raw) => Ok(*raw),
            NumpyImport::Tensor(t) => crate::foreign::import(py, t, copy, None),
        }
    }
}

/// An exact `numpy.ndarray` (not a subclass, whose `__dlpack__` may be anyone's), read
/// from its fields ([`crate::numpy::layout`]) where it can be: with `share`, an array that can
/// be shared as it is comes back [`NumpyImport::Shared`] ([`crate::numpy::share`]), anything
/// else as a tensor ([`crate::numpy::view`]). Arrays the fields do not describe go through
/// their versioned capsule without the mapping checks
/// ([`ImportedTensor::from_versioned_trusted`]: NumPy's pointers are its own live
/// memory). `None` for any other object, or an array NumPy cannot export. Host data: no
/// stream, no `__dlpack_device__` call.
pub(crate) fn take_numpy(obj: &Bound<'_, PyAny>, share: bool) -> PyResult<Option<NumpyImport>> {
    let py = obj.py();
    if !obj.get_type().is(crate::dtype::ndarray_type(py)?) {
        return Ok(None);
    }
    if let Some(l) = crate::numpy::layout(obj)? {
        if share && let Some(raw) = crate::numpy::share(obj, &l) {
            return Ok(Some(NumpyImport::Shared(Box::new(raw))));
        }
        return crate::numpy::view(obj, &l).map(|t| Some(NumpyImport::Tensor(t)));
    }
    // A dtype memarray does not hold (strings, objects, a foreign byte order) is the
    // TypeError every dtype argument gives, naming it, not NumPy's BufferError from its
    // capsule; other dtype objects (np.longlong, ml_dtypes' bfloat16) go on.
    crate::dtype::parse_dtype(Some(&obj.getattr(pyo3::intern!(py, "dtype"))?))?;
    let kwargs = crate::once::once(&MAX_VERSION_KW, py, || -> PyResult<_> {
        let d = pyo3::types::PyDict::new(py);
        d.set_item("max_version", (1, 3))?;
        Ok(d.unbind())
    })?;
    // A dtype NumPy cannot export (bfloat16 from ml_dtypes) raises: the general path
    // (a copy through NumPy, or its own error) takes it.
    let Ok(cap) = obj.call_method(pyo3::intern!(py, "__dlpack__"), (), Some(kwargs.bind(py)))
    else {
        return Ok(None);
    };
    let raw = cap.as_ptr();
    // SAFETY: raw is a live object; the capsule API checks type and name, setting no
    // error when IsValid fails.
    unsafe {
        if ffi::PyCapsule_IsValid(raw, NAME_VERSIONED.as_ptr()) != 1 {
            return take_capsule(&cap).map(|t| Some(NumpyImport::Tensor(t.into_foreign())));
        }
        let p = ffi::PyCapsule_GetPointer(raw, NAME_VERSIONED.as_ptr());
        let p = NonNull::new(p.cast::<DLManagedTensorVersioned>())
            .ok_or_else(|| PyBufferError::new_err("DLPack capsule holds a null tensor"))?;
        if ffi::PyCapsule_SetName(raw, USED_VERSIONED.as_ptr()) != 0 {
            return Err(PyErr::fetch(py));
        }
        // An exact ndarray's capsule describes NumPy's own live memory.
        let t = ImportedTensor::from_versioned_trusted(p).py()?;
        Ok(Some(NumpyImport::Tensor(t.into_foreign())))
    }
}

/// Exports whose deleter has not run yet, `(unversioned, versioned)`: a diagnostic for
/// tests and leak hunts (every capsule ever made, consumed or not, must end at zero).
#[pyfunction]
pub fn _dlpack_live_exports() -> (usize, usize) {
    let stats = memarray_dlpack::pool_stats();
    (stats.unversioned.live, stats.versioned.live)
}

// The DLPack protocol of MemArray.
#[pymethods]
impl PyMemArray {
    /// Moves the data to `device_type` (default: where it is; a DLPack device type or any
    /// device word `move_memory` takes: "cpu", "cuda:1") and returns a context manager
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
            Some(dt) => Target::from_pair_args(dt, device_id)?,
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

    /// (device_type, device_id) of the current data: (kDLCPU, 0) or (kDLCUDA, id).
    fn __dlpack_device__(&self, py: Python<'_>) -> (i64, i64) {
        self.location_tuple(py)
    }
}
