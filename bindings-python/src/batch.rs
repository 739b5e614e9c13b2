//! `memarray.move_many`: many arrays moved in one call.

use pyo3::exceptions::PyTypeError;
use pyo3::prelude::*;

use memarray_cuda::RawArray;

use crate::array::PyMemArray;
use crate::born::parse_device;
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
    let mut refs: Vec<PyRef<'_, PyMemArray>> = Vec::new();
    for item in arrays.try_iter()? {
        let item = item?;
        let a = item.cast::<PyMemArray>().map_err(|_| {
            PyTypeError::new_err(format!(
                "move_many takes MemArrays, got {}",
                item.get_type()
                    .name()
                    .map(|n| n.to_string())
                    .unwrap_or_default()
            ))
        })?;
        refs.push(a.borrow());
    }
    let mut arrays: Vec<&PyMemArray> = refs.iter().map(|r| &**r).collect();
    // One mutex per array, taken in address order (no deadlock with another move_many),
    // each once.
    arrays.sort_by_key(|a| *a as *const PyMemArray as usize);
    arrays.dedup_by_key(|a| *a as *const PyMemArray as usize);
    py.detach(|| {
        let mut guards: Vec<_> = arrays.iter().map(|a| a.shared.state()).collect();
        let mut raws: Vec<&mut RawArray> = guards.iter_mut().map(|g| &mut **g).collect();
        RawArray::move_many(&mut raws, target, stream)
    })
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
