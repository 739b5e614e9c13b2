//! The relief path's Python half: the relievers that make torch, CuPy and RMM give cached
//! memory back when memarray runs out (`memarray/_pressure.py`), its counters, the
//! libraries' budgets and live bytes (the ledger), and the Python stack provider of the
//! tracking adaptor.

use std::sync::Arc;

use pyo3::exceptions::{PyTypeError, PyValueError};
use pyo3::prelude::*;
use pyo3::types::{PyDict, PyList};

use memarray_core::Location;
use memarray_core::Source;
use memarray_core::resource::ledger::{self, BudgetScope};
use memarray_core::resource::watermark;
use memarray_core::resource::{pressure, pressure_statistics};

use crate::device::parse_device;

/// The process-wide counters of the relief path, as a dict.
#[pyfunction]
pub(super) fn pressure_stats(py: Python<'_>) -> PyResult<Bound<'_, PyDict>> {
    let s = pressure_statistics();
    let d = PyDict::new(py);
    d.set_item("events", s.events)?;
    d.set_item("recovered", s.recovered)?;
    d.set_item("failed", s.failed)?;
    d.set_item("own_released_bytes", s.own_released_bytes)?;
    d.set_item("spills", s.spills)?;
    d.set_item("spilled_bytes", s.spilled_bytes)?;
    let libs = PyDict::new(py);
    for (lib, calls, bytes) in s.relievers {
        let row = PyDict::new(py);
        row.set_item("calls", calls)?;
        row.set_item("released_bytes", bytes)?;
        libs.set_item(lib.name(), row)?;
    }
    d.set_item("libraries", libs)?;
    let mine = PyList::empty(py);
    for r in s.user_relievers {
        let row = PyDict::new(py);
        row.set_item("id", r.id)?;
        row.set_item("name", r.name)?;
        row.set_item("device", r.device)?;
        row.set_item("source", r.library.map(Source::name))?;
        row.set_item("priority", r.priority)?;
        row.set_item("calls", r.calls)?;
        row.set_item("released_bytes", r.released_bytes)?;
        row.set_item("failures", r.failures)?;
        mine.append(row)?;
    }
    d.set_item("relievers", mine)?;
    Ok(d)
}

/// Registers `f(device, nbytes) -> int | None` as a reliever of the user's (see
/// `memarray.resources.register_reliever`); returns its id. An exception it raises is
/// reported as unraisable and counted as a failure; the allocation goes on.
#[pyfunction]
#[pyo3(signature = (f, name, device, source, priority))]
pub(super) fn add_reliever(
    f: Py<PyAny>,
    name: &str,
    device: Option<u32>,
    source: Option<&str>,
    priority: i32,
) -> PyResult<u64> {
    let library = source.map(crate::sources::named).transpose()?;
    let reliever: pressure::UserReliever = Arc::new(move |device, nbytes| {
        Python::try_attach(|py| {
            f.call1(py, (device, nbytes))
                .and_then(|r| r.extract::<Option<usize>>(py))
                .map(Option::unwrap_or_default)
                .map_err(|e| {
                    let text = e.to_string();
                    e.write_unraisable(py, None);
                    text
                })
        })
        .unwrap_or_else(|| Err("no Python interpreter to call it".into()))
    });
    Ok(pressure::add_reliever(
        name, reliever, device, library, priority,
    ))
}

/// Removes the user's reliever `id`; whether it was registered.
#[pyfunction]
pub(super) fn remove_reliever(id: u64) -> bool {
    pressure::remove_reliever(id)
}

/// Asks `memarray._pressure.relieve(library, device)` to make `library` give its cache
/// back (None: the library is not loaded). Without a usable interpreter it was not asked;
/// on a Python error it released nothing.
pub(super) fn python_reliever(library: Source) -> pressure::Reliever {
    Arc::new(move |device| {
        Python::try_attach(|py| {
            py.import("memarray._pressure")
                .and_then(|m| m.call_method1("relieve", (library.name(), device)))
                .and_then(|r| r.extract::<Option<usize>>())
                .unwrap_or_else(|e| {
                    e.write_unraisable(py, None);
                    Some(0)
                })
        })
        .flatten()
    })
}

/// The Python stack of the allocating thread (innermost frame last), for tracking with
/// stacks on.
pub(super) fn python_stack() -> Option<String> {
    Python::try_attach(|py| {
        py.import("memarray._pressure")
            .and_then(|m| m.call_method0("stack"))
            .and_then(|s| s.extract::<String>())
            .ok()
    })
    .flatten()
}

/// Sets (`nbytes` an int or a size such as "4GiB") or removes (None) the budget of
/// `source` (memarray or one of its known libraries) on `device`: None every device,
/// "host" host memory, or a device id.
#[pyfunction]
#[pyo3(signature = (source, nbytes, device))]
pub(super) fn set_budget(
    source: &Bound<'_, PyAny>,
    nbytes: Option<&Bound<'_, PyAny>>,
    device: Option<&Bound<'_, PyAny>>,
) -> PyResult<()> {
    let source = library(&crate::convert::text(source, "source")?)?;
    let bytes = nbytes
        .filter(|n| !n.is_none())
        .map(byte_count)
        .transpose()?;
    let scope = match device.filter(|d| !d.is_none()) {
        None => BudgetScope::EveryDevice,
        Some(d) => BudgetScope::Place(parse_device(Some(d))?),
    };
    ledger::set_budget(source, scope, bytes).map_err(crate::errors::core_err)
}

/// Every library's live bytes, budget and refusals per place (see
/// `memarray.resources.library_usage`).
#[pyfunction]
pub(super) fn library_usage(py: Python<'_>) -> PyResult<Bound<'_, PyList>> {
    let rows = PyList::empty(py);
    for u in ledger::usage() {
        let row = place_row(py, u.place)?;
        row.set_item("source", u.source.name())?;
        row.set_item("live_bytes", u.live_bytes)?;
        row.set_item("budget", u.budget)?;
        row.set_item("refused", u.refused)?;
        rows.append(row)?;
    }
    Ok(rows)
}

/// A row whose `device` is `place`: a device id, or "host".
fn place_row(py: Python<'_>, place: Location) -> PyResult<Bound<'_, PyDict>> {
    let row = PyDict::new(py);
    match place {
        Location::Host => row.set_item("device", "host")?,
        Location::Device(d) => row.set_item("device", d)?,
    }
    Ok(row)
}

/// "memarray" or one of the known libraries.
fn library(name: &str) -> PyResult<Source> {
    if name == "memarray" {
        Ok(Source::MEMARRAY)
    } else {
        crate::sources::named(name)
    }
}

/// Sets the watermark of `device` ("host", a device id or "cuda:N") at `nbytes` with
/// `f(device, held, watermark)` called on memarray's notifier thread (see
/// `memarray.resources.set_watermark`); `nbytes` None removes it.
#[pyfunction]
#[pyo3(signature = (device, nbytes, f))]
pub(super) fn set_watermark(
    device: &Bound<'_, PyAny>,
    nbytes: Option<&Bound<'_, PyAny>>,
    f: Option<Py<PyAny>>,
) -> PyResult<()> {
    let place = parse_device(Some(device))?;
    let set = match (nbytes.filter(|n| !n.is_none()), f) {
        (None, _) => None,
        (Some(_), None) => {
            return Err(PyTypeError::new_err("a watermark needs a callback"));
        }
        (Some(n), Some(f)) => {
            let bytes = byte_count(n)?;
            let callback: watermark::WatermarkCallback = Arc::new(move |place, held, level| {
                Python::try_attach(|py| {
                    let device = match place {
                        Location::Host => "host".into_pyobject(py)?.into_any().unbind(),
                        Location::Device(d) => d.into_pyobject(py)?.into_any().unbind(),
                    };
                    f.call1(py, (device, held, level))
                        .map(drop)
                        .inspect_err(|e| {
                            e.clone_ref(py).write_unraisable(py, None);
                        })
                })
                .map_or_else(
                    || Err("no Python interpreter to call it".to_string()),
                    |r| r.map_err(|e| e.to_string()),
                )
            });
            Some((bytes, callback))
        }
    };
    watermark::set_watermark(place, set).map_err(crate::errors::core_err)
}

/// Every watermark set, with its counters (see `memarray.resources.watermarks`).
#[pyfunction]
pub(super) fn watermarks(py: Python<'_>) -> PyResult<Bound<'_, PyList>> {
    let rows = PyList::empty(py);
    for w in watermark::watermarks() {
        let row = place_row(py, w.place)?;
        row.set_item("watermark", w.watermark)?;
        row.set_item("crossings", w.crossings)?;
        row.set_item("failures", w.failures)?;
        rows.append(row)?;
    }
    Ok(rows)
}

/// An int, or a size such as "4GiB".
fn byte_count(n: &Bound<'_, PyAny>) -> PyResult<u64> {
    if n.is_instance_of::<pyo3::types::PyString>() {
        memarray_cuda::env::parse_bytes(&crate::convert::text(n, "nbytes")?)
            .map_err(|e| PyValueError::new_err(format!("nbytes: {e}")))
    } else {
        crate::convert::int::<u64>(n, "nbytes")
    }
}
