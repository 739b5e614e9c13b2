//! Moving bytes: every copy memarray makes, in one wing.
//!
//! - This module's door: [`copy_to`] / [`copy_from`] (one bounds-checked, waited-for copy
//!   between any two kinds of memory, umem's `sync_to` / `sync_from`), [`enqueue`] (the
//!   same copy without the wait, for callers that order host access with events: the
//!   MemArray mirror moves array data through it), and the one [`upload`] / [`download`]
//!   pair (host bytes to and from a device buffer by the route `route` picks), with
//!   [`upload_with`] for bytes produced while they are copied (a file read).
//! - [`direct`]: the driver's own copies and memsets on a stream (host to device, device
//!   to host, device to device, peer), bounds-checked.
//! - [`staged`]: pageable host memory to and from devices at pinned speed (several host
//!   threads, pinned slots), with its settings.
//! - [`many`]: many small device-to-device copies in one call (an SM copy kernel for
//!   small ones, one driver batch for the rest): packs use it.
//! - `route`: which of the two a host copy takes (the driver's direct copy for pinned
//!   memory and small copies, the staged pipeline above its direct-copy size).
//! - `threads`: the host thread pool that staged copies, `.npy` reads, `move_many`'s
//!   packing and large host copies share; it owns its own limits, which staging's
//!   settings pass in.
//!
//! A [`Span`] is a byte range of host-reachable memory (a [`HostBuffer`] from a host,
//! pinned, managed or file resource) or of device memory (a [`DeviceBuffer`]); both ranges
//! of a copy are checked ([`CoreError::CopyOutOfRange`]).

pub mod direct;
pub mod many;
pub(crate) mod route;
pub mod staged;
pub(crate) mod threads;

use crate::nvtx;
use memarray_core::{CoreError, HostBuffer, MemoryKind};

use crate::buffer::DeviceBuffer;
use crate::error::Result;
use crate::event::Enqueued;
use crate::stream::StreamRef;
use route::Route;
use staged::Direction;

/// Copies the host bytes `src` into `dst` (equal lengths, checked), on several of the
/// pool's threads from [`threads::PARALLEL_HOST_COPY`] bytes up, at most staging's
/// host-to-device thread count of them.
pub(crate) fn host_to_host(dst: &mut [u8], src: &[u8]) -> Result<()> {
    let lanes = staged::config(Direction::ToDevice).map_or(1, |c| c.threads);
    threads::copy_host(dst, src, lanes)
}

/// A byte range to copy to or from.
#[derive(Clone, Copy, Debug)]
pub enum Span<'a> {
    /// Host-reachable memory at an offset.
    Host(&'a HostBuffer, usize),
    /// Device memory at an offset.
    Device(&'a DeviceBuffer, usize),
}

impl Span<'_> {
    fn check(&self, len: usize) -> Result<()> {
        let (offset, capacity) = match self {
            Span::Host(b, o) => (*o, b.len()),
            Span::Device(b, o) => (*o, b.len()),
        };
        if offset.checked_add(len).is_none_or(|end| end > capacity) {
            return Err(CoreError::CopyOutOfRange {
                offset,
                len,
                capacity,
            }
            .into());
        }
        Ok(())
    }
}

/// Copies `len` bytes from `src` to `dst` (any two kinds) on `stream` (device copies; the
/// legacy default stream for `None`) and waits for them. Overlapping host ranges of one
/// buffer are copied as `memmove` would.
pub fn copy_to(dst: Span<'_>, src: Span<'_>, len: usize, stream: Option<StreamRef>) -> Result<()> {
    let stream = stream.unwrap_or(StreamRef::legacy());
    // SAFETY: the copy is waited for before the borrows of both spans end.
    match unsafe { enqueue(dst, src, len, stream) }? {
        Some(op) => op.synchronize(),
        None => Ok(()),
    }
}

/// Checks both ranges and enqueues the copy of `len` bytes from `src` to `dst` on
/// `stream`, returning the operation to record or wait for (`None` for a host-to-host
/// copy, done at once, and for zero bytes).
///
/// # Safety
/// 1. Host memory in a span stays allocated, and is neither written (source) nor read or
///    written (destination) by the host, until the returned operation has completed.
pub unsafe fn enqueue(
    dst: Span<'_>,
    src: Span<'_>,
    len: usize,
    stream: StreamRef,
) -> Result<Option<Enqueued>> {
    dst.check(len)?;
    src.check(len)?;
    if len == 0 {
        return Ok(None);
    }
    Ok(match (dst, src) {
        (Span::Host(d, doff), Span::Host(s, soff)) => {
            // SAFETY: both ranges were checked against live buffers; copy handles overlap.
            unsafe { std::ptr::copy(s.as_ptr().add(soff), d.as_mut_ptr().add(doff), len) };
            None
        }
        (Span::Device(d, doff), Span::Host(s, soff))
            if route::host(
                d.device(),
                Direction::ToDevice,
                Some(s.kind()),
                s.as_ptr().wrapping_add(soff),
                len,
            )? == Route::Staged =>
        {
            // SAFETY: the range was checked against the live buffer; the staged copy has
            // read it when it returns.
            let src = unsafe { std::slice::from_raw_parts(s.as_ptr().add(soff), len) };
            staged::to_device(d, doff, src, stream)?
        }
        (Span::Device(d, doff), Span::Host(s, soff)) => {
            // SAFETY: the source range is checked and kept by the caller until the copy
            // has run (item 1).
            Some(unsafe { direct::copy_htod_raw(d, doff, s.as_ptr().add(soff), len, stream) }?)
        }
        (Span::Host(d, doff), Span::Device(s, soff))
            if route::host(
                s.device(),
                Direction::ToHost,
                Some(d.kind()),
                d.as_ptr().wrapping_add(doff),
                len,
            )? == Route::Staged =>
        {
            // SAFETY: the range was checked against the live buffer, which the caller
            // keeps from host access until the copy is done (item 1); the staged copy has
            // written it when it returns.
            let dst = unsafe { std::slice::from_raw_parts_mut(d.as_mut_ptr().add(doff), len) };
            staged::to_host(dst, s, soff, stream)?;
            Some(Enqueued::new(stream, s.device().clone()))
        }
        (Span::Host(d, doff), Span::Device(s, soff)) => {
            // SAFETY: as above, for the destination range.
            Some(unsafe { direct::copy_dtoh_raw(d.as_mut_ptr().add(doff), s, soff, len, stream) }?)
        }
        (Span::Device(d, doff), Span::Device(s, soff)) => {
            Some(direct::copy_peer(d, doff, s, soff, len, stream)?)
        }
    })
}

/// Copies the host bytes `src` to `dst[dst_offset..]`, after the work queued on `stream`,
/// by the route `route` picks: staged, or the driver's copy of pageable memory (both
/// return once `src` has been read, with the operation to record), or the driver's copy
/// of memory it knows (returns once the copy has completed, `None`). `kind` is the source
/// buffer's resource kind, where known.
pub fn upload(
    dst: &DeviceBuffer,
    dst_offset: usize,
    src: &[u8],
    kind: Option<MemoryKind>,
    stream: StreamRef,
) -> Result<Option<Enqueued>> {
    let _nvtx = nvtx::range(c"memarray.upload", Some(src.len() as u64));
    dst.range(dst_offset, src.len())?;
    match route::host(
        dst.device(),
        Direction::ToDevice,
        kind,
        src.as_ptr(),
        src.len(),
    )? {
        Route::Staged => staged::to_device(dst, dst_offset, src, stream),
        // What the route learned is not asked again.
        Route::Direct { known }
            if !src.is_empty()
                && !match known {
                    Some(k) => k,
                    None => route::driver_knows(dst.device(), src.as_ptr())?,
                } =>
        {
            // Pageable memory: the driver has copied every byte of `src` into its own
            // staging memory when the call returns (CUDA's memcpy synchronisation rules),
            // so the DMA may run on while the caller reuses `src`; the caller orders
            // later work after the returned copy. (A known pointer is read in place.)
            // SAFETY: `src` is read before the call returns (above), while borrowed.
            let op =
                unsafe { direct::copy_htod_raw(dst, dst_offset, src.as_ptr(), src.len(), stream) }?;
            Ok(Some(op))
        }
        Route::Direct { .. } => {
            // copy_htod waits for the stream: the copy is complete.
            let _complete = direct::copy_htod(dst, dst_offset, src, stream)?;
            Ok(None)
        }
    }
}

/// As [`upload`], for `len` bytes that `fill(offset, buf)` produces (a file read): staged,
/// each lane filling its pinned slot directly; below the direct threshold, through one
/// buffer and the driver's copy.
pub fn upload_with(
    dst: &DeviceBuffer,
    dst_offset: usize,
    len: usize,
    fill: &(dyn Fn(usize, &mut [u8]) -> Result<()> + Sync),
    stream: StreamRef,
) -> Result<Option<Enqueued>> {
    let _nvtx = nvtx::range(c"memarray.upload", Some(len as u64));
    dst.range(dst_offset, len)?;
    // The bytes do not exist yet: only the size decides.
    match route::by_size(Direction::ToDevice, len)? {
        Route::Staged => staged::to_device_with(dst, dst_offset, len, fill, stream),
        Route::Direct { .. } => {
            let mut buf = vec![0u8; len];
            fill(0, &mut buf)?;
            let _complete = direct::copy_htod(dst, dst_offset, &buf, stream)?;
            Ok(None)
        }
    }
}

/// Copies `src[src_offset..]` into the host bytes `dst`, after the work queued on
/// `stream`, by the route `route` picks; returns once the bytes are in `dst`.
pub fn download(
    dst: &mut [u8],
    src: &DeviceBuffer,
    src_offset: usize,
    kind: Option<MemoryKind>,
    stream: StreamRef,
) -> Result<()> {
    let _nvtx = nvtx::range(c"memarray.download", Some(dst.len() as u64));
    src.range(src_offset, dst.len())?;
    match route::host(
        src.device(),
        Direction::ToHost,
        kind,
        dst.as_ptr(),
        dst.len(),
    )? {
        Route::Staged => staged::to_host(dst, src, src_offset, stream),
        Route::Direct { .. } => direct::copy_dtoh(dst, src, src_offset, stream),
    }
}

/// [`copy_to`] with the arguments the other way round: fills `dst` from `src`.
pub fn copy_from(
    src: Span<'_>,
    dst: Span<'_>,
    len: usize,
    stream: Option<StreamRef>,
) -> Result<()> {
    copy_to(dst, src, len, stream)
}

#[cfg(test)]
mod tests {
    use std::sync::Arc;

    use memarray_core::{FileResource, HostResource};

    use super::*;

    #[test]
    fn host_and_file_memory_copy_both_ways_and_ranges_are_checked() {
        let path = std::env::temp_dir().join(format!("memarray-sync-{}", std::process::id()));
        let file = Arc::new(FileResource::create(&path).unwrap());
        let src = HostBuffer::from_bytes(&[1, 2, 3, 4, 5, 6], Arc::new(HostResource)).unwrap();
        let dst = HostBuffer::zeroed_in(8, file).unwrap();
        copy_to(Span::Host(&dst, 2), Span::Host(&src, 1), 4, None).unwrap();
        assert_eq!(dst.as_slice(), &[0, 0, 2, 3, 4, 5, 0, 0]);
        let back = HostBuffer::zeroed(4).unwrap();
        copy_from(Span::Host(&dst, 3), Span::Host(&back, 0), 4, None).unwrap();
        assert_eq!(back.as_slice(), &[3, 4, 5, 0]);
        assert!(copy_to(Span::Host(&dst, 6), Span::Host(&src, 0), 4, None).is_err());
        assert!(copy_to(Span::Host(&dst, 0), Span::Host(&src, usize::MAX), 1, None).is_err());
        copy_to(Span::Host(&dst, 8), Span::Host(&src, 6), 0, None).unwrap();
        drop(dst);
        std::fs::remove_file(&path).ok();
    }
}
