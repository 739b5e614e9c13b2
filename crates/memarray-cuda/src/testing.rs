//! Helpers for tests that need a GPU. Not part of the stable API.

use std::io::Write;
use std::sync::Arc;

use crate::device::{Device, device_count};

/// The environment variable that turns skipped GPU tests into failures.
pub const REQUIRE_GPU_ENV: &str = "MEMARRAY_REQUIRE_GPU";

/// The environment variable that turns skipped multi-GPU (and NCCL) tests into failures.
pub const REQUIRE_PEER_ENV: &str = "MEMARRAY_REQUIRE_PEER";

fn required() -> bool {
    std::env::var(REQUIRE_GPU_ENV).is_ok_and(|v| v == "1")
}

fn peer_required() -> bool {
    std::env::var(REQUIRE_PEER_ENV).is_ok_and(|v| v == "1")
}

/// Writes a skip notice straight to stderr, which `cargo test` does not capture, so
/// skipped tests are visible without `--nocapture`.
pub fn report_skip(reason: &str) {
    // One write, so parallel tests do not interleave within the line.
    let line = format!("SKIPPED: {reason}\n");
    let _ = std::io::stderr().lock().write_all(line.as_bytes());
}

/// Device 0, or `None` after printing `SKIPPED: no CUDA device (<reason>)`.
///
/// # Panics
/// When `MEMARRAY_REQUIRE_GPU=1` and no device can be opened.
pub fn gpu_or_skip() -> Option<Arc<Device>> {
    match Device::get(0) {
        Ok(d) => Some(d),
        Err(e) if required() => panic!("{REQUIRE_GPU_ENV}=1 but no CUDA device: {e}"),
        Err(e) => {
            // The reason in full once per test binary, in short after that.
            static SAID: std::sync::atomic::AtomicBool = std::sync::atomic::AtomicBool::new(false);
            if SAID.swap(true, std::sync::atomic::Ordering::Relaxed) {
                report_skip("no CUDA device (reason above)");
            } else {
                report_skip(&format!("no CUDA device ({e})"));
            }
            None
        }
    }
}

/// The first `n` devices, or `None` after printing why. With fewer than `n` devices this
/// skips even under `MEMARRAY_REQUIRE_GPU=1` (a one-GPU machine cannot run peer tests)
/// but panics under `MEMARRAY_REQUIRE_PEER=1`; with none at all it panics under either,
/// as [`gpu_or_skip`] does.
pub fn gpus_or_skip(n: u32) -> Option<Vec<Arc<Device>>> {
    if peer_required() && Device::get(0).is_err() {
        panic!("{REQUIRE_PEER_ENV}=1 but no CUDA device");
    }
    gpu_or_skip()?;
    let count = device_count().unwrap_or(0);
    if count < n {
        if peer_required() {
            panic!("{REQUIRE_PEER_ENV}=1 but this machine has {count} CUDA device(s), not {n}");
        }
        report_skip(&format!(
            "needs {n} CUDA devices, this machine has {count} (run on nvidia-h200-x2)"
        ));
        return None;
    }
    match (0..n).map(Device::get).collect() {
        Ok(devices) => Some(devices),
        Err(e) if required() => panic!("{REQUIRE_GPU_ENV}=1 but devices 0..{n} failed: {e}"),
        Err(e) => {
            report_skip(&format!("could not open {n} CUDA devices ({e})"));
            None
        }
    }
}

/// Loads NCCL (feature `nccl`), or returns `false` after printing why; panics instead
/// under `MEMARRAY_REQUIRE_PEER=1` or `MEMARRAY_REQUIRE_NCCL=1`.
#[cfg(feature = "nccl")]
pub fn nccl_or_skip() -> bool {
    let required =
        peer_required() || std::env::var("MEMARRAY_REQUIRE_NCCL").is_ok_and(|v| v == "1");
    match crate::nccl::load(None) {
        Ok(_) => true,
        Err(e) if required => panic!("NCCL is required here but did not load: {e}"),
        Err(e) => {
            report_skip(&format!("NCCL not loadable ({e})"));
            false
        }
    }
}
