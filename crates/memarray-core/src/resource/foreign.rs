//! Host memory owned by someone else (a DLPack producer), wrapped so a [`HostBuffer`]
//! can hold it zero-copy.
//!
//! [`HostBuffer`]: crate::HostBuffer

use std::any::Any;
use std::ptr::NonNull;
use std::sync::Mutex;

use super::{HostResource, Location, MemoryKind, MemoryResource, RawStream};
use crate::error::Result;

/// Keeps a foreign allocation's owner alive until the buffer over it is dropped.
///
/// Deallocating the foreign base pointer drops the owner (which releases the producer);
/// new allocations (a clone of the buffer, say) come from the host heap.
#[derive(Debug)]
pub struct ForeignMemory {
    base: usize,
    kind: MemoryKind,
    owner: Mutex<Option<Box<dyn Any + Send + Sync>>>,
}

impl ForeignMemory {
    /// Wraps the owner of the memory at `base`.
    pub fn new(base: NonNull<u8>, kind: MemoryKind, owner: Box<dyn Any + Send + Sync>) -> Self {
        Self {
            base: base.as_ptr() as usize,
            kind,
            owner: Mutex::new(Some(owner)),
        }
    }
}

impl MemoryResource for ForeignMemory {
    fn allocate(&self, bytes: usize, align: usize, s: Option<RawStream>) -> Result<NonNull<u8>> {
        HostResource.allocate(bytes, align, s)
    }

    fn allocate_zeroed(
        &self,
        bytes: usize,
        align: usize,
        s: Option<RawStream>,
    ) -> Result<NonNull<u8>> {
        HostResource.allocate_zeroed(bytes, align, s)
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
            // SAFETY: every other pointer came from HostResource (the trait's item 1).
            unsafe { HostResource.deallocate(ptr, bytes, align, s) }
        }
    }

    fn kind(&self) -> MemoryKind {
        self.kind
    }

    fn is_accessible_from(&self, location: Location) -> bool {
        location == Location::Host || self.kind == MemoryKind::Managed
    }

    fn name(&self) -> &str {
        "foreign"
    }
}
