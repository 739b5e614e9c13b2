//! The device half of a [`super::RawArray`]: the lazily allocated device buffer, the
//! array's event, and the ordering rules of docs/architecture.md ("The mirror").
//!
//! - Every asynchronous operation runs on a stream and re-records the array's event
//!   there; `pending` remembers that stream.
//! - An operation on another stream first makes it wait on the event (no host block).
//! - Host access waits for the event, then forgets it.
//! - Buffers replaced while work may still use them (a peer move's source) stay alive in
//!   `pending` until that work is known to be done.

use std::sync::{Arc, Mutex};

use memarray_core::MemoryResource;

use crate::buffer::DeviceBuffer;
use crate::device::Device;
use crate::error::Result;
use crate::event::{Enqueued, Event};
use crate::resource::default_resource;
use crate::stream::StreamRef;

mod copies;

/// How the consumer of an export synchronises with the array's pending work (the device
/// side's ordering decides it; exports name it).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Consumer {
    /// The consumer does not synchronise (DLPack `stream=-1`): the caller's business.
    NoSync,
    /// The host waits for pending work before the export is handed out.
    Host,
    /// The consumer works on this stream, which is made to wait on pending work.
    Stream(StreamRef),
}

/// Keeps an exported buffer alive; when the consumer releases the export, the work it
/// queued on its stream by then is recorded as a use of the buffer, so a pool does not
/// hand the memory out again under that work.
#[derive(Debug)]
struct ExportOwner {
    buf: Arc<DeviceBuffer>,
    consumer: Option<StreamRef>,
}

impl Drop for ExportOwner {
    fn drop(&mut self) {
        if let Some(s) = self.consumer {
            self.buf.record_use(s);
        }
    }
}

#[derive(Debug)]
struct Pending {
    event: Arc<Event>,
    /// The stream the work ran on; `None` when it is on none of this process's streams
    /// (another process's work, an IPC import's event): every stream then waits.
    stream: Option<StreamRef>,
    keep_alive: Vec<Arc<DeviceBuffer>>,
}

/// Device buffer, event and pending work of one array.
#[derive(Debug)]
pub(crate) struct DeviceSide {
    buffer: Option<Arc<DeviceBuffer>>,
    pending: Mutex<Option<Pending>>,
    /// The stream of the last operation and the device it ran on: the default for the
    /// next operation on that device. Streams belong to one device: kernels launched and
    /// events recorded on another device's stream fail, so it is never reused elsewhere.
    last_stream: Option<(StreamRef, u32)>,
    /// Where this array's device buffers come from, instead of the device's default
    /// resource ([`crate::resource::default_resource`]).
    resource: Option<Arc<dyn MemoryResource>>,
    /// Whether a buffer here is a producer's memory (a shared import): freeing it hands
    /// it back to the producer, so the host waits for queued work first.
    foreign: bool,
    /// Work on this device's legacy default stream not yet captured in an event (an
    /// import's producer work, or memarray's own upload of pageable memory): the event is
    /// recorded there on first use ([`Self::settle`]), which orders after that work just
    /// as well, and an array dropped unused never pays for one.
    lazy: Mutex<Option<Arc<Device>>>,
}

impl Drop for DeviceSide {
    /// Queued work may still use the buffers being freed. Memarray's own buffers are freed
    /// stream-ordered: each one's free stream first waits on the pending event (no host
    /// block), so whatever resource reuses the memory orders that reuse after the work.
    /// Memory a producer owns (a shared import) goes back to the producer, which cannot be
    /// told about streams: the host waits for the work first. Buffers shared with live
    /// exports stay alive regardless. (The host copy is the array's: `RawArray`'s drop
    /// waits for pending work before freeing it.)
    fn drop(&mut self) {
        if self.foreign {
            // Unused since the import: nothing of memarray's was queued on the memory. (An
            // IPC import's pending event is the exporter's: its later work is not ours to
            // wait for.)
            let lazy_unused = self
                .lazy
                .get_mut()
                .map(|l| l.take())
                .ok()
                .flatten()
                .is_some();
            let unused = match self.pending.get_mut().unwrap_or_else(|e| e.into_inner()) {
                None => lazy_unused,
                Some(p) => p.stream.is_none(),
            };
            if !unused {
                crate::parked::park_err("waiting for a dropped array's work", self.wait_host());
            }
            return;
        }
        // Lazy work on the legacy stream: a buffer freed on that stream is ordered after
        // it already; one freed elsewhere waits for its event.
        let lazy = self.lazy.get_mut().map(|l| l.is_some()).unwrap_or(true);
        if lazy
            && self
                .buffer
                .iter()
                .any(|b| b.free_stream() != StreamRef::legacy())
        {
            self.settle();
        }
        let pending = self
            .pending
            .get_mut()
            .unwrap_or_else(|e| e.into_inner())
            .take();
        if let Some(p) = pending {
            let ordered = self
                .buffer
                .iter()
                .chain(p.keep_alive.iter())
                .all(|b| b.free_stream().wait(&p.event).is_ok());
            if !ordered {
                crate::parked::park_err(
                    "waiting for a dropped array's work",
                    p.event.synchronize(),
                );
            }
        }
    }
}

impl DeviceSide {
    pub(crate) fn new() -> Self {
        Self {
            buffer: None,
            pending: Mutex::new(None),
            last_stream: None,
            resource: None,
            foreign: false,
            lazy: Mutex::new(None),
        }
    }

    /// Makes `r` the source of this array's future device buffers.
    pub(crate) fn set_resource(&mut self, r: Option<Arc<dyn MemoryResource>>) {
        self.resource = r;
    }

    /// The resource a new device buffer on `device` comes from.
    fn resource_for(&self, device: &Arc<Device>) -> Result<Arc<dyn MemoryResource>> {
        match &self.resource {
            Some(r) => Ok(r.clone()),
            None => default_resource(device),
        }
    }

    /// A device side holding `buffer` (memarray's own memory), with no pending work.
    pub(crate) fn holding(buffer: Arc<DeviceBuffer>) -> Self {
        let mut out = Self::new();
        out.buffer = Some(buffer);
        out
    }

    /// A device side holding `buffer` (shared with a producer), ordered after the
    /// producer's stream when given.
    pub(crate) fn adopt(buffer: DeviceBuffer, producer: Option<StreamRef>) -> Result<Self> {
        let mut out = Self::new();
        out.foreign = true;
        let device = buffer.device().clone();
        out.buffer = Some(Arc::new(buffer));
        match producer {
            Some(s) if s == StreamRef::legacy() => {
                *out.lazy.get_mut().unwrap_or_else(|e| e.into_inner()) = Some(device);
            }
            Some(s) => out.record(Enqueued::new(s, device), None)?,
            None => {}
        }
        Ok(out)
    }

    /// A device side holding `buffer` (another process's memory, CUDA IPC), ordered after
    /// `event` (that process's work on it, an event opened from its handle).
    pub(crate) fn adopt_after(buffer: DeviceBuffer, event: Option<Arc<Event>>) -> Self {
        let mut out = Self::new();
        out.foreign = true;
        out.buffer = Some(Arc::new(buffer));
        if let Some(event) = event {
            *out.pending.get_mut().unwrap_or_else(|e| e.into_inner()) = Some(Pending {
                event,
                stream: None,
                keep_alive: Vec::new(),
            });
        }
        out
    }

    /// Records `event` (an interprocess event) on the legacy stream of the data's device
    /// after the pending work, for another process to wait on.
    pub(crate) fn record_shared(&self, event: &Event) -> Result<()> {
        let legacy = StreamRef::legacy();
        self.order(legacy, event.device().id())?;
        event.record(legacy)
    }

    /// A device side holding a new copy of `src`, made after the producer's work; `src`
    /// (and its owner) is released once the copy is done.
    pub(crate) fn copy_of(
        src: &DeviceBuffer,
        nbytes: usize,
        producer: Option<StreamRef>,
    ) -> Result<Self> {
        let device = src.device().clone();
        let stream = producer.unwrap_or(StreamRef::legacy());
        let resource = default_resource(&device)?;
        // SAFETY: written in full by the copy below before anyone reads it.
        let mut dst = unsafe { DeviceBuffer::uninit(&device, nbytes, resource, stream)? };
        if !stream.is_persistent() {
            // The producer's stream may be gone when the copy is freed.
            dst.set_free_stream(StreamRef::legacy());
        }
        crate::copy::copy_dtod(&dst, 0, src, 0, nbytes, stream)?.synchronize()?;
        let mut out = Self::new();
        out.buffer = Some(Arc::new(dst));
        Ok(out)
    }

    fn pending(&self) -> std::sync::MutexGuard<'_, Option<Pending>> {
        self.settle();
        self.pending.lock().unwrap_or_else(|e| e.into_inner())
    }

    /// Turns a lazy import's ordering into pending work: an event recorded now on the
    /// legacy stream (after the producer's work). If no event can be made, the host waits
    /// for the legacy stream instead, which orders just as well.
    fn settle(&self) {
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
    pub(super) fn pick(&self, stream: Option<StreamRef>, device_id: u32) -> StreamRef {
        let last = self.last_stream.filter(|&(_, d)| d == device_id);
        stream
            .or(last.map(|(s, _)| s))
            .unwrap_or(StreamRef::legacy())
    }

    /// Orders `stream`, on which the next operation runs on device `device_id`, after
    /// pending work on another stream (stream-wait-event, no host block). A default
    /// stream is per device: the same handle on another device is another stream, which
    /// must wait too, with that device bound.
    pub(super) fn order(&self, stream: StreamRef, device_id: u32) -> Result<()> {
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
        if let Some(p) = self.pending().as_ref()
            && (p.stream != Some(stream) || p.event.device().id() != device_id)
        {
            stream.wait_on(&*Device::get(device_id)?, &p.event)?;
        }
        Ok(())
    }

    /// Records the array's event after `op` and makes it the pending work. If recording
    /// fails, the previous pending work (and the buffers it keeps alive) stays in place.
    pub(super) fn record(&mut self, op: Enqueued, keep: Option<Arc<DeviceBuffer>>) -> Result<()> {
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
    pub(super) fn record_read(&self, op: &Enqueued) -> Result<()> {
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

    /// The device buffer on `device_id`: the existing one, or a new uninitialised one
    /// that the caller fills and then [`Self::install`]s once its copy is enqueued.
    ///
    /// # Safety
    /// 1. A new buffer is written in full before any read.
    pub(super) unsafe fn buffer_on(
        &self,
        device_id: u32,
        nbytes: usize,
        stream: StreamRef,
    ) -> Result<Arc<DeviceBuffer>> {
        if let Some(b) = &self.buffer
            && b.device().id() == device_id
        {
            return Ok(b.clone());
        }
        let device = Device::get(device_id)?;
        let resource = self.resource_for(&device)?;
        // SAFETY: item 1.
        let mut b = unsafe { DeviceBuffer::uninit(&device, nbytes, resource, stream)? };
        if !stream.is_persistent() {
            // A foreign stream may be gone when the buffer is freed.
            b.set_free_stream(StreamRef::legacy());
        }
        Ok(Arc::new(b))
    }

    /// Whether a copy to `device_id` would allocate a new buffer from the device's default
    /// resource (no buffer there yet, no resource of the array's own).
    pub(super) fn takes_default_buffer_on(&self, device_id: u32) -> bool {
        self.resource.is_none()
            && self
                .buffer
                .as_ref()
                .is_none_or(|b| b.device().id() != device_id)
    }

    /// Makes `b` the device copy (a no-op if it already is).
    pub(super) fn install(&mut self, b: Arc<DeviceBuffer>) {
        if self.buffer.as_ref().is_some_and(|old| Arc::ptr_eq(old, &b)) {
            return;
        }
        if let Some(old) = self.buffer.replace(b) {
            // The old buffer may still be read by queued work: keep it until that is done.
            if let Some(p) = self.pending().as_mut() {
                p.keep_alive.push(old);
            }
        }
    }
}
