//! Where the kernel stops paying, per device: measured once at first use (`tuning`: both
//! ways over sizes from 4 KiB to 256 KiB, the caller's whole cost, best of three) and
//! cached, unless the environment decides it.

use std::sync::{Arc, OnceLock};
use std::time::Instant;

use crate::buffer::DeviceBuffer;
use crate::device::Device;
use crate::error::Result;
use crate::event::Event;
use crate::module::Function;
use crate::per_device::PerDevice;
use crate::resource::plain_device_resource;
use crate::stream::Stream;

use super::kernel::{kernel, launch};
use super::{KERNEL_MAX, driver_batch, kernel_enabled, kernel_max_from_env};

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

/// Where a device's kernel limit came from.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum LimitSource {
    /// Measured at first use on this device.
    Measured,
    /// [`KERNEL_MAX_ENV`](super::KERNEL_MAX_ENV).
    Env,
    /// [`KERNEL_MAX`]: the trial failed (no device memory for it, say).
    Default,
    /// No kernel: [`KERNEL_ENV`](super::KERNEL_ENV) is `0`, or the driver refused the kernel.
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
/// [`KERNEL_MAX_ENV`](super::KERNEL_MAX_ENV) or [`KERNEL_ENV`](super::KERNEL_ENV) decide it.
pub fn tuning(device: &Arc<Device>) -> Result<Tuning> {
    if let Some(t) = TUNINGS.get(device.id()).get() {
        return Ok(t.clone());
    }
    let _ctx = device.bind()?;
    Ok(tuned(device).clone())
}

/// [`tuning`] with the device's context current.
pub(super) fn tuned(device: &Arc<Device>) -> &'static Tuning {
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
fn trial(device: &Arc<Device>, f: &Function) -> Result<Vec<(usize, f64, f64)>> {
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

#[cfg(test)]
mod tests {
    use super::*;

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
}
