//! DLPack: arrays out as versioned managed tensors (for a C++ extension handing them to
//! Python, or any DLPack consumer) and tensors in.

use std::ptr::NonNull;

use memarray_cuda::RawArray;
use memarray_cuda::array::{Consumer, CopyPolicy};
use memarray_dlpack::ffi::DLManagedTensorVersioned;
use memarray_dlpack::{ExportSpec, ImportedTensor, export_versioned};

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
        let buf = a.state().export_buffer(token_of(token), false, consumer)?;
        let (spec, owner) = ExportSpec::from_buffer(buf);
        let p = export_versioned(spec, owner)?;
        // SAFETY: checked above.
        unsafe { write_out(out, "out", p.as_ptr()) }
    })
}

/// Imports a DLPack 1.x versioned managed tensor, which becomes memarray's whatever the
/// status (its deleter runs when the array is done with it, or before an error returns).
/// C-contiguous writable tensors are shared zero-copy (host, pinned, managed or CUDA
/// memory); read-only and strided ones (any non-negative, non-overlapping strides) are
/// copied into a C-contiguous array where the data is: the rules of Python's
/// `memarray.from_dlpack`, through the same import. `producer`: the stream the
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
        let raw = RawArray::import(t.into_foreign(), CopyPolicy::IfNeeded, Some(producer))?;
        // SAFETY: checked above.
        unsafe { write_out(out, "out", new_handle(raw)) }
    })
}
