//! [`DeviceBuffer`]: an owned allocation that a device can access, freed through the
//! memory resource it came from.

use std::any::Any;
use std::fmt;
use std::ptr::NonNull;
use std::sync::Arc;

use memarray_core::{CoreError, ForeignMemory, MemoryKind, MemoryResource};

use crate::device::Device;
use crate::error::{CudaError, Result};
use crate::stream::StreamRef;

/// Alignment of every device buffer: what `cuMemAlloc` guarantees, and enough for every
/// element type and vectorised (`float4`, `double2`) access.
pub const DEVICE_ALIGN: usize = 256;

/// Owned bytes that `device` can access: device memory, or managed or pinned memory
/// from the matching resources.
///
/// Dropping the buffer deallocates through its resource on its *free stream* (the stream
/// given at allocation, or the one set with [`DeviceBuffer::set_free_stream`]):
/// stream-ordered resources free after the work enqueued there before the drop; other
/// resources free at once (`cuMemFree` waits for the device to finish with it). Work of
/// other streams that used the buffer ([`DeviceBuffer::record_use`]: an export's consumer)
/// is ordered before the free first: the free stream waits on it (no host block).
pub struct DeviceBuffer {
    device: Arc<Device>,
    ptr: NonNull<u8>,
    len: usize,
    resource: Arc<dyn MemoryResource>,
    free_stream: StreamRef,
    /// The library the allocation path counted the buffer for on its device's ledger
    /// ([`memarray_core::resource::ledger`]); `None` for memory it did not allocate (a
    /// slice, another library's memory).
    counted: Option<memarray_core::Source>,
    /// Events at the end of other streams' use of the buffer.
    uses: std::sync::Mutex<Vec<crate::event::Event>>,
    /// The IPC handle and interprocess event, made on the first export to another process.
    pub(crate) ipc: std::sync::OnceLock<Box<IpcExport>>,
    /// For a slice ([`DeviceBuffer::slice_of`]): the buffer owning the allocation (never
    /// itself a slice), which the slice keeps alive.
    root: Option<Arc<DeviceBuffer>>,
}

/// A buffer's export to other processes, made once by `ipc` and cached with the buffer:
/// its allocation's handle and offset, and (made on an array's first export) the
/// interprocess event it records for importers. Plain data here, so `buffer` does not
/// import `ipc` (which is built on it).
#[derive(Debug)]
pub(crate) struct IpcExport {
    pub(crate) handle: [u8; 64],
    pub(crate) offset: u64,
    pub(crate) event: std::sync::OnceLock<(crate::event::Event, [u8; 64])>,
}

// SAFETY: the buffer owns its allocation; it hands out only an integer address, and the
// resource is Send + Sync.
unsafe impl Send for DeviceBuffer {}
// SAFETY: as above: shared access exposes no host reference to the memory.
unsafe impl Sync for DeviceBuffer {}

impl DeviceBuffer {
    /// `len` bytes from `resource`, zeroed by a memset enqueued on `stream`.
    ///
    /// The resource must be accessible from `device` ([`CudaError::Inaccessible`]
    /// otherwise). Allocation failures come back as [`CoreError::Alloc`] naming the bytes
    /// and the device; out of memory, the shared relief steps run and the allocation is
    /// retried once first ([`memarray_core::resource::pressure`]).
    pub fn zeroed(
        device: &Arc<Device>,
        len: usize,
        resource: Arc<dyn MemoryResource>,
        stream: StreamRef,
    ) -> Result<Self> {
        Self::allocate(device, len, resource, stream, true)
    }

    /// `len` bytes from `resource`, uninitialised.
    ///
    /// # Safety
    /// 1. Every byte is written (by a copy, memset or kernel ordered on `stream` or after
    ///    it) before it is read.
    pub unsafe fn uninit(
        device: &Arc<Device>,
        len: usize,
        resource: Arc<dyn MemoryResource>,
        stream: StreamRef,
    ) -> Result<Self> {
        Self::allocate(device, len, resource, stream, false)
    }

    /// `len` bytes from `resource` through the relief path, zeroed when `zeroed`.
    fn allocate(
        device: &Arc<Device>,
        len: usize,
        resource: Arc<dyn MemoryResource>,
        stream: StreamRef,
        zeroed: bool,
    ) -> Result<Self> {
        Self::check_resource(device, &*resource)?;
        let source = memarray_core::resource::current_source().unwrap_or_default();
        let ptr = memarray_core::resource::allocate_with_relief(
            &*resource,
            len,
            DEVICE_ALIGN,
            Some(stream.into()),
            zeroed,
        )?;
        let mut buffer = Self::from_parts(device, ptr, len, resource, stream);
        buffer.counted = Some(source);
        Ok(buffer)
    }

    /// Wraps `len` bytes at `addr` on `device` that another library owns (a DLPack or
    /// CUDA Array Interface producer), without copying. Dropping the buffer drops
    /// `owner`, which releases the memory; copies made through
    /// [`DeviceBuffer::resource`] come from a [`crate::DeviceResource`] of the device.
    /// The address need not be aligned to [`DEVICE_ALIGN`]. The memory is released as
    /// soon as the buffer drops: synchronize work queued on it first.
    ///
    /// # Safety
    /// 1. `[addr, addr + len)` is memory `device` can access, valid and not reused for
    ///    anything else until `owner` is dropped.
    /// 2. Work the producer has queued on that memory is ordered before any use of the
    ///    buffer (the caller makes its stream wait on the producer's).
    pub unsafe fn from_foreign(
        device: &Arc<Device>,
        addr: u64,
        len: usize,
        owner: Box<dyn Any + Send + Sync>,
        stream: StreamRef,
    ) -> Result<Self> {
        let ptr = NonNull::new(addr as usize as *mut u8).ok_or_else(|| CoreError::Alloc {
            bytes: len,
            align: 1,
            resource: "foreign device memory".into(),
            reason: "the producer's address is 0".into(),
        })?;
        let resource = Arc::new(ForeignMemory::new(
            ptr,
            MemoryKind::Device,
            owner,
            crate::resource::plain_device_resource(device),
        ));
        Ok(Self::from_parts(device, ptr, len, resource, stream))
    }

    /// `len` bytes at `offset` of `block`, sharing its memory: the block is freed when it
    /// and its last slice are dropped. A slice is freed on the block's free stream (so the
    /// waits ordering each slice's release precede the block's), and buffers its resource
    /// makes later (a clone) come from the block's resource.
    pub(crate) fn slice_of(block: &Arc<DeviceBuffer>, offset: usize, len: usize) -> Result<Self> {
        let addr = block.range(offset, len)?;
        let ptr = NonNull::new(addr as usize as *mut u8).ok_or_else(|| CoreError::Alloc {
            bytes: len,
            align: 1,
            resource: block.resource.name().to_string(),
            reason: "a slice at address 0".into(),
        })?;
        let root = match &block.root {
            Some(r) => r.clone(),
            None => block.clone(),
        };
        let resource = Arc::new(ForeignMemory::new(
            ptr,
            MemoryKind::Device,
            Box::new(block.clone()),
            block.resource.clone(),
        ));
        let mut out = Self::from_parts(&block.device, ptr, len, resource, block.free_stream);
        out.root = Some(root);
        Ok(out)
    }

    /// For a slice: the buffer owning its allocation and the slice's offset in it.
    pub(crate) fn root(&self) -> Option<(&Arc<DeviceBuffer>, usize)> {
        self.root
            .as_ref()
            .map(|r| (r, self.ptr.as_ptr() as usize - r.ptr.as_ptr() as usize))
    }

    fn check_resource(device: &Device, resource: &dyn MemoryResource) -> Result<()> {
        if resource.is_accessible_from(device.location()) {
            Ok(())
        } else {
            Err(CudaError::Inaccessible {
                resource: resource.name().to_string(),
                location: device.location(),
            })
        }
    }

    fn from_parts(
        device: &Arc<Device>,
        ptr: NonNull<u8>,
        len: usize,
        resource: Arc<dyn MemoryResource>,
        free_stream: StreamRef,
    ) -> Self {
        DeviceBuffer {
            device: device.clone(),
            ptr,
            len,
            resource,
            free_stream,
            counted: None,
            uses: std::sync::Mutex::new(Vec::new()),
            ipc: std::sync::OnceLock::new(),
            root: None,
        }
    }

    /// Records that work queued on `stream` so far uses the buffer: the free waits for it
    /// (torch's `record_stream`). A consumer's stream is recorded when it releases an
    /// export. Errors (a stream already destroyed) leave nothing to wait for.
    pub fn record_use(&self, stream: StreamRef) {
        // On the free stream the free is ordered anyway; with spilling on it is recorded
        // still: a spill copies on its own stream and must see every use
        // ([`Self::uses_done`]).
        if stream == self.free_stream && !memarray_core::resource::spilling() {
            return;
        }
        // A use recorded into a capture is a graph's, run at each launch: no event of it
        // can order the free (the driver refuses waits on events recorded in a capture
        // from outside it); keeping the memory for the graph is the graph owner's part.
        if matches!(
            stream.capture(&self.device),
            Ok(crate::graph::Capture::Active { .. } | crate::graph::Capture::Invalidated { .. })
        ) {
            return;
        }
        if let Ok(e) = crate::event::Event::new(&self.device)
            && e.record(stream).is_ok()
        {
            self.uses
                .lock()
                .unwrap_or_else(std::sync::PoisonError::into_inner)
                .push(e);
        }
    }

    /// Whether every recorded use has finished (asks the driver; never blocks). Finished
    /// uses are forgotten, so a buffer exported many times keeps no trail of events.
    pub(crate) fn uses_done(&self) -> bool {
        let mut uses = self
            .uses
            .lock()
            .unwrap_or_else(std::sync::PoisonError::into_inner);
        uses.retain(|e| !e.is_complete().unwrap_or(false));
        uses.is_empty()
    }

    /// Size in bytes.
    pub fn len(&self) -> usize {
        self.len
    }

    /// Whether the buffer holds no bytes (its address is still valid and unique).
    pub fn is_empty(&self) -> bool {
        self.len == 0
    }

    /// The device the buffer belongs to.
    pub fn device(&self) -> &Arc<Device> {
        &self.device
    }

    /// The start address in the device's (unified) address space, aligned to
    /// [`DEVICE_ALIGN`] unless the buffer wraps foreign memory, for DLPack and the CUDA Array Interface. It is an integer on
    /// purpose: for device memory it must not be dereferenced on the host, and it stays
    /// valid only while the buffer lives.
    pub fn device_ptr(&self) -> u64 {
        self.addr()
    }

    /// The start address, for this crate's driver calls.
    pub(crate) fn addr(&self) -> u64 {
        self.ptr.as_ptr() as usize as u64
    }

    /// The kind of memory (device, managed, pinned).
    pub fn kind(&self) -> MemoryKind {
        self.resource.kind()
    }

    /// The resource the buffer came from.
    pub fn resource(&self) -> &Arc<dyn MemoryResource> {
        &self.resource
    }

    /// The stream the buffer is freed on when dropped.
    pub fn free_stream(&self) -> StreamRef {
        self.free_stream
    }

    /// Frees on `stream` instead when dropped: the stream of the buffer's last use, so a
    /// stream-ordered resource reuses the memory only after that use.
    pub fn set_free_stream(&mut self, stream: StreamRef) {
        self.free_stream = stream;
    }

    /// The address of `[offset, offset + len)`, checked against the buffer's size.
    pub(crate) fn range(&self, offset: usize, len: usize) -> Result<u64> {
        check_range(offset, len, self.len)?;
        Ok(self.addr() + offset as u64)
    }
}

/// `Ok` if `[offset, offset + len)` lies within `capacity` bytes.
pub(crate) fn check_range(offset: usize, len: usize, capacity: usize) -> Result<()> {
    match offset.checked_add(len) {
        Some(end) if end <= capacity => Ok(()),
        _ => Err(CoreError::CopyOutOfRange {
            offset,
            len,
            capacity,
        }
        .into()),
    }
}

impl Drop for DeviceBuffer {
    fn drop(&mut self) {
        let uses = std::mem::take(
            self.uses
                .get_mut()
                .unwrap_or_else(std::sync::PoisonError::into_inner),
        );
        for e in &uses {
            // Ordering only: a failure here leaves the resource's own rule (cuMemFree
            // waits for the device; a pool checks its free stream) in charge, and is
            // parked so it is still seen.
            crate::parked::park_err(
                "ordering a freed buffer after its uses",
                self.free_stream.wait(e),
            );
        }
        let stream = Some(self.free_stream.into());
        let (p, len, r) = (self.ptr, self.len, &*self.resource);
        // SAFETY: `ptr` came from this resource with (len, DEVICE_ALIGN) (through the
        // allocation path for `counted` when that is set) and is freed only here (item 1);
        // work using it is ordered on `free_stream` by the caller's use of the buffer, as
        // documented on the type (item 2).
        unsafe {
            match self.counted {
                Some(source) => memarray_core::resource::deallocate_counted(
                    r,
                    source,
                    p,
                    len,
                    DEVICE_ALIGN,
                    stream,
                ),
                None => r.deallocate(p, len, DEVICE_ALIGN, stream),
            }
        }
    }
}

impl fmt::Debug for DeviceBuffer {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("DeviceBuffer")
            .field("device", &self.device.id())
            .field("device_ptr", &format_args!("{:#x}", self.addr()))
            .field("len", &self.len)
            .field("resource", &self.resource.name())
            .field("free_stream", &self.free_stream.raw())
            .finish()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn ranges_are_checked_without_overflow() {
        assert!(check_range(0, 0, 0).is_ok());
        assert!(check_range(10, 0, 10).is_ok());
        assert!(check_range(3, 7, 10).is_ok());
        let e = check_range(3, 8, 10).unwrap_err();
        assert_eq!(
            e,
            CudaError::Core(CoreError::CopyOutOfRange {
                offset: 3,
                len: 8,
                capacity: 10
            })
        );
        assert!(
            e.to_string().contains("overruns a buffer of 10 bytes"),
            "{e}"
        );
        assert!(check_range(usize::MAX, 2, 10).is_err());
        assert!(check_range(11, 0, 10).is_err());
    }
}
