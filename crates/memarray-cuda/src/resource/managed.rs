//! [`ManagedResource`]: `cuMemAllocManaged` with `CU_MEM_ATTACH_GLOBAL`.

use std::sync::Arc;

use memarray_core::{Location, MemoryKind, RawStream};

use super::driver_backed::{Backend, DriverResource};
use crate::device::Device;
use crate::driver;
use crate::error::Result;

/// Managed (unified) memory: one address valid on the host and on every device, pages
/// migrating on demand. Host access while a device works on the same memory needs the
/// device attribute `concurrentManagedAccess` (Linux, Pascal and later).
pub type ManagedResource = DriverResource<ManagedAlloc>;

/// The `cuMemAllocManaged` / `cuMemFree` pair.
#[derive(Debug)]
pub struct ManagedAlloc;

impl Backend for ManagedAlloc {
    const KIND: MemoryKind = MemoryKind::Managed;

    unsafe fn alloc(&self, _: &Device, size: usize, _: Option<RawStream>) -> Result<usize> {
        // SAFETY: the caller made the device's context current (item 1).
        Ok(unsafe { driver::mem_alloc_managed(size) }? as usize)
    }

    unsafe fn free(&self, base: usize, _: Option<RawStream>) {
        // SAFETY: `base` came from `mem_alloc_managed` and is freed once (item 1); the
        // allocating context is current (item 2).
        let freed = unsafe { driver::mem_free(base as u64) };
        crate::parked::park_err("freeing managed memory", freed);
    }

    fn accessible(&self, _: &Device, _: Location) -> bool {
        true
    }
}

impl ManagedResource {
    /// A resource allocating in `device`'s context (the memory is reachable everywhere).
    pub fn new(device: &Arc<Device>) -> Self {
        super::probe_captures();
        Self::with_backend(
            device,
            format!("cuda:{} managed", device.id()),
            ManagedAlloc,
        )
    }
}
