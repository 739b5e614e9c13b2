//! The device half of a [`super::RawArray`]: the lazily allocated device buffer, the
//! array's event, and the ordering rules of docs/architecture.md ("The mirror").
//!
//! - Every asynchronous operation runs on a stream and re-records the array's event
//!   there; `pending` remembers that stream.
//! - An operation on another stream first makes it wait on the event (no host block).
//! - Host access waits for the event, then forgets it.
//! - Buffers replaced while work may still use them (a peer move's source) stay alive in
//!   `pending` until that work is known to be done.
//!
//! This file holds the type and how one is made; `ordering.rs` the rules above (pending
//! work, waits, records); `copies.rs` the data (copies in and out, the buffer, exports).

use std::sync::atomic::AtomicBool;
use std::sync::{Arc, Mutex};

use memarray_core::MemoryResource;

use crate::buffer::DeviceBuffer;
use crate::device::Device;
use crate::error::Result;
use crate::event::{Enqueued, Event};
use crate::resource::default_resource;
use crate::stream::StreamRef;

mod copies;
mod ordering;

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
    /// Work on this array recorded into a stream capture (a graph's, not run yet): what
    /// later work of the same capture orders after. The eager `pending` never records
    /// captured work, so waits and host accesses outside the capture never meet an event
    /// last recorded in one (which the driver refuses).
    captured: Mutex<Option<CapturedWork>>,
    /// Set when `captured` holds news for a memarray capture's graph: the array's first
    /// use in that capture, or its first write there ([`Self::take_capture_news`]).
    capture_news: AtomicBool,
}

/// An array's use in a capture, as its graph needs it ([`crate::graph::GraphMember`]).
#[derive(Clone, Debug)]
pub(crate) struct CaptureUse {
    /// The driver's id of the capture.
    pub(crate) id: u64,
    /// Whether the captured work writes the array.
    pub(crate) write: bool,
    /// The device and address of the device data the capture used.
    pub(crate) device: u32,
    pub(crate) addr: u64,
    /// Buffers the captured work uses that the array no longer holds (a move's source):
    /// the graph keeps them for its replays.
    #[expect(
        dead_code,
        reason = "held, never read: the buffers live as long as the graph"
    )]
    pub(crate) keep: Vec<Arc<DeviceBuffer>>,
}

/// Work on an array recorded into the capture `id`: its event (recorded in the capture)
/// and stream, and the buffers it reads.
#[derive(Debug)]
struct CapturedWork {
    id: u64,
    event: Arc<Event>,
    stream: StreamRef,
    keep_alive: Vec<Arc<DeviceBuffer>>,
    /// Whether any of it writes the array.
    write: bool,
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
            captured: Mutex::new(None),
            capture_news: AtomicBool::new(false),
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
}
