//! [`DeviceResource`]: plain `cuMemAlloc` / `cuMemFree`.

use std::ptr::NonNull;
use std::sync::Arc;

use memarray_core::{Location, MemoryInfo, MemoryKind, MemoryResource, RawStream, Result};

use super::{Aligner, allocate_then_zero};
use crate::device::Device;
use crate::driver;

/// Device memory from `cuMemAlloc`. Simple and safe to hand to other libraries:
/// `cuMemFree` waits for the device, so memory is never reused under queued work. Each
/// allocation costs tens of microseconds; see [`super::AsyncPoolResource`] for speed.
#[derive(Debug)]
pub struct DeviceResource {
    device: Arc<Device>,
    name: String,
    aligner: Aligner,
}

impl DeviceResource {
    /// A resource allocating on `device`.
    pub fn new(device: &Arc<Device>) -> Self {
        DeviceResource {
            device: device.clone(),
            name: format!("cuda:{} device", device.id()),
            aligner: Aligner::default(),
        }
    }

    /// The device it allocates on.
    pub fn device(&self) -> &Arc<Device> {
        &self.device
    }
}

impl MemoryResource for DeviceResource {
    fn allocate(&self, bytes: usize, align: usize, _: Option<RawStream>) -> Result<NonNull<u8>> {
        self.aligner.allocate(bytes, align, &self.name, |size| {
            let _ctx = self.device.bind()?;
            // SAFETY: `bind` made the device's live context current (item 1).
            let p = unsafe { driver::mem_alloc(size) }
                .map_err(|e| e.with_oom_context(size, self.device.id()))?;
            Ok(p as usize)
        })
    }

    fn allocate_zeroed(
        &self,
        bytes: usize,
        align: usize,
        stream: Option<RawStream>,
    ) -> Result<NonNull<u8>> {
        allocate_then_zero(self, &self.device, bytes, align, stream)
    }

    unsafe fn deallocate(&self, ptr: NonNull<u8>, _: usize, align: usize, _: Option<RawStream>) {
        let base = self.aligner.base_of(ptr, align);
        // Errors cannot be reported from here; cuMemFree fails only for bad pointers.
        if let Ok(_ctx) = self.device.bind() {
            // SAFETY: by the trait contract `base` came from `mem_alloc` and is freed once
            // with no later use (item 1); the device's context is current (item 2).
            let _ = unsafe { driver::mem_free(base as u64) };
        }
    }

    fn kind(&self) -> MemoryKind {
        MemoryKind::Device
    }

    fn is_accessible_from(&self, location: Location) -> bool {
        location == self.device.location()
    }

    fn memory_info(&self) -> Option<MemoryInfo> {
        self.device.memory_info().ok()
    }

    fn device_id(&self) -> Option<u32> {
        Some(self.device.id())
    }

    fn name(&self) -> &str {
        &self.name
    }
}
