//! Bounds-checked asynchronous copies and memsets on a stream.
//!
//! Every function checks its byte ranges ([`memarray_core::CoreError::CopyOutOfRange`]),
//! binds the device the operation runs on (a default [`StreamRef`] means that device's
//! default stream) and enqueues the work. All but [`copy_dtoh`] return an [`Enqueued`]
//! to record into an event; zero-byte operations enqueue nothing but still return one.
//!
//! Host memory: the safe functions take slices and block until the host side is done
//! ([`copy_htod`] until the source has been read, [`copy_dtoh`] until the bytes have
//! arrived), since a page-locked buffer is read or written by DMA after the driver call. The `_raw` forms take pointers and return at
//! once, for callers (such as the MemArray mirror) that order host access with events.

use crate::buffer::DeviceBuffer;
use crate::driver;
use crate::error::{CudaError, Result};
use crate::event::Enqueued;
use crate::stream::StreamRef;

/// Copies `src` to `dst[dst_offset..]` on `stream`, and waits for it: when this returns
/// `src` has been read, so it may be written or freed at once. (A page-locked source is
/// read by DMA after the driver call returns; only the `_raw` form leaves that open.)
pub fn copy_htod(
    dst: &DeviceBuffer,
    dst_offset: usize,
    src: &[u8],
    stream: StreamRef,
) -> Result<Enqueued> {
    // SAFETY: `src` is valid for reads of its length while borrowed, and the copy is
    // complete before the borrow ends (synchronized below), so item 1 holds.
    let op = unsafe { copy_htod_raw(dst, dst_offset, src.as_ptr(), src.len(), stream) }?;
    stream.synchronize(op.device())?;
    Ok(op)
}

/// Copies `len` bytes at `src` to `dst[dst_offset..]` on `stream`.
///
/// # Safety
/// 1. `src` is valid for reads of `len` bytes until the copy has run (pageable memory
///    only until this call returns), and not written meanwhile.
pub unsafe fn copy_htod_raw(
    dst: &DeviceBuffer,
    dst_offset: usize,
    src: *const u8,
    len: usize,
    stream: StreamRef,
) -> Result<Enqueued> {
    let d = dst.range(dst_offset, len)?;
    let device = dst.device();
    let _ctx = device.bind()?;
    if len > 0 {
        // SAFETY: item 1 covers the source; the destination range was checked against a
        // live buffer (item 2); the stream is live by StreamRef's contract and the
        // buffer's device is bound (item 3).
        unsafe { driver::memcpy_htod_async(d, src, len, stream.cu()) }?;
    }
    Ok(Enqueued::new(stream, device.clone()))
}

/// Copies `src[src_offset..src_offset + dst.len()]` into `dst` on `stream`, and waits for
/// it: when this returns the bytes are in `dst`.
pub fn copy_dtoh(
    dst: &mut [u8],
    src: &DeviceBuffer,
    src_offset: usize,
    stream: StreamRef,
) -> Result<()> {
    // SAFETY: `dst` is exclusively borrowed for the whole call, and the call waits for the
    // copy before returning, so nothing else touches the bytes while the device writes
    // them (item 1).
    let done = unsafe { copy_dtoh_raw(dst.as_mut_ptr(), src, src_offset, dst.len(), stream) }?;
    done.synchronize()
}

/// Copies `len` bytes of `src[src_offset..]` to `dst` on `stream`, returning at once.
///
/// # Safety
/// 1. `dst` is valid for writes of `len` bytes until the copy has run, and nothing reads
///    or writes them meanwhile (wait on the recorded event first).
pub unsafe fn copy_dtoh_raw(
    dst: *mut u8,
    src: &DeviceBuffer,
    src_offset: usize,
    len: usize,
    stream: StreamRef,
) -> Result<Enqueued> {
    let s = src.range(src_offset, len)?;
    let device = src.device();
    let _ctx = device.bind()?;
    if len > 0 {
        // SAFETY: item 1 covers the destination; the source range was checked against a
        // live buffer (item 2); live stream, device bound (item 3).
        unsafe { driver::memcpy_dtoh_async(dst, s, len, stream.cu()) }?;
    }
    Ok(Enqueued::new(stream, device.clone()))
}

/// Copies `len` bytes from `src[src_offset..]` to `dst[dst_offset..]` on one device.
/// Buffers on different devices are refused with [`CudaError::WrongDevice`]: use
/// [`copy_peer`].
pub fn copy_dtod(
    dst: &DeviceBuffer,
    dst_offset: usize,
    src: &DeviceBuffer,
    src_offset: usize,
    len: usize,
    stream: StreamRef,
) -> Result<Enqueued> {
    let device = dst.device();
    if src.device().id() != device.id() {
        return Err(CudaError::WrongDevice {
            what: "copy_dtod",
            expected: device.id(),
            got: src.device().id(),
        });
    }
    let (d, s) = (dst.range(dst_offset, len)?, src.range(src_offset, len)?);
    let _ctx = device.bind()?;
    if len > 0 {
        // SAFETY: both ranges were checked against live buffers of the bound device
        // (item 1); live stream of that device or its default stream (item 2).
        unsafe { driver::memcpy_dtod_async(d, s, len, stream.cu()) }?;
    }
    Ok(Enqueued::new(stream, device.clone()))
}

/// Copies `len` bytes from `src[src_offset..]` to `dst[dst_offset..]` between devices
/// (`cuMemcpyPeerAsync`: direct over NVLink/PCIe with peer access enabled, staged
/// through the host otherwise). `stream` belongs to `dst`'s device (a default stream is
/// `dst`'s). Buffers on one device are copied as [`copy_dtod`] does.
pub fn copy_peer(
    dst: &DeviceBuffer,
    dst_offset: usize,
    src: &DeviceBuffer,
    src_offset: usize,
    len: usize,
    stream: StreamRef,
) -> Result<Enqueued> {
    if src.device().id() == dst.device().id() {
        return copy_dtod(dst, dst_offset, src, src_offset, len, stream);
    }
    let (d, s) = (dst.range(dst_offset, len)?, src.range(src_offset, len)?);
    let device = dst.device();
    let _ctx = device.bind()?;
    if len == 0 {
        return Ok(Enqueued::new(stream, device.clone()));
    }
    if stream.capture(device)? == crate::graph::Capture::None {
        // SAFETY: both ranges were checked against live buffers of the two devices, whose
        // primary contexts are retained for the process (item 1); the stream is live and
        // of the bound destination device (item 2).
        unsafe {
            driver::memcpy_peer_async(d, device.ctx(), s, src.device().ctx(), len, stream.cu())
        }?;
    } else if device.can_access_peer(src.device())? {
        // A capture takes no cuMemcpyPeerAsync; with peer access a device copy between
        // the two (unified) addresses is the same copy, and is captured.
        device.link_peer(src.device())?;
        // SAFETY: as above; the destination device reaches the source's memory directly
        // (peer access enabled just above).
        unsafe { driver::memcpy_dtod_async(d, s, len, stream.cu()) }?;
    } else {
        // Without peer access the copy stages through the host: no graph can replay it.
        stream.refuse_under_capture(device, "a copy between devices without peer access")?;
    }
    Ok(Enqueued::new(stream, device.clone()))
}

/// Sets `len` bytes of `dst[offset..]` to zero on `stream`.
pub fn memset_zero(
    dst: &DeviceBuffer,
    offset: usize,
    len: usize,
    stream: StreamRef,
) -> Result<Enqueued> {
    memset(dst, offset, len, 0, stream)
}

/// Sets `len` bytes of `dst[offset..]` to `value` on `stream`.
pub fn memset(
    dst: &DeviceBuffer,
    offset: usize,
    len: usize,
    value: u8,
    stream: StreamRef,
) -> Result<Enqueued> {
    let d = dst.range(offset, len)?;
    let device = dst.device();
    let _ctx = device.bind()?;
    if len > 0 {
        // SAFETY: the range was checked against a live buffer (item 1); live stream of the
        // bound device or its default stream (item 2).
        unsafe { driver::memset_d8_async(d, value, len, stream.cu()) }?;
    }
    Ok(Enqueued::new(stream, device.clone()))
}
