//! Pageable host memory from the global allocator, aligned to at least 64 bytes.

use std::alloc::{self, Layout};
use std::ptr::NonNull;

use super::{Location, MemoryKind, MemoryResource, RawStream};
use crate::error::{CoreError, Result};

/// Minimum alignment of every host allocation: a cache line, and enough for AVX-512.
pub const HOST_ALIGN: usize = 64;

/// Largest alignment served (a 2 MiB huge page).
const MAX_ALIGN: usize = 1 << 21;

/// Pageable host memory, aligned to `max(align, 64)`.
///
/// # Example
///
/// ```
/// use memarray_core::{HostResource, MemoryKind, MemoryResource};
///
/// let r = HostResource;
/// let p = r.allocate_zeroed(4096, 64, None)?;
/// assert_eq!(p.as_ptr() as usize % 64, 0);
/// // SAFETY: 4096 zeroed bytes were just allocated at p.
/// assert_eq!(unsafe { *p.as_ptr().add(4095) }, 0);
/// // SAFETY: allocated above by this resource with the same size and alignment; no use follows.
/// unsafe { r.deallocate(p, 4096, 64, None) };
/// assert_eq!(r.kind(), MemoryKind::Host);
/// # Ok::<(), memarray_core::CoreError>(())
/// ```
#[derive(Debug, Default, Clone, Copy)]
pub struct HostResource;

impl HostResource {
    fn layout(bytes: usize, align: usize) -> Result<Layout> {
        if !align.is_power_of_two() || align > MAX_ALIGN {
            return Err(CoreError::BadAlignment {
                align,
                max: MAX_ALIGN,
            });
        }
        Layout::from_size_align(bytes.max(1), align.max(HOST_ALIGN)).map_err(|e| CoreError::Alloc {
            bytes,
            align,
            resource: "host".into(),
            reason: e.to_string(),
        })
    }

    fn alloc_with(
        bytes: usize,
        align: usize,
        f: unsafe fn(Layout) -> *mut u8,
    ) -> Result<NonNull<u8>> {
        let layout = Self::layout(bytes, align)?;
        // SAFETY: the layout has non-zero size (bytes.max(1)).
        let p = unsafe { f(layout) };
        NonNull::new(p).ok_or_else(|| CoreError::Alloc {
            bytes,
            align,
            resource: "host".into(),
            reason: "out of memory".into(),
        })
    }
}

impl MemoryResource for HostResource {
    fn allocate(&self, bytes: usize, align: usize, _: Option<RawStream>) -> Result<NonNull<u8>> {
        Self::alloc_with(bytes, align, alloc::alloc)
    }

    fn allocate_zeroed(
        &self,
        bytes: usize,
        align: usize,
        _: Option<RawStream>,
    ) -> Result<NonNull<u8>> {
        Self::alloc_with(bytes, align, alloc::alloc_zeroed)
    }

    unsafe fn deallocate(
        &self,
        ptr: NonNull<u8>,
        bytes: usize,
        align: usize,
        _: Option<RawStream>,
    ) {
        let layout = Self::layout(bytes, align).expect("layout was valid at allocation");
        // SAFETY: per the trait contract (item 1) ptr came from `alloc_with` with this layout.
        unsafe { alloc::dealloc(ptr.as_ptr(), layout) }
    }

    fn kind(&self) -> MemoryKind {
        MemoryKind::Host
    }

    fn is_accessible_from(&self, location: Location) -> bool {
        location == Location::Host
    }

    fn name(&self) -> &str {
        "host"
    }
}
