//! [`TrackingAdaptor`]: every live allocation of a resource, with where it came from (the
//! Rust side of "trace and plot").

use std::collections::{HashMap, VecDeque};
use std::hash::{BuildHasherDefault, Hasher};
use std::ptr::NonNull;
use std::sync::{Arc, Mutex, OnceLock, PoisonError};

use super::{Location, MemoryInfo, MemoryKind, MemoryResource, RawStream, Source};
use crate::error::Result;

mod clock;
use clock::Clock;

/// Captures the caller's stack in the host language (the Python bindings install one that
/// returns the Python stack, innermost frame last), for [`TrackingAdaptor::with_stacks`].
pub type StackProvider = fn() -> Option<String>;

static STACKS: OnceLock<StackProvider> = OnceLock::new();

/// Installs the process's [`StackProvider`] (the first call wins; returns whether this one
/// did).
pub fn set_stack_provider(provider: StackProvider) -> bool {
    STACKS.set(provider).is_ok()
}

/// Addresses are distinct and 256-byte aligned: a multiply spreads them, where SipHash
/// would cost more than the rest of the bookkeeping.
#[derive(Default)]
struct AddressHasher(u64);

impl Hasher for AddressHasher {
    fn finish(&self) -> u64 {
        self.0
    }

    fn write(&mut self, bytes: &[u8]) {
        for b in bytes {
            self.0 = (self.0 << 8 | u64::from(*b)).wrapping_mul(0x9E37_79B9_7F4A_7C15);
        }
    }

    fn write_usize(&mut self, n: usize) {
        self.0 = (n as u64 >> 4).wrapping_mul(0x9E37_79B9_7F4A_7C15);
    }
}

type AddressMap<V> = HashMap<usize, V, BuildHasherDefault<AddressHasher>>;

/// One live allocation.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Allocation {
    /// Its address.
    pub address: usize,
    /// Bytes.
    pub size: usize,
    /// The stream it was allocated on, if any (a `CUstream` as an integer).
    pub stream: Option<usize>,
    /// The device of the resource below, `None` for host memory.
    pub device: Option<u32>,
    /// Who asked for it: the thread's [`current_source`](super::current_source) (the
    /// glue of torch, CuPy ... sets it), else the adaptor's source.
    pub source: Source,
    /// Nanoseconds since the adaptor was made: to the kernel's tick (1-4 ms) unless stacks
    /// or backtraces are on (see [`TrackingAdaptor`]).
    pub time_ns: u64,
    /// The host-language stack (Python's, innermost last) where it was made, when stacks
    /// are on and a provider is installed.
    pub stack: Option<String>,
    /// The Rust backtrace where it was made, when backtraces are on.
    pub backtrace: Option<String>,
}

/// One allocation or free of a trace ([`TrackingAdaptor::trace`]).
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct TraceEvent {
    /// Nanoseconds since the adaptor was made.
    pub time_ns: u64,
    /// `false` for an allocation, `true` for a free.
    pub free: bool,
    /// The address.
    pub address: usize,
    /// Bytes.
    pub size: usize,
    /// The stream, if any (a `CUstream` as an integer).
    pub stream: Option<usize>,
    /// The device of the resource below, `None` for host memory.
    pub device: Option<u32>,
    /// Who asked for it (for a free: who had allocated it).
    pub source: Source,
    /// The host-language stack of an allocation (frees carry none).
    pub stack: Option<String>,
}

/// Most trace events kept; the oldest go first.
pub const TRACE_EVENTS: usize = 1 << 16;

/// Wraps a resource and keeps every live allocation with its size, stream, device, source
/// and (when [`with_stacks`](Self::with_stacks) / [`with_backtraces`](Self::with_backtraces)
/// are on) the Python stack and Rust backtrace where it was made, plus a timeline of live
/// bytes per source: what `memarray.resources.snapshot()` reads.
///
/// A mutex-guarded map keyed by address with a multiplicative hash; the measured cost over
/// the bare pool is in docs/memory-manager.md. Stacks and backtraces cost microseconds each.
/// Times come from the kernel's coarse clock (1-4 ms resolution, about a third of the
/// time-stamp counter's cost on virtual machines) unless stacks or backtraces are on; then
/// from the precise one. Allocations keep their order either way.
///
/// ```
/// use std::sync::Arc;
/// use memarray_core::{HostResource, MemoryResource, Source, TrackingAdaptor};
///
/// let t = TrackingAdaptor::new(Arc::new(HostResource), Source::MEMARRAY);
/// let p = t.allocate(4096, 64, None)?;
/// let live = t.live();
/// assert_eq!((live.len(), live[0].size, live[0].source), (1, 4096, Source::MEMARRAY));
/// // SAFETY: p came from this resource with these arguments and is freed once.
/// unsafe { t.deallocate(p, 4096, 64, None) };
/// assert!(t.live().is_empty());
/// assert_eq!(t.timeline().last().map(|(_, bytes)| bytes[Source::MEMARRAY.index()]), Some(0));
/// # Ok::<(), memarray_core::CoreError>(())
/// ```
#[derive(Debug)]
pub struct TrackingAdaptor {
    upstream: Arc<dyn MemoryResource>,
    name: String,
    source: Source,
    device: Option<u32>,
    stacks: bool,
    backtraces: bool,
    clock: Clock,
    state: Mutex<State>,
    /// The last memory event before the adaptor was made.
    first_event: u64,
}

/// One point of the timeline: nanoseconds since the adaptor was made and the live bytes of
/// each source (indexed by [`Source::index`]) after the call.
pub type TimelinePoint = (u64, [usize; Source::MAX]);

/// What the map keeps per live allocation: small, so the hot path moves 32 bytes (the
/// stack and backtrace, when on, live in `State::extras`).
#[derive(Clone, Copy, Debug)]
struct Entry {
    size: usize,
    stream: Option<usize>,
    ticks: u64,
    source: Source,
}

#[derive(Debug, Default)]
struct State {
    live: AddressMap<Entry>,
    /// With stacks or backtraces on: `(stack, backtrace)` of each live allocation.
    extras: AddressMap<(Option<String>, Option<String>)>,
    live_bytes: [usize; Source::MAX],
    /// With stacks on: live bytes per (source, stack), kept as allocations come and go, so
    /// a monitor reads the sites without walking every allocation.
    by_stack: HashMap<(Source, String), usize>,
    timeline: Vec<TimelinePoint>,
    /// Ticks a timeline point spans: an event closer than this to where the last point's
    /// span began updates that point instead of adding one. [`MIN_SPAN_NS`] at first, then
    /// at least the kept points' mean spacing after each thinning.
    spacing: u64,
    /// Where the last point's span began.
    span_start: u64,
    /// With stacks on: the last [`TRACE_EVENTS`] allocations and frees.
    trace: VecDeque<TraceEvent>,
    /// The last event's ticks ([`State::stamp`]).
    last: u64,
}

impl State {
    /// `t`, or one tick past the last event's when the clock has not moved past it (the
    /// coarse clock's ticks advance once per kernel tick): events keep their order in
    /// time, so [`TrackingAdaptor::live`] lists allocations oldest first.
    fn stamp(&mut self, t: u64) -> u64 {
        self.last = t.max(self.last + 1);
        self.last
    }

    fn trace(&mut self, e: TraceEvent) {
        if self.trace.len() == TRACE_EVENTS {
            self.trace.pop_front();
        }
        self.trace.push_back(e);
    }
}

/// Most timeline points kept; older ones are thinned to every other point when it fills,
/// and later points then span at least the kept points' mean spacing.
const TIMELINE_POINTS: usize = 1 << 16;

/// The shortest span of one timeline point (with the coarse clock, at least its tick):
/// events closer together (a loop of allocations and frees) update one point in place,
/// holding the live bytes after the latest, instead of writing a 72-byte point each (at 1 MiB, a Python allocate + free 1.38x the bare pool's
/// with a point per event, 1.08x without points).
pub const MIN_SPAN_NS: u64 = 10_000;

impl TrackingAdaptor {
    /// Tracks `upstream`'s allocations; those made outside any library's glue are
    /// attributed to `source`.
    pub fn new(upstream: Arc<dyn MemoryResource>, source: Source) -> Self {
        Self {
            name: super::adaptor_name("tracking", upstream.name()),
            device: upstream.device_id(),
            upstream,
            source,
            stacks: false,
            backtraces: false,
            clock: Clock::new(false),
            state: Mutex::new(State {
                spacing: MIN_SPAN_NS,
                ..State::default()
            }),
            first_event: super::events::last_event(),
        }
    }

    /// Records the Rust backtrace of every allocation (costly: for finding leaks).
    pub fn with_backtraces(mut self, on: bool) -> Self {
        self.backtraces = on;
        self.precise_clock();
        self
    }

    /// Records the host-language stack of every allocation through the installed
    /// [`StackProvider`] (none installed: no stacks).
    pub fn with_stacks(mut self, on: bool) -> Self {
        self.stacks = on;
        self.precise_clock();
        self
    }

    /// With stacks or backtraces on, times come from the precise clock (each allocation
    /// already costs microseconds); else from the coarse one. Called before any event.
    fn precise_clock(&mut self) {
        let precise = self.stacks || self.backtraces;
        if precise != self.clock.precise {
            self.clock = Clock::new(precise);
            self.lock().spacing = self.clock.ticks_per_span();
        }
    }

    /// The source of allocations made outside any library's glue.
    pub fn source(&self) -> Source {
        self.source
    }

    /// Live bytes per registered source and the number of live allocations, read from
    /// counters kept as allocations come and go (no walk over them).
    pub fn live_bytes(&self) -> (Vec<(Source, usize)>, usize) {
        let st = self.lock();
        let bytes = Source::all()
            .into_iter()
            .map(|s| (s, st.live_bytes[s.index()]))
            .collect();
        (bytes, st.live.len())
    }

    /// With stacks on: live bytes per source and stack (the Python stack where they were
    /// allocated), read from counters; allocations without a stack are not listed.
    pub fn live_by_stack(&self) -> Vec<(Source, String, usize)> {
        let st = self.lock();
        st.by_stack
            .iter()
            .map(|((source, stack), &n)| (*source, stack.clone(), n))
            .collect()
    }

    /// Every live allocation, oldest first.
    pub fn live(&self) -> Vec<Allocation> {
        let ns = self.clock.to_ns();
        let st = self.lock();
        let mut v: Vec<Allocation> = st
            .live
            .iter()
            .map(|(&address, e)| {
                let (stack, backtrace) = st.extras.get(&address).cloned().unwrap_or_default();
                Allocation {
                    address,
                    size: e.size,
                    stream: e.stream,
                    device: self.device,
                    source: e.source,
                    time_ns: ns(e.ticks),
                    stack,
                    backtrace,
                }
            })
            .collect();
        drop(st);
        v.sort_by_key(|a| (a.time_ns, a.address));
        v
    }

    /// Spills and restores on this resource's device (every device for host memory) since
    /// the adaptor was made: (nanoseconds since then, `"spill"` or `"restore"`, device
    /// bytes), oldest first ([`super::events`]).
    pub fn events(&self) -> Vec<(u64, &'static str, usize)> {
        super::events::events_since(self.first_event, self.device)
            .into_iter()
            .map(|e| (self.clock.ns_at(e.at), e.kind, e.bytes))
            .collect()
    }

    /// With stacks on ([`with_stacks`](Self::with_stacks)): the last [`TRACE_EVENTS`]
    /// allocations and frees, oldest first, each allocation with its stack (what a
    /// picture in torch's memory-snapshot format draws). Empty with stacks off, which keeps
    /// tracking cheap.
    pub fn trace(&self) -> Vec<TraceEvent> {
        let mut v: Vec<TraceEvent> = self.lock().trace.iter().cloned().collect();
        let ns = self.clock.to_ns();
        for e in &mut v {
            e.time_ns = ns(e.time_ns);
        }
        v
    }

    /// Live bytes per source over time, one point after each call (thinned past 65,536
    /// points, keeping the shape).
    pub fn timeline(&self) -> Vec<TimelinePoint> {
        let mut v = self.lock().timeline.clone();
        let ns = self.clock.to_ns();
        for p in &mut v {
            p.0 = ns(p.0);
        }
        v
    }

    fn lock(&self) -> std::sync::MutexGuard<'_, State> {
        self.state.lock().unwrap_or_else(PoisonError::into_inner)
    }

    fn now(&self) -> u64 {
        self.clock.ticks()
    }

    fn point(st: &mut State, t: u64) {
        let bytes = st.live_bytes;
        if t.saturating_sub(st.span_start) < st.spacing
            && let Some(last) = st.timeline.last_mut()
        {
            *last = (t, bytes);
            return;
        }
        if st.timeline.len() >= TIMELINE_POINTS {
            // Every other point, in place: a new vector of this size would cost page
            // faults on every thinning (tens of ns a call on a virtual machine).
            let mut keep = false;
            st.timeline.retain(|_| {
                keep = !keep;
                keep
            });
            if let (Some(first), Some(last)) = (st.timeline.first(), st.timeline.last()) {
                st.spacing = st
                    .spacing
                    .max((last.0 - first.0) / st.timeline.len() as u64)
                    .max(1);
            }
        }
        st.span_start = t;
        st.timeline.push((t, bytes));
    }

    fn record(&self, p: NonNull<u8>, bytes: usize, stream: Option<RawStream>) {
        // Stacks are taken before the lock: a provider may wait (for the GIL).
        let stack = if self.stacks {
            STACKS.get().and_then(|f| f())
        } else {
            None
        };
        let backtrace = self
            .backtraces
            .then(|| std::backtrace::Backtrace::force_capture().to_string());
        let source = super::current_source().unwrap_or(self.source);
        let address = p.as_ptr() as usize;
        let stream = stream.map(|s| s.raw());
        let ticks = self.now();
        let mut st = self.lock();
        let ticks = st.stamp(ticks);
        let slot = &mut st.live_bytes[source.index()];
        *slot = slot.saturating_add(bytes);
        if self.stacks {
            st.trace(TraceEvent {
                time_ns: ticks,
                free: false,
                address,
                size: bytes,
                stream,
                device: self.device,
                source,
                stack: stack.clone(),
            });
        }
        if let Some(stack) = &stack {
            *st.by_stack.entry((source, stack.clone())).or_default() += bytes;
        }
        if stack.is_some() || backtrace.is_some() {
            st.extras.insert(address, (stack, backtrace));
        }
        st.live.insert(
            address,
            Entry {
                size: bytes,
                stream,
                ticks,
                source,
            },
        );
        Self::point(&mut st, ticks);
    }
}

impl MemoryResource for TrackingAdaptor {
    fn allocate(
        &self,
        bytes: usize,
        align: usize,
        stream: Option<RawStream>,
    ) -> Result<NonNull<u8>> {
        let p = self.upstream.allocate(bytes, align, stream)?;
        self.record(p, bytes, stream);
        Ok(p)
    }

    fn allocate_zeroed(
        &self,
        bytes: usize,
        align: usize,
        stream: Option<RawStream>,
    ) -> Result<NonNull<u8>> {
        let p = self.upstream.allocate_zeroed(bytes, align, stream)?;
        self.record(p, bytes, stream);
        Ok(p)
    }

    unsafe fn deallocate(
        &self,
        ptr: NonNull<u8>,
        bytes: usize,
        align: usize,
        stream: Option<RawStream>,
    ) {
        {
            let t = self.now();
            let mut st = self.lock();
            let t = st.stamp(t);
            let address = ptr.as_ptr() as usize;
            if let Some(a) = st.live.remove(&address) {
                let slot = &mut st.live_bytes[a.source.index()];
                *slot = slot.saturating_sub(a.size);
                if (self.stacks || self.backtraces)
                    && let Some((Some(stack), _)) = st.extras.remove(&address)
                {
                    let key = (a.source, stack);
                    if let Some(n) = st.by_stack.get_mut(&key) {
                        *n = n.saturating_sub(a.size);
                        if *n == 0 {
                            st.by_stack.remove(&key);
                        }
                    }
                }
                if self.stacks {
                    st.trace(TraceEvent {
                        time_ns: t,
                        free: true,
                        address,
                        size: a.size,
                        stream: stream.map(|s| s.raw()),
                        device: self.device,
                        source: a.source,
                        stack: None,
                    });
                }
            }
            Self::point(&mut st, t);
        }
        // SAFETY: forwarded unchanged under the caller's contract.
        unsafe { self.upstream.deallocate(ptr, bytes, align, stream) };
    }

    forward_to_upstream!();

    fn memory_info(&self) -> Option<MemoryInfo> {
        self.upstream.memory_info()
    }
}

#[cfg(test)]
mod tests;
