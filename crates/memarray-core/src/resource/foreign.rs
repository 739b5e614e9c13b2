//! Memory owned by someone else (a DLPack or CUDA Array Interface producer), wrapped so
//! a buffer can hold it zero-copy: host memory in a [`HostBuffer`], device memory in
//! memarray-cuda's `DeviceBuffer`.
//!
//! [`HostBuffer`]: crate::HostBuffer

use std::any::Any;
use std::ptr::NonNull;
use std::sync::{Arc, Mutex};

use super::{Location, MemoryInfo, MemoryKind, MemoryResource, RawStream};
use crate::error::Result;

/// Keeps a foreign allocation's owner alive until the buffer over it is dropped.
///
/// Deallocating the foreign base pointer drops the owner (which releases the producer);
/// new allocations (a clone of the buffer, say) come from `fallback`, a resource of the
/// same memory, which also answers accessibility and memory-info queries.
#[derive(Debug)]
pub struct ForeignMemory {
    base: usize,
    kind: MemoryKind,
    owner: Mutex<Option<Box<dyn Any + Send + Sync>>>,
    fallback: Arc<dyn MemoryResource>,
}

impl ForeignMemory {
    /// Wraps the owner of the memory of `kind` at `base`; copies come from `fallback`.
    pub fn new(
        base: NonNull<u8>,
        kind: MemoryKind,
        owner: Box<dyn Any + Send + Sync>,
        fallback: Arc<dyn MemoryResource>,
    ) -> Self {
        Self {
            base: base.as_ptr() as usize,
            kind,
            owner: Mutex::new(Some(owner)),
            fallback,
        }
    }
}

impl MemoryResource for ForeignMemory {
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
        self.kind
    }

    fn is_accessible_from(&self, location: Location) -> bool {
        self.fallback.is_accessible_from(location)
    }

    fn memory_info(&self) -> Option<MemoryInfo> {
        self.fallback.memory_info()
    }

    fn name(&self) -> &str {
        "foreign"
    }
}
