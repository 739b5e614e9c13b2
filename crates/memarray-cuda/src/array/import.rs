//! The one import of a foreign tensor ([`ForeignTensor`], filled by memarray-dlpack's
//! import, the CUDA Array Interface parser or NumPy's fields): the span check against the
//! driver, share or copy, the strided gather, the host memory kind. Python's
//! `from_dlpack` / `from_cuda_array_interface` and C's `memarray_array_from_dlpack` all
//! come here, so they follow the same rules.

use std::sync::Arc;

use memarray_core::foreign::{ForeignTensor, Place};
use memarray_core::{HostBuffer, Location, MemoryKind, layout};

use super::raw::RawArray;
use crate::buffer::DeviceBuffer;
use crate::device::{Device, check_device_span};
use crate::error::{ArrayError, Result};
use crate::event::Event;
use crate::stream::StreamRef;

/// Whether an import may, must or must not copy (Python's `copy=False / None / True`).
#[derive(Clone, Copy, Debug, PartialEq, Eq, Default)]
pub enum CopyPolicy {
    /// Share the memory or refuse ([`ArrayError::NotShareable`]).
    Never,
    /// Share the memory where the tensor allows it (C-contiguous, writable, with
    /// elements), copy otherwise.
    #[default]
    IfNeeded,
    /// Always copy.
    Always,
}

impl From<Option<bool>> for CopyPolicy {
    /// Python's spelling: `Some(false)` never, `None` if needed, `Some(true)` always.
    fn from(copy: Option<bool>) -> Self {
        match copy {
            Some(false) => CopyPolicy::Never,
            None => CopyPolicy::IfNeeded,
            Some(true) => CopyPolicy::Always,
        }
    }
}

impl RawArray {
    /// The array of a foreign tensor: sharing its memory (the tensor's owner then lives
    /// as long as the array) when it is C-contiguous, writable, non-empty and `copy`
    /// allows; otherwise a C-contiguous copy where the data is (a strided device tensor
    /// is gathered through the host). Device memory must lie inside one allocation the
    /// driver knows; CUDA data is ordered after `producer` (the stream the producer's
    /// work is queued on; `None`: nothing to wait for). Host tensors become host arrays
    /// of the memory's kind (pageable, pinned, managed).
    ///
    /// # Errors
    /// [`ArrayError::NotShareable`] when `copy` is [`CopyPolicy::Never`] and the tensor
    /// cannot be shared; [`ArrayError::ForeignMemory`] for device memory the driver does
    /// not know or that is shorter than the tensor; driver and allocation errors.
    pub fn import(
        t: ForeignTensor,
        copy: CopyPolicy,
        producer: Option<StreamRef>,
    ) -> Result<RawArray> {
        let shareable = t.shareable();
        if copy == CopyPolicy::Never
            && !t.is_empty()
            && let Err(reason) = shareable
        {
            return Err(ArrayError::NotShareable { reason }.into());
        }
        let share = shareable.is_ok() && copy != CopyPolicy::Always;
        match t.place() {
            Place::Device(id) => import_device(t, id, share, producer),
            Place::Host => import_host(t, MemoryKind::Host, share),
            Place::Pinned => import_host(t, MemoryKind::Pinned, share),
            Place::Managed => import_host(t, MemoryKind::Managed, share),
        }
    }
}

fn import_host(t: ForeignTensor, kind: MemoryKind, share: bool) -> Result<RawArray> {
    let (dtype, shape) = (t.dtype(), t.shape().to_vec());
    if share && let Some(ptr) = std::ptr::NonNull::new(t.data() as *mut u8) {
        let len = t.nbytes();
        // SAFETY: the tensor's checked layout is `len` dense bytes at `ptr` of host
        // memory, writable (shareable), live while its owner is, which the buffer keeps.
        let host = unsafe { HostBuffer::from_foreign(ptr, len, kind, t.into_owner()) };
        return RawArray::from_host_buffer(dtype, &shape, host, 0);
    }
    let mut raw = RawArray::zeros(dtype, &shape, 0)?;
    if !t.is_empty() {
        let out = raw.host_bytes_mut(None)?;
        // SAFETY: host memory (every place but a device) over the checked layout.
        unsafe { t.gather_into(out) };
    }
    Ok(raw)
}

fn import_device(
    t: ForeignTensor,
    id: u32,
    share: bool,
    producer: Option<StreamRef>,
) -> Result<RawArray> {
    let device = Device::get(id)?;
    let (dtype, shape) = (t.dtype(), t.shape().to_vec());
    if t.is_empty() {
        // Nothing to share: an empty array on the producer's device.
        return RawArray::zeros_on(dtype, &shape, Location::Device(id), None, None);
    }
    // The producer's claim must fit one allocation the driver knows:
    // a forged pointer, offset or stride would fault on the device and poison the context.
    check_device_span(&device, t.data(), t.span_bytes()).map_err(|e| {
        ArrayError::ForeignMemory {
            reason: e.to_string(),
        }
    })?;
    if !t.is_c_contiguous() {
        return import_strided(&device, t, producer);
    }
    let (addr, nbytes) = (t.data(), t.nbytes());
    // SAFETY: the tensor's checked layout is `nbytes` dense bytes at `addr` on `device`
    // (inside one allocation, checked above), live while its owner is; `producer` is the
    // producer's live stream.
    unsafe {
        RawArray::from_device_memory(
            &device,
            dtype,
            &shape,
            addr,
            nbytes,
            t.into_owner(),
            share,
            producer,
        )
    }
}

/// Copies a non-contiguous device tensor into a new C-contiguous array on its device.
/// The reachable span is staged through the host and gathered there: correct for any
/// layout [`layout::check`] accepts, at host-copy speed. The owner is released once the
/// span is read.
fn import_strided(
    device: &Arc<Device>,
    t: ForeignTensor,
    producer: Option<StreamRef>,
) -> Result<RawArray> {
    let (dtype, shape, strides) = (t.dtype(), t.shape().to_vec(), t.strides().to_vec());
    let (addr, span) = (t.data(), t.span_bytes());
    let stream = StreamRef::legacy();
    // SAFETY: every element lies within `span` bytes from `addr` (checked layout), inside
    // one allocation on `device` (checked by the caller), live while the owner is; the
    // buffer (and owner) drops after the synchronous copy below.
    let foreign =
        unsafe { DeviceBuffer::from_foreign(device, addr, span, t.into_owner(), stream) }?;
    if let Some(p) = producer {
        let ev = Event::new(device)?;
        ev.record(p)?;
        stream.wait(&ev)?;
    }
    let mut staging = Vec::new();
    staging
        .try_reserve_exact(span)
        .map_err(|_| memarray_core::CoreError::OutOfMemory {
            bytes: span,
            resource: "host".into(),
            reason: "cannot stage the strided device tensor through host memory".into(),
        })?;
    staging.resize(span, 0);
    crate::copy::download(&mut staging, &foreign, 0, None, stream)?;
    drop(foreign);
    let mut raw = RawArray::zeros(dtype, &shape, device.id())?;
    let out = raw.host_bytes_mut(None)?;
    // SAFETY: every element offset lies within `span`, which `staging` holds in full.
    unsafe { layout::gather(staging.as_ptr(), &shape, &strides, dtype.size(), out) };
    raw.move_memory(Location::Device(device.id()), None, true, None)?;
    Ok(raw)
}

#[cfg(test)]
mod tests {
    use super::*;
    use memarray_core::DType;

    fn host(data: &[u8], shape: Vec<usize>, strides: Vec<i64>, read_only: bool) -> ForeignTensor {
        // SAFETY: every layout used below stays inside `data`, which outlives the tensor
        // (the tests drop the arrays first or copy).
        unsafe {
            ForeignTensor::new(
                Place::Host,
                data.as_ptr() as u64,
                0,
                DType::U8,
                shape,
                strides,
                read_only,
                Box::new(()),
            )
        }
        .unwrap()
    }

    #[test]
    fn host_tensors_share_copy_or_refuse_by_one_rule() {
        let data: Vec<u8> = (0..12).collect();
        // Contiguous and writable: shared (the array reads the producer's bytes).
        let raw = RawArray::import(
            host(&data, vec![3, 4], vec![4, 1], false),
            CopyPolicy::Never,
            None,
        )
        .unwrap();
        assert_eq!(raw.host_bytes(None).unwrap().as_ptr(), data.as_ptr());
        drop(raw);
        // Strided: gathered into C order (copy allowed), refused with copy never.
        let t = host(&data, vec![3, 2], vec![4, 2], false);
        let e = RawArray::import(t, CopyPolicy::Never, None).unwrap_err();
        assert!(e.to_string().contains("not C-contiguous"), "{e}");
        let raw = RawArray::import(
            host(&data, vec![3, 2], vec![4, 2], false),
            CopyPolicy::IfNeeded,
            None,
        )
        .unwrap();
        assert_eq!(raw.host_bytes(None).unwrap(), &[0, 2, 4, 6, 8, 10]);
        // Read-only: copied, never shared.
        let raw = RawArray::import(
            host(&data, vec![12], vec![1], true),
            CopyPolicy::IfNeeded,
            None,
        )
        .unwrap();
        assert_ne!(raw.host_bytes(None).unwrap().as_ptr(), data.as_ptr());
        assert_eq!(raw.host_bytes(None).unwrap(), &data[..]);
        // Always: a copy even of a shareable tensor.
        let raw = RawArray::import(
            host(&data, vec![12], vec![1], false),
            CopyPolicy::Always,
            None,
        )
        .unwrap();
        assert_ne!(raw.host_bytes(None).unwrap().as_ptr(), data.as_ptr());
        // Empty: an empty array whatever the policy.
        let raw = RawArray::import(
            host(&data, vec![0, 3], vec![3, 1], true),
            CopyPolicy::Never,
            None,
        )
        .unwrap();
        assert_eq!(raw.shape(), &[0, 3]);
    }
}
