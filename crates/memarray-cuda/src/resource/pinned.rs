//! [`PinnedResource`]: page-locked host memory from `cuMemHostAlloc`.

use std::ffi::c_uint;
use std::sync::Arc;

use cudarc::driver::sys;
use memarray_core::{Location, MemoryKind, RawStream};

use super::driver_backed::{Backend, DriverResource};
use crate::device::Device;
use crate::driver;
use crate::error::Result;

/// `cuMemHostAlloc` flags.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub struct PinnedFlags {
    /// `CU_MEMHOSTALLOC_PORTABLE`: pinned for every context, not only the allocating one.
    pub portable: bool,
    /// `CU_MEMHOSTALLOC_DEVICEMAP`: mapped into the device address space. With unified
    /// addressing (every 64-bit platform) all pinned memory is mapped anyway.
    pub mapped: bool,
    /// `CU_MEMHOSTALLOC_WRITECOMBINED`: faster host-to-device transfers, but host reads are
    /// uncached and very slow: only for buffers the host writes and never reads.
    pub write_combined: bool,
}

impl Default for PinnedFlags {
    /// Portable only: usable from every device, fast to read back on the host.
    fn default() -> Self {
        PinnedFlags {
            portable: true,
            mapped: false,
            write_combined: false,
        }
    }
}

impl PinnedFlags {
    fn bits(self) -> c_uint {
        let mut f = 0;
        if self.portable {
            f |= sys::CU_MEMHOSTALLOC_PORTABLE;
        }
        if self.mapped {
            f |= sys::CU_MEMHOSTALLOC_DEVICEMAP;
        }
        if self.write_combined {
            f |= sys::CU_MEMHOSTALLOC_WRITECOMBINED;
        }
        f as c_uint
    }
}

/// Page-locked host memory: the host reads and writes it directly, copies to and from
/// devices run asynchronously at full PCIe speed (55 GB/s on an H200 against 9-16 GB/s
/// pageable), and with unified addressing every device can also access it in place.
pub type PinnedResource = DriverResource<PinnedAlloc>;

/// The `cuMemHostAlloc` / `cuMemFreeHost` pair, with its flags.
#[derive(Debug)]
pub struct PinnedAlloc {
    flags: PinnedFlags,
}

impl Backend for PinnedAlloc {
    const KIND: MemoryKind = MemoryKind::Pinned;
    const HOST_ZEROED: bool = true;
    const ON_DEVICE: bool = false;

    unsafe fn alloc(&self, _: &Device, size: usize, _: Option<RawStream>) -> Result<usize> {
        // SAFETY: the caller made the device's context current (item 1).
        Ok(unsafe { driver::mem_host_alloc(size, self.flags.bits()) }? as usize)
    }

    unsafe fn free(&self, base: usize, _: Option<RawStream>) {
        // SAFETY: `base` came from `mem_host_alloc` and is freed once (item 1); a live
        // context is current (item 2).
        let freed = unsafe { driver::mem_free_host(base as *mut std::ffi::c_void) };
        crate::parked::park_err("freeing pinned memory", freed);
    }

    /// The host, and every device: with unified addressing all `cuMemHostAlloc` memory is
    /// directly accessible from every device, whatever the flags.
    fn accessible(&self, _: &Device, _: Location) -> bool {
        true
    }
}

impl PinnedResource {
    /// Portable pinned memory, allocated in `device`'s context.
    pub fn new(device: &Arc<Device>) -> Self {
        super::probe_captures();
        Self::with_flags(device, PinnedFlags::default())
    }

    /// Pinned memory with `flags`, allocated in `device`'s context.
    pub fn with_flags(device: &Arc<Device>, flags: PinnedFlags) -> Self {
        let mut name = String::from("pinned");
        for (on, word) in [
            (flags.portable, " portable"),
            (flags.mapped, " mapped"),
            (flags.write_combined, " write-combined"),
        ] {
            if on {
                name.push_str(word);
            }
        }
        Self::with_backend(device, name, PinnedAlloc { flags })
    }

    /// The flags allocations use.
    pub fn flags(&self) -> PinnedFlags {
        self.backend.flags
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn default_flags_are_portable_and_not_write_combined() {
        let f = PinnedFlags::default();
        assert!(f.portable && !f.mapped && !f.write_combined);
        assert_eq!(f.bits(), sys::CU_MEMHOSTALLOC_PORTABLE as c_uint);
        let all = PinnedFlags {
            portable: true,
            mapped: true,
            write_combined: true,
        };
        assert_eq!(all.bits(), 7);
    }
}

/// Host memory someone else allocated, page-locked in place (`cuMemHostRegister`) until
/// dropped: what Numba's `mempin` asks of its memory manager. Portable and mapped flags as
/// in [`PinnedFlags`] (write-combining does not apply to registered memory).
#[derive(Debug)]
pub struct HostRegistration {
    device: Arc<Device>,
    addr: usize,
    len: usize,
}

impl HostRegistration {
    /// Page-locks `[addr, addr + len)` for `device` (and every device when
    /// `flags.portable`).
    ///
    /// # Safety
    /// 1. `[addr, addr + len)` is host memory that stays allocated until the registration
    ///    is dropped.
    pub unsafe fn new(
        device: &Arc<Device>,
        addr: usize,
        len: usize,
        flags: PinnedFlags,
    ) -> Result<Self> {
        if addr == 0 || len == 0 {
            return Err(crate::error::CudaError::Core(
                memarray_core::CoreError::Alloc {
                    bytes: len,
                    align: 0,
                    resource: "host registration".into(),
                    reason: "a null address or an empty range cannot be page-locked".into(),
                },
            ));
        }
        let mut bits = 0;
        if flags.portable {
            bits |= sys::CU_MEMHOSTREGISTER_PORTABLE;
        }
        if flags.mapped {
            bits |= sys::CU_MEMHOSTREGISTER_DEVICEMAP;
        }
        let _ctx = device.bind()?;
        // SAFETY: item 1 keeps the memory allocated while registered; the device's
        // context is current.
        unsafe { driver::mem_host_register(addr as *mut _, len, bits as c_uint) }?;
        Ok(Self {
            device: device.clone(),
            addr,
            len,
        })
    }

    /// The registered range's start.
    pub fn addr(&self) -> usize {
        self.addr
    }

    /// Bytes registered.
    pub fn len(&self) -> usize {
        self.len
    }

    /// Never true: an empty range is refused.
    pub fn is_empty(&self) -> bool {
        self.len == 0
    }
}

impl Drop for HostRegistration {
    fn drop(&mut self) {
        if let Ok(_ctx) = self.device.bind() {
            // SAFETY: registered in `new`, unregistered once here; device work using it
            // is the owner's to have finished (as with cuMemFreeHost).
            let done = unsafe { driver::mem_host_unregister(self.addr as *mut _) };
            crate::parked::park_err("unregistering host memory", done);
        }
    }
}
