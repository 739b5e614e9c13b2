//! Device work on an array that the mirror does not enqueue itself: NCCL collectives,
//! scatter / gather copies, and work a caller queued on a stream of their own
//! ([`RawArray::record_stream`]). The same rules as every mirror operation
//! (docs/architecture.md, "The mirror"): the stream first waits on the array's pending event,
//! and the array's event is recorded after the work.

use memarray_core::{Location, LockToken};

use super::raw::RawArray;
use crate::device::Device;
use crate::error::Result;
use crate::event::Enqueued;
use crate::stream::StreamRef;

impl RawArray {
    /// Records that the work queued on `stream` so far uses this array (a kernel or a
    /// library call memarray did not enqueue, such as a DLPack consumer's writes): later
    /// operations on other streams wait for it (stream-wait-event, no host block), host
    /// access waits for it, and freed memory is not reused before it. The stream belongs
    /// to the device holding the data (the array's target device when on the host).
    pub fn record_stream(&mut self, stream: StreamRef, token: Option<LockToken>) -> Result<()> {
        self.check(token)?;
        let device = match self.location {
            Location::Device(id) => id,
            Location::Host => self.device_id,
        };
        self.dev
            .record(Enqueued::new(stream, Device::get(device)?), None)
    }

    /// The device buffer a kernel on `device` and `stream` uses: the data moved there
    /// first (restored if spilled; on `stream`, no host wait), `stream` ordered after the
    /// array's pending work. Checks the lock first. For a kernel launched outside
    /// [`launch`](crate::launch::launch) (`Function::launch_raw`, another library's
    /// launcher): call [`RawArray::wrote`] or [`RawArray::was_read`] with the launch after.
    pub fn kernel_operand(
        &mut self,
        device: u32,
        stream: StreamRef,
        token: Option<memarray_core::LockToken>,
    ) -> Result<std::sync::Arc<crate::buffer::DeviceBuffer>> {
        self.move_memory(Location::Device(device), Some(stream), false, token)?;
        let buf = self.dev.current()?;
        self.dev.order(stream, device)?;
        Ok(buf)
    }

    /// The stream an operation on `device` uses: `stream`, else the array's last stream on
    /// that device, else the legacy default stream.
    pub fn stream_for(&self, stream: Option<StreamRef>, device: u32) -> StreamRef {
        self.dev.pick(stream, device)
    }

    /// Makes `op`, which wrote the array's device data, its pending work.
    pub fn wrote(&mut self, op: Enqueued) -> Result<()> {
        self.dev.record(op, None)
    }

    /// Records `op`, which only read the array's device data, so later writes wait for it.
    pub fn was_read(&self, op: &Enqueued) -> Result<()> {
        self.dev.record_read(op)
    }
}

/// The operands of NCCL collectives (built with the `nccl` feature only, so a build
/// without it has no unused code).
#[cfg(feature = "nccl")]
mod collective {
    use std::sync::Arc;

    use memarray_core::{Location, LockToken};

    use super::RawArray;
    use crate::buffer::DeviceBuffer;
    use crate::error::{ArrayError, Result};
    use crate::stream::StreamRef;

    impl RawArray {
        /// The device buffer of data that must be on `device` for `what`, with `stream`
        /// ordered after the array's pending work. Checks the lock first.
        pub(crate) fn operand_on(
            &self,
            what: &'static str,
            device: u32,
            stream: StreamRef,
            token: Option<LockToken>,
        ) -> Result<Arc<DeviceBuffer>> {
            self.check(token)?;
            // Collectives take senders by shared reference: the caller restores them
            // (the Python binding does before every collective).
            self.not_spilled()?;
            if self.location != Location::Device(device) {
                return Err(ArrayError::NotOnDevice {
                    what,
                    expected: device,
                    location: self.location,
                }
                .into());
            }
            let buf = self.dev.current()?;
            self.dev.order(stream, device)?;
            Ok(buf)
        }
    }
}
