//! The pool's half of offload and restore ("sleep", driven by [`crate::sleep`], which does
//! the copies through the copy wing): a pool growing in place lists the large blocks handed
//! out, then releases its range's memory while the addresses stay reserved, keeping the
//! caller's copy of their bytes; a restore backs the range again at the same addresses and
//! hands the copy back. From the start of an offload to the end of its restore the pool
//! refuses allocations (frees are taken) and gives nothing back. Small blocks (separate
//! upstream allocations, up to `SMALL_MAX` each) stay where they are.

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
    /// list order).
    Asleep {
        blocks: Vec<(usize, usize)>,
        copy: HostBuffer,
    },
    /// Backed again; its blocks are being copied back.
    Waking,
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
        let backed = st.range_len;
        let left = range.unmap(0, backed);
        st.sleep = Sleep::Asleep { blocks, copy };
        if left != 0 {
            // Part of it would not go (what did go lost its bytes): the caller restores.
            return Err(self.refuse(
                "offload",
                format!("only {} of {backed} bytes could be released", backed - left),
            ));
        }
        Ok(backed as u64)
    }

    /// Gives up an offload begun: the pool serves again (its memory was never released).
    pub fn offload_abort(&self) {
        let mut st = self.lock();
        if matches!(st.sleep, Sleep::Going) {
            st.sleep = Sleep::Awake;
        }
    }

    /// Starts a restore: backs the range again at the same addresses and returns the
    /// offloaded blocks and their copy, for the caller to copy back, then
    /// [`restore_finish`](Self::restore_finish). Refused when not offloaded; out of memory
    /// when the device has no room (the pool stays offloaded).
    pub fn restore_begin(&self) -> Result<(Vec<(usize, usize)>, HostBuffer)> {
        let range = self.range_or("restore")?;
        let mut st = self.lock();
        if !matches!(st.sleep, Sleep::Asleep { .. }) {
            return Err(self.refuse("restore", "it is not offloaded"));
        }
        // Backed from where the range's memory ends now (all of it released, or part of
        // it after an offload that could not release the rest).
        let (now, backed) = (range.backed(), st.range_len);
        if now < backed {
            range.map(now, backed)?;
        }
        let Sleep::Asleep { blocks, copy } = std::mem::replace(&mut st.sleep, Sleep::Waking) else {
            unreachable!("checked above");
        };
        Ok((blocks, copy))
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
