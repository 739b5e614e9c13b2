//! Shared by memarray's benches: the device check, CUDA-event timing, medians, the
//! criterion settings per size, and the greppable summary lines.
#![allow(dead_code)]

use std::sync::Arc;
use std::time::Duration;

use criterion::{BenchmarkGroup, SamplingMode, measurement::WallTime};
use memarray_cuda::{Device, Event, Result, StreamRef};

/// What a bench run does, from `MEMARRAY_BENCH`: `criterion` (only the criterion
/// groups), `summary` (only the summary, fast) or anything else / unset (both).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Mode {
    /// Run the criterion groups.
    pub criterion: bool,
    /// Run the summary repetitions and print the summary lines.
    pub summary: bool,
}

impl Mode {
    pub fn from_env() -> Mode {
        match std::env::var("MEMARRAY_BENCH").as_deref() {
            Ok("criterion") => Mode {
                criterion: true,
                summary: false,
            },
            Ok("summary") => Mode {
                criterion: false,
                summary: true,
            },
            _ => Mode {
                criterion: true,
                summary: true,
            },
        }
    }
}

/// Device 0, or `None` after printing `SKIPPED: no CUDA device (<reason>)` (a panic
/// instead under `MEMARRAY_REQUIRE_GPU=1`).
pub fn device_or_skip() -> Option<Arc<Device>> {
    memarray_testing::gpu_or_skip()
}

/// A pair of timed events: GPU time between two points of one stream.
pub struct Timer {
    start: Event,
    stop: Event,
}

impl Timer {
    pub fn new(dev: &Arc<Device>) -> Result<Timer> {
        Ok(Timer {
            start: Event::timed(dev)?,
            stop: Event::timed(dev)?,
        })
    }

    /// GPU time from just before `work` is enqueued on `stream` to just after it ran.
    /// The start event completes at once on an idle stream, so host overhead that
    /// delays the enqueue (bookkeeping, lock checks, allocation) is counted too.
    pub fn time(&self, stream: StreamRef, work: impl FnOnce() -> Result<()>) -> Result<Duration> {
        self.start.record(stream)?;
        work()?;
        self.stop.record(stream)?;
        self.stop.synchronize()?;
        let ms = self.stop.elapsed_ms(&self.start)?;
        Ok(Duration::from_secs_f64(f64::from(ms) / 1e3))
    }
}

/// The median of `xs` (seconds, microseconds, anything); `NaN` for none.
pub fn median(mut xs: Vec<f64>) -> f64 {
    if xs.is_empty() {
        return f64::NAN;
    }
    xs.sort_by(f64::total_cmp);
    let m = xs.len() / 2;
    if xs.len() % 2 == 1 {
        xs[m]
    } else {
        (xs[m - 1] + xs[m]) / 2.0
    }
}

/// `bytes` per `seconds` in GB/s (10^9 bytes per second, as the contract's table).
pub fn gbps(bytes: usize, seconds: f64) -> f64 {
    bytes as f64 / seconds / 1e9
}

/// "4 KiB", "16 MiB", "1 GiB".
pub fn label(bytes: usize) -> String {
    match bytes {
        b if b >= 1 << 30 && b % (1 << 30) == 0 => format!("{} GiB", b >> 30),
        b if b >= 1 << 20 && b % (1 << 20) == 0 => format!("{} MiB", b >> 20),
        b if b >= 1 << 10 && b % (1 << 10) == 0 => format!("{} KiB", b >> 10),
        b => format!("{b} B"),
    }
}

/// How many summary repetitions a size gets: enough for a stable median, bounded time.
pub fn reps(bytes: usize) -> usize {
    match bytes {
        b if b <= 1 << 20 => 50,
        b if b <= 16 << 20 => 20,
        b if b <= 256 << 20 => 10,
        _ => 5,
    }
}

/// Criterion settings by size, to keep a whole run within a few minutes on the device:
/// short warm-ups, fewer samples and flat sampling for the large copies.
pub fn configure(group: &mut BenchmarkGroup<'_, WallTime>, bytes: usize) {
    group.warm_up_time(Duration::from_millis(300));
    if bytes >= 256 << 20 {
        group
            .sample_size(10)
            .sampling_mode(SamplingMode::Flat)
            .measurement_time(Duration::from_secs(2));
    } else if bytes >= 16 << 20 {
        group
            .sample_size(20)
            .measurement_time(Duration::from_millis(1500));
    } else {
        group
            .sample_size(30)
            .measurement_time(Duration::from_secs(1));
    }
}

/// One summary line: `H2D 16 MiB: memarray X GB/s, raw Y GB/s, ratio Z<note>`.
pub fn throughput_line(what: &str, bytes: usize, ours: f64, raw: f64, note: &str) -> String {
    let (a, b) = (gbps(bytes, ours), gbps(bytes, raw));
    format!(
        "{what}: memarray {a:.2} GB/s, raw {b:.2} GB/s, ratio {:.3}{note}",
        a / b
    )
}

/// Prints the summary block: a header naming the device and how it was measured.
pub fn print_summary(title: &str, dev: &Device, how: &str, lines: &[String]) {
    println!();
    println!(
        "== memarray {title} summary on {} (cc {}.{}); {how}",
        dev.name(),
        dev.compute_capability().0,
        dev.compute_capability().1
    );
    for l in lines {
        println!("{l}");
    }
}
