//! [`DriverResource`]: the one implementation of memory from a driver allocation pair.
//! Device, managed, stream-ordered pool and pinned memory differ only in the
//! pair they call, the kind, where the memory is reachable and how zeroed memory is made:
//! that is the [`Backend`]; the struct, alignment, context binding, out-of-memory
//! reporting and the [`MemoryResource`] implementation are shared.

use std::fmt;
use std::ptr::NonNull;
use std::sync::Arc;

use memarray_core::{Location, MemoryInfo, MemoryKind, MemoryResource, RawStream, Result};

use super::{Aligner, allocate_then_zero};
use crate::device::Device;
use crate::error::Result as CudaResult;

/// What one driver-backed resource does differently from the others.
pub trait Backend: fmt::Debug + Send + Sync + 'static {
    /// The kind of memory served.
    const KIND: MemoryKind;

    /// Allocates `size` bytes, returning the address.
    ///
    /// # Safety
    /// 1. `device`'s context is current on the calling thread.
    unsafe fn alloc(
        &self,
        device: &Device,
        size: usize,
        stream: Option<RawStream>,
    ) -> CudaResult<usize>;

    /// Frees what [`alloc`](Self::alloc) returned.
    ///
    /// # Safety
    /// 1. `base` came from `alloc` of this backend and is freed once, with no later use.
    /// 2. `device`'s context is current on the calling thread.
    unsafe fn free(&self, base: usize, stream: Option<RawStream>);

    /// Whether code at `location` can use the memory, for memory of `device`.
    fn accessible(&self, device: &Device, location: Location) -> bool;

    /// Whether the memory is host memory, zeroed by the host (else a device memset).
    const HOST_ZEROED: bool = false;

    /// Whether the resource reports the device's memory and id.
    const ON_DEVICE: bool = true;
}

/// Memory from the driver through backend `B` (see [`super::DeviceResource`],
/// [`super::ManagedResource`], [`super::AsyncPoolResource`], [`super::PinnedResource`]).
#[derive(Debug)]
pub struct DriverResource<B: Backend> {
    pub(super) device: Arc<Device>,
    pub(super) name: String,
    pub(super) backend: B,
    aligner: Aligner,
}

impl<B: Backend> DriverResource<B> {
    pub(super) fn with_backend(device: &Arc<Device>, name: String, backend: B) -> Self {
        DriverResource {
            device: device.clone(),
            name,
            backend,
            aligner: Aligner::default(),
        }
    }

    /// The device it allocates on (in whose context).
    pub fn device(&self) -> &Arc<Device> {
        &self.device
    }
}

impl<B: Backend> MemoryResource for DriverResource<B> {
    fn allocate(
        &self,
        bytes: usize,
        align: usize,
        stream: Option<RawStream>,
    ) -> Result<NonNull<u8>> {
        self.aligner.allocate(bytes, align, &self.name, |size| {
            let _ctx = self.device.bind()?;
            // SAFETY: `bind` made the device's live context current (item 1).
            unsafe { self.backend.alloc(&self.device, size, stream) }
                .map_err(|e| e.with_oom_context(size, self.device.id()))
        })
    }

    fn allocate_zeroed(
        &self,
        bytes: usize,
        align: usize,
        stream: Option<RawStream>,
    ) -> Result<NonNull<u8>> {
        if B::HOST_ZEROED {
            let p = self.allocate(bytes, align, stream)?;
            // SAFETY: p is a fresh host allocation of at least `bytes` bytes.
            unsafe { p.as_ptr().write_bytes(0, bytes) };
            return Ok(p);
        }
        allocate_then_zero(self, &self.device, bytes, align, stream)
    }

    unsafe fn deallocate(
        &self,
        ptr: NonNull<u8>,
        _: usize,
        align: usize,
        stream: Option<RawStream>,
    ) {
        let base = self.aligner.base_of(ptr, align);
        // Errors cannot be reported from here; the frees fail only for bad pointers.
        if let Ok(_ctx) = self.device.bind() {
            // SAFETY: by the trait contract `ptr` came from `allocate` of this resource and
            // is freed once (item 1); the device's context is current (item 2).
            unsafe { self.backend.free(base, stream) };
        }
    }

    fn kind(&self) -> MemoryKind {
        B::KIND
    }

    fn is_accessible_from(&self, location: Location) -> bool {
        self.backend.accessible(&self.device, location)
    }

    fn memory_info(&self) -> Option<MemoryInfo> {
        if B::ON_DEVICE {
            self.device.memory_info().ok()
        } else {
            None
        }
    }

    fn device_id(&self) -> Option<u32> {
        B::ON_DEVICE.then(|| self.device.id())
    }

    fn name(&self) -> &str {
        &self.name
    }
}
