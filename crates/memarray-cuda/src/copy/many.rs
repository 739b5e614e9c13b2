//! Many device-to-device copies on one device in one call (`copy_many`): copies of at
//! most [`KERNEL_MAX`] bytes go to one launch of the `copy_many` kernel per
//! [`TABLE_MAX`] of them (`kernels-cuda/src/copy_many.cu`, its PTX committed in
//! `copy/ptx/`), larger ones to the driver as one batch (`cuMemcpyBatchAsync`).
//!
//! Small copies cost the copy engine more in setup than in bytes: on an H100, 1,000 copies
//! of 4 KiB as one driver batch took milliseconds, one kernel microseconds. The kernel
//! reads its table from a by-value parameter (no upload), so a launch is one driver call.
//! `MEMARRAY_COPY_KERNEL=0` sends every copy to the driver instead (for comparison); the
//! kernel is also skipped, for good, where the driver cannot load it.

use std::ffi::c_void;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, OnceLock};

use crate::device::Device;
use crate::driver::{self, BatchWay, CUfunction, CUmodule};
use crate::error::{Result, SettingError};
use crate::per_device::PerDevice;
use crate::stream::StreamRef;

/// The kernel, NUL-terminated for `cuModuleLoadData`.
const PTX: &str = concat!(include_str!("ptx/copy_many.ptx"), "\0");

/// Copies per launch: the kernel's table (`COPY_MANY_MAX` in `copy_many.cu`).
pub const TABLE_MAX: usize = 1024;

/// Copies up to this many bytes go to the kernel; larger ones to the driver.
pub const KERNEL_MAX: usize = 64 << 10;

/// Threads per block: one block per copy, 16 bytes a thread per pass (4 KiB a pass).
const BLOCK: u32 = 256;

/// The environment variable that turns the kernel off (`0`) or on (`1`, the default).
pub const KERNEL_ENV: &str = "MEMARRAY_COPY_KERNEL";

#[repr(C)]
#[derive(Clone, Copy, Default)]
struct Entry {
    dst: u64,
    src: u64,
    len: u64,
}

/// `CopyTable` in `copy_many.cu`: the kernel's one parameter.
#[repr(C)]
struct Table {
    n: u32,
    pad: u32,
    e: [Entry; TABLE_MAX],
}

/// Whether [`KERNEL_ENV`] lets the kernel run: unset or `1` yes, `0` no.
///
/// # Errors
/// [`SettingError::Env`] for any other value.
pub fn kernel_setting_from_env() -> std::result::Result<bool, SettingError> {
    kernel_setting(crate::env::var(KERNEL_ENV)?.as_deref())
}

fn kernel_setting(value: Option<&str>) -> std::result::Result<bool, SettingError> {
    match value {
        None | Some("1") => Ok(true),
        Some("0") => Ok(false),
        Some(other) => Err(SettingError::Env {
            var: KERNEL_ENV,
            value: other.to_string(),
            expected: "0 or 1",
        }),
    }
}

fn kernel_enabled() -> bool {
    static ON: OnceLock<bool> = OnceLock::new();
    // A bad value is refused at start-up (`check_env`); here it leaves the kernel on.
    *ON.get_or_init(|| kernel_setting_from_env().unwrap_or(true))
}

/// Copies made by the kernel and by the driver through `copy_many` since the process
/// started.
static BY_KERNEL: AtomicU64 = AtomicU64::new(0);
static BY_DRIVER: AtomicU64 = AtomicU64::new(0);

/// `(by the kernel, by the driver)`: the copies `copy_many` made each way so far.
pub fn copies_made() -> (u64, u64) {
    (
        BY_KERNEL.load(Ordering::Relaxed),
        BY_DRIVER.load(Ordering::Relaxed),
    )
}

/// A device's loaded kernel: the function and the module that owns it, for the life of
/// the process; `None` where the driver refused the module.
struct Loaded {
    function: CUfunction,
    _module: CUmodule,
}

// SAFETY: a CUfunction / CUmodule handle is a plain token any thread may pass to the
// driver; the module is never unloaded (it lives as long as the process).
unsafe impl Send for Loaded {}
// SAFETY: as above; the handles are only read.
unsafe impl Sync for Loaded {}

static KERNELS: PerDevice<OnceLock<Option<Loaded>>> = PerDevice::new();

/// `device`'s kernel, loaded on first use; `None` where it cannot be (the copies then go
/// to the driver). The device's context must be current.
fn kernel(device: &Arc<Device>) -> Option<CUfunction> {
    KERNELS
        .get(device.id())
        .get_or_init(|| {
            // SAFETY: the caller bound the device's context; PTX ends with its NUL.
            let module = unsafe { driver::module_load_image(PTX.as_bytes()) }.ok()?;
            // SAFETY: the module is live (loaded above, never unloaded).
            let function = unsafe { driver::module_get_function(module, c"copy_many") }.ok()?;
            Some(Loaded {
                function,
                _module: module,
            })
        })
        .as_ref()
        .map(|l| l.function)
}

/// Which copies (by index) each kernel launch takes, at most [`TABLE_MAX`] a launch, and
/// which go to the driver (all of them without the kernel); empty copies go nowhere.
fn plan(lens: &[usize], kernel: bool) -> (Vec<Vec<usize>>, Vec<usize>) {
    let mut launches: Vec<Vec<usize>> = Vec::new();
    let mut driver = Vec::new();
    for (i, &n) in lens.iter().enumerate() {
        if n == 0 {
            continue;
        }
        if kernel && n <= KERNEL_MAX {
            match launches.last_mut() {
                Some(l) if l.len() < TABLE_MAX => l.push(i),
                _ => launches.push(vec![i]),
            }
        } else {
            driver.push(i);
        }
    }
    (launches, driver)
}

/// Enqueues `dsts.len()` device-to-device copies (`lens[i]` bytes from `srcs[i]` to
/// `dsts[i]`) on `stream`: the small ones in kernel launches, the rest as one batch of the
/// driver's copies (see the module's text). Nothing waits.
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
    let function = if kernel_enabled() {
        kernel(device)
    } else {
        None
    };
    let (launches, rest) = plan(lens, function.is_some());
    if let Some(f) = function {
        let mut table = Box::new(Table {
            n: 0,
            pad: 0,
            e: [Entry::default(); TABLE_MAX],
        });
        for launch in &launches {
            for (slot, &i) in table.e.iter_mut().zip(launch) {
                *slot = Entry {
                    dst: dsts[i],
                    src: srcs[i],
                    len: lens[i] as u64,
                };
            }
            table.n = launch.len() as u32;
            let mut params = [std::ptr::from_mut(&mut *table).cast::<c_void>()];
            // SAFETY: the function takes one `CopyTable`, laid out as `Table` (repr(C),
            // the same fields; `plan` fills at most TABLE_MAX entries); item 2 for the
            // context and stream; item 1 keeps every range live until the kernel has run.
            // The driver copies the parameter during the call.
            unsafe { driver::launch_kernel(f, table.n, BLOCK, stream.cu(), &mut params)? };
            BY_KERNEL.fetch_add(launch.len() as u64, Ordering::Relaxed);
        }
    }
    let mut big_dst: Vec<u64> = rest.iter().map(|&i| dsts[i]).collect();
    let mut big_src: Vec<u64> = rest.iter().map(|&i| srcs[i]).collect();
    let mut big_len: Vec<usize> = rest.iter().map(|&i| lens[i]).collect();
    if !big_dst.is_empty() {
        BY_DRIVER.fetch_add(big_dst.len() as u64, Ordering::Relaxed);
        // SAFETY: items 1 and 2, for the copies the kernel did not take.
        unsafe {
            driver::memcpy_batch_async(
                &mut big_dst,
                &mut big_src,
                &mut big_len,
                BatchWay::OnDevice,
                device.id() as i32,
                stream.cu(),
            )?
        };
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_table_is_the_kernels_parameter() {
        // copy_many.cu's CopyTable: two u32, then COPY_MANY_MAX entries of three u64.
        assert_eq!(std::mem::size_of::<Table>(), 8 + TABLE_MAX * 24);
        let entry = format!(
            ".param .align 8 .b8 copy_many_param_0[{}]",
            8 + TABLE_MAX * 24
        );
        assert!(
            PTX.contains(&entry),
            "the committed PTX's parameter is not {entry}"
        );
        assert!(PTX.contains(".target sm_75"));
        assert!(PTX.contains(".version 9.0"), "PTX ISA 9.0 (driver 580)");
    }

    #[test]
    fn small_copies_fill_launches_of_at_most_a_table_and_the_rest_go_to_the_driver() {
        let mut lens = vec![4096; TABLE_MAX + 5];
        lens[3] = 0;
        lens[7] = KERNEL_MAX;
        lens[8] = KERNEL_MAX + 1;
        let (launches, driver) = plan(&lens, true);
        assert_eq!(driver, vec![8]);
        assert_eq!(launches.len(), 2);
        assert_eq!(launches[0].len(), TABLE_MAX);
        assert!(launches[0].contains(&7) && !launches[0].contains(&3));
        let all: Vec<usize> = launches.concat();
        assert_eq!(
            all.len(),
            lens.len() - 2,
            "every non-empty small copy, once"
        );
        assert!(all.windows(2).all(|w| w[0] < w[1]), "in order");
        let (none, driver) = plan(&lens, false);
        assert!(none.is_empty());
        assert_eq!(driver.len(), lens.len() - 1, "all but the empty one");
        assert_eq!(plan(&[], true), (Vec::<Vec<usize>>::new(), vec![]));
    }

    #[test]
    fn the_switch_reads_0_and_1_and_refuses_the_rest() {
        assert!(kernel_setting(None).unwrap());
        assert!(kernel_setting(Some("1")).unwrap());
        assert!(!kernel_setting(Some("0")).unwrap());
        let e = kernel_setting(Some("yes")).unwrap_err();
        assert!(
            e.to_string().contains(KERNEL_ENV) && e.to_string().contains("yes"),
            "{e}"
        );
    }
}
