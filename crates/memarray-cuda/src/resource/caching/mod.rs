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
//!   event is queried, never waited for; until it completes the block is skipped. A
//!   foreign stream (or the per-thread default stream) may be destroyed, or name another
//!   stream, once its call returns, so the pool records that event at the free and never
//!   names the stream again; on the legacy default stream and memarray's own streams
//!   (recycled, never destroyed) it records one only when needed, at a reuse elsewhere or
//!   a give-back, so a free there costs no driver call. Under a capture of the
//!   allocating stream no block of another stream is taken (no event is queried, which
//!   a capture forbids). A block freed on a stream being captured is held for the
//!   capture's graph (its kernels may still use it at every launch): it goes back to the
//!   pool only once the graph and every executable made from it are destroyed and their
//!   launches done (a CUDA user object the graph owns tells the pool), freed then on the
//!   legacy default stream. Giving a block back upstream makes
//!   the legacy default stream wait for that event (host memory: the host waits). A pool made without a device ([`CachingPool::host`]) serves host code only
//!   and ignores stream arguments.
//! - **Out of memory**: the pool gives its cache back and retries once before failing.
//! - Alignments above [`POOL_ALIGN`] pass straight through to the upstream.

use crate::nvtx;
use std::collections::{BTreeMap, BTreeSet, HashMap};
use std::ptr::NonNull;
use std::sync::{Arc, Mutex, PoisonError};

use memarray_core::{
    CoreError, GrowableRange, Location, MemoryInfo, MemoryKind, MemoryResource, RawStream, Result,
};

use super::zero_device_memory;
use crate::device::Device;
use crate::event::Event;

mod expand;
mod graph_held;
mod heaps;
mod sleep;
pub use sleep::Restore;
mod streams;
mod trim;

use heaps::NvtxHeaps;

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
    /// The largest free block kept (what one allocation can get from the cache without
    /// the upstream; against `cached_bytes` it says how fragmented the cache is).
    pub largest_free_bytes: u64,
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
    /// Bytes of the pool's range backed now (a pool with a range: see `expand`); while
    /// offloaded, the bytes backed before and restored after.
    range_len: usize,
    /// Where the pool is in an offload and restore (`sleep`).
    sleep: sleep::Sleep,
    /// The host copy of the last offload, kept after its restore for the next one
    /// (pinning is most of a first offload's time); [`CachingPool::trim`] drops it.
    spare_copy: Option<memarray_core::HostBuffer>,
    /// Blocks held for CUDA graphs now (`graph_held`).
    graph_held: usize,
    /// Segment base -> size.
    segments: HashMap<usize, usize>,
    live: HashMap<usize, Live>,
    /// Free blocks freed on a stream that may not outlive its call (foreign, per-thread
    /// default): the event recorded there at the free (the stream itself may be gone).
    freed: HashMap<usize, Event>,
    /// Spare events.
    events: Vec<Event>,
    stats: PoolStatistics,
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
    /// The pool as a tool taking NVTX's memory extension sees it.
    heaps: NvtxHeaps,
    /// Blocks freed under a capture whose graphs are gone, to be freed for real.
    returned: Arc<graph_held::Returned>,
    /// Where large blocks live when the pool grows in place ([`CachingPool::growing`]).
    range: Option<Arc<dyn GrowableRange>>,
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

    /// A pool that grows in place: large blocks are carved from `range`, backed piece by
    /// piece as the pool grows, so blocks from different growths coalesce when freed and
    /// giving memory back unmaps the range's free end; small blocks come from `upstream`
    /// (memory of the same kind as the range's). `device`: as [`CachingPool::new`] (None:
    /// a host pool).
    pub fn growing(
        upstream: Arc<dyn MemoryResource>,
        range: Arc<dyn GrowableRange>,
        device: Option<&Arc<Device>>,
        release_threshold: usize,
    ) -> Self {
        let mut pool = Self::make(upstream, device.cloned(), release_threshold);
        pool.name = memarray_core::resource::adaptor_name("growing pool", range.name());
        pool.range = Some(range);
        pool
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
            heaps: NvtxHeaps::default(),
            returned: Arc::default(),
            range: None,
        }
    }

    /// The pool's counters.
    pub fn statistics(&self) -> PoolStatistics {
        let st = self.lock();
        let small = st
            .small_free
            .iter()
            .filter(|(_, v)| !v.is_empty())
            .map(|((class, _), _)| *class);
        let large = st
            .large_free
            .values()
            .filter_map(|set| set.last().map(|&(size, _)| size));
        PoolStatistics {
            largest_free_bytes: small.chain(large).max().unwrap_or(0) as u64,
            ..st.stats
        }
    }

    /// The release threshold in bytes.
    pub fn release_threshold(&self) -> usize {
        self.release_threshold
    }

    /// Gives every cached block back to the upstream, and drops the host copy an offload
    /// kept for the next one; returns the device (or host pool) bytes released.
    pub fn trim(&self) -> usize {
        let (released, spare) = {
            let mut st = self.lock();
            self.take_returned(&mut st);
            (self.trim_to(&mut st, 0), st.spare_copy.take())
        };
        drop(spare); // unpinned outside the lock
        released
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
        if others.is_empty() || self.capturing(tag) {
            return None;
        }
        for (from, addr) in others {
            if self.block_idle(st, addr, from) {
                st.small_free.get_mut(&(class, from)).and_then(Vec::pop);
                st.drop_event(addr);
                return Some(addr);
            }
        }
        None
    }

    /// The best fit of `size` among other streams' free large blocks whose work is done;
    /// none while `tag`'s stream is being captured (asking would query events).
    fn idle_elsewhere(
        &self,
        st: &mut State,
        size: usize,
        tag: Tag,
    ) -> Option<(Tag, (usize, usize))> {
        let others: Vec<Tag> = st
            .large_free
            .keys()
            .copied()
            .filter(|&t| t != tag)
            .collect();
        if others.is_empty() || self.capturing(tag) {
            return None;
        }
        for from in others {
            if let Some(b) = best_fit(st, from, size)
                && self.block_idle(st, b.1, from)
            {
                return Some((from, b));
            }
        }
        None
    }

    /// The best-fitting free large block for `tag` (or an idle stream's), split to
    /// `size` when worthwhile and marked used.
    fn take_large(&self, st: &mut State, size: usize, tag: Tag) -> Option<usize> {
        let found = match best_fit(st, tag, size) {
            Some(b) => Some((tag, b)),
            None => self.idle_elsewhere(st, size, tag),
        };
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
            self.cache_free(st, addr + size, rest);
        }
        Some(addr)
    }

    /// Upstream allocation, retried once after giving the cache back on out-of-memory.
    fn upstream_alloc(
        &self,
        st: &mut State,
        size: usize,
        stream: Option<RawStream>,
    ) -> Result<NonNull<u8>> {
        let p = match self.upstream.allocate(size, POOL_ALIGN, stream) {
            Err(CoreError::OutOfMemory { .. }) => {
                self.trim_to(st, 0);
                self.upstream.allocate(size, POOL_ALIGN, stream)
            }
            other => other,
        }?;
        // Not described while the stream is being captured: compute-sanitizer's work on a
        // new heap then invalidated the capture (a second device's fresh pool, allocating
        // inside a capture). Its blocks then have no heap and no regions, as a
        // pass-through block's.
        if !(nvtx::mem_active() && self.capturing(self.tag(stream))) {
            self.heaps
                .allocation_added(self.device.as_ref(), p.as_ptr() as usize, size);
        }
        Ok(p)
    }

    /// The upstream allocation the block at `addr` lies in (a small block is one of its
    /// own, a large one lies in a segment).
    fn allocation_of(st: &State, addr: usize) -> usize {
        st.large.get(&addr).map_or(addr, |b| b.segment)
    }

    fn alloc(&self, bytes: usize, align: usize, stream: Option<RawStream>) -> Result<NonNull<u8>> {
        let _nvtx = nvtx::range(c"memarray.alloc", Some(bytes as u64));
        if !align.is_power_of_two() {
            return Err(CoreError::BadAlignment {
                align,
                max: super::MAX_ALIGN,
            });
        }
        let mut st = self.lock();
        self.take_returned(&mut st);
        self.check_awake(&st)?;
        if align > POOL_ALIGN {
            let p = self.upstream.allocate(bytes, align, stream)?;
            st.live
                .insert(p.as_ptr() as usize, Live::Passthrough { bytes, align });
            st.stats.upstream_bytes += bytes as u64;
            st.stats.misses += 1;
            // A whole upstream allocation: the tool sees it as that, no region to add.
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
                None if self.range.is_some() => {
                    let range = self.range.clone().ok_or_else(too_big)?;
                    self.grow_range(&mut st, &range, size, tag)?;
                    let a = self.take_large(&mut st, size, tag).ok_or_else(too_big)?;
                    let got = st.large.get(&a).map_or(size, |b| b.size);
                    st.stats.cached_bytes -= got as u64;
                    st.stats.misses += 1;
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
                        st.stats.cached_bytes += rest.size as u64;
                        self.cache_free(&mut st, p + size, rest);
                    }
                    p
                }
            };
            st.live.insert(addr, Live::Large { tag });
            (addr, st.large.get(&addr).map_or(size, |b| b.size))
        };
        st.stats.used_bytes += block as u64;
        // Not described while the stream is being captured, as a heap is not (see
        // `upstream_alloc`): compute-sanitizer then refused the region's unregistering
        // later (a second device's blocks, handed out inside a capture).
        if !(nvtx::mem_active() && self.capturing(tag)) {
            let base = || Self::allocation_of(&st, addr);
            self.heaps
                .block_out(self.device.as_ref(), base, addr, block);
        }
        NonNull::new(addr as *mut u8).ok_or_else(too_big)
    }

    fn free(&self, ptr: NonNull<u8>, stream: Option<RawStream>) {
        let _nvtx = nvtx::range(c"memarray.free", None);
        let mut st = self.lock();
        self.take_returned(&mut st);
        if self.held_for_graph(&st, ptr, stream) {
            st.graph_held += 1;
            return; // still in use for the capture's graph: freed when the graph is gone
        }
        self.free_in(&mut st, ptr, stream);
    }

    /// Frees the block at `ptr` on `stream` (the free's work follows the work queued there).
    fn free_in(&self, st: &mut State, ptr: NonNull<u8>, stream: Option<RawStream>) {
        let addr = ptr.as_ptr() as usize;
        let Some(live) = st.live.remove(&addr) else {
            return; // not ours (or freed twice): nothing to do, never a crash
        };
        self.heaps.block_back(self.device.as_ref(), addr);
        match live {
            Live::Passthrough { bytes, align } => {
                st.stats.upstream_bytes -= bytes as u64;
                // SAFETY: allocated from upstream with these arguments, freed once.
                unsafe { self.upstream.deallocate(ptr, bytes, align, stream) };
                return;
            }
            Live::Small { class, tag } => {
                let tag = stream.map_or(tag, |_| self.tag(stream));
                self.note_free(st, addr, tag);
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
                    remove_free(st, tag, n.size, n_addr);
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
                    remove_free(st, tag, p.size, p_addr);
                    st.drop_event(p_addr);
                    b.size += p.size;
                    start = p_addr;
                }
                self.cache_free(st, start, b);
            }
        }
        if st.stats.cached_bytes > self.release_threshold as u64 {
            self.trim_to(st, self.release_threshold);
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
        if let Some(range) = &self.range
            && Self::range_in_use(&self.lock(), range.base())
        {
            // Its users hold addresses in it: the range stays reserved and backed.
            std::mem::forget(range.clone());
        }
    }
}

#[cfg(test)]
mod tests;
