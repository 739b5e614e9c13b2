//! `memarray.move_many`: many arrays moved in one call.

use pyo3::prelude::*;

use memarray_cuda::RawArray;

use crate::array::{Locked, PyMemArray};
use crate::device::parse_device;
use crate::errors::IntoPyResult as _;
use crate::stream::parse_move_stream;

/// move_many(arrays, device, stream=None)
/// --
///
/// Moves every MemArray in `arrays` to `device` ("cpu", "cuda", "cuda:N", an int, a
/// DLPack pair) in one pass: small pageable arrays are packed into one pinned buffer, the
/// copies go to the driver as one batch, and the call waits once. When it returns every
/// array is at `device`. If any array is locked (LockError), nothing moves. The GIL is
/// released throughout. The same array may appear more than once.
#[pyfunction]
#[pyo3(signature = (arrays, device, stream=None))]
pub fn move_many(
    py: Python<'_>,
    arrays: &Bound<'_, PyAny>,
    device: &Bound<'_, PyAny>,
    stream: Option<&Bound<'_, PyAny>>,
) -> PyResult<()> {
    let target = parse_device(Some(device))?;
    let stream = parse_move_stream(stream)?;
    let mut refs: Vec<Bound<'_, PyMemArray>> = Vec::new();
    for item in arrays.try_iter()? {
        refs.push(PyMemArray::arg(&item?, "move_many")?.clone());
    }
    let arrays: Vec<&PyMemArray> = refs.iter().map(|r| r.get()).collect();
    py.detach(|| RawArray::move_many(&mut Locked::new(&arrays).all_mut(), target, stream))
        .py()
}

/// _last_batch_profile() -> dict
/// --
///
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
