//! Moving bytes: every copy memarray makes, in one wing with one door: this module.
//! Nothing outside the wing names a room behind it or the driver's copy calls (the
//! layering check enforces it); the rooms are private and the door re-exports what
//! users, bindings and benches name.
//!
//! - The door's own calls: [`copy_to`] / [`copy_from`] (one bounds-checked, waited-for
//!   copy between any two kinds of memory, umem's `sync_to` / `sync_from`), [`enqueue`]
//!   (the same copy without the wait, for callers that order host access with events: the
//!   MemArray mirror moves array data through it), and the one [`upload`] / [`download`]
//!   pair (host bytes to and from a device buffer by the route `route` picks), with
//!   [`upload_with`] for bytes produced while they are copied (a file read). The host
//!   route is decided in one place, `route::host`.
//! - `direct`: the driver's own copies and memsets on a stream (host to device, device
//!   to host, device to device, peer), bounds-checked: [`copy_htod`], [`copy_dtoh`],
//!   [`copy_dtod`], [`copy_peer`], [`memset`], [`memset_zero`] and the `_raw` forms.
//! - `staged`: pageable host memory to and from devices at pinned speed (several host
//!   threads, pinned slots), with its settings ([`StagingConfig`], [`staging_config`],
//!   [`set_staging_config`]); [`staged_to_device`] / [`staged_to_host`] always stage.
//! - `many`: many small device-to-device copies in one call (an SM copy kernel for small
//!   ones, one driver batch for the rest): device packs use it; its settings and
//!   per-device [`tuning`].
//! - `batch`: many small host-device copies as one (one staging pass, one driver batch,
//!   one wait): `RawArray::move_many`'s bytes; [`last_batch_profile`].
//! - `pack`: the one layout of many arrays in one allocation ([`pack_layout`]), for device
//!   packs, host packs and the batch's staging buffer.
//! - `route`: which way a host copy goes (the driver's direct copy for pinned memory and
//!   small copies, the staged pipeline above its direct-copy size).
//! - `threads`: the host thread pool that staged copies, `.npy` reads, the batch's packing
//!   and large host copies share; it owns its own limits, which staging's settings pass in.
//!
//! A [`Span`] is a byte range of host-reachable memory (a [`HostBuffer`] from a host,
//! pinned, managed or file resource) or of device memory (a [`DeviceBuffer`]); both ranges
//! of a copy are checked ([`CoreError::CopyOutOfRange`]).

mod batch;
mod direct;
mod many;
mod pack;
mod route;
mod staged;
mod threads;

pub use batch::{BatchProfile, last_batch_profile};
pub(crate) use batch::{download_many, host_pieces, upload_many};
pub use direct::{
    copy_dtod, copy_dtoh, copy_dtoh_raw, copy_htod, copy_htod_raw, copy_peer, memset, memset_zero,
};
pub(crate) use many::copy_many;
pub use many::{
    KERNEL_ENV, KERNEL_MAX, KERNEL_MAX_CEILING, KERNEL_MAX_ENV, LimitSource, TABLE_MAX, Tuning,
    copies_made, kernel_max_from_env, kernel_setting_from_env, tuning,
};
pub use pack::{PACK_ALIGN, pack_layout};
pub use staged::{
    Direction, MAX_SHORT, MAX_THREADS, MIN_CHUNK, StagingConfig, config as staging_config,
    set_config as set_staging_config, to_device as staged_to_device,
    to_device_with as staged_to_device_with, to_host as staged_to_host,
};
pub(crate) use threads::parallel;
pub use threads::{MAX_LANES, PARALLEL_HOST_COPY, copy_host};

use crate::nvtx;
use memarray_core::{CoreError, HostBuffer, MemoryKind};

use crate::buffer::DeviceBuffer;
use crate::device::Device;
use crate::error::Result;
use crate::event::Enqueued;
use crate::graph::Capture;
use crate::stream::StreamRef;
use route::Route;

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
        (Span::Device(d, doff), Span::Host(s, soff)) => {
            // SAFETY: the range was checked against the live buffer, which the caller
            // keeps, unwritten, until the returned operation has completed (item 1).
            let src = unsafe { std::slice::from_raw_parts(s.as_ptr().add(soff), len) };
            // SAFETY: as above: kept until the operation completes.
            unsafe { up(d, doff, src, Some(s.kind()), stream, Keep::UntilDone) }?
        }
        (Span::Host(d, doff), Span::Device(s, soff)) => {
            // SAFETY: the range was checked against the live buffer, which the caller
            // keeps from host access until the returned operation has completed (item 1).
            let dst = unsafe { std::slice::from_raw_parts_mut(d.as_mut_ptr().add(doff), len) };
            // SAFETY: as above.
            unsafe { down(dst, s, soff, Some(d.kind()), stream, Keep::UntilDone) }?
        }
        (Span::Device(d, doff), Span::Device(s, soff)) => {
            Some(direct::copy_peer(d, doff, s, soff, len, stream)?)
        }
    })
}

/// How long the caller keeps the host side of a copy untouched.
#[derive(Clone, Copy, PartialEq, Eq)]
enum Keep {
    /// Until the copy's operation has completed ([`enqueue`]): every route may run on
    /// after the call.
    UntilDone,
    /// Until the call returns ([`upload`], [`download`]): a copy that reads or writes the
    /// host memory in place completes before it.
    UntilReturn,
}

/// The route of a host copy of `len` bytes at `host` in `dir` ([`route::host`]), after
/// `stream`'s work. Under a capture of `stream`, only a copy a graph can replay goes ahead:
/// the DMA of host memory the driver knows (pinned, registered, managed) that the caller
/// keeps until the copy completes. Staging by host threads, pageable memory (which the
/// driver stages during the call) and a copy the call waits for cannot be, and are refused
/// with [`crate::CudaError::Captured`] before anything is enqueued, the capture left
/// valid. Outside a capture the check is one driver query (none on the legacy stream).
fn host_route(
    device: &Device,
    dir: Direction,
    kind: Option<MemoryKind>,
    host: *const u8,
    len: usize,
    stream: StreamRef,
    keep: Keep,
) -> Result<Route> {
    let route = route::host(device, dir, kind, host, len)?;
    if stream.capture(device)? == Capture::None
        || replayable(&route, keep, || route::driver_knows(device, host))?
    {
        return Ok(route);
    }
    let what = match dir {
        Direction::ToDevice => "a copy from host memory a graph cannot replay (pageable or staged)",
        Direction::ToHost => {
            "a copy to host memory a graph cannot replay (pageable, staged or waited for)"
        }
    };
    stream.refuse_under_capture(device, what)?;
    Ok(route)
}

/// Whether a host copy by `route`, whose host side the caller keeps as `keep` says, can be
/// replayed by a graph: a DMA of memory the driver knows (asking `knows` only where the
/// route did not learn it), kept until the copy completes.
fn replayable(route: &Route, keep: Keep, knows: impl FnOnce() -> Result<bool>) -> Result<bool> {
    Ok(keep == Keep::UntilDone
        && match *route {
            Route::Direct { known: Some(k) } => k,
            Route::Direct { known: None } => knows()?,
            Route::Staged => false,
        })
}

/// Host bytes `src` to `dst[dst_offset..]` after the work queued on `stream`, by the
/// route [`route::host`] picks.
///
/// # Safety
/// 1. With [`Keep::UntilDone`], `src` stays allocated and unwritten until the returned
///    operation has completed.
unsafe fn up(
    dst: &DeviceBuffer,
    dst_offset: usize,
    src: &[u8],
    kind: Option<MemoryKind>,
    stream: StreamRef,
    keep: Keep,
) -> Result<Option<Enqueued>> {
    dst.range(dst_offset, src.len())?;
    let dir = Direction::ToDevice;
    match host_route(
        dst.device(),
        dir,
        kind,
        src.as_ptr(),
        src.len(),
        stream,
        keep,
    )? {
        // Returns once `src` has been read.
        Route::Staged => staged::to_device(dst, dst_offset, src, stream),
        // Pageable memory: the driver has copied every byte of `src` into its own staging
        // memory when the call returns (CUDA's memcpy synchronisation rules), so the DMA
        // may run on while the caller reuses `src`; the caller orders later work after
        // the returned copy. Memory the driver knows is read in place: the copy may run
        // on only while the caller keeps `src` (item 1).
        Route::Direct { known }
            if keep == Keep::UntilDone
                || (!src.is_empty()
                    && !match known {
                        Some(k) => k,
                        None => route::driver_knows(dst.device(), src.as_ptr())?,
                    }) =>
        {
            // SAFETY: `src` is read before the call returns, or kept until the copy is
            // done (item 1), as the arm's condition says.
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

/// `src[src_offset..]` into the host bytes `dst` after the work queued on `stream`, by
/// the route `route::host` picks. With [`Keep::UntilReturn`] the bytes are in `dst` when
/// it returns (`None`).
///
/// # Safety
/// 1. With [`Keep::UntilDone`], `dst` stays allocated and untouched by the host until
///    the returned operation has completed.
unsafe fn down(
    dst: &mut [u8],
    src: &DeviceBuffer,
    src_offset: usize,
    kind: Option<MemoryKind>,
    stream: StreamRef,
    keep: Keep,
) -> Result<Option<Enqueued>> {
    src.range(src_offset, dst.len())?;
    let dir = Direction::ToHost;
    match host_route(
        src.device(),
        dir,
        kind,
        dst.as_ptr(),
        dst.len(),
        stream,
        keep,
    )? {
        Route::Staged => {
            // Returns once the bytes are in `dst`.
            staged::to_host(dst, src, src_offset, stream)?;
            Ok((keep == Keep::UntilDone).then(|| Enqueued::new(stream, src.device().clone())))
        }
        Route::Direct { .. } if keep == Keep::UntilDone => {
            // SAFETY: `dst` is kept from host access until the copy is done (item 1).
            let op = unsafe {
                direct::copy_dtoh_raw(dst.as_mut_ptr(), src, src_offset, dst.len(), stream)
            }?;
            Ok(Some(op))
        }
        Route::Direct { .. } => {
            direct::copy_dtoh(dst, src, src_offset, stream)?;
            Ok(None)
        }
    }
}

/// Copies the host bytes `src` to `dst[dst_offset..]`, after the work queued on `stream`,
/// by the route `route::host` picks: staged, or the driver's copy of pageable memory
/// (both return once `src` has been read, with the operation to record), or the driver's
/// copy of memory it knows (returns once the copy has completed, `None`). `kind` is the
/// source buffer's resource kind, where known.
pub fn upload(
    dst: &DeviceBuffer,
    dst_offset: usize,
    src: &[u8],
    kind: Option<MemoryKind>,
    stream: StreamRef,
) -> Result<Option<Enqueued>> {
    let _nvtx = nvtx::range(c"memarray.upload", Some(src.len() as u64));
    // SAFETY: Keep::UntilReturn: `src` is not used after the call returns.
    unsafe { up(dst, dst_offset, src, kind, stream, Keep::UntilReturn) }
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

/// As [`upload_with`], into several device ranges `(buffer, offset, bytes)` of one device
/// that take `fill`'s bytes in turn (many arrays from one file): staged in one pipeline
/// when the total is large enough, else through one buffer and a driver copy per range.
///
/// # Errors
/// `InvalidArgument` for ranges on different devices, `BufferTooSmall` for one past its
/// buffer (nothing copied); `fill`'s or a copy's error.
pub fn upload_spans_with(
    dsts: &[(&DeviceBuffer, usize, usize)],
    fill: &(dyn Fn(usize, &mut [u8]) -> Result<()> + Sync),
    stream: StreamRef,
) -> Result<Option<Enqueued>> {
    let Some(first) = dsts.first() else {
        return Ok(None);
    };
    let device = first.0.device();
    let mut spans = Vec::with_capacity(dsts.len());
    for (i, &(dst, offset, len)) in dsts.iter().enumerate() {
        if dst.device().id() != device.id() {
            return Err(crate::CudaError::InvalidArgument {
                what: "upload_spans_with",
                detail: format!(
                    "range {i} is on cuda:{}, the first on cuda:{}: one device per call",
                    dst.device().id(),
                    device.id()
                ),
            });
        }
        spans.push((dst.range(offset, len)?, len));
    }
    let total: usize = spans.iter().map(|s| s.1).sum();
    let _nvtx = nvtx::range(c"memarray.upload", Some(total as u64));
    match route::by_size(Direction::ToDevice, total)? {
        Route::Staged => staged::to_device_spans_with(device, &spans, fill, stream),
        Route::Direct { .. } => {
            let mut buf = vec![0u8; total];
            fill(0, &mut buf)?;
            let mut at = 0;
            for &(dst, offset, len) in dsts {
                let _complete = direct::copy_htod(dst, offset, &buf[at..at + len], stream)?;
                at += len;
            }
            Ok(None)
        }
    }
}

/// For parts `(base, bytes)` that take a copy's bytes in turn (laid end to end), calls
/// `f(base + offset in the part, offset in [off, off + n), bytes)` for each non-empty piece
/// of the copy's bytes `[off, off + n)`, in order: the device ranges of one staged upload
/// for many arrays, the file ranges of many tensors read as one.
pub(crate) fn each_laid(
    parts: &[(u64, usize)],
    off: usize,
    n: usize,
    mut f: impl FnMut(u64, usize, usize) -> Result<()>,
) -> Result<()> {
    let (end, mut start) = (off + n, 0usize);
    for &(base, len) in parts {
        let stop = start + len;
        if len > 0 && stop > off && start < end {
            let from = off.max(start);
            f(
                base + (from - start) as u64,
                from - off,
                stop.min(end) - from,
            )?;
        }
        if stop >= end {
            break;
        }
        start = stop;
    }
    Ok(())
}

/// Copies `src[src_offset..]` into the host bytes `dst`, after the work queued on
/// `stream`, by the route `route::host` picks; returns once the bytes are in `dst`.
pub fn download(
    dst: &mut [u8],
    src: &DeviceBuffer,
    src_offset: usize,
    kind: Option<MemoryKind>,
    stream: StreamRef,
) -> Result<()> {
    let _nvtx = nvtx::range(c"memarray.download", Some(dst.len() as u64));
    // SAFETY: Keep::UntilReturn: `dst` holds the bytes when the call returns.
    unsafe { down(dst, src, src_offset, kind, stream, Keep::UntilReturn) }.map(drop)
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
    use crate::CudaError;

    #[test]
    fn only_a_kept_dma_of_memory_the_driver_knows_is_replayable_under_a_capture() {
        let never = || -> Result<bool> { panic!("the route already knew") };
        let known = Route::Direct { known: Some(true) };
        let pageable = Route::Direct { known: Some(false) };
        assert!(replayable(&known, Keep::UntilDone, never).unwrap());
        // A copy the call waits for, pageable memory, staging: not replayable.
        assert!(!replayable(&known, Keep::UntilReturn, never).unwrap());
        assert!(!replayable(&pageable, Keep::UntilDone, never).unwrap());
        assert!(!replayable(&Route::Staged, Keep::UntilDone, never).unwrap());
        // Where the size alone decided the route, the driver is asked (once), and its
        // error is the caller's.
        let unknown = Route::Direct { known: None };
        assert!(replayable(&unknown, Keep::UntilDone, || Ok(true)).unwrap());
        assert!(!replayable(&unknown, Keep::UntilDone, || Ok(false)).unwrap());
        let failed = replayable(&unknown, Keep::UntilDone, || {
            Err(CudaError::InvalidArgument {
                what: "test",
                detail: "the driver could not say".into(),
            })
        });
        assert!(failed.is_err());
        assert!(!replayable(&unknown, Keep::UntilReturn, || panic!("not asked")).unwrap());
    }

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
