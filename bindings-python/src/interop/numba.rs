//! Numba's memory manager over memarray (`memarray/numba.py`): host memory page-locked in
//! place for `mempin`, and the pinned resource `memhostalloc` draws from.

use crate::fork::Detach;
use std::sync::{Arc, Mutex, PoisonError};

use pyo3::prelude::*;

use memarray_core::MemoryResource;
use memarray_cuda::Device;

/// Host memory page-locked in place for a Python owner (Numba's `mempin`), unlocked by
/// `release()` or when collected.
#[pyclass(module = "memarray._memarray._interop", frozen)]
pub(super) struct Pinning {
    registration: Mutex<Option<memarray_cuda::resource::HostRegistration>>,
    addr: usize,
    size: usize,
}

#[pymethods]
impl Pinning {
    #[getter]
    fn ptr(&self) -> usize {
        self.addr
    }

    #[getter]
    fn size(&self) -> usize {
        self.size
    }

    /// Unlocks the pages (a second call does nothing).
    fn release(&self, py: Python<'_>) {
        let r = self
            .registration
            .lock()
            .unwrap_or_else(PoisonError::into_inner)
            .take();
        py.detach_section(|| drop(r));
    }
}

/// Page-locks `size` bytes at `ptr`, inside `owner`'s memory, for `device_id`.
#[pyfunction]
#[pyo3(signature = (owner, ptr, size, device_id, mapped=false, portable=false))]
pub(super) fn pin(
    py: Python<'_>,
    owner: &Bound<'_, PyAny>,
    ptr: &Bound<'_, PyAny>,
    size: &Bound<'_, PyAny>,
    device_id: &Bound<'_, PyAny>,
    mapped: bool,
    portable: bool,
) -> PyResult<Pinning> {
    let ptr: usize = crate::convert::int(ptr, "ptr")?;
    let size: usize = crate::convert::int(size, "size")?;
    let device: u32 = crate::convert::int(device_id, "device_id")?;
    let dev = Device::get(device).map_err(crate::errors::cuda_err)?;
    // An owner with a C-contiguous buffer has the range checked against it; others (a
    // strided NumPy view Numba pins whole) are trusted, as Numba's own manager trusts them.
    let view = crate::held::HeldBuffer::get(owner, false);
    let inside = size > 0
        && view.as_ref().is_none_or(|v| {
            ptr >= v.addr()
                && ptr
                    .checked_add(size)
                    .is_some_and(|end| end <= v.addr() + v.len())
        });
    if !inside || ptr == 0 {
        return Err(pyo3::exceptions::PyValueError::new_err(format!(
            "cannot pin [{ptr:#x}, +{size}): empty, null, or not inside the owner's buffer"
        )));
    }
    drop(view);
    let flags = memarray_cuda::PinnedFlags {
        portable,
        mapped,
        write_combined: false,
    };
    // SAFETY: the range lies inside the owner's buffer (checked above); the caller keeps
    // the owner alive while pinned (Numba's PinnedMemory holds it), and the Python wrapper
    // holds it too.
    let reg = py
        .detach_section(|| unsafe {
            memarray_cuda::resource::HostRegistration::new(&dev, ptr, size, flags)
        })
        .map_err(crate::errors::cuda_err)?;
    Ok(Pinning {
        registration: Mutex::new(Some(reg)),
        addr: ptr,
        size,
    })
}

/// The pinned memory resource Numba's `memhostalloc` draws from: `device_id`'s pinned
/// caching pool (portable; with unified addressing every pinned block is also mapped),
/// or for write-combined memory a plain write-combined pinned resource.
#[pyfunction]
#[pyo3(signature = (device_id, write_combined=false))]
pub(super) fn pinned_source(
    device_id: &Bound<'_, PyAny>,
    write_combined: bool,
) -> PyResult<crate::resources::PyResource> {
    let device: u32 = crate::convert::int(device_id, "device_id")?;
    let dev = Device::get(device).map_err(crate::errors::cuda_err)?;
    let r: Arc<dyn MemoryResource> = if write_combined {
        Arc::new(memarray_cuda::PinnedResource::with_flags(
            &dev,
            memarray_cuda::PinnedFlags {
                portable: true,
                mapped: true,
                write_combined: true,
            },
        ))
    } else {
        memarray_cuda::resource::pinned_pool(&dev)
    };
    Ok(crate::resources::PyResource::plain(r))
}
