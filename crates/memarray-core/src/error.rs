//! The core error type.

use thiserror::Error;

/// Everything memarray-core can refuse. Each variant names the numbers involved.
#[derive(Debug, Error, Clone, PartialEq, Eq)]
#[non_exhaustive]
pub enum CoreError {
    /// The product of the dimensions (or its size in bytes) does not fit in 64 bits.
    #[error("shape {shape:?} overflows: its element count or byte size does not fit in 64 bits")]
    ShapeOverflow {
        /// The offending shape.
        shape: Vec<usize>,
    },
    /// An index lies outside the shape.
    #[error("index {index:?} is out of bounds for shape {shape:?}")]
    OutOfBounds {
        /// The requested index (one entry per dimension, or a single linear index).
        index: Vec<u64>,
        /// The array's shape.
        shape: Vec<usize>,
    },
    /// An index or shape has the wrong number of dimensions.
    #[error("expected {expected} dimensions, got {got}")]
    WrongNdim {
        /// Dimensions the array has.
        expected: usize,
        /// Dimensions given.
        got: usize,
    },
    /// Two shapes that must agree do not.
    #[error("shape mismatch: expected {expected:?}, got {got:?}")]
    ShapeMismatch {
        /// The array's shape.
        expected: Vec<usize>,
        /// The shape given.
        got: Vec<usize>,
    },
    /// More dimensions than memarray supports.
    #[error("ndim {ndim} exceeds the maximum of {max}")]
    TooManyDims {
        /// Dimensions given.
        ndim: usize,
        /// [`crate::MAX_NDIM`].
        max: usize,
    },
    /// The array is locked by another holder.
    #[error("array is locked by lock {held}; {}", match .requested {
        Some(r) => format!("the operation presented lock {r}, which does not hold it"),
        None => "the operation presented no lock token".to_string(),
    })]
    Locked {
        /// The id of the token that holds the lock.
        held: u64,
        /// The id the caller presented, if any.
        requested: Option<u64>,
    },
    /// An unlock or a token check for an array that is not locked.
    #[error("array is not locked; lock {requested} does not hold it")]
    NotLocked {
        /// The id the caller presented.
        requested: u64,
    },
    /// A dtype memarray does not store.
    #[error(
        "unsupported {what}; supported dtypes: {}",
        crate::DType::supported_names()
    )]
    UnsupportedDType {
        /// What was asked for, in words.
        what: String,
    },
    /// A dtype does not match the element type asked for.
    #[error("dtype mismatch: the array holds {held}, the caller asked for {requested}")]
    DTypeMismatch {
        /// The array's dtype.
        held: crate::DType,
        /// The dtype asked for.
        requested: crate::DType,
    },
    /// A memory resource could not allocate.
    #[error("allocation of {bytes} bytes (alignment {align}) from {resource} failed: {reason}")]
    Alloc {
        /// Bytes requested.
        bytes: usize,
        /// Alignment requested.
        align: usize,
        /// The resource's name.
        resource: String,
        /// Why, in words.
        reason: String,
    },
    /// A resource has no memory left for the request (the device is full, or a limiting
    /// adaptor's byte limit would be passed). A retry adaptor releases cached blocks and
    /// tries once more on this error, and only on this one.
    #[error("out of memory: {bytes} bytes from {resource}: {reason}")]
    OutOfMemory {
        /// Bytes requested.
        bytes: usize,
        /// The resource's name.
        resource: String,
        /// Why, in words (the limit, the free bytes, the driver's message).
        reason: String,
    },
    /// An alignment that is not a power of two, or too large.
    #[error("invalid alignment {align}: must be a power of two no larger than {max}")]
    BadAlignment {
        /// Alignment requested.
        align: usize,
        /// The largest alignment the resource serves.
        max: usize,
    },
    /// Memory at an address that is not aligned for its element type.
    #[error("address {addr:#x} is not aligned to the {align} bytes its elements need")]
    Misaligned {
        /// The address.
        addr: usize,
        /// The element alignment required.
        align: usize,
    },
    /// A copy between buffers whose ranges do not fit.
    #[error("copy of {len} bytes at offset {offset} overruns a buffer of {capacity} bytes")]
    CopyOutOfRange {
        /// Byte offset of the range.
        offset: usize,
        /// Bytes to copy.
        len: usize,
        /// The buffer's size.
        capacity: usize,
    },
    /// A `.npy` file memarray cannot read: a bad header, a dtype or order it does not
    /// hold, or less data than the header describes.
    #[error("cannot read {path} as .npy: {reason}")]
    BadNpy {
        /// The file.
        path: String,
        /// What is wrong, and the fix where there is one.
        reason: String,
    },
    /// A file another memarray user holds (its advisory lock is taken).
    #[error(
        "{path} is in use by another memarray File resource or file operation (its lock is \
         held): refused rather than truncating or sharing pages another mapping uses"
    )]
    FileInUse {
        /// The file.
        path: String,
    },
    /// A resource that cannot serve at all here: its driver or device is unusable in this
    /// process (no driver, or a process forked after its parent started CUDA). Nothing
    /// ran out of memory.
    #[error("{resource} cannot allocate: {reason}")]
    Unavailable {
        /// The resource's name.
        resource: String,
        /// Why, in words (with the fix where there is one).
        reason: String,
    },
    /// A source name that is not registered ([`Source`](crate::resource::Source)), or one
    /// that cannot be.
    #[error("unknown source {name:?}: allocations are attributed to {known}")]
    UnknownSource {
        /// The name given (at most 80 characters of it).
        name: String,
        /// The registered names (or why no more can be).
        known: String,
    },
    /// A safetensors file memarray cannot read: a header that breaks the format's rules
    /// (see [`safetensors`](crate::safetensors)), a tensor of a dtype memarray does not
    /// hold, a name it does not have.
    #[error("cannot read {path} as safetensors: {reason}")]
    BadSafetensors {
        /// The file.
        path: String,
        /// What is wrong.
        reason: String,
    },
    /// A pool that cannot offload or restore now: not one growing in place, already
    /// offloaded (or not), memory a graph holds.
    #[error("{resource} cannot {what}: {reason}")]
    Offload {
        /// The pool's name.
        resource: String,
        /// "offload" or "restore".
        what: &'static str,
        /// Why not.
        reason: String,
    },
    /// A library budget that cannot be set
    /// ([`set_budget`](crate::resource::ledger::set_budget)).
    #[error("budget on {place}: {reason}")]
    BadBudget {
        /// Where it was to apply.
        place: String,
        /// Why not.
        reason: String,
    },
    /// An I/O error from a file-backed resource.
    #[error("I/O error on {path}: {reason}")]
    Io {
        /// The file.
        path: String,
        /// The operating system's message.
        reason: String,
        /// The operating system's error number, when it gave one (`ENOENT` for a missing
        /// file: Python raises `FileNotFoundError` from it).
        errno: Option<i32>,
    },
    /// A strided layout that is not one memarray can address: negative or overlapping
    /// strides, a null or misaligned pointer, a span past the address space.
    #[error(transparent)]
    Layout(#[from] LayoutError),
}

impl CoreError {
    /// [`CoreError::Io`] for `path` from the operating system's error `e`.
    pub fn io(path: &std::path::Path, e: &std::io::Error) -> Self {
        CoreError::Io {
            path: path.display().to_string(),
            reason: e.to_string(),
            errno: e.raw_os_error(),
        }
    }

    /// Whether this is the out-of-memory error ([`CoreError::OutOfMemory`]), which the
    /// CUDA layer recognises too (`CudaError::is_out_of_memory`).
    pub fn is_out_of_memory(&self) -> bool {
        matches!(self, CoreError::OutOfMemory { .. })
    }

    /// What kind of failure this is, for the language boundaries.
    pub fn kind(&self) -> ErrorKind {
        match self {
            CoreError::OutOfBounds { .. } | CoreError::WrongNdim { .. } => ErrorKind::OutOfRange,
            CoreError::Locked { .. } | CoreError::NotLocked { .. } => ErrorKind::Locked,
            CoreError::UnsupportedDType { .. } | CoreError::DTypeMismatch { .. } => {
                ErrorKind::Dtype
            }
            CoreError::Alloc { .. } | CoreError::OutOfMemory { .. } => ErrorKind::OutOfMemory,
            CoreError::Unavailable { .. } => ErrorKind::Unavailable,
            CoreError::Io { .. } | CoreError::FileInUse { .. } => ErrorKind::Io,
            CoreError::ShapeOverflow { .. }
            | CoreError::ShapeMismatch { .. }
            | CoreError::TooManyDims { .. }
            | CoreError::BadAlignment { .. }
            | CoreError::Misaligned { .. }
            | CoreError::CopyOutOfRange { .. }
            | CoreError::BadNpy { .. }
            | CoreError::BadSafetensors { .. }
            | CoreError::UnknownSource { .. }
            | CoreError::BadBudget { .. }
            | CoreError::Offload { .. }
            | CoreError::Layout(_) => ErrorKind::InvalidArgument,
        }
    }
}

/// The one classification of memarray's errors that the language boundaries map from
/// (each error type that crosses one has a `kind()`): Python picks its exception class
/// from it, C its status code. The bindings keep a few finer spellings of their own (a
/// Python `BufferError` that says how to get host data, `OSError` with the errno).
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
#[non_exhaustive]
pub enum ErrorKind {
    /// An index or a number of dimensions out of range (Python `IndexError`).
    OutOfRange,
    /// The caller's argument is wrong: a shape, size, setting, device or malformed
    /// tensor (`ValueError`; C `INVALID_ARGUMENT`).
    InvalidArgument,
    /// A dtype memarray does not store, or not the one asked for (`TypeError`;
    /// `WRONG_DTYPE`).
    Dtype,
    /// The array is locked by another holder (`memarray.LockError`; `LOCKED`).
    Locked,
    /// The data is not where the call needs it (`WRONG_LOCATION`).
    WrongLocation,
    /// Out of memory, after the relief steps (`MemoryError`; `OUT_OF_MEMORY`).
    OutOfMemory,
    /// No usable CUDA driver, device or library (`memarray.CudaUnavailableError`;
    /// `CUDA_UNAVAILABLE`).
    Unavailable,
    /// The CUDA driver refused a call (`RuntimeError`; `CUDA`).
    Driver,
    /// A file or the operating system failed (`OSError`; `FAILED`).
    Io,
    /// Anything else that failed (`RuntimeError`; `FAILED`).
    Failed,
}

/// Why a strided layout (a foreign tensor's, or one memarray exports) was refused: the
/// checks of [`crate::layout::check`], one variant per rule, each naming the numbers and
/// the fix.
#[derive(Debug, Error, Clone, PartialEq, Eq)]
#[non_exhaustive]
pub enum LayoutError {
    /// `strides` has a different length from `shape`.
    #[error("{strides} strides given for a shape of ndim {ndim}; pass one stride per dimension")]
    StridesLength {
        /// Dimensions of the shape.
        ndim: usize,
        /// Strides given.
        strides: usize,
    },
    /// A negative stride on a dimension of extent above 1.
    #[error(
        "stride {stride} in dimension {dim} (strides {strides:?}, shape {shape:?}) is negative; \
         memarray views need non-negative strides: copy the array (e.g. np.ascontiguousarray) \
         before exchanging it"
    )]
    NegativeStride {
        /// The dimension.
        dim: usize,
        /// Its stride, in elements.
        stride: i64,
        /// All strides, in elements.
        strides: Vec<i64>,
        /// The shape.
        shape: Vec<usize>,
    },
    /// Strides under which two indices may address the same element (including stride 0,
    /// as broadcasting produces).
    #[error(
        "strides {strides:?} with shape {shape:?} let different indices address the same \
         element (overlapping or broadcast view); copy the array before exchanging it"
    )]
    OverlappingStrides {
        /// Strides, in elements.
        strides: Vec<i64>,
        /// The shape.
        shape: Vec<usize>,
    },
    /// The memory span the strides reach, or the end address, does not fit in 64 bits.
    #[error(
        "strides {strides:?} with shape {shape:?} and element size {itemsize} reach past \
         the 64-bit address space from address {address:#x}"
    )]
    SpanOverflow {
        /// Strides, in elements.
        strides: Vec<i64>,
        /// The shape.
        shape: Vec<usize>,
        /// Element size in bytes.
        itemsize: usize,
        /// `data + byte_offset`, or `data` if that sum overflows.
        address: u64,
    },
    /// The tensor reaches past the end of any process's address space.
    #[error(
        "the tensor spans {span} bytes from address {address:#x}, past {limit:#x}, where no \
         process maps memory: the data pointer, byte_offset or strides are not real"
    )]
    OutsideAddressSpace {
        /// `data + byte_offset`.
        address: u64,
        /// Bytes from the first element to the end of the last.
        span: u64,
        /// The end of user space ([`crate::layout::ADDRESS_LIMIT`]).
        limit: u64,
    },
    /// A null data pointer for a tensor that has elements.
    #[error(
        "data pointer is null but shape {shape:?} has elements; only empty tensors may be null"
    )]
    NullData {
        /// The shape.
        shape: Vec<usize>,
    },
    /// `data + byte_offset` is not aligned for the element type.
    #[error(
        "data address {data:#x} + byte_offset {byte_offset} = {address:#x} is not a multiple of \
         {align}, the alignment of {dtype}; the producer must pass an element-aligned offset"
    )]
    Misaligned {
        /// The data pointer.
        data: u64,
        /// The byte offset.
        byte_offset: u64,
        /// Their sum (wrapping).
        address: u64,
        /// The element type.
        dtype: crate::DType,
        /// Its alignment in bytes.
        align: usize,
    },
}

/// Result alias for core operations.
pub type Result<T, E = CoreError> = std::result::Result<T, E>;
