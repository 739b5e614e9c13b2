//! Export: build a `DLManagedTensor` or `DLManagedTensorVersioned` that keeps an owner alive
//! until its deleter runs.
//!
//! The struct comes from the recycling pool ([`crate::pool`]); `manager_ctx` points to the
//! pooled slot, which also holds the shape / strides storage and the owner. The deleter
//! nulls `manager_ctx` with an atomic swap (so of two calls, even concurrent ones, exactly
//! one proceeds), nulls `shape`, `strides` and `data`, returns the slot to the pool and drops
//! the owner last, outside every lock. It never touches Python and runs on any thread.

use std::any::Any;
use std::ffi::c_void;
use std::panic::{self, AssertUnwindSafe};
use std::ptr::{self, NonNull};
use std::sync::atomic::{AtomicPtr, Ordering};

use dlpack_rs::ffi::{
    DLDataType, DLManagedTensor, DLManagedTensorVersioned, DLPACK_FLAG_BITMASK_IS_COPIED,
    DLPACK_FLAG_BITMASK_READ_ONLY, DLPACK_MAJOR_VERSION, DLPACK_MINOR_VERSION, DLPackVersion,
    DLTensor,
};
use memarray_core::foreign::ExportBuffer;
use memarray_core::{DType, MAX_NDIM, layout};

use crate::device::Device;
use crate::error::DlpackError;
use crate::pool::{Managed, Slot};

/// What to export: a pointer, where it lives, and how to read it.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct ExportSpec {
    /// The data pointer (host or device address). Null only for empty tensors.
    pub data: *mut c_void,
    /// Where `data` lives.
    pub device: Device,
    /// The element type.
    pub dtype: DType,
    /// Extents, 0 to [`MAX_NDIM`] of them.
    pub shape: Vec<usize>,
    /// Strides in elements, one per dimension; `None` means C-contiguous. The exported
    /// tensor always carries explicit strides.
    pub strides: Option<Vec<i64>>,
    /// Bytes from `data` to the first element; `data + byte_offset` must be element-aligned.
    pub byte_offset: u64,
    /// Consumers must not write. Versioned exports set `DLPACK_FLAG_BITMASK_READ_ONLY`;
    /// unversioned exports cannot say so and refuse.
    pub read_only: bool,
    /// The data is a fresh copy made for this export (`DLPACK_FLAG_BITMASK_IS_COPIED`;
    /// versioned only, unversioned exports drop it).
    pub is_copied: bool,
}

impl ExportSpec {
    /// The export of memarray's `buf` (C-contiguous, writable, `is_copied` as the buffer
    /// says), and the owner to hand [`export_versioned`] / [`export_unversioned`] with it:
    /// the one sequence every exporter (Python's `__dlpack__`, the C exchange allocator,
    /// the C ABI) follows.
    pub fn from_buffer(buf: ExportBuffer) -> (Self, Box<dyn Any + Send>) {
        let mut spec =
            ExportSpec::contiguous(buf.ptr, Device::from(buf.location), buf.dtype, buf.shape);
        spec.is_copied = buf.is_copied;
        (spec, buf.owner)
    }

    /// A writable, C-contiguous, not-copied export of `shape` at `data`.
    pub fn contiguous(data: *mut c_void, device: Device, dtype: DType, shape: Vec<usize>) -> Self {
        ExportSpec {
            data,
            device,
            dtype,
            shape,
            strides: None,
            byte_offset: 0,
            read_only: false,
            is_copied: false,
        }
    }
}

/// Builds an unversioned `DLManagedTensor` (DLPack < 1.0 consumers such as JAX).
///
/// Returns an owning pointer: hand it to a `"dltensor"` capsule, or to
/// [`crate::ImportedTensor::from_unversioned`], or end it with
/// [`call_deleter_unversioned`]. `owner` is kept alive until the deleter runs.
///
/// # Errors
/// Every check of [`export_versioned`], and [`DlpackError::ReadOnlyUnversioned`] when
/// `spec.read_only` is set (the unversioned struct cannot carry the flag; NumPy refuses
/// the same way). On error `owner` is dropped before returning.
pub fn export_unversioned(
    spec: ExportSpec,
    owner: Box<dyn Any + Send>,
) -> Result<NonNull<DLManagedTensor>, DlpackError> {
    if spec.read_only {
        return Err(DlpackError::ReadOnlyUnversioned);
    }
    let (slot, dl_tensor) = fill::<DLManagedTensor>(&spec, owner)?;
    let tensor = DLManagedTensor {
        dl_tensor,
        manager_ctx: slot.as_ptr().cast(),
        deleter: Some(deleter::<DLManagedTensor>),
    };
    // SAFETY: `fill` gave us the slot exclusively; `tensor` is `Copy`, nothing is dropped.
    unsafe { ptr::write(&raw mut (*slot.as_ptr()).tensor, tensor) };
    Ok(slot.cast())
}

/// Builds a versioned `DLManagedTensorVersioned`, version
/// `{DLPACK_MAJOR_VERSION, DLPACK_MINOR_VERSION}` = 1.3, with the read-only and
/// is-copied flags from `spec`.
///
/// Returns an owning pointer: hand it to a `"dltensor_versioned"` capsule, or to
/// [`crate::ImportedTensor::from_versioned`], or end it with [`call_deleter_versioned`].
/// `owner` is kept alive until the deleter runs.
///
/// # Errors
/// [`DlpackError::NegativeDeviceId`]; `Core(TooManyDims)` above [`MAX_NDIM`] dimensions;
/// `Core(ShapeOverflow)` when the byte size overflows; `Core(Layout(..))` for strides, a
/// null pointer with elements or a misaligned one ([`memarray_core::LayoutError`]). On
/// error `owner` is dropped before returning.
pub fn export_versioned(
    spec: ExportSpec,
    owner: Box<dyn Any + Send>,
) -> Result<NonNull<DLManagedTensorVersioned>, DlpackError> {
    let (slot, dl_tensor) = fill::<DLManagedTensorVersioned>(&spec, owner)?;
    let mut flags = 0;
    if spec.read_only {
        flags |= DLPACK_FLAG_BITMASK_READ_ONLY;
    }
    if spec.is_copied {
        flags |= DLPACK_FLAG_BITMASK_IS_COPIED;
    }
    let tensor = DLManagedTensorVersioned {
        version: DLPackVersion {
            major: DLPACK_MAJOR_VERSION,
            minor: DLPACK_MINOR_VERSION,
        },
        manager_ctx: slot.as_ptr().cast(),
        deleter: Some(deleter::<DLManagedTensorVersioned>),
        flags,
        dl_tensor,
    };
    // SAFETY: `fill` gave us the slot exclusively; `tensor` is `Copy`, nothing is dropped.
    unsafe { ptr::write(&raw mut (*slot.as_ptr()).tensor, tensor) };
    Ok(slot.cast())
}

/// Validates `spec`, takes a slot, stores shape, strides and owner in it, and returns the
/// `DLTensor` pointing into it. The caller writes the managed struct.
fn fill<T: Managed>(
    spec: &ExportSpec,
    owner: Box<dyn Any + Send>,
) -> Result<(NonNull<Slot<T>>, DLTensor), DlpackError> {
    Device::from_dl(spec.device.to_dl())?;
    layout::check_shape(&spec.shape, spec.dtype)?;
    let ndim = spec.shape.len();
    let mut c_strides = [0i64; MAX_NDIM];
    let strides: &[i64] = match &spec.strides {
        Some(s) => s,
        None => {
            // `shape::c_strides` without its Vec: exports should stay well under 1 us.
            let mut acc = 1i64;
            for (s, &d) in c_strides[..ndim].iter_mut().zip(&spec.shape).rev() {
                *s = acc;
                acc = acc.wrapping_mul(d.max(1) as i64);
            }
            &c_strides[..ndim]
        }
    };
    layout::check(
        &spec.shape,
        strides,
        spec.dtype,
        spec.data as u64,
        spec.byte_offset,
    )?;

    let slot = T::pool().acquire();
    let s = slot.as_ptr();
    // SAFETY: `acquire` hands out the slot exclusively (fresh, or out of quarantine with no
    // owner); `dims` is plain data and `owner` is `None`, so the assignments drop nothing
    // of value. `ndim <= MAX_NDIM` was checked, so both ranges are in bounds.
    let dims = unsafe {
        (*s).owner = Some(owner);
        let dims = &mut (*s).dims;
        for (d, &e) in dims[..ndim].iter_mut().zip(&spec.shape) {
            *d = e as i64; // fits: check_shape bounds extents by i64::MAX
        }
        dims[MAX_NDIM..MAX_NDIM + ndim].copy_from_slice(strides);
        dims.as_mut_ptr()
    };
    let (code, bits, lanes) = spec.dtype.dlpack();
    let dl_tensor = DLTensor {
        data: spec.data,
        device: spec.device.to_dl(),
        ndim: ndim as i32,
        dtype: DLDataType { code, bits, lanes },
        // Never null, also for ndim 0: a valid pointer to zero extents and zero strides,
        // so consumers that predate DLPack 1.2 never read null strides as "contiguous".
        shape: dims,
        // SAFETY: MAX_NDIM < dims.len(), so the offset stays inside the array.
        strides: unsafe { dims.add(MAX_NDIM) },
        byte_offset: spec.byte_offset,
    };
    Ok((slot, dl_tensor))
}

/// The deleter installed in every export. Idempotent: a repeated call within the quarantine
/// of [`crate::pool`], concurrent ones included, finds `manager_ctx` null and returns.
///
/// # Safety
/// 1. `p` is null, or a struct this crate exported (live, or deleted less than
///    [`crate::pool::QUARANTINE`] deletions ago).
unsafe extern "C" fn deleter<T: Managed>(p: *mut T) {
    if p.is_null() {
        return;
    }
    // SAFETY: `p` is one of our slots, still allocated (item 1); `manager_ctx` is pointer-
    // aligned, and every other access to it is ordered with this one by the pool's mutex or
    // by the hand-over of the pointer to the consumer.
    let ctx = unsafe { AtomicPtr::from_ptr(T::manager_ctx(p)) };
    let slot = ctx
        .swap(ptr::null_mut(), Ordering::AcqRel)
        .cast::<Slot<T>>();
    let Some(slot) = NonNull::new(slot) else {
        return; // already deleted
    };
    // SAFETY: winning the swap made this call the slot's only user. `manager_ctx` is the
    // slot itself, so the slot's tensor is `*p`.
    let owner = unsafe {
        let s = slot.as_ptr();
        let t = T::dl_tensor(&raw mut (*s).tensor);
        (*t).data = ptr::null_mut();
        (*t).shape = ptr::null_mut();
        (*t).strides = ptr::null_mut();
        (*t).ndim = 0;
        (*s).owner.take()
    };
    // SAFETY: the slot came from this pool, its owner is taken and `manager_ctx` nulled.
    unsafe { T::pool().release(slot) };
    // Dropped last and outside the pool lock: the owner's Drop may export or delete again.
    // A panic must not unwind into the (C) caller; the panic hook has already reported it.
    let _ = panic::catch_unwind(AssertUnwindSafe(move || drop(owner)));
}

/// Calls `p`'s deleter, if it has one: ends an export that no consumer took (a capsule
/// destroyed unconsumed), for this crate's exports and foreign ones alike.
///
/// # Safety
/// 1. `p` points to a valid `DLManagedTensor`: not yet deleted, or exported by this crate
///    and deleted less than [`crate::pool::QUARANTINE`] deletions ago (then this is a no-op).
/// 2. The caller owns `p` and does not use it afterwards.
pub unsafe fn call_deleter_unversioned(p: NonNull<DLManagedTensor>) {
    // SAFETY: `p` is valid for reads (item 1).
    let deleter = unsafe { (*p.as_ptr()).deleter };
    if let Some(deleter) = deleter {
        // SAFETY: the owner ends the tensor once (items 1, 2), as DLPack prescribes.
        unsafe { deleter(p.as_ptr()) };
    }
}

/// Calls `p`'s deleter, if it has one. Reads only `deleter`, which DLPack keeps at the same
/// offset in every major version, so it also ends tensors of an unsupported version.
///
/// # Safety
/// 1. `p` points to a valid `DLManagedTensorVersioned`: not yet deleted, or exported by this
///    crate and deleted less than [`crate::pool::QUARANTINE`] deletions ago (a no-op then).
/// 2. The caller owns `p` and does not use it afterwards.
pub unsafe fn call_deleter_versioned(p: NonNull<DLManagedTensorVersioned>) {
    // SAFETY: `p` is valid for reads (item 1).
    let deleter = unsafe { (*p.as_ptr()).deleter };
    if let Some(deleter) = deleter {
        // SAFETY: the owner ends the tensor once (items 1, 2), as DLPack prescribes.
        unsafe { deleter(p.as_ptr()) };
    }
}
