//! CUDA memory resources, on memarray-core's [`MemoryResource`] trait.
//!
//! | resource | memory | allocate / free | `stream` argument |
//! |---|---|---|---|
//! | [`DeviceResource`] | device | `cuMemAlloc` / `cuMemFree` | orders the zeroing memset |
//! | [`AsyncPoolResource`] | device | `cuMemAllocAsync` / `cuMemFreeAsync` | orders allocation, zeroing and free |
//! | [`PinnedResource`] | page-locked host | `cuMemHostAlloc` / `cuMemFreeHost` | ignored |
//! | [`ManagedResource`] | managed (unified) | `cuMemAllocManaged` / `cuMemFree` | orders the zeroing memset |
//!
//! Common rules: zero bytes still gives a unique, aligned address (one byte is
//! allocated); any power-of-two alignment up to [`MAX_ALIGN`] is served, alignments above
//! the driver's 256 bytes by over-allocating; `None` as the stream means the legacy
//! default stream, and zeroing on it blocks until done. Errors are
//! [`CoreError::Alloc`] naming the bytes, the resource and the device, or
//! [`CoreError::BadAlignment`].

mod caching;
mod device;
mod driver_backed;
mod managed;
mod pinned;
mod pinned_pool;
mod pool;
#[cfg(test)]
pub(crate) mod test_range;
mod vmm;

use std::collections::HashMap;
use std::ptr::NonNull;
use std::sync::{Arc, Mutex, OnceLock, PoisonError};

use memarray_core::{CoreError, MemoryResource, RawStream};

pub use caching::{CachingPool, PoolStatistics, Restore};
pub use device::{DeviceAlloc, DeviceResource};
pub use driver_backed::{Backend, DriverResource};
pub use managed::{ManagedAlloc, ManagedResource};
pub use pinned::{HostRegistration, PinnedAlloc, PinnedFlags, PinnedResource};
pub use pinned_pool::{
    PINNED_LIMIT_ENV, PINNED_POOL_KEEP, PinnedFallbacks, pinned_fallbacks, pinned_limit_from_env,
    pinned_pool,
};
pub(crate) use pinned_pool::{count_fallback, staging_host_buffer};
pub use pool::{AsyncAlloc, AsyncPoolResource};
pub use vmm::VmmRange;

use crate::device::Device;
use crate::driver;
use crate::error::{CudaError, Result, SettingError};
use crate::per_device::PerDevice;
use crate::stream::StreamRef;

/// The largest alignment the CUDA resources serve (a 2 MiB large page).
pub const MAX_ALIGN: usize = 1 << 21;

/// Alignment every driver allocation already has.
const NATURAL_ALIGN: usize = 256;

/// The environment variable that picks [`default_resource`]'s kind.
pub const RESOURCE_ENV: &str = "MEMARRAY_MEMORY_RESOURCE";

/// The default resource for device buffers on `device`, chosen once per device by
/// `MEMARRAY_MEMORY_RESOURCE`: `pool` (the default: a [`CachingPool`] over `cuMemAlloc`),
/// `device` (`cuMemAlloc` / `cuMemFree` each time), `async` (the driver's stream-ordered
/// pool) or `managed`; replaced by [`set_default_resource`].
///
/// The pool is the default because it allocates and frees 1 MiB in 0.17 us against
/// 2.7 us for `cuMemAlloc` + `cuMemFree` and 1.7 us for `cuMemAllocAsync` (H100,
/// benches/resources.rs), which makes `memarray.empty` on a device twice as fast as
/// `torch.empty`. Its reuse rule is safe for exports: a DLPack consumer's stream is
/// recorded when it releases the export, and the freed block waits for that stream's work
/// ([`crate::DeviceBuffer::record_use`]). `device` remains for code that hands memory to
/// consumers through the CUDA Array Interface on non-blocking streams of their own (which
/// memarray cannot see) and frees it while their work is queued: `cuMemFree` waits for
/// the whole device.
pub fn default_resource(device: &Arc<Device>) -> Result<Arc<dyn MemoryResource>> {
    let slot = DEFAULTS.get(device.id());
    if let Some(r) = slot.read().unwrap_or_else(PoisonError::into_inner).as_ref() {
        return Ok(r.clone());
    }
    probe_captures();
    let r = resource_from_env(device)?;
    let mut w = slot.write().unwrap_or_else(PoisonError::into_inner);
    Ok(w.get_or_insert(r).clone())
}

/// Makes `r` the resource new device buffers on `device` come from (buffers already made
/// keep theirs: each holds its resource). Returns the previous default, if one was chosen.
///
/// `r` must serve memory `device` can use ([`MemoryResource::is_accessible_from`] its
/// location): anything else is [`CudaError::Inaccessible`].
pub fn set_default_resource(
    device: &Arc<Device>,
    r: Arc<dyn MemoryResource>,
) -> Result<Option<Arc<dyn MemoryResource>>> {
    if !r.is_accessible_from(device.location()) {
        return Err(CudaError::Inaccessible {
            resource: r.name().to_string(),
            location: device.location(),
        });
    }
    let mut w = DEFAULTS
        .get(device.id())
        .write()
        .unwrap_or_else(PoisonError::into_inner);
    Ok(w.replace(r))
}

/// Each device's default resource: chosen on first use from the environment, replaced by
/// [`set_default_resource`].
static DEFAULTS: PerDevice<std::sync::RwLock<Option<Arc<dyn MemoryResource>>>> = PerDevice::new();

/// Each device's plain [`DeviceResource`], made once: what imported memory falls back to
/// for copies (an import makes none of its own: `from_dlpack` is a hot path).
static PLAIN: PerDevice<OnceLock<Arc<dyn MemoryResource>>> = PerDevice::new();

/// `device`'s shared plain [`DeviceResource`].
pub(crate) fn plain_device_resource(device: &Arc<Device>) -> Arc<dyn MemoryResource> {
    PLAIN
        .get(device.id())
        .get_or_init(|| Arc::new(DeviceResource::new(device)))
        .clone()
}

/// The kinds `MEMARRAY_MEMORY_RESOURCE` names.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum ResourceChoice {
    /// `pool` (or unset): [`CachingPool`] over [`DeviceResource`].
    Pool,
    /// `device`: [`DeviceResource`].
    Device,
    /// `async`: [`AsyncPoolResource`].
    Async,
    /// `managed`: [`ManagedResource`].
    Managed,
}

/// Parses a `MEMARRAY_MEMORY_RESOURCE` value (surrounding spaces ignored; empty is the
/// default, `pool`); anything else is [`SettingError::Env`] naming the accepted values.
pub fn parse_resource_choice(value: &str) -> Result<ResourceChoice> {
    match value.trim() {
        "" | "pool" => Ok(ResourceChoice::Pool),
        "device" => Ok(ResourceChoice::Device),
        "async" => Ok(ResourceChoice::Async),
        "managed" => Ok(ResourceChoice::Managed),
        other => Err(CudaError::from(SettingError::Env {
            var: RESOURCE_ENV,
            value: other.to_string(),
            expected: "pool (the default), device, async or managed",
        })),
    }
}

/// What `MEMARRAY_MEMORY_RESOURCE` asks for (the pool when unset).
///
/// # Errors
/// [`SettingError::Env`] for a value that is not UTF-8 or names no resource.
pub fn resource_choice_from_env() -> Result<ResourceChoice> {
    let value = crate::env::var(RESOURCE_ENV)?.unwrap_or_default();
    parse_resource_choice(&value)
}

/// The resource `MEMARRAY_MEMORY_RESOURCE` names for `device`.
fn resource_from_env(device: &Arc<Device>) -> Result<Arc<dyn MemoryResource>> {
    Ok(match resource_choice_from_env()? {
        ResourceChoice::Device => Arc::new(DeviceResource::new(device)),
        ResourceChoice::Pool => Arc::new(CachingPool::new(
            Arc::new(DeviceResource::new(device)),
            device,
            usize::MAX,
        )),
        ResourceChoice::Async => Arc::new(AsyncPoolResource::new(device)?),
        ResourceChoice::Managed => Arc::new(ManagedResource::new(device)),
    })
}

/// Serves any power-of-two alignment up to [`MAX_ALIGN`] from an allocator that
/// guarantees [`NATURAL_ALIGN`], remembering where over-aligned blocks really start.
#[derive(Debug, Default)]
pub(crate) struct Aligner {
    /// Aligned address handed out -> address the driver returned.
    over_aligned: Mutex<HashMap<usize, usize>>,
}

impl Aligner {
    /// Allocates `bytes` (0 allowed) aligned to `align`; `raw` allocates a non-zero size.
    pub(crate) fn allocate(
        &self,
        bytes: usize,
        align: usize,
        name: &str,
        raw: impl FnOnce(usize) -> Result<usize>,
    ) -> Result<NonNull<u8>, CoreError> {
        if !align.is_power_of_two() || align > MAX_ALIGN {
            return Err(CoreError::BadAlignment {
                align,
                max: MAX_ALIGN,
            });
        }
        let size = bytes.max(1);
        let extra = align.saturating_sub(NATURAL_ALIGN);
        let total = size.checked_add(extra).ok_or_else(|| CoreError::Alloc {
            bytes,
            align,
            resource: name.to_string(),
            reason: "size plus alignment overflows usize".into(),
        })?;
        let base = raw(total).map_err(|e| e.into_alloc(bytes, align, name))?;
        let aligned = base.next_multiple_of(align);
        if extra > 0 {
            self.lock().insert(aligned, base);
        }
        NonNull::new(aligned as *mut u8).ok_or_else(|| CoreError::Alloc {
            bytes,
            align,
            resource: name.to_string(),
            reason: "the driver returned address 0".into(),
        })
    }

    /// The address the driver returned for `ptr`, forgetting it.
    pub(crate) fn base_of(&self, ptr: NonNull<u8>, align: usize) -> usize {
        let p = ptr.as_ptr() as usize;
        if align > NATURAL_ALIGN {
            self.lock().remove(&p).unwrap_or(p)
        } else {
            p
        }
    }

    fn lock(&self) -> std::sync::MutexGuard<'_, HashMap<usize, usize>> {
        self.over_aligned.lock().unwrap_or_else(|e| e.into_inner())
    }
}

/// The stream an allocation call names: `None` is the legacy default stream.
pub(crate) fn stream_or_legacy(stream: Option<RawStream>) -> Result<StreamRef> {
    stream.map_or(Ok(StreamRef::legacy()), StreamRef::from_raw_stream)
}

/// `allocate_zeroed` of the device-side resources: allocates from `r`, then zeroes on
/// `stream`; if zeroing fails the block goes back to `r` and the error names `r`.
pub(crate) fn allocate_then_zero(
    r: &dyn MemoryResource,
    device: &Device,
    bytes: usize,
    align: usize,
    stream: Option<RawStream>,
) -> std::result::Result<NonNull<u8>, CoreError> {
    let p = r.allocate(bytes, align, stream)?;
    if let Err(e) = zero_device_memory(device, p.as_ptr() as usize, bytes, stream) {
        // SAFETY: p was just allocated from r with these arguments and never used.
        unsafe { r.deallocate(p, bytes, align, stream) };
        return Err(e.into_alloc(bytes, align, r.name()));
    }
    Ok(p)
}

/// Zeroes `[addr, addr + len)` on `stream`; on the legacy stream (`None`) it also waits,
/// since later work on non-blocking streams would not be ordered after it.
/// Zeroes `len` bytes at `addr`, device memory of `device`, with a memset ordered on
/// `stream` (`None`: the legacy default stream, and the call waits for it): for resources
/// defined outside this crate over memory a library hands out uninitialised.
///
/// # Safety
/// 1. `[addr, addr + len)` is device-accessible memory of `device` that the caller owns,
///    with no access pending that the memset could race.
pub unsafe fn zero_memory(
    device: &Device,
    addr: usize,
    len: usize,
    stream: Option<RawStream>,
) -> Result<()> {
    zero_device_memory(device, addr, len, stream)
}

pub(crate) fn zero_device_memory(
    device: &Device,
    addr: usize,
    len: usize,
    stream: Option<RawStream>,
) -> Result<()> {
    let s = stream_or_legacy(stream)?;
    let _ctx = device.bind()?;
    // SAFETY: the caller just allocated `[addr, addr + len)` on this device (item 1); the
    // stream is live by StreamRef's contract and the device's context is current (item 2).
    unsafe { driver::memset_d8_async(addr as u64, 0, len, s.cu()) }?;
    if stream.is_none() {
        s.synchronize(device)?;
    }
    Ok(())
}

/// Lets the relief path ask whether an allocation's stream is being captured (it then
/// skips its steps, which a capture forbids): installed by every device resource.
pub(crate) fn probe_captures() {
    memarray_core::resource::set_capture_probe(crate::graph::stream_captured);
}

#[cfg(test)]
mod tests {
    use super::*;

    /// A fake driver allocator handing out 256-aligned addresses.
    fn fake(next: &std::cell::Cell<usize>) -> impl FnOnce(usize) -> Result<usize> + '_ {
        move |size| {
            let p = next.get();
            next.set((p + size).next_multiple_of(256) + 256);
            Ok(p)
        }
    }

    #[test]
    fn resource_env_values_and_a_clear_error_for_unknown_ones() {
        assert_eq!(parse_resource_choice("").unwrap(), ResourceChoice::Pool);
        assert_eq!(
            parse_resource_choice(" pool ").unwrap(),
            ResourceChoice::Pool
        );
        assert_eq!(
            parse_resource_choice("device").unwrap(),
            ResourceChoice::Device
        );
        assert_eq!(
            parse_resource_choice("async").unwrap(),
            ResourceChoice::Async
        );
        assert_eq!(
            parse_resource_choice("managed").unwrap(),
            ResourceChoice::Managed
        );
        let e = parse_resource_choice("cuda-pool").unwrap_err();
        let msg = e.to_string();
        assert!(
            msg.contains("MEMARRAY_MEMORY_RESOURCE") && msg.contains("cuda-pool"),
            "{msg}"
        );
        assert!(
            msg.contains("pool") && msg.contains("device") && msg.contains("async"),
            "{msg}"
        );
    }

    #[test]
    fn over_aligned_blocks_remember_their_base() {
        let a = Aligner::default();
        let next = std::cell::Cell::new(0x1_0100);
        let p = a.allocate(10, 4096, "t", fake(&next)).unwrap();
        assert_eq!(p.as_ptr() as usize % 4096, 0);
        assert_eq!(a.base_of(p, 4096), 0x1_0100);
        assert!(a.over_aligned.lock().unwrap().is_empty());
        let q = a.allocate(0, 64, "t", fake(&next)).unwrap();
        assert_eq!(a.base_of(q, 64), q.as_ptr() as usize);
    }

    #[test]
    fn bad_alignments_and_overflow_are_errors() {
        let a = Aligner::default();
        let next = std::cell::Cell::new(0x100);
        assert!(matches!(
            a.allocate(8, 3, "t", fake(&next)),
            Err(CoreError::BadAlignment { align: 3, .. })
        ));
        assert!(matches!(
            a.allocate(8, MAX_ALIGN * 2, "t", fake(&next)),
            Err(CoreError::BadAlignment { .. })
        ));
        assert!(matches!(
            a.allocate(usize::MAX, 4096, "t", fake(&next)),
            Err(CoreError::Alloc { .. })
        ));
        let oom = |_| {
            Err(CudaError::Driver {
                call: "cuMemAlloc_v2",
                code: crate::error::OUT_OF_MEMORY_CODE,
                name: "CUDA_ERROR_OUT_OF_MEMORY".into(),
                message: "out of memory".into(),
            }
            .with_oom_context(7, 0))
        };
        match a.allocate(7, 8, "cuda:0 device", oom) {
            Err(CoreError::OutOfMemory {
                bytes: 7,
                resource,
                reason,
            }) => {
                assert_eq!(resource, "cuda:0 device");
                assert!(reason.contains("out of memory on cuda:0"), "{reason}");
            }
            other => panic!("{other:?}"),
        }
    }
}
