//! The CUDA Array Interface (v3) both ways: a MemArray's `__cuda_array_interface__` dict
//! (device data only; pending work named as its `stream`), and the import of any producer's
//! dict (`memarray.cuda.from_cuda_array_interface`), parsed into a `ForeignTensor` for
//! memarray-cuda's one import, which DLPack tensors take too.

use pyo3::exceptions::{PyBufferError, PyTypeError, PyValueError};
use pyo3::intern;
use pyo3::prelude::*;
use pyo3::sync::PyOnceLock;
use pyo3::types::{PyDict, PyString, PyTuple};

use memarray_core::{DType, ForeignTensor, Location, Place};
use memarray_cuda::StreamRef;

use crate::array::PyMemArray;
use crate::convert;
use crate::errors::IntoPyResult;

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
        cuda_array_interface(py, self)
    }
}
