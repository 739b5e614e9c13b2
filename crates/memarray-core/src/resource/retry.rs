//! [`RetryAdaptor`]: on out-of-memory, release cached memory below and try once more.

use std::ptr::NonNull;
use std::sync::Arc;

use super::{Location, MemoryInfo, MemoryKind, MemoryResource, RawStream};
use crate::error::{CoreError, Result};

/// Wraps a resource; when an allocation fails with [`CoreError::OutOfMemory`], asks the
/// resources below to give their cached blocks back ([`MemoryResource::release_cached`])
/// and retries once. Any other error, or a second out-of-memory, is returned as is.
///
/// ```
/// use std::sync::Arc;
/// use memarray_core::{HostResource, LimitingAdaptor, MemoryResource, RetryAdaptor};
///
/// let r = RetryAdaptor::new(Arc::new(LimitingAdaptor::new(Arc::new(HostResource), 100)));
/// assert!(r.allocate(50, 8, None).is_ok_and(|p| {
///     // SAFETY: p came from r with these arguments and is freed once.
///     unsafe { r.deallocate(p, 50, 8, None) };
///     true
/// }));
/// assert!(r.allocate(500, 8, None).is_err(), "nothing cached to release: still refused");
/// assert_eq!(r.retries(), 1);
/// ```
#[derive(Debug)]
pub struct RetryAdaptor {
    upstream: Arc<dyn MemoryResource>,
    retries: std::sync::atomic::AtomicU64,
    name: String,
}

impl RetryAdaptor {
    /// Retries `upstream`'s out-of-memory failures once after releasing cached memory.
    pub fn new(upstream: Arc<dyn MemoryResource>) -> Self {
        Self {
            name: super::adaptor_name("retry", upstream.name()),
            upstream,
            retries: Default::default(),
        }
    }

    /// How many allocations were retried.
    pub fn retries(&self) -> u64 {
        self.retries.load(std::sync::atomic::Ordering::Relaxed)
    }

    fn retry(&self, f: impl Fn() -> Result<NonNull<u8>>) -> Result<NonNull<u8>> {
        match f() {
            Err(CoreError::OutOfMemory { .. }) => {
                self.retries
                    .fetch_add(1, std::sync::atomic::Ordering::Relaxed);
                self.upstream.release_cached();
                f()
            }
            other => other,
        }
    }
}

impl MemoryResource for RetryAdaptor {
    fn allocate(
        &self,
        bytes: usize,
        align: usize,
        stream: Option<RawStream>,
    ) -> Result<NonNull<u8>> {
        self.retry(|| self.upstream.allocate(bytes, align, stream))
    }

    fn allocate_zeroed(
        &self,
        bytes: usize,
        align: usize,
        stream: Option<RawStream>,
    ) -> Result<NonNull<u8>> {
        self.retry(|| self.upstream.allocate_zeroed(bytes, align, stream))
    }

    unsafe fn deallocate(
        &self,
        ptr: NonNull<u8>,
        bytes: usize,
        align: usize,
        stream: Option<RawStream>,
    ) {
        // SAFETY: forwarded; this adaptor allocated through upstream with these arguments.
        unsafe { self.upstream.deallocate(ptr, bytes, align, stream) }
    }

    forward_to_upstream!();

    fn memory_info(&self) -> Option<MemoryInfo> {
        self.upstream.memory_info()
    }
}
