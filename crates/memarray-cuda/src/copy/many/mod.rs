//! Many device-to-device copies on one device in one call (`copy_many`): one engine for
//! small copies. Runs of copies that continue each other on both sides are merged first
//! (coalesced, up to the kernel limit: only the kernel takes merged copies, which may
//! span two adjacent allocations); copies of at most the device's kernel limit go to one
//! launch of the
//! `copy_many` kernel per [`TABLE_MAX`] of them (`kernel.rs`), larger ones to the driver as one batch
//! (`cuMemcpyBatchAsync`).
//!
//! Small copies cost the copy engine more in setup than in bytes: on an H100, 1,000 copies
//! of 4 KiB as one driver batch took milliseconds, one kernel microseconds. The kernel
//! reads its table from a by-value parameter (no upload), so a launch is one driver call.
//! Where the kernel stops paying differs per GPU, so the limit is measured once per device
//! at first use ([`tuning`]: both ways over sizes from 4 KiB to 256 KiB, the caller's
//! whole cost, best of three) and cached; `MEMARRAY_COPY_KERNEL_MAX=<bytes>` sets it
//! instead, `MEMARRAY_COPY_KERNEL=0` sends every copy to the driver (for comparison). The
//! kernel is also skipped, for good, where the driver cannot load it.

mod kernel;
mod plan;
mod tuning;

use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, OnceLock};

use crate::device::Device;
use crate::driver::{self, BatchWay};
use crate::error::{Result, SettingError};
use crate::stream::StreamRef;

pub use tuning::{LimitSource, Tuning, tuning};

/// Copies per launch: the kernel's table (`COPY_MANY_MAX` in `copy_many.cu`).
pub const TABLE_MAX: usize = 1024;

/// The kernel limit where the trial fails (no device memory for it, say): copies up to
/// this many bytes go to the kernel, larger ones to the driver.
pub const KERNEL_MAX: usize = 64 << 10;

/// The environment variable that turns the kernel off (`0`) or on (`1`, the default).
pub const KERNEL_ENV: &str = "MEMARRAY_COPY_KERNEL";

/// The environment variable that sets the kernel limit in bytes instead of measuring it.
pub const KERNEL_MAX_ENV: &str = "MEMARRAY_COPY_KERNEL_MAX";

/// The largest kernel limit [`KERNEL_MAX_ENV`] takes (16 MiB).
pub const KERNEL_MAX_CEILING: usize = 16 << 20;

/// [`KERNEL_MAX_ENV`]'s value: `None` when unset (measure). A byte count read as every
/// byte count is ([`crate::env::bytes`]: `65536`, `64KiB`).
///
/// # Errors
/// [`SettingError::Env`] unless a byte count up to [`KERNEL_MAX_CEILING`].
pub fn kernel_max_from_env() -> std::result::Result<Option<usize>, SettingError> {
    kernel_max_setting(crate::env::var(KERNEL_MAX_ENV)?.as_deref())
}

fn kernel_max_setting(value: Option<&str>) -> std::result::Result<Option<usize>, SettingError> {
    match crate::env::bytes_of(KERNEL_MAX_ENV, value)? {
        None => Ok(None),
        Some(n) if n <= KERNEL_MAX_CEILING as u64 => Ok(Some(n as usize)),
        Some(_) => Err(SettingError::Env {
            var: KERNEL_MAX_ENV,
            value: value.unwrap_or_default().to_string(),
            expected: "a byte count from 0 to 16MiB",
        }),
    }
}

/// Whether [`KERNEL_ENV`] lets the kernel run: unset or an on word yes, an off word no
/// ([`crate::env::switch`]).
///
/// # Errors
/// [`SettingError::Env`] for any other value.
pub fn kernel_setting_from_env() -> std::result::Result<bool, SettingError> {
    kernel_setting(crate::env::var(KERNEL_ENV)?.as_deref())
}

fn kernel_setting(value: Option<&str>) -> std::result::Result<bool, SettingError> {
    Ok(crate::env::switch_of(KERNEL_ENV, value)?.unwrap_or(true))
}

pub(super) fn kernel_enabled() -> bool {
    static ON: OnceLock<bool> = OnceLock::new();
    // A bad value is refused at start-up (`check_env`); here it leaves the kernel on.
    *ON.get_or_init(|| kernel_setting_from_env().unwrap_or(true))
}

/// Copies made by the kernel and by the driver through `copy_many` since the process
/// started.
static BY_KERNEL: AtomicU64 = AtomicU64::new(0);
static BY_DRIVER: AtomicU64 = AtomicU64::new(0);

/// `(by the kernel, by the driver)`: the copies `copy_many` made each way so far (after
/// merging; the first-use trial's are not counted).
pub fn copies_made() -> (u64, u64) {
    (
        BY_KERNEL.load(Ordering::Relaxed),
        BY_DRIVER.load(Ordering::Relaxed),
    )
}

/// The copies `which` as one driver batch.
///
/// # Safety
/// As [`copy_many`]'s items 1 and 2, for those copies.
pub(super) unsafe fn driver_batch(
    device: &Arc<Device>,
    stream: StreamRef,
    dsts: &[u64],
    srcs: &[u64],
    lens: &[usize],
    which: &[usize],
) -> Result<()> {
    if which.is_empty() {
        return Ok(());
    }
    let mut d: Vec<u64> = which.iter().map(|&i| dsts[i]).collect();
    let mut s: Vec<u64> = which.iter().map(|&i| srcs[i]).collect();
    let mut n: Vec<usize> = which.iter().map(|&i| lens[i]).collect();
    // SAFETY: the caller's items 1 and 2.
    unsafe {
        driver::memcpy_batch_async(
            &mut d,
            &mut s,
            &mut n,
            BatchWay::OnDevice,
            device.id() as i32,
            stream.cu(),
        )
    }
}

/// Enqueues `dsts.len()` device-to-device copies (`lens[i]` bytes from `srcs[i]` to
/// `dsts[i]`) on `stream`: adjacent ones merged, the small ones in kernel launches, the
/// rest as one batch of the driver's copies (see the module's text). Nothing waits. The
/// device's first call measures its kernel limit ([`tuning`]).
///
/// # Safety
/// 1. Every range is live memory of `device` (or memory it can read and write), not
///    freed until the copies have run; destinations do not overlap sources or each other.
/// 2. `device`'s context is current on this thread and `stream` is a live stream of it
///    that is not a default stream.
pub(crate) unsafe fn copy_many(
    device: &Arc<Device>,
    stream: StreamRef,
    dsts: &[u64],
    srcs: &[u64],
    lens: &[usize],
) -> Result<()> {
    driver::same_lengths("copy_many", dsts.len(), srcs.len(), lens.len())?;
    // The kernel and its limit (a limit is only measured where the kernel loaded).
    let engine = tuning::tuned(device)
        .kernel_max
        .and_then(|limit| Some((kernel::kernel(device)?, limit)));
    let limit = engine.map(|(_, limit)| limit);
    let (dsts, srcs, lens) = plan::coalesce(dsts, srcs, lens, limit.unwrap_or(0));
    let (launches, rest) = plan::plan(&lens, limit);
    if let Some((f, _)) = engine {
        for which in &launches {
            // SAFETY: the caller's items 1 and 2; `plan` gives at most TABLE_MAX a launch.
            unsafe { kernel::launch(f, stream, &dsts, &srcs, &lens, which)? };
            BY_KERNEL.fetch_add(which.len() as u64, Ordering::Relaxed);
        }
    }
    BY_DRIVER.fetch_add(rest.len() as u64, Ordering::Relaxed);
    // SAFETY: items 1 and 2, for the copies the kernel did not take.
    unsafe { driver_batch(device, stream, &dsts, &srcs, &lens, &rest) }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_limit_setting_reads_byte_counts_as_every_byte_count_up_to_the_ceiling() {
        assert_eq!(kernel_max_setting(None).unwrap(), None);
        assert_eq!(kernel_max_setting(Some("")).unwrap(), None);
        assert_eq!(kernel_max_setting(Some(" 32768 ")).unwrap(), Some(32768));
        assert_eq!(kernel_max_setting(Some("64KiB")).unwrap(), Some(65536));
        assert_eq!(kernel_max_setting(Some("16MiB")).unwrap(), Some(16 << 20));
        assert_eq!(kernel_max_setting(Some("0")).unwrap(), Some(0));
        for bad in ["-1", "16777217", "17MiB", "lots"] {
            let e = kernel_max_setting(Some(bad)).unwrap_err().to_string();
            assert!(e.contains(KERNEL_MAX_ENV) && e.contains(bad), "{e}");
        }
    }

    #[test]
    fn the_switch_reads_the_switch_words_and_refuses_the_rest() {
        assert!(kernel_setting(None).unwrap());
        for on in ["1", "on", "yes", "TRUE"] {
            assert!(kernel_setting(Some(on)).unwrap(), "{on}");
        }
        for off in ["0", "off", "no", "False"] {
            assert!(!kernel_setting(Some(off)).unwrap(), "{off}");
        }
        let e = kernel_setting(Some("maybe")).unwrap_err();
        assert!(
            e.to_string().contains(KERNEL_ENV) && e.to_string().contains("maybe"),
            "{e}"
        );
    }
}
