//! `memarray.move_many`: many arrays moved in one call.

use crate::fork::Detach;
use std::sync::Arc;

use pyo3::exceptions::PyTypeError;
use pyo3::prelude::*;
use pyo3::types::PyList;

use memarray_core::{HostBuffer, Location};
use memarray_cuda::array::Fill;
use memarray_cuda::{RawArray, StreamRef};

use crate::array::PyMemArray;
use crate::born::Progress;
use crate::device::parse_device;
use crate::errors::IntoPyResult as _;
use crate::locked::Locked;
use crate::stream::parse_move_stream;
use crate::table::PackTable;

/// Moves every array in `arrays` to `device` ("cpu", "cuda", "cuda:N", an int, a DLPack
/// pair) in one pass and returns them as MemArrays, in order. MemArrays move in place (and
/// come back as themselves); NumPy arrays and other DLPack producers are imported without a
/// wrapping call each (NumPy's zero-copy), moved, and returned as new MemArrays that no
/// longer hold the producer's host memory once they are on a device. Small pageable arrays
/// are packed into one pinned buffer, the copies go to the driver as one batch, and the
/// call waits once. If any MemArray is locked (LockError), nothing moves. The GIL is
/// released throughout the copies. The same array may appear more than once. A batch of
/// 64 MiB or more still running after a second shows a progress bar in an interactive
/// session (`memarray.set_progress`).
#[pyfunction]
#[pyo3(signature = (arrays, device, stream=None, _progress=None), text_signature = "(arrays, device, stream=None)")]
pub fn move_many<'py>(
    py: Python<'py>,
    arrays: &Bound<'py, PyAny>,
    device: &Bound<'py, PyAny>,
    stream: Option<&Bound<'py, PyAny>>,
    _progress: Option<&Bound<'py, Progress>>,
) -> PyResult<Bound<'py, PyList>> {
    let target = parse_device(Some(device))?;
    let stream_arg = stream;
    let stream = parse_move_stream(stream)?;
    let mut refs: Vec<Bound<'py, PyMemArray>> = Vec::new();
    // Which of them memarray made here (imports), by position in `refs`.
    let mut made: Vec<bool> = Vec::new();
    for item in arrays.try_iter()? {
        let item = item?;
        if let Ok(a) = item.cast::<PyMemArray>() {
            refs.push(a.clone());
            made.push(false);
            continue;
        }
        let raw = import_item(py, &item)?;
        refs.push(Bound::new(py, PyMemArray::from(raw))?);
        made.push(true);
    }
    let arrays: Vec<&PyMemArray> = refs.iter().map(|r| r.get()).collect();
    let list = PyList::new(py, &refs)?;
    let total: usize = arrays.iter().map(|a| a.peek(py, |raw| raw.nbytes())).sum();
    let helper = match _progress {
        None if total >= PROGRESS_FROM => Some(py.import("memarray._progress")?),
        _ => None,
    };
    let released: Vec<Arc<HostBuffer>> = match helper {
        Some(helper) if helper.call_method1("wanted", (total,))?.is_truthy()? => {
            // memarray._progress calls this function again, with a counter, in a thread
            // of its own, and draws the bar while it runs.
            helper.call_method1("move_many", (&list, device, stream_arg, total))?;
            made_hosts(&arrays, &made, |a, f| a.peek(py, f))
        }
        _ => {
            let done = Progress::counter(_progress);
            py.detach_section(|| -> memarray_cuda::Result<_> {
                let mut all = Locked::new(&arrays);
                RawArray::move_many_counted(&mut all.all_mut(), target, stream, &done)?;
                drop(all); // the locks, before each state is taken again below
                Ok(made_hosts(&arrays, &made, |a, f| f(&mut a.shared.state())))
            })
            .py()?
        }
    };
    // The copies are done (move_many waits): imports let go of the producers' memory,
    // dropped here with the GIL held (NumPy's deleter).
    drop(released);
    Ok(list)
}

/// The host memory of the arrays `move_many` imported (`made`), taken from them once they
/// are on their target; `on` runs a call on one array's state.
fn made_hosts(
    arrays: &[&PyMemArray],
    made: &[bool],
    on: impl Fn(&PyMemArray, fn(&mut RawArray) -> Option<Arc<HostBuffer>>) -> Option<Arc<HostBuffer>>,
) -> Vec<Arc<HostBuffer>> {
    arrays
        .iter()
        .zip(made)
        .filter(|&(_, &m)| m)
        .filter_map(|(a, _)| on(a, RawArray::take_host_copy))
        .collect()
}

/// Batches smaller than this never ask `memarray._progress` whether to draw a bar (the
/// same floor as its `SMALLEST`, so small calls pay nothing).
const PROGRESS_FROM: usize = 64 << 20;

/// `asarray(x, device=...)`'s fast path for an exact, C-contiguous NumPy array bound for a
/// CUDA device: a device-born array filled from the NumPy memory in one call (no Python
/// steps in between); None for anything else (the general path takes it).
#[pyfunction]
pub fn _numpy_to_device(
    py: Python<'_>,
    obj: &Bound<'_, PyAny>,
    device: &Bound<'_, PyAny>,
) -> PyResult<Option<PyMemArray>> {
    let Location::Device(id) = parse_device(Some(device))? else {
        return Ok(None);
    };
    // Not shared: only its bytes are read.
    let Some(crate::dlpack::NumpyImport::Tensor(t)) = crate::dlpack::take_numpy(obj, false)? else {
        return Ok(None);
    };
    if !t.is_c_contiguous() {
        return Ok(None);
    }
    let (dtype, shape, nbytes) = (t.dtype(), t.shape().to_vec(), t.nbytes());
    let src: &[u8] = if nbytes == 0 {
        &[]
    } else {
        // SAFETY: a validated C-contiguous host tensor: nbytes bytes at data(), alive
        // while `t` is (dropped below, after the copy).
        unsafe { std::slice::from_raw_parts(t.data() as *const u8, nbytes) }
    };
    let fill = || -> memarray_cuda::Result<RawArray> {
        let mut raw = RawArray::born_with(
            dtype,
            &shape,
            Location::Device(id),
            Fill::Unset,
            None,
            None,
            None,
        )?;
        if nbytes > 0 {
            raw.write_all(src, None)?; // returns once `src` has been read
        }
        Ok(raw)
    };
    // Small copies cost less than a GIL hand-off.
    let raw = if nbytes >= crate::host_pool::POOL_MIN_BYTES {
        py.detach_section(fill)
    } else {
        fill()
    }
    .py()?;
    drop(t);
    Ok(Some(raw.into()))
}

/// A non-MemArray item of `move_many` as an array over its memory (zero-copy where the
/// producer allows, as `from_dlpack`).
fn import_item(py: Python<'_>, item: &Bound<'_, PyAny>) -> PyResult<RawArray> {
    if let Some(n) = crate::dlpack::take_numpy(item, true)? {
        return n.import(py, None);
    }
    if !item.hasattr("__dlpack__")? {
        return Err(PyTypeError::new_err(format!(
            "move_many takes MemArrays, NumPy arrays and DLPack producers, got {}",
            crate::errors::type_name(item)
        )));
    }
    let cap = crate::dlpack::request_capsule(item)?;
    let t = crate::dlpack::take_capsule(&cap)?;
    crate::foreign::import(py, t.into_foreign(), None, Some(StreamRef::legacy()))
}

/// Where the last host-to-device `move_many` batch spent its time (microseconds), and
/// how many batches the driver took as one call: for benchmarks.
#[pyfunction]
pub fn _last_batch_profile(py: Python<'_>) -> PyResult<Bound<'_, pyo3::types::PyDict>> {
    let p = memarray_cuda::array::last_batch_profile();
    let d = pyo3::types::PyDict::new(py);
    d.set_item("arrays", p.arrays)?;
    d.set_item("stage_us", p.stage_us)?;
    d.set_item("prepare_us", p.prepare_us)?;
    d.set_item("enqueue_us", p.enqueue_us)?;
    d.set_item("wait_us", p.wait_us)?;
    d.set_item("batched", p.batched)?;
    d.set_item("refused", p.refused)?;
    Ok(d)
}

/// Where a pack places parts of `sizes` bytes (`memarray_cuda::copy::pack_layout`): each
/// part's offset and the pack's length, the same for host and device packs.
#[pyfunction]
pub fn _pack_layout(sizes: Vec<usize>) -> (Vec<usize>, usize) {
    memarray_cuda::copy::pack_layout(&sizes)
}

/// One uint8 array holding the bytes of every array in `arrays` (MemArrays whose data is
/// on one device, or all on the host), each at a 256-byte aligned offset, there; on a
/// device filled in one call (small ones by an SM copy kernel) and waited for; returned
/// with each array's (dtype, shape, offset) for `_unpack`. One transfer of the pack then
/// carries them all (memarray.Bundle).
/// With `max_each`, an array of more bytes is a ValueError before anything is copied.
#[pyfunction]
#[pyo3(signature = (arrays, max_each=None))]
pub fn _pack<'py>(
    py: Python<'py>,
    arrays: &Bound<'py, PyAny>,
    max_each: Option<usize>,
) -> PyResult<(PyMemArray, PackTable)> {
    let (parts, at) = memarrays(py, arrays, "_pack")?;
    let Some(at) = at else {
        return Err(pyo3::exceptions::PyValueError::new_err(
            "_pack needs at least one array",
        ));
    };
    let (pack, entries) = with_locked(py, &parts, quick_pack, |raws| {
        if let Some(max) = max_each
            && let Some((i, r)) = raws.iter().enumerate().find(|(_, r)| r.nbytes() > max)
        {
            return Err(memarray_cuda::CudaError::InvalidArgument {
                what: "_pack",
                detail: format!("part {i} is {} bytes, more than max_each {max}", r.nbytes()),
            });
        }
        RawArray::pack(raws, at)
    })
    .py()?;
    Ok((pack.into(), PackTable::new(entries)))
}

/// `arrays` as MemArrays (a TypeError naming `what` for anything else) and where the
/// first one's data is (None: there is none).
fn memarrays<'py>(
    py: Python<'py>,
    arrays: &Bound<'py, PyAny>,
    what: &str,
) -> PyResult<(Vec<Bound<'py, PyMemArray>>, Option<Location>)> {
    let mut refs: Vec<Bound<'py, PyMemArray>> = Vec::new();
    for a in arrays.try_iter()? {
        refs.push(PyMemArray::arg(&a?, what)?.clone());
    }
    let at = refs.first().map(|p| p.get().peek(py, |raw| raw.location()));
    Ok((refs, at))
}

/// `f` over the arrays' states, all locked at once: with the GIL held when no other thread
/// is in a call on one of them, none has device work pending and `quick` says `f` is
/// short; else with the GIL released, both while waiting for the arrays and while `f`
/// runs. A hand-off of the GIL costs up to the switch interval (5 ms) beside a busy Python
/// thread: inside a Ray actor on two H200s the pack of 1,000 x 4 KiB took 2.4 ms with the
/// GIL released, 1.36-1.51 ms with it kept (docs/benchmarks.md).
fn with_locked<R: Send>(
    py: Python<'_>,
    arrays: &[Bound<'_, PyMemArray>],
    quick: impl FnOnce(&[&RawArray]) -> bool,
    f: impl FnOnce(&[&RawArray]) -> R + Send,
) -> R {
    let parts: Vec<&PyMemArray> = arrays.iter().map(|r| r.get()).collect();
    if let Some(locked) = Locked::try_new(&parts) {
        let held = states(&parts, &locked);
        if held.iter().all(|r| !r.has_pending_work()) && quick(&held) {
            return f(&held);
        }
    }
    py.detach_section(|| f(&states(&parts, &Locked::new(&parts))))
}

/// The states of `parts`, in their order, from `locked` (which locked every one).
fn states<'l>(parts: &[&PyMemArray], locked: &'l Locked<'_>) -> Vec<&'l RawArray> {
    parts.iter().filter_map(|p| locked.get(p)).collect()
}

/// Whether a pack of `raws` is quick to make with the GIL held: at most [`HELD_PACK`]
/// bytes on a device (one gather kernel, microseconds), [`HELD_PACK_HOST`] on the host
/// (a copy by this thread).
fn quick_pack(raws: &[&RawArray]) -> bool {
    let bytes: usize = raws.iter().map(|r| r.nbytes()).sum();
    match raws.first().map(|r| r.location()) {
        Some(Location::Host) => bytes <= HELD_PACK_HOST,
        _ => bytes <= HELD_PACK,
    }
}

const HELD_PACK: usize = 16 << 20;
const HELD_PACK_HOST: usize = 1 << 20;

/// `_pack`'s result with no copy, where `arrays` are slices of one allocation (the arrays
/// `_unpack` makes, in any order or subset): a uint8 slice of that allocation spanning
/// them, and their entries in it; None (nothing done) otherwise, or when the span would be
/// more than twice the pack `_pack` would make. The result shares their memory.
#[pyfunction]
pub fn _share<'py>(
    py: Python<'py>,
    arrays: &Bound<'py, PyAny>,
) -> PyResult<Option<(PyMemArray, PackTable)>> {
    let (parts, at) = memarrays(py, arrays, "_share")?;
    let Some(at) = at else {
        return Ok(None);
    };
    // No copy: quick whenever nothing is pending.
    let shared = with_locked(py, &parts, |_| true, |raws| RawArray::share(raws, at)).py()?;
    let Some((pack, entries)) = shared else {
        return Ok(None);
    };
    Ok(Some((pack.into(), PackTable::new(entries))))
}

/// The arrays `_pack` packed: one per `(dtype, shape, offset)` entry, each a slice of
/// `pack`'s memory (no copy; device or host), after `pack`'s pending work. They share its memory:
/// drop the pack, or leave it unwritten, while they are used.
#[pyfunction]
pub fn _unpack<'py>(
    py: Python<'py>,
    pack: &Bound<'py, PyAny>,
    entries: &Bound<'py, PyAny>,
) -> PyResult<Bound<'py, PyList>> {
    let a = PyMemArray::arg(pack, "_unpack")?.get();
    let wanted = crate::table::packed_entries(py, entries)?;
    // Views only: with the GIL held unless the pack's data is still in flight.
    let arrays = a.with(py, |raw| raw.unpack(&wanted, None)).py()?;
    let arrays = arrays
        .into_iter()
        .map(|raw| PyMemArray::untracked(py, raw))
        .collect::<PyResult<Vec<_>>>()?;
    PyList::new(py, arrays)
}
