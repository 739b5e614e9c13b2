//! [`HostBuffer`]: an owned, aligned, host-accessible allocation from a resource.

use std::ptr::NonNull;
use std::sync::Arc;

use crate::error::{CoreError, Result};
use crate::resource::{
    ForeignMemory, HOST_ALIGN, HostResource, Location, MemoryKind, MemoryResource,
};

/// Owned host-accessible bytes. Freed through the resource that made them.
///
/// # Example
///
/// ```
/// use std::sync::Arc;
/// use memarray_core::{HostBuffer, HostResource, MemoryKind};
///
/// let mut b = HostBuffer::zeroed_in(64, Arc::new(HostResource))?;
/// b.as_mut_slice()[3] = 7;
/// assert_eq!((b.len(), b.as_slice()[3], b.kind()), (64, 7, MemoryKind::Host));
/// let c = b.try_clone()?; // a deep copy from the same resource
/// assert_eq!(c.as_slice(), b.as_slice());
/// assert_ne!(c.as_ptr(), b.as_ptr());
/// # Ok::<(), memarray_core::CoreError>(())
/// ```
#[derive(Debug)]
pub struct HostBuffer {
    ptr: NonNull<u8>,
    len: usize,
    align: usize,
    resource: Arc<dyn MemoryResource>,
    /// For a slice ([`HostBuffer::slice_of`]): the buffer that owns the allocation (never
    /// itself a slice), which the slice keeps alive.
    root: Option<Arc<HostBuffer>>,
}

// SAFETY: HostBuffer owns its allocation exclusively; resources are Send + Sync.
unsafe impl Send for HostBuffer {}
// SAFETY: shared access only hands out raw pointers or `&[u8]` under &self.
unsafe impl Sync for HostBuffer {}

/// One `HostResource` for every foreign buffer's copies (an import costs no allocation
/// for it).
fn shared_host() -> Arc<dyn MemoryResource> {
    static HOST: std::sync::LazyLock<Arc<HostResource>> =
        std::sync::LazyLock::new(|| Arc::new(HostResource));
    HOST.clone()
}

impl HostBuffer {
    /// `len` zeroed bytes from the default pageable [`HostResource`].
    pub fn zeroed(len: usize) -> Result<Self> {
        Self::zeroed_in(len, Arc::new(HostResource))
    }

    /// `len` zeroed bytes from `resource`, which must be host-accessible.
    pub fn zeroed_in(len: usize, resource: Arc<dyn MemoryResource>) -> Result<Self> {
        Self::check_host(&*resource, len)?;
        let ptr = resource.allocate_zeroed(len, HOST_ALIGN, None)?;
        Ok(Self {
            ptr,
            len,
            align: HOST_ALIGN,
            resource,
            root: None,
        })
    }

    /// `len` uninitialised bytes from `resource`.
    ///
    /// # Safety
    /// 1. The caller writes every byte before reading it.
    pub unsafe fn uninit_in(len: usize, resource: Arc<dyn MemoryResource>) -> Result<Self> {
        Self::check_host(&*resource, len)?;
        let ptr = resource.allocate(len, HOST_ALIGN, None)?;
        Ok(Self {
            ptr,
            len,
            align: HOST_ALIGN,
            resource,
            root: None,
        })
    }

    /// Wraps `len` bytes at `ptr` owned by someone else; `owner` is dropped (releasing the
    /// memory) when the buffer is.
    ///
    /// # Safety
    /// 1. `ptr` is valid for reads and writes of `len` bytes on the host for as long as
    ///    `owner` lives, and nothing else frees it meanwhile.
    pub unsafe fn from_foreign(
        ptr: NonNull<u8>,
        len: usize,
        kind: MemoryKind,
        owner: Box<dyn std::any::Any + Send + Sync>,
    ) -> Self {
        Self {
            ptr,
            len,
            align: 1,
            resource: Arc::new(ForeignMemory::new(ptr, kind, owner, shared_host())),
            root: None,
        }
    }

    /// `len` bytes at `offset` of `block`, sharing its memory (the slice keeps it alive).
    /// A slice of a slice is a slice of the same allocation ([`HostBuffer::root`]).
    ///
    /// # Errors
    /// [`CoreError::CopyOutOfRange`] when the range does not lie inside `block`.
    pub fn slice_of(block: &Arc<HostBuffer>, offset: usize, len: usize) -> Result<Self> {
        if offset.checked_add(len).is_none_or(|end| end > block.len) {
            return Err(CoreError::CopyOutOfRange {
                offset,
                len,
                capacity: block.len,
            });
        }
        let root = match &block.root {
            Some(r) => r.clone(),
            None => block.clone(),
        };
        // In bounds (checked above) of a live buffer: never null.
        let ptr = NonNull::new(block.ptr.as_ptr().wrapping_add(offset))
            .expect("an address inside a live buffer");
        Ok(Self {
            ptr,
            len,
            align: 1,
            resource: Arc::new(ForeignMemory::new(
                ptr,
                block.kind(),
                Box::new(root.clone()),
                shared_host(),
            )),
            root: Some(root),
        })
    }

    /// For a slice: the buffer owning its allocation and the slice's offset in it.
    pub fn root(&self) -> Option<(&Arc<HostBuffer>, usize)> {
        self.root
            .as_ref()
            .map(|r| (r, self.ptr.as_ptr() as usize - r.ptr.as_ptr() as usize))
    }

    /// A buffer holding a copy of `bytes`.
    pub fn from_bytes(bytes: &[u8], resource: Arc<dyn MemoryResource>) -> Result<Self> {
        // SAFETY: every byte is written by the copy below before any read.
        let mut b = unsafe { Self::uninit_in(bytes.len(), resource)? };
        b.as_mut_slice().copy_from_slice(bytes);
        Ok(b)
    }

    fn check_host(resource: &dyn MemoryResource, len: usize) -> Result<()> {
        if resource.is_accessible_from(Location::Host) {
            Ok(())
        } else {
            Err(CoreError::Alloc {
                bytes: len,
                align: HOST_ALIGN,
                resource: resource.name().into(),
                reason: "resource is not host-accessible".into(),
            })
        }
    }

    /// Size in bytes.
    pub fn len(&self) -> usize {
        self.len
    }

    /// Whether the buffer holds no bytes.
    pub fn is_empty(&self) -> bool {
        self.len == 0
    }

    /// Start address (aligned to at least 64 bytes).
    pub fn as_ptr(&self) -> *const u8 {
        self.ptr.as_ptr()
    }

    /// Start address for writing. Writes through it while a shared borrow of the buffer
    /// exists are the caller's responsibility.
    pub fn as_mut_ptr(&self) -> *mut u8 {
        self.ptr.as_ptr()
    }

    /// The bytes.
    pub fn as_slice(&self) -> &[u8] {
        // SAFETY: ptr is valid for len initialised bytes for the life of self.
        unsafe { std::slice::from_raw_parts(self.ptr.as_ptr(), self.len) }
    }

    /// The bytes, writable.
    pub fn as_mut_slice(&mut self) -> &mut [u8] {
        // SAFETY: as above, and &mut self gives exclusive access.
        unsafe { std::slice::from_raw_parts_mut(self.ptr.as_ptr(), self.len) }
    }

    /// The kind of memory (pageable, pinned, managed, file).
    pub fn kind(&self) -> MemoryKind {
        self.resource.kind()
    }

    /// The resource the buffer came from.
    pub fn resource(&self) -> &Arc<dyn MemoryResource> {
        &self.resource
    }

    /// A new buffer from the same resource with the same bytes (foreign buffers clone
    /// into host heap memory).
    pub fn try_clone(&self) -> Result<Self> {
        Self::from_bytes(self.as_slice(), self.resource.clone())
    }
}

impl Drop for HostBuffer {
    fn drop(&mut self) {
        // SAFETY: ptr came from this resource with (len, align) and is freed only here.
        unsafe {
            self.resource
                .deallocate(self.ptr, self.len, self.align, None)
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn zeroed_aligned_and_cloned() {
        let mut b = HostBuffer::zeroed(1000).unwrap();
        assert_eq!(b.as_ptr() as usize % 64, 0);
        assert!(b.as_slice().iter().all(|&x| x == 0));
        b.as_mut_slice()[999] = 7;
        let c = b.try_clone().unwrap();
        assert_eq!(c.as_slice()[999], 7);
        assert_ne!(c.as_ptr(), b.as_ptr());
        assert_eq!(c.kind(), MemoryKind::Host);
        let e = HostBuffer::zeroed(0).unwrap();
        assert!(e.is_empty());
        assert_eq!(e.as_ptr() as usize % 64, 0);
    }

    #[test]
    fn foreign_owner_lives_until_the_buffer_drops() {
        use std::sync::atomic::{AtomicUsize, Ordering};
        static DROPS: AtomicUsize = AtomicUsize::new(0);
        struct Owner(Vec<u8>);
        impl Drop for Owner {
            fn drop(&mut self) {
                DROPS.fetch_add(1, Ordering::SeqCst);
            }
        }
        let mut owner = Owner(vec![1, 2, 3, 4]);
        let ptr = NonNull::new(owner.0.as_mut_ptr()).unwrap();
        // SAFETY: the Vec's heap block lives (and does not move) as long as the owner.
        let b = unsafe { HostBuffer::from_foreign(ptr, 4, MemoryKind::Host, Box::new(owner)) };
        assert_eq!(b.as_slice(), &[1, 2, 3, 4]);
        let c = b.try_clone().unwrap();
        drop(b);
        assert_eq!(DROPS.load(Ordering::SeqCst), 1);
        assert_eq!(c.as_slice(), &[1, 2, 3, 4]);
        drop(c);
        assert_eq!(
            DROPS.load(Ordering::SeqCst),
            1,
            "the clone must not drop the owner"
        );
    }
}
