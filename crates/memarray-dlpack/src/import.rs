//! Import: a validated, borrowed view of a foreign managed tensor that calls the producer's
//! deleter exactly once, when dropped or when validation fails.

use std::ffi::c_void;
use std::ptr::NonNull;
use std::slice;

use dlpack_rs::ffi::{
    DLManagedTensor, DLManagedTensorVersioned, DLPACK_FLAG_BITMASK_IS_COPIED,
    DLPACK_FLAG_BITMASK_READ_ONLY, DLPACK_MAJOR_VERSION, DLPACK_MINOR_VERSION, DLTensor,
};
use memarray_core::{DType, ForeignTensor, MAX_NDIM, Place, shape};

use crate::device::{Device, DeviceType};
use crate::error::DlpackError;
use crate::export::{call_deleter_unversioned, call_deleter_versioned};
use crate::layout;

/// What keeps an import's memory alive: a managed-tensor pointer of either kind, whose
/// deleter runs once on drop. It is the owner of the import's [`ForeignTensor`].
enum Owned {
    Unversioned(NonNull<DLManagedTensor>),
    Versioned(NonNull<DLManagedTensorVersioned>),
}

// SAFETY: the only cross-thread effect is the producer's deleter, run by `Drop` on whichever
// thread drops this. DLPack lets the consumer end a tensor from any thread; Python producers
// (NumPy, CuPy, cuda.core) take the GIL inside their deleters and this crate's own deleters
// are thread-safe.
unsafe impl Send for Owned {}
// SAFETY: `&Owned` gives nothing to call: the pointer is only read by `Drop`.
unsafe impl Sync for Owned {}

impl std::fmt::Debug for Owned {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self {
            Owned::Unversioned(p) => f.debug_tuple("Unversioned").field(p).finish(),
            Owned::Versioned(p) => f.debug_tuple("Versioned").field(p).finish(),
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
        }
    }
}

/// A foreign tensor taken over from its producer: the fields, validated and copied, plus
/// the managed pointer, whose deleter runs when this is dropped.
///
/// The data itself is borrowed, not copied. Non-contiguous strided views are accepted
/// ([`is_c_contiguous`](Self::is_c_contiguous) is then false and callers read element-wise);
/// negative and overlapping strides are refused, by memarray-core's one layout check (the
/// tensor is a [`ForeignTensor`] inside, which [`into_foreign`](Self::into_foreign) hands
/// to memarray-cuda's import).
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
    /// The description memarray-cuda imports, owning the managed pointer.
    tensor: ForeignTensor,
    device: Device,
    byte_offset: u64,
    is_copied: bool,
    version: Option<(u32, u32)>,
}

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
        let mut readable = layout::Readable::default();
        check_struct_readable(
            &mut readable,
            p.as_ptr() as u64,
            size_of::<DLManagedTensor>(),
        )?;
        let owned = Owned::Unversioned(p);
        // SAFETY: `p` is valid for reads (item 1); `DLTensor` is `Copy`.
        let dl = unsafe { (*p.as_ptr()).dl_tensor };
        // SAFETY: `dl` is the valid tensor of item 1.
        unsafe { Self::from_parts(owned, &dl, 0, None, Some(&mut readable)) }
    }

    /// Takes over a `DLManagedTensorVersioned` (a `"dltensor_versioned"` capsule's pointer).
    /// A major version other than 1 is refused after reading only `version` and `deleter`;
    /// a newer minor version is accepted.
    ///
    /// # Errors
    /// [`DlpackError::UnsupportedVersion`], [`DlpackError::UnknownDeviceType`],
    /// [`DlpackError::NegativeDeviceId`], [`DlpackError::VectorLanes`],
    /// [`DlpackError::UnsupportedDType`], [`DlpackError::BadNdim`], [`DlpackError::NullShape`],
    /// [`DlpackError::NegativeShape`], `Core(ShapeOverflow)`, `Core(Layout(..))` for the
    /// strides, a null or misaligned pointer or a span past the address space
    /// ([`memarray_core::LayoutError`]), [`DlpackError::Unmapped`]. The deleter has then
    /// already been called, exactly once.
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
    /// strides and host data are readable (up to four probes, most of an import's
    /// cost), for tensors from a producer the caller knows (NumPy's exact `ndarray`):
    /// every other check runs.
    ///
    /// # Safety
    /// As [`ImportedTensor::from_versioned`], and every pointer in the tensor (and its host
    /// data, for `data + byte_offset` over the layout's span) is readable.
    pub unsafe fn from_versioned_trusted(
        p: NonNull<DLManagedTensorVersioned>,
    ) -> Result<Self, DlpackError> {
        // SAFETY: the caller's contract.
        unsafe { Self::versioned(p, false) }
    }

    /// # Safety
    /// As [`ImportedTensor::from_versioned`]; with `!check_readable`, as
    /// [`ImportedTensor::from_versioned_trusted`].
    unsafe fn versioned(
        p: NonNull<DLManagedTensorVersioned>,
        check_readable: bool,
    ) -> Result<Self, DlpackError> {
        let mut readable = layout::Readable::default();
        if check_readable {
            check_struct_readable(
                &mut readable,
                p.as_ptr() as u64,
                size_of::<DLManagedTensorVersioned>(),
            )?;
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
        let readable = check_readable.then_some(&mut readable);
        // SAFETY: `dl` is the valid tensor of item 1.
        unsafe { Self::from_parts(owned, &dl, flags, version, readable) }
    }

    /// Validates `dl` and copies its fields. The shape and strides arrays must be readable
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
        mut readable: Option<&mut layout::Readable>,
    ) -> Result<Self, DlpackError> {
        let device = Device::from_dl(dl.device)?;
        let mut unreadable =
            |address: u64, len: u64| readable.as_mut().is_some_and(|r| !r.check(address, len));
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
        } else if unreadable(dl.shape as u64, (ndim * 8) as u64) {
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
        // Null strides mean C-contiguous before DLPack 1.2; still accepted from old producers.
        let strides = if ndim == 0 {
            Vec::new()
        } else if dl.strides.is_null() {
            shape::c_strides(&shape)
        } else if unreadable(dl.strides as u64, (ndim * 8) as u64) {
            return Err(DlpackError::Unmapped {
                address: dl.strides as u64,
                span: (ndim * 8) as u64,
            });
        } else {
            // SAFETY: non-null with `ndim` readable entries (item 1).
            unsafe { slice::from_raw_parts(dl.strides, ndim) }.to_vec()
        };
        let place = match device.kind {
            DeviceType::Cpu => Place::Host,
            DeviceType::CudaHost => Place::Pinned,
            DeviceType::CudaManaged => Place::Managed,
            // `Device::from_dl` refused a negative id.
            DeviceType::Cuda => Place::Device(device.id as u32),
        };
        let read_only = flags & DLPACK_FLAG_BITMASK_READ_ONLY != 0;
        // The one layout check (memarray-core's); on error the owner drops, calling the
        // deleter.
        // SAFETY: the producer describes its own memory, live until the deleter runs,
        // which `owned` (the tensor's owner) does when dropped.
        let tensor = unsafe {
            ForeignTensor::new(
                place,
                dl.data as u64,
                dl.byte_offset,
                dtype,
                shape,
                strides,
                read_only,
                Box::new(owned),
            )
        }?;
        // Host-accessible memory must be readable here: a forged pointer or stride would
        // otherwise fault on the first read. Device memory is checked
        // by the CUDA layer, which can ask the driver.
        if !matches!(place, Place::Device(_)) && !tensor.is_empty() {
            let (address, span) = (tensor.data(), tensor.span_bytes() as u64);
            if unreadable(address, span) {
                return Err(DlpackError::Unmapped { address, span });
            }
        }
        Ok(ImportedTensor {
            tensor,
            device,
            byte_offset: dl.byte_offset,
            is_copied: flags & DLPACK_FLAG_BITMASK_IS_COPIED != 0,
            version,
        })
    }

    /// Address of the first element: the producer's `data + byte_offset`. A host or device
    /// address depending on [`device`](Self::device); null only for an empty tensor.
    pub fn data(&self) -> *mut c_void {
        self.tensor.data() as *mut c_void
    }

    /// Where the data lives.
    pub fn device(&self) -> Device {
        self.device
    }

    /// The element type.
    pub fn dtype(&self) -> DType {
        self.tensor.dtype()
    }

    /// Extents.
    pub fn shape(&self) -> &[usize] {
        self.tensor.shape()
    }

    /// Number of dimensions.
    pub fn ndim(&self) -> usize {
        self.tensor.shape().len()
    }

    /// Strides in elements, one per dimension: the producer's, or C-contiguous ones when it
    /// passed null.
    pub fn strides(&self) -> &[i64] {
        self.tensor.strides()
    }

    /// Whether the elements are dense in C order (extent-1 strides and empty tensors aside).
    pub fn is_c_contiguous(&self) -> bool {
        self.tensor.is_c_contiguous()
    }

    /// The versioned read-only flag; false for unversioned tensors.
    pub fn read_only(&self) -> bool {
        self.tensor.read_only()
    }

    /// The versioned is-copied flag; false for unversioned tensors.
    pub fn is_copied(&self) -> bool {
        self.is_copied
    }

    /// Number of elements.
    pub fn len(&self) -> usize {
        self.tensor.shape().iter().product()
    }

    /// Whether the tensor has no elements (some extent is 0).
    pub fn is_empty(&self) -> bool {
        self.tensor.is_empty()
    }

    /// Bytes of the elements: `len() * dtype().size()` (checked at import).
    pub fn nbytes(&self) -> usize {
        self.tensor.nbytes()
    }

    /// Bytes from the first element to the end of the last one; equals
    /// [`nbytes`](Self::nbytes) for contiguous tensors, more for strided views.
    pub fn span_bytes(&self) -> usize {
        self.tensor.span_bytes()
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
        self.version.is_some()
    }

    /// The tensor as memarray-cuda imports it (`RawArray::import`); the producer's deleter
    /// runs when it, or the array sharing its memory, drops.
    pub fn into_foreign(self) -> ForeignTensor {
        self.tensor
    }
}

impl From<ImportedTensor> for ForeignTensor {
    fn from(t: ImportedTensor) -> Self {
        t.into_foreign()
    }
}

/// Refuses a managed-tensor pointer whose struct cannot be read here (a forged capsule):
/// the struct cannot be read, so its deleter cannot be called either, and the tensor is
/// left alone.
fn check_struct_readable(
    readable: &mut layout::Readable,
    address: u64,
    size: usize,
) -> Result<(), DlpackError> {
    if readable.check(address, size as u64) {
        Ok(())
    } else {
        Err(DlpackError::Unmapped {
            address,
            span: size as u64,
        })
    }
}
