//! The device side's ordering, by docs/architecture.md's rules ("The mirror"): the
//! pending work (event, stream, buffers it keeps alive), a lazy import's ordering turned
//! into an event on first use, picking the stream for an operation, making a stream wait,
//! recording after a write or a read, and the host's wait.

use std::sync::Arc;
use std::sync::atomic::Ordering;

use crate::buffer::DeviceBuffer;
use crate::device::Device;
use crate::error::Result;
use crate::event::{Enqueued, Event};
use crate::graph::Capture;
use crate::stream::StreamRef;

use super::{CaptureUse, CapturedWork, DeviceSide, Pending};

/// The capture `stream` (of `device`) is in, if any: the one question the ordering asks
/// before it records or waits (one driver query, no allocation).
fn capture_id(stream: StreamRef, device: &Device) -> Result<Option<u64>> {
    Ok(match stream.capture(device)? {
        Capture::None => None,
        Capture::Active { id } | Capture::Invalidated { id } => Some(id),
    })
}

impl DeviceSide {
    /// Records `event` (an interprocess event) on the legacy stream of the data's device
    /// after the pending work, for another process to wait on.
    pub(crate) fn record_shared(&self, event: &Event) -> Result<()> {
        let legacy = StreamRef::legacy();
        self.order(legacy, event.device().id())?;
        event.record(legacy)
    }

    pub(super) fn pending(&self) -> std::sync::MutexGuard<'_, Option<Pending>> {
        self.settle();
        self.pending.lock().unwrap_or_else(|e| e.into_inner())
    }

    /// Turns a lazy import's ordering into pending work: an event recorded now on the
    /// legacy stream (after the producer's work). If no event can be made, the host waits
    /// for the legacy stream instead, which orders just as well.
    pub(super) fn settle(&self) {
        let Some(device) = self.lazy.lock().unwrap_or_else(|e| e.into_inner()).take() else {
            return;
        };
        let legacy = StreamRef::legacy();
        let event = Event::new(&device).and_then(|e| {
            e.record(legacy)?;
            Ok(e)
        });
        match event {
            Ok(event) => {
                let mut guard = self.pending.lock().unwrap_or_else(|e| e.into_inner());
                if guard.is_none() {
                    *guard = Some(Pending {
                        event: Arc::new(event),
                        stream: Some(legacy),
                        keep_alive: Vec::new(),
                    });
                }
            }
            Err(e) => {
                // No event to record: waiting for the stream gives the same order.
                crate::parked::park("recording lazy work's event", e);
                crate::parked::park_err("waiting for lazy work", legacy.synchronize(&device));
            }
        }
    }

    /// The stream for an operation on `device_id`: the caller's, else the last one if it
    /// ran on that device, else the legacy default stream (which is per device).
    pub(in crate::array) fn pick(&self, stream: Option<StreamRef>, device_id: u32) -> StreamRef {
        let last = self.last_stream.filter(|&(_, d)| d == device_id);
        stream
            .or(last.map(|(s, _)| s))
            .unwrap_or(StreamRef::legacy())
    }

    /// Orders `stream`, on which the next operation runs on device `device_id`, after
    /// pending work on another stream (stream-wait-event, no host block). A default
    /// stream is per device: the same handle on another device is another stream, which
    /// must wait too, with that device bound.
    ///
    /// Under a stream capture: after this array's earlier work in the same capture (a
    /// fork joined inside the graph); eager work from before the capture becomes an
    /// external wait in the graph (each launch waits for it), since a capture may not wait
    /// on an uncaptured event otherwise. Nothing is asked of the driver when no wait could
    /// be needed.
    pub(in crate::array) fn order(&self, stream: StreamRef, device_id: u32) -> Result<()> {
        // Lazy work is on this device's legacy stream: later work there follows it.
        if stream == StreamRef::legacy()
            && self
                .lazy
                .lock()
                .unwrap_or_else(|e| e.into_inner())
                .as_ref()
                .is_some_and(|d| d.id() == device_id)
        {
            return Ok(());
        }
        let pending = self.pending();
        let eager = pending
            .as_ref()
            .filter(|p| p.stream != Some(stream) || p.event.device().id() != device_id);
        let mut captured = self.captured.lock().unwrap_or_else(|e| e.into_inner());
        if eager.is_none() && captured.is_none() {
            return Ok(());
        }
        let device = Device::get(device_id)?;
        let Some(id) = capture_id(stream, &device)? else {
            *captured = None; // a capture's work orders only that capture's later work
            if let Some(p) = eager {
                stream.wait_on(&device, &p.event)?;
            }
            return Ok(());
        };
        if let Some(c) = captured.as_ref().filter(|c| c.id == id) {
            // Eager work was ordered before this capture's first use of the array.
            if c.stream != stream {
                stream.wait_on(&device, &c.event)?;
            }
            return Ok(());
        }
        // Not asked whether it is done: a capture in global or thread-local mode forbids
        // querying events (the query invalidates it); a wait on done work costs nothing.
        if let Some(p) = eager {
            stream.wait_on_external(&device, &p.event)?;
        }
        Ok(())
    }

    /// Records `op`, enqueued under the capture `id`, as this array's captured work (not
    /// its pending work, which stays the eager work before the capture); `write` says
    /// whether it wrote the device data. The array's first use in a capture, and its first
    /// write there, are news for its graph ([`Self::take_capture_news`]).
    fn record_captured(
        &self,
        id: u64,
        op: &Enqueued,
        keep: Option<Arc<DeviceBuffer>>,
        write: bool,
    ) -> Result<()> {
        let mut captured = self.captured.lock().unwrap_or_else(|e| e.into_inner());
        let event = match captured.as_ref() {
            Some(c) if c.event.device().id() == op.device().id() => c.event.clone(),
            _ => Arc::new(Event::new(op.device())?),
        };
        event.record(op.stream())?;
        let (mut keep_alive, wrote) = match captured.take() {
            Some(c) if c.id == id => (c.keep_alive, Some(c.write)),
            _ => (Vec::new(), None),
        };
        // News: a first use, a first write, or memory the graph must keep (a buffer the
        // captured work reads that the array let go of: a move's source).
        if wrote.is_none_or(|w| write && !w) || keep.is_some() {
            self.capture_news.store(true, Ordering::Relaxed);
        }
        keep_alive.extend(keep);
        *captured = Some(CapturedWork {
            id,
            event,
            stream: op.stream(),
            keep_alive,
            write: write || wrote.unwrap_or(false),
        });
        Ok(())
    }

    /// What a capture learnt of this array since the last call: the capture, whether it
    /// writes the array, and where the array's device data was (one relaxed load when
    /// there is no news).
    pub(in crate::array) fn take_capture_news(&self) -> Option<CaptureUse> {
        // A load first: every state guard's drop asks, and a swap would write the line.
        if !self.capture_news.load(Ordering::Relaxed)
            || !self.capture_news.swap(false, Ordering::Relaxed)
        {
            return None;
        }
        let captured = self.captured.lock().unwrap_or_else(|e| e.into_inner());
        let c = captured.as_ref()?;
        let buffer = self.buffer.as_ref()?;
        Some(CaptureUse {
            id: c.id,
            write: c.write,
            device: buffer.device().id(),
            addr: buffer.device_ptr(),
            keep: c.keep_alive.clone(),
        })
    }

    /// Records the array's event after `op` and makes it the pending work. If recording
    /// fails, the previous pending work (and the buffers it keeps alive) stays in place.
    pub(in crate::array) fn record(
        &mut self,
        op: Enqueued,
        keep: Option<Arc<DeviceBuffer>>,
    ) -> Result<()> {
        if let Some(id) = capture_id(op.stream(), op.device())? {
            self.record_captured(id, &op, keep, true)?;
            // The captured stream becomes the default, as after any write, so the array's
            // next call without a stream is captured too (or refused).
            let stream = op.stream();
            self.last_stream = stream.is_persistent().then_some((stream, op.device().id()));
            return Ok(());
        }
        let stream = op.stream();
        let device = op.device().clone();
        self.settle();
        let mut guard = self.pending.lock().unwrap_or_else(|e| e.into_inner());
        let event = match guard.as_ref() {
            // Re-recording reuses the event: later waits capture the new point; work
            // that waited on the old point is ordered before it anyway.
            // (Not another process's event: the mirror never records one of those.)
            Some(p) if p.event.device().id() == device.id() && p.stream.is_some() => {
                p.event.clone()
            }
            _ => Arc::new(Event::new(&device)?),
        };
        op.record(&event)?;
        let mut keep_alive = guard.take().map(|p| p.keep_alive).unwrap_or_default();
        keep_alive.extend(keep);
        *guard = Some(Pending {
            event,
            stream: Some(stream),
            keep_alive,
        });
        drop(guard);
        // A foreign handle is promised only for this call: later defaults use the
        // legacy stream instead of keeping it.
        self.last_stream = stream.is_persistent().then_some((stream, device.id()));
        Ok(())
    }

    /// Records the array's event after `op`, which only reads the device copy (a copy
    /// out of it), so that later writes on other streams wait for the read.
    pub(in crate::array) fn record_read(&self, op: &Enqueued) -> Result<()> {
        if let Some(id) = capture_id(op.stream(), op.device())? {
            return self.record_captured(id, op, None, false);
        }
        let mut guard = self.pending();
        let event = match guard.as_ref() {
            Some(p) if p.event.device().id() == op.device().id() && p.stream.is_some() => {
                p.event.clone()
            }
            _ => Arc::new(Event::new(op.device())?),
        };
        event.record(op.stream())?;
        let keep_alive = guard.take().map(|p| p.keep_alive).unwrap_or_default();
        *guard = Some(Pending {
            event,
            stream: Some(op.stream()),
            keep_alive,
        });
        Ok(())
    }

    /// Whether work is pending that a host access would wait for (a lazy import's
    /// producer work counts; asking does not record its event).
    pub(crate) fn has_pending(&self) -> bool {
        self.lazy
            .lock()
            .unwrap_or_else(|e| e.into_inner())
            .is_some()
            || self
                .pending
                .lock()
                .unwrap_or_else(|e| e.into_inner())
                .is_some()
    }

    /// Whether dropping this device side may block the host: recorded pending work. A
    /// lazy import never used is dropped without a wait (nothing of memarray's ran on it).
    pub(crate) fn drop_may_wait(&self) -> bool {
        self.pending
            .lock()
            .unwrap_or_else(|e| e.into_inner())
            .is_some()
    }

    /// Refuses `what` with [`crate::CudaError::Captured`] while the capture that recorded
    /// this array's captured work is still going on.
    pub(in crate::array) fn refuse_if_captured(&self, what: &'static str) -> Result<()> {
        let captured = self.captured.lock().unwrap_or_else(|e| e.into_inner());
        let Some(c) = captured.as_ref() else {
            return Ok(());
        };
        match c.stream.capture(c.event.device())? {
            Capture::Active { id } | Capture::Invalidated { id } if id == c.id => {
                c.stream.refuse_under_capture(c.event.device(), what)
            }
            _ => Ok(()),
        }
    }

    /// Blocks the host until pending work is done, then forgets it.
    pub(crate) fn wait_host(&self) -> Result<()> {
        let mut guard = self.pending();
        if let Some(p) = guard.as_ref() {
            p.event.synchronize()?;
            // Keep the event object for reuse; only the buffers kept alive can go.
            if let Some(p) = guard.take() {
                drop(p.keep_alive);
            }
        }
        Ok(())
    }

    /// As [`Self::record`], except that a copy on the legacy default stream with nothing
    /// pending before it is kept as [`Self::lazy`] ordering: the event is recorded on
    /// first use (a small upload then costs no event).
    pub(super) fn record_legacy_lazily(&mut self, op: Enqueued) -> Result<()> {
        let lazy = self.lazy.get_mut().unwrap_or_else(|e| e.into_inner());
        let pending = self.pending.get_mut().unwrap_or_else(|e| e.into_inner());
        if op.stream() != StreamRef::legacy() || pending.is_some() || lazy.is_some() {
            return self.record(op, None);
        }
        *lazy = Some(op.device().clone());
        self.last_stream = None;
        Ok(())
    }

    /// The stream work is pending on, if any (for the CUDA Array Interface `stream`). A
    /// foreign stream cannot be named after the call that gave it (it may be gone), nor can
    /// another process's (an IPC import's event): the host waits for that work instead and
    /// `None` is returned.
    pub(crate) fn pending_stream(&self) -> Result<Option<StreamRef>> {
        let pending = self.pending().as_ref().map(|p| p.stream);
        match pending {
            // Another process's work, or a foreign stream: wait here instead of naming it.
            Some(s) if s.is_none_or(|s| !s.is_persistent()) => {
                self.wait_host()?;
                Ok(None)
            }
            other => Ok(other.flatten()),
        }
    }
}
