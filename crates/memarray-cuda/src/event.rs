//! [`Event`]: a point in a stream's work; [`Enqueued`]: the `#[must_use]` proof that an
//! operation was enqueued, to be recorded into an event or synchronized.

use std::sync::Arc;

use crate::device::Device;
use crate::driver::{self, CUevent};
use crate::error::Result;
use crate::stream::{Stream, StreamRef};

/// A CUDA event on one device. Created without timing by default (recording is cheaper);
/// [`Event::timed`] makes one for [`Event::elapsed_ms`].
#[derive(Debug)]
pub struct Event {
    device: Arc<Device>,
    handle: CUevent,
    timed: bool,
}

// SAFETY: CUDA event handles may be used from any thread; every method binds the
// device's context on the calling thread first.
unsafe impl Send for Event {}
// SAFETY: as above; the driver synchronises concurrent record/query/wait internally.
unsafe impl Sync for Event {}

impl Event {
    /// An event without timing (`CU_EVENT_DISABLE_TIMING`).
    pub fn new(device: &Arc<Device>) -> Result<Event> {
        Self::create(device, false)
    }

    /// An event that records timestamps, for benchmarks.
    pub fn timed(device: &Arc<Device>) -> Result<Event> {
        Self::create(device, true)
    }

    fn create(device: &Arc<Device>, timed: bool) -> Result<Event> {
        let _ctx = device.bind()?;
        // SAFETY: `bind` made the device's live context current (item 1).
        let handle = unsafe { driver::event_create(timed) }?;
        Ok(Event {
            device: device.clone(),
            handle,
            timed,
        })
    }

    /// An event other processes can open ([`Event::ipc_handle`]); no timing.
    pub fn interprocess(device: &Arc<Device>) -> Result<Event> {
        let _ctx = device.bind()?;
        // SAFETY: `bind` made the device's live context current.
        let handle = unsafe { driver::event_create_interprocess() }?;
        Ok(Event {
            device: device.clone(),
            handle,
            timed: false,
        })
    }

    /// The 64-byte handle another process opens with [`Event::open_ipc`]; only for
    /// [`Event::interprocess`] events (others are a driver error).
    pub fn ipc_handle(&self) -> Result<[u8; 64]> {
        let _ctx = self.device.bind()?;
        // SAFETY: the event is live; a non-interprocess event is a driver error.
        unsafe { driver::ipc_get_event_handle(self.handle) }
    }

    /// Opens another process's interprocess event on `device`: waiting on it waits for
    /// that process's work up to its latest recording.
    pub fn open_ipc(device: &Arc<Device>, handle: &[u8; 64]) -> Result<Event> {
        let _ctx = device.bind()?;
        // SAFETY: `bind` made the device's live context current.
        let handle = unsafe { driver::ipc_open_event_handle(handle) }?;
        Ok(Event {
            device: device.clone(),
            handle,
            timed: false,
        })
    }

    /// Records the event at the current end of `stream`'s work (a default stream is this
    /// event's device's). Later waits and queries refer to this recording.
    pub fn record(&self, stream: StreamRef) -> Result<()> {
        let _ctx = self.device.bind()?;
        // SAFETY: the event is live while `self` is; the stream is live by StreamRef's
        // contract and of this device's context or a default stream of it (item 1).
        unsafe { driver::event_record(self.handle, stream.cu()) }
    }

    /// Blocks the host until the recorded work is done (at once if never recorded).
    pub fn synchronize(&self) -> Result<()> {
        let _ctx = self.device.bind()?;
        // SAFETY: the event is live while `self` is (item 1).
        unsafe { driver::event_synchronize(self.handle) }
    }

    /// Whether the recorded work is done (`true` if never recorded). Does not block.
    pub fn is_complete(&self) -> Result<bool> {
        let _ctx = self.device.bind()?;
        // SAFETY: the event is live while `self` is (item 1).
        unsafe { driver::event_query(self.handle) }
    }

    /// Milliseconds from `start`'s recording to this one's. Both must be
    /// [`Event::timed`] and complete; otherwise the driver's error is returned.
    pub fn elapsed_ms(&self, start: &Event) -> Result<f32> {
        let _ctx = self.device.bind()?;
        // SAFETY: both events are live while borrowed; the driver reports events without
        // timing as CUDA_ERROR_INVALID_HANDLE rather than misbehaving (item 1).
        unsafe { driver::event_elapsed_ms(start.handle, self.handle) }
    }

    /// Whether this event records timestamps.
    pub fn is_timed(&self) -> bool {
        self.timed
    }

    /// The device the event belongs to.
    pub fn device(&self) -> &Arc<Device> {
        &self.device
    }

    /// The driver handle.
    pub(crate) fn handle(&self) -> CUevent {
        self.handle
    }
}

impl Drop for Event {
    fn drop(&mut self) {
        // Drop cannot return an error: a failure is parked (`crate::parked`).
        match self.device.bind() {
            Ok(_ctx) => {
                // SAFETY: the handle is live and never used after this (item 1).
                let done = unsafe { driver::event_destroy(self.handle) };
                crate::parked::park_err("destroying an event", done);
            }
            Err(e) => crate::parked::park("binding the context to destroy an event", e),
        }
    }
}

/// Returned by every asynchronous operation (copy, memset, kernel): the work is enqueued
/// on [`Enqueued::stream`] but may not have run. Record it into an [`Event`] so that
/// other streams and host reads can wait for it, or block with
/// [`Enqueued::synchronize`]. Dropping it does nothing: ordering is then the caller's
/// business (work later on the same stream is ordered anyway).
#[must_use = "record the operation into an Event (or synchronize) so later work and host reads can wait for it"]
#[derive(Debug)]
pub struct Enqueued {
    stream: StreamRef,
    device: Arc<Device>,
}

impl Enqueued {
    /// The work queued on `stream` (of `device`) so far, as an operation to record or wait
    /// for: what a call that enqueued nothing returns.
    pub fn new(stream: StreamRef, device: Arc<Device>) -> Self {
        Enqueued { stream, device }
    }

    /// The stream the operation was enqueued on.
    pub fn stream(&self) -> StreamRef {
        self.stream
    }

    /// The device whose context ran the operation.
    pub fn device(&self) -> &Arc<Device> {
        &self.device
    }

    /// Records `event` right after the operation.
    pub fn record(self, event: &Event) -> Result<()> {
        event.record(self.stream)
    }

    /// Records a new event (without timing) right after the operation and returns it.
    pub fn into_event(self) -> Result<Event> {
        let e = Event::new(&self.device)?;
        e.record(self.stream)?;
        Ok(e)
    }

    /// Blocks until the stream, and so the operation, is done.
    pub fn synchronize(self) -> Result<()> {
        self.stream.synchronize(&self.device)
    }
}

// Waiting on an event is a stream operation that names an event: it lives here, with the
// events, so `stream` (which events record on) needs nothing of `event`.
impl StreamRef {
    /// Makes later work on this stream wait until `event`'s recorded work is done,
    /// without blocking the host. A default stream here is `event`'s device's.
    pub fn wait(self, event: &Event) -> Result<()> {
        let _ctx = event.device().bind()?;
        // SAFETY: the stream is live by `from_raw`'s contract or is a recycled (never
        // destroyed) `Stream`; default streams refer to the bound context (item 1); the
        // event is live while borrowed (item 2).
        unsafe { driver::stream_wait_event(self.cu(), event.handle()) }
    }

    /// [`StreamRef::wait`] where a default stream is `device`'s (the device the next
    /// operation on this stream runs on) rather than `event`'s. Events of another device
    /// may be waited on.
    pub(crate) fn wait_on(self, device: &Device, event: &Event) -> Result<()> {
        let _ctx = device.bind()?;
        // SAFETY: the stream is live as in `wait`, a default stream referring to the
        // bound context of `device` (item 1); the event is live while borrowed (item 2).
        unsafe { driver::stream_wait_event(self.cu(), event.handle()) }
    }

    /// Under a capture of this stream: makes the graph wait for `event` as an external
    /// event node (each launch waits for the event's latest recording), for an event
    /// recorded outside the capture, which a plain wait may not name.
    pub(crate) fn wait_on_external(self, device: &Device, event: &Event) -> Result<()> {
        let _ctx = device.bind()?;
        // SAFETY: as in `wait_on`; the flag is valid under capture, which the caller
        // checked.
        unsafe { driver::stream_wait_event_external(self.cu(), event.handle()) }
    }
}

impl Stream {
    /// Makes later work on this stream wait for `event` (no host block).
    pub fn wait(&self, event: &Event) -> Result<()> {
        self.as_ref().wait(event)
    }
}
