//! memarray as the process's one memory manager, one file per framework:
//! `torch` (the pluggable allocator's C entry points), `cupy` (the allocator
//! hook), `rmm` (resources both ways), `numba` (pinning for its memory manager),
//! `cuda_core` (a cuda.core memory resource's hot path), and `pressure` (the relievers,
//! their counters and the tracking adaptor's stack provider). The Python halves are the
//! files of the same names in `memarray/`.

mod cuda_core;
mod cupy;
mod glue;
mod numba;
mod pressure;
mod rmm;
mod torch;

use pyo3::prelude::*;

use memarray_core::resource::{pressure as relief, set_stack_provider};

/// Registers `memarray._memarray._interop` and the relievers and stack provider.
pub fn register(m: &Bound<'_, PyModule>) -> PyResult<()> {
    let py = m.py();
    let i = PyModule::new(py, "_interop")?;
    i.add_function(wrap_pyfunction!(torch::torch_live_blocks, &i)?)?;
    i.add_function(wrap_pyfunction!(pressure::pressure_stats, &i)?)?;
    i.add_function(wrap_pyfunction!(pressure::add_reliever, &i)?)?;
    i.add_function(wrap_pyfunction!(pressure::remove_reliever, &i)?)?;
    i.add_function(wrap_pyfunction!(pressure::set_budget, &i)?)?;
    i.add_function(wrap_pyfunction!(pressure::library_usage, &i)?)?;
    i.add_function(wrap_pyfunction!(pressure::set_watermark, &i)?)?;
    i.add_function(wrap_pyfunction!(pressure::watermarks, &i)?)?;
    i.add_function(wrap_pyfunction!(rmm::callback_resource, &i)?)?;
    i.add_function(wrap_pyfunction!(numba::pin, &i)?)?;
    i.add_function(wrap_pyfunction!(rmm::resource_callbacks, &i)?)?;
    i.add_function(wrap_pyfunction!(cupy::cupy_allocator, &i)?)?;
    i.add_class::<cupy::CupyAllocator>()?;
    i.add_class::<rmm::ResourceCallbacks>()?;
    i.add_function(wrap_pyfunction!(numba::pinned_source, &i)?)?;
    i.add_class::<numba::Pinning>()?;
    i.add_function(wrap_pyfunction!(cuda_core::cuda_core_callbacks, &i)?)?;
    i.add_class::<cuda_core::CudaCoreCallbacks>()?;
    m.add_submodule(&i)?;
    for library in [
        *crate::sources::TORCH,
        *crate::sources::CUPY,
        *crate::sources::RMM,
    ] {
        relief::register_reliever(library, pressure::python_reliever(library));
    }
    set_stack_provider(pressure::python_stack);
    Ok(())
}
