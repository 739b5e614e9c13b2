//! [`LimitingAdaptor`]: refuses allocations past a byte limit.

use std::ptr::NonNull;
use std::sync::Arc;
use std::sync::atomic::{AtomicU64, Ordering};

use super::{Location, MemoryInfo, MemoryKind, MemoryResource, RawStream};
use crate::error::{CoreError, Result};

/// Wraps a resource and refuses, with [`CoreError::OutOfMemory`], any allocation that
/// would take the bytes live through it past `limit` (RMM's `limiting_resource_adaptor`).
///
/// ```
/// use std::sync::Arc;
/// use memarray_core::{CoreError, HostResource, LimitingAdaptor, MemoryResource};
///
/// let r = LimitingAdaptor::new(Arc::new(HostResource), 1000);
/// let p = r.allocate(600, 8, None)?;
/// assert!(matches!(r.allocate(600, 8, None), Err(CoreError::OutOfMemory { .. })));
/// // SAFETY: p came from r with these arguments and is freed once.
/// unsafe { r.deallocate(p, 600, 8, None) };
/// let q = r.allocate(600, 8, None)?; // room again
/// // SAFETY: as above.
/// unsafe { r.deallocate(q, 600, 8, None) };
/// # Ok::<(), CoreError>(())
/// ```
#[derive(Debug)]
pub struct LimitingAdaptor {
    upstream: Arc<dyn MemoryResource>,
    limit: u64,
    used: AtomicU64,
    name: String,
}

impl LimitingAdaptor {
    /// At most `limit` bytes live through this adaptor at any time.
    pub fn new(upstream: Arc<dyn MemoryResource>, limit: u64) -> Self {
        Self {
            name: super::adaptor_name(&format!("limiting[{limit} bytes]"), upstream.name()),
            upstream,
            limit,
            used: AtomicU64::new(0),
        }
    }

    /// The byte limit.
    pub fn limit(&self) -> u64 {
        self.limit
    }

    /// Bytes live through this adaptor now.
    pub fn used(&self) -> u64 {
        self.used.load(Ordering::Relaxed)
    }

    /// Reserves `bytes` under the limit, or says why not.
    fn reserve(&self, bytes: usize) -> Result<()> {
        let b = bytes as u64;
        self.used
            .fetch_update(Ordering::AcqRel, Ordering::Acquire, |u| {
                u.checked_add(b).filter(|&n| n <= self.limit)
            })
            .map(|_| ())
            .map_err(|used| CoreError::OutOfMemory {
                bytes,
                resource: self.name.clone(),
                reason: format!(
                    "{used} of {} bytes are in use; the limit leaves {}",
                    self.limit,
                    self.limit.saturating_sub(used)
                ),
            })
    }

    fn with_reservation(
        &self,
        bytes: usize,
        f: impl FnOnce() -> Result<NonNull<u8>>,
    ) -> Result<NonNull<u8>> {
        self.reserve(bytes)?;
        f().inspect_err(|_| {
            self.used.fetch_sub(bytes as u64, Ordering::AcqRel);
        })
    }
}

impl MemoryResource for LimitingAdaptor {
    fn allocate(
        &self,
        bytes: usize,
        align: usize,
        stream: Option<RawStream>,
    ) -> Result<NonNull<u8>> {
        self.with_reservation(bytes, || self.upstream.allocate(bytes, align, stream))
    }

    fn allocate_zeroed(
        &self,
        bytes: usize,
        align: usize,
        stream: Option<RawStream>,
    ) -> Result<NonNull<u8>> {
        self.with_reservation(bytes, || {
            self.upstream.allocate_zeroed(bytes, align, stream)
        })
    }

    unsafe fn deallocate(
        &self,
        ptr: NonNull<u8>,
        bytes: usize,
        align: usize,
        stream: Option<RawStream>,
    ) {
        // SAFETY: forwarded; this adaptor allocated through upstream with these arguments.
        unsafe { self.upstream.deallocate(ptr, bytes, align, stream) };
        self.used.fetch_sub(bytes as u64, Ordering::AcqRel);
    }

    forward_to_upstream!();

    fn memory_info(&self) -> Option<MemoryInfo> {
        let used = self.used();
        let upstream_free = self.upstream.memory_info().map_or(u64::MAX, |i| i.free);
        Some(MemoryInfo {
            free: self.limit.saturating_sub(used).min(upstream_free),
            total: self.limit,
        })
    }
}
