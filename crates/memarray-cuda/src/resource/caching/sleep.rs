//! The pool's half of offload and restore ("sleep", driven by [`crate::sleep`], which does
//! the copies through the copy wing): a pool growing in place lists the large blocks handed
//! out, then releases its range's memory while the addresses stay reserved, keeping the
//! caller's copy of their bytes (the free end of the range goes for good); a restore backs
//! the range again at the same addresses, in the pieces it was backed in before (runs of
//! small ones merged), for the caller to copy each block back as soon as its pieces are
//! backed, and hands the copy back. From the start of an offload to the end of its restore
//! the pool refuses allocations (frees are taken) and gives nothing back. Small blocks
//! (separate upstream allocations, up to `SMALL_MAX` each) stay where they are.

use std::sync::Arc;

use memarray_core::{CoreError, GrowableRange, HostBuffer, Result};

use super::{CachingPool, State};
use crate::device::Device;

/// Where a pool is in a sleep.
#[derive(Debug, Default)]
pub(super) enum Sleep {
    /// Serving.
    #[default]
    Awake,
    /// Its blocks are being copied out.
    Going,
    /// Its memory released; the copy of the listed blocks kept (laid end to end, in
    /// list order), and where the range's pieces ended before.
    Asleep {
        blocks: Vec<(usize, usize)>,
        copy: HostBuffer,
        pieces: Vec<usize>,
    },
    /// Backed again; its blocks are being copied back.
    Waking,
}

/// Runs of pieces smaller than this are backed again as one (fewer driver calls).
const MERGE_BELOW: usize = 256 << 20;

/// A restore under way ([`CachingPool::restore_begin`]): the offloaded blocks, in address
/// order, with their copy laid end to end, and the range's parts to back again (offsets from
/// `base`, ascending, starting where the range's memory ends now).
#[derive(Debug)]
pub struct Restore {
    /// The offloaded blocks, `(address, bytes)`, in address order.
    pub blocks: Vec<(usize, usize)>,
    /// Their bytes, laid end to end in the blocks' order.
    pub copy: HostBuffer,
    /// The range's first address.
    pub base: usize,
    /// The parts to back, `[from, to)` offsets from `base`, ascending and adjoining.
    pub parts: Vec<(usize, usize)>,
    pieces: Vec<usize>,
}

/// The parts to back from `now` to `backed`, split where the pieces `ends` ended (runs of
/// pieces under [`MERGE_BELOW`] joined).
fn parts(ends: &[usize], now: usize, backed: usize) -> Vec<(usize, usize)> {
    let mut parts: Vec<(usize, usize)> = Vec::new();
    let mut start = now;
    let bounds = ends.iter().copied().filter(|&e| e > now && e < backed);
    for end in bounds.chain((backed > now).then_some(backed)) {
        match parts.last_mut() {
            Some((from, to)) if *to - *from < MERGE_BELOW && end - start < MERGE_BELOW => {
                *to = end;
            }
            _ => parts.push((start, end)),
        }
        start = end;
    }
    parts
}

impl CachingPool {
    /// The device whose streams the pool serves (None: a host pool).
    pub fn device(&self) -> Option<&Arc<Device>> {
        self.device.as_ref()
    }

    fn refuse(&self, what: &'static str, reason: impl Into<String>) -> CoreError {
        CoreError::Offload {
            resource: self.name.clone(),
            what,
            reason: reason.into(),
        }
    }

    fn range_or(&self, what: &'static str) -> Result<Arc<dyn GrowableRange>> {
        self.range
            .clone()
            .ok_or_else(|| self.refuse(what, "only a pool growing in place keeps its addresses"))
    }

    /// Starts an offload: waits for the device, refuses allocations from now on, and
    /// returns the large blocks handed out, `(address, bytes)`, for the caller to copy.
    /// Refused for a pool with separate segments, one not awake, or one with blocks held
    /// for CUDA graphs.
    pub fn offload_begin(&self) -> Result<Vec<(usize, usize)>> {
        let range = self.range_or("offload")?;
        let mut st = self.lock();
        self.take_returned(&mut st);
        if !matches!(st.sleep, Sleep::Awake) {
            return Err(self.refuse("offload", "it is offloaded already"));
        }
        if st.graph_held > 0 {
            return Err(self.refuse(
                "offload",
                format!("{} of its blocks are held for CUDA graphs", st.graph_held),
            ));
        }
        if let Some(device) = &self.device {
            device
                .synchronize()
                .map_err(|e| self.refuse("offload", e.to_string()))?;
        }
        let base = range.base();
        let blocks = st
            .large
            .range(base..base + st.range_len)
            .filter(|(_, b)| b.segment == base && !b.free)
            .map(|(&a, b)| (a, b.size))
            .collect();
        st.sleep = Sleep::Going;
        Ok(blocks)
    }

    /// Ends an offload begun by [`offload_begin`](Self::offload_begin): the range's memory
    /// is released (addresses kept) and `copy` (the blocks' bytes) kept until the
    /// restore; returns the bytes released. When only part of the memory could be
    /// released the pool is offloaded all the same and the error says so: restore it.
    pub fn offload_finish(&self, blocks: Vec<(usize, usize)>, copy: HostBuffer) -> Result<u64> {
        let range = self.range_or("offload")?;
        let mut st = self.lock();
        if !matches!(st.sleep, Sleep::Going) {
            return Err(self.refuse("offload", "no offload was begun"));
        }
        // The free end of the range goes first, for good: a restore backs only up to the
        // last block handed out (cached blocks are dropped, not copied).
        let trimmed = self.shrink_range(&mut st, &range, 0);
        let backed = st.range_len;
        let pieces = range.pieces();
        let left = range.unmap(0, backed);
        st.sleep = Sleep::Asleep {
            blocks,
            copy,
            pieces,
        };
        if left != 0 {
            // Part of it would not go (what did go lost its bytes): the caller restores.
            return Err(self.refuse(
                "offload",
                format!("only {} of {backed} bytes could be released", backed - left),
            ));
        }
        Ok((trimmed + backed) as u64)
    }

    /// Gives up an offload begun: the pool serves again (its memory was never released).
    pub fn offload_abort(&self) {
        let mut st = self.lock();
        if matches!(st.sleep, Sleep::Going) {
            st.sleep = Sleep::Awake;
        }
    }

    /// Starts a restore: returns the offloaded blocks, their copy and the range's parts to
    /// back again, for the caller to back each part ([`restore_back`](Self::restore_back))
    /// and copy the blocks back, then [`restore_finish`](Self::restore_finish) (or
    /// [`restore_abort`](Self::restore_abort)). Refused when not offloaded.
    pub fn restore_begin(&self) -> Result<Restore> {
        let range = self.range_or("restore")?;
        let mut st = self.lock();
        if !matches!(st.sleep, Sleep::Asleep { .. }) {
            return Err(self.refuse("restore", "it is not offloaded"));
        }
        let Sleep::Asleep {
            blocks,
            copy,
            pieces,
        } = std::mem::replace(&mut st.sleep, Sleep::Waking)
        else {
            unreachable!("checked above");
        };
        // From where the range's memory ends now (all of it released, or part of it after
        // an offload that could not release the rest).
        let parts = parts(&pieces, range.backed(), st.range_len);
        Ok(Restore {
            blocks,
            copy,
            base: range.base(),
            parts,
            pieces,
        })
    }

    /// Backs the part `[from, to)` of a restore begun (one of its `parts`, in order).
    /// Out of memory when the device has no room: the caller waits for its copies and
    /// gives up ([`restore_abort`](Self::restore_abort)).
    pub fn restore_back(&self, from: usize, to: usize) -> Result<()> {
        let range = self.range_or("restore")?;
        if !matches!(self.lock().sleep, Sleep::Waking) {
            return Err(self.refuse("restore", "no restore was begun"));
        }
        range.map(from, to)
    }

    /// Gives up a restore begun (its copies done or never queued): what it backed is
    /// released again and the pool stays offloaded, its copy kept for the next restore.
    pub fn restore_abort(&self, restore: Restore) {
        let mut st = self.lock();
        if !matches!(st.sleep, Sleep::Waking) {
            return;
        }
        if let (Ok(range), Some(&(from, _))) = (self.range_or("restore"), restore.parts.first()) {
            range.unmap(from, range.backed());
        }
        st.sleep = Sleep::Asleep {
            blocks: restore.blocks,
            copy: restore.copy,
            pieces: restore.pieces,
        };
    }

    /// Ends a restore: the pool serves again, keeping `spare` (the offload's host copy,
    /// copied back) for the next offload: [`take_spare_copy`](Self::take_spare_copy).
    pub fn restore_finish(&self, spare: Option<HostBuffer>) {
        let old = {
            let mut st = self.lock();
            st.sleep = Sleep::Awake;
            std::mem::replace(&mut st.spare_copy, spare)
        };
        drop(old); // outside the lock
    }

    /// The host copy the last restore kept, for an offload to reuse (None after a
    /// [`trim`](Self::trim), or before any offload).
    pub fn take_spare_copy(&self) -> Option<HostBuffer> {
        self.lock().spare_copy.take()
    }

    /// Whether the pool is offloaded (or between an offload's start and a restore's end).
    pub fn offloaded(&self) -> bool {
        !matches!(self.lock().sleep, Sleep::Awake)
    }

    /// An allocation while not awake: refused.
    pub(super) fn check_awake(&self, st: &State) -> Result<()> {
        if !matches!(st.sleep, Sleep::Awake) {
            return Err(CoreError::OutOfMemory {
                bytes: 0,
                resource: self.name.clone(),
                reason: "the pool is offloaded: restore it first".into(),
            });
        }
        Ok(())
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    const MIB: usize = 1 << 20;

    #[test]
    fn a_restore_backs_the_pieces_it_had_joining_runs_of_small_ones() {
        let big = MERGE_BELOW;
        // Big pieces stay as they were.
        assert_eq!(
            parts(&[big, 3 * big], 0, 3 * big),
            [(0, big), (big, 3 * big)]
        );
        // Small ones join until a run reaches the limit; a big one stands alone.
        assert_eq!(
            parts(
                &[2 * MIB, 4 * MIB, 4 * MIB + big, 4 * MIB + big + 2 * MIB],
                0,
                4 * MIB + big + 2 * MIB
            ),
            [
                (0, 4 * MIB),
                (4 * MIB, 4 * MIB + big),
                (4 * MIB + big, 4 * MIB + big + 2 * MIB)
            ]
        );
        // From where the memory ends now (a release that stopped short); pieces past the
        // range's end (none should be) are cut at it.
        assert_eq!(parts(&[big, 2 * big], big, 2 * big), [(big, 2 * big)]);
        assert_eq!(
            parts(&[big, 2 * big, 3 * big], 0, 2 * big),
            [(0, big), (big, 2 * big)]
        );
        // Nothing to back.
        assert!(parts(&[big], big, big).is_empty());
        assert!(parts(&[], 0, 0).is_empty());
    }
}
