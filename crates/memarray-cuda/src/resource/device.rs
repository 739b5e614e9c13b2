//! [`DeviceResource`]: plain `cuMemAlloc` / `cuMemFree`.

use std::sync::Arc;

use memarray_core::{Location, MemoryKind, RawStream};

use super::driver_backed::{Backend, DriverResource};
use crate::device::Device;
use crate::driver;
use crate::error::Result;

/// Device memory from `cuMemAlloc`. Simple and safe to hand to other libraries:
/// `cuMemFree` waits for the device, so memory is never reused under queued work. Each
/// allocation costs tens of microseconds; see [`super::AsyncPoolResource`] for speed.
pub type DeviceResource = DriverResource<DeviceAlloc>;

/// The `cuMemAlloc` / `cuMemFree` pair.
#[derive(Debug)]
pub struct DeviceAlloc;

impl Backend for DeviceAlloc {
    const KIND: MemoryKind = MemoryKind::Device;

    unsafe fn alloc(&self, _: &Device, size: usize, _: Option<RawStream>) -> Result<usize> {
        // SAFETY: the caller made the device's context current (item 1).
        Ok(unsafe { driver::mem_alloc(size) }? as usize)
    }

    unsafe fn free(&self, base: usize, _: Option<RawStream>) {
        // SAFETY: `base` came from `mem_alloc` and is freed once (item 1); the context is
        // current (item 2).
        let freed = unsafe { driver::mem_free(base as u64) };
        crate::parked::park_err("freeing device memory", freed);
    }

    fn accessible(&self, device: &Device, location: Location) -> bool {
        location == device.location()
    }
}

impl DeviceResource {
    /// A resource allocating on `device`.
    pub fn new(device: &Arc<Device>) -> Self {
        super::probe_captures();
        Self::with_backend(device, format!("cuda:{} device", device.id()), DeviceAlloc)
    }
}
