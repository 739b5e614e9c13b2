//! The DLPack error type.

use memarray_core::{CoreError, DType, ErrorKind, LayoutError};
use thiserror::Error;

/// Everything memarray-dlpack refuses, on export or import. Each variant names the numbers
/// involved and what to change. The Python layer maps all of them to `BufferError`, except
/// [`DlpackError::Core`], which keeps the mapping of the wrapped [`CoreError`]. A strided
/// layout memarray cannot address (negative or overlapping strides, a null or misaligned
/// pointer, a span past the address space) is `Core(Layout(..))`: the one layout check,
/// in memarray-core, that the CUDA Array Interface's tensors pass too.
#[derive(Debug, Error, Clone, PartialEq, Eq)]
#[non_exhaustive]
pub enum DlpackError {
    /// An error from memarray-core (shape overflow, too many dimensions, ...).
    #[error(transparent)]
    Core(#[from] CoreError),

    /// A versioned tensor whose major version this crate cannot read. Only its deleter was
    /// touched (DLPack keeps `version`, `manager_ctx` and `deleter` ABI-stable).
    #[error(
        "DLPack version {major}.{minor} is not supported: this consumer reads major version \
         {supported_major}; ask the producer for a version {supported_major}.x tensor \
         (max_version=({supported_major}, {supported_minor}))"
    )]
    UnsupportedVersion {
        /// Major version the producer wrote.
        major: u32,
        /// Minor version the producer wrote.
        minor: u32,
        /// The major version this crate reads.
        supported_major: u32,
        /// The newest minor version this crate knows.
        supported_minor: u32,
    },

    /// A `DLDeviceType` code outside CPU (1), CUDA (2), CUDAHost (3) and CUDAManaged (13).
    #[error(
        "DLPack device type {code} is not supported: memarray holds kDLCPU (1), kDLCUDA (2), \
         kDLCUDAHost (3) and kDLCUDAManaged (13); copy the data to the CPU or a CUDA device first"
    )]
    UnknownDeviceType {
        /// The device type code.
        code: u32,
    },

    /// A negative device ordinal.
    #[error("device id {id} for device type {code} is negative; device ids count from 0")]
    NegativeDeviceId {
        /// The device type code.
        code: u32,
        /// The device id.
        id: i32,
    },

    /// A dtype memarray does not store (fp8, sub-byte floats, opaque handles, ...).
    #[error(
        "DLPack dtype (code {code}, bits {bits}, lanes {lanes}) is not supported; \
         supported dtypes: {}; cast to one of them before exporting",
        DType::supported_names()
    )]
    UnsupportedDType {
        /// `DLDataType::code`.
        code: u8,
        /// `DLDataType::bits`.
        bits: u8,
        /// `DLDataType::lanes`.
        lanes: u16,
    },

    /// A vector dtype (`lanes != 1`).
    #[error(
        "DLPack dtype (code {code}, bits {bits}) has {lanes} lanes; memarray stores scalar \
         elements only (lanes 1): reshape the vector dimension into the shape instead"
    )]
    VectorLanes {
        /// `DLDataType::code`.
        code: u8,
        /// `DLDataType::bits`.
        bits: u8,
        /// `DLDataType::lanes`.
        lanes: u16,
    },

    /// `ndim` negative or above [`memarray_core::MAX_NDIM`].
    #[error("ndim {ndim} is out of range: memarray supports 0 to {max} dimensions")]
    BadNdim {
        /// The `ndim` field as the producer wrote it.
        ndim: i64,
        /// [`memarray_core::MAX_NDIM`].
        max: usize,
    },

    /// `shape` is null although `ndim > 0`.
    #[error("shape pointer is null but ndim is {ndim}; a producer must pass ndim extents")]
    NullShape {
        /// The number of dimensions.
        ndim: usize,
    },

    /// A negative extent.
    #[error(
        "shape {shape:?} has negative extent {extent} in dimension {dim}; extents must be >= 0"
    )]
    NegativeShape {
        /// The dimension.
        dim: usize,
        /// Its extent.
        extent: i64,
        /// The whole shape.
        shape: Vec<i64>,
    },

    /// Host memory the tensor (its struct, shape, strides or data) claims that this process
    /// cannot read: not mapped, or mapped without read access (a guard page).
    #[error(
        "the host tensor's {span} bytes from address {address:#x} are not all readable by this \
         process: the struct, shape, strides, data pointer or byte_offset are not real"
    )]
    Unmapped {
        /// `data + byte_offset`.
        address: u64,
        /// Bytes from the first element to the end of the last.
        span: u64,
    },

    /// A read-only export requested as an unversioned tensor, which cannot carry the flag.
    #[error(
        "a read-only array cannot be exported as an unversioned DLPack tensor (it has no \
         read-only flag); request a versioned one (max_version >= (1, 0)) or export a copy"
    )]
    ReadOnlyUnversioned,
}

impl DlpackError {
    /// What kind of failure this is: a dtype memarray does not store, the wrapped core
    /// error's kind, or a malformed or unusable tensor (the caller's argument).
    pub fn kind(&self) -> ErrorKind {
        match self {
            DlpackError::Core(c) => c.kind(),
            DlpackError::UnsupportedDType { .. } | DlpackError::VectorLanes { .. } => {
                ErrorKind::Dtype
            }
            _ => ErrorKind::InvalidArgument,
        }
    }
}

impl From<LayoutError> for DlpackError {
    /// A layout refused by memarray-core's one check, as `Core(Layout(..))`.
    fn from(e: LayoutError) -> Self {
        DlpackError::Core(CoreError::Layout(e))
    }
}
