//! Giving cached memory back upstream: whole free segments first, then small blocks,
//! each free ordered after its last uses.

use std::collections::HashMap;
use std::ptr::NonNull;

use memarray_core::{Location, RawStream};

use super::{CachingPool, LargeBlock, POOL_ALIGN, State, Tag, remove_free};
use crate::event::Event;
use crate::stream::StreamRef;

impl CachingPool {
    /// Gives cached memory back until at most `target` bytes stay cached, not counting
    /// free parts of segments still partly in use (they cannot go back): whole free
    /// segments first, largest first (the big idle blocks a burst left behind), then
    /// small blocks (cheap to keep, and the likeliest to be asked for again: trimming
    /// them first made a 1 MiB pinned array cost a cuMemHostAlloc each time while a 1 GiB
    /// segment sat in the cache).
    pub(super) fn trim_to(&self, st: &mut State, target: usize) -> usize {
        if !matches!(st.sleep, super::sleep::Sleep::Awake) {
            return 0; // offloaded: its memory is released already, its blocks kept
        }
        let mut released = 0usize;
        let host_memory = self.upstream.is_accessible_from(Location::Host);
        // A segment can go back when every block in it is free, whatever streams they
        // were freed on.
        let mut by_segment: HashMap<usize, (bool, Vec<(usize, LargeBlock)>)> = HashMap::new();
        // A growing pool's range goes back from its end only (`shrink_range`): its free
        // blocks but the one ending it stay.
        let range_base = self.range.as_ref().map(|r| r.base());
        let range_tail = range_base
            .and_then(|base| Self::range_tail(st, base))
            .map(|(a, _)| a);
        let mut range_stuck = 0u64;
        for (&a, &b) in &st.large {
            if Some(b.segment) == range_base {
                if b.free && Some(a) != range_tail {
                    range_stuck += b.size as u64;
                }
                continue;
            }
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
        let target = (target as u64)
            .saturating_add(stuck)
            .saturating_add(range_stuck);
        if let Some(range) = self.range.clone() {
            released += self.shrink_range(st, &range, target);
        }
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
                events.extend(self.order_event(st, *a, b.tag));
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
                let events: Vec<Event> = self.order_event(st, a, tag).into_iter().collect();
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
            // device) is left in charge, and the error is parked so it is still seen.
            let ordered = if host_memory {
                e.synchronize()
            } else {
                StreamRef::legacy().wait(e)
            };
            crate::parked::park_err("ordering a trimmed block after its uses", ordered);
        }
        if host_memory
            && tag == legacy
            && let Some(device) = &self.device
        {
            let waited = StreamRef::legacy().synchronize(device);
            crate::parked::park_err("waiting before giving pinned blocks back", waited);
        }
        self.heaps.allocation_removed(self.device.as_ref(), addr);
        if let Some(p) = NonNull::new(addr as *mut u8) {
            // SAFETY: (addr, size, POOL_ALIGN) came from upstream.allocate and is freed
            // once; its last uses are ordered before the legacy default stream's position
            // (waited for above if host-reachable).
            unsafe { self.upstream.deallocate(p, size, POOL_ALIGN, stream) };
        }
    }
}
