//! [`CachingPool`]: a thread-safe caching pool over any upstream resource.
//!
//! - **Small blocks** (up to [`SMALL_MAX`]) come in power-of-two size classes from 512
//!   bytes; each is one upstream allocation, kept on its class's free list when freed.
//! - **Large blocks** are carved from upstream segments (multiples of [`SEGMENT_ROUND`]) by
//!   best fit; a block larger than needed by at least [`SPLIT_MIN`] is split, and a freed
//!   block merges with free neighbours of the same segment and stream.
//! - **Release threshold**: after a free, cached bytes above it go back upstream; `trim()`
//!   ([`MemoryResource::release_cached`]) gives back everything cached.
//! - **Streams.** A freed block remembers the stream it was freed on. An allocation on the
//!   same stream reuses it at once (stream order makes that safe). On another stream it is
//!   reused only once the work queued on its stream before the free has completed: an
//!   event recorded there at the free (a stream other than the legacy default stream may
//!   be destroyed once its call returns, so the pool never names it again) is queried,
//!   never waited for; until it completes the block is skipped. Giving such a block back
//!   upstream makes the legacy default stream wait for that event (host memory: the host
//!   waits). A pool made without a device ([`CachingPool::host`]) serves host code only
//!   and ignores stream arguments.
//! - **Out of memory**: the pool gives its cache back and retries once before failing.
//! - Alignments above [`POOL_ALIGN`] pass straight through to the upstream.

use std::collections::{BTreeMap, BTreeSet, HashMap};
use std::ptr::NonNull;
use std::sync::{Arc, Mutex, PoisonError};

use memarray_core::{
    CoreError, Location, MemoryInfo, MemoryKind, MemoryResource, RawStream, Result,
};

use super::zero_device_memory;
use crate::device::Device;
use crate::event::Event;
use crate::stream::StreamRef;

/// Alignment of every pooled block (the driver's natural alignment).
pub const POOL_ALIGN: usize = 256;
/// Smallest block, and the granularity of large blocks.
pub const MIN_BLOCK: usize = 512;
/// Largest small (size-classed) block.
pub const SMALL_MAX: usize = 1 << 20;
/// Large segments are multiples of this.
pub const SEGMENT_ROUND: usize = 2 << 20;
/// A large free block is split when the remainder would be at least this.
pub const SPLIT_MIN: usize = 1 << 20;

/// Counters of a [`CachingPool`].
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct PoolStatistics {
    /// Bytes in blocks handed out (rounded block sizes).
    pub used_bytes: u64,
    /// Bytes in free blocks kept for reuse.
    pub cached_bytes: u64,
    /// Bytes held from the upstream (used + cached + pass-through).
    pub upstream_bytes: u64,
    /// Allocations served from the cache.
    pub hits: u64,
    /// Allocations that went to the upstream.
    pub misses: u64,
}

/// The stream tag of a call: the raw handle, the legacy stream for `None`; 0 for a pool
/// without a device (streams ignored).
type Tag = usize;

#[derive(Debug)]
enum Live {
    Small {
        class: usize,
        tag: Tag,
    },
    Large {
        tag: Tag,
    },
    /// Over-aligned: straight from the upstream.
    Passthrough {
        bytes: usize,
        align: usize,
    },
}

#[derive(Clone, Copy, Debug)]
struct LargeBlock {
    size: usize,
    segment: usize,
    free: bool,
    tag: Tag,
}

#[derive(Debug, Default)]
struct State {
    small_free: HashMap<(usize, Tag), Vec<usize>>,
    /// Free large blocks per stream: (size, address), for best fit.
    large_free: HashMap<Tag, BTreeSet<(usize, usize)>>,
    /// Every large block, free or not, by address (neighbours for merging).
    large: BTreeMap<usize, LargeBlock>,
    /// Segment base -> size.
    segments: HashMap<usize, usize>,
    live: HashMap<usize, Live>,
    /// Free blocks freed on a stream other than the legacy default stream: the event
    /// recorded there at the free (the stream itself may be gone since).
    freed: HashMap<usize, Event>,
    /// Spare events.
    events: Vec<Event>,
    stats: PoolStatistics,
}

impl State {
    /// Forgets free block `addr`'s event (it is reused on its own stream, merged into a
    /// newer block of that stream, or given back).
    fn drop_event(&mut self, addr: usize) {
        if let Some(e) = self.freed.remove(&addr) {
            self.events.push(e);
        }
    }
}

/// A caching pool over any [`MemoryResource`]: device, pinned or managed memory (with a
/// device, for stream-ordered reuse) or host memory. See the module docs for the rules.
///
/// ```
/// use std::sync::Arc;
/// use memarray_core::{HostResource, MemoryResource};
/// use memarray_cuda::resource::CachingPool;
///
/// let pool = CachingPool::host(Arc::new(HostResource), usize::MAX);
/// let p = pool.allocate(1000, 64, None)?;
/// // SAFETY: p came from the pool with these arguments and is freed once.
/// unsafe { pool.deallocate(p, 1000, 64, None) };
/// let q = pool.allocate(900, 64, None)?; // same 1 KiB class: the cached block again
/// assert_eq!(p, q);
/// assert_eq!(pool.statistics().hits, 1);
/// // SAFETY: as above.
/// unsafe { pool.deallocate(q, 900, 64, None) };
/// assert_eq!(pool.release_cached(), 1024);
/// # Ok::<(), memarray_core::CoreError>(())
/// ```
#[derive(Debug)]
pub struct CachingPool {
    upstream: Arc<dyn MemoryResource>,
    device: Option<Arc<Device>>,
    release_threshold: usize,
    name: String,
    state: Mutex<State>,
}

impl CachingPool {
    /// A pool over `upstream` whose blocks are used on `device`'s streams; cached bytes
    /// beyond `release_threshold` go back upstream after each free.
    pub fn new(
        upstream: Arc<dyn MemoryResource>,
        device: &Arc<Device>,
        release_threshold: usize,
    ) -> Self {
        Self::make(upstream, Some(device.clone()), release_threshold)
    }

    /// A pool for host code (stream arguments ignored), e.g. over host or file memory.
    pub fn host(upstream: Arc<dyn MemoryResource>, release_threshold: usize) -> Self {
        Self::make(upstream, None, release_threshold)
    }

    fn make(
        upstream: Arc<dyn MemoryResource>,
        device: Option<Arc<Device>>,
        release_threshold: usize,
    ) -> Self {
        Self {
            name: memarray_core::resource::adaptor_name("pool", upstream.name()),
            upstream,
            device,
            release_threshold,
            state: Mutex::new(State::default()),
        }
    }

    /// The pool's counters.
    pub fn statistics(&self) -> PoolStatistics {
        self.lock().stats
    }

    /// The release threshold in bytes.
    pub fn release_threshold(&self) -> usize {
        self.release_threshold
    }

    /// Gives every cached block back to the upstream; returns the bytes released.
    pub fn trim(&self) -> usize {
        let mut st = self.lock();
        self.trim_to(&mut st, 0)
    }

    fn lock(&self) -> std::sync::MutexGuard<'_, State> {
        self.state.lock().unwrap_or_else(PoisonError::into_inner)
    }

    fn tag(&self, stream: Option<RawStream>) -> Tag {
        match (&self.device, stream) {
            (None, _) => 0,
            (Some(_), None) => RawStream::LEGACY.raw(),
            (Some(_), Some(s)) => s.raw(),
        }
    }

    /// Whether free block `addr`, freed on stream `from`, may be used on another stream
    /// now (the work queued before its free has completed; no host block). Any doubt (no
    /// device, an error) is a no.
    fn block_idle(&self, st: &mut State, addr: usize, from: Tag) -> bool {
        let Some(device) = &self.device else {
            return true;
        };
        if let Some(e) = st.freed.get(&addr) {
            return e.is_complete().unwrap_or(false);
        }
        if from != RawStream::LEGACY.raw() {
            return false; // freed on a stream with no event: never happens; stay safe
        }
        // The legacy default stream lives as long as the context.
        let event = match st.events.pop() {
            Some(e) => e,
            None => match Event::new(device) {
                Ok(e) => e,
                Err(_) => return false,
            },
        };
        let idle =
            event.record(StreamRef::legacy()).is_ok() && event.is_complete().unwrap_or(false);
        st.events.push(event);
        idle
    }

    /// A cached block of `class` for stream `tag`, or one from another stream whose work
    /// has completed.
    fn take_small(&self, st: &mut State, class: usize, tag: Tag) -> Option<usize> {
        if let Some(a) = st.small_free.get_mut(&(class, tag)).and_then(Vec::pop) {
            st.drop_event(a);
            return Some(a);
        }
        // Another stream's newest free block: when its work is done, so is the work
        // before every older block of that stream.
        let others: Vec<(Tag, usize)> = st
            .small_free
            .iter()
            .filter(|((c, t), _)| *c == class && *t != tag)
            .filter_map(|((_, t), v)| v.last().map(|&a| (*t, a)))
            .collect();
        for (from, addr) in others {
            if self.block_idle(st, addr, from) {
                st.small_free.get_mut(&(class, from)).and_then(Vec::pop);
                st.drop_event(addr);
                return Some(addr);
            }
        }
        None
    }

    /// The best-fitting free large block for `tag` (or an idle stream's), split to
    /// `size` when worthwhile and marked used.
    fn take_large(&self, st: &mut State, size: usize, tag: Tag) -> Option<usize> {
        let mut found = best_fit(st, tag, size).map(|b| (tag, b));
        if found.is_none() {
            let others: Vec<Tag> = st
                .large_free
                .keys()
                .copied()
                .filter(|&t| t != tag)
                .collect();
            for from in others {
                if let Some(b) = best_fit(st, from, size)
                    && self.block_idle(st, b.1, from)
                {
                    found = Some((from, b));
                    break;
                }
            }
        }
        let (from, (bsize, addr)) = found?;
        st.drop_event(addr);
        if let Some(set) = st.large_free.get_mut(&from) {
            set.remove(&(bsize, addr));
        }
        let block = st.large.get_mut(&addr)?;
        block.free = false;
        block.tag = tag;
        let segment = block.segment;
        if bsize - size >= SPLIT_MIN {
            block.size = size;
            // The rest stays free on this call's stream (live now; the work before the
            // block's free is complete or on this same stream): reused on another stream
            // once an event recorded here now completes.
            let rest = LargeBlock {
                size: bsize - size,
                segment,
                free: true,
                tag,
            };
            st.large.insert(addr + size, rest);
            st.large_free
                .entry(tag)
                .or_default()
                .insert((rest.size, addr + size));
            if tag != RawStream::LEGACY.raw()
                && let Some(stream) = self.stream_of(tag)
            {
                self.note_free(st, addr + size, stream);
            }
        }
        Some(addr)
    }

    /// The live stream of the current call's tag (the caller named it just now).
    fn stream_of(&self, tag: Tag) -> Option<StreamRef> {
        if self.device.is_none() || tag == 0 {
            return None;
        }
        // SAFETY: only called with the tag of the stream the current call passed, live
        // for the call (RawStream's contract).
        StreamRef::from_raw_stream(unsafe { RawStream::from_raw(tag) }).ok()
    }

    /// Records, on `stream` (live now), the event that says when free block `addr` may
    /// be used on another stream. Without an event the block is never reused elsewhere.
    fn note_free(&self, st: &mut State, addr: usize, stream: StreamRef) {
        let Some(device) = &self.device else {
            return;
        };
        st.drop_event(addr);
        let event = match st.events.pop() {
            Some(e) => e,
            None => match Event::new(device) {
                Ok(e) => e,
                Err(_) => return,
            },
        };
        if event.record(stream).is_ok() {
            st.freed.insert(addr, event);
        } else {
            st.events.push(event);
        }
    }

    /// Upstream allocation, retried once after giving the cache back on out-of-memory.
    fn upstream_alloc(
        &self,
        st: &mut State,
        size: usize,
        stream: Option<RawStream>,
    ) -> Result<NonNull<u8>> {
        match self.upstream.allocate(size, POOL_ALIGN, stream) {
            Err(CoreError::OutOfMemory { .. }) => {
                self.trim_to(st, 0);
                self.upstream.allocate(size, POOL_ALIGN, stream)
            }
            other => other,
        }
    }

    fn alloc(&self, bytes: usize, align: usize, stream: Option<RawStream>) -> Result<NonNull<u8>> {
        if !align.is_power_of_two() {
            return Err(CoreError::BadAlignment {
                align,
                max: super::MAX_ALIGN,
            });
        }
        let mut st = self.lock();
        if align > POOL_ALIGN {
            let p = self.upstream.allocate(bytes, align, stream)?;
            st.live
                .insert(p.as_ptr() as usize, Live::Passthrough { bytes, align });
            st.stats.upstream_bytes += bytes as u64;
            st.stats.misses += 1;
            return Ok(p);
        }
        let too_big = || CoreError::OutOfMemory {
            bytes,
            resource: self.name.clone(),
            reason: "the size cannot be rounded to a pool block".into(),
        };
        let size = bytes
            .max(1)
            .checked_next_multiple_of(MIN_BLOCK)
            .filter(|&s| s <= isize::MAX as usize / 2)
            .ok_or_else(too_big)?;
        let tag = self.tag(stream);
        let (addr, block) = if size <= SMALL_MAX {
            let class = size.next_power_of_two();
            let addr = match self.take_small(&mut st, class, tag) {
                Some(a) => {
                    st.stats.cached_bytes -= class as u64;
                    st.stats.hits += 1;
                    a
                }
                None => {
                    let p = self.upstream_alloc(&mut st, class, stream)?;
                    st.stats.upstream_bytes += class as u64;
                    st.stats.misses += 1;
                    p.as_ptr() as usize
                }
            };
            st.live.insert(addr, Live::Small { class, tag });
            (addr, class)
        } else {
            let addr = match self.take_large(&mut st, size, tag) {
                Some(a) => {
                    let got = st.large.get(&a).map_or(size, |b| b.size);
                    st.stats.cached_bytes -= got as u64;
                    st.stats.hits += 1;
                    a
                }
                None => {
                    let seg = size
                        .checked_next_multiple_of(SEGMENT_ROUND)
                        .ok_or_else(too_big)?;
                    let p = self.upstream_alloc(&mut st, seg, stream)?.as_ptr() as usize;
                    st.stats.upstream_bytes += seg as u64;
                    st.stats.misses += 1;
                    st.segments.insert(p, seg);
                    st.large.insert(
                        p,
                        LargeBlock {
                            size: seg,
                            segment: p,
                            free: false,
                            tag,
                        },
                    );
                    if seg - size >= SPLIT_MIN {
                        if let Some(b) = st.large.get_mut(&p) {
                            b.size = size;
                        }
                        let rest = LargeBlock {
                            size: seg - size,
                            segment: p,
                            free: true,
                            tag,
                        };
                        st.large.insert(p + size, rest);
                        st.large_free
                            .entry(tag)
                            .or_default()
                            .insert((rest.size, p + size));
                        st.stats.cached_bytes += rest.size as u64;
                        if tag != RawStream::LEGACY.raw()
                            && let Some(stream) = self.stream_of(tag)
                        {
                            self.note_free(&mut st, p + size, stream);
                        }
                    }
                    p
                }
            };
            st.live.insert(addr, Live::Large { tag });
            (addr, st.large.get(&addr).map_or(size, |b| b.size))
        };
        st.stats.used_bytes += block as u64;
        NonNull::new(addr as *mut u8).ok_or_else(too_big)
    }

    fn free(&self, ptr: NonNull<u8>, stream: Option<RawStream>) {
        let addr = ptr.as_ptr() as usize;
        let mut st = self.lock();
        let Some(live) = st.live.remove(&addr) else {
            return; // not ours (or freed twice): nothing to do, never a crash
        };
        match live {
            Live::Passthrough { bytes, align } => {
                st.stats.upstream_bytes -= bytes as u64;
                // SAFETY: allocated from upstream with these arguments, freed once.
                unsafe { self.upstream.deallocate(ptr, bytes, align, stream) };
                return;
            }
            Live::Small { class, tag } => {
                let tag = stream.map_or(tag, |_| self.tag(stream));
                if tag != RawStream::LEGACY.raw()
                    && let Some(s) = self.stream_of(tag)
                {
                    self.note_free(&mut st, addr, s);
                }
                st.small_free.entry((class, tag)).or_default().push(addr);
                st.stats.used_bytes -= class as u64;
                st.stats.cached_bytes += class as u64;
            }
            Live::Large { tag } => {
                let tag = stream.map_or(tag, |_| self.tag(stream));
                let Some(mut b) = st.large.get(&addr).copied() else {
                    return;
                };
                st.stats.used_bytes -= b.size as u64;
                st.stats.cached_bytes += b.size as u64;
                b.free = true;
                b.tag = tag;
                let mut start = addr;
                // Merge with the next block, then the previous one: same segment, free,
                // same stream.
                if let Some((&n_addr, &n)) = st.large.range(addr + 1..).next()
                    && n_addr == addr + b.size
                    && n.segment == b.segment
                    && n.free
                    && n.tag == tag
                {
                    st.large.remove(&n_addr);
                    remove_free(&mut st, tag, n.size, n_addr);
                    st.drop_event(n_addr); // this free's event (same stream) is newer
                    b.size += n.size;
                }
                if let Some((&p_addr, &p)) = st.large.range(..addr).next_back()
                    && p_addr + p.size == addr
                    && p.segment == b.segment
                    && p.free
                    && p.tag == tag
                {
                    st.large.remove(&addr);
                    remove_free(&mut st, tag, p.size, p_addr);
                    st.drop_event(p_addr);
                    b.size += p.size;
                    start = p_addr;
                }
                st.large.insert(start, b);
                st.large_free
                    .entry(tag)
                    .or_default()
                    .insert((b.size, start));
                if tag != RawStream::LEGACY.raw()
                    && let Some(s) = self.stream_of(tag)
                {
                    self.note_free(&mut st, start, s);
                }
            }
        }
        if st.stats.cached_bytes > self.release_threshold as u64 {
            self.trim_to(&mut st, self.release_threshold);
        }
    }

    /// Gives cached blocks back upstream until at most `target` bytes stay cached;
    /// returns the bytes released. Only whole segments (one free block) of large memory
    /// can go back.
    /// Gives cached memory back until at most `target` bytes stay cached, not counting
    /// free parts of segments still partly in use (they cannot go back): whole free
    /// segments first, largest first (the big idle blocks a burst left behind), then
    /// small blocks (cheap to keep, and the likeliest to be asked for again: trimming
    /// them first made a 1 MiB pinned array cost a cuMemHostAlloc each time while a 1 GiB
    /// segment sat in the cache).
    fn trim_to(&self, st: &mut State, target: usize) -> usize {
        let mut released = 0usize;
        let host_memory = self.upstream.is_accessible_from(Location::Host);
        // A segment can go back when every block in it is free, whatever streams they
        // were freed on.
        let mut by_segment: HashMap<usize, (bool, Vec<(usize, LargeBlock)>)> = HashMap::new();
        for (&a, &b) in &st.large {
            let e = by_segment.entry(b.segment).or_insert((true, Vec::new()));
            e.0 &= b.free;
            e.1.push((a, b));
        }
        // (size, base, blocks) of each segment whose blocks are all free.
        type FreeSegment = (usize, usize, Vec<(usize, LargeBlock)>);
        // Free parts of segments still partly in use cannot go back: the target applies
        // to the rest (else each free over the threshold gave back the small block it had
        // just cached, and the next allocation of that size went upstream again).
        let stuck: u64 = by_segment
            .values()
            .filter(|(all_free, _)| !*all_free)
            .flat_map(|(_, blocks)| blocks.iter())
            .filter(|(_, b)| b.free)
            .map(|(_, b)| b.size as u64)
            .sum();
        let target = (target as u64).saturating_add(stuck);
        let mut free_segments: Vec<FreeSegment> = by_segment
            .into_iter()
            .filter(|(_, (all_free, _))| *all_free)
            .filter_map(|(segment, (_, blocks))| {
                st.segments
                    .get(&segment)
                    .map(|&size| (size, segment, blocks))
            })
            .collect();
        free_segments.sort_unstable_by(|a, b| b.0.cmp(&a.0).then(a.1.cmp(&b.1)));
        for (size, segment, blocks) in free_segments {
            if st.stats.cached_bytes <= target {
                break;
            }
            let mut tags: Vec<Tag> = blocks.iter().map(|(_, b)| b.tag).collect();
            tags.sort_unstable();
            tags.dedup();
            let mut events = Vec::new();
            for (a, b) in &blocks {
                st.large.remove(a);
                remove_free(st, b.tag, b.size, *a);
                events.extend(st.freed.remove(a));
            }
            st.segments.remove(&segment);
            let tag = match tags.as_slice() {
                [one] => *one,
                // Freed on several streams: ordered by their events below.
                _ => RawStream::LEGACY.raw(),
            };
            self.give_back(segment, size, tag, &events, host_memory);
            st.events.extend(events);
            st.stats.cached_bytes -= size as u64;
            st.stats.upstream_bytes -= size as u64;
            released += size;
        }
        if st.stats.cached_bytes <= target {
            return released;
        }
        let mut small: Vec<((usize, Tag), Vec<usize>)> = st.small_free.drain().collect();
        // Largest classes first, as above.
        small.sort_unstable_by_key(|e| std::cmp::Reverse(e.0));
        let mut keep: Vec<((usize, Tag), Vec<usize>)> = Vec::new();
        for ((class, tag), mut addrs) in small {
            while st.stats.cached_bytes > target {
                let Some(a) = addrs.pop() else { break };
                let events: Vec<Event> = st.freed.remove(&a).into_iter().collect();
                self.give_back(a, class, tag, &events, host_memory);
                st.events.extend(events);
                st.stats.cached_bytes -= class as u64;
                st.stats.upstream_bytes -= class as u64;
                released += class;
            }
            if !addrs.is_empty() {
                keep.push(((class, tag), addrs));
            }
        }
        st.small_free.extend(keep);
        released
    }

    /// Frees one upstream allocation last used on stream `tag`. A stream other than the
    /// legacy default stream is not named again: its `events` (recorded at the frees)
    /// order the free instead, on the legacy default stream. Host-reachable memory is
    /// waited for first (the upstream may hand it to host code at once).
    fn give_back(&self, addr: usize, size: usize, tag: Tag, events: &[Event], host_memory: bool) {
        let legacy = RawStream::LEGACY.raw();
        let stream = match tag {
            0 => None,
            // SAFETY: the legacy default stream lives as long as the context.
            _ => Some(unsafe { RawStream::from_raw(legacy) }),
        };
        for e in events {
            // Ordering only: on failure the upstream's own rule (cuMemFree waits for the
            // device) is left in charge.
            let _ = if host_memory {
                e.synchronize()
            } else {
                StreamRef::legacy().wait(e)
            };
        }
        if host_memory
            && tag == legacy
            && let Some(device) = &self.device
        {
            let _ = StreamRef::legacy().synchronize(device);
        }
        if let Some(p) = NonNull::new(addr as *mut u8) {
            // SAFETY: (addr, size, POOL_ALIGN) came from upstream.allocate and is freed
            // once; its last uses are ordered before the legacy default stream's position
            // (waited for above if host-reachable).
            unsafe { self.upstream.deallocate(p, size, POOL_ALIGN, stream) };
        }
    }
}

fn best_fit(st: &State, tag: Tag, size: usize) -> Option<(usize, usize)> {
    st.large_free.get(&tag)?.range((size, 0)..).next().copied()
}

fn remove_free(st: &mut State, tag: Tag, size: usize, addr: usize) {
    if let Some(set) = st.large_free.get_mut(&tag) {
        set.remove(&(size, addr));
    }
}

impl MemoryResource for CachingPool {
    fn allocate(
        &self,
        bytes: usize,
        align: usize,
        stream: Option<RawStream>,
    ) -> Result<NonNull<u8>> {
        self.alloc(bytes, align, stream)
    }

    fn allocate_zeroed(
        &self,
        bytes: usize,
        align: usize,
        stream: Option<RawStream>,
    ) -> Result<NonNull<u8>> {
        let p = self.alloc(bytes, align, stream)?;
        let on_device = matches!(
            self.upstream.kind(),
            MemoryKind::Device | MemoryKind::Managed
        );
        let zeroed = match (&self.device, on_device) {
            (Some(device), true) => zero_device_memory(device, p.as_ptr() as usize, bytes, stream)
                .map_err(|e| e.into_alloc(bytes, align, &self.name)),
            _ if self.upstream.is_accessible_from(Location::Host) => {
                // SAFETY: p holds at least `bytes` host-writable bytes, the caller's now;
                // cross-stream reuse only happens after the other stream's work is done.
                unsafe { p.as_ptr().write_bytes(0, bytes) };
                Ok(())
            }
            _ => Err(CoreError::Alloc {
                bytes,
                align,
                resource: self.name.clone(),
                reason: "device memory needs a pool made with a device to be zeroed".into(),
            }),
        };
        if let Err(e) = zeroed {
            self.free(p, stream);
            return Err(e);
        }
        Ok(p)
    }

    unsafe fn deallocate(
        &self,
        ptr: NonNull<u8>,
        _bytes: usize,
        _align: usize,
        stream: Option<RawStream>,
    ) {
        self.free(ptr, stream);
    }

    fn kind(&self) -> MemoryKind {
        self.upstream.kind()
    }

    fn is_accessible_from(&self, location: Location) -> bool {
        self.upstream.is_accessible_from(location)
    }

    fn memory_info(&self) -> Option<MemoryInfo> {
        // Cached bytes are as good as free for this pool's users.
        self.upstream.memory_info().map(|i| MemoryInfo {
            free: i
                .free
                .saturating_add(self.statistics().cached_bytes)
                .min(i.total),
            total: i.total,
        })
    }

    fn device_id(&self) -> Option<u32> {
        self.upstream.device_id()
    }

    fn release_cached(&self) -> usize {
        self.trim() + self.upstream.release_cached()
    }

    fn name(&self) -> &str {
        &self.name
    }
}

impl Drop for CachingPool {
    fn drop(&mut self) {
        // Cached blocks go back; blocks still handed out are leaked rather than freed
        // under their users (a pool is normally dropped after everything it served).
        self.trim();
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use memarray_core::resource::conformance;
    use memarray_core::{HostResource, StatisticsAdaptor};

    fn host_pool(threshold: usize) -> CachingPool {
        CachingPool::host(Arc::new(HostResource), threshold)
    }

    #[test]
    fn host_pool_conforms() {
        conformance::check_all(Arc::new(host_pool(usize::MAX)));
        conformance::check_all(Arc::new(host_pool(0)));
        conformance::check_all(Arc::new(host_pool(3 << 20)));
    }

    #[test]
    fn small_blocks_are_reused_by_class() {
        let pool = host_pool(usize::MAX);
        let a = pool.allocate(700, 64, None).unwrap();
        // SAFETY: freed once, with the arguments it was allocated with.
        unsafe { pool.deallocate(a, 700, 64, None) };
        let b = pool.allocate(1024, 64, None).unwrap();
        assert_eq!(a, b, "700 and 1024 bytes share the 1 KiB class");
        let c = pool.allocate(1025, 64, None).unwrap();
        assert_ne!(b, c);
        let s = pool.statistics();
        assert_eq!((s.hits, s.misses, s.used_bytes), (1, 2, 1024 + 2048));
        // SAFETY: as above.
        unsafe {
            pool.deallocate(b, 1024, 64, None);
            pool.deallocate(c, 1025, 64, None);
        }
        assert_eq!(pool.statistics().cached_bytes, 3072);
    }

    #[test]
    fn large_blocks_split_best_fit_and_coalesce() {
        let upstream = Arc::new(StatisticsAdaptor::new(Arc::new(HostResource)));
        let pool = CachingPool::host(upstream.clone(), usize::MAX);
        // 2.5 MiB -> one 4 MiB segment: 2.5 MiB used, a 1.5 MiB free remainder.
        let (n_a, n_b) = (5 << 19, 3 << 19);
        let a = pool.allocate(n_a, 256, None).unwrap();
        assert_eq!(upstream.statistics().current_bytes, 4 << 20);
        let b = pool.allocate(n_b, 256, None).unwrap(); // the remainder, no new segment
        assert_eq!(b.as_ptr() as usize, a.as_ptr() as usize + n_a);
        assert_eq!(upstream.statistics().total_count, 1);
        // SAFETY: freed once each, with the arguments they were allocated with.
        unsafe {
            pool.deallocate(a, n_a, 256, None);
            pool.deallocate(b, n_b, 256, None);
        }
        // Merged back into one 4 MiB block: a 4 MiB request fits without a new segment.
        let c = pool.allocate(4 << 20, 256, None).unwrap();
        assert_eq!(c, a);
        assert_eq!(upstream.statistics().total_count, 1);
        // SAFETY: as above.
        unsafe { pool.deallocate(c, 4 << 20, 256, None) };
        assert_eq!(pool.trim(), 4 << 20);
        assert_eq!(
            upstream.statistics().current_bytes,
            0,
            "trim returns every segment"
        );
    }

    #[test]
    fn release_threshold_bounds_the_cache() {
        let upstream = Arc::new(StatisticsAdaptor::new(Arc::new(HostResource)));
        let pool = CachingPool::host(upstream.clone(), 4 << 20);
        let blocks: Vec<_> = (0..8)
            .map(|_| pool.allocate(2 << 20, 256, None).unwrap())
            .collect();
        for p in blocks {
            // SAFETY: freed once, with the arguments it was allocated with.
            unsafe { pool.deallocate(p, 2 << 20, 256, None) };
            assert!(pool.statistics().cached_bytes <= 4 << 20);
        }
        assert_eq!(
            upstream.statistics().current_bytes,
            pool.statistics().cached_bytes
        );
    }

    #[test]
    fn trimming_gives_back_big_idle_segments_before_small_blocks() {
        let pool = CachingPool::host(Arc::new(HostResource), 64 << 20);
        let big = pool.allocate(64 << 20, 256, None).unwrap();
        let small = pool.allocate(4096, 256, None).unwrap();
        // 64 MiB cached: at the limit; then over it, which trims.
        // SAFETY: freed once, with the arguments it was allocated with.
        unsafe { pool.deallocate(big, 64 << 20, 256, None) };
        // SAFETY: as above.
        unsafe { pool.deallocate(small, 4096, 256, None) };
        let cached = pool.statistics().cached_bytes;
        assert!(
            cached < 1 << 20,
            "the 64 MiB segment went back ({cached} cached)"
        );
        let again = pool.allocate(4096, 256, None).unwrap();
        assert_eq!(again, small, "the small block stayed cached");
        assert_eq!(pool.statistics().hits, 1);
        // SAFETY: as above.
        unsafe { pool.deallocate(again, 4096, 256, None) };
    }

    #[test]
    fn free_parts_of_used_segments_do_not_push_small_blocks_out() {
        let pool = CachingPool::host(Arc::new(HostResource), 2 << 20);
        // Each 3 MiB block takes a 4 MiB segment whose free 1 MiB tail stays cached: 5 MiB
        // cached that no trim can give back while the blocks live.
        let big: Vec<_> = (0..5)
            .map(|_| pool.allocate(3 << 20, 256, None).unwrap())
            .collect();
        let small = pool.allocate(4096, 256, None).unwrap();
        // SAFETY: freed once, with the arguments it was allocated with.
        unsafe { pool.deallocate(small, 4096, 256, None) };
        assert!(pool.statistics().cached_bytes > 2 << 20);
        let again = pool.allocate(4096, 256, None).unwrap();
        assert_eq!(again, small, "the small block stayed cached");
        assert_eq!(pool.statistics().hits, 1);
        // SAFETY: as above, for every block.
        unsafe {
            pool.deallocate(again, 4096, 256, None);
            for p in big {
                pool.deallocate(p, 3 << 20, 256, None);
            }
        }
    }

    #[test]
    fn out_of_memory_gives_the_cache_back_and_retries() {
        let limited = Arc::new(memarray_core::LimitingAdaptor::new(
            Arc::new(HostResource),
            8 << 20,
        ));
        let pool = CachingPool::host(limited.clone(), usize::MAX);
        let a = pool.allocate(6 << 20, 256, None).unwrap();
        // SAFETY: freed once, with the arguments it was allocated with.
        unsafe { pool.deallocate(a, 6 << 20, 256, None) };
        // 6 MiB cached + a new 4 MiB segment would pass 8 MiB, but 4 MiB fits in the
        // cached segment; ask for 8 MiB instead: needs the cache given back first.
        let b = pool.allocate(8 << 20, 256, None).unwrap();
        assert_eq!(limited.used(), 8 << 20);
        // SAFETY: as above.
        unsafe { pool.deallocate(b, 8 << 20, 256, None) };
        assert!(matches!(
            pool.allocate(9 << 20, 256, None),
            Err(CoreError::OutOfMemory { .. })
        ));
    }

    #[test]
    fn foreign_and_double_frees_are_ignored() {
        let pool = host_pool(usize::MAX);
        let p = pool.allocate(64, 64, None).unwrap();
        // SAFETY: freed once...
        unsafe { pool.deallocate(p, 64, 64, None) };
        // ...and again: the pool no longer knows it and ignores it.
        // SAFETY: the pool ignores addresses it did not hand out (tested here).
        unsafe { pool.deallocate(p, 64, 64, None) };
        assert_eq!(pool.statistics().cached_bytes, 512);
    }
}
