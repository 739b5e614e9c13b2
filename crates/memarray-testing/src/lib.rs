//! memarray-testing: what memarray's own tests share, and nothing a user needs (not
//! published; a dev-dependency only).
//!
//! - [`conformance`]: one suite every `MemoryResource` must pass (core's resources are
//!   checked in this crate's tests, CUDA's in memarray-cuda's).
//! - [`gpu`]: tests that need a GPU skip with a reason (or fail under
//!   `MEMARRAY_REQUIRE_GPU=1`), count their skips, and make foreign streams.

pub mod conformance;
pub mod gpu;

pub use gpu::{gpu_or_skip, gpus_or_skip, report_skip};
