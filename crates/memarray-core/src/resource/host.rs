//! Pageable host memory from the global allocator, aligned to at least 64 bytes; blocks of
//! 2 MiB and more are 2 MiB-aligned with transparent huge pages asked for
//! (`madvise(MADV_HUGEPAGE)`, as NumPy does), which cuts their first-touch page faults by
//! 512x where the kernel grants them (`/sys/kernel/mm/transparent_hugepage/enabled` set to
//! `madvise` or `always`). On Linux, blocks of [`MAPPED`] bytes and more are mapped
//! straight from the kernel, whose pages come zeroed: a zeroed block costs no fill pass
//! (each page is zeroed when first touched, by the thread that touches it, as `calloc`
//! does for NumPy's `np.zeros`), and a free unmaps it, as glibc does past its mapping
//! threshold (at most 32 MiB).

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

/// Blocks this size and larger are mapped from the kernel on Linux (see the module docs):
/// past glibc's largest mapping threshold (32 MiB), so each is a block glibc would have
/// mapped and unmapped itself, never one its heap would have reused.
pub const MAPPED: usize = 64 << 20;

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
    /// filling touches huge pages), or mapped zeroed from [`MAPPED`] bytes up.
    fn alloc_advised(bytes: usize, align: usize, zero: bool) -> Result<NonNull<u8>> {
        #[cfg(target_os = "linux")]
        if bytes >= MAPPED {
            Self::layout(bytes, align)?;
            return mapped::map(bytes);
        }
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
        #[cfg(target_os = "linux")]
        if bytes >= MAPPED {
            // SAFETY: per the trait contract ptr came from `mapped::map(bytes)`.
            unsafe { mapped::unmap(ptr, bytes) };
            return;
        }
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

/// The system's page size (read once; 4096 where it cannot be read).
pub(crate) fn page_size() -> usize {
    static PAGE: std::sync::OnceLock<usize> = std::sync::OnceLock::new();
    *PAGE.get_or_init(|| {
        // SAFETY: sysconf has no preconditions.
        usize::try_from(unsafe { libc::sysconf(libc::_SC_PAGESIZE) })
            .ok()
            .filter(|p| p.is_power_of_two())
            .unwrap_or(4096)
    })
}

/// Blocks mapped from the kernel: anonymous private mappings, 2 MiB-aligned (a larger
/// mapping, its ends unmapped), huge pages advised.
#[cfg(target_os = "linux")]
mod mapped {
    use std::ptr::NonNull;

    use super::HUGE;
    use crate::error::{CoreError, Result};

    /// `bytes` rounded up to whole pages.
    fn span(bytes: usize) -> usize {
        bytes.next_multiple_of(super::page_size())
    }

    /// A zeroed block of `bytes` (at least one page), 2 MiB-aligned.
    pub(super) fn map(bytes: usize) -> Result<NonNull<u8>> {
        let len = span(bytes);
        let oom = |reason: String| CoreError::Alloc {
            bytes,
            align: HUGE,
            resource: "host".into(),
            reason,
        };
        let whole = len
            .checked_add(HUGE)
            .ok_or_else(|| oom("size overflows".into()))?;
        // SAFETY: a new anonymous private mapping; no existing memory is touched.
        let raw = unsafe {
            libc::mmap(
                std::ptr::null_mut(),
                whole,
                libc::PROT_READ | libc::PROT_WRITE,
                libc::MAP_PRIVATE | libc::MAP_ANONYMOUS,
                -1,
                0,
            )
        };
        if raw == libc::MAP_FAILED {
            return Err(oom(format!("mmap: {}", std::io::Error::last_os_error())));
        }
        let start = raw as usize;
        let aligned = start.next_multiple_of(HUGE);
        // SAFETY: [start, aligned) and [aligned + len, start + whole) lie inside the
        // mapping just made and nothing uses them; madvise only changes how the kernel
        // backs [aligned, aligned + len) (a failure leaves 4 KiB pages).
        unsafe {
            if aligned > start {
                libc::munmap(raw, aligned - start);
            }
            let tail = start + whole - (aligned + len);
            if tail > 0 {
                libc::munmap((aligned + len) as *mut libc::c_void, tail);
            }
            libc::madvise(aligned as *mut libc::c_void, len, libc::MADV_HUGEPAGE);
        }
        NonNull::new(aligned as *mut u8).ok_or_else(|| oom("mmap returned null".into()))
    }

    /// Unmaps a block [`map`] returned for `bytes`.
    ///
    /// # Safety
    /// `p` came from `map(bytes)` and is not used after.
    pub(super) unsafe fn unmap(p: NonNull<u8>, bytes: usize) {
        // SAFETY: per the contract, [p, p + span(bytes)) is one block `map` made.
        unsafe { libc::munmap(p.as_ptr().cast(), span(bytes)) };
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// Resident bytes of this process (Linux), from /proc/self/statm.
    #[cfg(target_os = "linux")]
    fn resident() -> usize {
        let statm = std::fs::read_to_string("/proc/self/statm").unwrap();
        let pages: usize = statm.split_whitespace().nth(1).unwrap().parse().unwrap();
        pages * page_size()
    }

    #[cfg(target_os = "linux")]
    #[test]
    fn large_blocks_are_mapped_zeroed_without_a_fill_and_unmapped_on_free() {
        let r = HostResource;
        let bytes = 4 * MAPPED + 12_345;
        let before = resident();
        let p = r.allocate_zeroed(bytes, 64, None).unwrap();
        assert_eq!(p.as_ptr() as usize % HUGE, 0);
        // No fill touched the pages: the resident size barely moved (a fill would add
        // 256 MiB).
        let grew = resident().saturating_sub(before);
        assert!(grew < MAPPED / 2, "resident grew by {grew} bytes");
        // SAFETY: `bytes` zeroed bytes were just allocated at p; this thread alone uses them.
        let all = unsafe { std::slice::from_raw_parts_mut(p.as_ptr(), bytes) };
        assert!(all.iter().step_by(4093).all(|&b| b == 0) && all[bytes - 1] == 0);
        // Written on every page: now resident.
        all.iter_mut().step_by(4096).for_each(|b| *b = 9);
        all[bytes - 1] = 7;
        assert_eq!((all[4096], all[bytes - 1]), (9, 7));
        let touched = resident();
        assert!(
            touched.saturating_sub(before) > bytes / 2,
            "written pages resident"
        );
        // SAFETY: allocated above with this size and alignment; not used after.
        unsafe { r.deallocate(p, bytes, 64, None) };
        // The free gives them back at once.
        assert!(
            touched.saturating_sub(resident()) > bytes / 2,
            "unmapped on free"
        );
        // An uninitialised block of the same size frees the same way.
        let p = r.allocate(MAPPED, 8, None).unwrap();
        assert_eq!(p.as_ptr() as usize % HUGE, 0);
        // SAFETY: as above.
        unsafe { r.deallocate(p, MAPPED, 8, None) };
    }

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
