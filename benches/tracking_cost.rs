//! Measures the tracking adaptor's cost over a bare resource (the "stacks off"
//! target): allocate + free of 1 KiB, median of 7 runs of 200,000 pairs; and what
//! the clock reads it makes cost on this machine (a virtual machine may trap them), beside
//! the coarse clock (a jiffy's resolution, 1-4 ms) that could replace them. On the 2-core CI
//! machine: +44-49 ns a pair, rdtsc 9.2 ns (two a pair), the coarse clock 5.3 ns.
//!
//!     cargo bench -p memarray-core --bench tracking_cost

use std::sync::Arc;
use std::time::Instant;

use memarray_core::{HostResource, MemoryResource, Source, TrackingAdaptor};

fn per_pair(r: &dyn MemoryResource) -> f64 {
    let n = 200_000;
    let mut runs: Vec<f64> = (0..7)
        .map(|_| {
            let t = Instant::now();
            for _ in 0..n {
                let p = r.allocate(1024, 64, None).unwrap();
                // SAFETY: p came from r with these arguments and is freed once.
                unsafe { r.deallocate(p, 1024, 64, None) };
            }
            t.elapsed().as_nanos() as f64 / n as f64
        })
        .collect();
    runs.sort_by(f64::total_cmp);
    runs[3]
}

fn main() {
    let bare: Arc<dyn MemoryResource> = Arc::new(HostResource);
    let tracked = TrackingAdaptor::new(bare.clone(), Source::MEMARRAY);
    let b = per_pair(&*bare);
    let t = per_pair(&tracked);
    println!(
        "allocate + free of 1 KiB: bare {b:.0} ns, tracking {t:.0} ns (+{:.0} ns)",
        t - b
    );
    let n = 1_000_000u32;
    let clock = |name: &str, read: &dyn Fn()| {
        let t = Instant::now();
        for _ in 0..n {
            read();
        }
        println!(
            "{name}: {:.1} ns",
            t.elapsed().as_nanos() as f64 / f64::from(n)
        );
    };
    #[cfg(target_arch = "x86_64")]
    clock("rdtsc", &|| {
        // SAFETY: RDTSC has no preconditions; every x86-64 CPU has it.
        std::hint::black_box(unsafe { std::arch::x86_64::_rdtsc() });
    });
    clock("Instant::now", &|| {
        std::hint::black_box(Instant::now());
    });
    #[cfg(target_os = "linux")]
    clock("CLOCK_MONOTONIC_COARSE", &|| {
        let mut ts = libc::timespec {
            tv_sec: 0,
            tv_nsec: 0,
        };
        // SAFETY: a valid out-pointer to a timespec.
        unsafe { libc::clock_gettime(libc::CLOCK_MONOTONIC_COARSE, &raw mut ts) };
        std::hint::black_box(ts);
    });
}
