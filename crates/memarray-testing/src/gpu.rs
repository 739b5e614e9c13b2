//! Helpers for tests that need a GPU: skip with a reason, or fail under
//! `MEMARRAY_REQUIRE_GPU=1`.

use std::io::Write;
use std::sync::Arc;

use memarray_cuda::{Device, device_count};

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

/// The environment variable naming a file each skip appends one line to (`./dev.sh test`
/// counts them there and prints the reason once).
pub const SKIP_LOG_ENV: &str = "MEMARRAY_SKIP_LOG";

/// Appends `SKIPPED: <reason>` to the skip log, when one is named.
fn log_skip(reason: &str) {
    if let Some(path) = std::env::var_os(SKIP_LOG_ENV)
        && let Ok(mut f) = std::fs::OpenOptions::new()
            .create(true)
            .append(true)
            .open(path)
    {
        // One write: appends from parallel tests do not interleave. A test's note: a
        // failed write has nowhere to go and changes no result.
        let _ = f.write_all(format!("SKIPPED: {reason}\n").as_bytes());
    }
}

/// Writes a skip notice straight to stderr, which `cargo test` does not capture, so
/// skipped tests are visible without `--nocapture`, and to the skip log.
pub fn report_skip(reason: &str) {
    log_skip(reason);
    // One write, on a line of its own (libtest may have written "test x ... " without its
    // newline yet). A failed write to stderr has nowhere to go and changes no result.
    let line = format!("\nSKIPPED: {reason}\n");
    let _ = std::io::stderr().lock().write_all(line.as_bytes());
}

/// The first clauses of a reason (`CUDA is unavailable: libcuda.so not found`), for a
/// line a person reads among test names.
fn short(reason: &str) -> &str {
    match reason.match_indices(": ").nth(1) {
        Some((at, _)) => &reason[..at],
        None => reason,
    }
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
            // One short line per test binary on stderr; every skip in the skip log, where
            // `./dev.sh test` counts them and prints the reason in full once.
            static SAID: std::sync::atomic::AtomicBool = std::sync::atomic::AtomicBool::new(false);
            let reason = e.to_string();
            if SAID.swap(true, std::sync::atomic::Ordering::Relaxed) {
                log_skip(&format!("no CUDA device ({reason})"));
            } else {
                log_skip(&format!("no CUDA device ({reason})"));
                let line = format!(
                    "\nSKIPPED: no CUDA device ({}): this binary's GPU tests return early\n",
                    short(&reason)
                );
                // As above: nowhere to report a failed write to stderr.
                let _ = std::io::stderr().lock().write_all(line.as_bytes());
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

/// Runs `load` (NCCL's loader: `memarray_cuda::nccl::load`, feature `nccl`), or returns
/// `false` after printing why it failed; panics instead under `MEMARRAY_REQUIRE_PEER=1` or
/// `MEMARRAY_REQUIRE_NCCL=1`.
pub fn nccl_or_skip<T, E: std::fmt::Display>(load: impl FnOnce() -> Result<T, E>) -> bool {
    let required =
        peer_required() || std::env::var("MEMARRAY_REQUIRE_NCCL").is_ok_and(|v| v == "1");
    match load() {
        Ok(_) => true,
        Err(e) if required => panic!("NCCL is required here but did not load: {e}"),
        Err(e) => {
            report_skip(&format!("NCCL not loadable ({e})"));
            false
        }
    }
}

/// A driver stream memarray did not make, as torch, CuPy or cuda.core hand one over, and
/// destroyed when dropped (memarray's own streams are recycled, never destroyed): for
/// tests of what memarray may do with a foreign stream after the call that named it.
#[derive(Debug)]
pub struct ForeignStream {
    device: Arc<Device>,
    raw: usize,
}

impl ForeignStream {
    /// A new non-blocking stream on `device`, made with the driver's own call (as a
    /// foreign library makes one), not through memarray.
    pub fn new(device: &Arc<Device>) -> memarray_cuda::Result<Self> {
        use cudarc::driver::sys;
        let _ctx = device.bind()?;
        let mut s: sys::CUstream = std::ptr::null_mut();
        let flags = sys::CUstream_flags::CU_STREAM_NON_BLOCKING as u32;
        // SAFETY: `bind` made the device's context current; the out pointer is valid.
        let r = unsafe { sys::cuStreamCreate(&mut s, flags) };
        if r != sys::CUresult::CUDA_SUCCESS {
            return Err(memarray_cuda::CudaError::InvalidArgument {
                what: "ForeignStream::new",
                detail: format!("cuStreamCreate returned {r:?}"),
            });
        }
        Ok(ForeignStream {
            device: device.clone(),
            raw: s as usize,
        })
    }

    /// The handle, as a foreign library would pass it.
    pub fn raw(&self) -> usize {
        self.raw
    }
}

impl Drop for ForeignStream {
    fn drop(&mut self) {
        if let Ok(_ctx) = self.device.bind() {
            // SAFETY: a live stream of this device's context, created by `new`; the test
            // names it no more. A failure leaks one stream of a test process: a test's
            // helper has nothing to report it to.
            let _ = unsafe { cudarc::driver::sys::cuStreamDestroy_v2(self.raw as _) };
        }
    }
}
