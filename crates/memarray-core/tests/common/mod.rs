//! What the allocation path's tests share (each test file its own process): a resource
//! of any place that costs nothing, and allocation and free through memarray's
//! allocation path for a library.

// Each test binary uses part of it.
#![allow(dead_code)]

use std::ptr::NonNull;
use std::sync::atomic::{AtomicUsize, Ordering};

use memarray_core::resource::{allocate_with_relief, deallocate_counted, with_source};
use memarray_core::{CoreError, Location, MemoryKind, MemoryResource, RawStream, Result, Source};

/// Memory of `device` (`None`: host memory), counted, never dereferenced: at most `cap`
/// bytes in use (out of memory past that).
#[derive(Debug)]
pub struct Slots {
    pub device: Option<u32>,
    pub used: AtomicUsize,
    pub cap: usize,
}

impl Slots {
    /// Unbounded.
    pub fn on(device: Option<u32>) -> Self {
        Self::capped(device, usize::MAX, 0)
    }

    /// `cap` bytes, `used` of them in use already.
    pub fn capped(device: Option<u32>, cap: usize, used: usize) -> Self {
        Slots {
            device,
            used: AtomicUsize::new(used),
            cap,
        }
    }
}

impl MemoryResource for Slots {
    fn allocate(&self, bytes: usize, _: usize, _: Option<RawStream>) -> Result<NonNull<u8>> {
        let used = self.used.load(Ordering::SeqCst);
        if used.saturating_add(bytes) > self.cap {
            return Err(CoreError::OutOfMemory {
                bytes,
                resource: "slots".into(),
                reason: format!("{used} of {} used", self.cap),
            });
        }
        self.used.fetch_add(bytes, Ordering::SeqCst);
        Ok(NonNull::dangling())
    }
    fn allocate_zeroed(
        &self,
        bytes: usize,
        align: usize,
        stream: Option<RawStream>,
    ) -> Result<NonNull<u8>> {
        self.allocate(bytes, align, stream)
    }
    unsafe fn deallocate(&self, _: NonNull<u8>, bytes: usize, _: usize, _: Option<RawStream>) {
        self.used.fetch_sub(bytes, Ordering::SeqCst);
    }
    fn kind(&self) -> MemoryKind {
        if self.device.is_some() {
            MemoryKind::Device
        } else {
            MemoryKind::Host
        }
    }
    fn is_accessible_from(&self, _: Location) -> bool {
        false
    }
    fn device_id(&self) -> Option<u32> {
        self.device
    }
    fn name(&self) -> &str {
        "slots"
    }
}

pub fn alloc(r: &Slots, source: Source, bytes: usize) -> Result<NonNull<u8>> {
    with_source(source, || allocate_with_relief(r, bytes, 8, None, false))
}

pub fn free(r: &Slots, source: Source, p: NonNull<u8>, bytes: usize) {
    // SAFETY: p came from r through the allocation path for `source`, freed once.
    unsafe { deallocate_counted(r, source, p, bytes, 8, None) }
}
