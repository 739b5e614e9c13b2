//! `memarray.load_safetensors` and `memarray.save_safetensors` over
//! `RawArray::load_safetensors` and `SafetensorsWriter` (the Python halves, with the
//! progress bar and the argument checks, are in `memarray/_files.py`).

use pyo3::exceptions::PyTypeError;
use pyo3::prelude::*;
use pyo3::types::{PyDict, PyList};

use memarray_cuda::{RawArray, SafetensorsWriter};

use crate::array::PyMemArray;
use crate::born::Progress;
use crate::convert::{host_kind_arg, text};
use crate::device::parse_device;
use crate::errors::IntoPyResult;
use crate::fork::Detach;

/// Reads the safetensors file at `path` into a dict of new arrays on `device` (None: the
/// host), in data order; `names` (a list of str, or None for every tensor) picks some.
/// Returns `(arrays, metadata)`.
#[pyfunction]
#[pyo3(signature = (path, device=None, host_memory=None, names=None, _progress=None))]
pub fn load_safetensors<'py>(
    py: Python<'py>,
    path: &Bound<'py, PyAny>,
    device: Option<&Bound<'py, PyAny>>,
    host_memory: Option<&Bound<'py, PyAny>>,
    names: Option<&Bound<'py, PyAny>>,
    _progress: Option<&Bound<'py, Progress>>,
) -> PyResult<(Bound<'py, PyDict>, Bound<'py, PyDict>)> {
    let location = parse_device(device)?;
    let kind = host_kind_arg(host_memory)?;
    let path = crate::convert::path(path, "path")?;
    let names: Option<Vec<String>> = match names.filter(|n| !n.is_none()) {
        None => None,
        Some(n) => {
            let list = n.cast::<PyList>().map_err(|_| {
                PyTypeError::new_err(format!(
                    "names must be a list of str or None, not {}",
                    crate::errors::type_name(n)
                ))
            })?;
            Some(
                list.iter()
                    .map(|x| text(&x, "a name"))
                    .collect::<PyResult<_>>()?,
            )
        }
    };
    let done = Progress::counter(_progress);
    let (arrays, metadata) = py
        .detach_section(|| {
            let borrowed: Option<Vec<&str>> = names
                .as_ref()
                .map(|v| v.iter().map(String::as_str).collect());
            RawArray::load_safetensors(&path, location, kind, borrowed.as_deref(), &done)
        })
        .py()?;
    let out = PyDict::new(py);
    for (name, raw) in arrays {
        out.set_item(name, PyMemArray::from(raw))?;
    }
    let meta = PyDict::new(py);
    for (k, v) in metadata {
        meta.set_item(k, v)?;
    }
    Ok((out, meta))
}

/// Writes `arrays` (a list of `(name, MemArray)`, names checked by the caller) to `path`
/// as a safetensors file with `metadata` (a list of `(str, str)`): the header first, then
/// each array's data in the file's order, each array held only while its data is written.
#[pyfunction]
#[pyo3(signature = (path, arrays, metadata, _progress=None))]
pub fn save_safetensors(
    py: Python<'_>,
    path: &Bound<'_, PyAny>,
    arrays: Vec<(String, PyRef<'_, PyMemArray>)>,
    metadata: Vec<(String, String)>,
    _progress: Option<&Bound<'_, Progress>>,
) -> PyResult<()> {
    let path = crate::convert::path(path, "path")?;
    let shapes: Vec<_> = arrays
        .iter()
        .map(|(_, a)| a.peek(py, |raw| (raw.dtype(), raw.shape().to_vec())))
        .collect();
    let entries: Vec<memarray_core::safetensors::Entry<'_>> = arrays
        .iter()
        .zip(&shapes)
        .map(
            |((name, _), (dtype, shape))| memarray_core::safetensors::Entry {
                name,
                dtype: *dtype,
                shape,
            },
        )
        .collect();
    let done = Progress::counter(_progress);
    let mut w = py
        .detach_section(|| SafetensorsWriter::create(&path, &entries, &metadata))
        .py()?;
    for i in w.order().to_vec() {
        let a = &arrays[i].1;
        a.with_detached(py, |raw| {
            raw.check(None)?;
            w.write(raw, &done)
        })
        .py()?;
    }
    py.detach_section(|| w.finish()).py()
}
