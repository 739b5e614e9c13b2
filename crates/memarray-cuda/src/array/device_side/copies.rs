//! The device side's copies in and out: uploads, downloads, peer moves, byte reads and
//! writes, the seed kernel, exports and clones, each ordered by the rules in `mod.rs`.

use crate::buffer::DeviceBuffer;
use crate::copy::{self, Span};
use crate::device::Device;
use crate::error::{ArrayError, Result};
use crate::event::Enqueued;
use crate::resource::default_resource;
use crate::stream::StreamRef;
use memarray_core::{HostBuffer, Location};
use std::sync::Arc;

use super::{Consumer, DeviceSide, ExportOwner};

impl DeviceSide {
    /// Host -> device `device_id` through [`copy::enqueue`], allocating the device buffer
    /// on first use.
    pub(crate) fn copy_from_host(
        &mut self,
        host: &HostBuffer,
        device_id: u32,
        nbytes: usize,
        stream: Option<StreamRef>,
    ) -> Result<()> {
        let stream = self.pick(stream, device_id);
        // SAFETY: the copy below writes all nbytes before any read.
        let dst = unsafe { self.buffer_on(device_id, nbytes, stream)? };
        self.order(stream, device_id)?;
        // SAFETY: the host buffer holds nbytes bytes and outlives the copy (the array owns
        // an Arc to it, and every host access and the array's drop wait for the event
        // recorded below).
        let op =
            unsafe { copy::enqueue(Span::Device(&dst, 0), Span::Host(host, 0), nbytes, stream)? };
        if let Some(op) = op {
            self.record(op, None)?;
        }
        self.install(dst);
        Ok(())
    }

    /// Makes a new device copy on `device_id` for an array born there: uninitialised
    /// (`fill` None), or every element set to `fill` (its bytes; all zero is a memset).
    /// No host memory is touched beyond the one element a non-byte pattern is seeded
    /// from; a non-byte pattern then doubles on the device (log2(n) device copies).
    pub(crate) fn born(
        &mut self,
        device_id: u32,
        nbytes: usize,
        fill: Option<&[u8]>,
        stream: Option<StreamRef>,
    ) -> Result<()> {
        let stream = self.pick(stream, device_id);
        // SAFETY: with a fill, every byte is written below before any read; without one
        // the bytes are unspecified by the caller's choice (device memory read only through
        // copies, so an unset byte is a value, not undefined behaviour on the host).
        let dst = unsafe { self.buffer_on(device_id, nbytes, stream)? };
        let op = match fill {
            None => None,
            Some(pattern) if pattern.iter().all(|&b| b == pattern[0]) => {
                Some(copy::memset(&dst, 0, nbytes, pattern[0], stream)?)
            }
            Some(pattern) => {
                let seed = pattern.len().min(nbytes);
                let mut op = copy::copy_htod(&dst, 0, &pattern[..seed], stream)?;
                let mut done = seed;
                while done < nbytes {
                    let n = done.min(nbytes - done);
                    op = copy::copy_dtod(&dst, done, &dst, 0, n, stream)?;
                    done += n;
                }
                Some(op)
            }
        };
        if let Some(op) = op {
            self.record(op, None)?;
        }
        self.install(dst);
        Ok(())
    }

    /// Device -> host through [`copy::enqueue`].
    pub(crate) fn copy_to_host(
        &mut self,
        host: &HostBuffer,
        nbytes: usize,
        stream: Option<StreamRef>,
    ) -> Result<()> {
        let src = self.current()?;
        let stream = self.pick(stream, src.device().id());
        debug_assert_eq!(src.len(), nbytes);
        self.order(stream, src.device().id())?;
        // SAFETY: the host buffer holds nbytes bytes and stays alive (the array owns an
        // Arc to it) until the event recorded below, which every host access waits for.
        let op =
            unsafe { copy::enqueue(Span::Host(host, 0), Span::Device(&src, 0), nbytes, stream)? };
        match op {
            Some(op) => self.record(op, None),
            None => Ok(()),
        }
    }

    /// Device -> another device, peer to peer.
    pub(crate) fn move_peer(
        &mut self,
        to: u32,
        nbytes: usize,
        stream: Option<StreamRef>,
    ) -> Result<()> {
        let stream = self.pick(stream, to);
        let (src, dst, op) = self.copy_into_new(to, nbytes, stream)?;
        // Only now does the new buffer become the device copy: if anything above
        // failed, the array still holds its data on the source device.
        if let Some(op) = op {
            self.record(op, Some(src))?;
        }
        self.install(dst);
        Ok(())
    }

    /// Why the device copy cannot be spilled now, if it cannot: a producer's memory, a
    /// live export or pin (another holder of the buffer), or work still running on it
    /// (the array's event or a consumer's recorded use; asked without blocking).
    pub(crate) fn spill_refusal(&self) -> Option<&'static str> {
        let Some(b) = &self.buffer else {
            return Some("it has no device copy");
        };
        if self.foreign {
            return Some("its device memory belongs to another library (a zero-copy import)");
        }
        if b.ipc.get().is_some() {
            return Some(
                "its device memory was shared with other processes (an IPC handle), which may \
                 still map it",
            );
        }
        if Arc::strong_count(b) > 1 {
            return Some(
                "its device memory is exported (a DLPack consumer, a CUDA Array Interface \
                 pointer, an IPC handle or an on_device scope holds it)",
            );
        }
        // Memarray's own lazy upload: its event, recorded now, tells whether it is done.
        self.settle();
        let busy = self
            .pending
            .lock()
            .unwrap_or_else(|e| e.into_inner())
            .as_ref()
            .is_some_and(|p| !p.event.is_complete().unwrap_or(false));
        if busy || !b.uses_done() {
            return Some("work is still queued on it");
        }
        None
    }

    /// Whether the device copy is a producer's memory (a zero-copy import).
    pub(crate) fn is_foreign(&self) -> bool {
        self.foreign
    }

    /// Frees the device copy (after a spill moved its data out and the host waited).
    pub(crate) fn drop_buffer(&mut self) {
        self.buffer = None;
    }

    pub(in crate::array) fn current(&self) -> Result<Arc<DeviceBuffer>> {
        self.buffer.clone().ok_or(ArrayError::NoDeviceCopy.into())
    }

    /// Device address of the current device copy.
    pub(crate) fn device_addr(&self) -> Result<u64> {
        Ok(self.current()?.device_ptr())
    }

    /// The current device buffer, shared (for exports that must pin it).
    pub(crate) fn device_buffer(&self) -> Result<Arc<DeviceBuffer>> {
        self.current()
    }

    /// Reads bytes of the device copy synchronously, after pending work.
    pub(crate) fn read_bytes(&self, offset: usize, out: &mut [u8]) -> Result<()> {
        let src = self.current()?;
        let stream = self.pick(None, src.device().id());
        self.order(stream, src.device().id())?;
        // Staged through pinned slots or direct, as `route` decides; done when it returns.
        copy::download(out, &src, offset, None, stream)
    }

    /// Writes bytes of the device copy, after pending work; returns once `value` has
    /// been read (the copy is the array's pending work).
    pub(crate) fn write_bytes(&mut self, offset: usize, value: &[u8]) -> Result<()> {
        let dst = self.current()?;
        let stream = self.pick(None, dst.device().id());
        self.order(stream, dst.device().id())?;
        match copy::upload(&dst, offset, value, None, stream)? {
            Some(op) => self.record_legacy_lazily(op),
            None => Ok(()),
        }
    }

    /// Writes `len` bytes that `fill(offset, buf)` produces at `offset` of the device copy,
    /// through the staged pipeline (each lane fills its pinned slot directly).
    pub(crate) fn write_with(
        &mut self,
        offset: usize,
        len: usize,
        fill: &(dyn Fn(usize, &mut [u8]) -> Result<()> + Sync),
    ) -> Result<()> {
        let dst = self.current()?;
        let stream = self.pick(None, dst.device().id());
        self.order(stream, dst.device().id())?;
        match copy::upload_with(&dst, offset, len, fill, stream)? {
            Some(op) => self.record(op, None),
            None => Ok(()),
        }
    }

    /// Fills the device copies of `sides` (`(side, bytes)`, each from its start, all on
    /// one device) from `fill` over their bytes laid end to end, in one upload
    /// ([`copy::upload_spans_with`]): on the first's stream, after every one's pending
    /// work; each records the upload as its pending work.
    pub(crate) fn write_many_with(
        sides: &mut [(&mut DeviceSide, usize)],
        fill: &(dyn Fn(usize, &mut [u8]) -> Result<()> + Sync),
    ) -> Result<()> {
        let Some((first, _)) = sides.first() else {
            return Ok(());
        };
        let bufs = sides
            .iter()
            .map(|(side, _)| side.current())
            .collect::<Result<Vec<_>>>()?;
        let id = bufs[0].device().id();
        let stream = first.pick(None, id);
        for (side, _) in sides.iter() {
            side.order(stream, id)?;
        }
        let dsts: Vec<(&DeviceBuffer, usize, usize)> = bufs
            .iter()
            .zip(sides.iter())
            .map(|(b, &(_, n))| (&**b, 0, n))
            .collect();
        if let Some(op) = copy::upload_spans_with(&dsts, fill, stream)? {
            for (side, _) in sides.iter_mut() {
                side.record(Enqueued::new(op.stream(), op.device().clone()), None)?;
            }
        }
        Ok(())
    }

    /// The device copy for an export (or a fresh copy of it), ordered for `consumer`.
    pub(crate) fn export(
        &self,
        nbytes: usize,
        copy: bool,
        consumer: Consumer,
    ) -> Result<(u64, Box<dyn std::any::Any + Send + Sync>)> {
        let src = self.current()?;
        let buf = if copy {
            let id = src.device().id();
            let stream = self.pick(None, id);
            let (_, dst, op) = self.copy_into_new(id, nbytes, stream)?;
            // No operation: nothing to copy (zero bytes), nothing to wait for.
            if let Some(op) = op {
                self.record_read(&op)?;
                let event = op.into_event()?;
                match consumer {
                    Consumer::Stream(s) if s != stream => s.wait(&event)?,
                    Consumer::Host => event.synchronize()?,
                    _ => {}
                }
            }
            dst
        } else {
            match consumer {
                Consumer::Stream(s) => self.order(s, src.device().id())?,
                Consumer::Host => self.wait_host()?,
                Consumer::NoSync => {}
            }
            src
        };
        let consumer = match consumer {
            Consumer::Stream(s) => Some(s),
            _ => None,
        };
        Ok((buf.device_ptr(), Box::new(ExportOwner { buf, consumer })))
    }

    /// A deep copy of the device side: a new device buffer holding the current data when
    /// the data is on a device, nothing otherwise.
    pub(crate) fn try_clone(&self, location: Location, nbytes: usize) -> Result<Self> {
        match location {
            Location::Device(id) => self.copy_on(id, nbytes, None),
            Location::Host => {
                let mut out = Self::new();
                out.resource = self.resource.clone();
                Ok(out)
            }
        }
    }

    /// A new device side holding a copy of the current device data on device `to`: one
    /// device copy (peer to peer from another device), on `stream` (the array's last
    /// stream there, else the legacy default stream, when `None`), after this side's work.
    pub(crate) fn copy_on(
        &self,
        to: u32,
        nbytes: usize,
        stream: Option<StreamRef>,
    ) -> Result<Self> {
        let stream = self.pick(stream, to);
        let (_, dst, op) = self.copy_into_new(to, nbytes, stream)?;
        let mut out = Self::new();
        out.resource = self.resource.clone();
        out.buffer = Some(dst);
        if let Some(op) = op {
            self.record_read(&op)?;
            out.record(op, None)?;
        }
        Ok(out)
    }

    /// The one copy behind [`Self::move_peer`] and [`Self::copy_on`]: a new buffer on
    /// device `to` (from [`Self::copy_resource`]) receiving the current device data on
    /// `stream`, after this side's work. Returns the source, the new buffer and the
    /// copy's operation for the caller to record.
    fn copy_into_new(
        &self,
        to: u32,
        nbytes: usize,
        stream: StreamRef,
    ) -> Result<(Arc<DeviceBuffer>, Arc<DeviceBuffer>, Option<Enqueued>)> {
        let src = self.current()?;
        let device = Device::get(to)?;
        if to != src.device().id() {
            // Direct peer access (NVLink / PCIe P2P) where the pair supports it; without
            // it cuMemcpyPeerAsync stages through the host. Enabling is idempotent.
            device.link_peer(src.device())?;
        }
        self.order(stream, to)?;
        let resource = self.copy_resource(&src, &device)?;
        // SAFETY: written in full by the copy below before anyone reads it.
        let mut dst = unsafe { DeviceBuffer::uninit(&device, nbytes, resource, stream)? };
        if !stream.is_persistent() {
            // A foreign stream may be gone when the buffer is freed.
            dst.set_free_stream(StreamRef::legacy());
        }
        // SAFETY: device memory only: no host span.
        let op =
            unsafe { copy::enqueue(Span::Device(&dst, 0), Span::Device(&src, 0), nbytes, stream)? };
        Ok((src, Arc::new(dst), op))
    }

    /// Where a copy of `src` on `device` comes from: `src`'s own resource for memarray's
    /// memory on the same device (a copy of a pinned-pool or managed array is of its
    /// kind); this side's resource or the device's default for another device and for a
    /// producer's memory (whose wrapper would serve it from a plain `cuMemAlloc`, freed by
    /// a synchronising `cuMemFree`, outside the pool and its accounting).
    fn copy_resource(
        &self,
        src: &DeviceBuffer,
        device: &Arc<Device>,
    ) -> Result<Arc<dyn memarray_core::MemoryResource>> {
        if self.foreign || src.device().id() != device.id() {
            self.resource_for(device)
        } else {
            Ok(src.resource().clone())
        }
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

    /// The device buffer on `device_id`: the existing one, or a new uninitialised one
    /// that the caller fills and then [`Self::install`]s once its copy is enqueued.
    ///
    /// # Safety
    /// 1. A new buffer is written in full before any read.
    pub(in crate::array) unsafe fn buffer_on(
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
    pub(in crate::array) fn takes_default_buffer_on(&self, device_id: u32) -> bool {
        self.resource.is_none()
            && self
                .buffer
                .as_ref()
                .is_none_or(|b| b.device().id() != device_id)
    }

    /// Makes `b` the device copy (a no-op if it already is).
    pub(in crate::array) fn install(&mut self, b: Arc<DeviceBuffer>) {
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
