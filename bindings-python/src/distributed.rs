//! `memarray._memarray.distributed`: NCCL communicators over `memarray_cuda::nccl`
//! (the Python module `memarray.distributed` wraps these), and `memarray.scatter` /
//! `memarray.gather`. Every call that may block (communicator setup, the first collective
//! connecting peers, waits for arrays) runs with the GIL released.

use crate::fork::Detach;
use std::mem::ManuallyDrop;
use std::path::PathBuf;
use std::sync::Arc;

use pyo3::prelude::*;
use pyo3::types::{PyBytes, PyList};

use memarray_cuda::RawArray;
use memarray_cuda::nccl::{self, Comm, ReduceOp, UniqueId};

use crate::array::{PyMemArray, drop_detached};
use crate::convert;
use crate::device::parse_device;
use crate::errors::IntoPyResult;
use crate::locked::Locked;
use crate::stream::parse_move_stream;

/// One rank of an NCCL communicator on one device (from `memarray.distributed.init` or
/// `communicators`). Collectives take MemArrays whose data is on this rank's device and
/// run on `stream` (else the array's last stream, else the legacy default stream) after
/// the arrays' pending work, without blocking the host.
#[pyclass(name = "Communicator", module = "memarray.distributed", frozen)]
pub struct PyComm {
    /// Dropped in [`Drop`] with the GIL released: destroying a communicator flushes its
    /// queued collectives.
    comm: ManuallyDrop<Arc<Comm>>,
}

impl Drop for PyComm {
    fn drop(&mut self) {
        // SAFETY: `comm` is taken exactly once, here, and never used afterwards.
        let comm = unsafe { ManuallyDrop::take(&mut self.comm) };
        drop_detached(comm);
    }
}

impl PyComm {
    /// Runs `f` on `array` (locked, GIL released).
    fn one(
        &self,
        py: Python<'_>,
        call: &str,
        array: &Bound<'_, PyAny>,
        f: impl FnOnce(&Comm, &mut RawArray) -> nccl::Result<()> + Send,
    ) -> PyResult<()> {
        let a = PyMemArray::arg(array, call)?.get();
        let comm: &Comm = &self.comm;
        py.detach_section(|| {
            let mut g = a.shared.state();
            // A spilled array comes back before the collective reads or writes it.
            g.restore(None, false, None)?;
            f(comm, &mut g)
        })
        .py()
    }

    /// Runs `f` on `array` and `out`, two distinct arrays (both locked in id order,
    /// GIL released).
    fn pair(
        &self,
        py: Python<'_>,
        call: &'static str,
        array: &Bound<'_, PyAny>,
        out: &Bound<'_, PyAny>,
        f: impl FnOnce(&Comm, &mut RawArray, &mut RawArray) -> nccl::Result<()> + Send,
    ) -> PyResult<()> {
        let (a, o) = (
            PyMemArray::arg(array, call)?.get(),
            PyMemArray::arg(out, call)?.get(),
        );
        let comm: &Comm = &self.comm;
        py.detach_section(|| {
            let mut locked = Locked::new(&[a, o]);
            match locked.pair_mut(a, o) {
                Some((a, o)) => {
                    a.restore(None, false, None)?;
                    o.restore(None, false, None)?;
                    f(comm, a, o)
                }
                None => Err(nccl::NcclError::Call {
                    call,
                    reason: "out must be another array than the input".into(),
                }),
            }
        })
        .py()
    }
}

#[pymethods]
impl PyComm {
    /// This rank.
    #[getter]
    fn rank(&self) -> usize {
        self.comm.rank()
    }

    /// Ranks in the communicator.
    #[getter]
    fn size(&self) -> usize {
        self.comm.size()
    }

    /// The device ordinal this rank runs on.
    #[getter]
    fn device_id(&self) -> u32 {
        self.comm.device_id()
    }

    /// Reduces `array` over all ranks into `out` (same dtype and size), or in place when
    /// `out` is None or `array` itself. `op`: sum, prod, max, min, avg.
    #[pyo3(signature = (array, out=None, op="sum", stream=None))]
    fn all_reduce(
        &self,
        py: Python<'_>,
        array: &Bound<'_, PyAny>,
        out: Option<&Bound<'_, PyAny>>,
        op: &str,
        stream: Option<&Bound<'_, PyAny>>,
    ) -> PyResult<()> {
        let op = ReduceOp::from_name(op).py()?;
        let stream = parse_move_stream(stream)?;
        match out.filter(|o| !o.is(array)) {
            None => self.one(py, "all_reduce", array, |c, a| {
                c.all_reduce_in_place(a, op, stream)
            }),
            Some(out) => self.pair(py, "ncclAllReduce", array, out, |c, a, o| {
                c.all_reduce(a, o, op, stream)
            }),
        }
    }

    /// Every rank's `array` concatenated in rank order into `out` (size times as many
    /// elements, same dtype).
    #[pyo3(signature = (array, out, stream=None))]
    fn all_gather(
        &self,
        py: Python<'_>,
        array: &Bound<'_, PyAny>,
        out: &Bound<'_, PyAny>,
        stream: Option<&Bound<'_, PyAny>>,
    ) -> PyResult<()> {
        let stream = parse_move_stream(stream)?;
        self.pair(py, "ncclAllGather", array, out, |c, a, o| {
            c.all_gather(a, o, stream)
        })
    }

    /// This rank's block of the reduction over ranks of `array` into `out` (`array` holds
    /// size blocks the size of `out`).
    #[pyo3(signature = (array, out, op="sum", stream=None))]
    fn reduce_scatter(
        &self,
        py: Python<'_>,
        array: &Bound<'_, PyAny>,
        out: &Bound<'_, PyAny>,
        op: &str,
        stream: Option<&Bound<'_, PyAny>>,
    ) -> PyResult<()> {
        let op = ReduceOp::from_name(op).py()?;
        let stream = parse_move_stream(stream)?;
        self.pair(py, "ncclReduceScatter", array, out, |c, a, o| {
            c.reduce_scatter(a, o, op, stream)
        })
    }

    /// Copies rank `root`'s (default 0) `array` into `array` on every rank.
    #[pyo3(signature = (array, root=None, stream=None))]
    fn broadcast(
        &self,
        py: Python<'_>,
        array: &Bound<'_, PyAny>,
        root: Option<&Bound<'_, PyAny>>,
        stream: Option<&Bound<'_, PyAny>>,
    ) -> PyResult<()> {
        let stream = parse_move_stream(stream)?;
        let root: usize = convert::opt_int(root, "root")?.unwrap_or(0);
        self.one(py, "broadcast", array, |c, a| c.broadcast(a, root, stream))
    }

    /// Sends `array` to rank `peer`, which receives it with `recv` into an array of the
    /// same size. Pair sends and receives that run at once inside `group()`.
    #[pyo3(signature = (array, peer, stream=None))]
    fn send(
        &self,
        py: Python<'_>,
        array: &Bound<'_, PyAny>,
        peer: &Bound<'_, PyAny>,
        stream: Option<&Bound<'_, PyAny>>,
    ) -> PyResult<()> {
        let stream = parse_move_stream(stream)?;
        let peer: usize = convert::int(peer, "peer")?;
        self.one(py, "send", array, |c, a| c.send(a, peer, stream))
    }

    /// Receives into `array` what rank `peer` sends.
    #[pyo3(signature = (array, peer, stream=None))]
    fn recv(
        &self,
        py: Python<'_>,
        array: &Bound<'_, PyAny>,
        peer: &Bound<'_, PyAny>,
        stream: Option<&Bound<'_, PyAny>>,
    ) -> PyResult<()> {
        let stream = parse_move_stream(stream)?;
        let peer: usize = convert::int(peer, "peer")?;
        self.one(py, "recv", array, |c, a| c.recv(a, peer, stream))
    }

    /// Aborts the communicator (`ncclCommAbort`) from any thread: its queued NCCL work
    /// stops, so a wait on a send or receive whose peer died or never calls returns, and
    /// later calls on it raise. What unfinished receives were writing did not arrive
    /// (check `aborted` after a wait). Every other rank must abort its communicator too.
    /// A second call does nothing.
    fn abort(&self, py: Python<'_>) -> PyResult<()> {
        let comm: &Comm = &self.comm;
        py.detach_section(|| comm.abort()).py()
    }

    /// Whether `abort()` ran.
    #[getter]
    fn aborted(&self) -> bool {
        self.comm.is_aborted()
    }

    fn __repr__(&self) -> String {
        format!(
            "memarray.distributed.Communicator(rank={}, size={}, device=cuda:{}{})",
            self.comm.rank(),
            self.comm.size(),
            self.comm.device_id(),
            if self.comm.is_aborted() {
                ", aborted"
            } else {
                ""
            }
        )
    }
}

/// Loads libnccl (from `path`, else MEMARRAY_NCCL_LIBRARY, else the loader path); returns
/// (path, (major, minor, patch)).
#[pyfunction]
#[pyo3(signature = (path=None))]
fn load(py: Python<'_>, path: Option<&Bound<'_, PyAny>>) -> PyResult<(PathBuf, (u32, u32, u32))> {
    let path = match path.filter(|p| !p.is_none()) {
        Some(p) => Some(convert::path(p, "path")?),
        None => None,
    };
    let info = py.detach_section(|| nccl::load(path.as_deref())).py()?;
    Ok((info.path, info.version))
}

/// Whether libnccl is loaded.
#[pyfunction]
fn is_loaded() -> bool {
    nccl::is_loaded()
}

/// A new NCCL unique id (128 bytes).
#[pyfunction]
fn unique_id(py: Python<'_>) -> PyResult<Bound<'_, PyBytes>> {
    let id = py.detach_section(UniqueId::new).py()?;
    Ok(PyBytes::new(py, &id.to_bytes()))
}

/// Shares a unique id through the file `path` (rank 0 writes, the others wait up to
/// `timeout` seconds); returns its 128 bytes.
#[pyfunction]
fn exchange_id_file<'py>(
    py: Python<'py>,
    path: &Bound<'_, PyAny>,
    rank: &Bound<'_, PyAny>,
    timeout: f64,
) -> PyResult<Bound<'py, PyBytes>> {
    let path = convert::path(path, "path")?;
    let rank: usize = convert::int(rank, "rank")?;
    // Infinity waits forever; NaN and negatives are a ValueError, never a panic.
    let timeout = convert::seconds(timeout, "timeout")?;
    let id = py
        .detach_section(|| UniqueId::exchange_file(&path, rank, timeout))
        .py()?;
    Ok(PyBytes::new(py, &id.to_bytes()))
}

/// Rank `rank` of `size` on `device`, joining the communicator named by `unique_id`
/// (bytes or 256 hex digits). Returns once every rank has joined.
#[pyfunction]
fn init_rank(
    py: Python<'_>,
    device: &Bound<'_, PyAny>,
    size: &Bound<'_, PyAny>,
    rank: &Bound<'_, PyAny>,
    unique_id: &Bound<'_, PyAny>,
) -> PyResult<PyComm> {
    let device: u32 = convert::int(device, "device")?;
    let size: usize = convert::int(size, "size")?;
    let rank: usize = convert::int(rank, "rank")?;
    let id = match unique_id.extract::<Vec<u8>>() {
        Ok(b) if !unique_id.is_instance_of::<pyo3::types::PyString>() => UniqueId::from_bytes(&b),
        _ => UniqueId::from_hex(&convert::text(unique_id, "unique_id")?),
    }
    .py()?;
    let comm = py
        .detach_section(|| Comm::init_rank(device, size, rank, &id))
        .py()?;
    Ok(PyComm {
        comm: ManuallyDrop::new(Arc::new(comm)),
    })
}

/// One communicator per device in `devices` (rank i on devices[i]), for one process.
#[pyfunction]
fn init_all<'py>(py: Python<'py>, devices: &Bound<'py, PyAny>) -> PyResult<Bound<'py, PyList>> {
    let devices: Vec<u32> = devices
        .try_iter()?
        .map(|d| convert::int(&d?, "devices entry"))
        .collect::<PyResult<_>>()?;
    let comms = py.detach_section(|| Comm::init_all(&devices)).py()?;
    let out = PyList::empty(py);
    for c in comms {
        let comm = ManuallyDrop::new(Arc::new(c));
        out.append(Py::new(py, PyComm { comm })?)?;
    }
    Ok(out)
}

/// ncclGroupStart (this thread).
#[pyfunction]
fn group_start() -> PyResult<()> {
    nccl::group_start().py()
}

/// ncclGroupEnd (this thread): launches the group's collectives (GIL released).
#[pyfunction]
fn group_end(py: Python<'_>) -> PyResult<()> {
    py.detach_section(nccl::group_end).py()
}

/// Splits `array` along its first axis into len(devices) new arrays, part i on
/// devices[i] (an int or "cuda:N"; sizes as numpy.array_split), by peer copies from device
/// data or host-to-device copies from host data. The array is left as it was.
#[pyfunction]
pub fn scatter<'py>(
    py: Python<'py>,
    array: &Bound<'py, PyAny>,
    devices: &Bound<'py, PyAny>,
) -> PyResult<Bound<'py, PyList>> {
    let a = PyMemArray::arg(array, "scatter")?.get();
    let mut ids = Vec::new();
    for d in devices.try_iter()? {
        match parse_device(Some(&d?))? {
            memarray_core::Location::Device(id) => ids.push(id),
            memarray_core::Location::Host => {
                return Err(pyo3::exceptions::PyValueError::new_err(
                    "scatter splits across CUDA devices; \"cpu\" is not one",
                ));
            }
        }
    }
    let parts = py
        .detach_section(|| a.shared.state().scatter(&ids, None))
        .py()?;
    let out = PyList::empty(py);
    for p in parts {
        out.append(Py::new(py, PyMemArray::from(p))?)?;
    }
    Ok(out)
}

/// One new array at `device` ("cpu", "cuda:N", an int; default cuda:0) holding `parts` (MemArrays of one
/// dtype and trailing shape, anywhere) concatenated along the first axis.
#[pyfunction]
#[pyo3(signature = (parts, device=None))]
pub fn gather(
    py: Python<'_>,
    parts: &Bound<'_, PyAny>,
    device: Option<&Bound<'_, PyAny>>,
) -> PyResult<PyMemArray> {
    let to = match device {
        Some(d) => parse_device(Some(d))?,
        None => memarray_core::Location::Device(0),
    };
    let mut refs: Vec<Bound<'_, PyMemArray>> = Vec::new();
    for p in parts.try_iter()? {
        refs.push(PyMemArray::arg(&p?, "gather")?.clone());
    }
    let parts: Vec<&PyMemArray> = refs.iter().map(|r| r.get()).collect();
    let out = py
        .detach_section(|| {
            let locked = Locked::new(&parts);
            // Every part was locked above; `get` finds each.
            let raws: Vec<&RawArray> = parts.iter().filter_map(|p| locked.get(p)).collect();
            RawArray::gather(&raws, to)
        })
        .py()?;
    Ok(out.into())
}

/// Registers `distributed` (NCCL) as a submodule.
pub fn register(m: &Bound<'_, PyModule>) -> PyResult<()> {
    let py = m.py();
    let d = PyModule::new(py, "distributed")?;
    d.add_class::<PyComm>()?;
    d.add_function(wrap_pyfunction!(load, &d)?)?;
    d.add_function(wrap_pyfunction!(is_loaded, &d)?)?;
    d.add_function(wrap_pyfunction!(unique_id, &d)?)?;
    d.add_function(wrap_pyfunction!(exchange_id_file, &d)?)?;
    d.add_function(wrap_pyfunction!(init_rank, &d)?)?;
    d.add_function(wrap_pyfunction!(init_all, &d)?)?;
    d.add_function(wrap_pyfunction!(group_start, &d)?)?;
    d.add_function(wrap_pyfunction!(group_end, &d)?)?;
    m.add_submodule(&d)?;
    m.add_function(wrap_pyfunction!(scatter, m)?)?;
    m.add_function(wrap_pyfunction!(gather, m)?)?;
    Ok(())
}
