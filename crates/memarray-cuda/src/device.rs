//! [`Device`]: one CUDA device and its primary context, cached per ordinal.

use std::fmt;
use std::sync::atomic::{AtomicU32, Ordering};
use std::sync::{Arc, OnceLock};

use cudarc::driver::sys::CUdevice_attribute as Attr;
use memarray_core::{Location, MemoryInfo};

use crate::driver::{self, CUcontext, CUdevice};
use crate::error::{CudaError, Result};

/// Keeps a device's context current until dropped, then restores the context the thread
/// had before. memarray never leaves its context behind: torch, CuPy and the CUDA runtime
/// read the thread's current context as their current device.
#[must_use = "the context is restored when the guard drops; bind it with `let _ctx = ...`"]
#[derive(Debug)]
pub struct BindGuard {
    previous: CUcontext,
    bound: CUcontext,
}

impl Drop for BindGuard {
    fn drop(&mut self) {
        if self.previous != self.bound {
            // SAFETY: `previous` was current on this thread when the guard was made, so it
            // is a live context or null (which unbinds); contexts memarray binds are
            // primary contexts that are never released.
            let done = unsafe { driver::ctx_set_current(self.previous) };
            crate::parked::park_err("restoring the thread's previous context", done);
        }
    }
}

/// Whether no context is current on the calling thread (for tests of [`BindGuard`]).
#[doc(hidden)]
pub fn current_context_is_null() -> Result<bool> {
    Ok(driver::ctx_get_current()?.is_null())
}

/// The device of the CUDA context current on the calling thread, as CUDA keeps it per
/// thread: set by [`Device::make_current`], torch's `torch.cuda.set_device`, CuPy's
/// `Device.use()` or `cudaSetDevice`, so all of them agree. `None` when no context is
/// current on this thread.
///
/// # Errors
/// [`CudaError::Unavailable`] without a driver.
pub fn current_device() -> Result<Option<u32>> {
    driver::ctx_get_device()
}

/// [`current_device`] without starting CUDA: `None` when memarray has not used the driver
/// yet in this process (a host-only program stays free of CUDA, and of its fork rules).
pub fn current_device_if_started() -> Option<u32> {
    if !driver::started() {
        return None;
    }
    current_device().ok().flatten()
}

/// The device of threads that have no current context: 0 unless [`set_default_device`]
/// chose another (a worker process that serves one GPU of several, say).
static DEFAULT_DEVICE: AtomicU32 = AtomicU32::new(0);

/// The device a thread without a current context uses (see [`set_default_device`]).
pub fn default_device() -> u32 {
    DEFAULT_DEVICE.load(Ordering::Relaxed)
}

/// Makes `id` the device of every thread of this process that has no current context
/// (threads that set one keep theirs).
///
/// # Errors
/// [`CudaError::Unavailable`] without a driver; [`CudaError::NoSuchDevice`] for a device
/// that does not exist.
pub fn set_default_device(id: u32) -> Result<()> {
    Device::get(id)?;
    DEFAULT_DEVICE.store(id, Ordering::Relaxed);
    Ok(())
}

/// The calling thread's device: its current context's ([`current_device`]), else the
/// process default ([`default_device`]); the default too when there is no driver (the first
/// device use then says why). Never starts CUDA when `started_only` is set and memarray has
/// not used the driver yet.
pub fn current_or_default(started_only: bool) -> u32 {
    let current = if started_only {
        current_device_if_started()
    } else {
        current_device().ok().flatten()
    };
    current.unwrap_or_else(default_device)
}

/// Leaves no context current on the calling thread (undoes [`Device::make_current`] where
/// nothing was current before it).
pub fn clear_current() -> Result<()> {
    // SAFETY: null is allowed (item 1 of `ctx_set_current`): it unbinds, nothing is
    // released.
    unsafe { driver::ctx_set_current(std::ptr::null_mut()) }
}

/// Whether this process can use at least one CUDA device. Never panics.
pub fn is_available() -> bool {
    device_count().is_ok_and(|n| n > 0)
}

/// Number of CUDA devices visible to this process.
///
/// Returns [`CudaError::Unavailable`] when there is no driver or `cuInit` fails (for
/// example `CUDA_ERROR_NO_DEVICE`).
pub fn device_count() -> Result<u32> {
    driver::device_count()
}

/// The device that owns the memory at `addr` (a device, managed or pinned address the
/// driver knows, e.g. from `__cuda_array_interface__`). Other addresses are a
/// [`CudaError::Driver`] error (`CUDA_ERROR_INVALID_VALUE`).
pub fn device_of_pointer(addr: u64) -> Result<Arc<Device>> {
    Device::get(driver::pointer_device_ordinal(addr)?)
}

/// Checks that `[addr, addr + span)` lies inside one allocation the driver knows on
/// `device`: a foreign tensor's claim (DLPack, CUDA Array Interface), checked before any
/// copy or kernel reads it, since a forged pointer, offset or stride would fault on the
/// device and poison the context. A [`CudaError::Driver`] error for an address
/// the driver does not know, [`CudaError::BufferTooSmall`] for a span past the end.
pub fn check_device_span(device: &Device, addr: u64, span: usize) -> Result<()> {
    if span == 0 {
        return Ok(());
    }
    // One driver call, no context switch, for memory the driver reports a range for.
    if let Some((base, size)) = driver::pointer_range(addr)? {
        return fits(addr, span, base, size);
    }
    let _ctx = device.bind()?;
    // SAFETY: the device's context is bound above.
    let (base, size) = match unsafe { driver::mem_get_address_range(addr) } {
        Ok(r) => r,
        // Memory the driver knows but reports no range for (virtual-memory mappings):
        // only the pointer itself can be checked.
        Err(e) => {
            return driver::pointer_device_ordinal(addr)
                .map(|_| ())
                .map_err(|_| e);
        }
    };
    fits(addr, span, base, size)
}

/// Whether `span` bytes from `addr` stay inside the allocation `(base, size)`.
fn fits(addr: u64, span: usize, base: u64, size: usize) -> Result<()> {
    let room = (base + size as u64).saturating_sub(addr);
    if span as u64 > room {
        return Err(CudaError::BufferTooSmall {
            what: format!("a foreign device tensor at {addr:#x}"),
            needed: span,
            len: room as usize,
        });
    }
    Ok(())
}

/// One CUDA device, holding a reference to its primary context (the context the CUDA
/// runtime, PyTorch and CuPy use, so memory and streams are shared with them).
///
/// Devices are created once per ordinal and cached for the life of the process:
/// [`Device::get`] is a lock-free lookup after the first call. The primary context is
/// retained once and never released: releasing it while another library's work or
/// memarray's own buffers may still use it would destroy them, and a process uses few
/// devices.
///
/// # Example
///
/// ```
/// use memarray_cuda::{CudaError, Device};
///
/// match Device::get(0) {
///     Ok(d) => println!("{} (sm_{}{})", d.name(), d.compute_capability().0, d.compute_capability().1),
///     // Without a driver every entry point says so; nothing panics.
///     Err(CudaError::Unavailable { .. }) => assert!(!memarray_cuda::is_available()),
///     Err(e) => return Err(e),
/// }
/// # Ok::<(), CudaError>(())
/// ```
pub struct Device {
    id: u32,
    cu: CUdevice,
    ctx: CUcontext,
    name: String,
    compute_capability: (u32, u32),
    sm_count: u32,
}

// SAFETY: a primary context handle may be used from any thread (CUDA contexts are
// thread-safe; binding is per thread, done by `bind`); the other fields are plain data.
unsafe impl Send for Device {}
// SAFETY: as above; no method mutates unsynchronised state.
unsafe impl Sync for Device {}

impl Device {
    /// The device with ordinal `id`, retaining its primary context on first use.
    ///
    /// Errors: [`CudaError::Unavailable`] without a driver or device,
    /// [`CudaError::NoSuchDevice`] for an ordinal past [`device_count`].
    pub fn get(id: u32) -> Result<Arc<Device>> {
        let slots = slots()?;
        let slot = slots.get(id as usize).ok_or(CudaError::NoSuchDevice {
            id,
            count: slots.len() as u32,
        })?;
        if let Some(d) = slot.get() {
            return Ok(d.clone());
        }
        // Two threads may both get here; both retain (a reference count, never released)
        // and one result wins.
        let d = Arc::new(Device::open(id)?);
        Ok(slot.get_or_init(|| d).clone())
    }

    fn open(id: u32) -> Result<Device> {
        let cu = driver::device_get(id)?;
        let attr = |a| driver::device_attribute(cu, a).map(|v| v.max(0) as u32);
        Ok(Device {
            id,
            cu,
            ctx: driver::primary_ctx_retain(cu)?,
            name: driver::device_name(cu)?,
            compute_capability: (
                attr(Attr::CU_DEVICE_ATTRIBUTE_COMPUTE_CAPABILITY_MAJOR)?,
                attr(Attr::CU_DEVICE_ATTRIBUTE_COMPUTE_CAPABILITY_MINOR)?,
            ),
            sm_count: attr(Attr::CU_DEVICE_ATTRIBUTE_MULTIPROCESSOR_COUNT)?,
        })
    }

    /// The device ordinal.
    pub fn id(&self) -> u32 {
        self.id
    }

    /// `Location::Device(id)`.
    pub fn location(&self) -> Location {
        Location::Device(self.id)
    }

    /// Makes this device's primary context current on the calling thread. Cheap when it
    /// already is (one driver query); every memarray operation calls it, so callers need
    /// not, but code mixing raw driver calls with memarray may.
    pub fn bind(&self) -> Result<BindGuard> {
        Ok(BindGuard {
            previous: self.set_current()?,
            bound: self.ctx,
        })
    }

    /// Makes this device's primary context current on the calling thread; returns the
    /// context that was current before.
    fn set_current(&self) -> Result<driver::CUcontext> {
        let previous = driver::ctx_get_current()?;
        if previous != self.ctx {
            // SAFETY: `ctx` is a primary context retained in `open` and never released
            // (item 1 of `ctx_set_current`).
            unsafe { driver::ctx_set_current(self.ctx) }?;
        }
        Ok(previous)
    }

    /// Makes this device's primary context current on the calling thread and leaves it
    /// so (the thread's current device, [`current_device`]; what `cudaSetDevice` does).
    pub fn make_current(&self) -> Result<()> {
        self.set_current().map(drop)
    }

    /// The device's name, e.g. `"NVIDIA H200"`.
    pub fn name(&self) -> &str {
        &self.name
    }

    /// Compute capability `(major, minor)`, e.g. `(9, 0)` for Hopper.
    pub fn compute_capability(&self) -> (u32, u32) {
        self.compute_capability
    }

    /// Number of streaming multiprocessors.
    pub fn multiprocessor_count(&self) -> u32 {
        self.sm_count
    }

    /// Free and total device memory in bytes, as the driver reports them now.
    pub fn memory_info(&self) -> Result<MemoryInfo> {
        let _ctx = self.bind()?;
        // SAFETY: `bind` made this device's live context current (item 1).
        let (free, total) = unsafe { driver::mem_get_info() }?;
        Ok(MemoryInfo { free, total })
    }

    /// Whether kernels and copies on this device can access `other`'s memory directly.
    /// A device can always access itself.
    pub fn can_access_peer(&self, other: &Device) -> Result<bool> {
        if other.id == self.id {
            return Ok(true);
        }
        driver::device_can_access_peer(self.cu, other.cu)
    }

    /// Lets this device access `other`'s memory directly (one direction). Idempotent:
    /// enabling twice, or enabling a device to itself, is `Ok`.
    pub fn enable_peer_access(&self, other: &Device) -> Result<()> {
        if other.id == self.id {
            return Ok(());
        }
        let _ctx = self.bind()?;
        // SAFETY: this device's context is current (item 1); `other.ctx` is a retained,
        // never-released primary context of another device (item 2).
        unsafe { driver::ctx_enable_peer_access(other.ctx) }.map(|_| ())
    }

    /// Enables direct access both ways between this device and `other` where the pair
    /// supports it (NVLink / PCIe P2P); otherwise peer copies stage through the host.
    /// Idempotent.
    pub fn link_peer(&self, other: &Device) -> Result<()> {
        if other.id != self.id && self.can_access_peer(other)? {
            self.enable_peer_access(other)?;
            other.enable_peer_access(self)?;
        }
        Ok(())
    }

    /// Blocks until all work on this device's primary context has finished.
    pub fn synchronize(&self) -> Result<()> {
        let _ctx = self.bind()?;
        // SAFETY: `bind` made this device's live context current (item 1).
        unsafe { driver::ctx_synchronize() }
    }

    /// The primary context handle.
    pub(crate) fn ctx(&self) -> CUcontext {
        self.ctx
    }

    /// The driver's device handle.
    pub(crate) fn cu(&self) -> CUdevice {
        self.cu
    }
}

impl fmt::Debug for Device {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("Device")
            .field("id", &self.id)
            .field("name", &self.name)
            .field("compute_capability", &self.compute_capability)
            .field("sm_count", &self.sm_count)
            .finish_non_exhaustive()
    }
}

/// One lazily filled slot per visible device.
fn slots() -> Result<&'static [OnceLock<Arc<Device>>]> {
    static SLOTS: OnceLock<Box<[OnceLock<Arc<Device>>]>> = OnceLock::new();
    if let Some(s) = SLOTS.get() {
        return Ok(s);
    }
    let n = device_count()?;
    Ok(SLOTS.get_or_init(|| (0..n).map(|_| OnceLock::new()).collect()))
}

#[cfg(test)]
mod tests {
    use super::*;

    /// On machines without a driver (CI, this crate's development machine) every entry
    /// point returns `Unavailable` with a reason instead of panicking.
    #[test]
    fn without_a_driver_everything_is_an_error_not_a_panic() {
        if driver::init().is_ok() {
            return; // a GPU machine: covered by the integration tests
        }
        assert!(!is_available());
        let e = Device::get(0).unwrap_err();
        assert!(matches!(e, CudaError::Unavailable { .. }), "{e:?}");
        assert!(e.to_string().contains("CUDA is unavailable"), "{e}");
        assert!(matches!(device_count(), Err(CudaError::Unavailable { .. })));
    }
}
