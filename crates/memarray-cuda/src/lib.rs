//! memarray-cuda: typed N-d arrays mirrored between the host and CUDA devices, on the
//! driver API through `cudarc`.
//!
//! **Start with [`MemArray`]** (typed, `MemArray<T, N>`) or [`RawArray`] (dtype and ndim
//! chosen at run time): an array whose data lives on the host, on a device, or both, moved
//! with [`MemArray::move_memory`] on streams ordered by events, locked while an outside
//! observer holds it. Everything below is what it is built from, for finer control.
//!
//! ```
//! use memarray_core::Location;
//! use memarray_cuda::MemArray;
//!
//! let mut a = MemArray::<f32, 2>::from_slice([2, 3], &[0., 1., 2., 3., 4., 5.])?;
//! a.set([1, 2], 50.0)?;
//! if memarray_cuda::is_available() {
//!     a.move_memory(Location::Device(0), None, true, None)?; // copy to cuda:0 and wait
//!     a.move_memory(Location::Host, None, true, None)?;
//! }
//! assert_eq!(a.get([1, 2])?, 50.0);
//! # Ok::<(), memarray_cuda::CudaError>(())
//! ```
//!
//! The building blocks:
//!
//! - [`Device`]: a device and its primary context (shared with the CUDA runtime,
//!   PyTorch, CuPy), cached per ordinal; [`is_available`], [`device_count`].
//! - [`Stream`] (owned) and [`StreamRef`] (borrowed, `Copy`, possibly foreign); [`Event`],
//!   and [`Enqueued`], the `#[must_use]` result of every asynchronous operation.
//! - [`graph`]: CUDA graphs: whether a stream is being captured, a capture scope that
//!   yields a graph, and launching it.
//! - [`DeviceBuffer`]: owned device-accessible memory from a memory resource.
//! - [`resource`]: device, stream-ordered pool, pinned and managed implementations of
//!   memarray-core's [`MemoryResource`](memarray_core::MemoryResource).
//! - [`copy`]: every copy: one bounds-checked copy between any two kinds of memory
//!   ([`copy::copy_to`], umem's `sync_to` / `sync_from`), the one
//!   [`copy::upload`] / [`copy::download`] pair, the driver's direct copies and memsets
//!   ([`copy::copy_htod`] and kin), and pageable host memory at pinned speed (the
//!   staged pipeline behind `upload` / `download`).
//! - [`ipc`]: device memory shared between processes ([`ipc::IpcHandle`]).
//! - `nccl` (feature `nccl`): NCCL collectives on device arrays, libnccl loaded at run time.
//! - [`launch`]: your own kernels (PTX, cubin, fatbin, or CUDA C++ through NVRTC) on
//!   arrays, passed [`Indexer`](memarray_core::Indexer)s by value.
//! - [`nvtx`]: memarray's NVTX ranges and the pools' memory-extension heaps, for Nsight and
//!   compute-sanitizer (beside the driver: loaded at run time, off without a tool).
//!
//! The seed's demo operation, `add_index_tuple`, lives above this crate in
//! `memarray-seed`, a user of the public API like any other.
//!
//! What it checks: byte ranges of every copy, buffer sizes against shapes, device
//! identity of operands, stream handle 0 (refused), alignments. What it leaves to its
//! caller: ordering work across streams (record an [`Event`], make the other stream
//! [`wait`](StreamRef::wait)), and keeping host memory of `_raw` copies alive and
//! untouched until they have run. The MemArray mirror builds that ordering on top.
//!
//! Errors: [`CudaError`]. The driver library is loaded at run time: without an NVIDIA
//! driver or device every entry point returns [`CudaError::Unavailable`] (never a
//! panic), so this crate builds and its CPU tests run anywhere. Raw driver calls live in
//! one private module; no raw `CUdeviceptr`, context or stream handle type escapes
//! (addresses and stream handles are exposed as integers, for DLPack and Python).
#![warn(missing_docs)]
#![deny(unsafe_op_in_unsafe_fn)]

mod driver;

pub mod array;
pub mod buffer;
pub mod copy;
pub mod device;
pub mod env;
pub mod error;
pub mod event;
pub mod graph;
pub mod ipc;
pub mod launch;
mod module;
#[cfg(feature = "nccl")]
pub mod nccl;
pub mod nvtx;
pub mod parked;
mod per_device;
pub mod resource;
pub mod sleep;
pub mod spill;
pub mod stream;

pub use array::{HostKind, MemArray, RawArray, SafetensorsWriter};
pub use buffer::{DEVICE_ALIGN, DeviceBuffer};
pub use device::{
    Device, check_device_span, current_device, current_device_if_started, current_or_default,
    default_device, device_count, device_of_pointer, is_available, set_default_device,
};
pub use error::{ArrayError, CudaError, IpcError, LaunchError, Result, SettingError};
pub use event::{Enqueued, Event};
pub use per_device::PerDevice;
pub use resource::{
    AsyncPoolResource, DeviceResource, ManagedResource, PinnedFlags, PinnedResource,
};
pub use stream::{Stream, StreamRef};

/// Checks every environment variable memarray-cuda reads (`MEMARRAY_NVTX`,
/// `MEMARRAY_MEMORY_RESOURCE`,
/// `MEMARRAY_PINNED_LIMIT`, `MEMARRAY_COPY_KERNEL`, the
/// staging variables, `MEMARRAY_SPILL` and its budgets), so a front end can refuse a bad
/// value when it starts (Python's `import memarray` does) instead of at first use.
///
/// # Errors
/// [`SettingError::Env`] or, for the spill variables, [`SettingError::Invalid`] naming
/// the variable: a value that is not UTF-8 or not understood.
pub fn check_env() -> Result<()> {
    env::switch(crate::nvtx::ENV)?;
    resource::resource_choice_from_env()?;
    resource::pinned_limit_from_env()?;
    copy::kernel_setting_from_env()?;
    copy::kernel_max_from_env()?;
    copy::staging_config(copy::Direction::ToDevice)?;
    spill::env_settings().map_err(|detail| SettingError::Invalid {
        what: "the spill environment",
        detail,
    })?;
    Ok(())
}

/// The `ndarray` version memarray's views are of ([`MemArray::view`]): use it to build
/// arrays for [`MemArray::from_ndarray`] without a version of your own to keep in step.
pub use ndarray;

// The guides' Rust blocks run as doctests: the README's with every build, the
// Rust guide's with the `nccl` feature (one block uses it), as CI runs them. Blocks that
// need a GPU are `no_run`: compiled here, never run (the GPU machine has no Rust).
#[cfg(doctest)]
#[doc = include_str!("../../../README.md")]
pub struct ReadmeDoctests;

#[cfg(all(doctest, feature = "nccl"))]
#[doc = include_str!("../../../docs/rust-guide.md")]
pub struct RustGuideDoctests;
