//! The host-readability check of imports. The layout rules themselves are memarray-core's
//! ([`memarray_core::layout`]), shared with the CUDA Array Interface.
//!
//! A forged tensor may point into memory that is mapped but cannot be read (a `PROT_NONE`
//! page, such as a thread stack's guard page): asking whether a page is mapped (`msync`) is
//! not enough. Two questions, cheapest first:
//! - **A probe.** Ranges up to [`PROBE_PAGES`] pages (the managed struct, shape, strides,
//!   small data) are read one byte per page with `process_vm_readv` on this process, which
//!   reports `EFAULT` instead of faulting and changes no mapping. A successful probe is
//!   proof. A failed one is not: the kernel cannot pin driver-mapped memory (CUDA's pinned
//!   and managed host memory) that a plain load reads fine, so a failure is settled by the
//!   mappings' protections.
//! - **The mappings.** Longer ranges, and failed probes, are checked against the protection
//!   of every mapping that covers them: `PROCMAP_QUERY` (Linux >= 6.11, one `ioctl` per
//!   mapping) or else the text of `/proc/self/maps` (a few hundred microseconds). Nothing of
//!   the range is read, so a large `np.memmap` is not paged in.

use std::io::Read;
use std::os::fd::AsRawFd;

const PAGE: u64 = 4096;
/// Ranges up to this many pages are probed (one system call).
const PROBE_PAGES: u64 = 64;

/// Whether every byte of `[address, address + len)` can be read by this process. `len` 0
/// is trivially readable.
pub(crate) fn host_range_readable(address: u64, len: u64) -> bool {
    if len == 0 {
        return true;
    }
    let Some(end) = address.checked_add(len) else {
        return false;
    };
    if (end - 1) / PAGE - address / PAGE < PROBE_PAGES && probe(address, end) {
        return true;
    }
    match mappings_readable(address, end) {
        Some(ok) => ok,
        // No /proc (a sandbox without it): whether the range is mapped is all that can be
        // asked without reading it.
        None => msync_mapped(address, end),
    }
}

/// Reads one byte of every page of `[address, end)` (at most [`PROBE_PAGES`]) through the
/// kernel, which fails with `EFAULT` where a plain read would fault. `true` proves the range
/// readable; `false` proves nothing (see the module docs).
fn probe(address: u64, end: u64) -> bool {
    let mut sink = [0u8; PROBE_PAGES as usize];
    let mut remote = [libc::iovec {
        iov_base: std::ptr::null_mut(),
        iov_len: 0,
    }; PROBE_PAGES as usize];
    let mut n = 0usize;
    let mut at = address;
    while at < end && n < remote.len() {
        remote[n] = libc::iovec {
            iov_base: at as usize as *mut libc::c_void,
            iov_len: 1,
        };
        n += 1;
        at = (at / PAGE + 1) * PAGE;
    }
    let local = libc::iovec {
        iov_base: sink.as_mut_ptr().cast(),
        iov_len: n,
    };
    // SAFETY: the local iovec covers `n` bytes of `sink`, which lives for the call; the
    // remote iovecs are only read by the kernel, which validates them and reports
    // unreadable memory as an error (EFAULT) or a short count, never a fault.
    let got = unsafe {
        libc::process_vm_readv(
            libc::getpid(),
            &raw const local,
            1,
            remote.as_ptr(),
            n as _,
            0,
        )
    };
    at >= end && got == n as isize
}

/// Whether `[address, end)` is covered by readable mappings; `None` when /proc cannot be
/// read.
fn mappings_readable(address: u64, end: u64) -> Option<bool> {
    let mut maps = std::fs::File::open("/proc/self/maps").ok()?;
    if let Some(ok) = query_readable(&maps, address, end) {
        return Some(ok);
    }
    let mut text = String::new();
    maps.read_to_string(&mut text).ok()?;
    Some(covered_readable(&text, address, end))
}

/// `struct procmap_query` of `<linux/fs.h>` (Linux 6.11).
#[repr(C)]
#[derive(Default)]
struct ProcmapQuery {
    size: u64,
    query_flags: u64,
    query_addr: u64,
    vma_start: u64,
    vma_end: u64,
    vma_flags: u64,
    vma_page_size: u64,
    vma_offset: u64,
    inode: u64,
    dev_major: u32,
    dev_minor: u32,
    vma_name_size: u32,
    build_id_size: u32,
    vma_name_addr: u64,
    build_id_addr: u64,
}

/// `_IOWR('f', 17, struct procmap_query)`.
const PROCMAP_QUERY: u64 =
    (3 << 30) | ((size_of::<ProcmapQuery>() as u64) << 16) | (0x66 << 8) | 17;
const PROCMAP_QUERY_VMA_READABLE: u64 = 0x01;

/// The walk over the mappings covering `[address, end)` through `PROCMAP_QUERY`; `None`
/// where the kernel has no such `ioctl`.
fn query_readable(maps: &std::fs::File, address: u64, end: u64) -> Option<bool> {
    let mut at = address;
    while at < end {
        let mut q = ProcmapQuery {
            size: size_of::<ProcmapQuery>() as u64,
            query_addr: at,
            ..ProcmapQuery::default()
        };
        // SAFETY: `q` is a live, correctly sized `procmap_query` whose name and build-id
        // buffers are absent (sizes 0); the kernel writes only into `q`.
        let rc = unsafe { libc::ioctl(maps.as_raw_fd(), PROCMAP_QUERY as _, &raw mut q) };
        if rc != 0 {
            return match std::io::Error::last_os_error().raw_os_error() {
                // No mapping covers `at`.
                Some(libc::ENOENT) => Some(false),
                _ => None,
            };
        }
        if q.vma_start > at || q.vma_flags & PROCMAP_QUERY_VMA_READABLE == 0 || q.vma_end <= at {
            return Some(false);
        }
        at = q.vma_end;
    }
    Some(true)
}

/// The coverage walk over a maps text (lines in address order, `lo-hi perms ...`).
fn covered_readable(maps: &str, address: u64, end: u64) -> bool {
    let mut at = address;
    for line in maps.lines() {
        let mut fields = line.split_ascii_whitespace();
        let (Some(range), Some(perms)) = (fields.next(), fields.next()) else {
            continue;
        };
        let Some((lo, hi)) = range.split_once('-') else {
            continue;
        };
        let (Ok(lo), Ok(hi)) = (u64::from_str_radix(lo, 16), u64::from_str_radix(hi, 16)) else {
            continue;
        };
        if hi <= at {
            continue;
        }
        if lo > at || !perms.starts_with('r') {
            return false;
        }
        at = hi;
        if at >= end {
            return true;
        }
    }
    false
}

fn msync_mapped(address: u64, end: u64) -> bool {
    let start = address - address % PAGE;
    let Ok(n) = usize::try_from(end - start) else {
        return false;
    };
    // SAFETY: msync only inspects the mappings of [start, start + n); MS_ASYNC schedules
    // no I/O. An unmapped range is ENOMEM, never a fault.
    unsafe { libc::msync(start as usize as *mut libc::c_void, n, libc::MS_ASYNC) == 0 }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// Three pages: readable, `PROT_NONE`, readable.
    struct Guarded(*mut libc::c_void);

    impl Guarded {
        fn new() -> Guarded {
            // SAFETY: a fresh private anonymous mapping; the middle page's protection is
            // changed on memory this test owns.
            unsafe {
                let p = libc::mmap(
                    std::ptr::null_mut(),
                    3 * PAGE as usize,
                    libc::PROT_READ | libc::PROT_WRITE,
                    libc::MAP_PRIVATE | libc::MAP_ANONYMOUS,
                    -1,
                    0,
                );
                assert_ne!(p, libc::MAP_FAILED);
                let mid = p.cast::<u8>().add(PAGE as usize).cast();
                assert_eq!(libc::mprotect(mid, PAGE as usize, libc::PROT_NONE), 0);
                Guarded(p)
            }
        }
        fn at(&self, page: u64) -> u64 {
            self.0 as u64 + page * PAGE
        }
    }

    impl Drop for Guarded {
        fn drop(&mut self) {
            // SAFETY: the mapping made in `new`.
            unsafe { libc::munmap(self.0, 3 * PAGE as usize) };
        }
    }

    #[test]
    fn a_guard_page_is_unreadable_though_mapped() {
        let g = Guarded::new();
        assert!(host_range_readable(g.at(0), PAGE));
        assert!(host_range_readable(g.at(2) + 8, 64));
        assert!(!host_range_readable(g.at(1), 8));
        assert!(!host_range_readable(g.at(1) + 4000, 8));
        // Across it, from either side.
        assert!(!host_range_readable(g.at(0) + 4000, 200));
        assert!(!host_range_readable(g.at(0), 3 * PAGE));
        // msync calls it mapped: that is why it is not the check.
        assert!(msync_mapped(g.at(1), g.at(2)));
        // The probe cannot prove the guard page readable, and the mappings say it is not;
        // both ways of asking the mappings agree.
        assert!(!probe(g.at(1), g.at(1) + 8));
        assert!(probe(g.at(2), g.at(3)));
        assert_eq!(mappings_readable(g.at(0), g.at(3)), Some(false));
        assert_eq!(mappings_readable(g.at(2), g.at(3)), Some(true));
        assert_eq!(mappings_readable(g.at(0), g.at(1)), Some(true));
        // PROCMAP_QUERY where the kernel has it (Linux >= 6.11).
        if let Ok(maps) = std::fs::File::open("/proc/self/maps") {
            assert_ne!(query_readable(&maps, g.at(0), g.at(3)), Some(true));
            assert_ne!(query_readable(&maps, g.at(2), g.at(3)), Some(false));
        }
        let mut text = String::new();
        std::fs::File::open("/proc/self/maps")
            .unwrap()
            .read_to_string(&mut text)
            .unwrap();
        assert!(!covered_readable(&text, g.at(0), g.at(3)));
        assert!(covered_readable(&text, g.at(2), g.at(3)));
    }

    #[test]
    fn unmapped_and_wrapping_ranges_are_unreadable() {
        assert!(!host_range_readable(8, 8));
        assert!(!host_range_readable(u64::MAX - 4, 16));
        assert!(host_range_readable(0, 0));
        let v = vec![1u8; 10 * PAGE as usize * PROBE_PAGES as usize];
        // Long enough for the maps walk.
        assert!(host_range_readable(v.as_ptr() as u64, v.len() as u64));
    }

    #[test]
    fn the_maps_walk_needs_contiguous_readable_cover() {
        let maps = "1000-3000 r--p 0 0:0 0\n3000-4000 ---p 0 0:0 0\n4000-6000 rw-p 0 0:0 0\n";
        assert!(covered_readable(maps, 0x1000, 0x3000));
        assert!(!covered_readable(maps, 0x2000, 0x3001));
        assert!(covered_readable(maps, 0x4000, 0x6000));
        assert!(!covered_readable(maps, 0x5000, 0x7000));
        assert!(!covered_readable(maps, 0x800, 0x1800));
    }
}
