//! [`GrowableRange`]: an address range reserved once and backed with memory piece by piece,
//! so a pool grows in place (a block freed in a later piece coalesces with one in an
//! earlier piece: no segment boundary between them) and shrinks from its end. CUDA's
//! virtual memory API is the device's (memarray-cuda's `VmmRange`); [`HostRange`] is host
//! memory's, over `mmap` (reserved without access, made readable and writable as it is
//! backed), and is what the pool's logic is tested on without a GPU.

use std::fmt::Debug;
use std::sync::Mutex;

use super::{Location, MemoryKind};
use crate::error::{CoreError, Result};

/// A reserved address range that is backed with memory in pieces of
/// [`granularity`](GrowableRange::granularity) bytes, from its start up.
pub trait GrowableRange: Send + Sync + Debug {
    /// The range's first address.
    fn base(&self) -> usize;
    /// Bytes reserved: the most it can back.
    fn capacity(&self) -> usize;
    /// Every offset and length given to [`map`](Self::map) and [`unmap`](Self::unmap) is
    /// a multiple of this.
    fn granularity(&self) -> usize;
    /// Backs `[base + from, base + to)` with memory (the bytes below `from` are backed).
    ///
    /// # Errors
    /// [`CoreError::OutOfMemory`] when no memory is left to back it (nothing changes).
    fn map(&self, from: usize, to: usize) -> Result<()>;
    /// Releases what it can of `[base + from, base + to)`, the range's backed end, from
    /// the end down (the addresses stay reserved); nothing may use that memory any more.
    /// Returns the backed end after it: `from` when all of it went, more where memory is
    /// released only in the pieces it was backed in (CUDA's mappings).
    fn unmap(&self, from: usize, to: usize) -> usize;
    /// Bytes backed now, from the start.
    fn backed(&self) -> usize;

    /// Where each piece backed now ends (offsets, ascending; the last is
    /// [`backed`](Self::backed)): memory backed by one [`map`](Self::map) call is one
    /// piece. A restore backs the same pieces again. By default the backed bytes are one
    /// piece.
    fn pieces(&self) -> Vec<usize> {
        let backed = self.backed();
        if backed == 0 {
            Vec::new()
        } else {
            vec![backed]
        }
    }
    /// Whose memory it is.
    fn kind(&self) -> MemoryKind;
    /// Where it can be reached from.
    fn is_accessible_from(&self, location: Location) -> bool;
    /// Its device, if any.
    fn device_id(&self) -> Option<u32>;
    /// For messages.
    fn name(&self) -> &str;
}

/// Host memory as a [`GrowableRange`]: `capacity` bytes reserved with `mmap` (no access,
/// no swap reserved), pages made readable and writable as they are backed and given back
/// to the system (`MADV_DONTNEED`, then no access) as the range shrinks.
#[derive(Debug)]
pub struct HostRange {
    base: usize,
    capacity: usize,
    granularity: usize,
    name: String,
    /// Where each backed piece ends, ascending (the last is the backed end, which each
    /// call must grow or shrink).
    ends: Mutex<Vec<usize>>,
}

impl HostRange {
    /// Reserves `capacity` bytes (rounded up to `granularity`, itself a multiple of the page
    /// size).
    ///
    /// # Errors
    /// [`CoreError::Alloc`] when the address space cannot be reserved or `granularity` is
    /// not a multiple of the page size.
    pub fn reserve(capacity: usize, granularity: usize) -> Result<Self> {
        let page = super::host::page_size();
        let refuse = |reason: String| CoreError::Alloc {
            bytes: capacity,
            align: granularity,
            resource: "host range".into(),
            reason,
        };
        if granularity == 0 || !granularity.is_multiple_of(page) {
            return Err(refuse(format!(
                "the granularity {granularity} is not a multiple of the page size {page}"
            )));
        }
        let capacity = capacity
            .checked_next_multiple_of(granularity)
            .filter(|&c| c > 0 && c <= isize::MAX as usize)
            .ok_or_else(|| refuse("the capacity is 0 or too large".into()))?;
        // SAFETY: an anonymous private mapping at an address the kernel picks; no access.
        let p = unsafe {
            libc::mmap(
                std::ptr::null_mut(),
                capacity,
                libc::PROT_NONE,
                libc::MAP_PRIVATE | libc::MAP_ANONYMOUS | libc::MAP_NORESERVE,
                -1,
                0,
            )
        };
        if p == libc::MAP_FAILED {
            return Err(refuse(format!("mmap: {}", std::io::Error::last_os_error())));
        }
        Ok(HostRange {
            base: p as usize,
            capacity,
            granularity,
            name: format!("host range[{capacity} bytes]"),
            ends: Mutex::new(Vec::new()),
        })
    }

    fn ends(&self) -> std::sync::MutexGuard<'_, Vec<usize>> {
        self.ends
            .lock()
            .unwrap_or_else(std::sync::PoisonError::into_inner)
    }
}

impl GrowableRange for HostRange {
    fn base(&self) -> usize {
        self.base
    }

    fn capacity(&self) -> usize {
        self.capacity
    }

    fn granularity(&self) -> usize {
        self.granularity
    }

    fn map(&self, from: usize, to: usize) -> Result<()> {
        let mut ends = self.ends();
        let backed = ends.last().copied().unwrap_or(0);
        let fits = from == backed && from < to && to <= self.capacity;
        if !fits || !from.is_multiple_of(self.granularity) || !to.is_multiple_of(self.granularity) {
            return Err(CoreError::OutOfMemory {
                bytes: to.saturating_sub(from),
                resource: self.name.clone(),
                reason: format!(
                    "cannot back [{from}, {to}): {backed} bytes are backed of {} reserved",
                    self.capacity
                ),
            });
        }
        // SAFETY: [base + from, base + to) lies inside the reservation (checked above).
        let rc = unsafe {
            libc::mprotect(
                (self.base + from) as *mut libc::c_void,
                to - from,
                libc::PROT_READ | libc::PROT_WRITE,
            )
        };
        if rc != 0 {
            return Err(CoreError::OutOfMemory {
                bytes: to - from,
                resource: self.name.clone(),
                reason: format!("mprotect: {}", std::io::Error::last_os_error()),
            });
        }
        ends.push(to);
        Ok(())
    }

    fn unmap(&self, from: usize, to: usize) -> usize {
        let mut ends = self.ends();
        let backed = ends.last().copied().unwrap_or(0);
        if to != backed || from >= to || !from.is_multiple_of(self.granularity) {
            return backed; // not the backed end: nothing is released (never UB)
        }
        let (p, n) = ((self.base + from) as *mut libc::c_void, to - from);
        // SAFETY: a backed part of the reservation; nothing uses it any more (the
        // caller's contract). Failure leaves the pages mapped, never unsafe.
        unsafe {
            libc::madvise(p, n, libc::MADV_DONTNEED);
            libc::mprotect(p, n, libc::PROT_NONE);
        }
        // Pages are released at any granule: a piece cut short ends at `from`.
        ends.retain(|&end| end < from);
        if from > 0 {
            ends.push(from);
        }
        from
    }

    fn backed(&self) -> usize {
        self.ends().last().copied().unwrap_or(0)
    }

    fn pieces(&self) -> Vec<usize> {
        self.ends().clone()
    }

    fn kind(&self) -> MemoryKind {
        MemoryKind::Host
    }

    fn is_accessible_from(&self, location: Location) -> bool {
        location == Location::Host
    }

    fn device_id(&self) -> Option<u32> {
        None
    }

    fn name(&self) -> &str {
        &self.name
    }
}

impl Drop for HostRange {
    fn drop(&mut self) {
        // SAFETY: the whole reservation made in `reserve`; nothing in it is used after
        // the range (its pool) is dropped.
        unsafe { libc::munmap(self.base as *mut libc::c_void, self.capacity) };
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_host_range_backs_and_releases_its_end() {
        let g = 1 << 16;
        let r = HostRange::reserve(1 << 20, g).unwrap();
        r.map(0, 2 * g).unwrap();
        // SAFETY: backed just now.
        unsafe { std::ptr::write_bytes(r.base() as *mut u8, 7, 2 * g) };
        r.map(2 * g, 3 * g).unwrap();
        assert_eq!(r.backed(), 3 * g);
        assert_eq!(r.pieces(), [2 * g, 3 * g], "one piece a map");
        assert!(r.map(g, 4 * g).is_err(), "only the end grows");
        assert!(
            r.map(3 * g, (1 << 20) + g).is_err(),
            "not past the reservation"
        );
        assert_eq!(r.unmap(2 * g, 3 * g), 2 * g);
        assert_eq!(r.backed(), 2 * g);
        assert_eq!(r.unmap(0, g), 2 * g, "not the end: ignored");
        assert_eq!(r.pieces(), [2 * g]);
        // SAFETY: still backed.
        assert_eq!(unsafe { *(r.base() as *const u8).add(2 * g - 1) }, 7);
        assert_eq!(r.unmap(g, 2 * g), g, "part of a piece");
        assert_eq!(r.pieces(), [g], "the piece cut short");
        assert!(
            HostRange::reserve(1 << 20, 1000).is_err(),
            "not a page multiple"
        );
    }
}
