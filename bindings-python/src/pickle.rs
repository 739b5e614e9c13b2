//! Pickling: `pickle`, `copy.deepcopy` and `multiprocessing` for every dtype and ndim.
//!
//! `__reduce_ex__` hands the data as one contiguous byte buffer: a snapshot, copied while
//! the array's calls are serialised, so a writer on another thread can neither tear it nor
//! change it later. With protocol 5 it is a `pickle.PickleBuffer` over
//! a [`HostBytes`] holding the snapshot (a `buffer_callback` takes it out of band with no
//! further copy); older protocols get `bytes`. Device-resident data is read back into the
//! snapshot (the array stays where it is) and comes back on the same device id when CUDA
//! and that device exist there, else on the host. A locked array refuses to pickle with
//! `LockError`. Unpickling validates dtype, shape and payload size before it allocates.

use crate::fork::Detach;
use std::sync::Arc;

use pyo3::exceptions::PyValueError;
use pyo3::prelude::*;
use pyo3::types::{PyBytes, PyTuple};

use memarray_core::{DType, HostBuffer, Location};
use memarray_cuda::array::RawArray;

use crate::array::PyMemArray;
use crate::convert;
use crate::convert::{host_kind_arg, host_kind_name, parse_shape};
use crate::errors::IntoPyResult;
use crate::host_pool;
use crate::host_pool::HostBytes;

/// `MemArray.__reduce_ex__`: `(memarray._pickle.rebuild, (data, dtype, shape, device,
/// device_id, host_memory))`.
pub fn reduce<'py>(
    py: Python<'py>,
    arr: &PyMemArray,
    protocol: i64,
) -> PyResult<Bound<'py, PyAny>> {
    let (bytes, dtype, shape, loc, device_id, host_kind) = arr
        .with_detached(py, |raw| -> memarray_cuda::Result<_> {
            raw.check(None)?;
            // SAFETY: read_all writes every byte before anything reads the buffer. From the
            // NumPy block pool: recycled, huge-paged memory, no first-touch faults.
            let mut copy = unsafe { HostBuffer::uninit_in(raw.nbytes(), host_pool::resource()) }?;
            raw.read_all(copy.as_mut_slice(), None)?;
            let bytes = Arc::new(copy);
            Ok((
                bytes,
                raw.dtype(),
                raw.shape().to_vec(),
                raw.location(),
                raw.device_id(),
                raw.host_kind(),
            ))
        })
        .py()?;
    let data: Bound<'py, PyAny> = if protocol >= 5 {
        let holder = Bound::new(py, HostBytes::read_only(bytes))?;
        py.import("pickle")?
            .getattr("PickleBuffer")?
            .call1((holder,))?
    } else {
        PyBytes::new(py, bytes.as_slice()).into_any()
    };
    let device: Option<u32> = match loc {
        Location::Host => None,
        Location::Device(id) => Some(id),
    };
    let args = (
        data,
        dtype.name(),
        PyTuple::new(py, shape)?,
        device,
        device_id,
        host_kind_name(host_kind),
    );
    let rebuild = py.import("memarray._pickle")?.getattr("rebuild")?;
    Ok(PyTuple::new(py, [rebuild, args.into_pyobject(py)?.into_any()])?.into_any())
}

/// The inverse of [`reduce`]: a new array holding `data` (a C-contiguous byte buffer of
/// exactly the array's size), on `device` when CUDA and that device are present here.
#[pyfunction]
#[pyo3(signature = (data, dtype, shape, device, device_id, host_memory))]
pub fn _from_pickle(
    py: Python<'_>,
    data: pyo3::buffer::PyBuffer<u8>,
    dtype: &Bound<'_, PyAny>,
    shape: &Bound<'_, PyAny>,
    device: Option<&Bound<'_, PyAny>>,
    device_id: &Bound<'_, PyAny>,
    host_memory: &Bound<'_, PyAny>,
) -> PyResult<PyMemArray> {
    // Everything is checked before anything is allocated.
    let dtype = DType::from_name(&convert::text(dtype, "dtype")?).py()?;
    let shape = parse_shape(shape)?;
    let device: Option<u32> = convert::opt_int(device, "device")?;
    let device_id: u32 = convert::int(device_id, "device_id")?;
    let kind = host_kind_arg(Some(host_memory))?;
    let nbytes = memarray_core::shape::validate(&shape, dtype.size()).py()?;
    if !data.is_c_contiguous() {
        return Err(PyValueError::new_err(
            "pickled array data must be contiguous",
        ));
    }
    let addr = data.buf_ptr() as usize;
    let len = data.len_bytes();
    if len != nbytes {
        return Err(PyValueError::new_err(format!(
            "pickled payload holds {len} bytes; a {dtype} array of shape {shape:?} needs \
             {nbytes}"
        )));
    }
    let raw = py
        .detach_section(|| -> memarray_cuda::Result<RawArray> {
            let mut raw = match kind {
                Some(kind) => RawArray::zeros_in(dtype, &shape, device_id, kind)
                    .or_else(|_| RawArray::zeros(dtype, &shape, device_id))?,
                None => RawArray::zeros(dtype, &shape, device_id)?,
            };
            let bytes: &[u8] = if len == 0 {
                &[]
            } else {
                // SAFETY: `data` (a PyBuffer held by this frame) keeps `len` bytes at
                // addr alive and unmoved until it is released after this closure.
                unsafe { std::slice::from_raw_parts(addr as *const u8, len) }
            };
            raw.write_all(bytes, None)?;
            if let Some(id) = device.filter(|&id| device_present(id)) {
                raw.move_memory(Location::Device(id), None, true, None)?;
            }
            Ok(raw)
        })
        .py()?;
    Ok(raw.into())
}

/// Whether device `id` exists on this machine (no CUDA: false, never an error).
fn device_present(id: u32) -> bool {
    memarray_cuda::device_count().is_ok_and(|n| id < n)
}

// Pickle support of MemArray.
#[pymethods]
impl PyMemArray {
    /// Pickle support (protocol 5 hands the host data out of band, uncopied).
    fn __reduce_ex__<'py>(
        &self,
        py: Python<'py>,
        protocol: &Bound<'py, PyAny>,
    ) -> PyResult<Bound<'py, PyAny>> {
        crate::pickle::reduce(py, self, convert::int(protocol, "protocol")?)
    }
}
