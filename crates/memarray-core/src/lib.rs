//! memarray-core: the parts of memarray that need neither CUDA nor Python.
//!
//! **Most users start in [memarray-cuda](../memarray_cuda/index.html)** (`MemArray`, the
//! crate `cargo doc --open` would best open: it opens this one, the first by name), which
//! uses these types; start here to write a memory resource, or to work with shapes, dtypes and `.npy` headers without a GPU:
//!
//! ```
//! use std::sync::Arc;
//! use memarray_core::{DType, HostResource, MemoryResource, StatisticsAdaptor, shape};
//!
//! assert_eq!(shape::checked_nbytes(&[2, 3], DType::F32.size())?, 24);
//! assert!(shape::checked_nbytes(&[usize::MAX, 2], 1).is_err()); // overflow is an error
//! let stats = StatisticsAdaptor::new(Arc::new(HostResource));
//! let p = stats.allocate(1024, 64, None)?;
//! // SAFETY: p came from `stats` with these arguments and is freed once.
//! unsafe { stats.deallocate(p, 1024, 64, None) };
//! assert_eq!(stats.statistics().peak_bytes, 1024);
//! # Ok::<(), memarray_core::CoreError>(())
//! ```
//!
//! - [`DType`] and [`Element`]: the fifteen element types (bool, i8..i64, u8..u64, f16,
//!   bf16, f32, f64, complex64, complex128) with their DLPack codes and NumPy typestrs.
//! - [`shape`]: checked element counts (overflow is an error), C-contiguous strides and
//!   64-bit offsets; ndim up to [`MAX_NDIM`].
//! - [`Indexer`]: a `#[repr(C)]` data pointer plus shape, mirrored in CUDA C.
//! - [`Lock`] and [`LockToken`]: unique, never-reused tokens for outside observers.
//! - [`MemoryResource`] and [`HostResource`]; [`HostBuffer`], an owned aligned allocation.
//!
//! Everything here checks its inputs and returns [`CoreError`]; nothing panics on bad input.
//! Higher layers (memarray-cuda, memarray-dlpack) add devices and interchange formats.
#![warn(missing_docs)]
#![deny(unsafe_op_in_unsafe_fn)]

pub mod dtype;
mod dtype_lookup;
pub mod env;
pub mod error;
pub mod foreign;
pub mod fork;
pub mod host;
pub mod indexer;
pub mod layout;
pub mod lock;
pub mod npy;
pub mod resource;
pub mod safetensors;
pub mod shape;
pub mod spill;

pub use dtype::{DType, Element};
pub use error::{CoreError, ErrorKind, LayoutError, Result};
pub use foreign::{ForeignTensor, Place};
pub use host::HostBuffer;
pub use indexer::{Indexer, indexer_bytes};
pub use lock::{Lock, LockGuard, LockToken};
pub use resource::{
    FileMode, FileResource, ForeignMemory, GrowableRange, HostRange, HostResource, LimitingAdaptor,
    Location, LoggingAdaptor, MemoryInfo, MemoryKind, MemoryResource, RawStream, RetryAdaptor,
    Source, Statistics, StatisticsAdaptor, TrackingAdaptor, open_regular,
};
pub use shape::MAX_NDIM;

/// Re-exported element types for users of f16, bf16 and complex arrays.
pub use half::{bf16, f16};
pub use num_complex::{Complex32, Complex64};
