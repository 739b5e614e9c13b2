//! Sharing device memory between processes (CUDA IPC), for arrays and buffers.
//!
//! [`DeviceBuffer::ipc_handle`] names the buffer's `cuMemAlloc` allocation (a caching-pool
//! block is an offset into its segment) by a 64-byte driver handle plus offset, length,
//! device and the exporting process id: an [`IpcHandle`], which serialises to bytes
//! ([`IpcHandle::to_bytes`]) for pipes, queues and pickles. An array's handle
//! ([`crate::RawArray::ipc_handle`]) also carries an interprocess event recorded after the
//! array's pending work: the importer's first operation waits on it (stream-wait-event),
//! so neither side blocks. The handle and the event are made once per buffer and reused.
//!
//! Another process opens a handle with [`open`]: the mapping (and each event handle seen
//! with it) is made once per process and handle, shared by every buffer over it, and closed
//! when the last drops; keep one array over a buffer alive to keep later opens at a
//! microsecond. The exporter must keep the memory alive while importers use it, and not
//! overwrite it until they are done (an acknowledgement back); CUDA forbids opening a
//! handle in the process that made it. Memory that is not from `cuMemAlloc` (managed
//! memory, the driver's async pool) cannot be shared: [`CudaError::Ipc`] ([`IpcError`]).

use std::collections::HashMap;
use std::sync::{Arc, Mutex, OnceLock, PoisonError, Weak};

use crate::buffer::{DeviceBuffer, IpcExport};
use crate::device::Device;
use crate::driver;
use crate::error::{CudaError, IpcError, Result};
use crate::event::Event;
use crate::stream::StreamRef;

/// Serialised length of an [`IpcHandle`].
pub const IPC_HANDLE_BYTES: usize = 4 + 64 + 8 + 8 + 4 + 4 + 1 + 64;
const TAG: &[u8; 4] = b"MAH2";

/// A device buffer's memory as another process can open it.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub struct IpcHandle {
    /// The driver's handle of the allocation.
    pub handle: [u8; 64],
    /// Byte offset of the buffer in the allocation.
    pub offset: u64,
    /// Bytes of the buffer.
    pub nbytes: u64,
    /// Device ordinal in the exporting process (the importer opens on the same ordinal:
    /// keep `CUDA_VISIBLE_DEVICES` the same).
    pub device_id: u32,
    /// The exporting process.
    pub pid: u32,
    /// An interprocess event recorded after the exporter's work on the memory; importers
    /// order their work after it. `None`: the exporter finished its work before
    /// exporting.
    pub event: Option<[u8; 64]>,
}

impl IpcHandle {
    /// `MAH2`, the handle, then offset, nbytes, device id and pid (little-endian), a flag
    /// byte (1: an event follows) and the event handle (zeros without one).
    pub fn to_bytes(&self) -> [u8; IPC_HANDLE_BYTES] {
        let mut out = [0u8; IPC_HANDLE_BYTES];
        out[..4].copy_from_slice(TAG);
        out[4..68].copy_from_slice(&self.handle);
        out[68..76].copy_from_slice(&self.offset.to_le_bytes());
        out[76..84].copy_from_slice(&self.nbytes.to_le_bytes());
        out[84..88].copy_from_slice(&self.device_id.to_le_bytes());
        out[88..92].copy_from_slice(&self.pid.to_le_bytes());
        if let Some(e) = &self.event {
            out[92] = 1;
            out[93..157].copy_from_slice(e);
        }
        out
    }

    /// The inverse of [`to_bytes`](Self::to_bytes); anything else is [`IpcError::Handle`].
    pub fn from_bytes(b: &[u8]) -> Result<Self> {
        if b.len() != IPC_HANDLE_BYTES || &b[..4] != TAG {
            return Err(CudaError::from(IpcError::Open {
                reason: format!(
                    "not a memarray IPC handle ({} bytes; a handle is {IPC_HANDLE_BYTES} \
                     bytes starting with MAH2)",
                    b.len()
                ),
            }));
        }
        let u64_at = |i: usize| u64::from_le_bytes(b[i..i + 8].try_into().unwrap_or([0; 8]));
        let u32_at = |i: usize| u32::from_le_bytes(b[i..i + 4].try_into().unwrap_or([0; 4]));
        let mut handle = [0u8; 64];
        handle.copy_from_slice(&b[4..68]);
        let event = match b[92] {
            0 => None,
            1 => {
                let mut e = [0u8; 64];
                e.copy_from_slice(&b[93..157]);
                Some(e)
            }
            other => {
                return Err(CudaError::from(IpcError::Open {
                    reason: format!("bad event flag {other} in an IPC handle"),
                }));
            }
        };
        Ok(Self {
            handle,
            offset: u64_at(68),
            nbytes: u64_at(76),
            device_id: u32_at(84),
            pid: u32_at(88),
            event,
        })
    }
}

impl DeviceBuffer {
    /// A handle another process can open to map this buffer's memory. No event: the
    /// caller finishes its writes first (an array's handle carries one instead).
    pub fn ipc_handle(&self) -> Result<IpcHandle> {
        Ok(self.handle_of(self.exported()?, None))
    }

    /// A handle carrying the buffer's interprocess event, recorded by `record` (the
    /// array's ordering) first.
    pub(crate) fn ipc_handle_with(
        &self,
        record: impl FnOnce(&Event) -> Result<()>,
    ) -> Result<IpcHandle> {
        let e = self.exported()?;
        let (event, event_handle) = match e.event.get() {
            Some(ev) => ev,
            None => {
                let event = Event::interprocess(self.device())?;
                let h = event.ipc_handle()?;
                // Two threads may race to make it; the loser's event is dropped unused.
                e.event.get_or_init(|| (event, h))
            }
        };
        record(event)?;
        Ok(self.handle_of(e, Some(*event_handle)))
    }

    fn handle_of(&self, e: &IpcExport, event: Option<[u8; 64]>) -> IpcHandle {
        IpcHandle {
            handle: e.handle,
            offset: e.offset,
            nbytes: self.len() as u64,
            device_id: self.device().id(),
            pid: std::process::id(),
            event,
        }
    }

    /// The buffer's export: made on the first call, reused after.
    fn exported(&self) -> Result<&IpcExport> {
        if let Some(e) = self.ipc.get() {
            return Ok(e);
        }
        let _ctx = self.device().bind()?;
        let addr = self.device_ptr();
        let refuse = |e: CudaError| {
            CudaError::from(IpcError::Export {
                reason: format!(
                    "memory from {} cannot be shared with another process ({e}); IPC needs \
                 cuMemAlloc memory: the device resource or a pool over it",
                    self.resource().name()
                ),
            })
        };
        // SAFETY: the buffer is live and its device's context is bound above.
        let (base, size) = unsafe { driver::mem_get_address_range(addr) }.map_err(refuse)?;
        // SAFETY: `base` starts the live allocation containing the buffer (just asked).
        let handle = unsafe { driver::ipc_get_mem_handle(base) }.map_err(refuse)?;
        debug_assert!(addr - base + self.len() as u64 <= size as u64);
        Ok(self.ipc.get_or_init(|| {
            Box::new(IpcExport {
                handle,
                offset: addr - base,
                event: OnceLock::new(),
            })
        }))
    }
}

/// Opened interprocess events a mapping keeps for reuse.
const EVENTS_KEPT: usize = 64;

/// One process's mapping of another's allocation; closed when the last user drops.
#[derive(Debug)]
struct Mapping {
    device: Arc<Device>,
    base: u64,
    size: usize,
    /// Interprocess events opened with this memory's handles, kept while it is mapped.
    events: Mutex<HashMap<[u8; 64], Arc<Event>>>,
}

impl Mapping {
    /// The exporter's event `h`, opened on first sight and cached (at most
    /// [`EVENTS_KEPT`] a mapping: an exporter that shares new buffers of one allocation,
    /// such as packs from a pool, makes a new event for each).
    fn event(&self, h: &[u8; 64]) -> Result<Arc<Event>> {
        let mut events = self.events.lock().unwrap_or_else(PoisonError::into_inner);
        if let Some(e) = events.get(h) {
            return Ok(e.clone());
        }
        if events.len() >= EVENTS_KEPT {
            // Imports ordered after one of these hold their own reference; the cache only
            // saves reopening a handle seen again.
            events.clear();
        }
        let e = Arc::new(Event::open_ipc(&self.device, h).map_err(|e| {
            CudaError::from(IpcError::Open {
                reason: format!("cannot open the exporter's event ({e})"),
            })
        })?);
        events.insert(*h, e.clone());
        Ok(e)
    }
}

impl Drop for Mapping {
    fn drop(&mut self) {
        self.events.get_mut().map(|e| e.clear()).ok();
        if let Ok(_ctx) = self.device.bind() {
            // SAFETY: base came from ipc_open_mem_handle, and this is its only closer
            // (the last Arc); the device's context is bound.
            let done = unsafe { driver::ipc_close_mem_handle(self.base) };
            crate::parked::park_err("closing an IPC mapping", done);
        }
    }
}

type Mappings = HashMap<([u8; 64], u32), Weak<Mapping>>;

/// The live mappings by handle and the device whose context opened it: CUDA maps a handle
/// once per device context, and a handle opened on a device other than its memory's (a peer
/// mapping) is a mapping of its own.
fn mappings() -> &'static Mutex<Mappings> {
    static M: OnceLock<Mutex<Mappings>> = OnceLock::new();
    M.get_or_init(Default::default)
}

/// Opens `h` (made by another process) as a device buffer sharing its memory. The first
/// open of a handle maps it; later ones reuse the mapping (about a microsecond). The
/// handle's event is not waited for here: see [`open_with_event`].
pub fn open(h: &IpcHandle) -> Result<DeviceBuffer> {
    open_with_event(h).map(|(b, _)| b)
}

/// [`open`], also returning the exporter's event (opened once per mapping) for the
/// importer to order its work after.
pub fn open_with_event(h: &IpcHandle) -> Result<(DeviceBuffer, Option<Arc<Event>>)> {
    if h.pid == std::process::id() {
        return Err(CudaError::from(IpcError::Open {
            reason: "this handle was made by this process; CUDA opens IPC handles only in \
                     other processes (use the array itself here)"
                .into(),
        }));
    }
    let device = Device::get(h.device_id)?;
    let mapping = {
        let mut map = mappings().lock().unwrap_or_else(PoisonError::into_inner);
        match map.get(&(h.handle, h.device_id)).and_then(Weak::upgrade) {
            Some(m) => m,
            None => {
                let _ctx = device.bind()?;
                // SAFETY: the device's context is bound; a stale or foreign handle is a
                // driver error, not undefined behaviour.
                let base = unsafe { driver::ipc_open_mem_handle(&h.handle) }.map_err(|e| {
                    CudaError::from(IpcError::Open {
                        reason: format!(
                            "cannot open the handle of process {} on cuda:{} ({e}); the \
                             exporting process may have exited or freed the memory",
                            h.pid, h.device_id
                        ),
                    })
                })?;
                // SAFETY: base is a live mapping in this device's context.
                let (_, size) = unsafe { driver::mem_get_address_range(base) }?;
                let m = Arc::new(Mapping {
                    device: device.clone(),
                    base,
                    size,
                    events: Mutex::new(HashMap::new()),
                });
                map.retain(|_, w| w.strong_count() > 0);
                map.insert((h.handle, h.device_id), Arc::downgrade(&m));
                m
            }
        }
    };
    let end = h.offset.checked_add(h.nbytes);
    if end.is_none_or(|e| e > mapping.size as u64) {
        return Err(CudaError::from(IpcError::Open {
            reason: format!(
                "the handle claims {} bytes at offset {} of a {}-byte allocation",
                h.nbytes, h.offset, mapping.size
            ),
        }));
    }
    let event = h.event.as_ref().map(|e| mapping.event(e)).transpose()?;
    let addr = mapping.base + h.offset;
    // SAFETY: [addr, addr + nbytes) lies in the mapped allocation (checked above), which
    // stays mapped while `mapping` (the owner) lives; the exporter's writes are finished
    // before it hands out the handle (RawArray::ipc_handle synchronises).
    let buffer = unsafe {
        DeviceBuffer::from_foreign(
            &device,
            addr,
            h.nbytes as usize,
            Box::new(mapping),
            StreamRef::legacy(),
        )
    }?;
    Ok((buffer, event))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn handles_round_trip_through_bytes_and_garbage_is_refused() {
        let h = IpcHandle {
            handle: std::array::from_fn(|i| i as u8),
            offset: 512,
            nbytes: 1 << 20,
            device_id: 1,
            pid: 4242,
            event: None,
        };
        assert_eq!(IpcHandle::from_bytes(&h.to_bytes()).unwrap(), h);
        let with_event = IpcHandle {
            event: Some(std::array::from_fn(|i| 255 - i as u8)),
            ..h
        };
        assert_eq!(
            IpcHandle::from_bytes(&with_event.to_bytes()).unwrap(),
            with_event
        );
        let mut bad_flag = with_event.to_bytes();
        bad_flag[92] = 7;
        assert!(IpcHandle::from_bytes(&bad_flag).is_err());
        assert!(IpcHandle::from_bytes(b"short").is_err());
        let mut bad = h.to_bytes();
        bad[0] = b'X';
        assert!(IpcHandle::from_bytes(&bad).is_err());
    }

    #[test]
    fn own_handles_are_refused_before_any_driver_call() {
        let h = IpcHandle {
            handle: [0; 64],
            offset: 0,
            nbytes: 8,
            device_id: 0,
            pid: std::process::id(),
            event: None,
        };
        assert!(matches!(open(&h), Err(CudaError::Ipc(_))));
    }
}
