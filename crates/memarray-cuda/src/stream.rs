//! [`Stream`] (owned) and [`StreamRef`] (borrowed, `Copy`, possibly foreign).
//!
//! The default streams `1` (legacy) and `2` (per-thread) are per context: an operation
//! given one of them uses the default stream of the device it binds (the buffer's device
//! for copies, memsets and kernels; the event's device for [`StreamRef::wait`] and
//! [`crate::Event::record`]).

use std::num::NonZeroUsize;
use std::sync::{Arc, Mutex};

use memarray_core::RawStream;

use crate::device::Device;
use crate::driver::{self, CUstream};
use crate::error::{CudaError, Result};
use crate::per_device::PerDevice;

/// A borrowed stream handle: the two default streams, a [`Stream`]'s, or a foreign one
/// (from PyTorch's `cuda_stream` or CuPy's `ptr`).
///
/// Handle 0 never becomes a `StreamRef` (RMM's `cuda_stream_view` deletes that
/// constructor): libraries disagree on whether it names the legacy or the per-thread
/// default stream, and DLPack and the CUDA Array Interface forbid it. Use
/// [`StreamRef::legacy`] or [`StreamRef::per_thread`].
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub struct StreamRef(NonZeroUsize);

impl StreamRef {
    /// The legacy default stream (`CU_STREAM_LEGACY`, handle 1): synchronizes with every
    /// blocking stream of its context.
    pub const fn legacy() -> Self {
        StreamRef(NonZeroUsize::MIN)
    }

    /// The per-thread default stream (`CU_STREAM_PER_THREAD`, handle 2).
    pub const fn per_thread() -> Self {
        StreamRef(NonZeroUsize::MIN.saturating_add(1))
    }

    /// Wraps a raw `CUstream` handle, e.g. one from PyTorch or CuPy. Refuses 0 with
    /// [`CudaError::NullStream`], and with [`CudaError::InvalidArgument`] a handle that cannot
    /// be a stream: a `CUstream` is the address of the driver's host-side stream object,
    /// so anything but 1, 2 or an aligned address of mapped memory is a forged or stale
    /// integer, which the driver would dereference and crash on.
    ///
    /// # Safety
    /// 1. `handle` is 1, 2, or a stream that stays alive (not destroyed) for as long as
    ///    this `StreamRef` or any copy of it is used.
    pub unsafe fn from_raw(handle: usize) -> Result<Self> {
        if handle > 2 && !plausible_stream_address(handle) {
            return Err(CudaError::InvalidArgument {
                what: "stream handle",
                detail: format!(
                    "{handle:#x} is not a CUDA stream (not 1, 2 or the address of a live \
                     stream object)"
                ),
            });
        }
        NonZeroUsize::new(handle)
            .map(StreamRef)
            .ok_or(CudaError::NullStream)
    }

    /// The stream named by a core [`RawStream`] (whose unsafe constructor already took
    /// the liveness promise). Refuses 0 with [`CudaError::NullStream`].
    pub fn from_raw_stream(stream: RawStream) -> Result<Self> {
        NonZeroUsize::new(stream.raw())
            .map(StreamRef)
            .ok_or(CudaError::NullStream)
    }

    /// The handle as an integer, for Python (`__dlpack__(stream=...)`, CAI `stream`).
    pub fn raw(self) -> usize {
        self.0.get()
    }

    /// Whether this is the legacy or per-thread default stream.
    pub fn is_default(self) -> bool {
        self.raw() <= 2
    }

    /// Whether the handle stays valid for the life of the process: a default stream or
    /// one memarray created (owned streams are recycled, never destroyed). A foreign
    /// handle is only promised for the call that passed it, so memarray never keeps one
    /// for later work.
    pub fn is_persistent(self) -> bool {
        self.is_default() || is_owned(self.raw())
    }

    /// Blocks until all work on this stream is done. A default stream here is
    /// `device`'s.
    pub fn synchronize(self, device: &Device) -> Result<()> {
        // A capturing stream's work runs only when its graph is launched; the driver's
        // wait would invalidate the capture: refused, the capture stays valid.
        self.refuse_under_capture(device, "a host wait for a stream")?;
        let _ctx = device.bind()?;
        // SAFETY: live stream, as in `wait`; the device context is current (item 1).
        unsafe { driver::stream_synchronize(self.cu()) }
    }

    /// The driver handle.
    pub(crate) fn cu(self) -> CUstream {
        driver::stream_handle(self.raw())
    }
}

impl From<StreamRef> for RawStream {
    fn from(s: StreamRef) -> RawStream {
        // SAFETY: a StreamRef is 1, 2 or a live stream by its own constructors' contracts.
        unsafe { RawStream::from_raw(s.raw()) }
    }
}

/// Whether `raw` is a driver stream memarray created (recycled, never destroyed). Asked
/// at every pool free on a non-default stream: a read lock.
pub(crate) fn is_owned(raw: usize) -> bool {
    owned_streams()
        .read()
        .unwrap_or_else(|e| e.into_inner())
        .contains(&raw)
}

/// Handles of every driver stream memarray created (never destroyed).
fn owned_streams() -> &'static std::sync::RwLock<std::collections::HashSet<usize>> {
    static OWNED: std::sync::OnceLock<std::sync::RwLock<std::collections::HashSet<usize>>> =
        std::sync::OnceLock::new();
    OWNED.get_or_init(Default::default)
}

/// An owned stream on one device, created `CU_STREAM_NON_BLOCKING` (it does not
/// synchronize with the legacy default stream, like PyTorch's and CuPy's streams).
///
/// Dropping a `Stream` does not destroy the driver stream: it goes back to its device to
/// be reused by the next [`Stream::new`] (PyTorch pools its streams the same way). That
/// keeps every `StreamRef` sound without a lifetime: a copy that outlives its `Stream`
/// still names a live stream, so using it orders work conservatively instead of being
/// undefined behaviour. The number of driver streams is the most ever alive at once.
///
/// # Example
///
/// ```
/// use memarray_cuda::{Device, Event, Stream};
///
/// let Ok(device) = Device::get(0) else { return Ok(()) }; // needs a GPU
/// let (a, b) = (Stream::new(&device)?, Stream::new(&device)?);
/// let done = Event::new(&device)?;
/// done.record(a.as_ref())?; // work queued on `a` so far ...
/// b.wait(&done)?; // ... precedes anything queued on `b` later (no host block)
/// b.synchronize()?;
/// assert!(done.is_complete()?);
/// # Ok::<(), memarray_cuda::CudaError>(())
/// ```
#[derive(Debug)]
pub struct Stream {
    device: Arc<Device>,
    handle: StreamRef,
}

impl Stream {
    /// A new non-blocking stream on `device`.
    pub fn new(device: &Arc<Device>) -> Result<Stream> {
        let cu = match take_idle_stream(device) {
            Some(s) => s,
            None => {
                let _ctx = device.bind()?;
                // SAFETY: `bind` made the device's live context current (item 1).
                let cu = unsafe { driver::stream_create_non_blocking() }?;
                // An idle stream was listed when it was created.
                owned_streams()
                    .write()
                    .unwrap_or_else(|e| e.into_inner())
                    .insert(cu as usize);
                cu
            }
        };
        // The driver never returns a null stream from cuStreamCreate.
        let handle = NonZeroUsize::new(cu as usize).ok_or(CudaError::NullStream)?;
        Ok(Stream {
            device: device.clone(),
            handle: StreamRef(handle),
        })
    }

    /// A borrowed handle to this stream.
    pub fn as_ref(&self) -> StreamRef {
        self.handle
    }

    /// The device the stream belongs to.
    pub fn device(&self) -> &Arc<Device> {
        &self.device
    }

    /// Blocks until all work enqueued on the stream is done.
    pub fn synchronize(&self) -> Result<()> {
        self.handle.synchronize(&self.device)
    }

    /// The handle as an integer, for Python.
    pub fn raw(&self) -> usize {
        self.handle.raw()
    }
}

/// Streams of dropped [`Stream`]s, per device, reused instead of destroyed.
static IDLE: PerDevice<Mutex<Vec<usize>>> = PerDevice::new();

/// A stream of `device`'s context to reuse, if a dropped one is idle.
fn take_idle_stream(device: &Device) -> Option<CUstream> {
    let mut idle = IDLE
        .get(device.id())
        .lock()
        .unwrap_or_else(|e| e.into_inner());
    idle.pop().map(driver::stream_handle)
}

impl Drop for Stream {
    fn drop(&mut self) {
        let mut idle = IDLE
            .get(self.device.id())
            .lock()
            .unwrap_or_else(|e| e.into_inner());
        idle.push(self.handle.raw());
    }
}

/// Whether `addr` could be a `CUstream`: pointer-aligned, below the end of user space, and
/// in mapped memory (`msync(MS_ASYNC)` checks the page without touching it).
// Never inlined: scripts/valgrind.supp names this frame (optimised builds too).
#[inline(never)]
fn plausible_stream_address(addr: usize) -> bool {
    const PAGE: usize = 4096;
    if !addr.is_multiple_of(std::mem::align_of::<usize>()) || (addr as u64) >= 1 << 57 {
        return false;
    }
    let page = addr - addr % PAGE;
    // SAFETY: msync only inspects the mapping of one page; MS_ASYNC schedules no I/O. An
    // unmapped page is ENOMEM, never a fault.
    unsafe { libc::msync(page as *mut libc::c_void, PAGE, libc::MS_ASYNC) == 0 }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn handle_zero_is_refused() {
        // SAFETY: 0 is refused before any use.
        let e = unsafe { StreamRef::from_raw(0) }.unwrap_err();
        assert_eq!(e, CudaError::NullStream);
        assert!(e.to_string().contains("stream handle 0 is refused"), "{e}");
        // SAFETY: as above.
        let raw = unsafe { RawStream::from_raw(0) };
        assert_eq!(StreamRef::from_raw_stream(raw), Err(CudaError::NullStream));
    }

    #[test]
    fn default_streams_have_their_cuda_values() {
        assert_eq!(StreamRef::legacy().raw(), 1);
        assert_eq!(StreamRef::per_thread().raw(), 2);
        assert!(StreamRef::legacy().is_default());
        assert!(StreamRef::legacy().is_persistent());
        // A live, aligned address stands in for a foreign stream object.
        let object = Box::leak(Box::new([0u64; 4])).as_ptr() as usize;
        // SAFETY: never used as a stream; only its persistence is asked.
        let foreign = unsafe { StreamRef::from_raw(object) }.unwrap();
        assert!(!foreign.is_persistent());
        assert_eq!(RawStream::from(StreamRef::legacy()), RawStream::LEGACY);
        assert_eq!(
            RawStream::from(StreamRef::per_thread()),
            RawStream::PER_THREAD
        );
        assert_eq!(
            StreamRef::from_raw_stream(RawStream::PER_THREAD),
            Ok(StreamRef::per_thread())
        );
        // SAFETY: the handle is only compared, never used.
        let foreign = unsafe { StreamRef::from_raw(object + 8) }.unwrap();
        assert!(!foreign.is_default());
        for forged in [0xdead_0000, 0x7f00_dead_0003, 1 << 60, usize::MAX] {
            // SAFETY: refused before any use.
            let e = unsafe { StreamRef::from_raw(forged) }.unwrap_err();
            assert!(
                matches!(e, CudaError::InvalidArgument { .. }),
                "{forged:#x}: {e}"
            );
        }
    }
}
