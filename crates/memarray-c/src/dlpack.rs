//! DLPack: arrays out as versioned managed tensors (for a C++ extension handing them to
//! Python, or any DLPack consumer) and tensors in.

use std::ptr::NonNull;

use memarray_core::{HostBuffer, Location, MemoryKind};
use memarray_cuda::array::Consumer;
use memarray_cuda::{Device as CudaDevice, RawArray};
use memarray_dlpack::ffi::DLManagedTensorVersioned;
use memarray_dlpack::{DeviceType, ExportSpec, ImportedTensor, export_versioned};

use crate::array::{array_arg, memarray_array, new_handle, token_of};
use crate::error::{Error, check_out, guard, memarray_status, write_out};
use crate::stream::{memarray_stream, stream_arg};

/// Exports `a` zero-copy where its data is, as a DLPack 1.x versioned managed tensor.
/// `consumer`: the stream the consumer will use (it waits on the array's pending work),
/// or NULL to have the host wait before the call returns. On success `*out` is the
/// caller's: end it with its `deleter` (or hand it to a consumer that will, such as a
/// `"dltensor_versioned"` PyCapsule). The memory stays alive until then, whatever happens
/// to the array.
///
/// # Safety
/// Handles are live; `out` is writable.
#[unsafe(no_mangle)]
pub unsafe extern "C" fn memarray_array_to_dlpack(
    a: *const memarray_array,
    consumer: *const memarray_stream,
    token: u64,
    out: *mut *mut DLManagedTensorVersioned,
) -> memarray_status {
    guard(|| {
        // SAFETY: the caller's contract.
        let a = unsafe { array_arg(a, "array") }?;
        check_out(out, "out")?;
        // SAFETY: the caller's contract.
        let consumer = match unsafe { stream_arg(consumer) } {
            Some(s) => Consumer::Stream(s),
            None => Consumer::Host,
        };
        let (spec, owner) = {
            let mut raw = a.state();
            let buf = raw.export_buffer(token_of(token), false, consumer)?;
            let device = memarray_dlpack::Device::from(buf.location);
            let spec = ExportSpec::contiguous(buf.ptr, device, raw.dtype(), raw.shape().to_vec());
            (spec, buf.owner)
        };
        let p = export_versioned(spec, owner)?;
        // SAFETY: checked above.
        unsafe { write_out(out, "out", p.as_ptr()) }
    })
}

/// Imports a DLPack 1.x versioned managed tensor, which becomes memarray's whatever the
/// status (its deleter runs when the array is done with it, or before an error returns).
/// C-contiguous writable tensors are shared zero-copy (host, pinned, managed or CUDA
/// memory); read-only ones are copied; others are refused. `producer`: the stream the
/// producer's work on a CUDA tensor is queued on (NULL: the legacy default stream);
/// later work on the array waits for it. On success `*out` is a new array: release it
/// with `memarray_array_free`.
///
/// # Safety
/// `t` is NULL or a valid `DLManagedTensorVersioned` the caller gives up; `producer` is
/// NULL or live; `out` is writable.
#[unsafe(no_mangle)]
pub unsafe extern "C" fn memarray_array_from_dlpack(
    t: *mut DLManagedTensorVersioned,
    producer: *const memarray_stream,
    out: *mut *mut memarray_array,
) -> memarray_status {
    guard(|| {
        let Some(p) = NonNull::new(t) else {
            return Err(Error::arg("tensor is NULL"));
        };
        if out.is_null() {
            // Ownership passed to us: end the tensor before refusing.
            // SAFETY: the caller's contract; from_versioned ends it on error too.
            drop(unsafe { ImportedTensor::from_versioned(p) });
            return Err(Error::arg("out is NULL"));
        }
        // SAFETY: the caller's contract; ownership passes to `t`.
        let t = unsafe { ImportedTensor::from_versioned(p) }?;
        // SAFETY: the caller's contract.
        let producer =
            unsafe { stream_arg(producer) }.unwrap_or(memarray_cuda::StreamRef::legacy());
        let raw = import(t, producer)?;
        // SAFETY: checked above.
        unsafe { write_out(out, "out", new_handle(raw)) }
    })
}

fn import(t: ImportedTensor, producer: memarray_cuda::StreamRef) -> crate::error::Result<RawArray> {
    let (dtype, shape) = (t.dtype(), t.shape().to_vec());
    if !t.is_c_contiguous() && !t.is_empty() {
        return Err(Error::arg(
            "the tensor is not C-contiguous; memarray imports C-contiguous tensors from C",
        ));
    }
    let share = !t.read_only() && !t.is_empty();
    match t.device().kind {
        DeviceType::Cuda => {
            let id = u32::try_from(t.device().id)
                .map_err(|_| Error::arg("the tensor's CUDA device id is negative"))?;
            let device = CudaDevice::get(id)?;
            if t.is_empty() {
                return Ok(RawArray::zeros_on(
                    dtype,
                    &shape,
                    Location::Device(id),
                    None,
                    None,
                )?);
            }
            let (addr, nbytes) = (t.data() as u64, t.nbytes());
            memarray_cuda::check_device_span(&device, addr, t.span_bytes())
                .map_err(|e| Error::arg(format!("refused foreign device tensor: {e}")))?;
            // SAFETY: ImportedTensor validated the tensor: addr holds nbytes of this
            // C-contiguous shape on `device` while `t` (the owner) lives; `producer` is
            // the caller's live stream or the legacy one.
            Ok(unsafe {
                RawArray::from_device_memory(
                    &device,
                    dtype,
                    &shape,
                    addr,
                    nbytes,
                    Box::new(t),
                    share,
                    Some(producer),
                )
            }?)
        }
        kind => {
            if !share {
                let mut raw = RawArray::zeros(dtype, &shape, 0)?;
                if !t.is_empty() {
                    // SAFETY: a validated C-contiguous host tensor of nbytes bytes.
                    let src =
                        unsafe { std::slice::from_raw_parts(t.data().cast::<u8>(), t.nbytes()) };
                    raw.write_all(src, None)?;
                }
                return Ok(raw);
            }
            let mem = match kind {
                DeviceType::CudaHost => MemoryKind::Pinned,
                DeviceType::CudaManaged => MemoryKind::Managed,
                _ => MemoryKind::Host,
            };
            let ptr = NonNull::new(t.data().cast::<u8>())
                .ok_or_else(|| Error::arg("a tensor with elements has NULL data"))?;
            let len = t.nbytes();
            // SAFETY: ImportedTensor validated that data + nbytes is the producer's
            // memory, live until its deleter runs, which happens when `t` drops.
            let host = unsafe { HostBuffer::from_foreign(ptr, len, mem, Box::new(t)) };
            Ok(RawArray::from_host_buffer(dtype, &shape, host, 0)?)
        }
    }
}
