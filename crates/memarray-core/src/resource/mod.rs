//! The [`MemoryResource`] trait: one allocation interface for every kind of memory.
//!
//! Modelled on RMM's `device_memory_resource` and NBEP 7: allocate and deallocate take a
//! size, an alignment and an optional stream (stream-ordered pools use it; others ignore
//! it). Host memory lives here; memarray-cuda implements device, pinned, managed and pool
//! resources on the same trait.

/// The [`MemoryResource`] methods an adaptor passes straight to `self.upstream` (and its
/// `name` field).
macro_rules! forward_to_upstream {
    () => {
        fn kind(&self) -> MemoryKind {
            self.upstream.kind()
        }

        fn is_accessible_from(&self, location: Location) -> bool {
            self.upstream.is_accessible_from(location)
        }

        fn device_id(&self) -> Option<u32> {
            self.upstream.device_id()
        }

        fn release_cached(&self) -> usize {
            self.upstream.release_cached()
        }

        fn name(&self) -> &str {
            &self.name
        }
    };
}

pub mod events;
mod file;
mod foreign;
mod host;
pub mod ledger;
mod limiting;
mod logging;
pub mod pressure;
mod range;
mod retry;
mod source;
mod statistics;
mod tracking;
pub mod watermark;

use std::fmt;
use std::ptr::NonNull;

pub use file::{FileMode, FileResource, open_regular};
pub use foreign::ForeignMemory;
pub use host::{HOST_ALIGN, HostResource};
pub use ledger::{BudgetScope, LibraryUsage, deallocate_counted};
pub use limiting::LimitingAdaptor;
pub use logging::{LOG_HEADER, LoggingAdaptor};
pub use pressure::{
    BudgetHook, CaptureProbe, PressureStatistics, SpillHook, UserReliever, UserRelieverStatistics,
    add_reliever, allocate_with_relief, pressure_statistics, remove_reliever, set_capture_probe,
    set_spill_hooks, spilling,
};
pub use range::{GrowableRange, HostRange};
pub use retry::RetryAdaptor;
pub use source::{Source, current_source, with_source};
pub use statistics::{SourceStatistics, Statistics, StatisticsAdaptor};
pub use tracking::{
    Allocation, StackProvider, TRACE_EVENTS, TimelinePoint, TraceEvent, TrackingAdaptor,
    set_stack_provider,
};

use crate::error::Result;

/// The longest upstream name an adaptor's name spells out in full.
pub const MAX_UPSTREAM_NAME: usize = 120;

/// An adaptor's name: `kind(upstream)`, with `upstream` (the resource below's name)
/// shortened in its middle past [`MAX_UPSTREAM_NAME`] bytes, keeping the outermost and the
/// innermost resources. Each name is bounded, so a stack of adaptors holds memory linear
/// in its depth (spelled out whole, 4,000 nested adaptors held 253 MiB of names).
///
/// ```
/// use memarray_core::resource::adaptor_name;
///
/// assert_eq!(adaptor_name("pool", "device:0"), "pool(device:0)");
/// let deep = "statistics(".repeat(50) + "device:0" + &")".repeat(50);
/// let name = adaptor_name("pool", &deep);
/// assert!(name.len() < 140 && name.starts_with("pool(statistics(") && name.contains("device:0"));
/// ```
pub fn adaptor_name(kind: &str, upstream: &str) -> String {
    format!("{kind}({})", shorten(upstream, MAX_UPSTREAM_NAME))
}

/// `s` cut to about `max` bytes in its middle (`...`), at character boundaries. A nested
/// name's closing parentheses are dropped first, so its tail is the innermost resource.
fn shorten(s: &str, max: usize) -> std::borrow::Cow<'_, str> {
    if s.len() <= max {
        return s.into();
    }
    let core = s.trim_end_matches(')');
    let half = max / 2;
    let mut head = half.min(core.len());
    while !core.is_char_boundary(head) {
        head -= 1;
    }
    let mut tail = core.len().saturating_sub(half).max(head);
    while !core.is_char_boundary(tail) {
        tail += 1;
    }
    format!("{}...{}", &core[..head], &core[tail..]).into()
}

/// Where an array's current data lives.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub enum Location {
    /// Host memory (pageable, pinned or managed).
    Host,
    /// CUDA device memory on this device ordinal.
    Device(u32),
}

impl fmt::Display for Location {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            Location::Host => f.write_str("host"),
            Location::Device(id) => write!(f, "cuda:{id}"),
        }
    }
}

/// The kind of memory a resource hands out.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
#[non_exhaustive]
pub enum MemoryKind {
    /// Ordinary pageable host memory.
    Host,
    /// Page-locked host memory, registered with the CUDA driver.
    Pinned,
    /// Device memory of one device.
    Device,
    /// CUDA managed (unified) memory, reachable from host and devices.
    Managed,
    /// A memory-mapped file on the host.
    File,
}

/// An opaque stream handle (a `CUstream` as an integer) for stream-ordered allocators.
///
/// Core never dereferences it. There is deliberately no conversion from a literal 0:
/// use [`RawStream::LEGACY`] or [`RawStream::PER_THREAD`] to name the default streams.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub struct RawStream(usize);

impl RawStream {
    /// CUDA's legacy default stream (`CU_STREAM_LEGACY`).
    pub const LEGACY: RawStream = RawStream(1);
    /// CUDA's per-thread default stream (`CU_STREAM_PER_THREAD`).
    pub const PER_THREAD: RawStream = RawStream(2);

    /// Wraps a handle value.
    ///
    /// # Safety
    /// 1. `handle` is a live stream of the context the memory belongs to, or one of the
    ///    special values 1 (legacy) and 2 (per-thread), for as long as it is used.
    pub unsafe fn from_raw(handle: usize) -> Self {
        RawStream(handle)
    }

    /// The handle value.
    pub fn raw(self) -> usize {
        self.0
    }
}

/// Free and total bytes of the memory a resource draws from.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct MemoryInfo {
    /// Bytes free.
    pub free: u64,
    /// Bytes in all.
    pub total: u64,
}

/// A source of memory. Implementations are thread-safe.
///
/// Pointers are addresses in the resource's memory kind: device resources return device
/// addresses that the host must not dereference.
pub trait MemoryResource: Send + Sync + fmt::Debug {
    /// Allocates `bytes` bytes aligned to `align` (a power of two). Zero bytes still gives
    /// a valid, aligned pointer that must be deallocated.
    fn allocate(
        &self,
        bytes: usize,
        align: usize,
        stream: Option<RawStream>,
    ) -> Result<NonNull<u8>>;

    /// Like [`MemoryResource::allocate`], with the memory zeroed (host resources use
    /// zeroed pages; device resources enqueue a memset on `stream`).
    fn allocate_zeroed(
        &self,
        bytes: usize,
        align: usize,
        stream: Option<RawStream>,
    ) -> Result<NonNull<u8>>;

    /// Returns memory to the resource.
    ///
    /// # Safety
    /// 1. `ptr` came from `allocate` or `allocate_zeroed` of this resource with the same
    ///    `bytes` and `align`, and has not been deallocated.
    /// 2. No access to the memory is pending or follows, except work ordered on `stream`
    ///    before the deallocation (stream-ordered resources).
    unsafe fn deallocate(
        &self,
        ptr: NonNull<u8>,
        bytes: usize,
        align: usize,
        stream: Option<RawStream>,
    );

    /// The kind of memory this resource serves.
    fn kind(&self) -> MemoryKind;

    /// Whether code running at `location` can dereference this resource's pointers.
    fn is_accessible_from(&self, location: Location) -> bool;

    /// Free and total bytes, where the resource knows them.
    fn memory_info(&self) -> Option<MemoryInfo> {
        None
    }

    /// The CUDA device whose memory this is, for device-bound resources; `None` for host
    /// memory (pinned and managed included).
    fn device_id(&self) -> Option<u32> {
        None
    }

    /// Gives cached memory back to the resource below (pools; adaptors forward the call)
    /// and returns the bytes released. Resources that cache nothing return 0.
    fn release_cached(&self) -> usize {
        0
    }

    /// A short name for messages and logs.
    fn name(&self) -> &str;
}
