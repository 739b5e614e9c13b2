//! [`RawArray`]: the type-erased host/device mirror beneath [`super::MemArray`] and Python.

use std::sync::Arc;

use memarray_core::shape;
use memarray_core::{
    CoreError, DType, HostBuffer, HostResource, Location, Lock, LockToken, MemoryKind,
    MemoryResource,
};

use super::device_side::DeviceSide;
use super::host_kind::{HostKind, host_buffer};
use crate::buffer::DeviceBuffer;
use crate::device::Device;
use crate::error::{CudaError, Result};
use crate::spill::SpillNote;
use crate::stream::StreamRef;

/// A type-erased array: a dtype, a shape (ndim 0..=32), one host buffer, at most one
/// device buffer, the location of the current data, a lock and the pending work.
///
/// Every access checks the lock first; host access waits for pending device work.
///
/// # Example
///
/// ```
/// use memarray_core::{DType, Location};
/// use memarray_cuda::RawArray;
///
/// // Any dtype, any ndim up to 32, chosen at run time.
/// let mut a = RawArray::zeros(DType::I16, &[3, 2], 0)?;
/// a.write_element(&[2, 1], &(-7i16).to_ne_bytes(), None)?;
/// let mut out = [0u8; 2];
/// a.read_element(&[2, 1], &mut out, None)?;
/// assert_eq!(i16::from_ne_bytes(out), -7);
/// assert!(a.read_element(&[3, 0], &mut out, None).is_err(), "bounds are checked");
/// match a.move_memory(Location::Device(0), None, true, None) {
///     Ok(()) => assert_eq!(a.location(), Location::Device(0)),
///     Err(memarray_cuda::CudaError::Unavailable { .. }) => assert_eq!(a.location(), Location::Host),
///     Err(e) => return Err(e),
/// }
/// # Ok::<(), memarray_cuda::CudaError>(())
/// ```
#[derive(Debug)]
pub struct RawArray {
    pub(super) dtype: DType,
    pub(super) shape: Vec<usize>,
    pub(super) nbytes: usize,
    /// The host copy; `None` until first needed for an array born on a device. Present
    /// whenever `location` is the host.
    pub(super) host: Option<Arc<HostBuffer>>,
    pub(super) host_kind: HostKind,
    pub(super) device_id: u32,
    pub(super) location: Location,
    /// Shared so a [`super::SharedArray`] can release a token without the array's mutex.
    pub(super) lock: Arc<Lock>,
    pub(super) dev: DeviceSide,
    /// The data sits in the host copy for now, spilled from `Device(device_id)`
    /// ([`crate::spill`]): `location` is `Host`, [`Self::location`] still says the device,
    /// and every operation that needs the device data restores it first.
    pub(super) spilled: bool,
    /// What the spill registries know of this array (kept by its [`super::SharedArray`]
    /// cell; never swapped).
    pub(crate) spill_note: SpillNote,
}

impl Drop for RawArray {
    /// Work queued on the array may still read or write its host copy (an asynchronous
    /// copy): wait for it before the host buffer goes back to its resource, since a pool
    /// hands freed blocks out again at once. An array without a host copy (born on a
    /// device) does not wait: its device side orders the frees after the work instead.
    fn drop(&mut self) {
        if self.host.is_some() {
            crate::parked::park_err("waiting for a dropped array's work", self.dev.wait_host());
        }
    }
}

impl RawArray {
    /// A zero-filled array on the host targeting device `device_id`, with the default host
    /// memory kind ([`HostKind::auto`]; pageable if pinning fails).
    pub fn zeros(dtype: DType, shape: &[usize], device_id: u32) -> Result<Self> {
        let nbytes = shape::validate(shape, dtype.size())?;
        let (host, _) = host_buffer(HostKind::auto(nbytes), device_id, nbytes, true, true)?;
        Self::from_host_buffer(dtype, shape, host, device_id)
    }

    /// A zero-filled array whose host copy is of `host_kind`.
    pub fn zeros_in(
        dtype: DType,
        shape: &[usize],
        device_id: u32,
        host_kind: HostKind,
    ) -> Result<Self> {
        let nbytes = shape::validate(shape, dtype.size())?;
        let (host, _) = host_buffer(host_kind, device_id, nbytes, true, false)?;
        Self::from_host_buffer(dtype, shape, host, device_id)
    }

    /// An array holding a copy of `bytes` (C order), which must be exactly `nbytes` long.
    pub fn from_bytes(dtype: DType, shape: &[usize], bytes: &[u8], device_id: u32) -> Result<Self> {
        let nbytes = shape::validate(shape, dtype.size())?;
        if bytes.len() != nbytes {
            return Err(CoreError::CopyOutOfRange {
                offset: 0,
                len: bytes.len(),
                capacity: nbytes,
            }
            .into());
        }
        let host = HostBuffer::from_bytes(bytes, Arc::new(HostResource))?;
        Self::from_host_buffer(dtype, shape, host, device_id)
    }

    /// An array over an existing host buffer (a zero-copy DLPack import, or a buffer from
    /// any host-accessible resource), which must hold exactly the bytes of `shape`. The
    /// host kind follows the buffer's memory kind.
    pub fn from_host_buffer(
        dtype: DType,
        shape: &[usize],
        host: HostBuffer,
        device_id: u32,
    ) -> Result<Self> {
        let nbytes = shape::validate(shape, dtype.size())?;
        if host.len() != nbytes {
            return Err(CoreError::CopyOutOfRange {
                offset: 0,
                len: nbytes,
                capacity: host.len(),
            }
            .into());
        }
        if !(host.as_ptr() as usize).is_multiple_of(dtype.align()) {
            return Err(CoreError::Misaligned {
                addr: host.as_ptr() as usize,
                align: dtype.align(),
            }
            .into());
        }
        let host_kind = match host.kind() {
            MemoryKind::Pinned => HostKind::Pinned,
            MemoryKind::Managed => HostKind::Managed,
            _ => HostKind::Pageable,
        };
        Ok(Self {
            dtype,
            shape: shape.to_vec(),
            nbytes,
            host: Some(Arc::new(host)),
            host_kind,
            device_id,
            location: Location::Host,
            lock: Arc::new(Lock::new()),
            dev: DeviceSide::new(),
            spilled: false,
            spill_note: SpillNote::default(),
        })
    }

    /// An array over device memory owned by someone else (a DLPack or CUDA Array
    /// Interface producer): shared zero-copy when `share`, else copied into a new device
    /// buffer. With `producer`, the producer's queued work on that stream becomes the
    /// array's pending work, so every later operation is ordered after it.
    ///
    /// # Safety
    /// 1. `addr` holds `nbytes` bytes of C-contiguous `shape` elements on `device`, valid
    ///    for as long as `owner` lives.
    /// 2. `producer`, if given, is a live stream of `device`'s context.
    #[allow(clippy::too_many_arguments)]
    pub unsafe fn from_device_memory(
        device: &Arc<Device>,
        dtype: DType,
        shape: &[usize],
        addr: u64,
        nbytes: usize,
        owner: Box<dyn std::any::Any + Send + Sync>,
        share: bool,
        producer: Option<StreamRef>,
    ) -> Result<Self> {
        let expected = shape::validate(shape, dtype.size())?;
        if expected != nbytes {
            return Err(CoreError::CopyOutOfRange {
                offset: 0,
                len: expected,
                capacity: nbytes,
            }
            .into());
        }
        // SAFETY: the caller's item 1 is from_foreign's contract.
        let foreign = unsafe {
            DeviceBuffer::from_foreign(device, addr, nbytes, owner, StreamRef::legacy())?
        };
        let dev = if share {
            DeviceSide::adopt(foreign, producer)?
        } else {
            DeviceSide::copy_of(&foreign, nbytes, producer)?
        };
        Ok(Self::on_device_only(dtype, shape, nbytes, device.id(), dev))
    }

    /// An array whose data is `dev`'s device copy on `device_id` (no host copy yet: it is
    /// made on the first move to the host). `nbytes` is `shape`'s, already validated.
    pub(super) fn on_device_only(
        dtype: DType,
        shape: &[usize],
        nbytes: usize,
        device_id: u32,
        dev: DeviceSide,
    ) -> Self {
        Self {
            dtype,
            shape: shape.to_vec(),
            nbytes,
            host: None,
            host_kind: HostKind::auto(nbytes),
            device_id,
            location: Location::Device(device_id),
            lock: Arc::new(Lock::new()),
            dev,
            spilled: false,
            spill_note: SpillNote::default(),
        }
    }

    /// An empty husk left behind when a [`super::SharedArray`] hands its array out.
    pub(super) fn placeholder() -> Self {
        Self {
            dtype: DType::U8,
            shape: vec![0],
            nbytes: 0,
            host: None,
            host_kind: HostKind::Pageable,
            device_id: 0,
            location: Location::Host,
            lock: Arc::new(Lock::new()),
            dev: DeviceSide::new(),
            spilled: false,
            spill_note: SpillNote::default(),
        }
    }

    /// Element type.
    pub fn dtype(&self) -> DType {
        self.dtype
    }
    /// Extent of each dimension.
    pub fn shape(&self) -> &[usize] {
        &self.shape
    }
    /// Number of dimensions.
    pub fn ndim(&self) -> usize {
        self.shape.len()
    }
    /// Number of elements (1 for a 0-d array).
    pub fn len(&self) -> u64 {
        (self.nbytes / self.dtype.size()) as u64
    }
    /// Whether the array has no elements.
    pub fn is_empty(&self) -> bool {
        self.nbytes == 0
    }
    /// Size in bytes.
    pub fn nbytes(&self) -> usize {
        self.nbytes
    }
    /// Where the array lives: the device for a spilled array (its data is on the host
    /// for now; [`Self::is_spilled`]).
    pub fn location(&self) -> Location {
        if self.spilled {
            Location::Device(self.device_id)
        } else {
            self.location
        }
    }
    /// The device this array moves to by default.
    pub fn device_id(&self) -> u32 {
        self.device_id
    }
    /// The kind of host memory backing the host copy.
    pub fn host_kind(&self) -> HostKind {
        self.host_kind
    }
    /// Id of the token holding the lock, if any.
    pub fn lock_holder(&self) -> Option<u64> {
        self.lock.holder()
    }
    /// Whether the array is locked.
    pub fn is_locked(&self) -> bool {
        self.lock.is_locked()
    }

    /// Locks the array; see [`Lock::try_lock`].
    pub fn try_lock(&self) -> Result<LockToken> {
        Ok(self.lock.try_lock()?)
    }

    /// Releases the lock held by `token`.
    pub fn unlock(&self, token: LockToken) -> Result<()> {
        Ok(self.lock.unlock(token)?)
    }

    /// The array's lock slot, shared: it stays with this array across [`Self::swap`].
    pub(super) fn lock_slot(&self) -> Arc<Lock> {
        self.lock.clone()
    }

    /// Fails with [`CoreError::Locked`] unless the array is free or `token` holds it.
    pub fn check(&self, token: Option<LockToken>) -> Result<()> {
        Ok(self.lock.check(token)?)
    }

    /// Whether device work is pending that a host access would first wait for (callers
    /// holding another lock, such as Python's GIL, release it before such a wait).
    pub fn has_pending_work(&self) -> bool {
        self.dev.has_pending()
    }

    /// Whether dropping the array may block the host for pending work (callers holding
    /// Python's GIL release it around such a drop): recorded work, and with a host copy
    /// any work at all (the drop waits for it before freeing that copy).
    pub fn drop_may_wait(&self) -> bool {
        self.dev.drop_may_wait() || (self.host.is_some() && self.dev.has_pending())
    }

    /// Blocks the host until all work enqueued on this array has finished.
    pub fn synchronize(&self, token: Option<LockToken>) -> Result<()> {
        self.check(token)?;
        // Work recorded into a capture still going on runs only when its graph is
        // launched: a host wait for it could never end (refused; the capture stays valid).
        self.dev
            .refuse_if_captured("a host wait for an array's captured work")?;
        self.dev.wait_host()
    }

    /// Makes `r` the source of this array's future device buffers (the first move to a
    /// device, a peer move, copies), instead of the device's default resource; `None`
    /// goes back to the default. `r` must serve memory devices can use.
    pub fn set_device_resource(&mut self, r: Option<Arc<dyn MemoryResource>>) -> Result<()> {
        if let Some(res) = &r
            && !res.is_accessible_from(Location::Device(self.device_id))
        {
            return Err(CudaError::Inaccessible {
                resource: res.name().to_string(),
                location: Location::Device(self.device_id),
            });
        }
        self.dev.set_resource(r);
        Ok(())
    }

    /// An array like [`RawArray::zeros`] whose host buffer comes from `host` (any
    /// host-accessible resource: pinned, a pool, a file) and whose device buffers come
    /// from `device` (or the device's default resource).
    pub fn zeros_with(
        dtype: DType,
        shape: &[usize],
        device_id: u32,
        host: Arc<dyn MemoryResource>,
        device: Option<Arc<dyn MemoryResource>>,
    ) -> Result<Self> {
        let nbytes = shape::validate(shape, dtype.size())?;
        let mut a = Self::from_host_buffer(
            dtype,
            shape,
            HostBuffer::zeroed_in(nbytes, host)?,
            device_id,
        )?;
        a.set_device_resource(device)?;
        Ok(a)
    }

    /// Whether the array has a host copy yet (arrays born on a device get one on their
    /// first move to the host).
    pub fn has_host_copy(&self) -> bool {
        self.host.is_some()
    }

    pub(crate) fn device_side(&self) -> &DeviceSide {
        &self.dev
    }
}

/// Itself, so functions over any array take a `RawArray` as they take a `MemArray`.
impl AsMut<RawArray> for RawArray {
    fn as_mut(&mut self) -> &mut RawArray {
        self
    }
}
