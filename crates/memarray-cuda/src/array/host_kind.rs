//! Which host memory backs an array, and the measured default.

use std::sync::Arc;

use memarray_core::{HostBuffer, HostResource, MemoryResource};

use crate::device::Device;
use crate::error::Result;
use crate::resource::ManagedResource;

/// Arrays of at least this many bytes get pinned host memory by default when a CUDA
/// device is present ([`HostKind::auto`]).
pub const AUTO_PIN_BYTES: usize = 64 << 10;

/// Which host memory backs an array, chosen at construction.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash, Default)]
pub enum HostKind {
    /// Ordinary pageable memory: needs no driver and costs nothing to allocate (calloc'd
    /// pages), but copies run at a fraction of the bus speed and H2D blocks the host.
    #[default]
    Pageable,
    /// Page-locked memory (portable, not write-combined): full-speed async copies.
    Pinned,
    /// CUDA managed memory.
    Managed,
}

impl HostKind {
    /// The default kind for an array of `nbytes`: pinned from [`AUTO_PIN_BYTES`] up when a
    /// CUDA device is present, pageable otherwise.
    ///
    /// Pinned host buffers come from the device's pinned caching pool, so after the first
    /// allocation of a size class pinning costs about 1 us (benches/alloc.py), and every
    /// move then runs at the bus rate: a 1 MiB round trip at 9.5 GB/s pageable against
    /// 35 GB/s pinned on an H100 (docs/benchmarks.md, "Pageable transfers"). Below
    /// 64 KiB the copy is latency-bound either way and pageable memory costs no pinned
    /// pool space.
    pub fn auto(nbytes: usize) -> HostKind {
        if nbytes >= AUTO_PIN_BYTES && crate::is_available() {
            HostKind::Pinned
        } else {
            HostKind::Pageable
        }
    }
}

/// A host buffer of `nbytes` of `kind` and the kind it got. `zero` fills it with zeros;
/// without, pinned memory is left as the pinned pool hands it out. With `fallback` (the
/// automatic choice) pageable memory serves when pinned or managed memory cannot be had
/// (limits, no driver); an explicit kind fails instead.
pub(super) fn host_buffer(
    kind: HostKind,
    device_id: u32,
    nbytes: usize,
    zero: bool,
    fallback: bool,
) -> Result<(HostBuffer, HostKind)> {
    let made = host_resource(kind, device_id).and_then(|r| -> Result<HostBuffer> {
        if !zero && kind == HostKind::Pinned {
            // SAFETY: pinned memory comes from the pinned pool: a block it hands out
            // again holds its last user's bytes, a fresh one the zeroed pages
            // cuMemHostAlloc maps; either way every byte has a value, as np.empty's and
            // torch.empty's do.
            Ok(unsafe { HostBuffer::uninit_in(nbytes, r)? })
        } else {
            Ok(HostBuffer::zeroed_in(nbytes, r)?)
        }
    });
    match made {
        Ok(h) => Ok((h, kind)),
        Err(_) if fallback && kind != HostKind::Pageable => {
            if kind == HostKind::Pinned {
                crate::resource::count_fallback(nbytes);
            }
            Ok((
                HostBuffer::zeroed_in(nbytes, Arc::new(HostResource))?,
                HostKind::Pageable,
            ))
        }
        Err(e) => Err(e),
    }
}

/// The resource for a host copy of `kind` (pinned and managed memory belong to
/// `device_id`'s context).
pub(super) fn host_resource(kind: HostKind, device_id: u32) -> Result<Arc<dyn MemoryResource>> {
    Ok(match kind {
        HostKind::Pageable => Arc::new(HostResource),
        HostKind::Pinned => crate::resource::pinned_pool(&Device::get(device_id)?),
        HostKind::Managed => Arc::new(ManagedResource::new(&Device::get(device_id)?)),
    })
}
