//! The MemArray mirror: one host buffer, at most one device buffer, and the location of
//! the current data (docs/architecture.md, "The mirror").
//!
//! [`RawArray`] is type-erased (any [`memarray_core::DType`], ndim 0..=32) and serves
//! Python; [`MemArray<T, N>`] is the typed Rust face over it; [`SharedArray`] shares a
//! `RawArray` between threads (every method on `&self`, calls serialised).

mod batch;
mod born;
mod device_side;
mod export;
mod external;
mod host_access;
mod host_kind;
mod import;
mod ipc;
mod moves;
mod multi;
mod npy;
mod packed;
mod raw;
mod safetensors;
mod shared;
mod spill_side;
mod typed;

pub use crate::copy::{BatchProfile, PACK_ALIGN, last_batch_profile, pack_layout};
pub use batch::BATCH_BELOW;
pub use born::Fill;
pub use device_side::Consumer;
pub use host_kind::{AUTO_PIN_BYTES, HostKind};
pub use import::CopyPolicy;
pub use memarray_core::foreign::ExportBuffer;
pub use multi::split_rows;
pub use packed::Packed;
pub use raw::RawArray;
pub use safetensors::SafetensorsWriter;
pub use shared::{SharedArray, StateGuard};
pub use typed::MemArray;
