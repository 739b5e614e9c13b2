//! A pool whose large blocks live in one growing address range ([`GrowableRange`]: CUDA's
//! virtual memory on a device, `mmap` on the host) instead of separate upstream segments:
//! a miss backs more of the range (extending a free block at its end when there is one),
//! so blocks from different growths coalesce when freed, and giving memory back unmaps
//! the range's free end. Small blocks still come from the upstream, one each.

use std::sync::Arc;

use memarray_core::{CoreError, GrowableRange, Result};

use super::{CachingPool, LargeBlock, State, Tag, remove_free};
use crate::stream::StreamRef;

impl CachingPool {
    /// The free block ending the range, if there is one.
    pub(super) fn range_tail(st: &State, base: usize) -> Option<(usize, LargeBlock)> {
        let end = base + st.range_len;
        st.large
            .range(base..end)
            .next_back()
            .filter(|(a, b)| b.segment == base && b.free && **a + b.size == end)
            .map(|(a, b)| (*a, *b))
    }

    /// Backs enough more of the range for a large block of `size` on stream `tag` and
    /// puts the new memory in the cache as a free block (joined to a free block of the
    /// same stream that ends the range); the caller takes the block from the cache.
    pub(super) fn grow_range(
        &self,
        st: &mut State,
        range: &Arc<dyn GrowableRange>,
        size: usize,
        tag: Tag,
    ) -> Result<()> {
        let base = range.base();
        let mut retried = false;
        loop {
            let tail = Self::range_tail(st, base).filter(|(_, b)| b.tag == tag);
            let have = tail.map_or(0, |(_, b)| b.size);
            if have >= size {
                return Ok(()); // the free end fits already
            }
            let grow = (size - have)
                .checked_next_multiple_of(range.granularity())
                .ok_or_else(|| self.range_full(size, range))?;
            let from = st.range_len;
            let to = from
                .checked_add(grow)
                .filter(|&to| to <= range.capacity())
                .ok_or_else(|| self.range_full(size, range))?;
            match range.map(from, to) {
                Ok(()) => {
                    self.add_backed(st, base, from, grow, tail, tag);
                    return Ok(());
                }
                // No memory to back it: the cache goes back first, once (the free end
                // too), then one more try.
                Err(CoreError::OutOfMemory { .. }) if !retried => {
                    retried = true;
                    self.trim_to(st, 0);
                }
                Err(e) => return Err(e),
            }
        }
    }

    /// `grow` bytes backed at offset `from` become a free block (joined to `tail`).
    fn add_backed(
        &self,
        st: &mut State,
        base: usize,
        from: usize,
        grow: usize,
        tail: Option<(usize, LargeBlock)>,
        tag: Tag,
    ) {
        st.range_len = from + grow;
        st.segments.insert(base, st.range_len);
        st.stats.upstream_bytes += grow as u64;
        st.stats.cached_bytes += grow as u64;
        let (start, size) = match tail {
            Some((a, b)) => {
                st.large.remove(&a);
                remove_free(st, b.tag, b.size, a);
                st.drop_event(a);
                (a, b.size + grow)
            }
            None => (base + from, grow),
        };
        let block = LargeBlock {
            size,
            segment: base,
            free: true,
            tag,
        };
        self.cache_free(st, start, block);
    }

    fn range_full(&self, size: usize, range: &Arc<dyn GrowableRange>) -> CoreError {
        CoreError::OutOfMemory {
            bytes: size,
            resource: self.name.clone(),
            reason: format!(
                "the pool's reserved range ({} bytes) is full",
                range.capacity()
            ),
        }
    }

    /// Unmaps the free end of the range while more than `target` bytes are cached, in
    /// whole pieces of its granularity, once the work queued before that block's free is
    /// done (the device waits for it: unmapping memory still in use is not allowed).
    /// Returns the bytes released.
    pub(super) fn shrink_range(
        &self,
        st: &mut State,
        range: &Arc<dyn GrowableRange>,
        target: u64,
    ) -> usize {
        let base = range.base();
        if st.stats.cached_bytes <= target {
            return 0;
        }
        let Some((addr, b)) = Self::range_tail(st, base) else {
            return 0;
        };
        let keep = (addr - base).next_multiple_of(range.granularity());
        if keep >= st.range_len {
            return 0; // the free end is shorter than a piece
        }
        // The block's last uses finish before its memory goes.
        let event = self.order_event(st, addr, b.tag);
        match (&event, &self.device) {
            (Some(e), _) => {
                crate::parked::park_err("waiting to unmap a pool range", e.synchronize())
            }
            (None, Some(device)) => crate::parked::park_err(
                "waiting to unmap a pool range",
                StreamRef::legacy().synchronize(device),
            ),
            (None, None) => {}
        }
        st.events.extend(event);
        st.large.remove(&addr);
        remove_free(st, b.tag, b.size, addr);
        // Where memory goes back only in the pieces it was backed in, less may go.
        let keep = range.unmap(keep, st.range_len).min(st.range_len);
        let released = st.range_len - keep;
        st.range_len = keep;
        if keep == 0 {
            st.segments.remove(&base);
        } else {
            st.segments.insert(base, keep);
        }
        st.stats.cached_bytes -= released as u64;
        st.stats.upstream_bytes -= released as u64;
        if addr < base + keep {
            let rest = LargeBlock {
                size: base + keep - addr,
                ..b
            };
            self.cache_free(st, addr, rest);
        }
        released
    }

    /// Whether a block of the range is still handed out (the range must then outlive the
    /// pool: its users hold addresses in it).
    pub(super) fn range_in_use(st: &State, base: usize) -> bool {
        st.large.values().any(|b| b.segment == base && !b.free)
    }
}
