//! CuPy's allocator hook over memarray (`memarray/cupy.py`).

use pyo3::prelude::*;

use memarray_core::resource::{allocate_with_relief, with_source};
use memarray_cuda::Device;
use memarray_cuda::resource::default_resource;

use super::glue::{BLOCK_ALIGN, raw_stream};

/// CuPy's allocator hook (`cupy.cuda.set_allocator(...)`), in Rust: a Python function in
/// its place cost 1.6x CuPy's own pool per `cupy.empty`. Each call allocates from memarray's
/// default resource of CuPy's current device, ordered on CuPy's current stream, for the
/// source "cupy", and returns a `cupy.cuda.MemoryPointer` over an `UnownedMemory` whose
/// owner (an `Allocation`) frees the block when CuPy lets go, ordered on that stream, whose
/// CuPy `Stream` it keeps alive until then (a stream destroyed before its blocks' frees
/// would be named to the driver after its end, as RMM's hook avoids the same way); size 0
/// is the null pointer,
/// as on CuPy's own allocator. The GIL stays held: a pool hit costs less than handing it
/// over.
#[pyclass(module = "memarray._memarray._interop", frozen)]
pub(super) struct CupyAllocator {
    get_device: Py<PyAny>,
    get_stream: Py<PyAny>,
    unowned_memory: Py<PyAny>,
    memory_pointer: Py<PyAny>,
}

#[pymethods]
impl CupyAllocator {
    fn __call__(&self, py: Python<'_>, nbytes: &Bound<'_, PyAny>) -> PyResult<Py<PyAny>> {
        let nbytes: usize = crate::convert::int(nbytes, "nbytes")?;
        let device: u32 = self.get_device.call0(py)?.extract(py)?;
        let stream_obj = self.get_stream.call0(py)?;
        let stream: usize = stream_obj
            .getattr(py, pyo3::intern!(py, "ptr"))?
            .extract(py)?;
        if nbytes == 0 {
            // CuPy's own allocator gives size 0 the null pointer, and CuPy relies on it
            // (`a.data.ptr == 0` for an empty array): no block, no owner.
            let memory = self
                .unowned_memory
                .call1(py, (0usize, 0usize, py.None(), device))?;
            return self.memory_pointer.call1(py, (memory, 0));
        }
        let dev = Device::get(device).map_err(crate::errors::cuda_err)?;
        let resource = default_resource(&dev).map_err(crate::errors::cuda_err)?;
        let raw = raw_stream(stream);
        let p = with_source(*crate::sources::CUPY, || {
            allocate_with_relief(&*resource, nbytes, BLOCK_ALIGN, Some(raw), false)
        })
        .map_err(crate::errors::core_err)?;
        let addr = p.as_ptr() as usize;
        let owner = Py::new(
            py,
            crate::resources::Allocation::owned(
                resource,
                addr,
                nbytes,
                Some(raw),
                Some(*crate::sources::CUPY),
            )
            .keeping_stream(stream_obj),
        )?;
        let memory = self
            .unowned_memory
            .call1(py, (addr, nbytes, owner, device))?;
        self.memory_pointer.call1(py, (memory, 0))
    }
}

/// The hook over CuPy's `runtime.getDevice`, `get_current_stream`, `UnownedMemory` and
/// `MemoryPointer` (passed in: this module never imports CuPy).
#[pyfunction]
pub(super) fn cupy_allocator(
    get_device: Py<PyAny>,
    get_stream: Py<PyAny>,
    unowned_memory: Py<PyAny>,
    memory_pointer: Py<PyAny>,
) -> CupyAllocator {
    CupyAllocator {
        get_device,
        get_stream,
        unowned_memory,
        memory_pointer,
    }
}
