//! A [`RawArray`]'s half of spilling ([`crate::spill`]): moving its device data to the
//! host copy and freeing the device buffer, and bringing it back.
//!
//! A spilled array keeps its logical place: `location` is `Host` (the host copy is
//! current, so every host read works unchanged), `spilled` is set, and
//! [`RawArray::location`] reports the device. Operations that need the device data call
//! [`RawArray::restore`] (through `move_memory` or directly) before touching it.

use std::sync::Arc;

use memarray_core::{HostBuffer, Location, LockToken};

use super::raw::RawArray;
use crate::error::{ArrayError, Result};
use crate::stream::StreamRef;

impl RawArray {
    /// Whether the array's data is on the host for now, spilled from its device
    /// ([`Self::location`] still names the device).
    pub fn is_spilled(&self) -> bool {
        self.spilled
    }

    /// Brings a spilled array's data back to its device on `stream` (the array's last
    /// stream when `None`), which may spill others; a no-op otherwise. With `sync` the
    /// host waits for the copy. The copy is the array's pending work, so everything
    /// after it is ordered behind it.
    pub fn restore(
        &mut self,
        stream: Option<StreamRef>,
        sync: bool,
        token: Option<LockToken>,
    ) -> Result<()> {
        self.check(token)?;
        if self.spilled {
            let _nvtx = crate::nvtx::range(c"memarray.restore", Some(self.nbytes as u64));
            let start = std::time::Instant::now();
            let host = self.host.clone().ok_or(ArrayError::NoHostCopy)?;
            self.dev
                .copy_from_host(&host, self.device_id, self.nbytes, stream)?;
            self.spilled = false;
            self.location = Location::Device(self.device_id);
            self.spill_note.restored_ns =
                Some(u64::try_from(start.elapsed().as_nanos()).unwrap_or(u64::MAX));
        }
        if sync {
            self.dev.wait_host()?;
        }
        Ok(())
    }

    /// The device the data is resident on (memarray's own memory, not spilled), and the
    /// device whose registry should list the array (resident or spilled there).
    pub(crate) fn spill_place(&self) -> (Option<u32>, Option<u32>) {
        let resident = match self.location {
            Location::Device(d) if !self.spilled && !self.dev.is_foreign() => Some(d),
            _ => None,
        };
        (
            resident,
            resident.or(self.spilled.then_some(self.device_id)),
        )
    }

    /// Fails with [`ArrayError::Spilled`] while the array is spilled (for accessors that
    /// hand out device addresses through `&self` and so cannot restore).
    pub(crate) fn not_spilled(&self) -> Result<()> {
        if self.spilled {
            return Err(ArrayError::Spilled.into());
        }
        Ok(())
    }

    /// [`Self::restore`] without waiting, ahead of use: until its next use, other arrays
    /// spill before it (a scan that prefetches the next array does not lose it to the
    /// room its own prefetch makes).
    pub fn prefetch(&mut self, stream: Option<StreamRef>, token: Option<LockToken>) -> Result<()> {
        let was = self.spilled;
        self.restore(stream, false, token)?;
        if was {
            self.spill_note.ahead = true;
        }
        Ok(())
    }

    /// Why the array cannot be spilled now, if it cannot (locked, not resident on a
    /// device, exported, in use). Never blocks.
    pub(crate) fn spill_refusal(&self) -> Option<&'static str> {
        if self.lock.is_locked() {
            return Some("it is locked");
        }
        if self.spilled || !matches!(self.location, Location::Device(_)) {
            return Some("its data is not on a device");
        }
        self.dev.spill_refusal()
    }

    /// Moves the device data into the host copy on `stream` (made by `new_host` when the
    /// array has none), waits for the copy, frees the device buffer and marks the array
    /// spilled. Returns the device bytes freed. The caller checked
    /// [`Self::spill_refusal`] under the same mutex.
    pub(crate) fn spill_to_host(
        &mut self,
        stream: StreamRef,
        new_host: &dyn Fn(usize) -> Result<HostBuffer>,
    ) -> Result<usize> {
        let _nvtx = crate::nvtx::range(c"memarray.spill", Some(self.nbytes as u64));
        let Location::Device(device) = self.location else {
            return Err(ArrayError::NotSpillable {
                reason: "its data is not on a device",
            }
            .into());
        };
        if self.host.is_none() {
            self.host = Some(Arc::new(new_host(self.nbytes)?));
        }
        let host = self.host.clone().ok_or(ArrayError::NoHostCopy)?;
        self.dev.copy_to_host(&host, self.nbytes, Some(stream))?;
        self.dev.wait_host()?;
        self.dev.drop_buffer();
        self.location = Location::Host;
        self.device_id = device;
        self.spilled = true;
        Ok(self.nbytes)
    }
}
