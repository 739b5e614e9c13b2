//! The per-device pinned pool, its optional limit (`MEMARRAY_PINNED_LIMIT`) and the
//! pageable fallback of staging buffers when pinning fails, counted.
//!
//! Pinned memory is taken from the whole system: the kernel may refuse to lock more
//! (container limits, a machine short of memory), and a user may cap what memarray pins.
//! Staging buffers (the slots of staged copies, `move_many`'s packing buffer) and host
//! copies of the automatic kind then come from pageable memory: copies stay correct and
//! run at pageable speed, and [`pinned_fallbacks`] says how often that happened. An
//! explicit request for pinned memory (`host_memory="pinned"`, the `Pinned` resource)
//! fails instead.

use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, OnceLock};

use memarray_core::{HostBuffer, HostResource, LimitingAdaptor, MemoryResource};

use super::{CachingPool, PinnedResource};
use crate::device::Device;
use crate::error::{Result, SettingError};
use crate::per_device::PerDevice;

/// Bytes of pinned memory the per-device pinned pool keeps cached at most: pinning is
/// slow (cuMemHostAlloc of 1 MiB: about 40 us; torch caches pinned blocks too), but
/// pinned memory is taken from the whole system, so the cache is bounded.
pub const PINNED_POOL_KEEP: usize = 1 << 30;

/// The variable that caps the pinned memory each device's pinned pool holds (in use and
/// cached; a byte count such as `2GiB`, read once). Unset: no cap but the system's.
pub const PINNED_LIMIT_ENV: &str = "MEMARRAY_PINNED_LIMIT";

/// The cap `MEMARRAY_PINNED_LIMIT` sets, `None` when unset.
///
/// # Errors
/// [`SettingError::Env`] for a value that is not a byte count (or not UTF-8).
pub fn pinned_limit_from_env() -> std::result::Result<Option<u64>, SettingError> {
    pinned_limit(crate::env::var(PINNED_LIMIT_ENV)?)
}

fn pinned_limit(value: Option<String>) -> std::result::Result<Option<u64>, SettingError> {
    crate::env::bytes_of(PINNED_LIMIT_ENV, value.as_deref())
}

/// The pinned caching pool of `device` (portable pinned memory, [`CachingPool`] over
/// [`PinnedResource`], at most [`PINNED_POOL_KEEP`] bytes cached, within
/// [`PINNED_LIMIT_ENV`]'s cap when set), made once per device: where pinned host buffers
/// of arrays and staging buffers come from.
pub fn pinned_pool(device: &Arc<Device>) -> Arc<dyn MemoryResource> {
    // Per device, lock-free once made: `host_memory="pinned"` looks its pool up on every
    // allocation.
    static POOLS: PerDevice<OnceLock<Arc<dyn MemoryResource>>> = PerDevice::new();
    static LIMIT: OnceLock<Option<u64>> = OnceLock::new();
    POOLS
        .get(device.id())
        .get_or_init(|| {
            // A bad value is reported where the environment is checked (`check_env`, at
            // the Python package's import); here it leaves pinning uncapped.
            let limit = *LIMIT.get_or_init(|| pinned_limit_from_env().ok().flatten());
            let pinned: Arc<dyn MemoryResource> = Arc::new(PinnedResource::new(device));
            let upstream = match limit {
                Some(bytes) => Arc::new(LimitingAdaptor::new(pinned, bytes)),
                None => pinned,
            };
            Arc::new(CachingPool::new(upstream, device, PINNED_POOL_KEEP))
        })
        .clone()
}

/// Host buffers that were to be pinned and came from pageable memory instead, because
/// pinning failed (the system's limit or [`PINNED_LIMIT_ENV`]'s).
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct PinnedFallbacks {
    /// Buffers served pageable.
    pub count: u64,
    /// Their bytes.
    pub bytes: u64,
}

static FALLBACKS: AtomicU64 = AtomicU64::new(0);
static FALLBACK_BYTES: AtomicU64 = AtomicU64::new(0);

/// The process's pinned-to-pageable fallbacks so far.
pub fn pinned_fallbacks() -> PinnedFallbacks {
    PinnedFallbacks {
        count: FALLBACKS.load(Ordering::Relaxed),
        bytes: FALLBACK_BYTES.load(Ordering::Relaxed),
    }
}

/// Counts one buffer of `bytes` served pageable instead of pinned.
pub(crate) fn count_fallback(bytes: usize) {
    FALLBACKS.fetch_add(1, Ordering::Relaxed);
    FALLBACK_BYTES.fetch_add(bytes as u64, Ordering::Relaxed);
}

/// A staging buffer of `bytes` for copies to and from `device`: from its pinned pool,
/// or pageable memory (counted) when pinning fails.
///
/// # Safety
/// 1. The caller writes every byte it reads (the buffer is uninitialised).
pub(crate) unsafe fn staging_host_buffer(device: &Arc<Device>, bytes: usize) -> Result<HostBuffer> {
    // SAFETY: item 1, passed on.
    unsafe { staging_from(pinned_pool(device), bytes) }
}

/// [`staging_host_buffer`] from `pinned`.
///
/// # Safety
/// As [`staging_host_buffer`].
unsafe fn staging_from(pinned: Arc<dyn MemoryResource>, bytes: usize) -> Result<HostBuffer> {
    // SAFETY: item 1, passed on.
    match unsafe { HostBuffer::uninit_in(bytes, pinned) } {
        Ok(b) => Ok(b),
        Err(_) => {
            count_fallback(bytes);
            // SAFETY: as above.
            Ok(unsafe { HostBuffer::uninit_in(bytes, Arc::new(HostResource))? })
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use memarray_core::MemoryKind;

    #[test]
    fn a_refused_pinned_allocation_stages_through_counted_pageable_memory() {
        // A stand-in for the pinned pool that can pin 1 KiB.
        let pinned: Arc<dyn MemoryResource> =
            Arc::new(LimitingAdaptor::new(Arc::new(HostResource), 1024));
        let before = pinned_fallbacks();
        // SAFETY: the test writes before it reads.
        let fits = unsafe { staging_from(pinned.clone(), 1024) }.unwrap();
        assert_eq!(
            pinned_fallbacks(),
            before,
            "a buffer that fits is not a fallback"
        );
        // SAFETY: as above.
        let over = unsafe { staging_from(pinned.clone(), 4096) }.unwrap();
        let after = pinned_fallbacks();
        // Other tests may count fallbacks of their own meanwhile: at least this one.
        assert!(after.count > before.count, "{before:?} -> {after:?}");
        assert!(
            after.bytes >= before.bytes + 4096,
            "{before:?} -> {after:?}"
        );
        assert_eq!(over.len(), 4096);
        assert_eq!(over.kind(), MemoryKind::Host);
        // SAFETY: 4096 writable bytes, read back after writing.
        let s = unsafe { std::slice::from_raw_parts_mut(over.as_mut_ptr(), 4096) };
        s.fill(7);
        assert!(s.iter().all(|&b| b == 7));
        drop(fits);
    }

    #[test]
    fn the_limit_variable_takes_byte_counts_and_names_itself_when_refused() {
        assert_eq!(pinned_limit(Some("64 MiB".into())).unwrap(), Some(64 << 20));
        let e = pinned_limit(Some("lots".into())).unwrap_err().to_string();
        assert!(e.contains(PINNED_LIMIT_ENV) && e.contains("lots"), "{e}");
        assert_eq!(pinned_limit(None).unwrap(), None);
    }
}
