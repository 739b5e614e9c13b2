//! [`StatisticsAdaptor`]: counts what passes through to any resource.

use std::ptr::NonNull;
use std::sync::Arc;
use std::sync::atomic::{AtomicU64, Ordering};

use super::{Location, MemoryInfo, MemoryKind, MemoryResource, RawStream, Source};
use crate::error::Result;

/// Current, peak and total bytes and allocation counts of a resource.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct Statistics {
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

/// Wraps a resource and counts its allocations (RMM's `statistics_resource_adaptor`).
///
/// Lock-free: two atomic read-modify-writes per call and two relaxed ones per source (about
/// 15 ns on a current x86 core; see benches/resources.rs for the overhead over the pool).
///
/// ```
/// use std::sync::Arc;
/// use memarray_core::{HostResource, MemoryResource, StatisticsAdaptor};
///
/// let stats = StatisticsAdaptor::new(Arc::new(HostResource));
/// let p = stats.allocate(4096, 64, None)?;
/// assert_eq!(stats.statistics().current_bytes, 4096);
/// // SAFETY: p came from this resource with these arguments and is freed once.
/// unsafe { stats.deallocate(p, 4096, 64, None) };
/// let s = stats.statistics();
/// assert_eq!((s.current_bytes, s.peak_bytes, s.total_count), (0, 4096, 1));
/// # Ok::<(), memarray_core::CoreError>(())
/// ```
#[derive(Debug)]
pub struct StatisticsAdaptor {
    upstream: Arc<dyn MemoryResource>,
    name: String,
    // Totals and frees only: current = total - freed. Two relaxed read-modify-writes per
    // call (the floor for exact counts shared by threads); peaks are raised with a
    // compare-free load first, so the common case adds plain loads only.
    total_bytes: AtomicU64,
    total_count: AtomicU64,
    freed_bytes: AtomicU64,
    freed_count: AtomicU64,
    peak_bytes: AtomicU64,
    peak_count: AtomicU64,
    /// Per source ([`Source::index`]): bytes and counts allocated and freed.
    by_source: [SourceCounters; Source::MAX],
}

#[derive(Debug, Default)]
struct SourceCounters {
    total_bytes: AtomicU64,
    total_count: AtomicU64,
    freed_bytes: AtomicU64,
    freed_count: AtomicU64,
}

/// What one [`Source`] has allocated through a [`StatisticsAdaptor`].
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct SourceStatistics {
    /// Bytes allocated and not yet freed.
    pub current_bytes: u64,
    /// Allocations not yet freed.
    pub current_count: u64,
    /// Bytes ever allocated.
    pub total_bytes: u64,
    /// Allocations ever made.
    pub total_count: u64,
}

impl StatisticsAdaptor {
    /// Counts what goes through to `upstream`.
    pub fn new(upstream: Arc<dyn MemoryResource>) -> Self {
        Self {
            name: super::adaptor_name("statistics", upstream.name()),
            upstream,
            total_bytes: AtomicU64::new(0),
            total_count: AtomicU64::new(0),
            freed_bytes: AtomicU64::new(0),
            freed_count: AtomicU64::new(0),
            peak_bytes: AtomicU64::new(0),
            peak_count: AtomicU64::new(0),
            by_source: Default::default(),
        }
    }

    /// The counters of each source that has allocated through the adaptor (allocations
    /// and frees are attributed to the thread's
    /// [`current_source`](super::current_source), memarray's own outside any glue).
    pub fn by_source(&self) -> Vec<(Source, SourceStatistics)> {
        Source::all()
            .into_iter()
            .zip(&self.by_source)
            .filter_map(|(s, c)| {
                let freed_bytes = c.freed_bytes.load(Ordering::Acquire);
                let freed_count = c.freed_count.load(Ordering::Acquire);
                let total_bytes = c.total_bytes.load(Ordering::Acquire);
                let total_count = c.total_count.load(Ordering::Acquire);
                (total_count > 0).then(|| {
                    (
                        s,
                        SourceStatistics {
                            current_bytes: total_bytes.saturating_sub(freed_bytes),
                            current_count: total_count.saturating_sub(freed_count),
                            total_bytes,
                            total_count,
                        },
                    )
                })
            })
            .collect()
    }

    fn source_counters(&self) -> &SourceCounters {
        let s = super::current_source().unwrap_or(Source::MEMARRAY);
        &self.by_source[s.index()]
    }

    /// A snapshot of the counters (exact whenever no call is in flight).
    pub fn statistics(&self) -> Statistics {
        // Frees are read first: a free counted here has its allocation counted too.
        let freed_bytes = self.freed_bytes.load(Ordering::Acquire);
        let freed_count = self.freed_count.load(Ordering::Acquire);
        let total_bytes = self.total_bytes.load(Ordering::Acquire);
        let total_count = self.total_count.load(Ordering::Acquire);
        let current_bytes = total_bytes.saturating_sub(freed_bytes);
        let current_count = total_count.saturating_sub(freed_count);
        Statistics {
            current_bytes,
            peak_bytes: self.peak_bytes.load(Ordering::Relaxed).max(current_bytes),
            current_count,
            peak_count: self.peak_count.load(Ordering::Relaxed).max(current_count),
            total_bytes,
            total_count,
        }
    }

    /// Resets the peaks to the current values.
    pub fn reset_peaks(&self) {
        let s = self.statistics();
        self.peak_bytes.store(s.current_bytes, Ordering::Relaxed);
        self.peak_count.store(s.current_count, Ordering::Relaxed);
    }

    /// The wrapped resource.
    pub fn upstream(&self) -> &Arc<dyn MemoryResource> {
        &self.upstream
    }

    fn counted(&self, bytes: usize) {
        let b = bytes as u64;
        let c = self.source_counters();
        c.total_bytes.fetch_add(b, Ordering::Relaxed);
        c.total_count.fetch_add(1, Ordering::Relaxed);
        let total = self.total_bytes.fetch_add(b, Ordering::AcqRel) + b;
        let count = self.total_count.fetch_add(1, Ordering::AcqRel) + 1;
        let bytes_now = total.saturating_sub(self.freed_bytes.load(Ordering::Acquire));
        let count_now = count.saturating_sub(self.freed_count.load(Ordering::Acquire));
        if bytes_now > self.peak_bytes.load(Ordering::Relaxed) {
            self.peak_bytes.fetch_max(bytes_now, Ordering::Relaxed);
        }
        if count_now > self.peak_count.load(Ordering::Relaxed) {
            self.peak_count.fetch_max(count_now, Ordering::Relaxed);
        }
    }
}

impl MemoryResource for StatisticsAdaptor {
    fn allocate(
        &self,
        bytes: usize,
        align: usize,
        stream: Option<RawStream>,
    ) -> Result<NonNull<u8>> {
        let p = self.upstream.allocate(bytes, align, stream)?;
        self.counted(bytes);
        Ok(p)
    }

    fn allocate_zeroed(
        &self,
        bytes: usize,
        align: usize,
        stream: Option<RawStream>,
    ) -> Result<NonNull<u8>> {
        let p = self.upstream.allocate_zeroed(bytes, align, stream)?;
        self.counted(bytes);
        Ok(p)
    }

    unsafe fn deallocate(
        &self,
        ptr: NonNull<u8>,
        bytes: usize,
        align: usize,
        stream: Option<RawStream>,
    ) {
        self.freed_bytes.fetch_add(bytes as u64, Ordering::AcqRel);
        self.freed_count.fetch_add(1, Ordering::AcqRel);
        let c = self.source_counters();
        c.freed_bytes.fetch_add(bytes as u64, Ordering::Relaxed);
        c.freed_count.fetch_add(1, Ordering::Relaxed);
        // SAFETY: forwarded; the caller's contract is upstream's (this adaptor allocated
        // through upstream with the same arguments).
        unsafe { self.upstream.deallocate(ptr, bytes, align, stream) }
    }

    forward_to_upstream!();

    fn memory_info(&self) -> Option<MemoryInfo> {
        self.upstream.memory_info()
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::HostResource;
    use crate::resource::with_source;

    #[test]
    fn counts_are_kept_per_source() {
        let s = StatisticsAdaptor::new(Arc::new(HostResource));
        let a = s.allocate(100, 8, None).unwrap();
        let b = with_source(Source::register("torch").unwrap(), || {
            s.allocate(300, 8, None).unwrap()
        });
        let c = with_source(Source::register("torch").unwrap(), || {
            s.allocate(5, 8, None).unwrap()
        });
        let rows = s.by_source();
        assert_eq!(
            rows.iter()
                .map(|(src, c)| (*src, c.current_bytes, c.current_count))
                .collect::<Vec<_>>(),
            [
                (Source::MEMARRAY, 100, 1),
                (Source::register("torch").unwrap(), 305, 2)
            ]
        );
        // SAFETY: each pointer came from `s` with these arguments and is freed once.
        unsafe {
            with_source(Source::register("torch").unwrap(), || {
                s.deallocate(b, 300, 8, None)
            });
            s.deallocate(a, 100, 8, None);
        }
        let torch = s
            .by_source()
            .into_iter()
            .find(|r| r.0 == Source::register("torch").unwrap())
            .unwrap()
            .1;
        assert_eq!(
            (torch.current_bytes, torch.total_bytes, torch.total_count),
            (5, 305, 2)
        );
        assert_eq!(s.statistics().current_bytes, 5);
        // SAFETY: as above.
        unsafe {
            with_source(Source::register("torch").unwrap(), || {
                s.deallocate(c, 5, 8, None)
            })
        };
        assert!(s.by_source().iter().all(|(_, c)| c.current_bytes == 0));
    }
}

#[cfg(test)]
mod depth_tests {
    use super::*;
    use crate::resource::{HostResource, RetryAdaptor};

    #[test]
    fn names_are_bounded_so_memory_is_linear_in_depth() {
        let mut r: Arc<dyn MemoryResource> = Arc::new(HostResource);
        let mut total = 0usize;
        for i in 0..4000 {
            r = if i % 2 == 0 {
                Arc::new(StatisticsAdaptor::new(r))
            } else {
                Arc::new(RetryAdaptor::new(r))
            };
            assert!(r.name().len() <= 140, "depth {i}: {} bytes", r.name().len());
            total += r.name().len();
        }
        assert!(total < 4000 * 140);
        // The outermost and innermost resources stay named.
        assert!(
            r.name().starts_with("retry(statistics(retry("),
            "{}",
            r.name()
        );
        assert!(r.name().contains("host"), "{}", r.name());
    }
}
