//! Device access scopes: an array's device memory for the caller's own kernel on a
//! stream, with memarray's ordering on both ends.

use std::sync::Arc;

use memarray_core::LockToken;
use memarray_cuda::array::SharedArray;
use memarray_cuda::launch::{begin_access, end_access};
use memarray_cuda::{Device, DeviceBuffer, StreamRef};

use crate::array::{array_arg, indexer, memarray_array, memarray_indexer, token_of};
use crate::error::{check_out, guard, memarray_status, write_out};
use crate::handle::Handle;
use crate::stream::{memarray_stream, stream_arg};

/// An open device access (opaque): from [`memarray_access_begin`] to
/// [`memarray_access_end`].
pub struct memarray_access {
    array: Arc<SharedArray>,
    token: LockToken,
    /// Whether begin took the lock (and end releases it).
    owns_lock: bool,
    device: Arc<Device>,
    stream: StreamRef,
    write: bool,
    indexer: memarray_indexer,
    /// Keeps the device memory alive whatever happens to the array handle.
    _buffer: Arc<DeviceBuffer>,
}

impl Handle for memarray_access {}

// SAFETY: the indexer's pointer is a device address, never dereferenced here; every
// other field is Send + Sync.
unsafe impl Send for memarray_access {}
// SAFETY: as above.
unsafe impl Sync for memarray_access {}

/// Opens device access to `a` for work the caller enqueues on `stream` (NULL: the
/// legacy default stream) on `device`: the data moves there (restored if spilled),
/// `stream` waits on the array's pending work, and `*out`'s indexer holds the device
/// address. The array stays locked until [`memarray_access_end`]: by a new lock when
/// `token` is 0 (it fails with `MEMARRAY_STATUS_LOCKED` if someone else holds one), or
/// by the caller's lock `token`. `write`: whether the work writes the array (else it only
/// reads it). Free nothing the access uses before ending it; the array handle itself may
/// be freed (the access keeps the array).
///
/// # Safety
/// Handles are live; `out` is writable.
#[unsafe(no_mangle)]
pub unsafe extern "C" fn memarray_access_begin(
    a: *const memarray_array,
    device: i32,
    stream: *const memarray_stream,
    write: bool,
    token: u64,
    out: *mut *mut memarray_access,
) -> memarray_status {
    guard(|| {
        // SAFETY: the caller's contract.
        unsafe { array_arg(a, "array") }?;
        check_out(out, "out")?;
        // SAFETY: the caller's contract; checked non-null above.
        let array = unsafe { &*a }.inner.clone();
        let dev = crate::device::device(device)?;
        // SAFETY: the caller's contract.
        let stream = unsafe { stream_arg(stream) }.unwrap_or(StreamRef::legacy());
        let (token, owns_lock) = match token_of(token) {
            Some(t) => (t, false),
            None => (array.try_lock()?, true),
        };
        let opened = (|| {
            let mut raw = array.state();
            let buf = begin_access(&mut raw, &dev, stream, Some(token))?;
            let ix = indexer(buf.device_ptr() as *mut std::ffi::c_void, raw.shape());
            Ok::<_, memarray_cuda::CudaError>((buf, ix))
        })();
        let (buffer, ix) = match opened {
            Ok(v) => v,
            Err(e) => {
                if owns_lock {
                    // The caller needs the error above; this token is ours and unused
                    // elsewhere, so the unlock cannot fail.
                    let _ = array.unlock(token);
                }
                return Err(e.into());
            }
        };
        let h = memarray_access {
            array,
            token,
            owns_lock,
            device: dev,
            stream,
            write,
            indexer: ix,
            _buffer: buffer,
        };
        // SAFETY: checked above.
        unsafe { write_out(out, "out", h.into_raw()) }
    })
}

/// The open access's indexer (`data` a device address).
///
/// # Safety
/// `acc` is a live access; `out` is writable.
#[unsafe(no_mangle)]
pub unsafe extern "C" fn memarray_access_indexer(
    acc: *const memarray_access,
    out: *mut memarray_indexer,
) -> memarray_status {
    guard(|| {
        // SAFETY: the caller's contract.
        let acc = unsafe { memarray_access::arg(acc, "access") }?;
        // SAFETY: the caller's contract.
        unsafe { write_out(out, "out", acc.indexer) }
    })
}

/// Ends an access, after the caller has enqueued its work on the access's stream: that
/// work becomes the array's pending work (a write, or a read that later writes wait
/// for), and the lock begin took is released. The access is freed whatever the status
/// (NULL: `MEMARRAY_STATUS_INVALID_ARGUMENT`).
///
/// # Safety
/// `acc` is NULL or a live access, not used afterwards.
#[unsafe(no_mangle)]
pub unsafe extern "C" fn memarray_access_end(acc: *mut memarray_access) -> memarray_status {
    guard(|| {
        // SAFETY: the caller's contract: a live handle, consumed here.
        unsafe { memarray_access::arg(acc, "access") }?;
        // SAFETY: as above; not NULL (checked).
        let acc = unsafe { memarray_access::from_raw(acc) };
        let recorded = {
            let mut raw = acc.array.state();
            end_access(&mut raw, acc.device.clone(), acc.stream, acc.write)
        };
        if acc.owns_lock {
            acc.array.unlock(acc.token)?;
        }
        recorded?;
        Ok(())
    })
}
