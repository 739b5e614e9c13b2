//! The one place that decides how bytes move between host memory and a device:
//! straight to the driver ([`crate::copy::direct`]) or through the staged pipeline
//! ([`crate::copy::staged`]). The copy door (`copy/mod.rs`: `upload`, `download`,
//! `copy_to` / `copy_from` between any two kinds of memory, the mirror's moves included)
//! and `array::batch` (many small arrays at once) ask here; the staged pipeline itself
//! always stages and never falls back.

use memarray_core::MemoryKind;

use crate::copy::staged::{self, Direction};
use crate::device::Device;
use crate::driver;
use crate::error::Result;

/// How a host-device copy runs, with what the decision learned about the memory.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) enum Route {
    /// One driver copy. `known`: whether the driver knows the host memory (pinned,
    /// registered or managed: DMA reads it in place; pageable memory is staged by the
    /// driver itself), where the decision asked or the resource kind said; `None` where
    /// the size alone decided (callers that need it ask once, [`driver_knows`]).
    Direct {
        /// What the decision learned, if it asked.
        known: Option<bool>,
    },
    /// The staged pipeline: host threads copy through pinned slots.
    Staged,
}

impl Route {
    /// Whether this is a driver copy.
    pub(crate) fn is_direct(self) -> bool {
        matches!(self, Route::Direct { .. })
    }
}

/// Whether DMA reads and writes host memory of this resource kind in place (pinned and
/// managed memory), so no staging can help.
pub(crate) fn kind_is_direct(kind: MemoryKind) -> bool {
    !matches!(kind, MemoryKind::Host | MemoryKind::File)
}

/// The route of `len` bytes of host memory at `ptr` going `dir` to or from `device`;
/// `kind` is the host buffer's resource kind where memarray allocated it. Direct for
/// pinned or managed kinds, for copies below the direction's `direct_below` (the driver's
/// own path is faster there), and for memory the driver already knows (registered or
/// pinned by another library); staged otherwise.
pub(crate) fn host(
    device: &Device,
    dir: Direction,
    kind: Option<MemoryKind>,
    ptr: *const u8,
    len: usize,
) -> Result<Route> {
    if kind.is_some_and(kind_is_direct) {
        return Ok(Route::Direct { known: Some(true) });
    }
    if by_size(dir, len)?.is_direct() {
        return Ok(Route::Direct { known: None });
    }
    Ok(if driver_knows(device, ptr)? {
        Route::Direct { known: Some(true) }
    } else {
        Route::Staged
    })
}

/// Whether the driver knows the host memory at `ptr` (pinned, registered or managed, by
/// memarray or another library): DMA then reads it in place, after the call returns.
/// Memory it does not know is pageable: the driver stages it before a host-to-device
/// copy returns.
pub(crate) fn driver_knows(device: &Device, ptr: *const u8) -> Result<bool> {
    let _ctx = device.bind()?;
    Ok(driver::host_pointer_is_known(ptr))
}

/// The route by size alone: for bytes that do not exist yet (a file read into the
/// pipeline), where no buffer can be asked about.
pub(crate) fn by_size(dir: Direction, len: usize) -> Result<Route> {
    Ok(if len < staged::config(dir)?.direct_below {
        Route::Direct { known: None }
    } else {
        Route::Staged
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn pinned_and_managed_go_direct_pageable_and_files_do_not() {
        for kind in [MemoryKind::Pinned, MemoryKind::Managed, MemoryKind::Device] {
            assert!(kind_is_direct(kind), "{kind:?}");
        }
        for kind in [MemoryKind::Host, MemoryKind::File] {
            assert!(!kind_is_direct(kind), "{kind:?}");
        }
    }
}
