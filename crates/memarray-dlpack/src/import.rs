//! Import: a validated, borrowed view of a foreign managed tensor that calls the producer's
//! deleter exactly once, when dropped or when validation fails.

use std::any::Any;
use std::ffi::c_void;
use std::ptr::NonNull;
use std::slice;

use dlpack_rs::ffi::{
    DLManagedTensor, DLManagedTensorVersioned, DLPACK_FLAG_BITMASK_IS_COPIED,
    DLPACK_FLAG_BITMASK_READ_ONLY, DLPACK_MAJOR_VERSION, DLPACK_MINOR_VERSION, DLTensor,
};
use memarray_core::{DType, MAX_NDIM, shape};

use crate::device::{Device, DeviceType};
use crate::error::DlpackError;
use crate::export::{call_deleter_unversioned, call_deleter_versioned};
use crate::layout;

/// What keeps an import's memory alive: a managed-tensor pointer of either kind, whose
/// deleter runs once on drop, or the owner of a [`ImportedTensor::from_host_view`] view.
enum Owned {
    Unversioned(NonNull<DLManagedTensor>),
    Versioned(NonNull<DLManagedTensorVersioned>),
    View { _owner: Box<dyn Any + Send> },
}

impl std::fmt::Debug for Owned {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self {
            Owned::Unversioned(p) => f.debug_tuple("Unversioned").field(p).finish(),
            Owned::Versioned(p) => f.debug_tuple("Versioned").field(p).finish(),
            Owned::View { .. } => f.write_str("View"),
        }
    }
}

impl Drop for Owned {
    fn drop(&mut self) {
        match *self {
            // SAFETY: ownership passed to us in `from_*` (their item 1); `Owned` is dropped
            // once, and nothing reads the tensor afterwards.
            Owned::Unversioned(p) => unsafe { call_deleter_unversioned(p) },
            // SAFETY: as above.
            Owned::Versioned(p) => unsafe { call_deleter_versioned(p) },
            // The owner drops with `self`.
            Owned::View { .. } => {}
        }
    }
}

/// A foreign tensor taken over from its producer: the fields, validated and copied, plus
/// the managed pointer, whose deleter runs when this is dropped.
///
/// The data itself is borrowed, not copied. Non-contiguous strided views are accepted
/// ([`is_c_contiguous`](Self::is_c_contiguous) is then false and callers read element-wise);
/// negative and overlapping strides are refused.
///
/// # Example
///
/// ```
/// use std::sync::Arc;
/// use memarray_dlpack::{DType, Device, ExportSpec, ImportedTensor, export_versioned};
///
/// // A producer exports six floats it owns (the owner lives until the deleter runs) ...
/// let data = Arc::new(vec![1.0f32, 2.0, 3.0, 4.0, 5.0, 6.0]);
/// let spec = ExportSpec::contiguous(data.as_ptr().cast_mut().cast(), Device::CPU, DType::F32, vec![2, 3]);
/// let managed = export_versioned(spec, Box::new(data.clone()))?;
/// // ... and a consumer takes the managed tensor over, validating every field.
/// // SAFETY: a live, valid tensor whose ownership passes to the import.
/// let t = unsafe { ImportedTensor::from_versioned(managed) }?;
/// assert_eq!((t.shape(), t.dtype(), t.version()), (&[2usize, 3][..], DType::F32, Some((1, 3))));
/// assert!(t.is_c_contiguous() && !t.read_only());
/// drop(t); // runs the producer's deleter exactly once, which drops its owner
/// assert_eq!(Arc::strong_count(&data), 1);
/// # Ok::<(), memarray_dlpack::DlpackError>(())
/// ```
#[derive(Debug)]
pub struct ImportedTensor {
    owned: Owned,
    data: *mut c_void,
    byte_offset: u64,
    device: Device,
    dtype: DType,
    shape: Vec<usize>,
    strides: Vec<i64>,
    read_only: bool,
    is_copied: bool,
    version: Option<(u32, u32)>,
}

// SAFETY: the only cross-thread effect is the producer's deleter, run by `Drop` on whichever
// thread drops this. DLPack lets the consumer end a tensor from any thread; Python producers
// (NumPy, CuPy, cuda.core) take the GIL inside their deleters and this crate's own deleters
// are thread-safe. All other state is an owned copy.
unsafe impl Send for ImportedTensor {}
// SAFETY: `&ImportedTensor` only reads the owned copies; it never calls into the producer.
unsafe impl Sync for ImportedTensor {}

impl ImportedTensor {
    /// Takes over an unversioned `DLManagedTensor` (a `"dltensor"` capsule's pointer).
    /// It carries no flags: [`read_only`](Self::read_only) and
    /// [`is_copied`](Self::is_copied) are false.
    ///
    /// # Errors
    /// As [`from_versioned`](Self::from_versioned), without the version check. The deleter
    /// has then already been called, exactly once.
    ///
    /// # Safety
    /// 1. `p` points to a valid `DLManagedTensor` whose `shape` (and `strides`, if not null)
    ///    hold `ndim` readable entries when `0 <= ndim <= MAX_NDIM`.
    /// 2. Ownership passes to the returned value (or is ended on error): the caller never
    ///    calls the deleter nor reads `p` again.
    pub unsafe fn from_unversioned(p: NonNull<DLManagedTensor>) -> Result<Self, DlpackError> {
        check_struct_mapped(p.as_ptr() as u64, size_of::<DLManagedTensor>())?;
        let owned = Owned::Unversioned(p);
        // SAFETY: `p` is valid for reads (item 1); `DLTensor` is `Copy`.
        let dl = unsafe { (*p.as_ptr()).dl_tensor };
        // SAFETY: `dl` is the valid tensor of item 1.
        unsafe { Self::from_parts(owned, &dl, 0, None, true) }
    }

    /// Takes over a `DLManagedTensorVersioned` (a `"dltensor_versioned"` capsule's pointer).
    /// A major version other than 1 is refused after reading only `version` and `deleter`;
    /// a newer minor version is accepted.
    ///
    /// # Errors
    /// [`DlpackError::UnsupportedVersion`], [`DlpackError::UnknownDeviceType`],
    /// [`DlpackError::NegativeDeviceId`], [`DlpackError::VectorLanes`],
    /// [`DlpackError::UnsupportedDType`], [`DlpackError::BadNdim`], [`DlpackError::NullShape`],
    /// [`DlpackError::NegativeShape`], `Core(ShapeOverflow)`, [`DlpackError::NegativeStride`],
    /// [`DlpackError::OverlappingStrides`], [`DlpackError::SpanOverflow`],
    /// [`DlpackError::NullData`], [`DlpackError::Misaligned`]. The deleter has then already
    /// been called, exactly once.
    ///
    /// # Safety
    /// 1. `p` points to a valid `DLManagedTensorVersioned` (any major version); if its major
    ///    version is 1, its `shape` (and `strides`, if not null) hold `ndim` readable entries
    ///    when `0 <= ndim <= MAX_NDIM`.
    /// 2. Ownership passes to the returned value (or is ended on error): the caller never
    ///    calls the deleter nor reads `p` again.
    pub unsafe fn from_versioned(
        p: NonNull<DLManagedTensorVersioned>,
    ) -> Result<Self, DlpackError> {
        // SAFETY: the caller's contract.
        unsafe { Self::versioned(p, true) }
    }

    /// [`ImportedTensor::from_versioned`] without the checks that the struct, shape,
    /// strides and host data are mapped (up to four `msync` calls, most of an import's
    /// cost), for tensors from a producer the caller knows (NumPy's exact `ndarray`):
    /// every other check runs.
    ///
    /// # Safety
    /// As [`ImportedTensor::from_versioned`], and every pointer in the tensor (and its host
    /// data, for `data + byte_offset` over the layout's span) is mapped.
    pub unsafe fn from_versioned_trusted(
        p: NonNull<DLManagedTensorVersioned>,
    ) -> Result<Self, DlpackError> {
        // SAFETY: the caller's contract.
        unsafe { Self::versioned(p, false) }
    }

    /// A host tensor described field by field rather than by a managed tensor: the same
    /// checks as [`from_versioned_trusted`](Self::from_versioned_trusted) (no mapping
    /// checks), with `owner` keeping the memory alive until this drops. For producers
    /// whose layout the caller reads directly (an exact NumPy `ndarray`'s fields), which
    /// skips the producer's `__dlpack__` call and its capsule. `version` is `None`.
    ///
    /// # Errors
    /// As [`from_versioned`](Self::from_versioned) for the shape, strides, data and dtype;
    /// `owner` is then dropped.
    ///
    /// # Safety
    /// 1. `shape` and `strides` (in elements) have the same length.
    /// 2. `data` is mapped host memory over the layout's span, live while `owner` is.
    pub unsafe fn from_host_view(
        data: *mut c_void,
        dtype: DType,
        shape: &[i64],
        strides: &[i64],
        read_only: bool,
        owner: Box<dyn Any + Send>,
    ) -> Result<Self, DlpackError> {
        let (code, bits, lanes) = dtype.dlpack();
        let dl = DLTensor {
            data,
            device: Device::CPU.to_dl(),
            ndim: i32::try_from(shape.len()).unwrap_or(i32::MAX),
            dtype: dlpack_rs::ffi::DLDataType { code, bits, lanes },
            shape: shape.as_ptr().cast_mut(),
            strides: strides.as_ptr().cast_mut(),
            byte_offset: 0,
        };
        let flags = if read_only {
            DLPACK_FLAG_BITMASK_READ_ONLY
        } else {
            0
        };
        // SAFETY: `dl` describes `shape.len()` entries of shape and strides (item 1).
        unsafe { Self::from_parts(Owned::View { _owner: owner }, &dl, flags, None, false) }
    }

    /// # Safety
    /// As [`ImportedTensor::from_versioned`]; with `!check_mapped`, as
    /// [`ImportedTensor::from_versioned_trusted`].
    unsafe fn versioned(
        p: NonNull<DLManagedTensorVersioned>,
        check_mapped: bool,
    ) -> Result<Self, DlpackError> {
        if check_mapped {
            check_struct_mapped(p.as_ptr() as u64, size_of::<DLManagedTensorVersioned>())?;
        }
        let owned = Owned::Versioned(p);
        // SAFETY: `version` is the first field in every major version (item 1).
        let version = unsafe { (*p.as_ptr()).version };
        if version.major != DLPACK_MAJOR_VERSION {
            return Err(DlpackError::UnsupportedVersion {
                major: version.major,
                minor: version.minor,
                supported_major: DLPACK_MAJOR_VERSION,
                supported_minor: DLPACK_MINOR_VERSION,
            });
        }
        // SAFETY: a major-1 struct has this layout (item 1); both fields are `Copy`.
        let (flags, dl) = unsafe { ((*p.as_ptr()).flags, (*p.as_ptr()).dl_tensor) };
        let version = Some((version.major, version.minor));
        // SAFETY: `dl` is the valid tensor of item 1.
        unsafe { Self::from_parts(owned, &dl, flags, version, check_mapped) }
    }

    /// Validates `dl` and copies its fields. The shape and strides arrays must be mapped
    /// (a forged pointer is refused rather than read). On error `owned` drops, calling the deleter.
    ///
    /// # Safety
    /// 1. `dl.shape` (and `dl.strides`, if not null) hold `dl.ndim` readable entries when
    ///    `0 <= dl.ndim <= MAX_NDIM`.
    unsafe fn from_parts(
        owned: Owned,
        dl: &DLTensor,
        flags: u64,
        version: Option<(u32, u32)>,
        check_mapped: bool,
    ) -> Result<Self, DlpackError> {
        let device = Device::from_dl(dl.device)?;
        let (code, bits, lanes) = (dl.dtype.code, dl.dtype.bits, dl.dtype.lanes);
        if lanes != 1 {
            return Err(DlpackError::VectorLanes { code, bits, lanes });
        }
        let dtype = DType::from_dlpack(code, bits, lanes)
            .map_err(|_| DlpackError::UnsupportedDType { code, bits, lanes })?;
        let ndim = match usize::try_from(dl.ndim) {
            Ok(n) if n <= MAX_NDIM => n,
            _ => {
                return Err(DlpackError::BadNdim {
                    ndim: dl.ndim.into(),
                    max: MAX_NDIM,
                });
            }
        };
        // A 0-d tensor may carry null or dangling shape / strides: they are never read.
        let raw_shape: &[i64] = if ndim == 0 {
            &[]
        } else if dl.shape.is_null() {
            return Err(DlpackError::NullShape { ndim });
        } else if check_mapped && !layout::host_range_mapped(dl.shape as u64, (ndim * 8) as u64) {
            return Err(DlpackError::Unmapped {
                address: dl.shape as u64,
                span: (ndim * 8) as u64,
            });
        } else {
            // SAFETY: non-null with `ndim` readable entries (item 1).
            unsafe { slice::from_raw_parts(dl.shape, ndim) }
        };
        let mut shape = Vec::with_capacity(ndim);
        for (dim, &extent) in raw_shape.iter().enumerate() {
            let Ok(e) = usize::try_from(extent) else {
                return Err(DlpackError::NegativeShape {
                    dim,
                    extent,
                    shape: raw_shape.to_vec(),
                });
            };
            shape.push(e);
        }
        layout::check_shape(&shape, dtype)?;
        // Null strides mean C-contiguous before DLPack 1.2; still accepted from old producers.
        let strides = if ndim == 0 {
            Vec::new()
        } else if dl.strides.is_null() {
            shape::c_strides(&shape)
        } else if check_mapped && !layout::host_range_mapped(dl.strides as u64, (ndim * 8) as u64) {
            return Err(DlpackError::Unmapped {
                address: dl.strides as u64,
                span: (ndim * 8) as u64,
            });
        } else {
            // SAFETY: non-null with `ndim` readable entries (item 1).
            unsafe { slice::from_raw_parts(dl.strides, ndim) }.to_vec()
        };
        let data = dl.data;
        layout::check_layout(&shape, &strides, dtype, data as u64, dl.byte_offset)?;
        // Host-accessible memory must be mapped here: a forged pointer or stride would
        // otherwise fault on the first read (issue 13, item 5). Device memory is checked
        // by the CUDA layer, which can ask the driver.
        if check_mapped
            && matches!(
                device.kind,
                DeviceType::Cpu | DeviceType::CudaHost | DeviceType::CudaManaged
            )
            && !shape.contains(&0)
        {
            let address = (data as u64).wrapping_add(dl.byte_offset);
            let span = layout::span_bytes(&shape, &strides, dtype.size()) as u64;
            if !layout::host_range_mapped(address, span) {
                return Err(DlpackError::Unmapped { address, span });
            }
        }
        if usize::try_from(dl.byte_offset).is_err() {
            return Err(DlpackError::SpanOverflow {
                strides,
                shape,
                itemsize: dtype.size(),
                address: data as u64,
            });
        }
        Ok(ImportedTensor {
            owned,
            data,
            byte_offset: dl.byte_offset,
            device,
            dtype,
            shape,
            strides,
            read_only: flags & DLPACK_FLAG_BITMASK_READ_ONLY != 0,
            is_copied: flags & DLPACK_FLAG_BITMASK_IS_COPIED != 0,
            version,
        })
    }

    /// Address of the first element: the producer's `data + byte_offset`. A host or device
    /// address depending on [`device`](Self::device); null only for an empty tensor.
    pub fn data(&self) -> *mut c_void {
        // Offset checked at import to stay within the 64-bit address space; no provenance
        // is claimed (it may be a device address).
        self.data.wrapping_byte_add(self.byte_offset as usize)
    }

    /// Where the data lives.
    pub fn device(&self) -> Device {
        self.device
    }

    /// The element type.
    pub fn dtype(&self) -> DType {
        self.dtype
    }

    /// Extents.
    pub fn shape(&self) -> &[usize] {
        &self.shape
    }

    /// Number of dimensions.
    pub fn ndim(&self) -> usize {
        self.shape.len()
    }

    /// Strides in elements, one per dimension: the producer's, or C-contiguous ones when it
    /// passed null.
    pub fn strides(&self) -> &[i64] {
        &self.strides
    }

    /// Whether the elements are dense in C order (extent-1 strides and empty tensors aside).
    pub fn is_c_contiguous(&self) -> bool {
        shape::is_c_contiguous(&self.shape, &self.strides)
    }

    /// The versioned read-only flag; false for unversioned tensors.
    pub fn read_only(&self) -> bool {
        self.read_only
    }

    /// The versioned is-copied flag; false for unversioned tensors.
    pub fn is_copied(&self) -> bool {
        self.is_copied
    }

    /// Number of elements.
    pub fn len(&self) -> usize {
        self.shape.iter().product()
    }

    /// Whether the tensor has no elements (some extent is 0).
    pub fn is_empty(&self) -> bool {
        self.len() == 0
    }

    /// Bytes of the elements: `len() * dtype().size()` (checked at import).
    pub fn nbytes(&self) -> usize {
        self.len() * self.dtype.size()
    }

    /// Bytes from the first element to the end of the last one; equals
    /// [`nbytes`](Self::nbytes) for contiguous tensors, more for strided views.
    pub fn span_bytes(&self) -> usize {
        layout::span_bytes(&self.shape, &self.strides, self.dtype.size())
    }

    /// The producer's `byte_offset`, already included in [`data`](Self::data).
    pub fn byte_offset(&self) -> u64 {
        self.byte_offset
    }

    /// `(major, minor)` of a versioned tensor; `None` for an unversioned one.
    pub fn version(&self) -> Option<(u32, u32)> {
        self.version
    }

    /// Whether this came from a `DLManagedTensorVersioned`.
    pub fn is_versioned(&self) -> bool {
        matches!(self.owned, Owned::Versioned(_))
    }
}

/// Refuses a managed-tensor pointer whose struct is not mapped here (a forged capsule):
/// the struct cannot be read, so its deleter cannot be called either, and the tensor is
/// left alone.
fn check_struct_mapped(address: u64, size: usize) -> Result<(), DlpackError> {
    if layout::host_range_mapped(address, size as u64) {
        Ok(())
    } else {
        Err(DlpackError::Unmapped {
            address,
            span: size as u64,
        })
    }
}
