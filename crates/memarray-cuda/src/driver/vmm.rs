//! CUDA's virtual memory management: reserve an address range, create physical memory,
//! map it into the range and make it accessible (a growing pool's range, `resource::vmm`).

use cudarc::driver::sys;

use super::{check, init};
use crate::error::Result;

/// A pinned device allocation's properties on `device` (no shareable handle).
fn props(device: i32) -> sys::CUmemAllocationProp {
    // SAFETY: a plain C struct; all-zero is its documented default, then filled in.
    let mut p: sys::CUmemAllocationProp = unsafe { std::mem::zeroed() };
    p.type_ = sys::CUmemAllocationType::CU_MEM_ALLOCATION_TYPE_PINNED;
    p.requestedHandleTypes = sys::CUmemAllocationHandleType::CU_MEM_HANDLE_TYPE_NONE;
    p.location.type_ = sys::CUmemLocationType::CU_MEM_LOCATION_TYPE_DEVICE;
    p.location.id = device;
    p
}

/// `cuMemGetAllocationGranularity` (recommended) of pinned memory on `device`.
pub(crate) fn vmm_granularity(device: i32) -> Result<usize> {
    init()?;
    let p = props(device);
    let mut g = 0usize;
    // SAFETY: valid out pointer and properties.
    check("cuMemGetAllocationGranularity", unsafe {
        sys::cuMemGetAllocationGranularity(
            &mut g,
            &p,
            sys::CUmemAllocationGranularity_flags::CU_MEM_ALLOC_GRANULARITY_RECOMMENDED,
        )
    })?;
    Ok(g)
}

/// `cuMemAddressReserve`: `size` bytes of address space aligned to `align`.
pub(crate) fn vmm_reserve(size: usize, align: usize) -> Result<u64> {
    init()?;
    let mut ptr: sys::CUdeviceptr = 0;
    // SAFETY: valid out pointer; no fixed address asked for.
    check("cuMemAddressReserve", unsafe {
        sys::cuMemAddressReserve(&mut ptr, size, align, 0, 0)
    })?;
    Ok(ptr)
}

/// `cuMemAddressFree` of a reservation from [`vmm_reserve`].
///
/// # Safety
/// 1. `(ptr, size)` is a whole reservation with nothing mapped in it any more.
pub(crate) unsafe fn vmm_free_reservation(ptr: u64, size: usize) -> Result<()> {
    // SAFETY: item 1.
    check("cuMemAddressFree", unsafe {
        sys::cuMemAddressFree(ptr, size)
    })
}

/// `cuMemCreate` of `size` bytes (a multiple of the granularity) on `device`, mapped at
/// `at` (inside a reservation, unmapped) and made readable and writable from `device`.
/// Returns the physical handle, released by [`vmm_unmap`].
///
/// # Safety
/// 1. `[at, at + size)` lies in a reservation of this process and is not mapped.
pub(crate) unsafe fn vmm_map(at: u64, size: usize, device: i32) -> Result<u64> {
    init()?;
    let p = props(device);
    let mut handle: sys::CUmemGenericAllocationHandle = 0;
    // Not stream work: allowed under this thread's capture, as cuMemAlloc is.
    super::memory::relaxed_capture_mode(|| {
        // SAFETY: valid out pointer and properties.
        check("cuMemCreate", unsafe {
            sys::cuMemCreate(&mut handle, size, &p, 0)
        })
    })?;
    // SAFETY: item 1; the handle holds `size` bytes.
    if let Err(e) = check("cuMemMap", unsafe { sys::cuMemMap(at, size, 0, handle, 0) }) {
        // SAFETY: created above, never mapped.
        unsafe { sys::cuMemRelease(handle) };
        return Err(e);
    }
    let access = sys::CUmemAccessDesc {
        location: p.location,
        flags: sys::CUmemAccess_flags::CU_MEM_ACCESS_FLAGS_PROT_READWRITE,
    };
    // SAFETY: the range was mapped just now; one access descriptor.
    if let Err(e) = check("cuMemSetAccess", unsafe {
        sys::cuMemSetAccess(at, size, &access, 1)
    }) {
        // SAFETY: mapped above and used by no one yet.
        unsafe {
            sys::cuMemUnmap(at, size);
            sys::cuMemRelease(handle);
        }
        return Err(e);
    }
    Ok(handle)
}

/// Unmaps `[at, at + size)` and releases its physical handle.
///
/// # Safety
/// 1. `(at, size, handle)` came from one [`vmm_map`], and no pending or later work uses
///    the memory.
pub(crate) unsafe fn vmm_unmap(at: u64, size: usize, handle: u64) -> Result<()> {
    // SAFETY: item 1.
    check("cuMemUnmap", unsafe { sys::cuMemUnmap(at, size) })?;
    // SAFETY: item 1; unmapped above.
    check("cuMemRelease", unsafe { sys::cuMemRelease(handle) })
}
