//! The host-readability check of imports. The layout rules themselves are memarray-core's
//! ([`memarray_core::layout`]), shared with the CUDA Array Interface.
//!
//! A forged tensor may point into memory that is mapped but cannot be read (a `PROT_NONE`
//! page, such as a thread stack's guard page): asking whether a page is mapped (`msync`) is
//! not enough. Two questions, cheapest first:
//! - **A probe.** Ranges up to [`PROBE_PAGES`] pages (the managed struct, shape, strides,
//!   small data) have one byte per page copied by the kernel into a private memory file
//!   (a `pwrite` a page), which reports `EFAULT` instead of faulting and changes no mapping. A
//!   successful probe is proof; a failed one is settled by the mappings' protections. One
//!   import proves each page once ([`Readable`]): shape and strides beside the struct cost
//!   nothing more.
//! - **The mappings.** Longer ranges, and failed probes, are checked against the protection
//!   of every mapping that covers them: `PROCMAP_QUERY` (Linux >= 6.11, one `ioctl` per
//!   mapping) or else the text of `/proc/self/maps` (a few hundred microseconds). Nothing of
//!   the range is read, so a large `np.memmap` is not paged in.

use std::io::Read;
use std::os::fd::AsRawFd;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Mutex, PoisonError};

const PAGE: u64 = 4096;
/// Ranges up to this many pages are probed (a system call a page); longer ones ask the
/// mappings (one `ioctl` a mapping).
const PROBE_PAGES: u64 = 8;

/// The pages one import has proven readable, so that a range on pages already proven
/// (shape and strides beside the managed struct or beside each other, as producers
/// usually allocate them) costs no system call. Valid for one import: mappings change.
#[derive(Default)]
pub(crate) struct Readable {
    proven: [(u64, u64); 4],
    n: usize,
}

impl Readable {
    /// Whether `[address, address + len)` can be read (see [`host_range_readable`]).
    pub(crate) fn check(&mut self, address: u64, len: u64) -> bool {
        if len == 0 {
            return true;
        }
        let Some(end) = address.checked_add(len) else {
            return false;
        };
        let lo = address - address % PAGE;
        let hi = end.div_ceil(PAGE).saturating_mul(PAGE);
        if self.proven[..self.n]
            .iter()
            .any(|&(a, b)| a <= lo && hi <= b)
        {
            return true;
        }
        if !host_range_readable(address, len) {
            return false;
        }
        if self.n < self.proven.len() {
            self.proven[self.n] = (lo, hi);
            self.n += 1;
        }
        true
    }
}

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
/// kernel, which fails with `EFAULT` where a plain read would fault: a `pwrite` of that
/// byte into a private memory file (the kernel copies from user memory as a load would, so
/// pinned and managed memory pass too). `true` proves the range readable; `false` proves
/// nothing (no memory file here), and the mappings decide.
///
/// Never inlined: valgrind users suppress the probe's `pwrite` by this frame
/// (`scripts/valgrind.supp`), and an optimised build would otherwise fold it into its caller.
#[inline(never)]
fn probe(address: u64, end: u64) -> bool {
    let Some(fd) = sink() else {
        return false;
    };
    let mut at = address;
    while at < end {
        // One page per call (a vectored write would be one call, but valgrind names each
        // of its vector's entries apart, and the forged one can be any).
        // SAFETY: `fd` is this process's memory file; the kernel only reads the byte
        // (copy_from_user), reporting unreadable memory as EFAULT, never a fault. Offset
        // 0: the file never grows past one byte.
        let wrote = unsafe { libc::pwrite(fd, at as usize as *const libc::c_void, 1, 0) };
        if wrote != 1 {
            return false;
        }
        at = (at / PAGE + 1) * PAGE;
    }
    true
}

/// The memory file the probe writes into (made once; a child shares its parent's, which
/// is harmless: its contents are never read). `None` without `memfd_create`.
fn sink() -> Option<libc::c_int> {
    static FD: std::sync::OnceLock<Option<libc::c_int>> = std::sync::OnceLock::new();
    *FD.get_or_init(|| {
        // SAFETY: a NUL-terminated name and plain flags; the descriptor lives for the
        // process (close-on-exec).
        let fd = unsafe { libc::memfd_create(c"memarray-probe".as_ptr(), libc::MFD_CLOEXEC) };
        (fd >= 0).then_some(fd)
    })
}

/// Whether `[address, end)` is covered by readable mappings; `None` when /proc cannot be
/// read.
fn mappings_readable(address: u64, end: u64) -> Option<bool> {
    if let Some(ok) = query_cached(address, end) {
        return Some(ok);
    }
    let mut text = String::new();
    std::fs::File::open("/proc/self/maps")
        .ok()?
        .read_to_string(&mut text)
        .ok()?;
    Some(covered_readable(&text, address, end))
}

/// `/proc/self/maps` kept open for `PROCMAP_QUERY` (an open is most of a query's cost),
/// with the fork generation it was opened in: a child's inherited descriptor describes
/// its parent, so a child opens its own.
static MAPS: Mutex<Option<(u64, std::fs::File)>> = Mutex::new(None);
/// Set once the kernel is known to lack `PROCMAP_QUERY` (Linux < 6.11).
static NO_QUERY: AtomicBool = AtomicBool::new(false);

fn query_cached(address: u64, end: u64) -> Option<bool> {
    if NO_QUERY.load(Ordering::Relaxed) {
        return None;
    }
    let generation = memarray_core::fork::generation();
    let mut maps = MAPS.lock().unwrap_or_else(PoisonError::into_inner);
    if maps.as_ref().is_none_or(|(g, _)| *g != generation) {
        *maps = Some((generation, std::fs::File::open("/proc/self/maps").ok()?));
    }
    let (_, file) = maps.as_ref()?;
    let answer = query_readable(file, address, end);
    if answer.is_none() {
        NO_QUERY.store(true, Ordering::Relaxed);
    }
    answer
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

// Never inlined: scripts/valgrind.supp names this frame (optimised builds too).
#[inline(never)]
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
