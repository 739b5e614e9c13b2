//! memarray-dlpack: DLPack managed tensors, versioned (1.x) and unversioned, in both
//! directions. No Python and no CUDA calls: a device is a value ([`Device`]). Start with
//! [`export_versioned`] to hand memory to a consumer and [`ImportedTensor`] to take a
//! producer's tensor (the example on [`ImportedTensor`] does both).
//!
//! **Export** ([`export_versioned`], [`export_unversioned`]) builds a managed tensor from an
//! [`ExportSpec`] and an owner (any `Box<dyn Any + Send>`, typically a shared reference to
//! the buffer), which stays alive until the deleter runs. Strides are always explicit, also
//! for ndim 0 (a valid pointer to zero entries). Versioned exports are version 1.3 and carry
//! the read-only and is-copied flags. Deleters are idempotent, run on any thread and never
//! touch Python; the structs come from a recycling pool with a FIFO quarantine
//! ([`pool`], [`pool_stats`]) so that a repeated deleter call is harmless and memory stays
//! bounded.
//!
//! **Import** ([`ImportedTensor::from_versioned`], [`ImportedTensor::from_unversioned`])
//! takes ownership of a foreign managed tensor, validates every field, copies shape and
//! strides, and calls the producer's deleter exactly once: on drop, or at once when
//! validation fails.
//!
//! **Checks**, on export and import alike: device type (CPU, CUDA, CUDAHost, CUDAManaged) and
//! a non-negative id; dtype (the fifteen [`DType`]s, lanes 1); ndim 0 to [`MAX_NDIM`];
//! non-negative extents whose element count and byte size fit; and the layout, by
//! memarray-core's one check ([`memarray_core::layout::check`], which the CUDA Array
//! Interface's tensors pass too): strides non-negative and non-overlapping (non-contiguous
//! views are fine); data non-null unless empty; `data + byte_offset` element-aligned; the
//! reachable span within 64 bits. On import also the major version (1). An import is a
//! [`memarray_core::ForeignTensor`] inside ([`ImportedTensor::into_foreign`]), the
//! description memarray-cuda's one import takes.
//!
//! **Left to the caller**: that device memory really is as large as described (host memory
//! is checked to be readable, and no tensor may reach past the end of user space), and that
//! it outlives the export (the owner's job); stream synchronisation; capsules and the GIL;
//! element-wise copies of non-contiguous imports.
//!
//! **Errors**: [`DlpackError`], one variant per refused field, with the numbers and the fix;
//! core errors (the layout's included) arrive as [`DlpackError::Core`].
#![warn(missing_docs)]
#![deny(unsafe_op_in_unsafe_fn)]

pub mod device;
pub mod error;
pub mod export;
pub mod import;
mod layout;
pub mod pool;

pub use device::{Device, DeviceType};
pub use error::DlpackError;
pub use export::{
    ExportSpec, call_deleter_unversioned, call_deleter_versioned, export_unversioned,
    export_versioned,
};
pub use import::ImportedTensor;
pub use memarray_core::layout::ADDRESS_LIMIT;
pub use pool::{PoolStats, SlotStats, pool_stats};

/// The FFI structs, re-exported so callers need no direct `dlpack-rs` dependency.
pub use dlpack_rs::ffi;
pub use memarray_core::{CoreError, DType, LayoutError, MAX_NDIM};
