//! Memory resources: the host, a device, pinned memory, caching pools, limits and
//! statistics over any of them, and each device's default.

use std::sync::Arc;

use memarray_core::{HostResource, LimitingAdaptor, MemoryResource, StatisticsAdaptor};
use memarray_cuda::resource::{CachingPool, DeviceResource, PinnedResource};

use crate::error::{Error, Result, check_out, guard, memarray_status, write_out};
use crate::handle::Handle;

/// A memory resource (opaque), reference-counted: adaptors and arrays keep what they use.
pub struct memarray_resource {
    pub(crate) inner: Arc<dyn MemoryResource>,
    /// Set for resources made by [`memarray_resource_statistics`].
    stats: Option<Arc<StatisticsAdaptor>>,
}

impl Handle for memarray_resource {}

/// What a statistics resource has counted.
#[repr(C)]
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct memarray_statistics {
    /// Bytes allocated and not yet freed.
    pub current_bytes: u64,
    /// The most `current_bytes` has been.
    pub peak_bytes: u64,
    /// Allocations not yet freed.
    pub current_count: u64,
    /// The most `current_count` has been.
    pub peak_count: u64,
    /// Bytes ever allocated.
    pub total_bytes: u64,
    /// Allocations ever made.
    pub total_count: u64,
}

fn give(
    out: *mut *mut memarray_resource,
    inner: Arc<dyn MemoryResource>,
    stats: Option<Arc<StatisticsAdaptor>>,
) -> Result<()> {
    let h = memarray_resource { inner, stats }.into_raw();
    // SAFETY: callers checked `out` before doing any work.
    unsafe { write_out(out, "out", h) }
}

/// # Safety
/// A non-null `r` is a live handle.
unsafe fn upstream(r: *const memarray_resource) -> Result<Arc<dyn MemoryResource>> {
    // SAFETY: the caller's contract.
    Ok(unsafe { memarray_resource::arg(r, "upstream") }?
        .inner
        .clone())
}

/// Ordinary host memory (no driver needed). `*out`: release with
/// [`memarray_resource_free`].
///
/// # Safety
/// `out` is writable.
#[unsafe(no_mangle)]
pub unsafe extern "C" fn memarray_resource_host(
    out: *mut *mut memarray_resource,
) -> memarray_status {
    guard(|| {
        check_out(out, "out")?;
        give(out, Arc::new(HostResource), None)
    })
}

/// Device memory of `device` (`cuMemAlloc` / `cuMemFree` each time).
///
/// # Safety
/// `out` is writable.
#[unsafe(no_mangle)]
pub unsafe extern "C" fn memarray_resource_device(
    device: i32,
    out: *mut *mut memarray_resource,
) -> memarray_status {
    guard(|| {
        check_out(out, "out")?;
        let d = crate::device::device(device)?;
        give(out, Arc::new(DeviceResource::new(&d)), None)
    })
}

/// Page-locked host memory, usable by `device`'s copies at full speed.
///
/// # Safety
/// `out` is writable.
#[unsafe(no_mangle)]
pub unsafe extern "C" fn memarray_resource_pinned(
    device: i32,
    out: *mut *mut memarray_resource,
) -> memarray_status {
    guard(|| {
        check_out(out, "out")?;
        let d = crate::device::device(device)?;
        give(out, Arc::new(PinnedResource::new(&d)), None)
    })
}

/// A caching pool over `upstream`: freed blocks are kept for reuse, and cached bytes
/// beyond `release_threshold` go back upstream after each free. `device`: the device
/// whose streams use the blocks (ordering reuse after their work), or `MEMARRAY_HOST`
/// for a pool of host memory.
///
/// # Safety
/// `upstream` is live; `out` is writable.
#[unsafe(no_mangle)]
pub unsafe extern "C" fn memarray_resource_pool(
    upstream: *const memarray_resource,
    device: i32,
    release_threshold: u64,
    out: *mut *mut memarray_resource,
) -> memarray_status {
    guard(|| {
        check_out(out, "out")?;
        // SAFETY: the caller's contract.
        let up = unsafe { self::upstream(upstream) }?;
        let threshold = usize::try_from(release_threshold).unwrap_or(usize::MAX);
        let pool = if device == crate::MEMARRAY_HOST {
            CachingPool::host(up, threshold)
        } else {
            CachingPool::new(up, &crate::device::device(device)?, threshold)
        };
        give(out, Arc::new(pool), None)
    })
}

/// `upstream` with at most `limit` bytes outstanding: allocations past it fail with
/// `MEMARRAY_STATUS_OUT_OF_MEMORY`.
///
/// # Safety
/// `upstream` is live; `out` is writable.
#[unsafe(no_mangle)]
pub unsafe extern "C" fn memarray_resource_limiting(
    upstream: *const memarray_resource,
    limit: u64,
    out: *mut *mut memarray_resource,
) -> memarray_status {
    guard(|| {
        check_out(out, "out")?;
        // SAFETY: the caller's contract.
        let up = unsafe { self::upstream(upstream) }?;
        give(out, Arc::new(LimitingAdaptor::new(up, limit)), None)
    })
}

/// `upstream`, counting what goes through it (read with
/// [`memarray_resource_get_statistics`]).
///
/// # Safety
/// `upstream` is live; `out` is writable.
#[unsafe(no_mangle)]
pub unsafe extern "C" fn memarray_resource_statistics(
    upstream: *const memarray_resource,
    out: *mut *mut memarray_resource,
) -> memarray_status {
    guard(|| {
        check_out(out, "out")?;
        // SAFETY: the caller's contract.
        let up = unsafe { self::upstream(upstream) }?;
        let s = Arc::new(StatisticsAdaptor::new(up));
        give(out, s.clone(), Some(s))
    })
}

/// The counters of a resource made by [`memarray_resource_statistics`]
/// (`MEMARRAY_STATUS_INVALID_ARGUMENT` for any other).
///
/// # Safety
/// `r` is live; `out` is writable.
#[unsafe(no_mangle)]
pub unsafe extern "C" fn memarray_resource_get_statistics(
    r: *const memarray_resource,
    out: *mut memarray_statistics,
) -> memarray_status {
    guard(|| {
        // SAFETY: the caller's contract.
        let r = unsafe { memarray_resource::arg(r, "resource") }?;
        let s = r.stats.as_ref().ok_or_else(|| {
            Error::arg(format!(
                "{} counts nothing: make it with memarray_resource_statistics",
                r.inner.name()
            ))
        })?;
        let st = s.statistics();
        let v = memarray_statistics {
            current_bytes: st.current_bytes,
            peak_bytes: st.peak_bytes,
            current_count: st.current_count,
            peak_count: st.peak_count,
            total_bytes: st.total_bytes,
            total_count: st.total_count,
        };
        // SAFETY: the caller's contract.
        unsafe { write_out(out, "out", v) }
    })
}

/// Makes `r` the resource new device buffers on `device` come from (arrays already made
/// keep theirs). `r` must serve memory the device can use.
///
/// # Safety
/// `r` is live.
#[unsafe(no_mangle)]
pub unsafe extern "C" fn memarray_set_default_resource(
    device: i32,
    r: *const memarray_resource,
) -> memarray_status {
    guard(|| {
        // SAFETY: the caller's contract.
        let r = unsafe { memarray_resource::arg(r, "resource") }?;
        let d = crate::device::device(device)?;
        memarray_cuda::resource::set_default_resource(&d, r.inner.clone())?;
        Ok(())
    })
}

/// `device`'s current default resource (a new handle to it).
///
/// # Safety
/// `out` is writable.
#[unsafe(no_mangle)]
pub unsafe extern "C" fn memarray_default_resource(
    device: i32,
    out: *mut *mut memarray_resource,
) -> memarray_status {
    guard(|| {
        check_out(out, "out")?;
        let d = crate::device::device(device)?;
        give(out, memarray_cuda::resource::default_resource(&d)?, None)
    })
}

/// Releases a resource handle (NULL: nothing); arrays and adaptors made from it keep it.
///
/// # Safety
/// `r` is NULL or a live handle, not used afterwards.
#[unsafe(no_mangle)]
pub unsafe extern "C" fn memarray_resource_free(r: *mut memarray_resource) {
    // SAFETY: the caller's contract (NULL or a live handle, not used afterwards).
    unsafe { memarray_resource::free(r) }
}
