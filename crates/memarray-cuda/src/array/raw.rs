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
use crate::error::{ArrayError, CudaError, Result};
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
        self.dev.wait_host()
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

    /// Reads the element at `index` into `out` (`dtype().size()` bytes). Device-resident
    /// data is read with a small synchronous copy after pending work.
    pub fn read_element(
        &self,
        index: &[u64],
        out: &mut [u8],
        token: Option<LockToken>,
    ) -> Result<()> {
        self.check(token)?;
        let off = self.element_offset(index, out.len())?;
        match self.location {
            Location::Host => {
                self.dev.wait_host()?;
                out.copy_from_slice(&self.host_buf()?.as_slice()[off..off + out.len()]);
                Ok(())
            }
            Location::Device(_) => self.dev.read_bytes(off, out),
        }
    }

    /// Writes `value` (`dtype().size()` bytes) to the element at `index`, wherever the
    /// current data lives.
    pub fn write_element(
        &mut self,
        index: &[u64],
        value: &[u8],
        token: Option<LockToken>,
    ) -> Result<()> {
        self.check(token)?;
        let off = self.element_offset(index, value.len())?;
        match self.location {
            Location::Host => {
                self.dev.wait_host()?;
                // SAFETY: off + size <= nbytes (element_offset checked); host exports may
                // alias these bytes, which is the point of a zero-copy view; no Rust
                // reference to them is live across this write.
                unsafe {
                    let dst = self.host_buf()?.as_mut_ptr().add(off);
                    std::ptr::copy_nonoverlapping(value.as_ptr(), dst, value.len());
                }
                Ok(())
            }
            Location::Device(_) => self.dev.write_bytes(off, value),
        }
    }

    fn element_offset(&self, index: &[u64], size: usize) -> Result<usize> {
        if size != self.dtype.size() {
            return Err(CoreError::CopyOutOfRange {
                offset: 0,
                len: size,
                capacity: self.dtype.size(),
            }
            .into());
        }
        let linear = shape::offset_of(&self.shape, index)?;
        Ok(linear as usize * size)
    }

    /// The host buffer's first byte, if there is a host buffer.
    pub fn host_addr(&self) -> Option<usize> {
        self.host.as_ref().map(|h| h.as_ptr() as usize)
    }

    /// Whether `[addr, addr + len)` overlaps this array's host buffer (a destination
    /// that aliases the array must not be written through a separate slice).
    pub fn host_overlaps(&self, addr: usize, len: usize) -> bool {
        self.host.as_ref().is_some_and(|h| {
            let start = h.as_ptr() as usize;
            addr < start + h.len() && start < addr + len
        })
    }

    /// Copies the whole current data, wherever it lives, into `out` (exactly `nbytes`).
    pub fn read_all(&self, out: &mut [u8], token: Option<LockToken>) -> Result<()> {
        self.check(token)?;
        if out.len() != self.nbytes {
            return Err(CoreError::CopyOutOfRange {
                offset: 0,
                len: out.len(),
                capacity: self.nbytes,
            }
            .into());
        }
        match self.location {
            Location::Host => {
                self.dev.wait_host()?;
                crate::copy::host_to_host(out, self.host_buf()?.as_slice())?;
                Ok(())
            }
            Location::Device(_) => self.dev.read_bytes(0, out),
        }
    }

    /// Takes the host copy out of an array whose current data is on a device after a
    /// synchronous move (nothing pending reads it), so the array stops holding that memory:
    /// `move_many` lets go of the NumPy arrays it imported. `None` when the data is on the
    /// host or spilled. A later move to the host makes a new host buffer.
    pub fn take_host_copy(&mut self) -> Option<Arc<HostBuffer>> {
        if self.spilled || self.location == Location::Host {
            return None;
        }
        self.host.take()
    }

    /// The host bytes, after pending work. Fails unless the current data is on the host.
    pub fn host_bytes(&self, token: Option<LockToken>) -> Result<&[u8]> {
        self.host_ready(token)?;
        Ok(self.host_buf()?.as_slice())
    }

    /// The host bytes, writable, after pending work. Fails unless the data is on the host.
    pub fn host_bytes_mut(&mut self, token: Option<LockToken>) -> Result<&mut [u8]> {
        self.host_ready(token)?;
        // SAFETY: &mut self excludes every other Rust access to the buffer; zero-copy
        // exports (NumPy views, DLPack) may alias it, as they are meant to.
        Ok(unsafe { std::slice::from_raw_parts_mut(self.host_buf()?.as_mut_ptr(), self.nbytes) })
    }

    pub(super) fn host_ready(&self, token: Option<LockToken>) -> Result<()> {
        self.check(token)?;
        if self.location() != Location::Host {
            return Err(ArrayError::NotOnHost {
                location: self.location(),
            }
            .into());
        }
        self.dev.wait_host()
    }

    /// Overwrites the whole array with `bytes` (C order, exactly `nbytes`) where the data
    /// lives: on the host a memcpy, on a device a staged copy (pageable `bytes` at the
    /// pinned rate; [`crate::copy::staged`]) after pending work. Returns once `bytes` has
    /// been read. A wrong length changes nothing.
    pub fn write_all(&mut self, bytes: &[u8], token: Option<LockToken>) -> Result<()> {
        self.check(token)?;
        if bytes.len() != self.nbytes {
            return Err(CoreError::CopyOutOfRange {
                offset: 0,
                len: bytes.len(),
                capacity: self.nbytes,
            }
            .into());
        }
        if let Location::Device(_) = self.location {
            return self.dev.write_bytes(0, bytes);
        }
        self.dev.wait_host()?;
        self.ensure_host()?;
        self.location = Location::Host;
        // The host copy is current (a spilled array's too: it stays spilled, its new
        // bytes go back with it).
        let host = self.host_buf()?;
        // SAFETY: &mut self excludes every other Rust access to the buffer, which holds
        // nbytes bytes; zero-copy exports may alias it, as they are meant to.
        let dst = unsafe { std::slice::from_raw_parts_mut(host.as_mut_ptr(), self.nbytes) };
        crate::copy::host_to_host(dst, bytes)?;
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

    /// The host buffer; present whenever the data is on the host.
    pub(super) fn host_buf(&self) -> Result<&Arc<HostBuffer>> {
        self.host
            .as_ref()
            .ok_or(CudaError::Array(ArrayError::NoHostCopy))
    }

    /// Allocates the host copy of an array born on a device, on first need.
    pub(super) fn ensure_host(&mut self) -> Result<()> {
        if self.host.is_none() {
            let (host, kind) =
                host_buffer(self.host_kind, self.device_id, self.nbytes, true, true)?;
            self.host = Some(Arc::new(host));
            self.host_kind = kind;
        }
        Ok(())
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

    /// Raw host address, after the lock check and pending work; an error off the host.
    pub(crate) fn host_ptr(&self, token: Option<LockToken>) -> Result<*mut u8> {
        self.host_ready(token)?;
        Ok(self.host_buf()?.as_mut_ptr())
    }

    /// The host address without any check: the sharp knife.
    pub(crate) fn host_ptr_unchecked(&self) -> *mut u8 {
        self.host
            .as_ref()
            .map_or(std::ptr::null_mut(), |h| h.as_mut_ptr())
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
