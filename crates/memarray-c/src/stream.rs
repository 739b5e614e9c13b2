//! CUDA streams: memarray's own (recycled, never destroyed while handles may be out) or
//! a caller's `CUstream` / `cudaStream_t` wrapped.

use std::ffi::c_void;
use std::sync::Arc;

use memarray_cuda::{Device, Stream, StreamRef};

use crate::error::{check_out, guard, memarray_status, write_out};
use crate::handle::Handle;

/// A CUDA stream (opaque), of one device.
pub struct memarray_stream {
    pub(crate) stream: StreamRef,
    pub(crate) device: Arc<Device>,
    /// Keeps memarray's own stream; None for a wrapped one.
    _owned: Option<Stream>,
}

impl Handle for memarray_stream {}

/// The stream behind a nullable handle (NULL: None, the call's default).
///
/// # Safety
/// A non-null `s` is a live handle.
pub(crate) unsafe fn stream_arg(s: *const memarray_stream) -> Option<StreamRef> {
    // SAFETY: the caller's contract.
    unsafe { s.as_ref() }.map(|s| s.stream)
}

/// Makes a non-blocking stream on `device`. On success `*out` is a new stream: release
/// it with [`memarray_stream_free`].
///
/// # Safety
/// `out` is writable.
#[unsafe(no_mangle)]
pub unsafe extern "C" fn memarray_stream_create(
    device: i32,
    out: *mut *mut memarray_stream,
) -> memarray_status {
    guard(|| {
        check_out(out, "out")?;
        let d = crate::device::device(device)?;
        let s = Stream::new(&d)?;
        let h = memarray_stream {
            stream: s.as_ref(),
            device: d,
            _owned: Some(s),
        };
        // SAFETY: checked above.
        unsafe { write_out(out, "out", h.into_raw()) }
    })
}

/// Wraps the caller's live `CUstream` (or `cudaStream_t`) `handle` of `device`, so
/// memarray calls can order work on it; the caller keeps it alive while the wrapper is
/// used. `handle` NULL is the legacy default stream. Release with
/// [`memarray_stream_free`] (which does not destroy the caller's stream).
///
/// # Safety
/// `handle` is NULL or a live stream of `device`'s primary context; `out` is writable.
#[unsafe(no_mangle)]
pub unsafe extern "C" fn memarray_stream_wrap(
    device: i32,
    handle: *mut c_void,
    out: *mut *mut memarray_stream,
) -> memarray_status {
    guard(|| {
        check_out(out, "out")?;
        let d = crate::device::device(device)?;
        let stream = if handle.is_null() {
            StreamRef::legacy()
        } else {
            // SAFETY: the caller's contract: a live stream.
            unsafe { StreamRef::from_raw(handle as usize) }?
        };
        let h = memarray_stream {
            stream,
            device: d,
            _owned: None,
        };
        // SAFETY: checked above.
        unsafe { write_out(out, "out", h.into_raw()) }
    })
}

/// Releases a stream handle (NULL: nothing). memarray's own streams are recycled once
/// their work is done; a wrapped stream is left to its owner.
///
/// # Safety
/// `s` is NULL or a live handle, not used afterwards.
#[unsafe(no_mangle)]
pub unsafe extern "C" fn memarray_stream_free(s: *mut memarray_stream) {
    // SAFETY: the caller's contract (NULL or a live handle, not used afterwards).
    unsafe { memarray_stream::free(s) }
}

/// The stream's `CUstream` (usable as a `cudaStream_t`, e.g. in `<<<grid, block, 0,
/// stream>>>`), or NULL for a NULL handle.
///
/// # Safety
/// `s` is NULL or a live handle.
#[unsafe(no_mangle)]
pub unsafe extern "C" fn memarray_stream_handle(s: *const memarray_stream) -> *mut c_void {
    // SAFETY: the caller's contract.
    unsafe { s.as_ref() }.map_or(std::ptr::null_mut(), |s| s.stream.raw() as *mut c_void)
}

/// Waits until the stream's work is done.
///
/// # Safety
/// `s` is a live handle.
#[unsafe(no_mangle)]
pub unsafe extern "C" fn memarray_stream_synchronize(s: *const memarray_stream) -> memarray_status {
    guard(|| {
        // SAFETY: the caller's contract.
        let s = unsafe { memarray_stream::arg(s, "stream") }?;
        s.stream.synchronize(&s.device)?;
        Ok(())
    })
}
