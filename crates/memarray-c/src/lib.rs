//! memarray's C ABI: `libmemarray.so` / `libmemarray.a` with `include/memarray.h`
//! (generated from this crate by cbindgen; `tests/header.rs` fails when it is stale) and
//! `include/memarray.hpp`, RAII C++ over it.
//!
//! # memarray's crates
//! This crate's page may be the first `cargo doc` opens; the others are:
//! - [`memarray_core`]: dtypes, shapes, `Indexer`, locks, host memory, the `MemoryResource`
//!   trait (no CUDA, no Python);
//! - [`memarray_cuda`]: devices, streams, events, CUDA memory resources, `MemArray<T, N>`,
//!   your own kernels, NCCL (feature `nccl`), spilling;
//! - [`memarray_dlpack`]: DLPack managed tensors, export and import;
//! - `memarray_c` (this crate, library name `memarray`): the C ABI over all three.
//!
//! # The model (umem's, <https://github.com/xnd-project/umem>)
//! Every entry point returns a [`memarray_status`]: `MEMARRAY_STATUS_OK` or an error
//! code, with a message for this thread from [`memarray_last_error`]. Nothing unwinds
//! across the boundary: each entry point runs under `catch_unwind` and a panic is
//! `MEMARRAY_STATUS_INTERNAL` with its message. Pointers and sizes are checked before
//! use: a null handle or out-pointer is `MEMARRAY_STATUS_INVALID_ARGUMENT` naming the
//! parameter. Results come back through out-pointers, written only on success.
//!
//! # Ownership
//! Every object a `*_new` / `*_create` / `*_load` / `*_begin` function returns is the
//! caller's and is released by its `*_free` (or `*_end`) function, which takes NULL as a
//! no-op. Arrays, resources and modules are reference-counted inside: an access or a
//! function keeps what it uses alive, so freeing in any order is safe. A DLPack tensor
//! from [`memarray_array_to_dlpack`] is the caller's until its deleter runs; one given to
//! [`memarray_array_from_dlpack`] becomes memarray's (its deleter runs on success and on
//! failure). Strings returned by memarray stay valid until the next call on the same
//! thread.
//!
//! # Threads
//! Handles may be used from any thread; calls on one array are serialised by the array.

#![allow(non_camel_case_types)]

mod access;
mod array;
mod device;
mod dlpack;
mod error;
mod graph;
mod handle;
mod kernel;
mod resource;
mod stream;

pub use access::*;
pub use array::*;
pub use dlpack::*;
pub use error::{memarray_last_error, memarray_status};
pub use kernel::*;
pub use resource::*;
pub use stream::*;

/// The most dimensions an array has (memarray-core's `MAX_NDIM`).
pub const MEMARRAY_MAX_NDIM: usize = 32;
const _: () = assert!(MEMARRAY_MAX_NDIM == memarray_core::MAX_NDIM);

/// Where an array's data goes: the host, or a CUDA device by its ordinal.
pub const MEMARRAY_HOST: i32 = -1;

/// The library's version as `major * 10000 + minor * 100 + patch`.
#[unsafe(no_mangle)]
pub extern "C" fn memarray_version() -> u32 {
    let v = |s: &str| s.parse::<u32>().unwrap_or(0);
    v(env!("CARGO_PKG_VERSION_MAJOR")) * 10000
        + v(env!("CARGO_PKG_VERSION_MINOR")) * 100
        + v(env!("CARGO_PKG_VERSION_PATCH"))
}

/// The number of CUDA devices (0 without a driver: not an error).
#[unsafe(no_mangle)]
pub extern "C" fn memarray_device_count() -> i32 {
    std::panic::catch_unwind(|| memarray_cuda::device_count().map_or(0, |n| n as i32)).unwrap_or(0)
}
