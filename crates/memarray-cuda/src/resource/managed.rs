//! [`ManagedResource`]: `cuMemAllocManaged` with `CU_MEM_ATTACH_GLOBAL`.

use std::ptr::NonNull;
use std::sync::Arc;

use memarray_core::{Location, MemoryInfo, MemoryKind, MemoryResource, RawStream, Result};

use super::{Aligner, allocate_then_zero};
use crate::device::Device;
use crate::driver;

/// Managed (unified) memory: one address valid on the host and on every device, pages
/// migrating on demand. Host access while a device works on the same memory needs the
/// device attribute `concurrentManagedAccess` (Linux, Pascal and later).
#[derive(Debug)]
pub struct ManagedResource {
    device: Arc<Device>,
    name: String,
    aligner: Aligner,
}

impl ManagedResource {
    /// A resource allocating in `device`'s context (the memory is reachable everywhere).
    pub fn new(device: &Arc<Device>) -> Self {
        ManagedResource {
            device: device.clone(),
            name: format!("cuda:{} managed", device.id()),
            aligner: Aligner::default(),
        }
    }
}

impl MemoryResource for ManagedResource {
    fn allocate(&self, bytes: usize, align: usize, _: Option<RawStream>) -> Result<NonNull<u8>> {
        self.aligner.allocate(bytes, align, &self.name, |size| {
            let _ctx = self.device.bind()?;
            // SAFETY: `bind` made the device's live context current (item 1).
            let p = unsafe { driver::mem_alloc_managed(size) }
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
        if let Ok(_ctx) = self.device.bind() {
            // SAFETY: by the trait contract `base` came from `mem_alloc_managed` and is freed
            // once with no later use (item 1); the allocating context is current (item 2).
            let _ = unsafe { driver::mem_free(base as u64) };
        }
    }

    fn kind(&self) -> MemoryKind {
        MemoryKind::Managed
    }

    fn is_accessible_from(&self, _: Location) -> bool {
        true
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
