//! [`RawArray`]'s moves: the data to another location (host or a device, on a stream,
//! ordered by events), a new array holding the data elsewhere (`copied_to`), a deep copy,
//! and a swap of contents.

use std::sync::Arc;

use memarray_core::{Location, Lock, LockToken};

use super::raw::RawArray;
use crate::error::{ArrayError, CudaError, Result};
use crate::spill::SpillNote;
use crate::stream::StreamRef;

impl RawArray {
    /// A new array holding this one's data at `target` (the Array API's `to_device`; this
    /// array is left as it is, unlike [`RawArray::move_memory`]):
    /// host data bound for a device goes straight into an array born there (one staged
    /// upload, no host copy in between); device data bound for another device is copied
    /// there once, peer to peer, into an array born there; anything else is a clone moved
    /// to `target` on `stream`. Returns once the copy is done.
    pub fn copied_to(
        &self,
        target: Location,
        stream: Option<StreamRef>,
        token: Option<LockToken>,
    ) -> Result<Self> {
        self.check(token)?;
        if self.location == Location::Host && !self.spilled && target != Location::Host {
            self.dev.wait_host()?;
            let mut out = Self::empty_on(
                self.dtype,
                &self.shape,
                target,
                Some(self.host_kind),
                stream,
            )?;
            out.write_all(self.host_buf()?.as_slice(), None)?;
            return Ok(out);
        }
        if let (Location::Device(from), Location::Device(to)) = (self.location, target)
            && from != to
            && !self.spilled
        {
            let dev = self.dev.copy_on(to, self.nbytes, stream)?;
            let mut out = Self::on_device_only(self.dtype, &self.shape, self.nbytes, to, dev);
            out.host_kind = self.host_kind;
            out.dev.wait_host()?;
            return Ok(out);
        }
        let mut out = self.try_clone(token)?;
        out.move_memory(target, stream, true, None)?;
        Ok(out)
    }

    /// Copies the current data to `target` on `stream` (the array's last stream, or the
    /// legacy default stream, when `None`) and records an event. Returns at once when the
    /// data is already there. `sync` only decides whether the call waits for the copy.
    pub fn move_memory(
        &mut self,
        target: Location,
        stream: Option<StreamRef>,
        sync: bool,
        token: Option<LockToken>,
    ) -> Result<()> {
        self.check(token)?;
        if self.spilled {
            match target {
                // The host copy is current: no copy at all.
                Location::Host => self.spilled = false,
                Location::Device(d) if d == self.device_id => {
                    return self.restore(stream, sync, token);
                }
                // Straight from the host copy to the other device.
                Location::Device(_) => self.spilled = false,
            }
        }
        if target == self.location {
            if sync {
                self.dev.wait_host()?;
            }
            return Ok(());
        }
        match (self.location, target) {
            (Location::Host, Location::Device(id)) => {
                let host = self
                    .host
                    .as_ref()
                    .ok_or(CudaError::Array(ArrayError::NoHostCopy))?;
                self.dev.copy_from_host(host, id, self.nbytes, stream)?;
                self.device_id = id;
            }
            (Location::Device(_), Location::Host) => {
                self.ensure_host()?;
                let host = self
                    .host
                    .as_ref()
                    .ok_or(CudaError::Array(ArrayError::NoHostCopy))?;
                self.dev.copy_to_host(host, self.nbytes, stream)?;
            }
            (Location::Device(_), Location::Device(to)) => {
                self.dev.move_peer(to, self.nbytes, stream)?;
                self.device_id = to;
            }
            // Equal locations returned above; nothing to copy.
            (Location::Host, Location::Host) => return Ok(()),
        }
        self.location = target;
        if sync {
            self.dev.wait_host()?;
        }
        Ok(())
    }

    /// A deep copy: new buffers holding the current data, at the same location, unlocked.
    pub fn try_clone(&self, token: Option<LockToken>) -> Result<Self> {
        self.check(token)?;
        self.dev.wait_host()?;
        let host = match &self.host {
            Some(h) => Some(Arc::new(h.try_clone()?)),
            None => None,
        };
        let dev = self.dev.try_clone(self.location, self.nbytes)?;
        Ok(Self {
            dtype: self.dtype,
            shape: self.shape.clone(),
            nbytes: self.nbytes,
            host,
            host_kind: self.host_kind,
            device_id: self.device_id,
            location: self.location,
            lock: Arc::new(Lock::new()),
            dev,
            // A spilled array's copy is spilled too: restored on its first device use.
            spilled: self.spilled,
            spill_note: SpillNote::default(),
        })
    }

    /// Swaps contents (dtype, shape, buffers, location, pending work) with `other`,
    /// without copying. Both arrays must be unlocked; locks stay with their array.
    pub fn swap(&mut self, other: &mut Self) -> Result<()> {
        self.check(None)?;
        other.check(None)?;
        std::mem::swap(&mut self.dtype, &mut other.dtype);
        std::mem::swap(&mut self.shape, &mut other.shape);
        std::mem::swap(&mut self.nbytes, &mut other.nbytes);
        std::mem::swap(&mut self.host, &mut other.host);
        std::mem::swap(&mut self.host_kind, &mut other.host_kind);
        std::mem::swap(&mut self.device_id, &mut other.device_id);
        std::mem::swap(&mut self.location, &mut other.location);
        std::mem::swap(&mut self.dev, &mut other.dev);
        std::mem::swap(&mut self.spilled, &mut other.spilled);
        Ok(())
    }
}
