//! Allocation benchmarks: allocate + free of one block, median of repeated
//! batches, for the caching pool against the resources it is compared with.
//!
//! - Host (always): `CachingPool::host(HostResource)` against `HostResource` itself, and
//!   a `StatisticsAdaptor` over the pool (target: at most 10% over the bare pool).
//! - Device (with a GPU): `CachingPool` over `DeviceResource` (target: 1 MiB allocate +
//!   free at most 0.3 us), the statistics adaptor over it, `AsyncPoolResource`
//!   (`cuMemAllocAsync`) and `DeviceResource` (`cuMemAlloc`), all on one stream.
//!
//! Prints `alloc+free <size> <subject>: <median> us` lines. Run: `cargo bench -p
//! memarray-cuda --bench resources` (or the staged binary).

use std::hint::black_box;
use std::sync::Arc;
use std::time::Instant;

use memarray_core::{HostResource, MemoryResource, RawStream, StatisticsAdaptor};
use memarray_cuda::resource::CachingPool;
use memarray_cuda::{AsyncPoolResource, Device, DeviceResource, Stream};

/// Median time of one allocate + free, in microseconds, over `batches` of `n` pairs.
fn median_us(r: &dyn MemoryResource, bytes: usize, stream: Option<RawStream>, n: u32) -> f64 {
    let mut samples = Vec::new();
    for _ in 0..31 {
        let t = Instant::now();
        for _ in 0..n {
            let p = r.allocate(bytes, 256, stream).expect("allocate");
            // SAFETY: p came from r with these arguments and is freed once.
            unsafe { r.deallocate(black_box(p), bytes, 256, stream) };
        }
        samples.push(t.elapsed().as_secs_f64() * 1e6 / f64::from(n));
    }
    samples.sort_by(f64::total_cmp);
    samples[samples.len() / 2]
}

fn line(size: &str, what: &str, us: f64) {
    println!("alloc+free {size:>6} {what:<40} {us:>9.3} us");
}

/// The block sizes measured.
const SIZES: [(&str, usize); 3] = [("4 KiB", 4 << 10), ("1 MiB", 1 << 20), ("16 MiB", 16 << 20)];

/// A pool and a statistics adaptor over it, and the adaptor's overhead.
fn pool_and_statistics(
    size: &str,
    what: &str,
    pool: Arc<CachingPool>,
    bytes: usize,
    stream: Option<RawStream>,
) {
    let stats = StatisticsAdaptor::new(pool.clone());
    let p = median_us(pool.as_ref(), bytes, stream, 10_000);
    let s = median_us(&stats, bytes, stream, 10_000);
    line(size, what, p);
    line(size, &format!("statistics({what})"), s);
    println!(
        "  statistics overhead over the bare pool: {:+.1}%",
        (s / p - 1.0) * 100.0
    );
}

fn main() {
    if std::env::args().any(|a| a == "--list") {
        return;
    }
    for (size, bytes) in SIZES {
        let pool = Arc::new(CachingPool::host(Arc::new(HostResource), usize::MAX));
        pool_and_statistics(size, "host pool", pool, bytes, None);
        line(
            size,
            "HostResource (aligned malloc)",
            median_us(&HostResource, bytes, None, 1_000),
        );
    }
    let device = match Device::get(0) {
        Ok(d) => d,
        Err(e) => {
            println!("SKIPPED: no CUDA device ({e}); device figures need a GPU");
            return;
        }
    };
    let stream = Stream::new(&device).expect("stream");
    // SAFETY: a live stream of device 0 for the whole run.
    let raw = Some(unsafe { RawStream::from_raw(stream.raw()) });
    for (size, bytes) in SIZES {
        let upstream = Arc::new(DeviceResource::new(&device));
        let pool = Arc::new(CachingPool::new(upstream, &device, usize::MAX));
        pool_and_statistics(size, "device pool (over cuMemAlloc)", pool, bytes, raw);
        let asyncp = AsyncPoolResource::new(&device).expect("async pool");
        line(
            size,
            "AsyncPoolResource (cuMemAllocAsync)",
            median_us(&asyncp, bytes, raw, 1_000),
        );
        line(
            size,
            "DeviceResource (cuMemAlloc)",
            median_us(&DeviceResource::new(&device), bytes, raw, 100),
        );
        stream.synchronize().expect("sync");
    }
}
