//! Many device-to-device copies on one device in one call (`copy_many`): one engine for
//! small copies. Runs of copies that continue each other on both sides are merged first
//! (coalesced, up to the kernel limit: only the kernel takes merged copies, which may
//! span two adjacent allocations); copies of at most the device's kernel limit go to one
//! launch of the
//! `copy_many` kernel per [`TABLE_MAX`] of them (`kernels-cuda/src/copy_many.cu`, its PTX
//! committed in `copy/ptx/`), larger ones to the driver as one batch
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

use std::ffi::c_void;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, OnceLock};
use std::time::Instant;

use crate::buffer::DeviceBuffer;
use crate::device::Device;
use crate::driver::{self, BatchWay, CUfunction, CUmodule};
use crate::error::{Result, SettingError};
use crate::event::Event;
use crate::per_device::PerDevice;
use crate::resource::plain_device_resource;
use crate::stream::{Stream, StreamRef};

/// The kernel, NUL-terminated for `cuModuleLoadData`.
const PTX: &str = concat!(include_str!("ptx/copy_many.ptx"), "\0");

/// Copies per launch: the kernel's table (`COPY_MANY_MAX` in `copy_many.cu`).
pub const TABLE_MAX: usize = 1024;

/// The kernel limit where the trial fails (no device memory for it, say): copies up to
/// this many bytes go to the kernel, larger ones to the driver.
pub const KERNEL_MAX: usize = 64 << 10;

/// The copy sizes first use tries both ways, and the copies of each size per trial.
const TRIAL_SIZES: [usize; 7] = [
    4 << 10,
    8 << 10,
    16 << 10,
    32 << 10,
    64 << 10,
    128 << 10,
    256 << 10,
];
const TRIAL_COPIES: usize = 64;
const TRIAL_REPEATS: usize = 3;

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

fn kernel_enabled() -> bool {
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

/// Merges runs of copies that continue each other on both sides (copy `i + 1` starts
/// where copy `i` ends, in the source and in the destination) into one copy each, while
/// the merged copy stays within `cap` bytes, and leaves out empty copies. The merged copy
/// moves the same bytes. Only the kernel may take a merged copy: two allocations can be
/// adjacent in the address space, and the driver refuses a copy that spans both, so
/// `cap` is the kernel's limit (0 without the kernel: nothing merges).
fn coalesce(
    dsts: &[u64],
    srcs: &[u64],
    lens: &[usize],
    cap: usize,
) -> (Vec<u64>, Vec<u64>, Vec<usize>) {
    let (mut d, mut s, mut n) = (Vec::<u64>::new(), Vec::<u64>::new(), Vec::<usize>::new());
    for ((&dst, &src), &len) in dsts.iter().zip(srcs).zip(lens) {
        if len == 0 {
            continue;
        }
        if let (Some(&ld), Some(&ls), Some(ln)) = (d.last(), s.last(), n.last_mut()) {
            let end = *ln as u64;
            if *ln + len <= cap
                && ld.checked_add(end) == Some(dst)
                && ls.checked_add(end) == Some(src)
            {
                *ln += len;
                continue;
            }
        }
        d.push(dst);
        s.push(src);
        n.push(len);
    }
    (d, s, n)
}

/// Which copies (by index) each kernel launch takes, at most [`TABLE_MAX`] a launch, and
/// which go to the driver: those over `limit` (all of them without the kernel, `None`);
/// empty copies go nowhere.
fn plan(lens: &[usize], limit: Option<usize>) -> (Vec<Vec<usize>>, Vec<usize>) {
    let mut launches: Vec<Vec<usize>> = Vec::new();
    let mut driver = Vec::new();
    for (i, &n) in lens.iter().enumerate() {
        if n == 0 {
            continue;
        }
        if limit.is_some_and(|l| n <= l) {
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

/// Where a device's kernel limit came from.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum LimitSource {
    /// Measured at first use on this device.
    Measured,
    /// [`KERNEL_MAX_ENV`].
    Env,
    /// [`KERNEL_MAX`]: the trial failed (no device memory for it, say).
    Default,
    /// No kernel: [`KERNEL_ENV`] is `0`, or the driver refused the kernel.
    NoKernel,
}

/// What a device's small-copy engine chose at first use.
#[derive(Clone, Debug, PartialEq)]
pub struct Tuning {
    /// Copies of at most this many bytes go to the kernel (`None`: none do).
    pub kernel_max: Option<usize>,
    /// Where `kernel_max` came from.
    pub source: LimitSource,
    /// The trial, when measured: each size with the caller's cost of 64
    /// copies of it by the kernel and by the driver's batch, in microseconds (best of
    /// three, enqueue to completion).
    pub trial: Vec<(usize, f64, f64)>,
}

/// The kernel limit a trial gives: the largest size up to which the kernel cost no more
/// than the driver at every size tried; `None` when the driver was cheaper at the smallest.
fn choose(trial: &[(usize, f64, f64)]) -> Option<usize> {
    let mut limit = None;
    for &(size, kernel_us, driver_us) in trial {
        if kernel_us > driver_us {
            break;
        }
        limit = Some(size);
    }
    limit
}

static TUNINGS: PerDevice<OnceLock<Tuning>> = PerDevice::new();

/// `device`'s small-copy engine: its kernel limit, measured on first use (a few
/// milliseconds and 32 MiB of device memory from the driver, freed after; once per device
/// and process) unless
/// [`KERNEL_MAX_ENV`] or [`KERNEL_ENV`] decide it.
pub fn tuning(device: &Arc<Device>) -> Result<Tuning> {
    if let Some(t) = TUNINGS.get(device.id()).get() {
        return Ok(t.clone());
    }
    let _ctx = device.bind()?;
    Ok(tuned(device).clone())
}

/// [`tuning`] with the device's context current.
fn tuned(device: &Arc<Device>) -> &'static Tuning {
    TUNINGS.get(device.id()).get_or_init(|| {
        let function = if kernel_enabled() {
            kernel(device)
        } else {
            None
        };
        let Some(f) = function else {
            return Tuning {
                kernel_max: None,
                source: LimitSource::NoKernel,
                trial: vec![],
            };
        };
        if let Ok(Some(n)) = kernel_max_from_env() {
            return Tuning {
                kernel_max: Some(n),
                source: LimitSource::Env,
                trial: vec![],
            };
        }
        match trial(device, f) {
            Ok(trial) => Tuning {
                kernel_max: choose(&trial),
                source: LimitSource::Measured,
                trial,
            },
            Err(_) => Tuning {
                kernel_max: Some(KERNEL_MAX),
                source: LimitSource::Default,
                trial: vec![],
            },
        }
    })
}

/// Times [`TRIAL_COPIES`] copies of each of [`TRIAL_SIZES`] by the kernel and by the
/// driver's batch on a stream of its own (best of [`TRIAL_REPEATS`], enqueue to
/// completion, after one warm-up of each).
fn trial(device: &Arc<Device>, f: CUfunction) -> Result<Vec<(usize, f64, f64)>> {
    let biggest = TRIAL_SIZES[TRIAL_SIZES.len() - 1];
    let bytes = biggest * TRIAL_COPIES;
    let stream = Stream::new(device)?;
    let s = stream.as_ref();
    // Straight from the driver and back to it after: the trial's 32 MiB do not stay
    // cached in the default pool.
    let resource = plain_device_resource(device);
    // SAFETY: only copied from and into, never read by the host; the bytes are whatever
    // the allocation held.
    let (src, dst) = unsafe {
        (
            DeviceBuffer::uninit(device, bytes, resource.clone(), s)?,
            DeviceBuffer::uninit(device, bytes, resource, s)?,
        )
    };
    let done = Event::new(device)?;
    let mut out = Vec::with_capacity(TRIAL_SIZES.len());
    for &size in &TRIAL_SIZES {
        // Slots of `biggest` bytes (the trial calls the two ways directly: no merging).
        let at = |base: u64| -> Vec<u64> {
            (0..TRIAL_COPIES)
                .map(|i| base + (i * biggest) as u64)
                .collect()
        };
        let (dsts, srcs) = (at(dst.device_ptr()), at(src.device_ptr()));
        let lens = vec![size; dsts.len()];
        let all: Vec<usize> = (0..dsts.len()).collect();
        let mut best = [f64::INFINITY; 2];
        for round in 0..=TRIAL_REPEATS {
            for (way, best) in best.iter_mut().enumerate() {
                let t = Instant::now();
                if way == 0 {
                    // SAFETY: the ranges are in the two live buffers above, which outlive
                    // the wait below; the stream is live, of the bound device.
                    unsafe { launch(f, s, &dsts, &srcs, &lens, &all)? };
                } else {
                    // SAFETY: as above.
                    unsafe { driver_batch(device, s, &dsts, &srcs, &lens, &all)? };
                }
                done.record(s)?;
                done.synchronize()?;
                if round > 0 {
                    *best = best.min(t.elapsed().as_secs_f64() * 1e6);
                }
            }
        }
        out.push((size, best[0], best[1]));
    }
    stream.synchronize()?;
    Ok(out)
}

/// Launches the kernel over the copies `which` (at most [`TABLE_MAX`]).
///
/// # Safety
/// As [`copy_many`]'s items 1 and 2, for those copies.
unsafe fn launch(
    f: CUfunction,
    stream: StreamRef,
    dsts: &[u64],
    srcs: &[u64],
    lens: &[usize],
    which: &[usize],
) -> Result<()> {
    let mut table = Box::new(Table {
        n: 0,
        pad: 0,
        e: [Entry::default(); TABLE_MAX],
    });
    for (slot, &i) in table.e.iter_mut().zip(which) {
        *slot = Entry {
            dst: dsts[i],
            src: srcs[i],
            len: lens[i] as u64,
        };
    }
    table.n = which.len().min(TABLE_MAX) as u32;
    let mut params = [std::ptr::from_mut(&mut *table).cast::<c_void>()];
    // SAFETY: the function takes one `CopyTable`, laid out as `Table` (repr(C), the same
    // fields; at most TABLE_MAX entries filled); the caller keeps every range live until
    // the kernel has run and made the context current. The driver copies the parameter
    // during the call.
    unsafe { driver::launch_kernel(f, table.n, BLOCK, stream.cu(), &mut params) }
}

/// The copies `which` as one driver batch.
///
/// # Safety
/// As [`copy_many`]'s items 1 and 2, for those copies.
unsafe fn driver_batch(
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
    let engine = tuned(device)
        .kernel_max
        .and_then(|limit| Some((kernel(device)?, limit)));
    let limit = engine.map(|(_, limit)| limit);
    let (dsts, srcs, lens) = coalesce(dsts, srcs, lens, limit.unwrap_or(0));
    let (launches, rest) = plan(&lens, limit);
    if let Some((f, _)) = engine {
        for which in &launches {
            // SAFETY: the caller's items 1 and 2; `plan` gives at most TABLE_MAX a launch.
            unsafe { launch(f, stream, &dsts, &srcs, &lens, which)? };
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
        let (launches, driver) = plan(&lens, Some(KERNEL_MAX));
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
        let (none, driver) = plan(&lens, None);
        assert!(none.is_empty());
        assert_eq!(driver.len(), lens.len() - 1, "all but the empty one");
        assert_eq!(
            plan(&[], Some(KERNEL_MAX)),
            (Vec::<Vec<usize>>::new(), vec![])
        );
    }

    #[test]
    fn copies_that_continue_each_other_merge_and_others_stay() {
        // 0 and 1 continue each other on both sides; 2 continues 1 only in the source;
        // 3 is empty; 4 continues 2 on both sides.
        let dsts = [1000, 1100, 5000, 7, 5050];
        let srcs = [9000, 9100, 9150, 9, 9200];
        let lens = [100, 50, 50, 0, 30];
        let (d, s, n) = coalesce(&dsts, &srcs, &lens, 1000);
        assert_eq!(d, vec![1000, 5000]);
        assert_eq!(s, vec![9000, 9150]);
        assert_eq!(n, vec![150, 80]);
        let total: usize = lens.iter().sum();
        assert_eq!(n.iter().sum::<usize>(), total, "the same bytes");
        // A merge stops at the cap (the kernel's limit); without the kernel none happen.
        let (d, _, n) = coalesce(&dsts, &srcs, &lens, 149);
        assert_eq!((d, n), (vec![1000, 1100, 5000], vec![100, 50, 80]));
        let (_, _, n) = coalesce(&dsts, &srcs, &lens, 0);
        assert_eq!(n, vec![100, 50, 50, 30]);
        // No wrap-around at the top of the address space.
        let (d, _, n) = coalesce(&[u64::MAX - 9, 0], &[0, 10], &[10, 5], 1000);
        assert_eq!((d.len(), n), (2, vec![10, 5]));
        assert_eq!(coalesce(&[], &[], &[], 1000), (vec![], vec![], vec![]));
    }

    #[test]
    fn the_limit_is_the_largest_size_up_to_which_the_kernel_never_lost() {
        let t = [
            (4096, 10.0, 40.0),
            (8192, 12.0, 41.0),
            (16384, 50.0, 45.0),
            (32768, 20.0, 60.0),
        ];
        assert_eq!(choose(&t), Some(8192), "a later win does not count");
        assert_eq!(choose(&t[..2]), Some(8192));
        assert_eq!(
            choose(&[(4096, 5.0, 5.0)]),
            Some(4096),
            "a tie goes to the kernel"
        );
        assert_eq!(choose(&[(4096, 50.0, 40.0)]), None);
        assert_eq!(choose(&[]), None);
    }

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
