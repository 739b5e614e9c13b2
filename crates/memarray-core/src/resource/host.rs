//! Pageable host memory from the global allocator, aligned to at least 64 bytes; blocks of
//! 2 MiB and more are 2 MiB-aligned with transparent huge pages asked for
//! (`madvise(MADV_HUGEPAGE)`, as NumPy does), which cuts their first-touch page faults by
//! 512x where the kernel grants them (`/sys/kernel/mm/transparent_hugepage/enabled` set to
//! `madvise` or `always`).

use std::alloc::{self, Layout};
use std::ptr::NonNull;

use super::{Location, MemoryKind, MemoryResource, RawStream};
use crate::error::{CoreError, Result};

/// Minimum alignment of every host allocation: a cache line, and enough for AVX-512.
pub const HOST_ALIGN: usize = 64;

/// Largest alignment served (a 2 MiB huge page).
const MAX_ALIGN: usize = 1 << 21;

/// A huge page: blocks this size and larger are aligned to it and advised to use them.
const HUGE: usize = 1 << 21;

/// Pageable host memory, aligned to `max(align, 64)` (2 MiB from 2 MiB up, huge pages
/// asked for).
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
        let floor = if bytes >= HUGE { HUGE } else { HOST_ALIGN };
        Layout::from_size_align(bytes.max(1), align.max(floor)).map_err(|e| CoreError::Alloc {
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

    /// A block of `bytes`; zero-filled after the huge-page advice when `zero` (so the
    /// filling touches huge pages).
    fn alloc_advised(bytes: usize, align: usize, zero: bool) -> Result<NonNull<u8>> {
        if bytes < HUGE {
            let f = if zero {
                alloc::alloc_zeroed
            } else {
                alloc::alloc
            };
            return Self::alloc_with(bytes, align, f);
        }
        let p = Self::alloc_with(bytes, align, alloc::alloc)?;
        // SAFETY: [p, p + bytes) was just allocated, 2 MiB-aligned (layout); madvise only
        // changes how the kernel backs it (a failure leaves 4 KiB pages), and the fill
        // writes within the block before anyone reads it.
        unsafe {
            #[cfg(target_os = "linux")]
            libc::madvise(p.as_ptr().cast(), bytes, libc::MADV_HUGEPAGE);
            if zero {
                std::ptr::write_bytes(p.as_ptr(), 0, bytes);
            }
        }
        Ok(p)
    }
}

impl MemoryResource for HostResource {
    fn allocate(&self, bytes: usize, align: usize, _: Option<RawStream>) -> Result<NonNull<u8>> {
        Self::alloc_advised(bytes, align, false)
    }

    fn allocate_zeroed(
        &self,
        bytes: usize,
        align: usize,
        _: Option<RawStream>,
    ) -> Result<NonNull<u8>> {
        Self::alloc_advised(bytes, align, true)
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

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn blocks_from_two_mib_up_are_huge_page_aligned_and_zeroed_when_asked() {
        let r = HostResource;
        for bytes in [HUGE - 1, HUGE, 3 * HUGE + 17] {
            let p = r.allocate_zeroed(bytes, 64, None).unwrap();
            let want = if bytes >= HUGE { HUGE } else { HOST_ALIGN };
            assert_eq!(p.as_ptr() as usize % want, 0, "{bytes} bytes");
            // SAFETY: `bytes` zeroed bytes were just allocated at p.
            let all = unsafe { std::slice::from_raw_parts(p.as_ptr(), bytes) };
            assert!(all.iter().all(|&b| b == 0), "{bytes} bytes zeroed");
            // SAFETY: allocated above with this size and alignment; not used after.
            unsafe { r.deallocate(p, bytes, 64, None) };
        }
        // An uninitialised block of the same sizes frees with the same layout.
        let p = r.allocate(HUGE, 8, None).unwrap();
        assert_eq!(p.as_ptr() as usize % HUGE, 0);
        // SAFETY: as above.
        unsafe { r.deallocate(p, HUGE, 8, None) };
    }
}
