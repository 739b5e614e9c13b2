//! The tracking adaptor's timestamps ([`Clock`]).

use std::sync::OnceLock;
use std::time::Instant;

use super::MIN_SPAN_NS;

/// A cheap timestamp, in ticks since the adaptor was made, converted to nanoseconds when
/// read out. Two kinds:
///
/// - coarse (stacks and backtraces off, the hot path): the kernel's coarse monotonic
///   clock, one read of a shared page (5 ns on the 2-core CI machine, where the CPU's
///   time-stamp counter costs 9.2 ns and 22 ns on the lent H100 hosts' virtual
///   machines, `benches/tracking_cost.rs`); its resolution is the kernel's tick, 1-4 ms;
/// - precise (stacks or backtraces on, which cost microseconds anyway): the time-stamp
///   counter on x86-64, calibrated against `Instant` when read out; `Instant` elsewhere.
#[derive(Debug)]
pub(super) struct Clock {
    start: Instant,
    start_ticks: u64,
    pub(super) precise: bool,
}

impl Clock {
    pub(super) fn new(precise: bool) -> Self {
        Self {
            start: Instant::now(),
            start_ticks: Self::read(precise),
            precise,
        }
    }

    fn read(precise: bool) -> u64 {
        if precise {
            Self::tsc()
        } else {
            Self::coarse_ns()
        }
    }

    #[cfg(target_arch = "x86_64")]
    fn tsc() -> u64 {
        // SAFETY: RDTSC has no preconditions; every x86-64 CPU has it.
        unsafe { std::arch::x86_64::_rdtsc() }
    }

    #[cfg(not(target_arch = "x86_64"))]
    fn tsc() -> u64 {
        Self::instant_ns()
    }

    /// Nanoseconds of the coarse monotonic clock.
    #[cfg(target_os = "linux")]
    fn coarse_ns() -> u64 {
        let mut ts = libc::timespec {
            tv_sec: 0,
            tv_nsec: 0,
        };
        // SAFETY: a valid out-pointer to a timespec; the clock exists on every Linux.
        unsafe { libc::clock_gettime(libc::CLOCK_MONOTONIC_COARSE, &raw mut ts) };
        (ts.tv_sec as u64)
            .wrapping_mul(1_000_000_000)
            .wrapping_add(ts.tv_nsec as u64)
    }

    #[cfg(not(target_os = "linux"))]
    fn coarse_ns() -> u64 {
        Self::instant_ns()
    }

    #[cfg(any(not(target_arch = "x86_64"), not(target_os = "linux")))]
    fn instant_ns() -> u64 {
        static EPOCH: OnceLock<Instant> = OnceLock::new();
        u64::try_from(EPOCH.get_or_init(Instant::now).elapsed().as_nanos()).unwrap_or(u64::MAX)
    }

    /// About how many ticks make [`MIN_SPAN_NS`] (for the time-stamp counter measured over
    /// 20 us, once per process).
    pub(super) fn ticks_per_span(&self) -> u64 {
        if !self.precise {
            return MIN_SPAN_NS;
        }
        static PER_SPAN: OnceLock<u64> = OnceLock::new();
        *PER_SPAN.get_or_init(|| {
            let (t0, i0) = (Self::tsc(), Instant::now());
            while i0.elapsed().as_nanos() < 20_000 {
                std::hint::spin_loop();
            }
            let ns = i0.elapsed().as_nanos().max(1) as u64;
            (Self::tsc().saturating_sub(t0) * MIN_SPAN_NS / ns).max(1)
        })
    }

    /// Nanoseconds from the adaptor's making to `at` (0 for an earlier instant).
    pub(super) fn ns_at(&self, at: Instant) -> u64 {
        u64::try_from(at.saturating_duration_since(self.start).as_nanos()).unwrap_or(u64::MAX)
    }

    /// Ticks since the adaptor was made.
    pub(super) fn ticks(&self) -> u64 {
        Self::read(self.precise).saturating_sub(self.start_ticks)
    }

    /// A function from ticks to nanoseconds since the adaptor was made, calibrated now.
    pub(super) fn to_ns(&self) -> impl Fn(u64) -> u64 {
        let per_tick = if self.precise {
            let ns = self.start.elapsed().as_nanos() as f64;
            let ticks = self.ticks() as f64;
            if ticks > 0.0 { ns / ticks } else { 1.0 }
        } else {
            1.0
        };
        move |t| (t as f64 * per_tick) as u64
    }
}
