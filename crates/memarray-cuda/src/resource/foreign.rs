//! Device memory owned by someone else (a DLPack or CUDA Array Interface producer),
//! wrapped so a [`crate::DeviceBuffer`] can hold it without copying.

use std::any::Any;
use std::ptr::NonNull;
use std::sync::{Arc, Mutex};

use memarray_core::{Location, MemoryInfo, MemoryKind, MemoryResource, RawStream, Result};

use super::DeviceResource;
use crate::device::Device;

/// Keeps a foreign allocation's owner alive until the buffer over it is dropped.
///
/// Deallocating the foreign base address drops the owner (which releases the producer's
/// memory); new allocations (a copy of the buffer, say) come from a [`DeviceResource`]
/// of the same device.
#[derive(Debug)]
pub(crate) struct ForeignDeviceMemory {
    base: usize,
    location: Location,
    owner: Mutex<Option<Box<dyn Any + Send + Sync>>>,
    fallback: DeviceResource,
}

impl ForeignDeviceMemory {
    pub(crate) fn new(
        device: &Arc<Device>,
        base: NonNull<u8>,
        owner: Box<dyn Any + Send + Sync>,
    ) -> Self {
        ForeignDeviceMemory {
            base: base.as_ptr() as usize,
            location: device.location(),
            owner: Mutex::new(Some(owner)),
            fallback: DeviceResource::new(device),
        }
    }
}

impl MemoryResource for ForeignDeviceMemory {
    fn allocate(&self, bytes: usize, align: usize, s: Option<RawStream>) -> Result<NonNull<u8>> {
        self.fallback.allocate(bytes, align, s)
    }

    fn allocate_zeroed(
        &self,
        bytes: usize,
        align: usize,
        s: Option<RawStream>,
    ) -> Result<NonNull<u8>> {
        self.fallback.allocate_zeroed(bytes, align, s)
    }

    unsafe fn deallocate(
        &self,
        ptr: NonNull<u8>,
        bytes: usize,
        align: usize,
        s: Option<RawStream>,
    ) {
        if ptr.as_ptr() as usize == self.base {
            let owner = self.owner.lock().unwrap_or_else(|e| e.into_inner()).take();
            drop(owner);
        } else {
            // SAFETY: every other pointer came from the fallback resource (item 1 of the
            // trait contract), with the caller's ordering (item 2).
            unsafe { self.fallback.deallocate(ptr, bytes, align, s) }
        }
    }

    fn kind(&self) -> MemoryKind {
        MemoryKind::Device
    }

    fn is_accessible_from(&self, location: Location) -> bool {
        location == self.location
    }

    fn memory_info(&self) -> Option<MemoryInfo> {
        self.fallback.memory_info()
    }

    fn name(&self) -> &str {
        "foreign device memory"
    }
}
